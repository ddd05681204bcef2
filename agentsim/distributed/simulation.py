"""The engine on one rank of a multi-rank run: a :class:`~agentsim.engine.Simulation`
whose state is this rank's share of the agents and whose neighbor views include halos.

The one-process :class:`~agentsim.engine.Simulation` is untouched (no collectives);
this subclass adds three things, all delegated to the partitioner:

- after ``init``: keep this rank's share of the agents (:meth:`DataPartition.scatter`);
- before each substep: refresh the halos it reads (:meth:`DataPartition.before_substep`);
- ``halo`` and ``owned_env``: what the engine's neighbor views and metrics use.

Births, error flags, metrics and trajectory frames go through ``comm`` in the base
engine. Per-step communication figures are kept in :attr:`DistributedSimulation.comm_steps`.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor

from ..comm import Comm
from ..engine import Simulation
from ..model import Model
from ..substep import Substep
from .comm import CommStats
from .partition import DataPartition, make_partition

__all__ = ["DistributedSimulation"]


class DistributedSimulation(Simulation):
    """One rank's part of a run split by a partitioner.

    Args:
        model, agents, seed, device, check_nan, shuffle_rows: As for :class:`~agentsim.engine.Simulation`.
        comm: This rank's communication (a :class:`~agentsim.distributed.comm.TorchComm`, or
            :class:`~agentsim.comm.LocalComm` for one rank).
        partition: ``"data"`` or a :class:`DataPartition`.
        sync_every: Halo refresh period (only 1 is supported; see :mod:`agentsim.distributed.partition`).

    Attributes:
        comm_steps: Per step, the :class:`CommStats` of the collectives inside :meth:`step`
            (halos, births, error flags); empty when ``comm`` keeps no stats.
    """

    def __init__(self, model: Model, agents: int | None = None, seed: int = 0,
                 device: str | torch.device | None = "cpu", *, comm: Comm,
                 partition: str | DataPartition = "data", sync_every: int = 1,
                 check_nan: bool = True, shuffle_rows: bool = False) -> None:
        self.partition = make_partition(partition, sync_every)
        super().__init__(model, agents, seed, device, check_nan=check_nan, shuffle_rows=shuffle_rows, comm=comm)
        self.state = self.partition.scatter(self.state, self.comm)
        self.comm_steps: list[CommStats] = []

    def halo(self, population: str, substep: Substep) -> Mapping[str, Tensor] | None:
        return self.partition.halo(population, substep)

    def owned_env(self, name: str) -> Tensor:
        return self.partition.owned_env(self.state, name, self.comm)

    def _run_substep(self, s: Substep) -> list[tuple[str, Tensor]]:
        self.partition.before_substep(self.state, s, self.comm)
        try:
            return super()._run_substep(s)
        finally:
            self.partition.after_substep()

    def step(self) -> None:
        stats: CommStats | None = getattr(self.comm, "stats", None)
        before = stats.snapshot() if stats is not None else None
        try:
            super().step()
        finally:
            if stats is not None and before is not None:
                self.comm_steps.append(stats.since(before))
