"""Nearest-neighbor queries: on a :class:`~agentsim.space.line.Line` the next agents ahead, behind,
or the nearest either way, within a reach; in a :class:`~agentsim.space.continuous.Box` the ``k``
nearest within a radius.

::

    cars = ctx.neighbors("car")                       # this process's cars, then the halo
    near = nearest(ctx.space, cars, direction="ahead", within=p["vmax"])
    gap = torch.where(near.found[:, 0], near.distance[:, 0] - 1, p["vmax"])
    speed_ahead = near.take(cars["v"], fill=0)[:, 0]

Which agents a target sees (``x`` the position field, ``d`` the distance ahead,
:meth:`Line.ahead <agentsim.space.line.Line.ahead>`):

- ``"ahead"``: sources with ``0 < d <= within`` (on a ring, round the wrap), nearest first;
- ``"behind"``: the same looking backwards;
- ``"either"``: sources within ``within`` either way (agents at the target's own position
  too), nearest first; at equal distances, behind before ahead.

An agent is never its own neighbor; agents at the target's own position are neither ahead
nor behind. At most ``k`` sources per target, nearest first; sources at one position in
the order met walking that way along the line (ahead: ascending uid; behind: descending
uid; at the target's own position: ascending uid). That order depends only on positions
and uids, so the answer is the same on any number of processes and with either
partitioner, whose halos bring every agent within the substep's declared reach
(``within`` may not exceed it).

In a :class:`~agentsim.space.continuous.Box` (``direction`` does not apply): the sources within
``within`` of the target (Euclidean, minimum image when periodic, inclusive: the pairs of
:func:`~agentsim.space.continuous.radius_pairs`), nearest first by squared distance, ties in
ascending uid; ``distance`` is the correctly rounded square root (``pair.dist``'s bits).

On a line the query sorts the sources by ``(x, uid)``, unless their rows are already in that order,
or in that order turned round once (a ring's order after agents crossed the wrap, which the
engine's locality sort keeps): then it costs a few passes over the rows, like the code one
writes for a ring in NumPy.

Examples:
    >>> import torch
    >>> from agentsim.space.line import Line
    >>> road = Line(10, cells=True)
    >>> cars = {"x": torch.tensor([1, 4, 9]), "uid": torch.tensor([0, 1, 2])}
    >>> near = nearest(road, cars, direction="ahead", within=3)
    >>> near.index.tolist(), near.distance[:, 0].tolist()  # car 2 at 9: car 0 at 1 is 2 cells ahead
    ([[1], [-1], [0]], [3, 9223372036854775807, 2])
    >>> near.take(cars["uid"], fill=-1)[:, 0].tolist()
    [1, -1, 0]
    >>> nearest(road, cars, k=2, direction="either", within=4).index.tolist()
    [[2, 1], [0, -1], [0, -1]]
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from agentsim.core import portable
from agentsim.errors import ConfigError, FieldAccessError, did_you_mean
from agentsim.space.continuous.box import Box
from agentsim.space.line import Line
from agentsim.space.neighbors import _Agents, _box_chunks

__all__ = ["DIRECTIONS", "Nearest", "nearest", "turn_in_order"]

DIRECTIONS: tuple[str, ...] = ("ahead", "behind", "either")


class Nearest:
    """The answer of :func:`nearest`, one row per target, ``k`` columns nearest first.

    Attributes:
        distance: ``[n, k]`` distance to each source (the positions' dtype; ``fill`` where none).
    """

    def __init__(self, rows: Tensor | Callable[[], Tensor], found: Tensor | Callable[[], Tensor],
                 distance: Tensor) -> None:
        self._rows_or_fn = rows  # [n, k] int64 rows of the sources, meaningless where not found (or how)
        self._found = found  # or how to compute it, when asked
        self.distance = distance
        self._index: Tensor | None = None

    @property
    def _rows(self) -> Tensor:
        if callable(self._rows_or_fn):
            self._rows_or_fn = self._rows_or_fn()
        return self._rows_or_fn

    @property
    def found(self) -> Tensor:
        """``[n, k]`` bool: where a source was found."""
        if callable(self._found):
            self._found = self._found()
        return self._found

    @property
    def index(self) -> Tensor:
        """``[n, k]`` int64 rows of the sources (``ctx.neighbors(pop)``'s rows, halo included), ``-1``
        where fewer than ``k`` sources are within reach.
        """
        if self._index is None:
            self._index = torch.where(self.found, self._rows, -1)
        return self._index

    def take(self, values: Tensor, fill: float | int = 0) -> Tensor:
        """``values`` (``[n_sources, ...]``, a field of the sources) at the found sources,
        ``fill`` elsewhere: ``[n, k, ...]``.
        """
        shape = self.distance.shape
        if values.shape[0] == 0:
            return torch.full((*shape, *values.shape[1:]), fill, dtype=values.dtype, device=values.device)
        got = values.index_select(0, self._rows.clamp(min=0).reshape(-1)).reshape(*shape, *values.shape[1:])
        found = self.found.reshape(*shape, *([1] * (values.dim() - 1)))
        return torch.where(found, got, fill)


def _check_reach(space: Line | Box, within: float) -> None:
    """Refuse a query beyond the reach the substep declares (its space's query limit)."""
    limit = space.query_limit
    if limit is not None and within > limit[0]:
        raise FieldAccessError(f"{limit[1]} but queries within {within:g}: on several processes the agents beyond "
                               "the declared reach are not there. Declare a reach that covers the query")


def _sides(agents: Any, sources: Any, field: str) -> tuple[Tensor, Tensor, Tensor, int]:
    """The targets' positions ``field``, the sources' positions and uids (the agents' own without
    ``sources``), and the number of targets (``n_local`` of ``ctx.neighbors(pop)``, else every row).
    """
    pos_t = _field(agents, field, "the agents")
    pos_s, uid_s = (pos_t, _field(agents, "uid", "the agents")) if sources is None else (
        _field(sources, field, "the sources"), _field(sources, "uid", "the sources"))
    n_local = getattr(agents, "n_local", None)
    return pos_t, pos_s, uid_s, int(pos_t.shape[0] if n_local is None else n_local)


def _field(agents: Any, key: str, who: str) -> Tensor:
    try:
        got = agents[key]
    except KeyError:
        raise ConfigError(f"nearest: {who} have no field {key!r} (a Line places agents at 'x', "
                          "a Box at 'pos')") from None
    if not isinstance(got, Tensor):
        raise ConfigError(f"nearest: {who}[{key!r}]: expected a tensor (got {type(got).__name__})")
    return got


def nearest(space: Any, agents: Any, k: int = 1, *, direction: str | None = None, within: float,
            sources: Any = None, fill: float | int | None = None) -> Nearest:
    """The ``k`` nearest sources of each target along a line or in a box, within ``within`` (module
    docstring).

    Args:
        space: A :class:`~agentsim.space.line.Line` or a :class:`~agentsim.space.continuous.Box`
            (``ctx.space``).
        agents: The targets, ``ctx.neighbors(pop)`` (targets: its ``n_local`` local rows; sources:
            all its rows, halo included), or a mapping with the positions (``x`` ``[n]`` on a line,
            ``pos`` ``[n, d]`` in a box) and ``uid`` ``[n]`` (every row a target and a source).
        k: How many sources per target, an int >= 1.
        direction: On a line ``"ahead"`` (the default), ``"behind"`` or ``"either"``; in a box
            only ``"either"`` (or None).
        within: The largest distance (length units; cells on a line of cells), at most the reach the
            substep declares; on a ring below the length (``"either"``: below half of it), so that no
            source is met twice.
        sources: The sources when they are another population (``ctx.neighbors(other)`` or a
            mapping): every one of its rows is a source.
        fill: ``distance`` where none is found (default: ``inf``, or the largest int64 on a line of
            cells). On a ring of cells, ``within + 1`` (as if the next one were just out of reach)
            is the cheapest.

    Returns:
        A :class:`Nearest` with ``[n_targets, k]`` rows.

    Raises:
        ConfigError: not a Line, a bad ``k``, ``direction`` or ``within``, missing fields.
        FieldAccessError: ``within`` beyond the substep's declared reach.
    """
    if not isinstance(space, (Line, Box)):
        raise ConfigError(f"nearest: expected a Line or a Box space (got {type(space).__name__}); on a Grid "
                          "read neighbors with neighbor_reduce")
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ConfigError(f"nearest: expected k to be an int >= 1 (got {k!r})")
    if isinstance(space, Box):
        if direction not in (None, "either"):
            raise ConfigError(f"nearest: in a Box the k nearest are taken in every direction: leave direction out "
                              f"(got {direction!r}; 'ahead' and 'behind' are for a Line)")
        return _box_nearest(space, agents, k, within, sources, fill)
    direction = "ahead" if direction is None else direction
    if direction not in DIRECTIONS:
        raise ConfigError(f"nearest: unknown direction {direction!r} (valid: {', '.join(DIRECTIONS)})."
                          + did_you_mean(str(direction), DIRECTIONS))
    if isinstance(within, bool) or not isinstance(within, (int, float)) or not within >= 0:
        raise ConfigError(f"nearest: expected within to be a distance >= 0 (got {within!r})")
    _check_reach(space, within)
    length = space.length
    bound = length / 2 if direction == "either" else length
    if space.periodic and not within < bound:
        raise ConfigError(f"nearest: on {space.describe()}, within must be below {bound:g} for direction "
                          f"{direction!r}, or sources would be met twice round the ring (got {within:g})")
    same = sources is None
    x_t, x_s, uid_s, n_t = _sides(agents, sources, "x")
    if x_t.dim() != 1 or x_s.dim() != 1:
        raise ConfigError(f"nearest: expected positions x of shape [n] (got {tuple(x_t.shape)})")
    if space.cells == x_s.dtype.is_floating_point:
        want = "integer cells" if space.cells else "float positions"
        raise ConfigError(f"nearest: {space.describe()} holds {want} (got x of dtype {x_s.dtype})")
    if fill is None:
        fill = torch.iinfo(torch.int64).max if space.cells else float("inf")
    n_s = int(x_s.shape[0])
    if n_t == 0 or n_s == 0:
        none = torch.full((n_t, k), -1, dtype=torch.int64, device=x_t.device)
        return Nearest(none, none >= 0, torch.full((n_t, k), fill, dtype=x_s.dtype, device=x_t.device))
    turn = turn_in_order(x_s, strict=True) if same and n_t == n_s else None
    rows: Tensor | Callable[[], Tensor]
    if turn is not None:
        rows, distance = _ring_walk(space, x_s, turn, k, direction)
    else:
        rows, distance = _sorted_walk(space, x_t[:n_t], x_s, uid_s, k, direction, same)
    if turn is not None and space.periodic and direction != "either" and space.cells and fill == within + 1 \
            and k < n_s:
        # every row has a source at some distance: the ones beyond reach become within + 1 in one clamp
        raw = distance
        return Nearest(rows, lambda: raw <= within, torch.clamp(raw, max=fill))
    found = distance <= within
    if turn is None or not space.periodic or k >= n_s:  # past a bounded line's ends, or no source left
        rows = rows() if callable(rows) else rows
        found &= rows >= 0
    distance = torch.where(found, distance, fill)
    if direction != "either":  # nearest first already: a miss is followed by misses
        return Nearest(rows, found, distance)
    return _compact(rows() if callable(rows) else rows, found, distance, k)


def _box_nearest(box: Box, agents: Any, k: int, within: float, sources: Any, fill: float | int | None) -> Nearest:
    """:func:`nearest` in a Box: the radius pairs within ``within``, each target's sorted by
    (squared distance, uid), the first ``k`` kept.
    """
    if isinstance(within, bool) or not isinstance(within, (int, float)) or not 0 < within < float("inf"):
        raise ConfigError(f"nearest: expected within to be a distance > 0 in a Box (got {within!r})")
    _check_reach(box, within)
    same = sources is None
    _, pos_s, uid_s, n_t = _sides(agents, sources, box.position_field)
    if not same:  # the pairs' canonical order needs the targets' uids too: refused here, in nearest's words
        _field(agents, "uid", "the agents")
    fill = float("inf") if fill is None else fill
    device = pos_s.device
    rows = torch.full((n_t, k), -1, dtype=torch.int64, device=device)
    distance = torch.full((n_t, k), fill, dtype=pos_s.dtype, device=device)
    if n_t == 0 or pos_s.shape[0] == 0:
        return Nearest(rows, rows >= 0, distance)
    tgt = _Agents("agents", agents, n_t)
    for c in _box_chunks(box, tgt, tgt if same else _Agents("sources", sources, None), n_t, same, float(within)):
        i, j, dist2 = c.i.to(torch.int64), c.j.to(torch.int64), c.dist2
        assert dist2 is not None  # continuous chunks carry their squared distances
        # each target's pairs by (squared distance, uid): stable sorts, last key first
        order = torch.argsort(uid_s.index_select(0, j), stable=True)
        order = order.index_select(0, torch.argsort(dist2.index_select(0, order), stable=True))
        order = order.index_select(0, torch.argsort(i.index_select(0, order), stable=True))
        i, j, dist2 = i.index_select(0, order), j.index_select(0, order), dist2.index_select(0, order)
        counts = torch.bincount(i - c.start, minlength=c.stop - c.start)
        first = torch.cumsum(counts, 0) - counts
        rank = torch.arange(i.shape[0], device=device) - first.index_select(0, i - c.start)
        kept = torch.nonzero(rank < k).flatten()
        at = i.index_select(0, kept) * k + rank.index_select(0, kept)
        rows.view(-1).index_copy_(0, at, j.index_select(0, kept))
        distance.view(-1).index_copy_(0, at, portable.sqrt(dist2.index_select(0, kept)).to(distance.dtype))
    return Nearest(rows, rows >= 0, distance)


def turn_in_order(key: Tensor, strict: bool) -> int | None:
    """Where rows turn round, if ``key`` ``[n]`` is in increasing order (``strict``: no two equal) possibly
    turned round once (rows ``a..n-1`` then ``0..a-1``: a ring's order after agents crossed its end):
    ``a`` (0 when in order), else None.
    """
    if key.shape[0] < 2:
        return 0
    back = torch.nonzero(key[1:] <= key[:-1] if strict else key[1:] < key[:-1]).reshape(-1)
    if back.numel() == 0:
        return 0
    if back.numel() > 1:
        return None
    b = int(back[0])
    if strict and not bool(key[b + 1] < key[b]):  # two equal keys, not a turn
        return None
    turned = key[-1] < key[0] if strict else key[-1] <= key[0]
    return b + 1 if bool(turned) else None


def _ring_walk(space: Line, x: Tensor, turn: int, k: int, direction: str) -> tuple[Callable[[], Tensor], Tensor]:
    """Rows in ring order at distinct positions (turned round at row ``turn``): the ``j``-th source
    ahead of row ``r`` is row ``r + j`` (turning round), behind ``r - j``; ``(rows, distance [n,
    c])``, ``c`` = ``k`` (``2k`` for ``"either"``: behind, then ahead), ``rows()`` computing the
    ``[n, c]`` rows when asked (``-1`` past a bounded line's ends). A few passes over the rows per
    column, as the NumPy code for a ring.
    """
    n = int(x.shape[0])
    length = int(space.length) if space.cells else space.length
    signs = {"ahead": (1,), "behind": (-1,), "either": (-1, 1)}[direction]
    columns = [(sign, j) for sign in signs for j in range(1, k + 1)]

    def ends(sign: int, j: int) -> Tensor:
        """The rows whose ``j``-th source that way crosses the end of the line (the last or first ``j``
        in line order).
        """
        first = turn - j if sign > 0 else turn
        return torch.remainder(torch.arange(first, first + j, device=x.device), n)

    dist = []
    for sign, j in columns:
        if j >= n:  # once round: each source is met once
            dist.append(torch.zeros_like(x))
            continue
        d = torch.empty_like(x)
        if sign > 0:  # row r sees row r + j: x[r + j] - x[r]
            torch.sub(x[j:], x[:n - j], out=d[:n - j])
            torch.sub(x[:j], x[n - j:], out=d[n - j:])
        else:  # row r sees row r - j: x[r] - x[r - j]
            torch.sub(x[j:], x[:n - j], out=d[j:])
            torch.sub(x[:j], x[n - j:], out=d[:j])
        if space.periodic:
            d.index_add_(0, ends(sign, j), torch.full((j,), length, dtype=d.dtype, device=d.device))
        dist.append(d)

    def rows() -> Tensor:
        index = []
        for sign, j in columns:
            if j >= n:
                index.append(torch.full((n,), -1, dtype=torch.int64, device=x.device))
                continue
            row = torch.remainder(torch.arange(sign * j, n + sign * j, device=x.device), n)
            if not space.periodic:
                row.index_fill_(0, ends(sign, j), -1)
            index.append(row)
        return torch.stack(index, 1)

    return rows, dist[0][:, None] if len(dist) == 1 else torch.stack(dist, 1)


def _sorted_walk(space: Line, xt: Tensor, x_s: Tensor, uid_s: Tensor, k: int, direction: str,
                 same: bool) -> tuple[Tensor, Tensor]:
    """Any rows: the sources sorted by ``(x, uid)``, each target's place among them, then the walk;
    ``(rows of the sources, distance)`` ``[n, c]`` (``c``: ``k``, or ``3k + 1`` for ``"either"``).
    """
    n_t = int(xt.shape[0])
    order = _line_order(x_s, uid_s)
    xs = x_s.index_select(0, order) if order is not None else x_s
    # the first sorted source at each target's position (lo), and the first past it (hi)
    lo, hi = _bounds(xs, order, n_t) if same else (torch.searchsorted(xs, xt, right=False),
                                                   torch.searchsorted(xs, xt, right=True))
    if direction == "ahead":
        pos, dist = _walk(space, xs, xt, hi, k, +1)
    elif direction == "behind":
        pos, dist = _walk(space, xs, xt, lo - 1, k, -1)
    else:
        pos, dist = _either(space, xs, xt, lo, hi, k, order, same)
    if order is None:
        return pos, dist
    return torch.where(pos >= 0, order.index_select(0, pos.clamp(min=0).reshape(-1)).reshape(pos.shape), -1), dist


def _line_order(x: Tensor, uid: Tensor) -> Tensor | None:
    """Rows in ``(x, uid)`` order: None if they already are, a turned range if they are in that order
    turned round once, else a sort.
    """
    n = int(x.shape[0])
    if n < 2:
        return None
    a, b = x[:-1], x[1:]
    step_back = (b < a) | ((b == a) & (uid[1:] <= uid[:-1]))
    backs = torch.nonzero(step_back).reshape(-1)
    if backs.numel() == 0:
        return None
    if backs.numel() == 1:
        at = int(backs[0]) + 1  # rows at.. then 0..at-1: in order if the last row is not after the first
        if bool(x[-1] < x[0]) or bool((x[-1] == x[0]) & (uid[-1] < uid[0])):
            return torch.cat([torch.arange(at, n, device=x.device), torch.arange(0, at, device=x.device)])
    by_uid = torch.argsort(uid, stable=True)
    return by_uid.index_select(0, torch.argsort(x.index_select(0, by_uid), stable=True))


def _bounds(xs: Tensor, order: Tensor | None, n_t: int) -> tuple[Tensor, Tensor]:
    """``(lo, hi)`` ``[n_t]`` int64 when the targets are the sources' first rows: the first sorted
    source at each target's position, and the first past it (runs of equal positions, no search).
    """
    n_s = int(xs.shape[0])
    at = torch.arange(n_s, device=xs.device)
    if order is None:
        sorted_at = at[:n_t]
    else:  # the sorted position of each row: the inverse of the order
        sorted_at = torch.empty_like(order).index_copy_(0, order, at)[:n_t]
    new = xs[1:] != xs[:-1]
    if bool(new.all()):  # distinct positions: each its own run
        return sorted_at, sorted_at + 1
    starts = torch.nonzero(torch.cat([new.new_ones(1), new])).reshape(-1)
    run = torch.cumsum(torch.cat([new.new_zeros(1), new]).to(torch.int64), 0).index_select(0, sorted_at)
    ends = torch.cat([starts[1:], starts.new_full((1,), n_s)])
    return starts.index_select(0, run), ends.index_select(0, run)


def _walk(space: Line, xs: Tensor, xt: Tensor, first: Tensor, k: int, step: int) -> tuple[Tensor, Tensor]:
    """The ``k`` sorted sources from ``first`` on (``step`` +1: ahead, -1: behind), round the ring
    when periodic: ``(rows of xs [n, k] (-1 past a bounded line's end), distance [n, k])``.
    """
    n_s = int(xs.shape[0])
    steps = torch.arange(k, device=xs.device)
    pos = first[:, None] + step * steps[None]
    if space.periodic:
        wrapped = (pos >= n_s) | (pos < 0)
        pos = torch.remainder(pos, n_s)
        if k > n_s:  # once round the ring: each source is met once
            pos = torch.where(steps[None] < n_s, pos, torch.full_like(pos, -1))
    else:
        off = (pos >= n_s) | (pos < 0)
        pos = torch.where(off, torch.full_like(pos, -1), pos)
    got = xs.index_select(0, pos.clamp(min=0).reshape(-1)).reshape(pos.shape)
    d = got - xt[:, None] if step > 0 else xt[:, None] - got
    if space.periodic:
        length = int(space.length) if space.cells else space.length
        d = torch.where(wrapped, d + length, d)
    return pos, d


def _either(space: Line, xs: Tensor, xt: Tensor, lo: Tensor, hi: Tensor, k: int, order: Tensor | None,
            same: bool) -> tuple[Tensor, Tensor]:
    """The candidates of ``"either"``: ``k`` at the target's position (one more to skip itself), ``k``
    behind, ``k`` ahead; ``(rows of xs, distance)`` ``[n, 3k + 1]`` in the order of preference at equal
    distances (at the position, behind, ahead).
    """
    n_t, n_s = int(xt.shape[0]), int(xs.shape[0])
    at = lo[:, None] + torch.arange(k + 1, device=xs.device)[None]
    at = torch.where(at < hi[:, None], at, torch.full_like(at, -1))
    if same:  # the target itself is not its neighbor
        row_of_sorted = torch.arange(n_s, device=xs.device) if order is None else order
        own = torch.arange(n_t, device=xs.device)[:, None]
        is_self = (at >= 0) & (row_of_sorted.index_select(0, at.clamp(min=0).reshape(-1)).reshape(at.shape) == own)
        at = torch.where(is_self, torch.full_like(at, -1), at)
    behind, d_behind = _walk(space, xs, xt, lo - 1, k, -1)
    ahead, d_ahead = _walk(space, xs, xt, hi, k, +1)
    # within below half a ring: no source is kept both behind and ahead
    return torch.cat([at, behind, ahead], 1), torch.cat([torch.zeros_like(at, dtype=xs.dtype), d_behind, d_ahead], 1)


def _compact(rows: Tensor, found: Tensor, distance: Tensor, k: int) -> Nearest:
    """The ``k`` nearest of ``"either"``'s candidates, nearest first (stable: ties keep the candidates'
    order, itself the line's order within each group).
    """
    last = float("inf") if distance.is_floating_point() else torch.iinfo(distance.dtype).max
    order = torch.argsort(torch.where(found, distance, last), dim=1, stable=True)[:, :k]
    return Nearest(torch.gather(rows, 1, order), torch.gather(found, 1, order), torch.gather(distance, 1, order))
