"""Sphinx extension: the API reference, one page per public module, generated from ``__all__``.

Every name in the ``__all__`` of a module of :data:`PUBLIC_MODULES` gets an entry (autodoc), at
the first module that exports it; a later module that re-exports the same object links to that
entry instead of documenting it twice. The pages are written to ``reference/api/`` (not kept in
git) when the build starts. ``check_reference.py`` checks the built inventory against the same
lists, and that no module with an ``__all__`` is missing from :data:`PUBLIC_MODULES`.
"""

from __future__ import annotations

import importlib
import inspect
from pathlib import Path
from types import ModuleType
from typing import Any

#: The modules whose ``__all__`` is agentsim's public API, in the order the reference lists them,
#: with a one-line summary for the index.
PUBLIC_MODULES: dict[str, str] = {
    "agentsim": "the names a model and a run need: Model, Param, Context, spaces, run, Study, ...",
    "agentsim.engine": "the engine: Simulation and RunResult",
    "agentsim.threads": "torch's CPU threads: at most the usable cores, fewer while other processes keep cores busy",
    "agentsim.space.continuous": "continuous space: the box, its cell grid, radius searches",
    "agentsim.space.graph": "networks: the graph space and its builders",
    "agentsim.io": "reading trajectory files (numpy, pandas, xarray)",
    "agentsim.distributed": "process groups and partitioners",
    "agentsim.runner.launch": "starting W ranks: launch, run_ranks",
    "agentsim.core.ops": "vectorized reductions with exact, order-free sums",
    "agentsim.core.portable": "sqrt, sin and cos with the same bits on the CPU and on a GPU",
    "agentsim.space.fused": "the fused GPU neighbor kernels: which path a call takes",
    "agentsim.population": "synthetic populations: households, schools, workplaces, localities",
    "agentsim.core.metrics": "metric declarations and exact metric sums",
    "agentsim.grad.relax": "relaxed discrete draws for gradients",
    "agentsim.learn": "training agent policies with PPO",
    "agentsim.calibrate": "fitting parameters to data",
    "agentsim.study": "population studies on a process pool or Ray",
    "agentsim.plot": "figures and animations of trajectory and study files",
    "agentsim.data": "data sets that ship with agentsim",
}


def public_names(module: ModuleType) -> list[str]:
    """The names a module exports (its ``__all__``, without dunder names)."""
    return [n for n in getattr(module, "__all__", []) if not n.startswith("__")]


def _directive(obj: Any) -> str:
    if inspect.ismodule(obj):
        return "automodule"
    if inspect.isclass(obj):
        return "autoexception" if issubclass(obj, BaseException) else "autoclass"
    if callable(obj):
        return "autofunction"
    return "autodata"


def _page(module_name: str, summary: str, documented: dict[int, str]) -> str:
    module = importlib.import_module(module_name)
    lines = [f"# `{module_name}`", "", f"{summary[0].upper()}{summary[1:]}.", "",
             "```{eval-rst}", f".. automodule:: {module_name}", "   :no-members:", "", "```", ""]
    for name in public_names(module):
        obj = getattr(module, name)
        full = f"{module_name}.{name}"
        key = id(obj)
        if key in documented and not isinstance(obj, (int, float, str, tuple, frozenset)):
            lines += [f"## `{name}`", "", f"The same object as {{py:obj}}`{documented[key]}`.", ""]
            continue
        documented.setdefault(key, full)
        directive = _directive(obj)
        lines += [f"## `{name}`", "", "```{eval-rst}", f".. {directive}:: {full}"]
        if directive == "automodule":
            lines += ["   :members:"]
        if directive == "autodata":
            lines += ["   :no-value:"] if not isinstance(obj, (int, float, str, tuple, frozenset)) else []
        lines += ["```", ""]
    return "\n".join(lines)


def write_pages(out: Path) -> list[str]:
    """Write one page per public module into ``out``, and ``out/index.md``; return the page names."""
    out.mkdir(parents=True, exist_ok=True)
    documented: dict[int, str] = {}
    pages = []
    for module_name, summary in PUBLIC_MODULES.items():
        page = module_name.replace(".", "-")
        text = _page(module_name, summary, documented)
        target = out / f"{page}.md"
        if not target.exists() or target.read_text() != text:  # unchanged pages are not rebuilt
            target.write_text(text)
        pages.append(page)
    index = ["# Python API", "", "Every public name, generated from the docstrings. Each module lists what its "
             "`__all__` exports.", "", "| module | what |", "| --- | --- |"]
    index += [f"| {{doc}}`{m} <{m.replace('.', '-')}>` | {s} |" for m, s in PUBLIC_MODULES.items()]
    index += ["", "```{toctree}", ":hidden:", "", *pages, "```", ""]
    text = "\n".join(index)
    if not (out / "index.md").exists() or (out / "index.md").read_text() != text:
        (out / "index.md").write_text(text)
    return pages


def _generate(app: Any) -> None:
    write_pages(Path(app.srcdir) / "reference" / "api")


def setup(app: Any) -> dict[str, Any]:
    """Register the page generator (runs when the builder starts)."""
    app.connect("builder-inited", _generate)
    return {"parallel_read_safe": True, "version": "1"}
