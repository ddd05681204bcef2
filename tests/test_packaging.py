"""The installed layout: the reference models install as ``agentsim.models``, and nothing named
``models`` lands in site-packages; pyproject.toml lists every package directory."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]


def test_reference_models_import_as_agentsim_models_and_no_top_level_models(tmp_path):
    # Outside the repository, so that only what was installed can be imported.
    code = ("import importlib.util, agentsim, agentsim.models.sir as m; "
            "print(m.MODEL.name, agentsim.get_model('sir') is m.MODEL, importlib.util.find_spec('models'))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["sir", "True", "None"]


def test_pyproject_lists_every_package_directory():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    mapped = {name: ROOT / path for name, path in config["package-dir"].items()}
    found = {"agentsim.models", "agentsim.data"} | {
        ".".join(init.parent.relative_to(ROOT).parts) for init in (ROOT / "agentsim").rglob("__init__.py")}
    assert sorted(config["packages"]) == sorted(found)
    assert mapped == {"agentsim.models": ROOT / "models", "agentsim.data": ROOT / "data"}


def test_the_kernel_sources_are_compiled_and_installed():
    # every C file of agentsim/_native/src is compiled (sources.SOURCES) or included (HEADERS), and the
    # package data installs them (the first-use build compiles the installed copies)
    import fnmatch

    from agentsim._native import sources

    present = sorted(p.name for p in sources.SOURCE_DIR.iterdir() if p.suffix in (".c", ".h"))
    assert present == sorted((*sources.SOURCES, *sources.HEADERS))
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    globs = setuptools["package-data"]["agentsim._native"]
    assert all(any(fnmatch.fnmatch(f"src/{name}", g) for g in globs) for name in present)
    assert sources.SOURCE_DIR == ROOT / "agentsim" / "_native" / "src"
