"""Sums over groups of agents that may span processes: places whose members live on several ranks.

A *group field* is an integer field of a population whose value names the agent's group: a
household, a school, a workplace (any int >= 0; the agents of one group share the value; a
negative value: the agent is in no group of that field, contributes nothing and gets nothing).
A field of shape ``[n, k]`` gives each agent ``k`` memberships (several fixed groups of contacts,
say): an agent's contribution is added to each of its groups, and a group's size counts its
memberships.
:meth:`Context.group_totals <agentsim.core.context.Context.group_totals>` sums integer values
contributed by some of this rank's agents over each of their groups, adds the contributions of
the same groups' members on every other rank, and returns the totals of the groups this rank's
agents belong to. A model that reads other agents only through such totals needs no halo of
agents at all: the traffic is one row per group that has members on several ranks (a *cut*
group) and a contribution, so a partition that keeps households, schools and workplaces whole
sends almost nothing.

How it runs on ``W`` ranks (every rank calls it: it is a collective step):

- **once per field** (again after the field or its population changed): the ranks share the
  ranges their groups' ids lie in (at most 4096 per rank); each rank sends its groups that lie
  in another rank's ranges to their *owner* rank, ``group % W``; an owner finds the groups held
  by several ranks and tells each holder of such a cut group the other holders. Groups numbered
  by locality, with whole localities per rank, send almost nothing;
- **per call**: one all-reduce of a few integers (whether any rank's field changed, and that
  every rank sums values of the same width); each rank adds its contributions per group
  (``index_add`` of int64: exact) and sends the partial sums of its cut groups to the other
  holders of each, in one all-to-all whose sizes every rank knows; each holder adds what it
  receives (exact, so the order of ranks does not matter). ``ctx.group_tables`` does this for
  several fields with one all-reduce and one all-to-all. ``ctx.group_index`` once built costs
  the all-reduce only, and nothing after a table of the same field in the same substep call
  (when the substep does not write the field, every rank knows that its index is current).

Integers only: a float sum would depend on how the agents are split. Totals are therefore the
same bits on any number of ranks and for any partition of the agents. On one process it is a
per-group sum and nothing travels. :attr:`GroupSums.figures` gives, per field, the share of
the agents whose group is cut and the cut groups per rank (for ``/perf`` and the run summary).

Examples:
    >>> import torch
    >>> from agentsim.core.comm import LocalComm
    >>> sums = GroupSums(LocalComm())
    >>> household = torch.tensor([7, 7, 3, 9])          # agent k lives in household[k]
    >>> rows, values = torch.tensor([0, 1, 2]), torch.tensor([[1], [1], [1]])
    >>> groups, totals = sums.totals("person.household", household, rows, values)
    >>> groups.tolist(), totals.tolist()
    ([3, 7], [[1], [2]])
"""

from __future__ import annotations

import functools
import math
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from agentsim._native import build as native
from agentsim._native import kernels as cpu_kernels
from agentsim.core import ops
from agentsim.core.comm import Comm, post_all_gather
from agentsim.core.ops import expand_ranges, tensor_version
from agentsim.errors import ConfigError, FieldAccessError

__all__ = ["GroupIndex", "GroupSums"]


@dataclass
class _Cut:
    """What one rank knows of a group field's cut groups (built collectively).

    Attributes:
        field: The field tensor it was built from (a weak reference) and its version.
        index: The group index (:class:`GroupIndex`), once asked for.
        cut: ``[c]`` int64 sorted: this rank's groups that have members on other ranks.
        peer_pos: ``[s]`` int64 positions in ``cut`` of the groups shared with each peer rank, peer
            by peer (rank order) and by group id within a peer: what this rank sends, and the
            order of what it receives (each peer lists the same groups in the same order).
        peer_counts: ``[W]`` how many of ``peer_pos`` go to each rank.
        cut_members: This rank's agents whose group is cut.
        members: This rank's agents that have a group.
        peer_numbers: ``[s]`` int64 the numbers in the group index of the groups of ``peer_pos``
            (set as the index is built, on several ranks: what :meth:`GroupSums.table` sends and adds).
        numbering: This rank's groups numbered when the cut was found (``ids``, ``of``), until the
            index takes them.
        pushing: On several ranks, how ``GroupSums.spread`` pushes the groups held here alone
            (:class:`_CutPush`), once asked for; None where it reads tables (``pushing_known``).
        pairs, crossing_pairs: Over the groups this rank owns or holds alone, the pairs of members
            (contacts within a group: ``m (m - 1) / 2``) and those whose members are on two ranks.
    """

    field: Any
    version: int
    index: GroupIndex | None
    cut: Tensor
    peer_pos: Tensor
    peer_counts: list[int]
    cut_members: int
    members: int
    pairs: int = 0
    crossing_pairs: int = 0
    peer_numbers: Tensor | None = None
    numbering: tuple[Tensor, Tensor] | None = None
    pushing: _CutPush | None = None
    pushing_known: bool = False

    def describes(self, field: Tensor) -> bool:
        """Whether it was built from ``field`` as it is now (the same tensor, not modified since)."""
        return self.field() is field and self.version == tensor_version(field)


def _check_push(rows: Tensor, values: Tensor) -> None:
    """``rows`` and ``values`` of a push are ``[m]`` int32 or int64 of one length, else a ValueError."""
    integers = (torch.int32, torch.int64)
    if rows.dim() != 1 or values.shape != rows.shape or rows.dtype not in integers or values.dtype not in integers:
        raise ValueError(f"push: expected rows and values [m] int32 or int64 of one length (got rows {rows.dtype} "
                         f"{list(rows.shape)}, values {values.dtype} {list(values.shape)})")


def _memberships(of: Tensor, groups: int) -> Tensor:
    """``[n]`` int64 how many of the ``groups`` each agent's numbers ``of`` (``[n]`` or ``[n, k]``) name."""
    inside = of < groups
    return inside.sum(1, dtype=torch.int64) if inside.dim() == 2 else inside.to(torch.int64)


def _co_member_lists(of: Tensor, groups: int, memberships: Tensor, member_lists: tuple[Tensor, Tensor] | None = None,
                     counts: Tensor | None = None) -> tuple[Tensor, Tensor] | None:
    """Each agent's group-mates (:attr:`GroupIndex.co_members`) from its group numbers ``of`` (``G``:
    no group), or None where they would be more than ``_PUSH_ENTRIES`` a membership on average,
    off the CPU or without the kernel library. ``member_lists``: ``(start, order)`` where known
    (else made for this and dropped); ``counts``: ``[G]`` each group's memberships in ``of`` where
    known.
    """
    most = _PUSH_ENTRIES * max(int(memberships.sum()), 1)
    with native.one_off_memory():  # large temporaries of sizes not seen again
        lists = member_lists if member_lists is not None else cpu_kernels.group_members(of, groups, counts)
        return None if lists is None else cpu_kernels.co_members(lists[0], lists[1], of.shape[0], most)


class _Pushes:
    """Sums over each agent's groups pushed along co-member lists and kept from call to call, so that
    only the contributions that changed push again (:meth:`GroupIndex.push`'s state; on several
    ranks that of the groups a rank holds alone, :class:`_CutPush`).

    Args:
        lists: ``(indptr [n + 1] int64, indices [e] int32)`` each agent's group-mates.
        memberships: ``[n]`` int64 each agent's memberships (its own value counts once for each).
    """

    def __init__(self, lists: tuple[Tensor, Tensor], memberships: Tensor) -> None:
        self.lists, self.memberships = lists, memberships
        # the last push: its rows and values, the sums, and zeros to add up the changes ([0] until rows come
        # unsorted)
        self._last: tuple[Tensor, Tensor, Tensor, Tensor] | None = None

    def sums(self, rows: Tensor, values: Tensor) -> Tensor | None:
        """The sums for every agent after pushing the changes since the last call (``rows``,
        ``values``: ``[m]`` int32 or int64, checked): the tensor kept for the next call (``[n]``
        int64: read it before the next call, never write it), or None where the kernel did not run.

        Raises:
            IndexError: A row outside ``[0, n)`` (nothing pushed; the kept sums are unchanged).
        """
        n, device = self.memberships.shape[0], self.memberships.device
        rows, values = _own_int64(rows), _own_int64(values)  # kept: the caller's may change before the next push
        if self._last is None:
            empty = torch.zeros(0, dtype=torch.int64, device=device)
            old_rows, old_values, sums, scratch = empty, empty, torch.zeros(n, dtype=torch.int64, device=device), empty
        else:
            old_rows, old_values, sums, scratch = self._last
        done = cpu_kernels.push_changes(*self.lists, old_rows, old_values, rows, values, self.memberships, scratch,
                                        sums)
        if done is None:  # rows not in increasing order: a column to add up each row's changes, kept from now on
            scratch = torch.zeros_like(sums)
            done = cpu_kernels.push_changes(*self.lists, old_rows, old_values, rows, values, self.memberships,
                                            scratch, sums)
        if not done:
            return None
        self._last = (rows, values, sums, scratch)
        return sums


