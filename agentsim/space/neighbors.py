"""Neighbor interactions: a per-pair rule, reduced into each target, in any space.

A model states *what* a pair of agents does to each other; :func:`neighbor_reduce` does the
rest, in the spirit of PyG's message passing (``message`` then ``aggregate``)::

    def rule(pair):                      # pair.target[...], pair.source[...]: [m, ...] fields
        return {"push": pair.delta, "n": True}          # pair.delta: [m, d] (continuous)
    out = neighbor_reduce(ctx.space, ctx.neighbors("boid"), rule, {"n": "count"}, radius=10.0)
    out["push"]  # [n_local, d]: the sum of each boid's pairs' deltas; out["n"]: [n_local] counts

Who is a neighbor depends on the space:

- :class:`~agentsim.space.continuous.Box` (continuous): the sources within ``radius``
  (minimum image when periodic, inclusive), as :func:`~agentsim.space.continuous.radius_pairs`;
- :class:`~agentsim.space.grid.Grid`: the sources in the cells of the target's Moore or von
  Neumann neighborhood of ``radius`` cells (``kind``), its own cell too with
  ``include_center=True``, or only its own cell (``kind="cell"``);
- :class:`~agentsim.space.graph.Graph`: the sources across an edge of the target's node.

An agent is never its own neighbor. The engine's part: which pairs, chunked so that a chunk's
temporaries stay in cache (continuous: :func:`~agentsim.space.continuous.radius_pair_chunks`),
index dtypes, the memory layout (pair fields are gathered one column at a time into
column-major ``[m, d]`` tensors, whose columns the sums read without a copy), and the
**canonical pair order**: per target, continuous sources by neighbor cell then uid, grid
sources by neighborhood offset (lexicographic ``(drow, dcol)``) then uid, graph sources by node
id. Floating sums add each target's pairs in that order (``index_add_``'s bits on the CPU), which
depends neither on row order nor on how agents are split over ranks: the same bits on 1 or
several ranks and with both partitioners, whose halos arrive through ``ctx.neighbors(pop)``.

Messages:
    ``message`` is either a callable ``rule(pair: PairView) -> Tensor | dict[str, Tensor | bool]``
    (each tensor ``[m, ...]``, one row per pair; ``True`` counts every pair), or per-source values
    (PyG's plain ``x_j``): a tensor ``[n_sources, ...]``, ``True``, or a dict of them. With
    per-source integer or bool values a ``sum`` / ``count`` on a grid is a sum of cell layers,
    and a ``count`` on a graph a push along the sources' edges (exact integers, any order: the
    same result as the pairs, faster); other values go through the pairs.

Reductions (``reduce``: one name for every message, or a dict naming some of them; the others
are summed):
    ``sum`` (bool summed as int64), ``mean`` (sum over the number of pairs; 0 with none;
    integers floor-divided), ``min`` / ``max`` (``fill`` where no pairs: default ``+inf`` /
    ``-inf`` for floats, the dtype's extremes for integers), ``count`` (the pairs whose message is
    True, int32 ``[n]``). Sums and means keep autograd (a field that requires grad, or
    continuous positions that do, through ``pair.delta``).

Examples:
    >>> import torch
    >>> from agentsim.space.continuous import Box
    >>> agents = {"pos": torch.tensor([[1.0, 1.0], [2.0, 1.0], [8.0, 8.0]]), "mass": torch.tensor([1.0, 2.0, 4.0])}
    >>> out = neighbor_reduce(Box((10.0, 10.0)), agents, lambda p: {"m": p.source["mass"], "n": True},
    ...                       {"n": "count"}, radius=1.5)
    >>> out["m"].tolist(), out["n"].tolist()
    ([2.0, 1.0, 0.0], [1, 1, 0])
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from agentsim.core import ops, portable
from agentsim.errors import ConfigError, did_you_mean
from agentsim.space import fused
from agentsim.space.continuous.box import Box
from agentsim.space.continuous.search import _source_order, radius_pair_chunks
from agentsim.space.fused import radius as fused_radius
from agentsim.space.graph.network import Graph
from agentsim.space.grid import NEIGHBORHOODS, Grid

__all__ = ["GRID_KINDS", "REDUCTIONS", "PairView", "neighbor_reduce"]

REDUCTIONS: tuple[str, ...] = ("sum", "mean", "min", "max", "count")
GRID_KINDS: tuple[str, ...] = (*NEIGHBORHOODS, "cell")

# Pairs expanded at once on grids and graphs (continuous chunks are sized by the search):
# about the working set of the continuous search's chunks on the CPU, few large kernels elsewhere.
_MAX_PAIRS = 2**18
_MAX_PAIRS_ACCELERATOR = 2**25

MessageValue = Tensor | bool
Message = MessageValue | Mapping[str, MessageValue]
Rule = Callable[["PairView"], Message]


# --------------------------------------------------------------------------- agents
class _Agents:
    """One side of the pairs: fields by name, ``n`` rows, of which the first ``n_targets`` are targets."""

    def __init__(self, name: str, agents: Any, n_targets: int | None) -> None:
        if not hasattr(agents, "__getitem__"):
            raise ConfigError(f"neighbor_reduce: {name}: expected a NeighborView (ctx.neighbors(pop)) or a mapping of "
                              f"field tensors (got {type(agents).__name__})")
        self.name = name
        self.agents = agents
        local = getattr(agents, "n_local", None)
        self.n_targets_declared = n_targets if n_targets is not None else local
        # a mapping the caller built, not the engine's ctx.neighbors(pop) (whose uids the engine keeps unique)
        self.user_given = local is None
        self._values: dict[str, Tensor] = {}
        self._columns: dict[str, Tensor] = {}

    def __getitem__(self, key: str) -> Tensor:
        value = self._values.get(key)
        if value is not None:
            return value
        try:
            got = self.agents[key]  # a NeighborView concatenates local and halo rows at every read: once
        except KeyError:
            raise ConfigError(f"neighbor_reduce: {self.name} has no field {key!r}") from None
        if not isinstance(got, Tensor):
            raise ConfigError(f"neighbor_reduce: {self.name}[{key!r}]: expected a tensor (got {type(got).__name__})")
        self._values[key] = got
        return got

    def uid(self, n: int, device: torch.device) -> Tensor:
        """``[n]`` uids (``arange`` for a mapping without them)."""
        try:
            return self["uid"]
        except ConfigError:
            return torch.arange(n, device=device)

    def columns(self, key: str) -> Tensor:
        """Field ``key`` laid out for 1-D gathers: ``[n]`` as is, ``[n, ...]`` as ``[k, n]`` contiguous rows."""
        cols = self._columns.get(key)
        if cols is None:
            value = self[key]
            width = math.prod(value.shape[1:])
            flat = value.reshape(value.shape[0], width)
            # stacking the strided columns: several times faster than flat.t().contiguous() on the CPU
            cols = value if value.dim() == 1 else torch.stack([flat[:, k] for k in range(width)])
            self._columns[key] = cols
        return cols

    def gather(self, key: str, rows: Tensor) -> Tensor:
        """``field[rows]``, ``[m, ...]``: trailing dims column-major (each column contiguous)."""
        value = self[key]
        cols = self.columns(key)
        if value.dim() == 1:
            return cols.index_select(0, rows)
        if cols.requires_grad and torch.is_grad_enabled():
            out = torch.stack([c.index_select(0, rows) for c in cols])
        else:
            out = cols.new_empty((cols.shape[0], rows.shape[0]))
            for k in range(cols.shape[0]):
                torch.index_select(cols[k], 0, rows, out=out[k])
        return out.t().reshape(rows.shape[0], *value.shape[1:])


class _Fields:
    """``pair.target[key]`` / ``pair.source[key]``: a field at each pair's row, cached for the chunk."""

    def __init__(self, side: _Agents, rows: Tensor) -> None:
        self._side = side
        self._rows = rows
        self._cache: dict[str, Tensor] = {}

    def __getitem__(self, key: str) -> Tensor:
        got = self._cache.get(key)
        if got is None:
            got = self._side.gather(key, self._rows)
            self._cache[key] = got
        return got


