"""The kernels' C sources and how they are compiled: shared by the install-time build (``setup.py``,
which loads this file by path: it imports nothing but the standard library) and the first-use build
into the cache (:mod:`agentsim._native.build`).

The sources live in ``agentsim/_native/src``: ``agentsim_kernels.h`` declares every function the
Python side calls (bound by the table of :mod:`agentsim._native.bindings`), one ``.c`` file per
domain defines them. Both builds compile all of them into one shared library with :data:`FLAGS`
(``-ffp-contract=off``: no fused multiply-adds, so every kernel keeps the bits of its torch ops)
and :func:`warning_flags`, and stamp it with :func:`build_info` (the sources' digest and the CPU
it was tuned for), which the loader compares with the installed sources and this machine before
it uses a library.

Environment (read at build time):
    ``AGENTSIM_KERNELS_WERROR=1``: compiler warnings are errors (CI sets it).
    ``AGENTSIM_PORTABLE_KERNELS=1``: no ``-march=native`` (a library for any CPU of the
    architecture, e.g. a wheel built for other machines; slower).
"""

from __future__ import annotations

import hashlib
import os
import platform
from pathlib import Path

SOURCE_DIR = Path(__file__).resolve().parent / "src"
HEADER = "agentsim_kernels.h"
# one file per domain, plus library.c (agentsim_build_info)
SOURCES = ("library.c", "rng.c", "graph.c", "grid.c", "continuous.c", "ops.c", "metrics.c")
HEADERS = (HEADER, "common.h", "rng_constants.h")
LIBRARY_NAME = "_kernels"  # the setuptools extension agentsim._native._kernels (a plain shared library: no PyInit)
# its file: a name Python does not take for a module (no .so ending), so that nothing imports it or lists
# it among the package's modules (pkgutil, doctest, Sphinx autodoc); ctypes loads it by path
LIBRARY_FILE = "libagentsim_kernels.so.0"

# -ffp-contract=off: no fused multiply-adds (the bits of the torch ops); no errno or trap handling,
# so the loops of math calls vectorize.
FLAGS = ("-O3", "-std=c99", "-ffp-contract=off", "-fno-math-errno", "-fno-trapping-math")
WARNINGS = ("-Wall", "-Wextra")
NATIVE = ("-march=native",)


def warning_flags() -> list[str]:
    """``-Wall -Wextra``, and ``-Werror`` where ``AGENTSIM_KERNELS_WERROR=1``."""
    return [*WARNINGS, *(["-Werror"] if os.environ.get("AGENTSIM_KERNELS_WERROR") == "1" else [])]


def tuned_for_this_cpu() -> bool:
    """Whether the build adds ``-march=native``: on x86-64 unless ``AGENTSIM_PORTABLE_KERNELS=1``
    (elsewhere the compilers' defaults are kept).
    """
    return (platform.machine().lower() in ("x86_64", "amd64")
            and os.environ.get("AGENTSIM_PORTABLE_KERNELS") != "1")


def compile_flags() -> list[str]:
    """Every flag a build passes to the compiler for the sources (not the link's ``-shared``)."""
    return [*FLAGS, *(NATIVE if tuned_for_this_cpu() else ()), *warning_flags()]


def source_digest(directory: Path = SOURCE_DIR) -> str:
    """16 hex digits of the sha256 of every source and header (names and contents), or ``""`` where
    a file is missing.
    """
    digest = hashlib.sha256()
    for name in (*SOURCES, *HEADERS):
        path = directory / name
        if not path.is_file():
            return ""
        digest.update(name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def cpu_signature() -> str:
    """16 hex digits identifying what ``-march=native`` depends on: the CPU's model and flags (a
    shared home directory or a wheel cache may be used by machines with different CPUs).
    """
    try:
        text = Path("/proc/cpuinfo").read_text()
        wanted = ("model name", "flags", "Features", "CPU part")
        lines = sorted({ln for ln in text.splitlines() if ln.startswith(wanted)})
        found = "\n".join(lines)
    except OSError:
        found = platform.processor()
    return hashlib.sha256(f"{platform.machine()}\n{found}".encode()).hexdigest()[:16]


def build_info(origin: str) -> str:
    """What a library is stamped with (``agentsim_build_info()``): ``origin=install|cache;
    sources=DIGEST;cpu=SIGNATURE|portable`` (no spaces or quotes: it is passed as a ``-D`` value).
    """
    cpu = cpu_signature() if tuned_for_this_cpu() else "portable"
    return f"origin={origin};sources={source_digest()};cpu={cpu}"


def parse_build_info(text: str) -> dict[str, str]:
    """``build_info``'s fields as a dict (``{}`` for a library without them)."""
    return dict(part.split("=", 1) for part in text.split(";") if "=" in part)


def define_build_info(origin: str) -> str:
    """The ``-D`` flag that stamps a library with :func:`build_info`."""
    return f'-DAGENTSIM_BUILD_INFO="{build_info(origin)}"'
