"""What model code sees: the :class:`Context` of a substep, the :class:`InitContext` of ``init``
and the :class:`MetricsContext` of a metric.

A :class:`Context` is built by the engine for one substep call from explicit parts: the
state the substep runs on, the step, read-only parameters, a random generator bound to
the step (default stream: the substep's name), the space, the device and a function that
gives the neighbor view of a population. It holds no reference to the engine. Its views
enforce the substep's declaration: a read of an undeclared field or a write of a field
not in ``writes`` raises :class:`~agentsim.errors.FieldAccessError` naming the substep.
Births, deaths and error flags requested with :meth:`Context.spawn`, :meth:`Context.kill`
and :meth:`Context.flag` are collected in :attr:`Context.effects`, a public value that the
engine applies when the substep returns (so all tensors keep one length during a call).

Examples:
    >>> import torch
    >>> from agentsim.core.params import Params
    >>> from agentsim.core.random import CounterRNG
    >>> from agentsim.core.state import FieldSpec, Population, State
    >>> from agentsim.core.substep import Substep
    >>> def cull(ctx): ctx.kill("cell", ctx["cell"]["size"] > 1.0)
    >>> step = Substep(cull, reads=["cell.size"], deaths=["cell"])
    >>> cells = Population("cell", {"size": FieldSpec(torch.float32)},
    ...                    {"uid": torch.arange(3), "size": torch.tensor([0.5, 2.0, 1.5])})
    >>> ctx = Context(step, State({"cell": cells}), step=1, params=Params({}), rng=CounterRNG(0).at(1, "cull"),
    ...               space=None, device=torch.device("cpu"), neighbors=None)
    >>> step(ctx)
    >>> [(d.population, d.dies.tolist()) for d in ctx.effects.deaths]
    [('cell', [False, True, True])]
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple, TypeVar, overload

import torch
from torch import Tensor

from agentsim.core import ops
from agentsim.core.comm import LocalComm
from agentsim.core.env import DEPOSIT_FRAC_BITS, DEPOSIT_LIMIT, deposit_layer
from agentsim.core.groups import GroupIndex, GroupSums
from agentsim.core.params import Params
from agentsim.core.random import StepRNG
from agentsim.core.state import UID, FieldSpec, Population, State, converted
from agentsim.core.substep import ENV, Substep, resolve_reach
from agentsim.errors import ConfigError, FieldAccessError, did_you_mean

_Out = TypeVar("_Out")  # what a collective group method returns

__all__ = ["CLEAR", "Birth", "Context", "Death", "Effects", "EnvView", "Flag", "InitContext", "MetricsContext",
           "NeighborView", "PopulationView"]

Halos = Mapping[str, Mapping[str, Tensor]]  # population -> field -> rows of other ranks' agents


class Flag(NamedTuple):
    """An error condition recorded by a substep (raised once per step, on every rank).

    Attributes:
        message: ``"substep: what"``.
        condition: Bool tensor: ``[]`` (set anywhere), or ``[n]`` per agent when the engine runs
            an agentwise substep for a subset of its agents.
    """

    message: str
    condition: Tensor


CLEAR = torch.zeros((), dtype=torch.bool)  # the condition of a flag found clear when it was made (never written)


class Birth(NamedTuple):
    """Children to add: one per parent uid ``[m]``, with every field but ``uid`` ``[m, ...]``."""

    population: str
    parent_uid: Tensor
    fields: Mapping[str, Tensor]


class Death(NamedTuple):
    """Agents to remove: ``dies`` is a bool mask ``[n]`` over the population's rows."""

    population: str
    dies: Tensor


@dataclass
class Effects:
    """What a substep asked for besides its writes: births, deaths, error flags, and deposits into
    float env layers (``[cells]`` int64 per layer, in multiples of ``2**-DEPOSIT_FRAC_BITS``).
    """

    births: list[Birth] = field(default_factory=list)
    deaths: list[Death] = field(default_factory=list)
    flags: list[Flag] = field(default_factory=list)
    deposits: dict[str, Tensor] = field(default_factory=dict)


class PopulationView:
    """Checked access to one population's fields for one substep."""

    def __init__(self, pop: Population, substep: Substep) -> None:
        self._pop = pop
        self._substep = substep
        self._readable = substep.readable(pop.name)
        self._writable = substep.writable(pop.name)

    @property
    def n(self) -> int:
        """Number of agents (rows) this substep runs for."""
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
        self._readable = substep.readable(ENV) - {UID}
        self._writable = substep.writable(ENV)

    def __getitem__(self, key: str) -> Tensor:
        if key not in self._readable:
            raise FieldAccessError(
                f"substep '{self._substep.name}' reads 'env.{key}' but does not declare it "
                f"(declared env reads: {sorted(f'env.{k}' for k in self._readable) or 'none'}); add 'env.{key}' "
                "to reads=" + ("" if key in self._env else "." + did_you_mean(key, self._env))
            )
        return self._env[key]

    def __setitem__(self, key: str, value: Tensor) -> None:
        if key not in self._writable:
            raise FieldAccessError(
                f"substep '{self._substep.name}' writes 'env.{key}' but does not declare it "
                f"(declared writes: {sorted(self._writable) or 'none'})"
            )
        old = self._env[key]
        if not isinstance(value, Tensor):
            raise FieldAccessError(f"env.{key}: expected a tensor (got {type(value).__name__})")
        if tuple(value.shape) != tuple(old.shape):
            raise FieldAccessError(f"env.{key}: expected shape {list(old.shape)} (got {list(value.shape)})")
        self._env[key] = converted(f"env.{key}", value, old.dtype)