class PairView:
    """The pairs of one chunk of targets, as a rule sees them (``m`` pairs, canonical order).

    Attributes:
        target: ``target[field]`` is ``[m, ...]``: the target's field, for every pair.
        source: ``source[field]`` is ``[m, ...]``: the source's field, for every pair.
        n_pairs: ``m``.
    """

    def __init__(self, target: _Agents, source: _Agents, i: Tensor, j: Tensor,
                 delta: Tensor | None = None, dist2: Tensor | None = None) -> None:
        self.target = _Fields(target, i)
        self.source = _Fields(source, j)
        self.n_pairs = int(i.shape[0])
        self._source_side = source
        self._j = j
        self._delta = delta
        self._dist2 = dist2

    @property
    def delta(self) -> Tensor:
        """``[m, d]`` displacement from target to source (minimum image when periodic; length units).
        Continuous space only.
        """
        if self._delta is None:
            raise ConfigError("pair.delta: pairs have a displacement in continuous space (a Box) only")
        return self._delta.t()

    @property
    def dist2(self) -> Tensor:
        """``[m]`` squared distance ``sum_k delta[:, k] ** 2`` (added in dim order). Continuous space only."""
        if self._dist2 is None:
            raise ConfigError("pair.dist2: pairs have a distance in continuous space (a Box) only")
        return self._dist2

    @property
    def dist(self) -> Tensor:
        """``[m]`` distance ``sqrt(dist2)`` (length units), correctly rounded: the same bits on every
        device (:func:`agentsim.core.portable.sqrt`). Continuous space only.
        """
        return portable.sqrt(self.dist2)

    def source_values(self, values: Tensor) -> Tensor:
        """``values[j]``, ``[m, ...]``: per-source values ``[n_sources, ...]`` at each pair's source."""
        return values.index_select(0, self._j)


# --------------------------------------------------------------------------- pairs
@dataclass
class _Chunk:
    start: int
    stop: int
    t: Tensor  # [m] target row minus start
    i: Tensor  # [m] target row
    j: Tensor  # [m] source row
    delta: Tensor | None = None  # [d, m]
    dist2: Tensor | None = None


def _max_pairs(device: torch.device) -> int:
    return _MAX_PAIRS if device.type == "cpu" else _MAX_PAIRS_ACCELERATOR