@dataclass
class _CutPush:
    """On several ranks, a field's sums over each agent's groups in two parts: the groups held here
    alone are pushed along co-member lists as on one process (only the changes from call to call),
    and the cut groups' totals, exchanged with their other holders, are added for their members.

    Attributes:
        pushes: The pushes along the co-member lists of the groups held here alone (this rank's
            memberships of cut groups taken out): the sums over those groups.
        position: ``[G + 1]`` int64 each group number's position in ``_Cut.cut``; ``c`` (the cut
            groups' count) for a group that is not cut, and for "no group".
        rows, at: ``[q]`` int64 the memberships of cut groups: the agent's row and its group's position
            in ``_Cut.cut``.
        in_cut: ``[n]`` bool the agents with a membership of a cut group (only their contributions
            go to the cut groups' totals).
    """

    pushes: _Pushes
    position: Tensor
    rows: Tensor
    at: Tensor
    in_cut: Tensor

    @classmethod
    def of(cls, cut: Tensor, index: GroupIndex) -> _CutPush | None:
        """The parts of ``index``'s field whose cut groups are ``cut`` (``[c]`` sorted ids, all of them
        in ``index.ids``), or None where the groups held here alone have no co-member lists.
        """
        groups, c, of = index.ids.shape[0], cut.shape[0], index.of
        if of.device.type != "cpu":  # (no co-member lists off the CPU)
            return None
        position = torch.full((groups + 1,), c, dtype=torch.int64, device=of.device)
        position[index.find(cut)] = torch.arange(c, device=of.device)
        flat = position.index_select(0, of.reshape(-1).to(torch.int64))  # each membership's cut position, or c
        in_cut = flat < c
        alone = of.masked_fill(in_cut.view(of.shape), groups)  # memberships of cut groups: "no group" (dropped below)
        memberships = _memberships(alone, groups)
        lists = _co_member_lists(alone, groups, memberships)
        if lists is None:
            return None
        del alone
        slots = ops.flatnonzero(in_cut)
        per_agent = of.shape[1] if of.dim() == 2 else 1
        agents = in_cut.view(of.shape).any(1) if of.dim() == 2 else in_cut
        return cls(_Pushes(lists, memberships), position, torch.div(slots, per_agent, rounding_mode="floor"),
                   flat.index_select(0, slots), agents)


_PUSH_ENTRIES = 8  # GroupIndex.co_members: at most this many entries per membership on average (else None: tables)
_BLOCK = 1 << 21  # GroupSums.spread reads a table for this many agents at a time (small temporaries)
_SPARSE_SHARE = 4  # GroupIndex.sums maps the nonzero groups first where fewer than 1 in this many are nonzero


