"""Partitioners: which rank holds which agents, and what each rank sees of the others.

Two are built: :class:`DataPartition` (here) and
:class:`~agentsim.distributed.spatial.SpatialPartition` (``partition="spatial"``, regions of
space, halos within reach, migration, load balancing; see :mod:`agentsim.distributed.spatial`).
Both provide ``bind(space, params)``, ``scatter(state, comm)``, ``before_substep(state,
substep, comm)``, ``after_substep(state, substep, comm)``, ``halo(pop, substep)``,
``owned_env(state, name, comm)``, ``sync_env(state, comm)``, ``start_step()`` and
``maybe_balance(state, comm, counts)``.

:class:`DataPartition` (``partition="data"``) splits agents by index, with no regard
to space:

- every rank runs the model's global ``init`` (deterministic, so all ranks build the
  same state), then keeps a contiguous block of each population ordered by uid:
  rows ``[r * n // W, (r + 1) * n // W)`` of the uid-sorted rows on rank ``r``;
- births stay on the parent's rank (uids as on one process, see
  :meth:`TorchComm.birth_offset <agentsim.distributed.comm.TorchComm.birth_offset>`);
  deaths are local; agents never move between ranks;
- environment tensors are replicated: models derive env updates from global neighbor
  views, so every rank computes the same update. :meth:`DataPartition.owned_env`
  gives rank 0 every cell and the others none, so env metrics count each cell once;
- halo: before each substep that declares ``neighbors={pop: fields}``, every rank
  receives the ``uid`` and those fields of all agents of ``pop`` on the other ranks
  (one packed all_gather per population). Models see local rows, then these rows.

Every rank thus sees every agent exactly as one process would, so results are
bitwise identical to a one-process run (the models key every random draw by uid or
cell and never depend on row order). The cost: each rank receives every agent's
neighbor fields before each neighbor substep.

``sync_every`` > 1 (stale neighbor reads, refreshed every K steps) is implemented by the
engine, not here (:mod:`agentsim.snapshot`): between refreshes the engine skips
:meth:`DataPartition.before_substep` and reads its snapshot, and one process applies the
same rule, so results still match on any number of ranks.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor

from ..comm import Comm
from ..errors import ConfigError, did_you_mean
from ..snapshot import check_sync_every
from ..state import UID, State
from ..substep import Substep
from .halo import HaloBook
from .spatial import SpatialPartition

__all__ = ["PARTITIONS", "DataPartition", "check_sync_every_for", "make_partition"]

PARTITIONS = ("data", "spatial")


def check_partition(name: object) -> str:
    """Validate a partitioner name (``"data"`` or ``"spatial"``)."""
    if not isinstance(name, str) or name not in PARTITIONS:
        hint = did_you_mean(name, PARTITIONS) if isinstance(name, str) else ""
        raise ConfigError(f"unknown partition {name!r} (valid: {', '.join(PARTITIONS)})." + hint)
    return name


def check_sync_every_for(partition: DataPartition | SpatialPartition, sync_every: object) -> int:
    """Validate ``sync_every`` for ``partition``: K > 1 needs the data partitioner."""
    k = check_sync_every(sync_every)
    if k > 1 and isinstance(partition, SpatialPartition):
        raise ConfigError(
            f"sync_every={k} needs partition 'data' (or one process): the spatial partitioner sends only "
            "the agents within reach of current positions, so a snapshot would miss agents that move into "
            "reach (valid with 'spatial': 1)")
    return k


class DataPartition(HaloBook):
    """Agents split by uid blocks; env replicated; halos hold every other rank's agents.

    Examples:
        >>> from agentsim.comm import LocalComm
        >>> from agentsim.engine import Simulation
        >>> from agentsim.models.randomwalk import MODEL
        >>> sim = Simulation(MODEL, agents=10, seed=0)
        >>> state = DataPartition().scatter(sim.state, LocalComm())  # one rank keeps everything
        >>> state["walker"].n
        10
    """

    name = "data"

    def __repr__(self) -> str:
        return "DataPartition()"

    @staticmethod
    def block(n: int, rank: int, world_size: int) -> tuple[int, int]:
        """Rows ``[lo, hi)`` of ``n`` uid-sorted rows that rank ``rank`` keeps."""
        return rank * n // world_size, (rank + 1) * n // world_size

    def scatter(self, state: State, comm: Comm) -> State:
        """Keep this rank's block of every population (in place; uids and ``next_uid`` unchanged)."""
        for pop in state.populations.values():
            order = torch.argsort(pop[UID], stable=True)
            lo, hi = self.block(pop.n, comm.rank, comm.world_size)
            pop.keep(order[lo:hi])
        return state

    def before_substep(self, state: State, substep: Substep, comm: Comm) -> None:
        """Refresh the halo of every population ``substep`` reads through ``neighbors``.

        Done for all declared populations on every rank before the substep runs, so the
        collectives happen in the same order everywhere, whatever the substep does.
        """
        self.drop_halos()
        if comm.world_size == 1:
            return
        for name, fields in substep.neighbors.items():
            self.keep_halo(name, comm.all_gather_rows(state[name].select(fields), include_self=False))

    def after_substep(self, state: State | None = None, substep: Substep | None = None,
                      comm: Comm | None = None) -> None:
        self.drop_halos()

    # No regions: nothing to bind, sync, migrate or balance.
    def bind(self, space: object, params: Mapping[str, object]) -> None:
        pass

    def sync_env(self, state: State, comm: Comm) -> None:
        pass

    def maybe_balance(self, state: State, comm: Comm, counts: list[int]) -> bool:
        return False

    def owned_env(self, state: State, name: str, comm: Comm) -> Tensor:
        """All cells of env layer ``name`` on rank 0, none elsewhere (env is replicated)."""
        flat = state.env[name].reshape(-1)
        return flat if comm.rank == 0 else flat[:0]


def make_partition(partition: str | DataPartition | SpatialPartition = "data",
                   **options: object) -> DataPartition | SpatialPartition:
    """A partitioner from its name (``"data"``, ``"spatial"``) or an instance (returned as is).

    ``options`` go to :class:`~agentsim.distributed.spatial.SpatialPartition` (``layout``,
    ``balance_every``, ``balance_threshold``, ``bins``, ``overlap``); None values are dropped.
    """
    if isinstance(partition, (DataPartition, SpatialPartition)):
        return partition
    check_partition(partition)
    options = {k: v for k, v in options.items() if v is not None}
    if partition == "spatial":
        return SpatialPartition(**options)  # type: ignore[arg-type]
    if options:
        raise ConfigError(f"partition 'data' takes no options (got {', '.join(sorted(options))}); "
                          "layout and balancing belong to partition 'spatial'")
    return DataPartition()