class NeighborView:
    """Fields of the agents a substep may interact with: local rows first, then halo rows.

    Row ``k < n_local`` is agent ``k`` of the population (the rows of ``ctx[pop]``). On one
    process there are no halo rows. On several ranks the engine appends the agents of other
    ranks that are within reach (only the fields the substep declared in ``neighbors``), so
    ``n_local <= n``. With ``sync_every > 1`` the values come from the last refresh
    (``local`` overrides the local rows' values; the halo holds every other stored agent;
    see :mod:`agentsim.distributed.snapshot`).
    """

    def __init__(self, pop: Population, fields: tuple[str, ...], substep: Substep,
                 halo: Mapping[str, Tensor] | None = None, local: Mapping[str, Tensor] | None = None) -> None:
        self._pop = pop
        self._fields = set(fields) | {UID}
        self._substep = substep
        self._halo = halo or {}
        self._local = local
        self.n_local = pop.n

    @property
    def n(self) -> int:
        """Local plus halo rows."""
        uid = self._halo.get(UID)
        return self.n_local + (0 if uid is None else uid.shape[0])

    def __getitem__(self, key: str) -> Tensor:
        if key not in self._fields:
            raise FieldAccessError(
                f"substep '{self._substep.name}' reads neighbor field '{self._pop.name}.{key}' but declares "
                f"only neighbors={{'{self._pop.name}': {sorted(self._fields - {UID})}}}"
            )
        local = self._pop[key] if self._local is None else self._local[key]
        if key in self._halo:
            return torch.cat([local, self._halo[key]])
        return local


NeighborsFn = Callable[[str], NeighborView]