class GroupIndex:
    """This rank's groups of one field, numbered ``0 .. G - 1``, with their sizes over every rank and
    their members here (from :meth:`GroupSums.index`, ``ctx.group_index``). The numbers are this
    rank's: use them as indices, never as results (the ids are the same on any number of ranks).

    Attributes:
        ids: ``[G]`` int64 sorted ids of the groups of this rank's agents.
        of: ``[n]`` int32 number of each agent's group (its position in ``ids``); ``G`` for an
            agent in no group, so that a per-group table of ``G + 1`` entries (the last for "none")
            can be read at ``of`` directly. ``[n, k]`` for a field of ``k`` memberships per agent.
        size: ``[G]`` int32 members of each group over every rank (memberships, for a field of
            several per agent).
        start: ``[G + 1]`` int64: the rows of group ``k``'s members here are ``order[start[k]:start[k + 1]]``
            (made at the first use of ``start``, ``order`` or :meth:`members`).
        order: ``[m]`` int32 (int64 beyond 2**31 agents) rows of this rank's members, group by group
            (row order within a group; an agent with several memberships of one group appears once
            for each).
        size_is_local: Whether every member of every group is here (no group is cut), so that
            :attr:`size` also counts the memberships of :attr:`of` (and they are not counted again).
    """

    def __init__(self, ids: Tensor, of: Tensor, size: Tensor, size_is_local: bool = False) -> None:
        self.ids, self.of, self.size, self.size_is_local = ids, of, size, size_is_local

    @property
    def _local_counts(self) -> Tensor | None:
        """``[G]`` each group's memberships here where :attr:`size` is they (else None: count them)."""
        return self.size if self.size_is_local else None

    @property
    def start(self) -> Tensor:
        """``[G + 1]`` int64 where each group's members begin in :attr:`order`."""
        return self._member_lists[0]

    @property
    def order(self) -> Tensor:
        """``[m]`` rows of this rank's members, group by group."""
        return self._member_lists[1]

    @functools.cached_property
    def _member_lists(self) -> tuple[Tensor, Tensor]:
        """``(start, order)``: this rank's members group by group (a stable sort by number: a counting
        sort where the kernel applies).
        """
        counted = cpu_kernels.group_members(self.of, self.ids.shape[0], self._local_counts)
        if counted is not None:
            return counted
        groups, of = self.ids.shape[0], self.of.reshape(-1)
        per_agent = self.of.shape[1] if self.of.dim() == 2 else 1
        counts = torch.bincount(of, minlength=groups + 1)[:groups]
        start = torch.zeros(groups + 1, dtype=torch.int64, device=of.device)
        torch.cumsum(counts, 0, out=start[1:])
        rows_dtype = torch.int32 if self.of.shape[0] < 2**31 else torch.int64
        has = torch.nonzero(of < groups).reshape(-1)
        slots = has.index_select(0, torch.argsort(of.index_select(0, has), stable=True))
        return start, (torch.div(slots, per_agent, rounding_mode="floor") if per_agent > 1 else slots).to(rows_dtype)

    @functools.cached_property
    def co_members(self) -> tuple[Tensor, Tensor] | None:
        """Each agent's group-mates here, for :meth:`push`: ``(indptr [n + 1] int64, indices [e] int32)``,
        row ``i`` the rows of the other memberships of each of ``i``'s groups (``i`` itself where it
        holds two memberships of one group). Made at the first use; None where the lists would hold
        more than ``_PUSH_ENTRIES`` entries per membership on average (large groups: ``m (m - 1)``
        entries each), off the CPU, or without the kernel library.
        """
        # the member lists where they are kept, else made for this and dropped
        return _co_member_lists(self.of, self.ids.shape[0], self.memberships, self.__dict__.get("_member_lists"),
                                self._local_counts)

    @functools.cached_property
    def memberships(self) -> Tensor:
        """``[n]`` int64 how many groups each agent is in (memberships: 0 or 1 for an ``[n]`` field)."""
        return _memberships(self.of, self.ids.shape[0])

    @functools.cached_property
    def _pushes(self) -> _Pushes | None:
        """The kept state of :meth:`push` (None without co-member lists)."""
        lists = self.co_members
        return None if lists is None else _Pushes(lists, self.memberships)

    def push(self, rows: Tensor, values: Tensor, only: Tensor | None = None) -> Tensor | None:
        """Each agent's sum over its groups of the values of the groups' members ``rows`` here, by
        pushing values along the agents' :attr:`co_members` (no per-group table): the same as
        ``sums`` of a table of those values for every agent. Only groups with no members on another
        rank give their totals so (``GroupSums.spread`` uses it on one process; on several it pushes
        the groups each rank holds alone the same way).

        The sums of the last push are kept, and only the agents whose value changed since (their
        change: new minus old) push again, so the work follows the changes, not the contributors:
        a value that stays the same from one call to the next costs nothing to spread. The kept
        sums take ``n`` int64 (and ``n`` more for the changes once rows come in another order than
        increasing); the results are exact integers, the same as a push from zeros.

        Args:
            rows: ``[m]`` int64 or int32 contributing rows (repeats add again).
            values: ``[m]`` int64.
            only: ``[n]`` bool, the agents whose sums are wanted (the others get 0), or None.

        Returns:
            ``[n]`` int64 (a new tensor), or None where there are no co-member lists (see
            :attr:`co_members`).

        Raises:
            IndexError: A row outside ``[0, n)`` (nothing pushed; the kept sums are unchanged).
            ValueError: ``rows`` or ``values`` not ``[m]`` integers of one length, or ``only`` not
                ``[n]`` bool.
        """
        n = self.of.shape[0]
        if only is not None and (only.dtype != torch.bool or only.shape != (n,)):
            raise ValueError(f"push: expected only = None or [{n}] bool (one per agent), got {only.dtype} "
                             f"{list(only.shape)}")
        sums = self._pushed_sums(rows, values)
        if sums is None:
            return None
        out = torch.empty_like(sums)
        return out.copy_(sums) if only is None else cpu_kernels.keep_only(out, only, sums)

    def _pushed_sums(self, rows: Tensor, values: Tensor) -> Tensor | None:
        """:meth:`push`'s sums for every agent, the tensor kept for the next push (``[n]`` int64: read
        it before the next push, never write it; ``GroupSums.weighted``), or None where there are no
        co-member lists. Raises as :meth:`push`.
        """
        _check_push(rows, values)
        pushes = self._pushes
        return None if pushes is None else pushes.sums(rows, values)

    def find(self, groups: Tensor) -> Tensor:
        """``[g]`` int64 numbers of the group ids ``groups`` (each one of :attr:`ids`)."""
        return torch.searchsorted(self.ids, groups.to(torch.int64))

    def members(self, numbers: Tensor) -> tuple[Tensor, Tensor]:
        """This rank's members of the groups ``numbers`` (``[g]`` int64): ``(rows [m], which [m])``,
        ``which[j]`` the position in ``numbers`` of row ``rows[j]``'s group; group by group.
        """
        first = self.start.index_select(0, numbers)
        slot, which = expand_ranges(first, self.start.index_select(0, numbers + 1) - first)
        return self.order.index_select(0, slot).to(torch.int64), which

    def local_members(self, numbers: Tensor) -> int:
        """How many of this rank's agents the groups ``numbers`` have (the length of :meth:`members`)."""
        return int((self.start.index_select(0, numbers + 1) - self.start.index_select(0, numbers)).sum())

    def sums(self, table: Tensor, rows: Tensor, nonzero: Tensor | None = None) -> Tensor:
        """Each agent's sum of a per-group table over its groups, exact: ``table[of[r]]`` for each
        row ``r`` of ``rows``, added over the ``k`` memberships of a field of several per agent.

        Where few groups have a nonzero entry (a table of the infectious, early or late in an
        epidemic), the memberships are first looked up in a map of those groups (one byte a group,
        small enough to stay in the CPU's cache), and only their entries are read and added.

        Args:
            table: ``[G + 1]`` int64 per-group values, the last (agents in no group) 0, e.g. a
                ``ctx.group_table`` of this field.
            rows: ``[m]`` int64 or int32 rows of agents here.
            nonzero: ``table != 0`` (``[G + 1]`` bool), from a caller that reads one table for
                several batches of rows and maps it once; None: mapped here.

        Returns:
            ``[m]`` int64.

        Raises:
            ValueError: A table that is not ``[G + 1]`` int64, or a map of another shape.

        Examples:
            >>> index = GroupIndex(torch.tensor([3, 7]), torch.tensor([[0, 1], [1, 2], [0, 0]], dtype=torch.int32),
            ...                    torch.tensor([3, 2], dtype=torch.int32))
            >>> index.sums(torch.tensor([10, 1, 0]), torch.tensor([0, 1, 2])).tolist()
            [11, 1, 20]
        """
        groups = self.ids.shape[0]
        if table.shape != (groups + 1,) or table.dtype != torch.int64:
            raise ValueError(f"GroupIndex.sums: expected a table [{groups + 1}] int64 (one entry per group and one "
                             f"for no group), got {table.dtype} {list(table.shape)}")
        mine = self.of.index_select(0, rows.to(torch.int64))  # [m] or [m, k] int32
        if mine.dim() == 1:
            return table.index_select(0, mine)
        flat = mine.reshape(-1)
        if nonzero is None:
            nonzero = table != 0
        elif nonzero.shape != table.shape or nonzero.dtype != torch.bool:
            raise ValueError(f"GroupIndex.sums: expected nonzero = table != 0, [{groups + 1}] bool, got "
                             f"{nonzero.dtype} {list(nonzero.shape)}")
        if int(torch.count_nonzero(nonzero)) * _SPARSE_SHARE > groups:  # many nonzero: read every entry
            return table.index_select(0, flat).view(mine.shape).sum(1, dtype=torch.int64)
        hit = ops.flatnonzero(nonzero.index_select(0, flat))  # the memberships of nonzero groups, in order
        total = torch.zeros(mine.shape[0], dtype=torch.int64, device=table.device)
        return total.index_add_(0, torch.div(hit, mine.shape[1], rounding_mode="floor"),
                                table.index_select(0, flat.index_select(0, hit)))


def check_spread(requests: Mapping[str, tuple[Tensor, Tensor, Tensor]], only: Tensor | None) -> None:
    """The values of a ``group_sums`` call (``name: (field, rows, values)``) are ``[m]`` and ``only``
    is None or ``[n]`` bool for each field's ``n`` agents, else a ConfigError.
    """
    for name, (field, _, values) in requests.items():
        if values.dim() != 1:
            raise ConfigError(f"group_sums({name!r}): expected values [m] (one integer per contributing row), "
                              f"got {list(values.shape)}")
        if only is not None and (only.dtype != torch.bool or only.shape != field.shape[:1]):
            raise ConfigError(f"group_sums({name!r}): expected only = None or [{field.shape[0]}] bool (one per "
                              f"agent of the field's population), got {only.dtype} {list(only.shape)}")


def check_weights(requests: Mapping[str, tuple[Tensor, Tensor, Tensor]], weights: Mapping[str, float]) -> list[float]:
    """The weights of a ``weighted_group_sums`` call in the order of ``requests``: one finite float
    per field, else a ConfigError.
    """
    if set(weights) != set(requests) or not requests:
        raise ConfigError(f"weighted_group_sums: expected one weight per field, at least one field (fields "
                          f"{sorted(requests)}, weights for {sorted(weights)})")
    scales = [float(weights[name]) for name in requests]
    if not all(math.isfinite(w) for w in scales):
        raise ConfigError(f"weighted_group_sums: weights must be finite (got {dict(weights)})")
    return scales


def weighted_total(sums: Sequence[Tensor], weights: Sequence[float], only: Tensor | None) -> Tensor:
    """``[n]`` float64 ``sum_c float64(sums[c]) * weights[c]``, added in order from 0.0 (each product
    and addition rounded in float64), 0.0 where ``only`` is False: one pass where the kernel applies.
    """
    fused = cpu_kernels.scaled_total(list(sums), list(weights), only)
    if fused is not None:
        return fused
    out = torch.zeros(sums[0].shape[0], dtype=torch.float64, device=sums[0].device)
    for x, w in zip(sums, weights, strict=True):
        out += x.to(torch.float64) * w
    return out if only is None else out.masked_fill_(~only, 0.0)


