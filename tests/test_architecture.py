"""The package's layers: every import (module level, inside functions, or for type checking only)
goes downward, and no modules import each other in a circle.

The layers, bottom to top (a module may import its own package and any layer below it):

    errors, _version      leaf modules every layer may use
    threads               torch's CPU threads: capped by the usable cores, adapted to the load
    _native               C kernels and their build; nothing else from agentsim
    core                  params, state, substep, context, random, ops, metrics, env, model, comm protocol
    space                 grid, continuous box, graph, neighbor interactions
    population            synthetic populations: people in households, schools, workplaces
    grad                  differentiable collectives, relaxed draws, rollout gradients
    io                    HDF5, recording, checkpoints, config files, locks
    distributed           partitioners, torch.distributed comm, process groups
    engine                the Simulation
    runner                run(), worker processes, RunSpec, the invariance check
    learn, calibrate, study   (peers: none imports another)
    plot
    cli
    agentsim              the public facade (agentsim/__init__.py), __main__

The reference models (``agentsim.models``) sit above all of it and import only the facade
and the public subpackages.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "agentsim"

LAYERS: list[set[str]] = [
    {"agentsim.errors", "agentsim._version"},
    {"agentsim.threads"},
    {"agentsim._native"},
    {"agentsim.core"},
    {"agentsim.space"},
    {"agentsim.population"},
    {"agentsim.grad"},
    {"agentsim.io"},
    {"agentsim.distributed"},
    {"agentsim.engine"},
    {"agentsim.runner"},
    {"agentsim.learn", "agentsim.calibrate", "agentsim.study"},
    {"agentsim.plot"},
    {"agentsim.cli"},
    {"agentsim", "agentsim.__main__"},
]


def modules() -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its own name)."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


MODULES = modules()


def layer_of(module: str) -> tuple[int, str]:
    """(rank, unit): the layer a module belongs to and the unit (package or leaf module) it is in."""
    for rank, units in enumerate(LAYERS):
        for unit in sorted(units, key=len, reverse=True):
            if unit == "agentsim":
                if module == "agentsim":
                    return rank, unit
            elif module == unit or module.startswith(unit + "."):
                return rank, unit
    raise AssertionError(f"module {module} is in no layer: add its package to LAYERS in {__file__}")


def type_only_nodes(tree: ast.AST) -> set[int]:
    """ids of the import statements under ``if TYPE_CHECKING:`` (they never run)."""
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.body:
                ids.update(id(sub) for sub in ast.walk(child))
    return ids


def imported(module: str, path: Path, *, type_only: bool = True) -> Iterator[tuple[str, int]]:
    """(module, line) for every agentsim module that ``module`` imports, anywhere in its source
    (inside functions too); with ``type_only=False``, not those under ``if TYPE_CHECKING:``.
    """
    tree = ast.parse(path.read_text(), str(path))
    is_package = path.name == "__init__.py"
    skip = set() if type_only else type_only_nodes(tree)
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                if not is_package:
                    base = base[:-1]
                base = base[: len(base) - (node.level - 1)]
                absolute = ".".join(base + ([node.module] if node.module else []))
            else:
                absolute = node.module or ""
            submodules = [f"{absolute}.{alias.name}" for alias in node.names]
            names = [name for name in submodules if name in MODULES] or [absolute]
        for name in names:
            if not name.startswith("agentsim"):
                continue
            parts = name.split(".")
            while parts and ".".join(parts) not in MODULES:
                parts.pop()
            target = ".".join(parts)
            if target and target != module:
                yield target, node.lineno


def graph() -> dict[str, set[str]]:
    """Module -> the modules it imports when it runs (type-checking-only imports left out)."""
    return {module: {t for t, _ in imported(module, path, type_only=False)} for module, path in MODULES.items()}


def test_every_module_has_a_layer() -> None:
    for module in MODULES:
        layer_of(module)


def test_imports_go_downward() -> None:
    upward = []
    for module, path in MODULES.items():
        rank, unit = layer_of(module)
        for target, line in imported(module, path):
            target_rank, target_unit = layer_of(target)
            if target_unit == unit or target_rank < rank:
                continue
            # a package's __init__ re-exports from its own modules; nothing else imports up or sideways
            upward.append(f"{path.relative_to(ROOT)}:{line}: {module} ({unit}) imports {target} ({target_unit})")
    assert not upward, "imports that go up or sideways between layers:\n" + "\n".join(upward)


def test_no_import_cycles() -> None:
    """No module reaches itself through the imports that run (Tarjan's strongly connected
    components). An annotation-only import under ``if TYPE_CHECKING:`` may point back at a module
    of the same layer (a helper module naming the class that calls it); across layers it is held to
    the downward rule above like any other import.
    """
    edges = graph()
    # a package imports its own modules when it re-exports them; that is not a dependency of the
    # modules on the package, so a module's edge to its own parent package is left out
    for module in edges:
        edges[module] = {t for t in edges[module] if not module.startswith(t + ".")}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []
    counter = [0]

    def visit(node: str) -> None:
        index[node] = low[node] = counter[0]
        counter[0] += 1
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(edges.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    assert not cycles, "modules that import each other in a circle:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_models_import_only_the_public_api() -> None:
    """Reference models are what users copy: they use ``agentsim`` and its public subpackages."""
    private = []
    for path in sorted((ROOT / "models").glob("*.py")):
        for target, line in imported("agentsim.models." + path.stem, path):
            if target != "agentsim" and target.split(".")[1].startswith("_"):
                private.append(f"models/{path.name}:{line}: imports {target}")
    assert not private, "\n".join(private)


@pytest.mark.parametrize("bad", ["agentsim.core.model -> agentsim.engine.simulation"])
def test_the_check_sees_an_upward_import(bad: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The checks above can fail: an import from core up to the engine is reported."""
    source, target = bad.split(" -> ")
    fake = tmp_path / "fake.py"
    fake.write_text(f"def f():\n    from {target} import Simulation\n")
    found = list(imported(source, fake))
    assert (target, 2) in found
    rank, _ = layer_of(source)
    assert layer_of(target)[0] > rank
