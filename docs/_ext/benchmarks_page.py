"""Sphinx extension: the benchmarks page's tables and plots, generated from the recorded results.

When the build starts (``builder-inited``) it calls ``benchmarks/report.py`` (plain Python with
matplotlib, usable without Sphinx: ``python benchmarks/report.py``), which reads every
``benchmarks/results/**/*.json`` and writes ``_generated/benchmarks-tables.md`` and one PNG per
suite into ``_generated/benchmarks/`` under the documentation's source folder (ignored by git).
``benchmarks.md`` includes that Markdown with MyST's ``{include}`` directive. The folder is added
to ``exclude_patterns`` so that Sphinx does not read the generated file as a page of its own.

Nothing is rewritten when neither the results nor the renderer changed (a fingerprint of both is
kept next to the plots), and a file whose bytes are unchanged keeps its time, so an unchanged
build does not re-read the page.
"""

from __future__ import annotations

import importlib.util
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

from sphinx.util import logging

ROOT = Path(__file__).resolve().parents[2]
REPORT = ROOT / "benchmarks" / "report.py"
RESULTS = ROOT / "benchmarks" / "results"
GENERATED = "_generated"

logger = logging.getLogger(__name__)


def load_report() -> ModuleType:
    """Import ``benchmarks/report.py`` (``benchmarks/`` is not a package)."""
    spec = importlib.util.spec_from_file_location("agentsim_benchmarks_report", REPORT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _exclude_generated(app: Any, config: Any) -> None:
    if GENERATED not in config.exclude_patterns:
        config.exclude_patterns.append(GENERATED)


def _generate(app: Any) -> None:
    out = Path(app.srcdir) / GENERATED
    start = time.perf_counter()
    report = load_report().write(RESULTS, out / "benchmarks-tables.md", out / "benchmarks")
    seconds = time.perf_counter() - start
    if report is None:
        logger.info(f"benchmarks page: results unchanged ({seconds:.2f} s)")
    else:
        logger.info(f"benchmarks page: {len(report.sections)} suites rendered in {seconds:.2f} s")


def setup(app: Any) -> dict[str, Any]:
    """Register the generator (before the sources are read) and exclude its output folder."""
    app.connect("config-inited", _exclude_generated)
    app.connect("builder-inited", _generate)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