def _local_table(index: GroupIndex, field: Tensor, rows: Tensor, flat: Tensor) -> Tensor:
    """``[G + 1, k]`` int64 the sums of this rank's contributions (``flat`` ``[m, k]`` int64 at
    ``rows``) per group of ``index``, the last row (no group) 0: a table before the cut groups'
    rows from other ranks are added.
    """
    groups, width = index.ids.shape[0], flat.shape[1]
    number = index.of.index_select(0, rows).reshape(-1)  # G: in no group (row zeroed below)
    flat = _per_membership(field, flat)
    if width == 1:
        sums = torch.zeros((groups + 1, 1), dtype=torch.int64, device=flat.device)
        sums.view(-1).index_add_(0, number, flat.view(-1))
    else:  # column by column (torch's index_add_ of [m, k] rows is about 10x slower on the CPU)
        columns = torch.zeros((width, groups + 1), dtype=torch.int64, device=flat.device)
        for j in range(width):
            columns[j].index_add_(0, number, flat[:, j].contiguous())
        sums = columns.t().contiguous()
    sums[groups] = 0  # what agents in no group added
    return sums


def _read_table(index: GroupIndex, table: Tensor, only: Tensor | None) -> Tensor:
    """``[n]`` int64 each agent's sum of ``table`` (``[G + 1]`` int64) over its groups, 0 outside
    ``only`` (the agents outside it read nothing), a block of agents at a time.
    """
    n = index.of.shape[0]
    wanted = torch.arange(n, device=table.device) if only is None else ops.flatnonzero(only)
    nonzero = table != 0
    sums = torch.cat([index.sums(table, wanted[first:first + _BLOCK], nonzero)
                      for first in range(0, wanted.shape[0], _BLOCK)]) if wanted.shape[0] else table[:0]
    return sums if only is None else torch.zeros(n, dtype=torch.int64, device=table.device).index_copy_(
        0, wanted, sums)


@dataclass
class _Spread:
    """One field's sums over each agent's groups on several ranks (``GroupSums._across_fields``),
    after the exchange: either the kept sums of the groups held here alone (``kept``, pushed along
    ``pushing.pushes``; never written but by :meth:`add_cut_totals`) and the cut groups' totals
    (``cut_totals`` ``[c]``), or a table of every group (``table`` ``[G + 1, 1]``).
    """

    index: GroupIndex
    table: Tensor | None
    kept: Tensor | None
    pushing: _CutPush | None
    cut_totals: Tensor | None

    def sums(self, only: Tensor | None) -> Tensor:
        """``[n]`` int64 (a new tensor) each agent's sum, 0 outside ``only``."""
        if self.kept is None:
            assert self.table is not None
            return _read_table(self.index, self.table.view(-1), only)
        out = self.kept.clone()
        self.add_cut_totals(out=out)
        return out if only is None else out.masked_fill_(~only, 0)

    def add_cut_totals(self, extra: Tensor | None = None, out: Tensor | None = None) -> Tensor:
        """Add to ``out`` (the kept sums by default) each membership's cut group total, or ``extra``
        (``[q]`` int64, e.g. the negated totals, to take them out again: exact); return what was added.
        """
        assert self.pushing is not None and self.cut_totals is not None and self.kept is not None
        added = self.cut_totals.index_select(0, self.pushing.at) if extra is None else extra
        (self.kept if out is None else out).index_add_(0, self.pushing.rows, added)
        return added


@dataclass
class _CutsCheck:
    """A posted check of several group fields' cuts (``GroupSums._post_cuts_check``): the fields, the
    values' widths, the cuts this rank knew and whether its field is unchanged since (``fresh``),
    and the exchange in flight (every rank's flags and widths, ``[W * 3m]`` int64 as bytes).
    """

    names: list[str]
    fields: list[Tensor]
    widths: list[int]
    known: list[_Cut | None]
    fresh: list[bool]
    got: Tensor
    work: Any

    def ready(self) -> dict[int, tuple[_Cut, GroupIndex]]:
        """The fields (by position) whose cut and index this rank knows, its field unchanged: their
        local work may start before the check ends (it is kept if no rank's field changed).
        """
        out = {}
        for j, (cut, fresh) in enumerate(zip(self.known, self.fresh, strict=True)):
            if cut is not None and fresh and cut.index is not None:
                out[j] = (cut, cut.index)
        return out


def _spread_part(cut: _Cut, index: GroupIndex, field: Tensor, rows: Tensor,
                 flat: Tensor) -> tuple[_Spread, tuple[_Cut, Tensor, Tensor]]:
    """One field's local part of ``GroupSums._across_fields``: the sums pushed over the groups held
    here alone and this rank's contributions to its cut groups, or its table where there are no
    co-member lists; with what it sends to the cut groups' other holders (``(cut, rows, at)`` for
    ``GroupSums._add_peer_rows``). ``flat``: ``[m]`` int64 the values at ``rows``.
    """
    if not cut.pushing_known:
        cut.pushing, cut.pushing_known = _CutPush.of(cut.cut, index), True
    kept = cut.pushing.pushes.sums(rows, flat) if cut.pushing is not None else None
    if cut.pushing is not None and kept is not None:
        # this rank's contributions to its cut groups ([c + 1]: the last collects the other
        # memberships of the contributors that have one in a cut group)
        some = ops.flatnonzero(cut.pushing.in_cut.index_select(0, rows))
        numbers = index.of.index_select(0, rows.index_select(0, some)).reshape(-1).to(torch.int64)
        at = cut.pushing.position.index_select(0, numbers)
        totals = torch.zeros(cut.cut.shape[0] + 1, dtype=torch.int64, device=flat.device)
        totals.index_add_(0, at, _per_membership(field, flat.index_select(0, some)))
        cut_totals = totals[:-1]
        return _Spread(index, None, kept, cut.pushing, cut_totals), (cut, cut_totals.view(-1, 1), cut.peer_pos)
    table = _local_table(index, field, rows, flat.view(-1, 1))
    assert cut.peer_numbers is not None  # (set as the index was built)
    return _Spread(index, table, None, None, None), (cut, table, cut.peer_numbers)


def _own_int64(x: Tensor) -> Tensor:
    """``x`` as int64 in a tensor of its own: one copy, whether or not ``x`` was int64 already."""
    wide = x.to(torch.int64)
    return wide if wide is not x else x.clone()


def _per_membership(field: Tensor, values: Tensor) -> Tensor:
    """``values`` (``[m, w]``, one row per contributing agent) repeated for each of the agent's
    memberships of a field of several per agent (``[n, k]``: ``[m * k, w]``, agent by agent).
    """
    return values.repeat_interleave(field.shape[1], 0) if field.dim() == 2 else values


def _lexorder(major: Tensor, minor: Tensor) -> Tensor:
    """``[m]`` int64 the order of ``major`` and ``minor`` (``[m]`` int64) by ``major``, then ``minor``
    (two stable sorts: no products that overflow).
    """
    order = torch.argsort(minor, stable=True)
    return order.index_select(0, torch.argsort(major.index_select(0, order), stable=True))


def _number(field: Tensor) -> tuple[Tensor, Tensor]:
    """The groups of ``field`` (``[n]`` or ``[n, k]`` integers, negative: no group) numbered
    ``0 .. G - 1``: ``(ids [G] int64 sorted, of int32 shaped as field)``, ``of`` ``G`` for no group.
    Ids in a range of fewer than ``128 max(n, 2**16)`` from the smallest id >= 0 are numbered
    through a bitmap of the range where the kernel applies (a contiguous CPU int32 or int64
    field); otherwise ranges of fewer than ``16 max(n, 2**16)`` are counted a window at a time,
    and sparser ids sorted.
    """
    if field.dim() == 2:
        if field.numel() >= 2**31:
            raise ConfigError(f"group field: {field.shape[0]} agents of {field.shape[1]} groups each on one process "
                              f"({field.numel()} memberships); at most 2**31 - 1 memberships (numbers are int32)")
        ids, of = _number(field.reshape(-1))
        return ids, of.view(field.shape)
    n = field.shape[0]
    if n >= 2**31:
        raise ConfigError(f"group field: {n} agents on one process; at most 2**31 - 1 (numbers are int32)")
    top = int(field.max()) if n else -1
    lo = int(field.min()) if n else 0
    if lo < 0 <= top:  # the smallest id, agents in no group aside (a later process's ids are far from 0)
        lo = _smallest_id(field, top)
    # a bitmap of the ids (2 bits per id of the range: at most 32 bytes an agent, up to about 1.2
    # times a sort's temporaries), else a count of the ids a window of n at a time
    numbered = cpu_kernels.number_ids(field, lo, top) if 0 <= top and top - lo < _BITMAP_SPAN * max(
        n, _MIN_WINDOW) else None
    if numbered is not None:
        return numbered
    if 0 <= top and top - lo < _COUNTING_WINDOWS * max(n, _MIN_WINDOW):
        return _number_by_counting(field, lo, top)
    return _number_by_sorting(field)


