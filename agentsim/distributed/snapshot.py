"""Stale neighbor reads: with ``sync_every = K > 1``, what substeps see of other agents
is refreshed every K steps, with the same rule on one process and on any number of ranks.

With ``sync_every=1`` (the default) a substep reads through ``ctx.neighbors(pop)`` the
declared fields of every agent as they are when the substep starts: exact, and on
several ranks one halo exchange before every neighbor substep. With ``K > 1`` the
exchange happens only on refresh steps; in between, substeps read a snapshot. For the
result to be the same on any number of ranks, the snapshot rule covers every value read
through ``ctx.neighbors``, an agent's own row included:

- **Refresh steps** are steps 1, K + 1, 2K + 1, ... (and the first step in which a
  substep runs). The substep sees current values, as with K = 1, and they are stored
  (per substep and population, by uid).
- **Other steps**: ``ctx.neighbors(pop)`` gives first the rows of this rank's current
  agents (row ``k`` is agent ``k`` of ``ctx[pop]``, as always) with their *stored*
  values, then every other stored agent (agents of other ranks, and agents that died
  since the refresh: they stay visible until the next one).
- **Births** between refreshes: a newborn is stored with its values at birth (on several
  ranks the newborns' declared fields are all-gathered when they are born, so every
  rank sees them).

Fields read through ``ctx[pop]`` are always current. So boids steer, for K steps, from
the positions and headings of the last refresh, while moving along their current
heading. Stale reads can break what a model keeps true with fresh reads (two Schelling
residents may pick the same empty cell, a wolf may eat a sheep that died this step): that
is the price of fewer exchanges, and why ``sync_every=1`` is the default.

Supported on one process and with the data partitioner, where every rank sees every
agent. The spatial partitioner sends only the agents within reach of the *current*
positions, so a snapshot would miss agents that move into reach; it accepts only
``sync_every=1``.

Examples:
    >>> from agentsim.engine.simulation import Simulation
    >>> from agentsim.models.boids import MODEL
    >>> fresh = Simulation(MODEL, agents=200, seed=1).run(6).metrics["polarization"]
    >>> stale = Simulation(MODEL, agents=200, seed=1, sync_every=3).run(6).metrics["polarization"]
    >>> bool((fresh[:2] == stale[:2]).all()), bool((fresh != stale).any())  # step 1 refreshes
    (True, True)
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch
from torch import Tensor

from agentsim.core.state import UID
from agentsim.core.substep import Substep
from agentsim.errors import ConfigError, SimulationError

__all__ = ["NeighborSnapshots", "check_sync_every"]


def check_sync_every(sync_every: object) -> int:
    """Validate ``sync_every`` (an int >= 1)."""
    if isinstance(sync_every, bool) or not isinstance(sync_every, (int, np.integer)) or sync_every < 1:
        raise ConfigError(f"sync_every: expected an int >= 1 (got {sync_every!r})")
    return int(sync_every)


def _by_uid(rows: Mapping[str, Tensor]) -> dict[str, Tensor]:
    order = torch.argsort(rows[UID], stable=True)
    return {k: v.index_select(0, order) for k, v in rows.items()}


class NeighborSnapshots:
    """The stored neighbor rows of a run with ``sync_every > 1`` (see the module docstring).

    Args:
        sync_every: Refresh period in steps (>= 2; 1 needs no snapshots).
    """

    def __init__(self, sync_every: int) -> None:
        self.sync_every = check_sync_every(sync_every)
        self._rows: dict[tuple[str, str], dict[str, Tensor]] = {}  # (substep, population) -> by uid

    def due(self, substep: Substep, step: int) -> bool:
        """Whether ``substep`` refreshes when computing step ``step`` (the first step is 1)."""
        first = not any(key[0] == substep.name for key in self._rows)
        return first or (step - 1) % self.sync_every == 0

    def store(self, substep: Substep, population: str, rows: Mapping[str, Tensor]) -> None:
        """Keep ``rows`` (``uid`` and the declared fields of every visible agent, ``[n, ...]``)."""
        self._rows[(substep.name, population)] = _by_uid(rows)

    def fields(self, population: str) -> list[str]:
        """``uid`` and every field of ``population`` some snapshot holds (none: not tracked)."""
        names = {k for (_, pop), rows in self._rows.items() if pop == population for k in rows}
        return [UID, *sorted(names - {UID})] if names else []

    def add_births(self, population: str, born: Mapping[str, Tensor]) -> None:
        """Add newborns (``uid`` and :meth:`fields`, ``[m, ...]``, from every rank) to the
        snapshots of ``population``.
        """
        if born[UID].shape[0] == 0:
            return
        for (substep, pop), rows in self._rows.items():
            if pop == population:
                self._rows[(substep, pop)] = _by_uid({k: torch.cat([v, born[k].to(v.device)])
                                                      for k, v in rows.items()})

    def view(self, substep: Substep, population: str, local_uid: Tensor) -> tuple[dict[str, Tensor],
                                                                                   dict[str, Tensor]]:
        """(stored values of this rank's agents, in row order; every other stored agent).

        Args:
            local_uid: ``[n_local]`` int64 uids of this rank's current agents, in row order.

        Raises:
            SimulationError: a current agent is missing from the snapshot (agents may only
                appear through births, which are stored; a bug if it happens).
        """
        rows = self._rows[(substep.name, population)]
        uid = rows[UID]
        at = torch.searchsorted(uid, local_uid).clamp(max=max(uid.shape[0] - 1, 0))
        if local_uid.numel() and (uid.numel() == 0 or not bool((uid.index_select(0, at) == local_uid).all())):
            raise SimulationError(f"substep '{substep.name}': an agent of '{population}' is missing from the "
                                  "neighbor snapshot (sync_every > 1 supports agents added by ctx.spawn only)")
        ghost = torch.ones(uid.shape[0], dtype=torch.bool, device=uid.device)
        ghost[at] = False
        local = {k: v.index_select(0, at) for k, v in rows.items()}
        return local, {k: v[ghost] for k, v in rows.items()}