class Context:
    """The argument of every substep.

    Args:
        substep: The substep being run.
        state: The state it runs on (this rank's agents, or a subset of them).
        step: The step being computed (the first step is 1; the state at step 0 is the initial state).
        params: Read-only resolved parameters.
        rng: Counter-based random numbers bound to ``step``, default stream the substep's name.
        space: The model's space (Box, Grid, Graph) or None.
        device: The device of the state.
        neighbors: ``neighbors(population) -> NeighborView`` (None: the substep reads no neighbors).
        policies: Policy name to the actor that chooses its actions (see :mod:`agentsim.core.policy`).
        per_agent_flags: Keep the conditions of an agentwise substep's flags per agent (``[n]``)
            instead of reducing them: the engine runs it for a subset of its agents and keeps
            the flags of the agents whose values it keeps.
        groups: The run's per-group sums over ranks (:meth:`group_totals`; default: one process).

    Attributes:
        effects: The births, deaths and flags requested so far (:class:`Effects`).
    """

    def __init__(self, substep: Substep, state: State, *, step: int, params: Params, rng: StepRNG, space: Any,
                 device: torch.device, neighbors: NeighborsFn | None, per_agent_flags: bool = False,
                 policies: Mapping[str, Any] | None = None, groups: GroupSums | None = None) -> None:
        self.substep = substep
        self.step = step
        self.params = params
        self.rng = rng
        self.space = _limited(space, substep, params)
        self.device = device
        self.effects = Effects()
        self._state = state
        self._neighbors = neighbors
        self._per_agent_flags = per_agent_flags
        self._policies = policies or {}
        self._groups = groups if groups is not None else GroupSums(LocalComm())
        self._agreed: set[str] = set()  # group fields every rank checked in this call, which it may not write

    # ctx["env"] (as in 0.1) is ctx.env; the overlap of "env" with str is intended.
    @overload
    def __getitem__(self, population: Literal["env"]) -> EnvView: ...  # type: ignore[overload-overlap]

    @overload
    def __getitem__(self, population: str) -> PopulationView: ...

    def __getitem__(self, population: str) -> PopulationView | EnvView:
        """The checked view of a population (or, ``"env"``, of the environment)."""
        if population == ENV:
            return self.env
        pop = self._state[population]
        if not self.substep.touches(population):
            raise FieldAccessError(
                f"substep '{self.substep.name}' uses population '{population}' without declaring any of its fields"
            )
        return PopulationView(pop, self.substep)

    @property
    def env(self) -> EnvView:
        """Checked access to the environment tensors."""
        return EnvView(self._state.env, self.substep)

    def neighbors(self, population: str) -> NeighborView:
        """The declared neighbor fields of ``population``: local rows then halo rows."""
        if population not in self.substep.neighbors or self._neighbors is None:
            raise FieldAccessError(
                f"substep '{self.substep.name}' asks for neighbors of '{population}' but declares "
                f"neighbors={dict(self.substep.neighbors)}"
            )
        return self._neighbors(population)

    def group_totals(self, field: str, rows: Tensor, values: Tensor) -> tuple[Tensor, Tensor]:
        """Integer sums over groups of agents, whatever rank their members are on.

        ``field`` (``"population.field"``, declared in ``reads``) holds each agent's group: a
        household, a school (ints >= 0; negative: none); a field ``[n, k]`` holds ``k`` groups per
        agent (several venues, fixed groups of contacts), each of which gets the agent's values.
        The agents ``rows`` of this rank contribute ``values``; the contributions of every rank
        are added per group. A model that reads other agents
        only through such sums (infectious members per place) needs no ``neighbors`` at all.
        Every rank must call it, with empty ``rows`` when it has nothing to add, in the same
        order (it is a collective step, as ``ctx.spawn``). See :mod:`agentsim.core.groups`.

        Args:
            field: The group field, e.g. ``"person.household"``.
            rows: ``[m]`` int64 or int32 contributing rows of the population (this rank's).
            values: ``[m]`` or ``[m, k]`` integer contributions (float sums would depend on the
                split of agents over ranks, so they are refused).

        Returns:
            ``(groups, totals)``: ``[g]`` int64 sorted ids of the groups of this rank's agents
            that got a contribution from some rank, and ``[g]`` or ``[g, k]`` int64 totals over
            every rank: the same for any number of ranks.

        Examples:
            >>> import torch
            >>> from agentsim.core.params import Params
            >>> from agentsim.core.random import CounterRNG
            >>> from agentsim.core.state import FieldSpec, Population, State
            >>> from agentsim.core.substep import Substep
            >>> home = torch.tensor([4, 4, 1])
            >>> pop = Population("person", {"uid": FieldSpec(torch.int64), "home": FieldSpec(torch.int64)},
            ...                  {"uid": torch.arange(3), "home": home})
            >>> step = Substep(lambda ctx: None, name="mix", reads=["person.home"])
            >>> ctx = Context(step, State({"person": pop}, {}), step=1, params=Params({}),
            ...               rng=CounterRNG(0).at(1, "mix"), space=None, device=torch.device("cpu"), neighbors=None)
            >>> rows, ones = torch.tensor([0, 1, 2]), torch.ones(3, dtype=torch.int64)
            >>> groups, totals = ctx.group_totals("person.home", rows, ones)
            >>> groups.tolist(), totals.tolist()
            ([1, 4], [1, 2])
        """
        out = self._groups.totals(field, self._group_field("group_totals", field), rows, values)
        self._agree(field)
        return out

    def group_table(self, field: str, rows: Tensor, values: Tensor) -> Tensor:
        """The integer sums of :meth:`group_totals` for every group of this rank's agents, as a
        table in the numbering of :meth:`group_index` (row ``g``: group ``ctx.group_index(field).ids[g]``;
        0 where nothing was added; the last row, 0, for agents in no group), so that
        ``table[index.of]`` is each agent's group total (``[n, k]`` for a field of ``k`` groups per
        agent: ``.sum(1)`` adds them, or ``index.sums(table, rows)`` for some rows). Faster than
        :meth:`group_totals` where many groups get a contribution (no sort); several fields' tables
        are read at once with :func:`agentsim.core.ops.gather_sum`. A collective step like
        :meth:`group_totals`.

        Args:
            field: The group field, e.g. ``"person.household"`` (declared in ``reads``).
            rows: ``[m]`` int64 or int32 contributing rows of the population (this rank's).
            values: ``[m]`` or ``[m, k]`` integer contributions.

        Returns:
            ``[G + 1]`` or ``[G + 1, k]`` int64 totals over every rank, ``G`` the groups of this rank's
            agents.

        Examples:
            >>> import torch
            >>> from agentsim.core.params import Params
            >>> from agentsim.core.random import CounterRNG
            >>> from agentsim.core.state import FieldSpec, Population, State
            >>> from agentsim.core.substep import Substep
            >>> pop = Population("person", {"uid": FieldSpec(torch.int64), "home": FieldSpec(torch.int64)},
            ...                  {"uid": torch.arange(3), "home": torch.tensor([4, 4, 1])})
            >>> step = Substep(lambda ctx: None, name="mix", reads=["person.home"])
            >>> ctx = Context(step, State({"person": pop}, {}), step=1, params=Params({}),
            ...               rng=CounterRNG(0).at(1, "mix"), space=None, device=torch.device("cpu"), neighbors=None)
            >>> sick = torch.tensor([0, 1])  # rows 0 and 1, both of home 4
            >>> per_home = ctx.group_table("person.home", sick, torch.ones(2, dtype=torch.int64))
            >>> per_home.tolist(), per_home[ctx.group_index("person.home").of].tolist()
            ([0, 2, 0], [2, 2, 0])
        """
        out = self._groups.table(field, self._group_field("group_table", field), rows, values)
        self._agree(field)
        return out

    def group_tables(self, requests: Mapping[str, tuple[Tensor, Tensor]]) -> dict[str, Tensor]:
        """:meth:`group_table` of several group fields at once (``field: (rows, values)``): the
        same tables, with one exchange for all of them on several processes instead of one per
        field. A collective step: every rank passes the same fields in the same order.

        Examples:
            >>> import torch
            >>> from agentsim.core.params import Params
            >>> from agentsim.core.random import CounterRNG
            >>> from agentsim.core.state import FieldSpec, Population, State
            >>> from agentsim.core.substep import Substep
            >>> pop = Population("person", {"uid": FieldSpec(torch.int64), "home": FieldSpec(torch.int64),
            ...                             "work": FieldSpec(torch.int64)},
            ...                  {"uid": torch.arange(3), "home": torch.tensor([4, 4, 1]),
            ...                   "work": torch.tensor([0, 2, 2])})
            >>> step = Substep(lambda ctx: None, name="mix", reads=["person.home", "person.work"])
            >>> ctx = Context(step, State({"person": pop}, {}), step=1, params=Params({}),
            ...               rng=CounterRNG(0).at(1, "mix"), space=None, device=torch.device("cpu"), neighbors=None)
            >>> sick, one = torch.tensor([0, 1]), torch.ones(2, dtype=torch.int64)
            >>> tables = ctx.group_tables({"person.home": (sick, one), "person.work": (sick, one)})
            >>> tables["person.home"].tolist(), tables["person.work"].tolist()
            ([0, 2, 0], [1, 1, 0])
        """
        return self._over_fields("group_tables", requests, self._groups.tables)

    def group_sums(self, requests: Mapping[str, tuple[Tensor, Tensor]],
                   only: Tensor | None = None) -> dict[str, Tensor]:
        """Each agent's sum over its groups of the groups' totals, for several group fields at once
        (``field: (rows, values)``, ``values`` ``[m]`` integers): ``index.sums(table, every row)`` of
        the :meth:`group_tables` of the same contributions, the same bits on any number of ranks.
        Made for fields of many small groups (fixed groups of contacts, ``[n, k]``): on the CPU each
        contribution is pushed to the contributor's group-mates, and from the second call on only
        the contributions that changed since the last call push (their change), so the work
        follows the changes (people who became or stopped being infectious) instead of every group
        and every agent. On several processes the groups a rank holds alone are pushed so, and the
        totals of the groups shared with other ranks are exchanged and added for their members.
        Larger groups and other devices use the tables. A collective step: every rank passes the
        same fields in the same order.

        Args:
            requests: ``field: (rows, values)``: the contributing rows (``[m]`` int64 or int32) and
                their integer values ``[m]``.
            only: ``[n]`` bool, the agents whose sums are wanted (the susceptible, say); the others
                get 0, and with the tables only the wanted agents read them. None: every agent.

        Returns:
            ``field`` to ``[n]`` int64 (this rank's agents).

        Examples:
            >>> import torch
            >>> from agentsim.core.params import Params
            >>> from agentsim.core.random import CounterRNG
            >>> from agentsim.core.state import FieldSpec, Population, State
            >>> from agentsim.core.substep import Substep
            >>> pop = Population("person", {"uid": FieldSpec(torch.int64), "clubs": FieldSpec(torch.int64, (2,))},
            ...                  {"uid": torch.arange(3), "clubs": torch.tensor([[5, 8], [5, -1], [8, 8]])})
            >>> step = Substep(lambda ctx: None, name="mix", reads=["person.clubs"])
            >>> ctx = Context(step, State({"person": pop}, {}), step=1, params=Params({}),
            ...               rng=CounterRNG(0).at(1, "mix"), space=None, device=torch.device("cpu"), neighbors=None)
            >>> sick = torch.tensor([0])  # row 0, in clubs 5 and 8: those clubs' totals are 1 each
            >>> ctx.group_sums({"person.clubs": (sick, torch.ones(1, dtype=torch.int64))})["person.clubs"].tolist()
            [2, 1, 2]
        """
        return self._over_fields("group_sums", requests, lambda fields: self._groups.spread(fields, only))

    def weighted_group_sums(self, requests: Mapping[str, tuple[Tensor, Tensor]], weights: Mapping[str, float],
                            only: Tensor | None = None) -> Tensor:
        """The :meth:`group_sums` of several fields, each times its weight, added in the order of
        ``requests``: ``[n]`` float64, ``0.0 + float64(sums[f0]) * weights[f0] + ...`` (each product
        and addition rounded in float64), the same bits on any number of ranks. Typical use: the
        force of infection of several contact layers, each at its rate. Where the fields' groups
        are pushed (small groups, on the CPU), the kept sums are read directly: one float64 total
        instead of an int64 copy per field; on several processes the totals of the groups shared
        with other processes are added to them for the call.

        Args:
            requests: ``field: (rows, values)``, as :meth:`group_sums`.
            weights: ``field: weight``, one finite float per field of ``requests``.
            only: ``[n]`` bool, the agents whose total is wanted (the others get 0.0), or None.

        Returns:
            ``[n]`` float64 (this rank's agents).

        Raises:
            ConfigError: As :meth:`group_sums`, or weights that are not one finite float per field.

        Examples:
            >>> import torch
            >>> from agentsim.core.params import Params
            >>> from agentsim.core.random import CounterRNG
            >>> from agentsim.core.state import FieldSpec, Population, State
            >>> from agentsim.core.substep import Substep
            >>> pop = Population("person", {"uid": FieldSpec(torch.int64), "home": FieldSpec(torch.int64),
            ...                             "club": FieldSpec(torch.int64)},
            ...                  {"uid": torch.arange(3), "home": torch.tensor([1, 1, 2]),
            ...                   "club": torch.tensor([7, 8, 7])})
            >>> step = Substep(lambda ctx: None, name="mix", reads=["person.home", "person.club"])
            >>> ctx = Context(step, State({"person": pop}, {}), step=1, params=Params({}),
            ...               rng=CounterRNG(0).at(1, "mix"), space=None, device=torch.device("cpu"), neighbors=None)
            >>> sick, one = torch.tensor([0]), torch.ones(1, dtype=torch.int64)  # row 0: home 1, club 7
            >>> ctx.weighted_group_sums({"person.home": (sick, one), "person.club": (sick, one)},
            ...                         {"person.home": 0.5, "person.club": 0.25}).tolist()
            [0.75, 0.5, 0.25]
        """
        return self._over_fields("weighted_group_sums", requests,
                                 lambda fields: self._groups.weighted(fields, weights, only))

    def group_index(self, field: str) -> GroupIndex:
        """This rank's groups of ``field`` (declared in ``reads``), numbered ``0 .. G - 1``: their ids,
        each agent's group number (``[n, k]`` numbers for a field of ``k`` groups per agent), each
        group's size over every rank (memberships), and its members here
        (:class:`~agentsim.core.groups.GroupIndex`). Built at the first call and again when the field
        or its population changed; a collective step like :meth:`group_totals`, except after a
        :meth:`group_table` of the same field in the same call of a substep that does not write
        it: every rank then knows its index is current, and nothing travels.
        """
        tensor = self._group_field("group_index", field)
        if field in self._agreed and isinstance(self._groups, GroupSums):
            index = self._groups.current_index(field, tensor)
            if index is not None:
                return index
        out = self._groups.index(field, tensor)
        self._agree(field)
        return out

    def _agree(self, field: str) -> None:
        """After a collective group call on ``field``: every rank knows the field's groups as they are
        now, and they stay so in this call if the substep may not write the field (an undeclared
        write is an error).
        """
        population, _, name = field.partition(".")
        if name not in self.substep.writable(population):
            self._agreed.add(field)

    def _over_fields(self, what: str, requests: Mapping[str, tuple[Tensor, Tensor]],
                     call: Callable[[dict[str, tuple[Tensor, Tensor, Tensor]]], _Out]) -> _Out:
        """``call`` of the collective group method ``what`` with each requested field's tensor put
        before its ``(rows, values)``; then each field is agreed (:meth:`_agree`).
        """
        fields = {name: (self._group_field(what, name), *contribution) for name, contribution in requests.items()}
        out = call(fields)
        for name in fields:
            self._agree(name)
        return out

    def _group_field(self, what: str, field: str) -> Tensor:
        """The declared group field ``"population.field"`` of this rank's agents."""
        population, _, name = field.partition(".")
        if population not in self._state.populations or name not in self.substep.readable(population) or name == UID:
            raise FieldAccessError(f"substep '{self.substep.name}': {what}({field!r}) needs the group field "
                                   f"declared in reads= (declared: {', '.join(self.substep.reads) or 'none'})")
        if self.substep.agentwise:
            raise ConfigError(f"substep '{self.substep.name}' is agentwise: {what} reads all agents of a group, "
                              "which an agentwise substep may not (it may run on a subset of the agents)")
        return self._state[population][name]

    def actor(self, policy: str) -> Any:
        """The actor of ``policy`` in this run (what a policy substep asks for its actions)."""
        try:
            return self._policies[policy]
        except KeyError:
            raise ConfigError(f"substep '{self.substep.name}': no actor for policy {policy!r} in this run "
                              f"(actors: {', '.join(self._policies) or 'none'})") from None

    def spawn(self, population: str, parent_uid: Tensor, fields: Mapping[str, Tensor]) -> None:
        """Add one child per parent uid (applied when the substep returns).

        Args:
            population: Where the children go (must be declared in ``births``).
            parent_uid: ``[m]`` distinct int64 uids of the parents (of any population).
            fields: Every field of the population except ``uid``, each ``[m, ...]``.
        """
        if population not in self.substep.births:
            raise FieldAccessError(
                f"substep '{self.substep.name}' spawns into '{population}' but declares "
                f"births={list(self.substep.births)}")
        self.effects.births.append(Birth(population, parent_uid, fields))

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
        self.effects.deaths.append(Death(population, dies))

    def deposit(self, layer: str, cells: Tensor, amounts: Tensor) -> None:
        """Add ``amounts`` into the float env layer ``layer`` at the flat indices ``cells``, exactly
        (applied when the substep returns; :mod:`agentsim.core.env`).

        Each amount is rounded to a multiple of ``2**-24`` and the amounts of a cell are summed in
        int64 over this call's agents and every process, so the layer's new values have the same
        bits on any number of processes. Consuming is a negative deposit. Deposit for this
        process's agents (``ctx[pop]`` rows), never for the halo's. The substep must declare the
        layer in ``writes=`` with ``combine={"env.<layer>": "add"}``, and writes it only this way.

        Args:
            layer: The layer's name (``"food"`` or ``"env.food"``).
            cells: ``[m]`` integer flat indices into the layer (row-major).
            amounts: ``[m]`` float amounts (the layer's units). NaN, inf, magnitudes of
                :data:`~agentsim.core.env.DEPOSIT_LIMIT` or more, and cells outside the layer
                stop the run at this step with an error (those deposits are not made).
        """
        name = layer[len(ENV) + 1:] if layer.startswith(ENV + ".") else layer
        where = f"substep '{self.substep.name}': ctx.deposit into env.{name}"
        if name not in self.substep.writable(ENV) or self.substep.env_combine(name) != "add":
            raise FieldAccessError(f"{where}: declare the layer in writes= with combine={{'env.{name}': 'add'}}")
        current = self._state.env[name]
        if not deposit_layer(current.dtype, "add"):
            raise ConfigError(f"{where}: the layer holds {current.dtype}; deposits are for float layers (an integer "
                              "layer with combine 'add' is written as usual: its changes add up exactly)")
        if not isinstance(cells, Tensor) or cells.dim() != 1 or cells.is_floating_point() \
                or cells.dtype == torch.bool or not isinstance(amounts, Tensor) or amounts.shape != cells.shape \
                or not amounts.is_floating_point():
            got = ", ".join(f"{type(v).__name__} {v.dtype} {list(v.shape)}" if isinstance(v, Tensor)
                            else type(v).__name__ for v in (cells, amounts))
            raise ConfigError(f"{where}: expected cells [m] integers and amounts [m] floats (got {got})")
        if amounts.requires_grad and torch.is_grad_enabled():
            raise ConfigError(f"{where}: deposits are exact integer sums, not differentiable; a differentiable "
                              "run writes the layer with the default combine 'set'")
        n = current.numel()
        outside = (cells < 0) | (cells >= n)
        bad = ~torch.isfinite(amounts) | (amounts.abs() >= DEPOSIT_LIMIT)
        self.effects.flags.append(Flag(f"{where}: a cell outside the layer's {n} cells", outside.any()))
        self.effects.flags.append(Flag(f"{where}: an amount that is NaN, inf or of magnitude {DEPOSIT_LIMIT:g} or "
                                       "more", bad.any()))
        keep = ~(outside | bad)
        fixed = ops.to_fixed(torch.where(keep, amounts, 0.0), DEPOSIT_FRAC_BITS)  # 0 where not kept
        total = self.effects.deposits.get(name)
        if total is None:
            total = self.effects.deposits[name] = torch.zeros(n, dtype=torch.int64, device=current.device)
        total.index_add_(0, torch.where(keep, cells, 0).to(torch.int64), fixed)

    def flag(self, message: str, condition: Tensor) -> None:
        """Record an error condition (a bool tensor); checked once per step on all ranks.

        Any shape, except in an ``agentwise`` substep, whose conditions are per agent: ``[n, ...]``
        with ``n`` the agents of the population it writes (the engine may run it for a subset of
        them and keeps the flags of the agents whose values it keeps).
        """
        name = f"{self.substep.name}: {message}"
        written = self.substep.written_populations() if self.substep.agentwise else set()
        if written:
            pop = next(iter(written))
            n = self._state[pop].n
            if condition.dim() == 0 or condition.shape[0] != n:
                raise FieldAccessError(
                    f"substep '{self.substep.name}' is agentwise: ctx.flag expects a condition per agent of "
                    f"'{pop}' (shape [{n}, ...]; got {list(condition.shape)})")
            if self._per_agent_flags:  # the engine picks the rows it keeps
                self.effects.flags.append(Flag(name, condition.reshape(n, -1).any(1)))
                return
        self.effects.flags.append(Flag(name, condition.any()))


