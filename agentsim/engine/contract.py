"""The check mode (``Simulation(..., check=True)``, ``agentsim run --check``): every substep call
is checked against the contract that makes a model give the same bits on any number of
processes, and a broken promise stops the run at that substep with a :class:`ContractError`
that names the step, the substep, the field and the agents (uids), with a hint.

What is checked, at every call of every substep (policy substeps excepted):

- **row order**: the substep runs again on its agents in another row order; its writes (by
  uid), births (by parent uid), deaths, flags and env writes must be the same. Catches
  draws not keyed by uid (``torch.rand``), "first agent of the cell wins" by row, and sums in
  row order where the bits depend on it;
- **the split** (one process): the agents are split in two parts, as two processes would
  hold them (by position: the lower and upper half of the first region axis; by uid where
  there is no space), and the substep runs on each part with, as its halo, the other
  part's agents *within the declared reach* of the part's agents. The parts' writes,
  births, deaths and flags, and their env changes combined as declared
  (:mod:`agentsim.core.env`), must give what the one-process call gave. When they do not, the
  substep runs again with the whole other part as its halo: if that agrees, the substep
  reads agents beyond its declared ``reach``; if not, its result depends on how the
  agents are split (a sum or a choice over ``ctx[pop]`` rows instead of
  ``ctx.neighbors``, or env writes whose combine does not fit). ``ctx.group_totals`` in the
  parts adds the other part's contributions, as processes exchange them (the parts run again
  with what the other contributed until that stops changing), and ``ctx.group_index`` counts
  both parts' members;
- **env indices**: env layers read through ``ctx.env`` refuse negative indices (a bounded
  grid's ``neighbor_cells`` gives -1 beyond the border, which torch would read as the last
  cell);
- **uids**: after births, every uid of a population is distinct (over all ranks).

Besides these, every run (check mode or not) refuses undeclared reads and writes, in-place
changes of read-only fields, NaN and inf in written fields, duplicate uids from ``init``,
agents on cells outside the grid, narrowing dtype conversions, and env writes of several
processes that do not combine (:mod:`agentsim.core.env`).

On several processes the check mode checks the row order on each rank, the uids over all
ranks, and, with the spatial partitioner, the reach: the substep runs again with every
other rank's agents as its halo and must give the same writes. A violation found on one rank
stops every rank at the same substep. The checks cost several calls of every substep: use
the check mode while writing a model (``agentsim check`` runs it), not for production runs.
Nothing of it runs when it is off.

A sampled check, ``check=K`` (``agentsim run --check K``), checks every substep call of every K-th
step (steps K, 2K, ...) and runs the other steps as usual: a production run on several processes
that watches its contract at about ``1 + (c - 1) / K`` times the plain run's time, ``c`` the check
mode's own factor (the spatial partitioner then runs no substep around its exchange, on any step).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import Tensor

from agentsim.core.comm import Comm, LocalComm
from agentsim.core.context import Effects, Halos
from agentsim.core.env import DEPOSIT_FRAC_BITS, changed_cells, deposit_layer, merge_layer
from agentsim.core.groups import GroupIndex, GroupSums, check_spread, check_weights, weighted_total
from agentsim.core.params import Params
from agentsim.core.state import UID, State
from agentsim.core.substep import ENV, Substep, resolve_reach
from agentsim.errors import ConfigError, ContractError
from agentsim.space.continuous.box import Box
from agentsim.space.grid import Grid
from agentsim.space.line import Line

__all__ = ["ContractChecks", "check_every_steps", "checked_env"]

CallFn = Callable[..., Effects]  # call(substep, state, halos, groups=None) -> Effects
_GROUP_PASSES = 4  # passes of a split call that uses ctx.group_totals (2 unless totals feed later contributions)
Outcome = dict[str, Tensor]
_DEPOSITS = "deposits into "  # an outcome's key for a float layer's exact deposit sums, "deposits into env.<layer>"
_MESSAGE_BYTES = 4096  # a violation's message travels to every rank in a fixed-size row


def check_every_steps(check: object) -> int:
    """The steps between checked steps for a ``check`` argument: ``True`` 1 (every step), ``False``
    or 0 none (0), an int ``K >= 1`` every K-th step.

    Raises:
        ConfigError: ``check`` is neither a bool nor an int >= 0.
    """
    if isinstance(check, bool):
        return int(check)
    if isinstance(check, int) and check >= 0:
        return check
    raise ConfigError(f"check: expected True, False, or a number of steps K >= 1 (check every K-th step) "
                      f"(got {check!r})")


class _CheckedLayer(Tensor):
    """An env layer (and what is computed from it) that refuses negative indices (check mode)."""

    substep = ""  # the substep being called (calls are sequential)

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func in (Tensor.__getitem__, Tensor.index_select, torch.index_select, Tensor.take, torch.take,
                    Tensor.gather, torch.gather):
            for arg in (*args[1:], *kwargs.values()):
                for index in (arg if isinstance(arg, tuple) else (arg,)):
                    if isinstance(index, Tensor) and not index.is_floating_point() and index.dtype != torch.bool \
                            and index.numel() and bool((index < 0).any()):
                        raise ContractError(
                            f"substep '{cls.substep}': an env layer is indexed at {int(index.min())} (directly or "
                            "through a value computed from it): a negative index reads a cell from the "
                            "other end of the layer (a bounded grid's neighbor_cells gives -1 for cells beyond "
                            "the border: mask them, e.g. torch.where(cells >= 0, layer[cells.clamp(min=0)], 0))")
        return super().__torch_function__(func, types, args, kwargs)


def checked_env(env: dict[str, Tensor], substep: Substep) -> dict[str, Tensor]:
    """``env`` with each layer as a :class:`_CheckedLayer` naming ``substep`` in its errors."""
    _CheckedLayer.substep = substep.name
    return {key: value.as_subclass(_CheckedLayer) for key, value in env.items()}


def plain(t: Tensor) -> Tensor:
    """``t`` as a plain tensor (a value computed from a checked layer keeps its class otherwise)."""
    return t.as_subclass(Tensor) if isinstance(t, _CheckedLayer) else t


class ContractChecks:
    """The checks of one run in check mode (see the module docstring).

    Args:
        call: ``call(substep, state, halos) -> Effects``: runs a substep on a state (the engine's).
        space: The model's space (or None).
        params: Resolved parameters.
        comm: This rank's communication.
        partition: The partitioner's name (``"identity"``, ``"data"``, ``"spatial"``).
        skip: Substeps not checked (policies: their actor records what it is called with).
    """

    def __init__(self, call: CallFn, space: Any, params: Params, comm: Comm, partition: str,
                 skip: set[str]) -> None:
        self.call, self.space, self.params, self.comm = call, space, params, comm
        self.partition = partition
        self.skip = skip

    # ------------------------------------------------------------------ the engine's hook
    def check(self, s: Substep, before: State, halos: Halos, after: State, effects: Effects, step: int) -> None:
        """After the real call of ``s`` (on ``before``, giving ``after`` and ``effects``): run the
        checks; on several ranks every rank raises the first violation found on any rank.
        """
        problem = None
        if s.name not in self.skip:
            try:
                want = _outcome(s, after, effects)
                problem = self._row_order(s, before, halos, want)
                if problem is None and self.comm.world_size == 1:
                    problem = self._split(s, before, want, after)
                if self.comm.world_size > 1 and self.partition == "spatial" and s.neighbors:
                    found = self._reach_on_ranks(s, before, want)
                    problem = problem or found
            except ContractError as e:
                problem = str(e)
        if self.comm.world_size > 1:
            problem = self._first_problem(problem)
        if problem is not None:
            raise ContractError(f"step {step}: substep '{s.name}': {problem}")

    def check_uids(self, state: State, step: int, s: Substep) -> None:
        """After births: every uid of the populations ``s`` grew is distinct (over all ranks)."""
        for name in s.births:
            uid = state[name][UID]
            if self.comm.world_size > 1:
                uid = self.comm.all_gather_rows({UID: uid})[UID]
            ordered = torch.sort(uid).values
            twice = ordered[1:][ordered[1:] == ordered[:-1]]
            if twice.numel():
                raise ContractError(f"step {step}: substep '{s.name}': uid {int(twice[0])} of '{name}' is held by "
                                    "two agents after births (uids come from the engine: do not reset next_uid)")

    # ------------------------------------------------------------------ row order
    def _row_order(self, s: Substep, before: State, halos: Halos, want: Outcome) -> str | None:
        shuffled = before.clone()
        for pop in shuffled.populations.values():
            if pop.n > 1:  # a fixed permutation: reversed, then the halves swapped
                pop.permute(torch.roll(torch.arange(pop.n - 1, -1, -1), pop.n // 2).to(pop[UID].device))
        got = _outcome(s, shuffled, self.call(s, shuffled, halos))
        diff = _difference(want, got, label="in another row order")
        if diff is None:
            return None
        return (f"{diff} changes when its agents come in another row order: results must depend on uids, never "
                "on row positions (draw with ctx.rng keyed by uid, break ties with uid-keyed random keys as "
                "agentsim.rank_in_group does, sum floats with agentsim.core.ops / metrics in a fixed order)")

    # ------------------------------------------------------------------ the split (one process)
    def _parts(self, before: State) -> list[dict[str, Tensor]]:
        """Two parts, as row masks per population: by the first region axis where there is a space."""
        space = self.space
        field = getattr(space, "position_field", None)
        coords: dict[str, Tensor] = {}
        for name, pop in before.populations.items():
            if field is not None and field in pop and callable(getattr(space, "region_coords", None)):
                coords[name] = space.region_coords(pop[field], axis=0).cpu()
            else:
                coords[name] = (pop[UID] % 2).to(torch.float64).cpu()
        every = torch.cat(list(coords.values())) if coords else torch.zeros(0)
        if every.numel() < 2:
            return []
        cut = torch.quantile(every, 0.5).item()
        lower = {k: v <= cut for k, v in coords.items()}
        if all(bool(m.all()) for m in lower.values()):  # every agent at one coordinate: by uid instead
            lower = {k: (before[k][UID] % 2 == 0).cpu() for k in coords}
        return [lower, {k: ~m for k, m in lower.items()}]

    def _split(self, s: Substep, before: State, want: Outcome, after: State) -> str | None:
        """As the data partitioner splits (by uid, whole halos), then as the spatial one (by position,
        halos within reach).
        """
        by_uid = [{k: (p[UID] % 2 == i).cpu() for k, p in before.populations.items()} for i in (0, 1)]
        for parts, within_reach in ((by_uid, False), (self._parts(before), True)):
            if not parts or any(not any(bool(m.any()) for m in part.values()) for part in parts):
                continue
            problem = self._split_problem(s, before, want, parts, within_reach)
            if problem is not None:
                return problem
        return None

    def _split_problem(self, s: Substep, before: State, want: Outcome, parts: list[dict[str, Tensor]],
                       within_reach: bool) -> str | None:
        got = self._split_outcome(s, before, parts, within_reach=within_reach)
        diff = _difference(want, got, label="split over two processes")
        if diff is None:
            return None
        if within_reach and s.neighbors and \
                _difference(want, self._split_outcome(s, before, parts, within_reach=False)) is None:
            kind, value = resolve_reach(s, self.params)
            return (f"{diff} changes when the agents are split over two processes, each seeing the other's agents "
                    f"within the declared reach {s.reach!r} ({kind} {value:g}) only, and is right when each sees all "
                    "of them: the substep reads agents beyond its declared reach. Declare a reach that covers "
                    "every read (the largest distance, in cells or length units, between an agent and an agent "
                    "it reads)")
        hint = ("agents read other agents only through ctx.neighbors or the group sums ctx.group_table and "
                "ctx.group_totals (a sum, count or choice over ctx[pop] rows sees only this process's agents), "
                "and only their declared fields: a value computed in this substep for this process's agents (a "
                "target, a bid) is unknown for the halo's agents, so write it to a field in one substep and read "
                "it through ctx.neighbors in the next")
        if diff.startswith(_DEPOSITS):
            hint = ("deposit for this process's agents only (ctx[pop] rows, each agent's deposit made once, on the "
                    "process that holds it), never for the halo's (ctx.neighbors rows), and compute each amount "
                    "from what the agent reads through ctx.neighbors")
        elif diff.startswith("env."):
            layer = diff.split()[0]
            hint = (f"declare how writes to {layer} combine: combine={{'{layer}': 'add'}} if each agent adds to a "
                    f"cell (an integer layer written as usual, a float layer through ctx.deposit), 'min'/'max' if "
                    f"it only lowers/raises cells; with 'set' (the default) a "
                    "cell changed on several processes must be changed to one value, so compute it from "
                    "ctx.neighbors (every agent that affects it) rather than from this process's agents")
        return f"{diff} changes when the agents are split over two processes: {hint}"

    def _split_outcome(self, s: Substep, before: State, parts: list[dict[str, Tensor]], within_reach: bool) -> Outcome:
        calls = []
        for i, mine in enumerate(parts):
            others = parts[1 - i]
            sub = before.clone()
            for name, pop in sub.populations.items():
                pop.keep(mine[name].to(pop[UID].device))
            halos = {}
            for name, fields in s.neighbors.items():
                rest = before[name].select(fields)
                keep = others[name].to(rest[UID].device)
                if within_reach:
                    keep = keep & self._near(s, sub, before[name], keep)
                halos[name] = {k: v[keep] for k, v in rest.items()}
            calls.append((sub, halos))
        # ctx.group_totals adds the other part's contributions: as two processes exchange them, the parts
        # run again with what the other part contributed on the previous pass, until that stops changing
        split = _SplitGroups(before)
        for _ in range(_GROUP_PASSES):
            results = []
            for i, (sub, halos) in enumerate(calls):
                state = sub.clone()
                results.append((state, self.call(s, state, halos, groups=split.part(i))))
            if not split.next_pass():
                break
        return _merged([_outcome(s, sub, eff) for sub, eff in results], s, before)

    def _near(self, s: Substep, part: State, pop: Any, candidates: Tensor) -> Tensor:
        """``[n]`` bool over ``pop``'s rows: within ``s``'s reach of some agent of ``part``."""
        kind, value = resolve_reach(s, self.params)
        space, field = self.space, getattr(self.space, "position_field", None)
        if kind == "global" or field is None or field not in pop:
            return torch.ones(pop.n, dtype=torch.bool, device=pop[UID].device)
        targets = [p[field] for p in part.populations.values() if field in p]
        target = torch.cat(targets) if targets else pop[field][:0]
        if kind in ("cell", "moore") and isinstance(space, Grid):
            occupied = space.occupancy(target.reshape(-1)) > 0
            if kind == "moore" and int(value) > 0:
                occupied = space.neighbor_sum(occupied.reshape(space.shape), "moore", int(value),
                                              include_center=True).reshape(-1) > 0
            return occupied[pop[field]]
        if kind == "length" and isinstance(space, Line):
            return _near_on_line(space, pop[field], target, value)
        if kind == "length" and isinstance(space, Box):
            near = torch.zeros(pop.n, dtype=torch.bool, device=pop[UID].device)
            rows = torch.nonzero(candidates).reshape(-1)
            pos = pop[field].to(torch.float64)
            tgt = target.to(torch.float64)
            for start in range(0, rows.numel(), 256):
                r = rows[start:start + 256]
                if tgt.shape[0]:
                    d = space.distance(pos[r][:, None], tgt[None])
                    near[r] = (d <= value * (1 + 1e-9)).any(1)
            return near
        if kind == "graph" and callable(getattr(space, "edges", None)):
            src, dst = space.edges()
            n = int(space.region_extent[0])
            mark = torch.zeros(n, dtype=torch.bool, device=src.device)
            mark[target.to(src.device)] = True
            reached = mark.clone()
            reached[dst[mark[src]]] = True
            return reached[pop[field].to(src.device)].to(pop[UID].device)
        return torch.ones(pop.n, dtype=torch.bool, device=pop[UID].device)

    # ------------------------------------------------------------------ several ranks
    def _reach_on_ranks(self, s: Substep, before: State, want: Outcome) -> str | None:
        """Spatial partitioner: the call again with every other rank's agents as the halo (a collective)."""
        halos = {name: self.comm.all_gather_rows(before[name].select(fields), include_self=False)
                 for name, fields in s.neighbors.items()}
        again = before.clone()
        diff = _difference(want, _outcome(s, again, self.call(s, again, halos)), env=False,
                           label="with every agent in the halo")
        if diff is None:
            return None
        kind, value = resolve_reach(s, self.params)
        return (f"{diff} changes when this rank sees every other rank's agents instead of those within the declared "
                f"reach {s.reach!r} ({kind} {value:g}): the substep reads agents beyond its declared reach. Declare "
                "a reach that covers every read")

    def _first_problem(self, problem: str | None) -> str | None:
        """The first rank's violation (or None), the same on every rank (one all_gather)."""
        row = torch.zeros(1, _MESSAGE_BYTES, dtype=torch.uint8)
        if problem is not None:
            text = f"[rank {self.comm.rank}] {problem}".encode()[:_MESSAGE_BYTES - 1]
            row[0, :len(text)] = torch.tensor(list(text), dtype=torch.uint8)
            row[0, -1] = 1
        got = self.comm.all_gather_rows({"m": row}, rows_per_rank=1)["m"]
        for r in range(got.shape[0]):
            if int(got[r, -1]):
                return bytes(got[r, :-1].tolist()).rstrip(b"\0").decode(errors="replace")
        return None


def _near_on_line(line: Line, x: Tensor, target: Tensor, reach: float) -> Tensor:
    """``[n]`` bool: which of the positions ``x`` lie within ``reach`` of one of ``target``, either way."""
    if target.numel() == 0:
        return torch.zeros(x.shape[0], dtype=torch.bool, device=x.device)
    t = torch.sort(target.reshape(-1)).values
    at = torch.searchsorted(t, x)
    n = t.shape[0]  # the targets next above and below each position, round the ring when periodic
    up = t[at.clamp(max=n - 1)]
    down = t[(at - 1).clamp(min=0)]
    if line.periodic:
        up = torch.where(at < n, up, t[0])
        down = torch.where(at > 0, down, t[-1])
        gap = torch.minimum(line.ahead(x, up), line.ahead(down, x))
        gap = torch.where((up == x) | (down == x), torch.zeros_like(gap), gap)
    else:
        gap = torch.minimum((up - x).abs(), (x - down).abs())
    return gap.to(torch.float64) <= reach * (1 + 1e-9)


# ---------------------------------------------------------------------- outcomes
class _SplitGroups:
    """``ctx.group_totals`` for the two parts of a split call run one after the other in one process:
    each part's totals add the other part's contributions recorded on the previous pass.
    """

    def __init__(self, whole: State) -> None:
        self.whole = whole  # both parts' agents: group sizes count them all
        self.before: list[list[tuple[Tensor, Tensor]]] = [[], []]
        self.now: list[list[tuple[Tensor, Tensor]]] = [[], []]

    def part(self, i: int) -> _PartGroups:
        """The group sums part ``i`` (0 or 1) sees on this pass."""
        self.now[i] = []
        return _PartGroups(self, i)

    def next_pass(self) -> bool:
        """Keep this pass's contributions for the next; whether they changed (another pass is needed)."""
        changed = any(len(a) != len(b) or any(not (torch.equal(ga, gb) and torch.equal(va, vb))
                                              for (ga, va), (gb, vb) in zip(a, b, strict=False))
                      for a, b in zip(self.before, self.now, strict=True))
        self.before, self.now = self.now, [[], []]
        return changed


class _PartGroups:
    """One part's ``ctx.group_totals`` in a split call (see :class:`_SplitGroups`)."""

    def __init__(self, split: _SplitGroups, part: int) -> None:
        self.split, self.part = split, part

    def index(self, name: str, field: Tensor) -> GroupIndex:
        """The part's own groups and members, with sizes that count both parts' members."""
        index = GroupSums(LocalComm()).index(name, field)
        population, _, key = name.partition(".")
        every, counts = torch.unique(self.split.whole[population][key].to(torch.int64), return_counts=True)
        size = counts.index_select(0, torch.searchsorted(every, index.ids)).to(index.size.device, torch.int32)
        return GroupIndex(index.ids, index.of, size)

    def tables(self, requests: Mapping[str, tuple[Tensor, Tensor, Tensor]]) -> dict[str, Tensor]:
        """:meth:`table` of each field, in order."""
        return {name: self.table(name, *request) for name, request in requests.items()}

    def spread(self, requests: Mapping[str, tuple[Tensor, Tensor, Tensor]],
               only: Tensor | None = None) -> dict[str, Tensor]:
        """Each agent's sum over its groups of the part's totals (:meth:`table`); 0 outside ``only``."""
        check_spread(requests, only)
        out = {}
        for name, (field, rows, values) in requests.items():
            table = self.table(name, field, rows, values)
            sums = self.index(name, field).sums(table, torch.arange(field.shape[0], device=field.device))
            out[name] = sums if only is None else torch.where(only, sums, 0)
        return out

    def weighted(self, requests: Mapping[str, tuple[Tensor, Tensor, Tensor]], weights: Mapping[str, float],
                 only: Tensor | None = None) -> Tensor:
        """The part's :meth:`spread` sums, each times its weight, added in order (``weighted_total``)."""
        check_spread(requests, only)
        scales = check_weights(requests, weights)
        return weighted_total(list(self.spread(requests, only).values()), scales, only)

    def table(self, name: str, field: Tensor, rows: Tensor, values: Tensor) -> Tensor:
        """The part's totals (with the other part's contributions) as a table of its own groups."""
        groups, sums = self.totals(name, field, rows, values)
        index = self.index(name, field)
        out = torch.zeros((index.ids.shape[0] + 1, *sums.shape[1:]), dtype=torch.int64, device=sums.device)
        out.index_copy_(0, index.find(groups), sums)
        return out

    def totals(self, name: str, field: Tensor, rows: Tensor, values: Tensor) -> tuple[Tensor, Tensor]:
        mine, partial = GroupSums(LocalComm()).totals(name, field, rows, values)
        calls = self.split.now[self.part]
        theirs = self.split.before[1 - self.part]
        k = len(calls)
        calls.append((mine, partial))
        if k >= len(theirs):
            return mine, partial
        groups, sums = theirs[k]
        held = torch.isin(groups, field.to(torch.int64))  # the other part's groups with members here
        every = torch.cat([mine, groups[held]])
        merged, where = torch.unique(every, return_inverse=True)
        out = torch.zeros((merged.shape[0], *partial.shape[1:]), dtype=torch.int64, device=partial.device)
        out.index_add_(0, where, torch.cat([partial, sums[held].to(partial.device)]))
        return merged, out


def _outcome(s: Substep, state: State, effects: Effects) -> Outcome:
    """What a call of ``s`` did, independent of row order: written fields by uid, env layers,
    deaths (uids), births (by parent uid) and flags.
    """
    out: Outcome = {}
    for ref in s.writes:
        pop, key = ref.split(".")
        if pop == ENV:
            out[f"env.{key}"] = plain(state.env[key])
            if deposit_layer(state.env[key].dtype, s.env_combine(key)):
                total = effects.deposits.get(key)
                out[f"{_DEPOSITS}env.{key}"] = total if total is not None else torch.zeros(
                    state.env[key].numel(), dtype=torch.int64, device=state.env[key].device)
            continue
        p = state[pop]
        order = torch.argsort(p[UID])
        out[f"{ref}@uid"] = p[UID][order]
        out[ref] = plain(p[key])[order]
    for death in effects.deaths:
        uid = state[death.population][UID]
        out[f"deaths of {death.population}"] = torch.sort(uid[death.dies.to(uid.device)]).values
    for i, birth in enumerate(effects.births):
        order = torch.argsort(birth.parent_uid)
        out[f"births {i} into {birth.population}: parent uid"] = birth.parent_uid[order]
        for key, value in birth.fields.items():
            out[f"births {i} into {birth.population}: {key}"] = plain(value)[order]
    for flag in effects.flags:
        out[f"flag '{flag.message}'"] = flag.condition.reshape(-1).any().reshape(1)
    return out


def _merged(parts: list[Outcome], s: Substep, before: State) -> Outcome:
    """The outcome of the parts together: rows by uid, env changes combined as declared."""
    out: Outcome = {}
    keys = list(dict.fromkeys(k for p in parts for k in p))
    for key in keys:
        values = [p[key] for p in parts if key in p]
        if key.startswith(_DEPOSITS):  # exact sums: the parts' deposits add up (env only: made alike by each)
            out[key] = torch.stack(values).sum(0) if s.touches_agents() else values[0]
        elif key.startswith("env."):
            old = before.env[key[4:]]
            cells = [changed_cells(old, v) for v in values]
            changed = [v.reshape(-1)[c] for v, c in zip(values, cells, strict=True)]
            out[key] = merge_layer(old, torch.cat(cells), torch.cat(changed), s.env_combine(key[4:]))[0]
        elif key.startswith("flag "):
            out[key] = torch.cat(values).any().reshape(1)
        else:
            out[key] = torch.cat(values)
    for key in list(out):  # rows of the parts in uid order
        if key.endswith("@uid"):
            order = torch.argsort(out[key])
            ref = key[:-4]
            out[key], out[ref] = out[key][order], out[ref][order]
        elif key.startswith("deaths of "):
            out[key] = torch.sort(out[key]).values
        elif key.endswith(": parent uid"):
            order = torch.argsort(out[key])
            prefix = key[: -len("parent uid")]
            for k in [k for k in out if k.startswith(prefix)]:
                out[k] = out[k][order]
    return out


def _bits(t: Tensor) -> Tensor:
    t = t.detach()
    if t.dtype.is_floating_point:
        return t.contiguous().view({2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])
    return t


def _difference(want: Outcome, got: Outcome, env: bool = True, label: str = "in the other run") -> str | None:
    """The first difference between two outcomes, in words (None if they are the same bits)."""
    for key in dict.fromkeys([*want, *got]):
        if not env and key.startswith("env."):
            continue
        a, b = want.get(key), got.get(key)
        if a is None or b is None:
            return f"{key} (present in one run only)"
        if a.shape != b.shape:
            return f"{key} ({list(a.shape)[:1]} rows against {list(b.shape)[:1]})"
        x, y = _bits(a).cpu(), _bits(b).cpu()
        if not torch.equal(x, y):
            differ = (x != y).reshape(x.shape[0], -1).any(1) if x.dim() else torch.tensor([True])
            rows = torch.nonzero(differ).reshape(-1)
            if key.startswith(_DEPOSITS):
                cell, unit = int(rows[0]), 2.0 ** -DEPOSIT_FRAC_BITS
                return (f"{key} (cell {cell}: {a[cell].item() * unit:.9g} in the one-process call, "
                        f"{b[cell].item() * unit:.9g} {label})")
            if key.startswith("env."):
                cell = int(rows[0]) if a.dim() <= 1 else int(torch.nonzero((x != y).reshape(-1))[0])
                return (f"{key} (cell {cell}: {a.reshape(-1)[cell].item()} in the one-process call, "
                        f"{b.reshape(-1)[cell].item()} {label})")
            uids = want.get(f"{key}@uid")
            who = f"agents with uid {_few(uids[rows.to(uids.device)])}" if uids is not None else f"rows {_few(rows)}"
            return f"{key} ({who}: {_values(a, rows)} in the one-process call, {_values(b, rows)} {label})"
    return None


def _few(t: Tensor, k: int = 5) -> str:
    values = t.reshape(-1).tolist()
    return ", ".join(map(str, values[:k])) + (f" and {len(values) - k} more" if len(values) > k else "")


def _values(t: Tensor, rows: Tensor) -> str:
    return _few(t.reshape(t.shape[0], -1)[rows.to(t.device)][:, 0] if t.dim() else t.reshape(1), 3)
