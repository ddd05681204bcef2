"""agentsim: PyTorch-native agent-based simulation at population scale.

A model is an ordered list of registered substeps, vectorized functions over agent
tensors that declare the fields they read and write. See the README for a tour.
"""

from __future__ import annotations

from .catalog import get_model
from .distributed.launch import LaunchResult, launch
from .engine import RunResult, Simulation
from .errors import AgentsimError, ConfigError, FieldAccessError, OutputError, SimulationError
from .model import InitContext, MetricsContext, Model
from .params import Param, ParamSpec
from .random import CounterRNG
from .state import FieldSpec, Population, State
from .study import sweep
from .substep import Registry, Substep

__version__ = "0.1.0"

__all__ = [
    "AgentsimError",
    "ConfigError",
    "CounterRNG",
    "FieldAccessError",
    "FieldSpec",
    "InitContext",
    "LaunchResult",
    "MetricsContext",
    "Model",
    "OutputError",
    "Param",
    "ParamSpec",
    "Population",
    "Registry",
    "RunResult",
    "Simulation",
    "SimulationError",
    "State",
    "Substep",
    "get_model",
    "sweep",
    "launch",
    "__version__",
]
