"""The data partitioner: agents split by uid blocks, with no regard to space.

:class:`DataPartition` (``partition="data"``):

- every rank runs the model's global ``init`` (deterministic, so all ranks build the
  same state), then keeps a contiguous block of each population ordered by uid:
  rows ``[r * n // W, (r + 1) * n // W)`` of the uid-sorted rows on rank ``r``; or, where
  ``init`` builds a share per rank (``ic.share()``), each rank keeps what it built;
- births stay on the parent's rank (uids as on one process, see
  :meth:`TorchComm.birth_offset <agentsim.distributed.comm.TorchComm.birth_offset>`);
  deaths are local; agents never move between ranks;
- environment tensors are replicated: models derive env updates from global neighbor
  views, so every rank computes the same update. :meth:`DataPartition.owned_env`
  gives rank 0 every cell and the others none, so env metrics count each cell once;
- halo: before each substep that declares ``neighbors={pop: fields}``, every rank
  receives the ``uid`` and those fields of all agents of ``pop`` on the other ranks
  (one packed all_gather per population). Models see local rows, then these rows.
  In a differentiable run (``grad=``) the float fields are joined to the autograd graph,
  so gradients return to the agents' ranks (:mod:`agentsim.grad.autograd`).

Every rank thus sees every agent exactly as one process would, so results are
bitwise identical to a one-process run (the models key every random draw by uid or
cell and never depend on row order). The cost: each rank receives every agent's
neighbor fields before each neighbor substep.

``sync_every`` > 1 (stale neighbor reads, refreshed every K steps) is implemented by the
engine, not here (:mod:`agentsim.distributed.snapshot`): between refreshes the engine does not ask
for halos and reads its snapshot, and one process applies the same rule, so results
still match on any number of ranks.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from agentsim.core.comm import Comm
from agentsim.core.context import Halos
from agentsim.core.params import Params
from agentsim.core.state import UID, State
from agentsim.core.substep import Substep
from agentsim.distributed.partition import IdentityPartition
from agentsim.grad.autograd import gather_with_grad

__all__ = ["DataPartition"]


class DataPartition(IdentityPartition):
    """Agents split by uid blocks; env replicated; halos hold every other rank's agents.

    Examples:
        >>> from agentsim.core.comm import LocalComm
        >>> from agentsim.engine.simulation import Simulation
        >>> from agentsim.models.randomwalk import MODEL
        >>> sim = Simulation(MODEL, agents=10, seed=0)
        >>> state = DataPartition().place(sim.state, sim.space, MODEL.substeps, sim.params, LocalComm())
        >>> state["walker"].n  # one rank keeps everything
        10
    """

    name = "data"

    @staticmethod
    def block(n: int, rank: int, world_size: int) -> tuple[int, int]:
        """Rows ``[lo, hi)`` of ``n`` uid-sorted rows that rank ``rank`` keeps."""
        return rank * n // world_size, (rank + 1) * n // world_size

    def place(self, state: State, space: Any, substeps: Sequence[Substep], params: Params, comm: Comm,
              shared: bool = False) -> State:
        """Keep this rank's block of every population (in place; uids and ``next_uid`` unchanged); or,
        ``shared`` (each rank built its own share), the agents it built: halos hold every other rank's
        agents, so where an agent is never changes a result.
        """
        if shared:
            return state
        for pop in state.populations.values():
            order = torch.argsort(pop[UID], stable=True)
            lo, hi = self.block(pop.n, comm.rank, comm.world_size)
            pop.keep(order[lo:hi])
        return state

    def halos(self, state: State, substep: Substep, comm: Comm) -> Halos:
        """Every other rank's rows of each population ``substep`` reads through ``neighbors``.

        Done for all declared populations on every rank before the substep runs, so the
        collectives happen in the same order everywhere, whatever the substep does.
        """
        if comm.world_size == 1:
            return {}
        out = {}
        for name, fields in substep.neighbors.items():
            # In a differentiable run gradients reaching the rows go back to the agents' ranks.
            rows = gather_with_grad(comm, state[name].select(fields), self.grad_links)
            self.count_halo(rows)
            out[name] = rows
        return out