class InitContext:
    """What a model's ``init`` receives: it adds populations and environment layers and returns
    the space.

    Attributes:
        n_agents: The number of agents asked for (the model splits them over its populations).
        params: Read-only resolved parameters.
        rng: Random numbers at step 0; default stream ``"init"`` (name a stream per use).
        device: Where the state lives.
        seed: The run seed.
        rank, world_size: This process and the number of processes (0 and 1 on one process). An
            ``init`` that builds the whole state (the usual case) never needs them; one that builds
            only a share of the agents on each process asks with :meth:`share`.

    Examples:
        >>> import torch
        >>> from agentsim.core.random import CounterRNG
        >>> ic = InitContext(Params({}), 3, CounterRNG(1).at(0, "init"), torch.device("cpu"))
        >>> uid = ic.uids("walker", 3)
        >>> ic.add("walker", uid=uid, pos=ic.rng.uniform(uid, "pos", draws=2))
        >>> ic.state()["walker"]
        Population('walker', n=3, fields=[uid:int64, pos:float64[2]])
    """

    def __init__(self, params: Params, n_agents: int, rng: Any, device: torch.device, *, rank: int = 0,
                 world_size: int = 1) -> None:
        self.params = params
        self.n_agents = n_agents
        self.rng = rng  # a StepRNG at step 0, default stream "init"
        self.device = device
        self.rank, self.world_size = rank, world_size
        self.shared = False  # share() was called: this process builds its share of the agents only
        self._populations: dict[str, Population] = {}
        self._env: dict[str, Tensor] = {}
        self._next_uid: dict[str, int] = {}
        self.inputs: dict[str, tuple[int, int]] = {}  # declare_input: name -> (crc32, bytes) of what was read

    @property
    def seed(self) -> int:
        """The run seed."""
        return int(self.rng.seed)

    def share(self) -> tuple[int, int]:
        """Build only a share of the agents on this process: returns ``(rank, world_size)``.

        For populations too large for every process to build whole (a country's people): each
        process adds the agents of its share only (any split, e.g. the localities
        :func:`agentsim.population.partition_localities` gives ``rank``), and the partitioner then
        sends every agent to the process that owns it (``spatial``: the rank whose region holds its
        position, ``rcb`` regions from the histogram of every rank's agents; ``data``: agents stay
        where they were built). Every process adds the same populations with the same fields (empty
        tensors where its share has no agents); the engine checks it. The model keeps what makes a
        run the same on any number of processes:

        - the shares of ``0 .. world_size - 1`` together are exactly the agents one process builds
          (``share()`` gives ``(0, 1)`` there), with the same fields, whatever ``world_size``;
        - uids are global ids the model assigns (not :meth:`uids`, whose counter is per process);
        - environment layers are still whole and the same on every process.

        Examples:
            >>> import torch
            >>> from agentsim.core.params import Params
            >>> from agentsim.core.random import CounterRNG
            >>> ic = InitContext(Params({}), 10, CounterRNG(1).at(0, "init"), torch.device("cpu"), rank=1,
            ...                  world_size=2)
            >>> rank, world = ic.share()
            >>> uid = torch.arange(10)[rank::world]       # this process builds the odd uids
            >>> ic.add("walker", uid=uid)
            >>> ic.state()["walker"].n
            5
        """
        if self._next_uid:
            raise ConfigError("share() after uids(): an init that builds a share per process assigns global uids "
                              "itself (uids() counts on this process only)")
        self.shared = True
        return self.rank, self.world_size

    def declare_input(self, name: str, content: str | bytes) -> None:
        """Declare what this ``init`` read from outside the run's parameters (a file named by a
        parameter, a data set): on several processes each process reads its own copy, and the
        engine checks after ``init`` that every process read the same (a crc32 of ``content``),
        else it stops every process with an error naming ``name`` (a file that differs between
        hosts would otherwise give each process other agents, silently).

        Args:
            name: What was read, for the error (e.g. ``"age_pyramid 'ages.csv'"``).
            content: What was read, or a canonical text of what was parsed from it.

        Examples:
            >>> import torch
            >>> from agentsim.core.random import CounterRNG
            >>> ic = InitContext(Params({}), 3, CounterRNG(1).at(0, "init"), torch.device("cpu"))
            >>> ic.declare_input("ages", "age_from,age_to,percent; 0,99,100")
            >>> sorted(ic.inputs)
            ['ages']
        """
        if not isinstance(name, str) or not isinstance(content, (str, bytes)):
            raise ConfigError(f"declare_input(name, content): expected a str name and str or bytes content (got "
                              f"{type(name).__name__}, {type(content).__name__})")
        data = content.encode() if isinstance(content, str) else content
        self.inputs[name] = (zlib.crc32(data), len(data))

    def uids(self, population: str, n: int) -> Tensor:
        """``n`` new uids of ``population`` (``[n]`` int64 on the device): the next ``n`` of its
        counter, which starts at 0. Births continue from the last one reserved.

        A uid is unique within its population, not across populations (sheep 3 and wolf 3 may
        both exist): a substep that draws for two populations keyed by uid gives each its own
        stream (or draw index), or sheep 3 and wolf 3 get the same numbers.
        """
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ConfigError(f"uids({population!r}, n): expected an int n >= 0 (got {n!r})")
        if self.shared:
            raise ConfigError(f"uids({population!r}, n) after share(): it counts on this process only, so two "
                              "processes would give the same uids; assign global uids in the model")
        first = self._next_uid.get(population, 0)
        self._next_uid[population] = first + n
        return torch.arange(first, first + n, device=self.device)

    def add(self, population: str, *, uid: Tensor, **fields: Tensor) -> None:
        """Add a population: ``uid`` ``[n]`` int64 and its fields, each ``[n, ...]``; dtype and
        per-agent shape of every field are taken from the tensors given.
        """
        if population in self._populations:
            raise ConfigError(f"population '{population}' was already added")
        if population == ENV:
            raise ConfigError("'env' names the environment: use add_env() for environment layers")
        if not isinstance(uid, Tensor) or uid.dim() != 1 or uid.dtype not in (torch.int64, torch.int32):
            got = f"{uid.dtype} {list(uid.shape)}" if isinstance(uid, Tensor) else type(uid).__name__
            raise ConfigError(f"add({population!r}): uid must be a [n] int64 tensor (got {got})")
        for key, value in fields.items():
            if not isinstance(value, Tensor):
                raise ConfigError(f"add({population!r}): field '{key}' must be a tensor (got {type(value).__name__})")
        if uid.numel() > 1 and not bool((uid[1:] > uid[:-1]).all()):  # increasing (ic.uids): distinct, one pass
            ordered = torch.sort(uid.to(torch.int64)).values
            repeated = ordered[1:][ordered[1:] == ordered[:-1]]
            if repeated.numel():
                raise ConfigError(f"add({population!r}): uid {int(repeated[0])} appears more than once (uids identify "
                                  f"agents for the whole run and must be distinct; take them from "
                                  f"ic.uids({population!r}, n))")
        specs = {UID: FieldSpec(torch.int64), **{k: FieldSpec(v.dtype, tuple(v.shape[1:])) for k, v in fields.items()}}
        reserved = self._next_uid.get(population, 0)
        top = int(uid.max()) + 1 if uid.numel() else 0
        self._populations[population] = Population(population, specs, {UID: uid, **fields},
                                                   next_uid=max(reserved, top))

    def add_env(self, **layers: Tensor) -> None:
        """Add environment tensors (grid layers ``[H, W]``, scalars ``[]``, ...)."""
        for key, value in layers.items():
            if not isinstance(value, Tensor):
                raise ConfigError(f"add_env: '{key}' must be a tensor (got {type(value).__name__})")
            if key in self._env:
                raise ConfigError(f"environment layer '{key}' was already added")
            self._env[key] = value

    def state(self) -> State:
        """The state built by :meth:`add` and :meth:`add_env` (step 0)."""
        return State(self._populations, self._env)


