"""Small C kernels compiled on first use: the build, the cache and the loading, shared by every kernel.

A kernel is C source (a few loops that torch would run as many passes) compiled with the system
C compiler into a shared library cached under ``~/.cache/agentsim/kernels`` (``AGENTSIM_KERNEL_DIR``
overrides), keyed by the source, the flags, the compiler's version and the CPU, and loaded with
:mod:`ctypes`. Where there is no compiler or a build fails, :func:`load` warns once and returns
None, and the caller uses its torch ops: every kernel gives the same bits as its torch path (the
flags forbid fused multiply-adds), so a machine without a compiler runs the same trajectory, only
slower. ``AGENTSIM_KERNELS=0`` turns every kernel off (for A/B measurements); a kernel may have
its own switch too (``AGENTSIM_RNG_KERNEL=0``).

Users of this module: :mod:`agentsim.rng_kernel` (counter-based draws) and
:mod:`agentsim.cpu_kernels` (graph pushes, exact metric sums).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import threading
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

__all__ = ["FLAGS", "cache_dir", "load", "reuse_freed_memory", "status"]

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
