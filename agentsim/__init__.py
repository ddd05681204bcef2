"""agentsim: PyTorch-native agent-based simulation at population scale.

A model is populations of agents (tensors by field), an ``init`` that builds them, and
substeps: vectorized functions over agent tensors that declare the fields they read and
write, run in order every step, on one process or many (:mod:`agentsim.distributed.partition`).
Everything a model author needs is importable from here::

    import agentsim as asim
    walk = asim.Model("walk", params={"sigma": asim.Param(1.0, "step std (length units)", ge=0.0)})

See the README for a tour.
"""

from __future__ import annotations

import dis
import inspect

from agentsim._version import __version__
from agentsim.core import ops
from agentsim.core.catalog import get_model
from agentsim.core.context import Context, InitContext, MetricsContext
from agentsim.core.grouping import rank_in_group, sort_by_group
from agentsim.core.metrics import Metric
from agentsim.core.model import Model
from agentsim.core.params import REQUIRED, Param, Params
from agentsim.core.random import CounterRNG, StepRNG
from agentsim.core.state import FieldSpec, Population, State
from agentsim.core.substep import Substep
from agentsim.engine.simulation import RunResult, Simulation
from agentsim.engine.spec import RunSpec
from agentsim.errors import (
    AgentsimError,
    CollectiveError,
    ConfigError,
    ContractError,
    FieldAccessError,
    OutputError,
    SimulationError,
    UnknownParameterError,
)
from agentsim.runner.api import run
from agentsim.runner.launch import LaunchResult, launch
from agentsim.space.continuous import Box, CellGrid, radius_pair_chunks, radius_pairs
from agentsim.space.graph import Graph, erdos_renyi, from_edge_list_csv, layered_contacts, watts_strogatz
from agentsim.space.grid import Grid
from agentsim.space.line import Line
from agentsim.space.neighbors import PairView, neighbor_reduce
from agentsim.space.ordered import Nearest, nearest
from agentsim.study import Study, read_study, sweep
from agentsim.threads import cap_threads

cap_threads()  # torch's threads at most the cores this process may use (agentsim.threads)

__all__ = [
    "REQUIRED",
    "AgentsimError",
    "Box",
    "CellGrid",
    "CollectiveError",
    "ConfigError",
    "Context",
    "ContractError",
    "CounterRNG",
    "FieldAccessError",
    "FieldSpec",
    "Graph",
    "Grid",
    "InitContext",
    "LaunchResult",
    "Line",
    "Metric",
    "MetricsContext",
    "Model",
    "Nearest",
    "OutputError",
    "PairView",
    "Param",
    "Params",
    "Population",
    "RemovedNameError",
    "RunResult",
    "RunSpec",
    "Simulation",
    "SimulationError",
    "State",
    "StepRNG",
    "Study",
    "Substep",
    "UnknownParameterError",
    "__version__",
    "erdos_renyi",
    "from_edge_list_csv",
    "get_model",
    "launch",
    "layered_contacts",
    "nearest",
    "neighbor_reduce",
    "ops",
    "radius_pair_chunks",
    "radius_pairs",
    "rank_in_group",
    "read_study",
    "run",
    "sort_by_group",
    "sweep",
    "watts_strogatz",
]

_REMOVED = {
    "Registry": "agentsim.Registry was removed in 0.3: declare substeps on the model with @model.substep(...) "
                "(model = agentsim.Model(name, params={...})); see CHANGELOG.md",
    "ParamSpec": "agentsim.ParamSpec was removed in 0.3: pass the parameters as a dict, "
                 "agentsim.Model(name, params={'sigma': agentsim.Param(1.0, 'doc')}); see CHANGELOG.md",
}


class RemovedNameError(AttributeError):
    """A name of release 0.1 that 0.3 removed, with what to write instead (an AttributeError: ``hasattr``,
    IDEs and documentation tools treat the name as absent).
    """


def _importing_from() -> bool:
    """Whether the attribute is asked by ``from agentsim import NAME`` (the caller's instruction is
    IMPORT_FROM, whose AttributeError Python replaces by a bare "cannot import name").
    """
    here = inspect.currentframe()
    try:  # this function's frame, then __getattr__'s, then the code reading the name
        frame = here.f_back.f_back  # type: ignore[union-attr]
        return dis.opname[frame.f_code.co_code[frame.f_lasti]] == "IMPORT_FROM"  # type: ignore[union-attr]
    except (AttributeError, IndexError, ValueError):  # another Python: the plain AttributeError
        return False
    finally:
        del here


def __getattr__(name: str) -> object:
    """The names of release 0.1 that 0.3 removed say what to write instead: a
    :class:`RemovedNameError` (an AttributeError) for ``agentsim.NAME``, an ImportError with the same
    text for ``from agentsim import NAME``.
    """
    if name in _REMOVED:
        if _importing_from():
            raise ImportError(_REMOVED[name], name=name)
        raise RemovedNameError(_REMOVED[name], name=name)
    raise AttributeError(f"module 'agentsim' has no attribute {name!r}")
