"""The kernel library: where it comes from, its loading, and the threads and memory its callers use.

The C sources (``agentsim/_native/src``, see :mod:`agentsim._native.sources`) are compiled into
one shared library, loaded with :mod:`ctypes` and bound by the table of
:mod:`agentsim._native.bindings`. :func:`library` finds it, in this order:

1. **built at install**: ``pip install`` compiles the sources into ``agentsim/_native/libagentsim_kernels.so.0``
   (an optional setuptools extension: the install succeeds without a compiler). It is used when
   it was built from the installed sources (an edit since ``pip install -e .`` makes it stale) for
   this CPU. ``AGENTSIM_KERNEL_LIBRARY=PATH`` names another library file to use instead.
2. **built at first use**: otherwise the system C compiler (``CC``, else ``cc``, ``gcc``,
   ``clang``) builds the sources into a library cached under ``~/.cache/agentsim/kernels``
   (``AGENTSIM_KERNEL_DIR`` overrides), keyed by the sources, the flags, the compiler's version
   and the CPU; its compiler warnings are shown (``-Wall -Wextra``).
3. **not available**: no compiler, or a failed build: warned once, and the callers use their
   torch ops, which give the same bits (every kernel does the torch path's correctly rounded
   operations in its order; no fused multiply-adds), only slower.

Environment: ``AGENTSIM_KERNELS=0`` turns every kernel off (for A/B measurements; a kernel may have
its own switch too, ``AGENTSIM_RNG_KERNEL=0``); ``AGENTSIM_KERNELS=cache`` skips the library built at
install (step 2 directly); ``AGENTSIM_REQUIRE_KERNELS=1`` makes a library that cannot be had an
error instead of a warning (CI sets it, so that the kernels' tests fail rather than skip).
:func:`library_status` says which step gave the library, or why there is none (``agentsim info``).

Kernels that run on several threads hand their loop to :func:`parallel_for`, which runs its
pieces at once (ctypes releases the GIL during a call).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import itertools
import os
import platform
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import warnings
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch

from agentsim._native import sources
from agentsim._native.bindings import Library

__all__ = ["KernelStatus", "cache_dir", "huge_pages", "installed_library_path", "library", "library_status",
           "one_off_memory", "parallel_for", "reuse_freed_memory", "thread_ranges"]

_lock = threading.Lock()
_loaded: dict[str, Library | str] = {}  # AGENTSIM_KERNELS's value -> the library, or why there is none
_why_not_installed: dict[str, str] = {}  # AGENTSIM_KERNELS's value -> why the install-time library is not used


@dataclass(frozen=True)
class KernelStatus:
    """Which kernel library is in use and why.

    Attributes:
        state: ``"installed"`` (built by ``pip install``), ``"cache"`` (built on first use),
            ``"disabled"`` (``AGENTSIM_KERNELS=0``), ``"unavailable"`` (no compiler, a failed build)
            or ``"not loaded"`` (not asked for yet).
        path: The library's file, or None.
        detail: Why: the build information of the library in use, or the reason for none.
    """

    state: str
    path: str | None
    detail: str

    @property
    def active(self) -> bool:
        """Whether the kernels run (a library is loaded)."""
        return self.state in ("installed", "cache")


def cache_dir() -> Path:
    """Where libraries built on first use are kept."""
    root = os.environ.get("AGENTSIM_KERNEL_DIR")
    if root:
        return Path(root)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "agentsim" / "kernels"


def installed_library_path() -> Path | None:
    """The library built at install (``AGENTSIM_KERNEL_LIBRARY`` where set), or None where there is
    none (no compiler at install, or a source checkout not installed).
    """
    named = os.environ.get("AGENTSIM_KERNEL_LIBRARY")
    if named:
        return Path(named)
    here = Path(__file__).resolve().parent
    path = here / sources.LIBRARY_FILE
    return path if path.is_file() else None


def _mode() -> str:
    return os.environ.get("AGENTSIM_KERNELS", "1")


def _required() -> bool:
    return os.environ.get("AGENTSIM_REQUIRE_KERNELS") == "1"


def _compiler() -> list[str]:
    """The C compiler's command: ``CC`` (e.g. ``gcc`` or ``ccache clang``), else the first of
    ``cc``, ``gcc``, ``clang`` found.

    Raises:
        OSError: None found (saying what was looked for).
    """
    named = shlex.split(os.environ.get("CC", ""))
    if named:
        found = shutil.which(named[0])
        if found is None:
            raise OSError(f"no C compiler: CC={named[0]} is not an executable")
        return [found, *named[1:]]
    found = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if found is None:
        raise OSError("no C compiler found (looked for cc, gcc and clang; set CC, or install gcc or clang)")
    return [found]


def _load_installed(path: Path) -> Library:
    """The library at ``path`` if it was built from the installed sources for this CPU.

    Raises:
        OSError: It cannot be loaded, lacks a function, or is stale or for another CPU (the reason).
    """
    try:
        lib = Library(ctypes.CDLL(str(path)), path, "install")
    except AttributeError as e:
        raise OSError(f"{path} lacks a kernel ({e}): an older build") from None
    info = sources.parse_build_info(lib.build_info())
    digest = sources.source_digest()
    if digest and info.get("sources") != digest:
        raise OSError(f"{path} was built from other sources (sources={info.get('sources')}, installed "
                      f"sources={digest}: edited since the install? pip install again to rebuild it)")
    if info.get("cpu") not in ("portable", sources.cpu_signature()):
        raise OSError(f"{path} was built with -march=native on another CPU")
    return lib


def _build_into_cache(compiler: list[str]) -> Path:
    """The library built from the sources with ``compiler`` into :func:`cache_dir` (once per key).

    Raises:
        OSError: The build failed (the compiler's last lines of output).
    """
    version = subprocess.run([*compiler, "--version"], capture_output=True, text=True, timeout=30).stdout
    flags = [*sources.compile_flags(), "-fPIC", "-shared", sources.define_build_info("cache"),
             f"-I{sources.SOURCE_DIR}"]
    if not sources.source_digest():
        raise OSError(f"the kernels' sources are missing from {sources.SOURCE_DIR}")
    key = hashlib.sha256("\0".join([sources.source_digest(), *flags[:-1], version, platform.machine(),
                                     sources.cpu_signature()]).encode()).hexdigest()[:16]
    directory = cache_dir()
    target = directory / f"agentsim_kernels-{key}.so"
    if target.exists():
        return target
    directory.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=directory) as tmp:
        built = Path(tmp) / "agentsim_kernels.so"
        files = [str(sources.SOURCE_DIR / name) for name in sources.SOURCES]
        proc = subprocess.run([*compiler, *flags, *files, "-o", str(built), "-lm"], capture_output=True, text=True,
                              timeout=300)
        if proc.returncode != 0:
            raise OSError(f"{' '.join(compiler)} failed: {proc.stderr.strip()[-600:]}")
        if proc.stderr.strip():
            warnings.warn(f"agentsim: compiler warnings building the native kernels (please report them):\n"
                          f"{proc.stderr.strip()[-2000:]}", RuntimeWarning, stacklevel=4)
        os.replace(built, target)  # atomic: ranks building at once each install a whole library
    return target


def _find() -> Library | str:
    """The library by the steps of the module docstring, or why there is none."""
    skipped = ""
    installed = installed_library_path() if _mode() != "cache" else None
    if installed is not None:
        try:
            return _load_installed(installed)
        except OSError as e:
            skipped = str(e)
    elif _mode() == "cache":
        skipped = "AGENTSIM_KERNELS=cache"
    else:
        skipped = "no library was built at install (no C compiler then?)"
    _why_not_installed[_mode()] = skipped
    try:
        path = _build_into_cache(_compiler())
        return Library(ctypes.CDLL(str(path)), path, "cache")
    except (OSError, subprocess.SubprocessError, AttributeError) as e:
        return f"the native CPU kernel library could not be built ({e})"


def library() -> Library | None:
    """The kernel library (found or built once per process), or None where it is switched off
    (``AGENTSIM_KERNELS=0``) or cannot be had (warned once: the callers' torch ops give the same
    bits, slower).

    Raises:
        RuntimeError: No library where ``AGENTSIM_REQUIRE_KERNELS=1``.
    """
    mode = _mode()
    if mode == "0":
        return None
    got = _loaded.get(mode)
    if isinstance(got, Library):  # found before: no lock (a dict read is atomic)
        return got
    with _lock:
        got = _loaded.get(mode)
        if got is None:
            got = _loaded[mode] = _find()
            if isinstance(got, str) and not _required():
                warnings.warn(f"agentsim: {got}; torch ops are used instead (same bits, slower). "
                              "Set AGENTSIM_KERNELS=0 to skip the build.", RuntimeWarning, stacklevel=3)
    if isinstance(got, str):
        if _required():
            raise RuntimeError(f"agentsim: {got}, and AGENTSIM_REQUIRE_KERNELS=1 requires the kernels")
        return None
    return got


def library_status(load: bool = True) -> KernelStatus:
    """Which library is in use and why (loading it first unless ``load`` is False)."""
    mode = _mode()
    if mode == "0":
        return KernelStatus("disabled", None, "AGENTSIM_KERNELS=0: torch ops run instead")
    if load:
        try:
            library()
        except RuntimeError:
            pass
    got = _loaded.get(mode)
    if got is None:
        return KernelStatus("not loaded", None, "not used yet in this process")
    if isinstance(got, str):
        return KernelStatus("unavailable", None, f"{got}: torch ops run instead (same bits, slower)")
    info = got.build_info()
    if got.origin == "install":
        return KernelStatus("installed", str(got.path), f"built at install ({info})")
    why = _why_not_installed.get(mode, "")
    return KernelStatus("cache", str(got.path), f"built at first use into the cache ({info}); "
                                                 f"not the install-time library: {why}")


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


_GLIBC_MMAP_MAX = 65536  # glibc's default M_MMAP_MAX
_one_off_depth = 0  # one_off_memory blocks open (nested, or on several threads)


@contextlib.contextmanager
def one_off_memory() -> Iterator[None]:
    """Within the block, large allocations get fresh pages again (glibc's default) and give them
    back when freed, where :func:`reuse_freed_memory` was applied: for a one-off computation
    whose temporaries are large and of sizes not seen again (a group index built on the first
    step), so that they neither stay in the process nor leave holes that raise its peak.
    Nothing happens elsewhere.
    """
    global _one_off_depth
    if not _malloc_tuned:
        yield
        return
    libc = ctypes.CDLL(None)
    with _lock:
        _one_off_depth += 1
        if _one_off_depth == 1:
            libc.mallopt(_M_MMAP_MAX, _GLIBC_MMAP_MAX)
    try:
        yield
    finally:
        with _lock:
            _one_off_depth -= 1
            if _one_off_depth == 0:
                libc.mallopt(_M_MMAP_MAX, 0)


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
    if n < 2 * min_per_thread:  # one piece (thread_ranges' count is 1): no split to make
        body(0, n)
        return
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