def _smallest_id(field: Tensor, top: int) -> int:
    """The smallest id >= 0 of ``field`` (``[n]`` integers, some negative; ``top`` its largest)."""
    if field.device.type == "cpu":  # negative ids are the largest as unsigned integers (no masked copy)
        a = field.numpy()
        return int(a.view(np.uint64 if a.dtype == np.int64 else np.uint32).min())
    return int(field.masked_fill(field < 0, top).min())


_MAX_RANGES = 1 << 12  # id ranges a rank describes its groups by when it looks for cut groups


def _id_ranges(ids: Tensor, most: int) -> dict[str, Tensor]:
    """At most ``most`` ranges ``[lo, hi]`` (inclusive) that cover the sorted distinct ``ids``
    (``[h]`` int64): the runs of consecutive ids, joined across the narrowest gaps where there are
    more runs than ``most``. Place ids numbered place by place within localities give a few
    runs per locality a rank holds.

    Returns:
        ``{"lo": [r] int64, "hi": [r] int64}``, ``r <= most``.
    """
    if ids.numel() == 0:
        return {"lo": ids[:0], "hi": ids[:0]}
    gaps = ids[1:] - ids[:-1]
    breaks = torch.nonzero(gaps > 1).reshape(-1)  # a run ends at ids[b] and the next starts at ids[b + 1]
    if breaks.numel() > most - 1:  # keep the widest gaps (ties: the first ones), join across the others
        widest = torch.argsort(gaps.index_select(0, breaks), descending=True, stable=True)[:most - 1]
        breaks = torch.sort(breaks.index_select(0, widest)).values
    lo = torch.cat([ids[:1], ids.index_select(0, breaks + 1)])
    hi = torch.cat([ids.index_select(0, breaks), ids[-1:]])
    return {"lo": lo, "hi": hi}


def _inside(ids: Tensor, ranges: dict[str, Tensor]) -> Tensor:
    """``[h]`` bool: which ``ids`` lie in one of ``ranges`` (``{"lo": [r], "hi": [r]}``, inclusive,
    possibly overlapping, any order).
    """
    if ranges["lo"].numel() == 0:
        return torch.zeros(ids.shape, dtype=torch.bool, device=ids.device)
    order = torch.argsort(ranges["lo"], stable=True)
    lo = ranges["lo"].index_select(0, order)
    reach = torch.cummax(ranges["hi"].index_select(0, order), 0).values  # the furthest hi of the ranges so far
    last = torch.searchsorted(lo, ids, right=True) - 1  # the last range that starts at or before each id
    return (last >= 0) & (reach.index_select(0, last.clamp(min=0)) >= ids)


def _sorted_member(values: Tensor, sorted_set: Tensor) -> Tensor:
    """``[n]`` bool: which ``values`` are in the sorted 1-D ``sorted_set``."""
    if sorted_set.numel() == 0:
        return torch.zeros(values.shape, dtype=torch.bool, device=values.device)
    at = torch.searchsorted(sorted_set, values).clamp_(max=sorted_set.numel() - 1)
    return sorted_set.index_select(0, at) == values


_MIN_WINDOW = 1 << 16  # ids numbered per counting pass at least
_COUNTING_WINDOWS = 16  # most passes of a numbering by counting (sparser ids are sorted)
_BITMAP_SPAN = 128  # the widest range of ids numbered through a bitmap, per agent (sparser ids are sorted)


def _number_by_counting(field: Tensor, lo: int, top: int) -> tuple[Tensor, Tensor]:
    """``(ids, of)`` of a field whose ids are in ``[lo, top]`` (< 0: no group), without a sort: a
    window of ``n`` ids at a time, each id present marked in a table of the window and numbered
    by a running count. Temporaries: about 5 bytes per agent (the window's tables) and the rows
    of the agents in the window; one window when every id is within ``n`` of ``lo``.
    """
    n = field.shape[0]
    index = field if field.dtype in (torch.int32, torch.int64) else field.to(torch.int64)
    window = max(n, _MIN_WINDOW)
    every = n == 0 or int(field.min()) >= 0  # every agent in a group
    of = index.new_empty(n, dtype=torch.int32)
    found: list[Tensor] = []
    groups = 0
    for first in range(lo, top + 1, window):
        hi = min(first + window, top + 1)
        rows = None if every and first == lo and hi == top + 1 else ops.flatnonzero(_within(index, first, hi))
        local = index if rows is None else index.index_select(0, rows)
        if first:
            local = local - first
        held = torch.zeros(hi - first, dtype=torch.bool, device=field.device)
        held[local] = True
        number = torch.cumsum(held, 0, dtype=torch.int32)
        number += groups - 1
        if rows is None:
            torch.index_select(number, 0, local, out=of)
        else:
            of.index_copy_(0, rows, number.index_select(0, local))
        del number, local, rows
        found.append(ops.flatnonzero(held))
        if first:
            found[-1] += first
        groups += int(found[-1].shape[0])
        del held
    if not every:  # the agents in no group: number G
        of.masked_fill_(field < 0, groups)
    ids = found[0] if len(found) == 1 else torch.cat(found) if found else index.new_zeros(0, dtype=torch.int64)
    return ids.to(torch.int64), of


def _within(index: Tensor, lo: int, hi: int) -> Tensor:
    """``[n]`` bool: ``lo <= index < hi`` (through NumPy on the CPU, see :func:`agentsim.core.ops.equal`)."""
    if index.device.type == "cpu":
        a = index.numpy()
        return torch.from_numpy((a >= lo) & (a < hi))
    return (index >= lo) & (index < hi)


def _number_by_sorting(field: Tensor) -> tuple[Tensor, Tensor]:
    """``(ids, of)`` of a field with sparse ids: the members' ids sorted in their own width."""
    n = field.shape[0]
    grouped = field >= 0
    members = None if bool(grouped.all()) else ops.flatnonzero(grouped)
    values = field if members is None else field.index_select(0, members)
    if values.dtype not in (torch.int32, torch.int64):
        values = values.to(torch.int64)
    ids, number = torch.unique(values, return_inverse=True)
    if members is None:
        of = number.to(torch.int32)
    else:  # the agents in no group: number G
        of = torch.full((n,), ids.shape[0], dtype=torch.int32, device=field.device)
        of.index_copy_(0, members, number.to(torch.int32))
    return ids.to(torch.int64), of

