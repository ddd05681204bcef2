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
from agentsim.space.neighbors import PairView, neighbor_reduce
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
    "Metric",
    "MetricsContext",
    "Model",
    "OutputError",
    "PairView",
    "Param",
    "Params",
    "Population",
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


def __getattr__(name: str) -> object:
    """The names of release 0.1 that 0.3 removed raise an ImportError saying what to write instead
    (an ImportError, not an AttributeError, so that ``from agentsim import Registry`` shows it too).
    """
    if name in _REMOVED:
        raise ImportError(_REMOVED[name], name=name)
    raise AttributeError(f"module 'agentsim' has no attribute {name!r}")
