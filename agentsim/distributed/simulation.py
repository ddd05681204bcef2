"""Deprecated: :class:`DistributedSimulation` is :class:`~agentsim.engine.Simulation` with a
partitioner. Write ``Simulation(model, agents, seed, comm=comm, partition="data")``.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch

from ..comm import Comm
from ..engine import Simulation
from ..model import Model
from ..partition import Partitioner
from ..perf import summarize_perf

__all__ = ["DistributedSimulation", "summarize_perf"]


class DistributedSimulation(Simulation):
    """Deprecated alias of :class:`~agentsim.engine.Simulation` (``partition`` defaults to ``"data"``)."""

    def __init__(self, model: Model, agents: int | None = None, seed: int = 0,
                 device: str | torch.device | None = "cpu", *, comm: Comm,
                 partition: str | Partitioner = "data", **options: Any) -> None:
        warnings.warn("DistributedSimulation is deprecated and will be removed in the next release: use "
                      "Simulation(model, agents, seed, comm=comm, partition=...)", DeprecationWarning, stacklevel=2)
        super().__init__(model, agents, seed, device, comm=comm, partition=partition, **options)
