"""What a substep sees: checked views of populations and environment, RNG, space, neighbors.

A :class:`Context` is built by the engine for one substep call. Its views enforce
the substep's declaration: a read of an undeclared field or a write of a field not
in ``writes`` raises :class:`~agentsim.errors.FieldAccessError` naming the substep.
Births and deaths requested through :meth:`Context.spawn` and :meth:`Context.kill`
are applied when the substep returns, so all tensors keep one length during a call.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from .errors import FieldAccessError, did_you_mean
from .random import StepRNG
from .state import Population, State
from .substep import ENV, Substep

if TYPE_CHECKING:
    from .engine import Simulation


class PopulationView:
    """Checked access to one population's fields for one substep."""

    def __init__(self, pop: Population, substep: Substep) -> None:
        self._pop = pop
        self._substep = substep
        self._readable = substep.readable(pop.name)
        self._writable = substep.writable(pop.name)

    @property
    def n(self) -> int:
        """Number of local agents."""
        return self._pop.n

    def __len__(self) -> int:
        return self._pop.n

    def __getitem__(self, key: str) -> Tensor:
        if key not in self._readable:
            raise FieldAccessError(
                f"substep '{self._substep.name}' reads '{self._pop.name}.{key}' but does not declare it "
                f"(declared reads: {sorted(self._readable)}); add '{self._pop.name}.{key}' to reads="
            )
        return self._pop[key]

    def __setitem__(self, key: str, value: Tensor) -> None:
        if key not in self._writable:
            raise FieldAccessError(
                f"substep '{self._substep.name}' writes '{self._pop.name}.{key}' but does not declare it "
                f"(declared writes: {sorted(self._writable) or 'none'}); add '{self._pop.name}.{key}' to writes="
            )
        self._pop[key] = value


class EnvView:
    """Checked access to environment tensors (``env.<name>`` references)."""

    def __init__(self, env: dict[str, Tensor], substep: Substep) -> None:
        self._env = env
        self._substep = substep
        self._readable = substep.readable(ENV) - {"uid"}
        self._writable = substep.writable(ENV)

    def __getitem__(self, key: str) -> Tensor:
        if key not in self._readable:
            raise FieldAccessError(
                f"substep '{self._substep.name}' reads 'env.{key}' but does not declare it "
                f"(declared: {sorted(self._readable) or 'none'})." + did_you_mean(key, self._env)
            )
        return self._env[key]

    def __setitem__(self, key: str, value: Tensor) -> None:
        if key not in self._writable:
            raise FieldAccessError(
                f"substep '{self._substep.name}' writes 'env.{key}' but does not declare it "
                f"(declared writes: {sorted(self._writable) or 'none'})"
            )
        old = self._env[key]
        if tuple(value.shape) != tuple(old.shape):
            raise FieldAccessError(f"env.{key}: expected shape {list(old.shape)} (got {list(value.shape)})")
        self._env[key] = value.to(old.dtype)


class NeighborView:
    """Fields of the agents a substep may interact with: local rows first, then halo rows.

    Row ``k < n_local`` is agent ``k`` of the population (the rows of ``ctx[pop]``).
    On one process there are no halo rows. On several ranks the engine appends the
    agents of other ranks that are within reach (only the fields the substep
    declared in ``neighbors``), so ``n_local <= n``. With ``sync_every > 1`` the values
    come from the last refresh (``local`` overrides the local rows' values; the halo holds
    every other stored agent; see :mod:`agentsim.snapshot`).
    """

    def __init__(self, pop: Population, fields: tuple[str, ...], substep: Substep,
                 halo: Mapping[str, Tensor] | None = None, local: Mapping[str, Tensor] | None = None) -> None:
        self._pop = pop
        self._fields = set(fields) | {"uid"}
        self._substep = substep
        self._halo = halo or {}
        self._local = local
        self.n_local = pop.n

    @property
    def n(self) -> int:
        """Local plus halo rows."""
        uid = self._halo.get("uid")
        return self.n_local + (0 if uid is None else uid.shape[0])

    def __getitem__(self, key: str) -> Tensor:
        if key not in self._fields:
            raise FieldAccessError(
                f"substep '{self._substep.name}' reads neighbor field '{self._pop.name}.{key}' but declares "
                f"only neighbors={{'{self._pop.name}': {sorted(self._fields - {'uid'})}}}"
            )
        local = self._pop[key] if self._local is None else self._local[key]
        if key in self._halo:
            return torch.cat([local, self._halo[key]])
        return local