class GroupSums:
    """Per-group integer sums over the ranks of a run, with the cut groups of each field cached.

    Args:
        comm: The run's collectives (:class:`~agentsim.core.comm.LocalComm` on one process).
    """

    def __init__(self, comm: Comm) -> None:
        self.comm = comm
        self._cuts: dict[str, _Cut] = {}

    @property
    def figures(self) -> dict[str, dict[str, int]]:
        """Per group field (``"person.household"``), on this rank: ``members`` (agents in a group;
        memberships, for a field of several groups per agent),
        ``cut_members`` (agents whose group has members on another rank), ``cut_groups`` (groups
        shared with another rank: the ghost places), and over the groups it owns or holds alone ``pairs``
        (pairs of members: the contacts a group stands for) and ``crossing_pairs`` (those split over
        ranks); each group is counted on one rank.
        """
        return {name: {"members": c.members, "cut_members": c.cut_members, "cut_groups": int(c.cut.numel()),
                       "pairs": c.pairs, "crossing_pairs": c.crossing_pairs}
                for name, c in sorted(self._cuts.items())}

    def totals(self, name: str, field: Tensor, rows: Tensor, values: Tensor) -> tuple[Tensor, Tensor]:
        """Sums of ``values`` per group over every rank, for this rank's groups that got any.

        Args:
            name: The field's reference, ``"population.field"`` (the cache key).
            field: ``[n]`` integer group of each of this rank's agents (< 0: none), or ``[n, k]``: the
                ``k`` groups of each (a contribution is added to each of them).
            rows: ``[m]`` int64 or int32 the agents that contribute (rows of ``field``; repeats allowed).
            values: ``[m]`` or ``[m, k]`` integer contribution of each (summed as int64).

        Returns:
            ``(groups, totals)``: ``[g]`` int64 sorted group ids, every group of this rank's
            agents that a contribution reached from any rank, and ``[g]`` or ``[g, k]`` int64
            their totals over all ranks. The same for any number of ranks.

        Raises:
            ConfigError: float or bool ``values``, or shapes that do not fit.
        """
        flat = self._check_values("group_totals", name, field, rows, values)
        of = field.index_select(0, rows).to(torch.int64).reshape(-1)
        flat = _per_membership(field, flat)
        if of.numel() and int(of.min()) < 0:  # agents in no group contribute nothing
            some = torch.nonzero(of >= 0).reshape(-1)
            of, flat = of.index_select(0, some), flat.index_select(0, some)
        groups, where = torch.unique(of, return_inverse=True)
        partial = torch.zeros((groups.shape[0], flat.shape[1]), dtype=torch.int64, device=flat.device)
        partial.index_add_(0, where, flat)
        if self.comm.world_size > 1:
            groups, partial = self._across(self._cut(name, field, width=partial.shape[1]), groups, partial)
        else:
            self._local(name, field)  # known (its figures: nothing cut)
        return groups, partial.reshape((groups.shape[0], *values.shape[1:]))

    def table(self, name: str, field: Tensor, rows: Tensor, values: Tensor) -> Tensor:
        """Sums of ``values`` per group over every rank, for every group of this rank's agents, in
        the numbering of :meth:`index` (row ``g``: the group ``index.ids[g]``; 0 where nothing was
        added), and a last row of zeros for "no group", so that ``table[index.of]`` reads every
        agent's group. No sort: the contributions are added at their group's number; the cut
        groups' rows travel as in :meth:`totals`.

        Args:
            name, field, rows, values: As for :meth:`totals`.

        Returns:
            ``[G + 1]`` or ``[G + 1, k]`` int64 (``values``' trailing shape), ``G`` this rank's groups.

        Raises:
            ConfigError: float or bool ``values``, or shapes that do not fit.

        Examples:
            >>> import torch
            >>> from agentsim.core.comm import LocalComm
            >>> sums = GroupSums(LocalComm())
            >>> household = torch.tensor([7, 7, 3, 9])
            >>> sums.table("person.household", household, torch.tensor([0, 1, 3]), torch.tensor([1, 1, 5])).tolist()
            [0, 2, 5, 0]
        """
        return self.tables({name: (field, rows, values)})[name]

    def tables(self, requests: Mapping[str, tuple[Tensor, Tensor, Tensor]]) -> dict[str, Tensor]:
        """:meth:`table` of several fields at once (``name: (field, rows, values)``, in the same
        order on every rank): one check that the fields are current, and one all-to-all for all
        of them, instead of one of each per field.

        Returns:
            ``name`` to its table, as :meth:`table` gives it.

        Raises:
            ConfigError: As :meth:`table`, naming the field.
        """
        names = list(requests)
        if not names:
            return {}
        flats = [self._check_values("group_table", name, *requests[name]) for name in names]
        fields = [requests[name][0] for name in names]
        early: dict[int, tuple[_Cut, Tensor]] = {}  # tables made while the check travels, with their cut
        if self.comm.world_size > 1:
            check = self._post_cuts_check(names, fields, [flat.shape[1] for flat in flats])
            for j, (cut, index) in check.ready().items():
                early[j] = (cut, _local_table(index, fields[j], requests[names[j]][1], flats[j]))
            cuts = self._finish_cuts_check(check)
        else:
            cuts = [self._local(name, field) for name, field in zip(names, fields, strict=True)]
        out: dict[str, Tensor] = {}
        peers: list[tuple[_Cut, Tensor, Tensor]] = []
        for j, (name, field, cut, flat) in enumerate(zip(names, fields, cuts, flats, strict=True)):
            index = self._index_of(cut, field)
            made = early.get(j)
            sums = made[1] if made is not None and made[0] is cut else _local_table(index, field, requests[name][1],
                                                                                    flat)
            if self.comm.world_size > 1:
                assert cut.peer_numbers is not None  # (set as the index was built)
                peers.append((cut, sums, cut.peer_numbers))
            out[name] = sums.reshape((sums.shape[0], *requests[name][2].shape[1:]))
        if peers:
            self._add_peer_rows(peers)
        return out

    def spread(self, requests: Mapping[str, tuple[Tensor, Tensor, Tensor]],
               only: Tensor | None = None) -> dict[str, Tensor]:
        """Each agent's sum over its groups of the groups' totals over every rank (``name: (field,
        rows, values)``, ``values`` ``[m]``, in the same order on every rank): what ``sums`` of the
        field's :meth:`table` gives for every agent, exact and the same on any number of ranks.

        Each value is pushed to its agent's group-mates (:meth:`GroupIndex.push`: from the second
        call on only the values that changed push, so the work is in proportion to the changes
        times their groups' sizes; no table of every group), where the field's groups are small
        enough for co-member lists (and the field is on the CPU, with the kernel library);
        otherwise the table is made and the wanted agents read their groups' entries. On several
        processes the groups held by one rank alone are pushed so, and the cut groups' totals
        (exchanged as for :meth:`tables`, in one all-to-all for every field) are added for their
        members: the same integers.

        Args:
            requests: ``name: (field, rows, values)``.
            only: ``[n]`` bool, the agents whose sums are wanted (the others get 0; on the tables'
                path only they read their groups), or None for every agent.

        Returns:
            ``name`` to ``[n]`` int64.

        Raises:
            ConfigError: As :meth:`table`, ``values`` that are not ``[m]``, or ``only`` not ``[n]`` bool.
        """
        check_spread(requests, only)
        if not requests:
            return {}
        if self.comm.world_size > 1:
            parts = self._across_fields("group_sums", requests)
            return {name: part.sums(only) for name, part in zip(requests, parts, strict=True)}
        out: dict[str, Tensor] = {}
        tabled: dict[str, tuple[Tensor, Tensor, Tensor]] = {}
        for name, (field, rows, values) in requests.items():
            flat = self._check_values("group_sums", name, field, rows, values).view(-1)
            pushed = self._index_of(self._local(name, field), field).push(rows, flat, only)
            if pushed is None:
                tabled[name] = (field, rows, values)
            else:
                out[name] = pushed
        for name, table in self.tables(tabled).items():
            out[name] = _read_table(self._index_of(self._cuts[name], tabled[name][0]), table.view(-1), only)
        return {name: out[name] for name in requests}

    def _across_fields(self, what: str, requests: Mapping[str, tuple[Tensor, Tensor, Tensor]]) -> list[_Spread]:
        """Several ranks: each field's sums over each agent's groups (:meth:`spread`, values ``[m]``),
        in the order of ``requests``: pushed for the groups held here alone, with the cut groups'
        totals to add, or a table where there are no co-member lists (a rank's choice: both send
        the same rows, each cut group's partial sum here, in one all-to-all). ``what``: the call,
        for errors.
        """
        names = list(requests)
        flats = [self._check_values(what, name, *requests[name]).view(-1) for name in names]
        fields = [requests[name][0] for name in names]
        check = self._post_cuts_check(names, fields, [1] * len(names))
        early = {j: (cut, _spread_part(cut, index, fields[j], requests[names[j]][1], flats[j]))
                 for j, (cut, index) in check.ready().items()}  # made while the check travels
        cuts = self._finish_cuts_check(check)
        parts: list[_Spread] = []
        peers: list[tuple[_Cut, Tensor, Tensor]] = []
        for j, (name, field, cut, flat) in enumerate(zip(names, fields, cuts, flats, strict=True)):
            made = early.get(j)
            part, peer = made[1] if made is not None and made[0] is cut else _spread_part(
                cut, self._index_of(cut, field), field, requests[name][1], flat)
            parts.append(part)
            peers.append(peer)
        self._add_peer_rows(peers)
        return parts

    def weighted(self, requests: Mapping[str, tuple[Tensor, Tensor, Tensor]], weights: Mapping[str, float],
                 only: Tensor | None = None) -> Tensor:
        """Each agent's :meth:`spread` sums of several fields, each times its weight, added in the
        order of ``requests``: ``[n]`` float64 (0.0 outside ``only``), the bits of
        :func:`weighted_total` of the spread sums on any number of ranks. Where every field is pushed,
        the kept sums are read directly: no ``[n]`` int64 copy per field (on several ranks the cut
        groups' totals are added to them for the call, and taken out again).

        Raises:
            ConfigError: As :meth:`spread`, or weights that are not one finite float per field.
        """
        check_spread(requests, only)
        scales = check_weights(requests, weights)
        if self.comm.world_size > 1:
            parts = self._across_fields("weighted_group_sums", requests)
            if all(part.kept is not None for part in parts):  # the kept sums, the cut groups' totals added for now
                added: list[Tensor] = []
                try:
                    for part in parts:
                        added.append(part.add_cut_totals())
                    return weighted_total([part.kept for part in parts if part.kept is not None], scales, only)
                finally:
                    for part, extra in zip(parts, added, strict=False):  # (those added: all unless one failed)
                        part.add_cut_totals(extra.neg())  # (exact: the kept sums as they were)
            return weighted_total([part.sums(None) for part in parts], scales, only)
        kept = []
        for name, (field, rows, values) in requests.items():
            flat = self._check_values("weighted_group_sums", name, field, rows, values).view(-1)
            index = self._index_of(self._local(name, field), field)
            sums = index._pushed_sums(rows, flat)  # noqa: SLF001 (the kept tensor, read below before any push)
            if sums is None:
                break
            kept.append(sums)
        else:
            if kept:
                return weighted_total(kept, scales, only)
        return weighted_total(list(self.spread(requests, only).values()), scales, only)

    def current_index(self, name: str, field: Tensor) -> GroupIndex | None:
        """The index of ``field`` if it was built and ``field`` is unchanged since (no collective: the
        caller knows that every rank's field is unchanged too); None if it was never built.

        Raises:
            FieldAccessError: ``field`` changed since its groups were last found.
        """
        known = self._cuts.get(name)
        if known is None or known.index is None:
            return None
        if not known.describes(field):
            raise FieldAccessError(f"group field {name!r} changed during a substep that does not declare it in "
                                   "writes=")
        return known.index

    def _check_values(self, what: str, name: str, field: Tensor, rows: Tensor, values: Tensor) -> Tensor:
        """``values`` as ``[m, k]`` int64, after checking the field, ``rows`` and ``values``."""
        if values.dtype.is_floating_point or values.dtype.is_complex or values.dtype == torch.bool:
            raise ConfigError(f"{what}({name!r}): values must be integers (got {values.dtype}): a float "
                              "sum depends on how the agents are split over processes; count in integer units "
                              "(ops.to_fixed)")
        self._check_field(name, field)
        if rows.dim() != 1 or values.shape[:1] != rows.shape or rows.dtype not in (torch.int64, torch.int32):
            raise ConfigError(f"{what}({name!r}): expected rows [m] int64 or int32 and values [m] or [m, k] "
                              f"(got rows {rows.dtype} {list(rows.shape)}, values {list(values.shape)})")
        width = 1
        for extent in values.shape[1:]:
            width *= int(extent)
        return values.reshape(rows.shape[0], width).to(torch.int64)

    def _across(self, cut: _Cut, groups: Tensor, partial: Tensor) -> tuple[Tensor, Tensor]:
        """Add the other ranks' partial sums of this rank's cut groups (one all-to-all, no counts to
        exchange first: each rank sends every group it shares with a peer, in the order both know).
        A group is kept if a contribution reached it on some rank (a count travels with the sums).
        """
        k = partial.shape[1]
        shared = _sorted_member(groups, cut.cut)
        # [c, k + 1] this rank's sums of its cut groups, and how many rows contributed to each
        mine = torch.zeros((cut.cut.shape[0], k + 1), dtype=torch.int64, device=partial.device)
        at = torch.searchsorted(cut.cut, groups[shared])
        mine[at, :k] = partial[shared]
        mine[at, k] = 1
        self._add_peer_rows([(cut, mine, cut.peer_pos)])
        reached = mine[:, k] > 0
        every = torch.cat([groups[~shared], cut.cut[reached]])
        sums = torch.cat([partial[~shared], mine[reached, :k]])
        order = torch.argsort(every)
        return every.index_select(0, order), sums.index_select(0, order)

    def _add_peer_rows(self, parts: list[tuple[_Cut, Tensor, Tensor]]) -> None:
        """For each ``(cut, table, rows)`` of ``parts``: ``table[rows]`` (``[c, k]`` int64; ``rows``: this
        rank's cut groups in ``cut.peer_pos``'s order) sent to the peers that share each group, and
        what they send for the same groups added at the same rows, in place: one all-to-all for
        every part, whose sizes every rank knows (each peer's message: part by part).
        """
        world, device = self.comm.world_size, parts[0][1].device
        # a part with no cut group here sends nothing and gets nothing (a peer shares a group with
        # this rank exactly when this rank shares it with the peer): left out, but every rank posts
        parts = [part for part in parts if part[2].shape[0]]
        if not parts:
            _, work = self.comm.post_all_to_all(torch.zeros(0, dtype=torch.uint8, device=device), [0] * world,
                                                [0] * world)
            self.comm.wait(work)
            return
        widths = [table.shape[1] for _, table, _ in parts]
        counts = [[int(c) for c in cut.peer_counts] for cut, _, _ in parts]  # [part][peer] rows
        chunks = [torch.split(table.index_select(0, rows), c)  # [part][peer] rows to send
                  for (_, table, rows), c in zip(parts, counts, strict=True)]
        send = torch.cat([chunks[j][p].reshape(-1) for p in range(world) for j in range(len(parts))])
        sizes = [[c[p] * k for c, k in zip(counts, widths, strict=True)] for p in range(world)]  # [peer][part] int64s
        splits = [8 * sum(n) for n in sizes]
        got, work = self.comm.post_all_to_all(send.view(torch.uint8), splits, splits)
        self.comm.wait(work)
        values = got.view(torch.int64).to(device)
        per_peer = [torch.split(piece, n) for piece, n in zip(torch.split(values, [sum(n) for n in sizes]), sizes,
                                                              strict=True)]
        received = [torch.cat([per_peer[p][j] for p in range(world)]) for j in range(len(parts))]
        for (_, table, rows), k, part in zip(parts, widths, received, strict=True):
            table.index_add_(0, rows, part.reshape(-1, k))

    def index(self, name: str, field: Tensor) -> GroupIndex:
        """The groups of this rank's agents in ``field`` with their sizes over every rank and their
        members here (:class:`GroupIndex`); built once (a collective step: every rank calls it) and
        again when ``field`` or its population changed.

        Examples:
            >>> import torch
            >>> from agentsim.core.comm import LocalComm
            >>> index = GroupSums(LocalComm()).index("person.home", torch.tensor([7, -1, 3, 7]))
            >>> index.ids.tolist(), index.of.tolist(), index.size.tolist()
            ([3, 7], [1, 2, 0, 1], [1, 2])
            >>> rows, which = index.members(torch.tensor([1]))
            >>> rows.tolist(), which.tolist()
            ([0, 3], [0, 0])
        """
        self._check_field(name, field)
        cut = self._cut(name, field, width=1) if self.comm.world_size > 1 else self._local(name, field)
        return self._index_of(cut, field)

    def _index_of(self, cut: _Cut, field: Tensor) -> GroupIndex:
        """The index of ``cut``'s field, built at the first call (collectively, like ``cut``)."""
        if cut.index is None:
            with native.one_off_memory():  # large temporaries of sizes not seen again
                cut.index = self._build_index(cut, field)
        return cut.index

    def _build_index(self, cut: _Cut, field: Tensor) -> GroupIndex:
        """Number the groups of ``field`` here and count their members over every rank (the member
        lists are made when first asked for).
        """
        if cut.numbering is not None:  # numbered as the cut was found
            (ids, of), cut.numbering = cut.numbering, None
        else:
            ids, of = _number(field)
        size = torch.bincount(of.reshape(-1), minlength=ids.shape[0] + 1)[:ids.shape[0]]
        if self.comm.world_size > 1:  # the cut groups' members on the other ranks added (every cut group is here)
            cut.peer_numbers = torch.searchsorted(ids, cut.cut).index_select(0, cut.peer_pos)
            self._add_peer_rows([(cut, size.view(-1, 1), cut.peer_numbers)])
        if ids.shape[0] and int(size.max()) >= 2**31:
            raise ConfigError(f"group field: a group of {int(size.max())} members; at most 2**31 - 1")
        return GroupIndex(ids, of, size.to(torch.int32), size_is_local=cut.cut.shape[0] == 0)

    def _local(self, name: str, field: Tensor) -> _Cut:
        """One process: nothing is cut; the entry keeps the index while ``field`` stays the same."""
        known = self._cuts.get(name)
        if known is not None and known.describes(field):
            return known
        empty = field.new_zeros(0, dtype=torch.int64)
        members = int(torch.count_nonzero(field >= 0))  # (a bool's sum() makes an int64 copy)
        made = _Cut(weakref.ref(field), tensor_version(field), None, empty, empty, [0], 0, members)
        self._cuts[name] = made
        return made

    @staticmethod
    def _check_field(name: str, field: Tensor) -> None:
        if field.dim() not in (1, 2) or field.dtype.is_floating_point or field.dtype == torch.bool:
            raise ConfigError(f"group field {name!r}: expected [n] integers, or [n, k] for k groups per agent (got "
                              f"{field.dtype} {list(field.shape)})")

    def _cut(self, name: str, field: Tensor, width: int) -> _Cut:
        """The cut groups of ``field``, rebuilt (on every rank together) when any rank's changed.
        ``width``: the columns of the values summed (the same on every rank, else every rank raises).
        """
        return self._cuts_of([name], [field], [width])[0]

    def _cuts_of(self, names: list[str], fields: list[Tensor], widths: list[int]) -> list[_Cut]:
        """:meth:`_cut` of several fields, with one all-reduce for all of them."""
        return self._finish_cuts_check(self._post_cuts_check(names, fields, widths))

    def _post_cuts_check(self, names: list[str], fields: list[Tensor], widths: list[int]) -> _CutsCheck:
        """Start :meth:`_cuts_of` without waiting: every rank's flags (which of its fields changed)
        and widths travel while this rank works with the cuts it knows (:meth:`_CutsCheck.ready`);
        :meth:`_finish_cuts_check` gives the cuts.
        """
        known = [self._cuts.get(name) for name in names]
        fresh = [k is not None and k.describes(f) for k, f in zip(known, fields, strict=True)]
        flags = torch.tensor([0 if f else 1 for f in fresh] + widths + [w * w for w in widths], dtype=torch.int64)
        got, work = post_all_gather(self.comm, flags.view(torch.uint8))
        return _CutsCheck(names, fields, widths, known, fresh, got, work)

    def _finish_cuts_check(self, check: _CutsCheck) -> list[_Cut]:
        """The cuts of a posted check: those known where no rank's field changed, the others found
        again (on every rank together). Raises on every rank if the widths differ between ranks.
        """
        self.comm.wait(check.work)
        names, fields, widths, known = check.names, check.fields, check.widths, check.known
        world, m = self.comm.world_size, len(names)
        summed = check.got.cpu().view(torch.int64).view(world, 3 * m).sum(0).tolist()
        for j, name in enumerate(names):
            total, squares = summed[m + j], summed[2 * m + j]
            if total * total != world * squares:  # not every rank has the same width (Cauchy-Schwarz)
                raise ConfigError(f"group sums of {name!r}: the values have {widths[j]} column(s) here but not on "
                                  "every process; pass values of the same shape [m, k] on every process (also with "
                                  "m = 0)")
        cuts = []
        for j, (name, field) in enumerate(zip(names, fields, strict=True)):
            k = known[j]
            cuts.append(k if k is not None and summed[j] == 0 else self._find_cut(name, field))
        return cuts

    def _find_cut(self, name: str, field: Tensor) -> _Cut:
        """Find the cut groups of ``field`` (on every rank together)."""
        world = self.comm.world_size
        comm, rank = self.comm, self.comm.rank
        numbering = _number(field)  # (kept for the index, which numbers the groups the same way)
        held = numbering[0]
        held_members = torch.bincount(numbering[1].reshape(-1), minlength=held.shape[0] + 1)[:held.shape[0]]
        members = int(held_members.sum())
        # Only the groups inside another rank's id ranges can be held there too: the others are
        # this rank's alone (not cut), and their pairs are counted here.
        shared = _inside(held, comm.all_gather_rows(_id_ranges(held, _MAX_RANGES), include_self=False))
        alone = held_members[~shared]
        alone_pairs = int((alone * (alone - 1)).sum()) // 2
        held, held_members = held[shared], held_members[shared]
        # each group's owner (group % W) learns which ranks hold it, and how many members each
        owner = torch.remainder(held, world)
        mine, away = owner == rank, owner != rank
        got = comm.exchange_rows({"g": held[away], "r": torch.full_like(held[away], rank),
                                  "m": held_members[away]}, owner[away])
        g = torch.cat([held[mine], got["g"]])
        r = torch.cat([torch.full_like(held[mine], rank), got["r"]])
        m = torch.cat([held_members[mine], got["m"]])
        order = _lexorder(g, r)  # by group, then rank
        g, r, m = g.index_select(0, order), r.index_select(0, order), m.index_select(0, order)
        _, counts = torch.unique_consecutive(g, return_counts=True)
        total = torch.zeros(counts.shape[0], dtype=torch.int64, device=g.device)  # members of each owned group
        which = torch.repeat_interleave(torch.arange(counts.shape[0], device=g.device), counts)
        total.index_add_(0, which, m)
        squares = torch.zeros_like(total).index_add_(0, which, m * m)
        pairs, crossing = int((total * (total - 1)).sum()) // 2, int((total * total - squares).sum()) // 2
        row_count = torch.repeat_interleave(counts, counts)  # per (group, holder) row: its group's holders
        row_first = torch.repeat_interleave(torch.cumsum(counts, 0) - counts, counts)  # its group's first row
        cut_rows = torch.nonzero(row_count > 1).reshape(-1)  # rows of cut groups
        # and tells each holder of a cut group every other holder: rows (group, holder, peer), each
        # holder's row paired with every row of its group
        peer_rows, pair = expand_ranges(row_first.index_select(0, cut_rows), row_count.index_select(0, cut_rows))
        holder = cut_rows.index_select(0, pair)
        peer = r.index_select(0, peer_rows)
        keep = peer != r.index_select(0, holder)
        rows_g, rows_holder, rows_peer = g.index_select(0, holder)[keep], r.index_select(0, holder)[keep], peer[keep]
        here = rows_holder == rank
        told = comm.exchange_rows({"g": rows_g[~here], "p": rows_peer[~here]}, rows_holder[~here])
        pg, pp = torch.cat([rows_g[here], told["g"]]), torch.cat([rows_peer[here], told["p"]])
        cut_groups = torch.unique(pg)
        order = _lexorder(pp, pg)  # by peer, then group
        pp, pg = pp.index_select(0, order), pg.index_select(0, order)
        peer_pos = torch.searchsorted(cut_groups, pg)
        peer_counts = torch.bincount(pp, minlength=world).tolist()
        cut_members = int(held_members[_sorted_member(held, cut_groups)].sum())  # (cut groups are among held)
        made = _Cut(weakref.ref(field), tensor_version(field), None, cut_groups, peer_pos, peer_counts,
                    cut_members, members, pairs + alone_pairs, crossing, numbering=numbering)
        self._cuts[name] = made
        return made