def _expand(start: Tensor, cnt: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Segments ``[T, K]`` laid end to end, target by target: ``(target [m], segment [m],
    position [m])``, int64 (``segment``: the flat ``[T, K]`` index of the pair's segment).
    """
    flat = cnt.reshape(-1)
    m = int(flat.sum()) if flat.numel() else 0
    seg = torch.repeat_interleave(torch.arange(flat.shape[0], device=flat.device), flat, output_size=m)
    begin = torch.cumsum(flat, 0) - flat
    pos = torch.arange(m, device=flat.device) - begin.index_select(0, seg) + start.reshape(-1).index_select(0, seg)
    return torch.div(seg, start.shape[1], rounding_mode="floor"), seg, pos


def _segment_chunks(start: Tensor, cnt: Tensor, device: torch.device) -> Iterator[tuple[int, int]]:
    """Blocks of targets ``[a, b)`` whose segments hold about ``_max_pairs`` pairs or fewer."""
    n = start.shape[0]
    per_target = cnt.sum(1)
    bounds = [0]
    if n and int(per_target.sum()) > _max_pairs(device):
        csum = torch.cumsum(per_target, 0)
        marks = torch.arange(_max_pairs(device), int(csum[-1]), _max_pairs(device), device=device)
        bounds += [k for k in torch.searchsorted(csum, marks, right=True).tolist() if 0 < k < n]
    bounds.append(n)
    return ((a, b) for a, b in itertools.pairwise(bounds) if b > a)


def _grid_segments(grid: Grid, tgt_cell: Tensor, src_cell: Tensor, src_uid: Tensor, kind: str, radius: int,
                   include_center: bool) -> tuple[Tensor, Tensor, Tensor]:
    """Sources sorted by (cell, uid) and each target's ``[T, K]`` runs of them, one per offset."""
    order = _source_order(src_cell, src_uid.to(torch.int64), grid.n_cells) if src_cell.numel() else src_cell
    table = torch.zeros(grid.n_cells + 1, dtype=torch.int64, device=src_cell.device)
    torch.cumsum(torch.bincount(src_cell, minlength=grid.n_cells), 0, out=table[1:])
    if kind == "cell":
        near = tgt_cell.unsqueeze(1)
    else:
        near = grid.neighbor_cells(tgt_cell, kind, radius, include_center)  # [T, K], -1 outside
    inside = near >= 0
    near = near.clamp(min=0)
    start = table.index_select(0, near.reshape(-1)).view(near.shape)
    cnt = (table.index_select(0, near.reshape(-1) + 1).view(near.shape) - start) * inside
    return order, start, cnt


def _grid_chunks(grid: Grid, tgt: _Agents, src: _Agents, n_t: int, same: bool, kind: str, radius: int,
                 include_center: bool) -> Iterator[_Chunk]:
    tcell = tgt[grid.position_field][:n_t].to(torch.int64)
    scell = src[grid.position_field].to(torch.int64)
    suid = src.uid(scell.shape[0], scell.device)
    order, start, cnt = _grid_segments(grid, tcell, scell, suid, kind, radius, include_center)
    # The offsets are symmetric and in lexicographic order: the center, when there, is the middle one.
    center = start.shape[1] // 2 if same and (include_center or kind == "cell") else None
    for a, b in _segment_chunks(start, cnt, tcell.device):
        t, seg, pos = _expand(start[a:b], cnt[a:b])
        j = order.index_select(0, pos)
        if center is not None:  # an agent is not its own neighbor through the center offset
            # (on a torus smaller than the neighborhood, other offsets that wrap onto its cell count, as
            # Grid.neighbor_sum counts them)
            keep = ops.flatnonzero((j != t + a) | (seg % start.shape[1] != center))
            t, j = t.index_select(0, keep), j.index_select(0, keep)
        yield _Chunk(a, b, t, t + a, j)


def _graph_chunks(graph: Graph, tgt: _Agents, src: _Agents, n_t: int) -> Iterator[_Chunk]:
    node_t = tgt["uid"][:n_t].to(torch.int64)
    node_s = src["uid"].to(torch.int64)
    row_of = torch.full((graph.n_nodes,), -1, dtype=torch.int64, device=node_s.device)
    rows = torch.arange(node_s.shape[0], device=node_s.device)
    row_of[node_s] = rows
    if src.user_given and not bool((row_of.index_select(0, node_s) == rows).all()):
        raise ConfigError("neighbor_reduce: a graph's sources hold a node twice (a uid is its node: uids are unique)")
    start = graph.indptr.index_select(0, node_t).unsqueeze(1)
    cnt = graph.indptr.index_select(0, node_t + 1).unsqueeze(1) - start
    for a, b in _segment_chunks(start, cnt, node_t.device):
        t, _, pos = _expand(start[a:b], cnt[a:b])
        j = row_of.index_select(0, graph.indices.index_select(0, pos).to(torch.int64))
        keep = ops.flatnonzero(j >= 0)  # a neighbor that is not among the sources (not in the halo)
        t, j = t.index_select(0, keep), j.index_select(0, keep)
        yield _Chunk(a, b, t, t + a, j)


def _box_chunks(box: Box, tgt: _Agents, src: _Agents, n_t: int, same: bool, radius: float) -> Iterator[_Chunk]:
    field = box.position_field
    spos = src[field]
    suid = src.uid(spos.shape[0], spos.device)
    if same:
        pos, uid = spos, suid
    else:  # targets first, as rows the search queries; their pairs with each other are dropped
        pos = torch.cat([tgt[field][:n_t], spos])
        uid = torch.cat([tgt.uid(n_t, spos.device)[:n_t].to(torch.int64), suid.to(torch.int64)])
    for c in radius_pair_chunks(pos, box, radius, uid=uid, n_query=n_t, include_self=not same, with_delta=True,
                                index_dtype=torch.int32):
        i, j, delta, dist2 = c.i, c.j, c.delta, c.dist2
        assert delta is not None and dist2 is not None  # with_delta=True
        if not same:
            keep = ops.flatnonzero(j >= n_t)
            i, j = i.index_select(0, keep), j.index_select(0, keep) - n_t
            delta, dist2 = delta.index_select(1, keep), dist2.index_select(0, keep)
        yield _Chunk(c.start, c.stop, i - c.start if c.start else i, i, j, delta, dist2)


# --------------------------------------------------------------------------- reductions
def _check_reduce(names: list[str], reduce: str | Mapping[str, str], single: bool) -> dict[str, str]:
    def check(how: object, where: str) -> str:
        if how not in REDUCTIONS:
            raise ConfigError(f"neighbor_reduce: unknown reduction {how!r}{where} (valid: {', '.join(REDUCTIONS)})."
                              + did_you_mean(str(how), REDUCTIONS))
        return str(how)

    if isinstance(reduce, str):
        return {name: check(reduce, "") for name in names}
    if not isinstance(reduce, Mapping):
        raise ConfigError(f"neighbor_reduce: reduce: expected one of {', '.join(REDUCTIONS)} or a dict of them by "
                          f"message name (got {type(reduce).__name__})")
    if single:
        raise ConfigError("neighbor_reduce: reduce is a dict but the message is a single tensor: name the message "
                          "(return a dict) or give one reduction")
    unknown = sorted(set(reduce) - set(names))
    if unknown:
        raise ConfigError(f"neighbor_reduce: reduce names {unknown} but the messages are {sorted(names)}")
    return {name: check(reduce.get(name, "sum"), f" for message {name!r}") for name in names}


def _check_message(name: str, value: object, m: int, how: str, what: str) -> None:
    if value is True:
        if how != "count":
            raise ConfigError(f"neighbor_reduce: message {name!r} is True (every pair), which only 'count' "
                              f"reduces (got reduce {how!r})")
        return
    if not isinstance(value, Tensor) or value.dim() < 1 or value.shape[0] != m:
        got = f"{value.dtype} tensor of shape {list(value.shape)}" if isinstance(value, Tensor) else repr(value)
        raise ConfigError(f"neighbor_reduce: message {name!r}: expected a tensor [{m}, ...], one row per {what}, "
                          f"or True (got {got})")
    if how == "count" and value.dtype != torch.bool:
        raise ConfigError(f"neighbor_reduce: message {name!r}: 'count' counts the pairs whose message is True: "
                          f"expected a bool tensor or True (got {value.dtype})")


def _reduce_chunk(messages: dict[str, MessageValue], how: dict[str, str], t: Tensor, n: int,
                  fill: float | int | None) -> dict[str, Tensor]:
    """Each message reduced into the ``n`` targets of a chunk (``t``: ``[m]`` target minus the chunk's start)."""
    out: dict[str, Tensor] = {}
    pair_count: Tensor | None = None

    def counts() -> Tensor:
        nonlocal pair_count
        if pair_count is None:
            pair_count = torch.bincount(t, minlength=n)
        return pair_count

    # Sums: every column of every summed message, grouped by dtype, in one pass per group.
    columns: dict[torch.dtype, list[Tensor]] = {}
    for name, value in messages.items():
        if how[name] in ("sum", "mean"):
            assert isinstance(value, Tensor)
            flat = value.reshape(value.shape[0], math.prod(value.shape[1:]))
            if flat.dtype == torch.bool:
                flat = flat.to(torch.int64)
            columns.setdefault(flat.dtype, []).extend(flat[:, c] if flat[:, c].is_contiguous()
                                                      else flat[:, c].contiguous() for c in range(flat.shape[1]))
    sums = {dtype: iter(ops.scatter_sum_columns(cols, t, n)) for dtype, cols in columns.items()}
    for name, value in messages.items():
        kind = how[name]
        if kind in ("sum", "mean"):
            assert isinstance(value, Tensor)
            dtype = torch.int64 if value.dtype == torch.bool else value.dtype
            k = math.prod(value.shape[1:])
            got = [next(sums[dtype]) for _ in range(k)]
            total = got[0] if value.dim() == 1 else torch.stack(got, 1).reshape(n, *value.shape[1:])
            if kind == "mean":
                count = counts().clamp(min=1).view(-1, *([1] * (total.dim() - 1)))
                total = (total / count.to(total.dtype) if total.is_floating_point()
                         else torch.div(total, count, rounding_mode="floor"))
            out[name] = total
        elif kind == "count":
            if value is True:
                out[name] = counts().to(torch.int32)
            else:
                assert isinstance(value, Tensor)
                out[name] = ops.scatter_sum(value.to(torch.int32), t, n)
        else:
            assert isinstance(value, Tensor)
            extreme = ops.scatter_max if kind == "max" else ops.scatter_min
            out[name] = extreme(value, t, n, fill)
    return out


def _as_dict(message: Message) -> tuple[dict[str, MessageValue], bool]:
    if isinstance(message, Mapping):
        if not message:
            raise ConfigError("neighbor_reduce: the message dict is empty: expected one or more named messages")
        return dict(message), False
    return {"": message}, True


# --------------------------------------------------------------------------- fast paths
def _cell_layer(cell: Tensor, values: Tensor, n_cells: int, every: bool, all_positive: bool) -> Tensor:
    """The sum of ``values`` ``[n, ...]`` int64 per cell, ``[n_cells, ...]``, of sources in ``cell`` ``[n]``.

    ``every``: the values are all 1 (a count of sources: a bincount). ``all_positive``: all >= 1,
    so they are copied (3x faster than ``index_add_`` on the CPU) when no two sources share a cell,
    which fewer nonzero cells than sources would betray; then added.
    """
    if every:
        return torch.bincount(cell, minlength=n_cells)
    layer = torch.zeros((n_cells, *values.shape[1:]), dtype=torch.int64, device=cell.device)
    if all_positive and values.dim() == 1:
        layer.index_copy_(0, cell, values)
        if int(torch.count_nonzero(layer)) == cell.shape[0]:
            return layer
        layer.zero_()
    return layer.index_add_(0, cell, values)


def _grid_layer_counts(grid: Grid, tgt: _Agents, src: _Agents, n_t: int, same: bool, values: dict[str, MessageValue],
                       kind: str, radius: int, include_center: bool) -> dict[str, Tensor]:
    """Integer sums of per-source values over cell layers (exact, any order): the pairs' result."""
    tcell = tgt[grid.position_field][:n_t].to(torch.int64)
    scell = src[grid.position_field].to(torch.int64)
    n_s = scell.shape[0]
    # Bool columns go two to an int64 layer (the second shifted by 32 bits: a neighborhood holds
    # fewer than 2**31 sources), other integers one to a layer.
    names = list(values)
    flags = [k for k in names if values[k] is True or values[k].dtype == torch.bool]  # type: ignore[union-attr]
    layers: list[tuple[list[str], Tensor, bool]] = []
    for a in range(0, len(flags), 2):
        group = flags[a:a + 2]
        ones, terms = 0, []  # every source's constant part (a True flag), and its per-source parts
        for shift, name in zip((0, 32), group, strict=False):
            v = values[name]
            if v is True:
                ones += 1 << shift
            else:
                term = v.to(torch.int64)  # type: ignore[union-attr]
                terms.append(term << shift if shift else term)
        packed = terms[0] if terms else torch.zeros(n_s, dtype=torch.int64, device=scell.device)
        for term in terms[1:]:
            packed = packed + term
        if ones:
            packed = packed + ones
        layers.append((group, packed, ones > 0))
    for name in names:
        if name not in flags:
            layers.append(([name], values[name].to(torch.int64), False))  # type: ignore[union-attr]
    out: dict[str, Tensor] = {}
    for group, packed, all_positive in layers:
        width = math.prod(packed.shape[1:])
        flat = packed.reshape(n_s, width)
        if width == 1:  # one column: a 1-D layer (faster gathers)
            flat = flat.reshape(n_s)
        every = width == 1 and all(values[name] is True for name in group)
        layer = _cell_layer(scell, flat, grid.n_cells, every, all_positive)
        if kind != "cell":
            cells = layer.reshape(grid.shape) if width == 1 else layer.t().reshape(width, *grid.shape)
            summed = grid.neighbor_sum(cells, kind, radius, include_center)
            layer = summed.reshape(-1) if width == 1 else summed.reshape(width, grid.n_cells).t()
        at = layer.index_select(0, tcell)  # index_select: 4x faster than layer[tcell] on the CPU
        if same and (include_center or kind == "cell"):
            at = at - flat[:n_t]  # an agent is not its own neighbor (its center offset)
        if len(group) == 2:  # the low 32 bits, the high ones: each a count below 2**31
            out[group[0]], out[group[1]] = at.to(torch.int32), (at >> 32).to(torch.int32)
        else:
            value = values[group[0]]
            out[group[0]] = at.reshape(n_t, *(value.shape[1:] if isinstance(value, Tensor) else ()))
    return out


# --------------------------------------------------------------------------- entry point
def neighbor_reduce(
    space: Any,
    agents: Any,
    message: Rule | Message,
    reduce: str | Mapping[str, str] = "sum",
    *,
    sources: Any = None,
    radius: float | None = None,
    kind: str = "moore",
    include_center: bool = False,
    fill: float | int | None = None,
    n_targets: int | None = None,
) -> Any:
    """Reduce a per-pair message from each target's neighbors into the target.

    Args:
        space: A :class:`Box`, :class:`Grid` or :class:`Graph` (``ctx.space``).
        agents: The targets, ``ctx.neighbors(pop)`` (targets: its ``n_local`` local rows;
            sources: all its rows, halo included) or a mapping of field tensors (every row a
            target and a source). Needs the space's position field (``pos`` ``[n, d]``, ``cell``
            ``[n]`` or ``uid`` for a graph), and ``uid`` ``[n]`` unless rows are uids.
        message: ``rule(pair) -> Tensor | dict[str, Tensor | True]`` (tensors ``[m, ...]``, one
            row per pair of the :class:`PairView`), or per-source values: a tensor
            ``[n_sources, ...]``, ``True``, or a dict of them (see the module docstring).
        reduce: One of ``sum``, ``mean``, ``min``, ``max``, ``count`` for every message, or a dict
            ``{message name: reduction}`` (unnamed messages are summed).
        sources: The sources when they are another population (``ctx.neighbors(other)`` or a
            mapping): every one of its rows is a source.
        radius: Continuous: the neighbor radius (length units, required). Grid: the
            neighborhood radius in cells (default 1). Graph: not used.
        kind: Grid only: ``"moore"``, ``"von_neumann"`` or ``"cell"`` (the target's cell only).
        include_center: Grid only: the sources in the target's own cell are neighbors too.
        fill: ``min`` / ``max`` of a target without pairs (default: see the module docstring).
        n_targets: The number of target rows of a mapping (its first rows; default all).

    Returns:
        ``[n_targets, ...]`` for a single message, else a dict of them by message name.

    Raises:
        ConfigError: An unknown reduction or neighborhood kind, a missing radius or field, a
            message of the wrong shape or dtype.
    """
    tgt = _Agents("agents", agents, n_targets)
    src = tgt if sources is None else _Agents("sources", sources, None)
    same = sources is None
    field = getattr(space, "position_field", None)
    if not isinstance(space, (Box, Grid, Graph)) or field is None:
        hint = " (on a Line, read the agents ahead, behind or nearest with agentsim.nearest)" \
            if type(space).__name__ == "Line" else ""
        raise ConfigError(f"neighbor_reduce: expected a Box, Grid or Graph space (got {type(space).__name__}){hint}")
    position = tgt[field]  # a graph's is the uid: its agents are its nodes
    n_rows = position.shape[0]
    n_t = n_rows if tgt.n_targets_declared is None else int(tgt.n_targets_declared)
    if not 0 <= n_t <= n_rows:
        raise ConfigError(f"neighbor_reduce: expected 0 <= n_targets <= {n_rows} rows (got {n_t})")
    n_src = src[field].shape[0]
    _check_neighborhood(space, radius, kind, include_center)
    cells_radius = 1 if radius is None else int(radius)
    if not callable(message):
        values, single = _as_dict(message)
        how = _check_reduce(list(values), reduce, single)
        for name, value in values.items():
            _check_message(name or "message", value, n_src, how[name], "source row")
        exact = _exact_counts(space, tgt, src, n_t, same, values, how, kind, cells_radius, include_center)
        if exact is not None:
            return exact[""] if single else exact

        def per_source(pair: PairView) -> Message:
            picked = {k: v if v is True else pair.source_values(v) for k, v in values.items()}  # type: ignore[arg-type]
            return picked[""] if single else picked
        rule: Rule = per_source
    else:
        rule = message

    out, single_rule = _reduce_pairs(space, tgt, src, n_t, same, rule, reduce, fill, kind, cells_radius,
                                     include_center, float(radius or 0.0))
    return out[""] if single_rule else out


def _check_neighborhood(space: Any, radius: float | None, kind: str, include_center: bool) -> None:
    """The neighborhood arguments of :func:`neighbor_reduce` that ``space`` takes, checked."""
    if isinstance(space, Grid):
        if kind not in GRID_KINDS:
            raise ConfigError(f"neighbor_reduce: unknown grid neighborhood kind {kind!r} (valid: "
                              f"{', '.join(GRID_KINDS)}).{did_you_mean(str(kind), GRID_KINDS)}")
        if radius is not None and (isinstance(radius, bool) or not isinstance(radius, int) or radius < 1):
            raise ConfigError(f"neighbor_reduce: a grid radius is a number of cells, an int >= 1 (got {radius!r})")
    elif isinstance(space, Box) and radius is None:
        raise ConfigError("neighbor_reduce: continuous space needs radius= (length units)")
    elif isinstance(space, Graph) and radius is not None:
        raise ConfigError(f"neighbor_reduce: a graph's neighbors are its edges; radius= does not apply "
                          f"(got radius={radius!r})")
    if not isinstance(space, Grid) and (kind != "moore" or include_center):
        raise ConfigError(f"neighbor_reduce: kind= and include_center= are for a Grid (got kind={kind!r}, "
                          f"include_center={include_center!r} with a {type(space).__name__})")


def _exact_counts(space: Any, tgt: _Agents, src: _Agents, n_t: int, same: bool, values: dict[str, Any],
                  how: dict[str, str], kind: str, cells_radius: int, include_center: bool) -> dict[str, Tensor] | None:
    """Integer sums and counts of per-source values without expanding pairs (a grid's cell layers,
    a graph's push along edges), or None where no such path applies.
    """
    integer = all(v is True or not (v.is_floating_point() or v.is_complex())
                  for v in values.values())
    if integer and all(h in ("sum", "count") for h in how.values()):
        if isinstance(space, Grid):
            out = _grid_layer_counts(space, tgt, src, n_t, same, values, kind, cells_radius, include_center)
            return {k: v.to(torch.int32) if how[k] == "count" else v.to(torch.int64) for k, v in out.items()}
        if isinstance(space, Graph) and all(h == "count" for h in how.values()):
            at, suid = tgt["uid"][:n_t], src["uid"]
            if src.user_given and suid.numel() and int(torch.unique(suid).numel()) != int(suid.numel()):
                raise ConfigError("neighbor_reduce: a graph's sources hold a node twice (a uid is its node: "
                                  "uids are unique)")
            return {k: space.count_neighbors_in(
                suid if isinstance(v, bool) else suid.index_select(0, ops.flatnonzero(v)), at=at)
                for k, v in values.items()}
    return None


def _reduce_pairs(space: Any, tgt: _Agents, src: _Agents, n_t: int, same: bool, rule: Rule,
                  reduce: str | Mapping[str, str], fill: float | int | None, kind: str, cells_radius: int,
                  include_center: bool, radius: float) -> tuple[dict[str, Tensor], bool]:
    """The pairs of each target, chunk by chunk in canonical order, through ``rule`` and the
    reductions; returns the reduced messages by name and whether the rule returned a single one.
    """
    position = tgt[space.position_field]
    if isinstance(space, Box) and fused.wanted(position.device):
        through_kernel = _fused_box(space, tgt, src, n_t, same, rule, reduce, radius)
        if through_kernel is not None:
            return through_kernel
    if isinstance(space, Box):
        chunks: Iterator[_Chunk] = _box_chunks(space, tgt, src, n_t, same, radius)
    elif isinstance(space, Grid):
        chunks = _grid_chunks(space, tgt, src, n_t, same, kind, cells_radius, include_center)
    else:
        chunks = _graph_chunks(space, tgt, src, n_t)
    empty = torch.empty(0, dtype=torch.int64, device=position.device)
    first = next(chunks, None)
    if first is None:  # no targets: one empty chunk tells the messages' shapes
        first = _Chunk(0, n_t, empty, empty, empty)
        if isinstance(space, Box):
            first.delta, first.dist2 = position.new_empty((space.ndim, 0)), position.new_empty(0)
    parts: dict[str, list[Tensor]] = {}
    sums: _Sums | None = None
    how_checked: dict[str, str] | None = None
    single_rule = False
    for c in itertools.chain([first], chunks):
        got = rule(PairView(tgt, src, c.i, c.j, c.delta, c.dist2))
        messages, single_rule = _as_dict(got)
        if how_checked is None:
            how_checked = _check_reduce(list(messages), reduce, single_rule)
            if _Sums.applies(messages, how_checked):
                sums = _Sums(messages, how_checked, n_t, src[space.position_field].shape[0], position.device)
        elif set(messages) != set(how_checked):
            raise ConfigError(f"neighbor_reduce: the rule returned messages {sorted(messages)} for one chunk and "
                              f"{sorted(how_checked)} for another")
        m = int(c.i.shape[0])
        for name, value in messages.items():
            _check_message(name or "message", value, m, how_checked[name], "pair")
        if sums is not None:
            sums.add(messages, c.t, c.start, c.stop)
            continue
        for name, value in _reduce_chunk(messages, how_checked, c.t, c.stop - c.start, fill).items():
            parts.setdefault(name, []).append(value)
    if sums is not None:
        return sums.result(), single_rule
    return {k: v[0] if len(v) == 1 else torch.cat(v) for k, v in parts.items()}, single_rule


def _fused_box(box: Box, tgt: _Agents, src: _Agents, n_t: int, same: bool, rule: Rule,
               reduce: str | Mapping[str, str], radius: float) -> tuple[dict[str, Tensor], bool] | None:
    """The reduction through the fused kernel (:mod:`agentsim.space.fused`), or None (the reason
    noted in :func:`agentsim.space.fused.status`) where it does not apply.
    """
    pos = tgt[box.position_field]
    if pos.dtype != torch.float32 or src[box.position_field].dtype != torch.float32:
        fused.note(f"torch: positions of dtype {pos.dtype} (the kernel takes float32)")
        return None
    if n_t == 0 or src[box.position_field].shape[0] == 0:
        fused.note("torch: no targets or no sources")
        return None
    if torch.is_grad_enabled() and (pos.requires_grad or src[box.position_field].requires_grad):
        fused.note("torch: positions that require grad")
        return None
    tr = fused_radius.translation(rule, box.ndim, tgt, src)
    if isinstance(tr, str):
        fused.note(f"torch: {tr}")
        return None
    how = _check_reduce(list(tr.messages), reduce, tr.single)
    for name, message in tr.messages.items():
        counted = message is True or message[1] == torch.bool
        if how[name] not in ("sum", "mean", "count") or (message is True if how[name] != "count" else not counted):
            fused.note(f"torch: reduction {how[name]!r} of message {name!r}")
            return None
    for f in tr.fields:
        value = (src if f.side == "source" else tgt)[f.name]
        if torch.is_grad_enabled() and value.requires_grad:
            fused.note(f"torch: field {f.name!r} requires grad")
            return None
    fused.note("fused")
    sums, n_pairs = fused_radius.radius_reduce(box, tgt, src, n_t, same, radius, tr, how)
    shapes = {name: m[2] for name, m in tr.messages.items() if m is not True}
    counted = {name: sums.pop(name)[0] for name in list(sums) if how[name] == "count"}
    return _assemble(how, sums, shapes, counted, n_pairs, n_t), tr.single


class _Sums:
    """Sums, means and pair counts of every chunk's messages added in place into whole columns
    (``[k, n_targets]`` per message, each chunk into its own targets' slice): zeros, then each
    target's pairs in pair order, the bits of a fresh :func:`scatter_sum` per chunk, without a
    per-chunk result to stack and concatenate. Results are ``[n_targets, ...]`` views of the
    columns (column-major).
    """

    @staticmethod
    def applies(messages: dict[str, MessageValue], how: dict[str, str]) -> bool:
        """Sums and means of tensors without gradients, and counts of every pair (``True``)."""
        for name, value in messages.items():
            if how[name] == "count":
                one_column = isinstance(value, Tensor) and value.dtype == torch.bool and value.dim() == 1
                if value is not True and not one_column:
                    return False
            elif how[name] not in ("sum", "mean") or not isinstance(value, Tensor) or value.requires_grad:
                return False
        return True

    def __init__(self, messages: dict[str, MessageValue], how: dict[str, str], n: int, n_sources: int,
                 device: torch.device) -> None:
        self.how, self.n = how, n
        self.shapes: dict[str, tuple[int, ...]] = {}
        self.columns: dict[str, Tensor] = {}
        self.counted: dict[str, Tensor] = {}  # counts of the pairs whose (bool) message is True
        for name, value in messages.items():
            if isinstance(value, Tensor) and how[name] in ("sum", "mean"):
                dtype = torch.int64 if value.dtype == torch.bool else value.dtype
                self.shapes[name] = tuple(value.shape[1:])
                self.columns[name] = torch.zeros((math.prod(value.shape[1:]), n), dtype=dtype, device=device)
            elif isinstance(value, Tensor):
                self.counted[name] = torch.zeros(n, dtype=torch.int32, device=device)
        # Counts of bool messages ride along as one more column of the float sums' pass where that is
        # exact: a target has at most n_sources pairs, an integer float32 holds exactly below 2**24.
        floats = [c.dtype for c in self.columns.values() if c.is_floating_point()]
        exact = bool(floats) and (floats[0] == torch.float64 or n_sources < 2**24)
        self.count_dtype = floats[0] if exact else torch.int32
        if self.count_dtype != torch.int32:
            self.counted = {name: c.to(self.count_dtype) for name, c in self.counted.items()}
        needs_count = any(h == "mean" or (h == "count" and name not in self.counted) for name, h in how.items())
        self.count = torch.zeros(n, dtype=torch.int64, device=device) if needs_count else None

    def add(self, messages: dict[str, MessageValue], t: Tensor, start: int, stop: int) -> None:
        """Add one chunk's messages (``t``: ``[m]`` target minus ``start``) into targets ``start .. stop``."""
        outs: dict[torch.dtype, tuple[list[Tensor], list[Tensor]]] = {}
        for name, columns in self.columns.items():
            value = messages[name]
            assert isinstance(value, Tensor)
            flat = value.reshape(value.shape[0], columns.shape[0])
            if flat.dtype == torch.bool:
                flat = flat.to(torch.int64)
            into, values = outs.setdefault(flat.dtype, ([], []))
            for k in range(columns.shape[0]):
                into.append(columns[k, start:stop])
                values.append(flat[:, k] if flat[:, k].is_contiguous() else flat[:, k].contiguous())
        for name, counts in self.counted.items():
            value = messages[name]
            assert isinstance(value, Tensor)
            into, values = outs.setdefault(self.count_dtype, ([], []))
            into.append(counts[start:stop])
            values.append(value.to(self.count_dtype))
        for into, values in outs.values():
            ops.scatter_add_columns_(into, t, values)
        if self.count is not None:
            self.count[start:stop] = torch.bincount(t, minlength=stop - start)

    def result(self) -> dict[str, Tensor]:
        return _assemble(self.how, self.columns, self.shapes, self.counted, self.count, self.n)


def _assemble(how: dict[str, str], columns: dict[str, Tensor], shapes: dict[str, tuple[int, ...]],
              counted: dict[str, Tensor], count: Tensor | None, n: int) -> dict[str, Tensor]:
    """Each message's result from summed columns (``[k, n]`` per summed message), counts of bool
    messages (``[n]``) and pair counts (``[n]``, for means and counts of every pair): results are
    ``[n, ...]`` views of the columns (column-major), counts int32, means the sum over the count
    (0 with no pairs; integers floor-divided).
    """
    out: dict[str, Tensor] = {}
    for name, kind in how.items():
        if kind == "count":
            if name in counted:
                out[name] = counted[name].to(torch.int32)
                continue
            assert count is not None
            out[name] = count.to(torch.int32)
            continue
        shape = shapes[name]
        total = columns[name][0] if not shape else columns[name].t().reshape(n, *shape)
        if kind == "mean":
            assert count is not None
            per = count.clamp(min=1).view(-1, *([1] * (total.dim() - 1)))
            total = (total / per.to(total.dtype) if total.is_floating_point()
                     else torch.div(total, per, rounding_mode="floor"))
        out[name] = total
    return out