class Context:
    """The argument of every substep.

    Attributes:
        step: The step being computed (the first step is 1; state at step 0 is the initial state).
        params: Resolved model parameters (a dict).
        rng: Counter-based random numbers bound to this step (:class:`~agentsim.random.StepRNG`).
        space: The model's space (a Box, Grid or Graph), or None.
        device: The device of the state.
    """

    def __init__(self, sim: Simulation, substep: Substep, state: State | None = None,
                 halo: Mapping[str, Mapping[str, Tensor]] | None = None) -> None:
        self._sim = sim
        # ``state`` and ``halo``: the engine runs an agentwise substep on a subset of the
        # agents (the targets, as the rows of ``state``) with the other agents it may see
        # as halo rows (see agentsim.distributed.overlap).
        self._state: State = sim.state if state is None else state
        self._part_halo = halo
        self.substep = substep
        self.step: int = sim.state.step + 1
        self.params: dict[str, Any] = sim.params
        self.rng: StepRNG = sim.rng.at(self.step)
        self.space = sim.space
        self.device = sim.device
        self.comm = sim.comm
        self.fresh = True  # neighbor reads are current (False between refreshes with sync_every > 1)
        self._births: list[tuple[str, Tensor, Mapping[str, Tensor]]] = []
        self._deaths: list[tuple[str, Tensor]] = []
        self._flags: list[tuple[str, Tensor]] = []
        # Set by the engine on an agentwise substep run for a subset of its agents: flags
        # are kept per agent ([n] bool) instead of reduced.
        self.rows_flagged = False

    def __getitem__(self, population: str) -> Any:
        if population == ENV:
            return EnvView(self._state.env, self.substep)
        pop = self._state[population]
        if not self.substep.touches(population):
            raise FieldAccessError(
                f"substep '{self.substep.name}' uses population '{population}' without declaring any of its fields"
            )
        return PopulationView(pop, self.substep)

    @property
    def env(self) -> EnvView:
        return EnvView(self._state.env, self.substep)

    def neighbors(self, population: str) -> NeighborView:
        """The declared neighbor fields of ``population``: local rows then halo rows."""
        if population not in self.substep.neighbors:
            raise FieldAccessError(
                f"substep '{self.substep.name}' asks for neighbors of '{population}' but declares "
                f"neighbors={dict(self.substep.neighbors)}"
            )
        if self._part_halo is not None:
            return NeighborView(self._state[population], self.substep.neighbors[population], self.substep,
                                self._part_halo.get(population))
        return self._sim.neighbor_view(population, self.substep, fresh=self.fresh)

    def spawn(self, population: str, parent_uid: Tensor, fields: Mapping[str, Tensor]) -> None:
        """Add one child per parent uid (applied when the substep returns).

        Args:
            population: Where the children go (must be declared in ``births``).
            parent_uid: ``[m]`` distinct int64 uids of the parents (of any population).
            fields: Every field of the population except ``uid``, each ``[m, ...]``.
        """
        if population not in self.substep.births:
            raise FieldAccessError(
                f"substep '{self.substep.name}' spawns into '{population}' but declares births={list(self.substep.births)}"
            )
        self._births.append((population, parent_uid, fields))

    def kill(self, population: str, dies: Tensor) -> None:
        """Remove the agents where the bool mask ``dies`` ``[n]`` is True (applied when the substep returns)."""
        if population not in self.substep.deaths:
            raise FieldAccessError(
                f"substep '{self.substep.name}' kills in '{population}' but declares deaths={list(self.substep.deaths)}"
            )
        n = self._state[population].n
        if dies.dtype != torch.bool or tuple(dies.shape) != (n,):
            raise FieldAccessError(f"kill('{population}'): expected a bool mask of shape [{n}] "
                                   f"(got {dies.dtype} {list(dies.shape)})")
        self._deaths.append((population, dies))

    def flag(self, message: str, condition: Tensor) -> None:
        """Record an error condition (a bool tensor); checked once per step on all ranks.

        Any shape, except in an ``agentwise`` substep, whose conditions are per agent: ``[n, ...]``
        with ``n`` the agents of the population it writes (the engine may run it for a subset of
        them and keeps the flags of the agents whose values it keeps)."""
        name = f"{self.substep.name}: {message}"
        written = self.substep.written_populations() if self.substep.agentwise else set()
        if written:
            n = self._state[next(iter(written))].n
            if condition.dim() == 0 or condition.shape[0] != n:
                raise FieldAccessError(
                    f"substep '{self.substep.name}' is agentwise: ctx.flag expects a condition per agent of "
                    f"'{next(iter(written))}' (shape [{n}, ...]; got {list(condition.shape)})")
            if self.rows_flagged:  # the engine picks the rows it keeps
                self._flags.append((name, condition.reshape(n, -1).any(1)))
                return
        self._flags.append((name, condition.any()))