@dataclass
class MetricsContext:
    """What a metric function receives: the state (read it as ``state["walker"]["disp"]``),
    parameters, space and step, and the environment cells this rank owns.

    Environment layers may be replicated or overlap (halo cells) across ranks; use
    :meth:`owned_env` for metrics so every cell is counted once over all ranks.
    """

    state: State
    params: Mapping[str, Any]
    space: Any
    step: int
    owned_env_fn: Callable[[str], Tensor] | None = None

    def __getitem__(self, population: str) -> Population:
        return self.state[population]

    def owned_env(self, name: str) -> Tensor:
        """The cells of env layer ``name`` this rank owns, flattened (all of them on one process)."""
        if self.owned_env_fn is not None:
            return self.owned_env_fn(name)
        return self.state.env[name].reshape(-1)

    @property
    def env(self) -> None:
        """Not available: every process holds every layer whole, so a metric of ``env[name]`` would
        count each cell once per process; a metric reads :meth:`owned_env` (each cell counted once).
        """
        raise AttributeError("a metric reads env layers with state.owned_env(name) (the cells this process owns, "
                             "flattened), not state.env: every process holds every layer whole, so summing the "
                             "layer would count each cell once per process")


def _limited(space: Any, substep: Substep, params: Params) -> Any:
    """The space a substep sees: one that knows the radius the substep's length reach covers
    (a Box's ``with_query_limit``: searches beyond it raise), else ``space`` itself.
    """
    limit = getattr(space, "with_query_limit", None)
    if not substep.neighbors or limit is None:
        return space
    kind, value = resolve_reach(substep, params)
    if kind != "length":
        return space
    named = f" = {value}" if isinstance(substep.reach, str) else ""  # a parameter's name: say its value
    return limit(value, f"substep '{substep.name}' declares reach {substep.reach!r}{named}")
