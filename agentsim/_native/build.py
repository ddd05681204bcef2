"""Small C kernels compiled on first use: the build, the cache and the loading, shared by every kernel.

A kernel is C source (a few loops that torch would run as many passes) compiled with the system
C compiler into a shared library cached under ``~/.cache/agentsim/kernels`` (``AGENTSIM_KERNEL_DIR``
overrides), keyed by the source, the flags, the compiler's version and the CPU, and loaded with
:mod:`ctypes`. Where there is no compiler or a build fails, :func:`load` warns once and returns
None, and the caller uses its torch ops: every kernel gives the same bits as its torch path (the
flags forbid fused multiply-adds), so a machine without a compiler runs the same trajectory, only
slower. ``AGENTSIM_KERNELS=0`` turns every kernel off (for A/B measurements); a kernel may have
its own switch too (``AGENTSIM_RNG_KERNEL=0``).

Users of this module: :mod:`agentsim._native.rng` (counter-based draws) and
:mod:`agentsim._native.kernels` (graph pushes, exact metric sums, the lean network build). Kernels
that run on several threads hand their loop to :func:`parallel_for`, which runs its pieces at once
(ctypes releases the GIL during a call).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import itertools
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import warnings
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

import torch

__all__ = ["FLAGS", "cache_dir", "huge_pages", "load", "parallel_for", "reuse_freed_memory", "status",
           "thread_ranges"]

FLAGS = ["-O3", "-ffp-contract=off", "-fno-math-errno", "-fno-trapping-math", "-fPIC", "-shared", "-std=c99"]
_NATIVE = ["-march=native"]

T = TypeVar("T")

_lock = threading.Lock()
_loaded: dict[str, object] = {}  # name -> the bound kernel, or a str saying why there is none


def cache_dir() -> Path:
    """Where built libraries are kept."""
    root = os.environ.get("AGENTSIM_KERNEL_DIR")
    if root:
        return Path(root)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "agentsim" / "kernels"


def _cpu_signature() -> str:
    """What ``-march=native`` depends on: the CPU's model and flags (a shared home directory may
    be mounted on machines with different CPUs).
    """
    try:
        text = Path("/proc/cpuinfo").read_text()
        lines = [ln for ln in text.splitlines() if ln.startswith(("model name", "flags", "Features", "CPU part"))]
        return "\n".join(sorted(set(lines)))
    except OSError:
        return platform.processor()


def _build(name: str, source: str, compiler: str) -> Path:
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=30).stdout
    flags = FLAGS + (_NATIVE if platform.machine() in ("x86_64", "AMD64") else [])
    digest = hashlib.sha256("\0".join([source, *flags, version, platform.machine(), _cpu_signature()])
                            .encode()).hexdigest()[:16]
    directory = cache_dir()
    target = directory / f"{name}-{digest}.so"
    if target.exists():
        return target
    directory.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=directory) as tmp:
        src = Path(tmp) / f"{name}.c"
        src.write_text(source)
        built = Path(tmp) / f"{name}.so"
        proc = subprocess.run([compiler, *flags, str(src), "-o", str(built), "-lm"], capture_output=True,
                              text=True, timeout=120)
        if proc.returncode != 0:
            raise OSError(f"{compiler} failed: {proc.stderr.strip()[-400:]}")
        os.replace(built, target)  # atomic: ranks building at once each install a whole library
    return target


def _disabled(switch: str | None) -> bool:
    return os.environ.get("AGENTSIM_KERNELS", "1") == "0" or (
        switch is not None and os.environ.get(switch, "1") == "0")


def load(name: str, source: str, bind: Callable[[ctypes.CDLL, Path], T], *, switch: str | None = None,
         what: str = "kernel") -> T | None:
    """The kernel ``name`` built from ``source`` and wrapped by ``bind(library, path)``, built once
    per process; None where it is switched off (``AGENTSIM_KERNELS=0`` or ``switch=0``) or cannot
    be built (warned once: the caller's torch ops give the same bits, slower).
    """
    if _disabled(switch):
        return None
    with _lock:
        got = _loaded.get(name)
        if got is None:
            compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
            try:
                if compiler is None:
                    raise OSError("no C compiler found (set CC, or install gcc or clang)")
                path = _build(name, source, compiler)
                got = bind(ctypes.CDLL(str(path)), path)
            except (OSError, subprocess.SubprocessError, AttributeError) as e:
                got = f"eager: the {what} could not be built ({e})"
                hint = f"Set {switch}=0 to skip the build." if switch else "Set AGENTSIM_KERNELS=0 to skip the build."
                warnings.warn(f"agentsim: {got}; torch ops are used instead (same bits, slower). {hint}",
                              RuntimeWarning, stacklevel=3)
            _loaded[name] = got
        return None if isinstance(got, str) else got  # type: ignore[return-value]


def status(name: str) -> str:
    """Why the kernel ``name`` is not in use (``"eager: ..."``), or ``""`` when it is loaded or not
    asked for yet.
    """
    got = _loaded.get(name)
    return got if isinstance(got, str) else ""


_M_TRIM_THRESHOLD, _M_MMAP_MAX = -1, -4  # glibc's mallopt parameters
_malloc_tuned: bool | None = None


def reuse_freed_memory() -> bool:
    """Let glibc serve large allocations from its heap and keep freed memory for reuse (once per
    process; True where applied).

    glibc gives every allocation above 32 MB fresh pages from the kernel (``mmap``) and returns
    them when freed, so each new 80 MB tensor of a 10M-agent step pays a page fault per 4 KiB
    before it is written: a ``float32 -> float64`` copy of ``[10M, 2]`` took 77 ms that way and
    14 ms from reused memory, and the random walk's step at 10M fell from 0.39-0.44 s to 0.26 s.
    With ``mallopt(M_MMAP_MAX, 0)`` and a high ``M_TRIM_THRESHOLD`` freed blocks stay in the
    process and are reused. Results are unchanged; the process keeps its peak memory mapped
    (what a simulation's peak needs anyway). :class:`~agentsim.Simulation` calls this on the CPU;
    ``AGENTSIM_MALLOC=system`` keeps glibc's defaults. No effect off glibc.
    """
    global _malloc_tuned
    if _malloc_tuned is None:
        _malloc_tuned = False
        if os.environ.get("AGENTSIM_MALLOC", "") != "system" and platform.libc_ver()[0] == "glibc":
            try:
                libc = ctypes.CDLL(None)
                _malloc_tuned = bool(libc.mallopt(_M_MMAP_MAX, 0)) and bool(libc.mallopt(_M_TRIM_THRESHOLD, 2**31 - 1))
            except (OSError, AttributeError):
                pass
    return _malloc_tuned


# ---------------------------------------------------------------- threads
_pool: ThreadPoolExecutor | None = None
_pool_size = 0
_pool_pid = 0


def thread_ranges(n: int, min_per_thread: int) -> list[tuple[int, int]]:
    """``[0, n)`` cut into ``min(torch threads, n // min_per_thread)`` (at least one) contiguous
    ranges of nearly equal size.
    """
    threads = max(1, min(torch.get_num_threads(), n // max(min_per_thread, 1)))
    bounds = [n * k // threads for k in range(threads + 1)]
    return list(itertools.pairwise(bounds))


def parallel_for(n: int, min_per_thread: int, body: Callable[[int, int], object]) -> None:
    """``body(a, b)`` for the pieces ``[a, b)`` of :func:`thread_ranges` ``(n, min_per_thread)``, at
    once, one a thread (``body`` calls a kernel that releases the GIL), and wait for all; the last
    piece runs on the caller's thread (one thread fewer to wake, and the caller does not sit idle).
    The pool is made again after a fork.
    """
    global _pool, _pool_size, _pool_pid
    calls = [functools.partial(body, a, b) for a, b in thread_ranges(n, min_per_thread)]
    if len(calls) == 1:
        calls[0]()
        return
    helpers = len(calls) - 1
    with _lock:
        if _pool is None or _pool_size < helpers or _pool_pid != os.getpid():  # a forked child has no threads
            if _pool is not None and _pool_pid == os.getpid():
                _pool.shutdown(wait=False)
            _pool = ThreadPoolExecutor(helpers, thread_name_prefix="agentsim-kernel")
            _pool_size, _pool_pid = helpers, os.getpid()
        pool = _pool
    jobs = [pool.submit(call) for call in calls[:-1]]
    try:
        calls[-1]()
    finally:  # the other pieces write into the caller's buffers: wait for them even if this one raised
        for job in jobs:
            job.result()


# ---------------------------------------------------------------- huge pages
_MADV_HUGEPAGE = 14  # Linux
_HUGE_PAGE = 2 << 20
_HUGE_MIN = 64 << 20  # below this a tensor is left alone


def huge_pages(ptr: int, nbytes: int) -> bool:
    """Ask Linux for 2 MiB pages (``madvise(MADV_HUGEPAGE)``) for the whole 2 MiB pages inside
    ``[ptr, ptr + nbytes)``; call it before the memory is first written. True where applied.

    For arrays of gigabytes written or read at random (the lean network build places 2 entries
    per edge at random rows of ``indices``): with 4 KiB pages nearly every access also misses
    the TLB. Placing the 1G entries of a 100M-node graph of degree 10 took 131 s with 4 KiB
    pages and 64 s with 2 MiB pages here (one thread). Only where the system's transparent
    huge pages are ``madvise`` or ``always``; no effect on the contents. Skipped below 64 MiB
    and off Linux.
    """
    if nbytes < _HUGE_MIN or not sys.platform.startswith("linux"):
        return False
    start = -(-ptr // _HUGE_PAGE) * _HUGE_PAGE
    end = (ptr + nbytes) // _HUGE_PAGE * _HUGE_PAGE
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        return end > start and libc.madvise(start, end - start, _MADV_HUGEPAGE) == 0
    except (OSError, AttributeError):
        return False
