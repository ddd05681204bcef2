"""agentsim: PyTorch-native agent-based simulation at population scale.

A model is populations of agents (tensors by field), an ``init`` that builds them, and
substeps: vectorized functions over agent tensors that declare the fields they read and
write, run in order every step, on one process or many (:mod:`agentsim.partition`).
Everything a model author needs is importable from here::

    import agentsim as asim
    walk = asim.Model("walk", params={"sigma": asim.Param(1.0, "step std (length units)", ge=0.0)})

See the README for a tour.
"""

from __future__ import annotations

from . import ops
from .catalog import get_model
from .context import Context, InitContext, MetricsContext
from .distributed.launch import LaunchResult, launch
from .engine import RunResult, Simulation
from .errors import (
    AgentsimError,
    CollectiveError,
    ConfigError,
    ContractError,
    FieldAccessError,
    OutputError,
    SimulationError,
    UnknownParameterError,
)
from .grouping import rank_in_group, sort_by_group
from .metrics import Metric
from .model import Model
from .params import REQUIRED, Param, Params, ParamSpec
from .random import CounterRNG, StepRNG
from .runs import run
from .space.continuous import Box, CellGrid, radius_pair_chunks, radius_pairs
from .space.graph import Graph, erdos_renyi, from_edge_list_csv, layered_contacts, watts_strogatz
from .space.grid import Grid
from .state import FieldSpec, Population, State
from .study import Study, read_study, sweep
from .substep import Registry, Substep

__version__ = "0.2.0"

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
    "Param",
    "ParamSpec",
    "Params",
    "Population",
    "Registry",
    "RunResult",
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
