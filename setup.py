"""The native kernels' install-time build (everything else is in pyproject.toml).

``agentsim/_native/src/*.c`` are compiled into the plain shared library
``agentsim/_native/libagentsim_kernels.so.0``, which agentsim loads with ctypes (it has no Python C API, no
``PyInit``). The extension is optional: without a C compiler (or where the build fails) the install
still succeeds, and agentsim builds the library on first use into its cache, or, without a compiler
then either, warns once and runs the same computations with torch ops (see
agentsim/_native/build.py).

Environment: ``AGENTSIM_REQUIRE_KERNELS=1`` makes a failed build fail the install (CI);
``AGENTSIM_KERNELS_WERROR=1`` makes compiler warnings errors (CI); ``AGENTSIM_PORTABLE_KERNELS=1``
builds for any CPU of the architecture instead of this one (``-march=native``).
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = Path(__file__).resolve().parent
_spec = importlib.util.spec_from_file_location("_agentsim_native_sources", HERE / "agentsim/_native/sources.py")
assert _spec is not None and _spec.loader is not None
sources = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sources)

REQUIRED = os.environ.get("AGENTSIM_REQUIRE_KERNELS") == "1"


class BuildKernels(build_ext):
    """``build_ext`` for a ctypes library: the kernels' flags and build stamp, no ``PyInit`` export,
    and only with a GCC-style compiler (the sources use GCC builtins).
    """

    def build_extension(self, ext: Extension) -> None:
        """Compile the kernels with :func:`sources.compile_flags`, stamped with their build info."""
        if self.compiler.compiler_type != "unix":
            message = f"the native kernels need gcc or clang, not {self.compiler.compiler_type}"
            if REQUIRED:
                raise RuntimeError(message)
            self.warn(f"{message}: skipped (agentsim will use torch ops, or build them on first use)")
            return
        ext.extra_compile_args = sources.compile_flags()
        ext.define_macros = [("AGENTSIM_BUILD_INFO", f'"{sources.build_info("install")}"')]
        super().build_extension(ext)

    def get_ext_filename(self, fullname: str) -> str:
        """``agentsim/_native/libagentsim_kernels.so.0``: not a name Python imports as a module."""
        return os.path.join(os.path.dirname(super().get_ext_filename(fullname)), sources.LIBRARY_FILE)

    def get_export_symbols(self, ext: Extension) -> list[str]:
        """The extension's own exports only."""
        return list(ext.export_symbols or [])  # not PyInit_<name>: the library is no Python module


setup(
    ext_modules=[Extension(
        f"agentsim._native.{sources.LIBRARY_NAME}",
        sources=[f"agentsim/_native/src/{name}" for name in sources.SOURCES],
        depends=[f"agentsim/_native/src/{name}" for name in sources.HEADERS],
        include_dirs=["agentsim/_native/src"],
        libraries=["m"],
        optional=not REQUIRED,
    )],
    cmdclass={"build_ext": BuildKernels},
)
