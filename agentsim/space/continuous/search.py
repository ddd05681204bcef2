"""Radius neighbor search in canonical order (see :mod:`agentsim.space.continuous`)."""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from typing import NamedTuple

import numpy as np
import torch
from torch import Tensor

from agentsim._native import kernels as cpu_kernels
from agentsim.core.ops import flatnonzero
from agentsim.errors import ConfigError, FieldAccessError
from agentsim.space.continuous.box import Box, min_image
from agentsim.space.continuous.cells import CellGrid, check_radius

__all__ = ["NeighborList", "PairChunk", "Pairs", "radius_pair_chunks", "radius_pairs"]

# Candidate pairs materialized at once. On CPU, small enough that the ~20
# elementwise passes over them stay in cache and reuse allocator blocks: 2**20
# ran 4x faster than 2**25 on a 3D search (200k agents, ~30 neighbors, one
# thread) and 1.3x on 2D (1M agents). 2**18 (2 MB per int64 temporary, about
# a per-core L2 cache here) beat 2**20 again: 4.4 s against 5.2 s on that 3D
# search, and 290 ms against 340 ms on 500k boids -- with a second process
# running the same search on the other core too, where 2**20 lost more to the
# shared L3 (medians of interleaved repeats on the 2-core machine).
# Accelerators want fewer, larger kernels: each chunk launches some 150 kernels, and with
# the CPU's block sizes 1M circles (3D) took 69 chunks, 11.7k launches and 148 ms a step
# on an H100, most of it waiting on launches (43 ms of GPU time). 2**25 candidates is
# about 1 GB of temporaries.
_MAX_CANDIDATES = 2**18
_MAX_CANDIDATES_ACCELERATOR = 2**25
# (target, leading offset) segments per block of targets: [segment, target] index
# tables of at most 1 MB. On 1M boids (one thread) blocks of 2**16 to 2**18 segments
# were within noise of each other and 2**20 was about 10% slower.
_MAX_SEGMENTS = 2**17
_MAX_SEGMENTS_ACCELERATOR = 2**22


@dataclass
class Pairs:
    """Target / source pairs in canonical order.

    Attributes:
        i: ``[n_pairs]`` int64 target rows (receivers), ascending.
        j: ``[n_pairs]`` int64 source rows (senders).
        n_query: Number of target rows (the first ``n_query`` rows of pos).
        n_source: Number of source rows (all rows of pos).
    """

    i: Tensor
    j: Tensor
    n_query: int
    n_source: int

    @property
    def n_pairs(self) -> int:
        """Number of pairs."""
        return int(self.i.shape[0])


def _check_inputs(
    pos: Tensor, box: Box, uid: Tensor | None, n_query: int | None
) -> tuple[Tensor | None, int]:
    if not isinstance(pos, Tensor) or pos.dim() != 2 or pos.shape[1] != box.ndim:
        got = tuple(pos.shape) if isinstance(pos, Tensor) else type(pos).__name__
        raise ConfigError(f"Expected pos of shape [n, {box.ndim}] (got {got}).")
    if not pos.is_floating_point():
        raise ConfigError(f"Expected a floating-point pos (got {pos.dtype}).")
    n = pos.shape[0]
    if uid is not None:
        if not isinstance(uid, Tensor) or tuple(uid.shape) != (n,):
            got = tuple(uid.shape) if isinstance(uid, Tensor) else type(uid).__name__
            raise ConfigError(f"Expected uid of shape [{n}] like pos (got {got}).")
        if uid.is_floating_point() or uid.is_complex() or uid.dtype == torch.bool:
            raise ConfigError(f"Expected an integer uid (got {uid.dtype}).")
        if uid.device != pos.device:
            raise ConfigError(
                f"Expected uid on the device of pos, {pos.device} (got {uid.device})."
            )
        uid = uid.to(torch.int64)
    if n_query is None:
        n_query = n
    if not (0 <= int(n_query) <= n):
        raise ConfigError(f"Expected 0 <= n_query <= n = {n} (got {n_query}).")
    return uid, int(n_query)


class PairChunk(NamedTuple):
    """The pairs of the targets ``start .. stop - 1``, all of them (see :func:`radius_pair_chunks`).

    Attributes:
        start, stop: Target rows ``[start, stop)``.
        i: ``[m]`` target rows (each in ``[start, stop)``), ascending; int64, or int32
            when asked for (``index_dtype``) and every row fits.
        j: ``[m]`` source rows, the dtype of ``i``.
        delta: ``[d, m]`` displacement ``pos[j] - pos[i]`` (minimum image when periodic),
            one contiguous row per dim, in the dtype of ``pos`` (length units): the bits
            :meth:`Box.displacement` gives. None unless asked for (``with_delta=True``).
        dist2: ``[m]`` squared distances ``sum_k delta[k] ** 2`` (added in dim order), or
            None unless asked for.
    """

    start: int
    stop: int
    i: Tensor
    j: Tensor
    delta: Tensor | None = None
    dist2: Tensor | None = None


# Per leading dim, per offset: (neighbor row of each cell coordinate, inside a bounded box or None);
# the first and one-past-last padded cell of the last dim's neighborhood of each coordinate.
_GridTables = tuple[list[list[tuple[Tensor, Tensor | None]]], Tensor, Tensor]


class _SortedSources(NamedTuple):
    """The sources of a radius search laid out by padded cell (see :func:`_sort_sources`)."""

    order: Tensor  # [n_entries] source row of each sorted entry (ghost copies included)
    below: Callable[[Tensor], Tensor]  # padded cell ids -> entries sorted before each cell
    ccols: list[Tensor]  # d x [n] cell coordinates of every row
    width: int  # padded cells per row of the last dim (its cells and two ghosts)
    it: torch.dtype  # index dtype of rows, cells and candidates


def _sort_sources(pos: Tensor, box: Box, grid: CellGrid, uid: Tensor | None) -> _SortedSources:
    """Sort the sources by (padded cell, uid).

    Sources are laid out by "padded cell": each row of cells along the last dim gets a ghost cell
    before its first cell holding copies of its last cell's sources, and (with 3+ cells) one after
    its last cell holding copies of its first cell's, when periodic. A target's neighbor cells in
    one row are then one contiguous run of padded cells, in canonical order even across the
    periodic wrap: one segment per leading-dim offset (3 in 2D, 9 in 3D).
    """
    device = pos.device
    n = pos.shape[0]
    n_last = grid.shape[-1]
    ghost_before = box.periodic
    ghost_after = box.periodic and grid.dim_offsets()[-1][-1] == 1
    width = n_last + 2
    n_pcells = (grid.n_cells // n_last) * width
    # Index dtype of rows, cells and candidates: int32 where they fit (half the memory
    # traffic of int64, and faster gathers).
    it = torch.int32 if max(3 * n, n_pcells) < 2**31 - 1 else torch.int64
    ccols = grid.coord_columns(pos, it)  # d x [n] cell coordinates
    lead_row = ccols[0]
    for k in range(1, box.ndim - 1):
        lead_row = lead_row * grid.shape[k] + ccols[k]
    row_base = lead_row * width  # [n] padded id of each source's row
    pcid = [row_base + ccols[-1] + 1]  # real cells at 1 .. n_last
    rows = [torch.arange(n, dtype=it, device=device)]
    if ghost_before:
        g = flatnonzero(ccols[-1] == n_last - 1)
        rows.append(g.to(it))
        pcid.append(row_base.index_select(0, g))
    if ghost_after:
        g = flatnonzero(ccols[-1] == 0)
        rows.append(g.to(it))
        pcid.append(row_base.index_select(0, g) + (n_last + 1))
    entry_row = torch.cat(rows) if len(rows) > 1 else rows[0]  # [n_entries] source row
    entry_cell = torch.cat(pcid) if len(pcid) > 1 else pcid[0]  # [n_entries] padded cell
    entry_uid = None if uid is None else uid.index_select(0, entry_row)
    # Sources sorted by (padded cell, uid): order[p] is the row of sorted entry p. On the CPU, with
    # few cells per entry, one counting sort gives the order and the table of cell starts.
    counted = None
    below: Callable[[Tensor], Tensor]
    if _LOOKUP in (None, "table") and n_pcells <= _table_budget(entry_cell.shape[0]):
        counted = cpu_kernels.cell_sort(entry_cell, entry_uid, n_pcells)
    if counted is not None:
        perm, table = counted
        below = partial(torch.index_select, table, 0)
    else:
        perm = _source_order(entry_cell, entry_uid, n_pcells)
        below = _cell_counter(entry_cell, perm, n_pcells, width, it)
    return _SortedSources(entry_row.index_select(0, perm), below, ccols, width, it)


def _segment_ranges(grid: CellGrid, src: _SortedSources, tables: _GridTables, t0: int, t1: int,
                    n_seg: int) -> tuple[Tensor, Tensor, Tensor]:
    """For targets ``t0 .. t1``: the first sorted entry and the number of entries of each of their
    segments (``[n_seg, T]`` each, targets contiguous) and the candidates per target ``[T]``.
    """
    lead, lo_of, hi_of = tables
    ccols, it, width = src.ccols, src.it, src.width
    # Per leading-offset combination, in canonical (lexicographic) order: the neighbor row, [T];
    # and whether it is inside a bounded box. Everything is laid out [segment, target], targets
    # contiguous, so every operation runs over long vectors.
    bases: list[Tensor | None] = [None]
    valids: list[Tensor | None] = [None]
    for k, per_offset in enumerate(lead):
        c = ccols[k][t0:t1]
        nb_rows = [(tab.index_select(0, c), None if ok is None else ok.index_select(0, c)) for tab, ok in per_offset]
        bases = [row if b is None else b * grid.shape[k] + row for b in bases for row, _ in nb_rows]
        valids = [ok if v is None else (v if ok is None else v & ok) for v in valids for _, ok in nb_rows]
    cy = ccols[-1][t0:t1]
    lo_t, hi_t = lo_of.index_select(0, cy), hi_of.index_select(0, cy)
    lo = torch.empty((n_seg, t1 - t0), dtype=it, device=cy.device)
    hi = torch.empty_like(lo)
    for r, (b, ok) in enumerate(zip(bases, valids, strict=True)):
        assert b is not None
        b = b * width
        torch.add(b, lo_t, out=lo[r])
        torch.add(b, hi_t, out=hi[r])
        if ok is not None:  # a row outside a bounded box holds nothing
            lo[r] *= ok
            hi[r] *= ok
    start = src.below(lo.view(-1)).view(lo.shape)
    cnt = src.below(hi.view(-1)).view(hi.shape).sub_(start)
    return start, cnt, cnt.sum(0, dtype=it)


def _candidate_bounds(per_target: Tensor, max_candidates: int) -> list[int]:
    """Cut points (relative target indices, from 0 to T) of sub-chunks of at most about
    ``max_candidates`` candidates each.
    """
    bounds = [0]
    if int(per_target.sum()) > max_candidates:
        csum = torch.cumsum(per_target, 0)
        marks = torch.arange(max_candidates, int(csum[-1]), max_candidates, device=per_target.device)
        cuts = torch.searchsorted(csum, marks.to(csum.dtype), right=True).tolist()
        bounds += [k for k in cuts if 0 < k < per_target.shape[0]]
    bounds.append(per_target.shape[0])
    return bounds


def _iter_pair_chunks(
    pos: Tensor,
    box: Box,
    radius: float,
    uid: Tensor | None,
    n_query: int,
    include_self: bool,
    max_candidates: int | None = None,
    with_delta: bool = False,
    index_dtype: torch.dtype = torch.int64,
) -> Iterator[PairChunk]:
    """Yield chunks of consecutive targets whose pairs, concatenated, are in canonical order.

    Cell ids are row-major, so the neighbor cells that differ only in the last
    dim are adjacent ids and their sorted sources one contiguous range, in the
    canonical order already; ghost cells (:func:`_sort_sources`) keep it contiguous across a
    periodic wrap. Each target therefore has one segment per offset of the
    leading dims (3 in 2D, 9 in 3D) instead of one per neighbor cell (9 or 27).
    """
    device = pos.device
    if pos.shape[0] == 0 or n_query == 0:
        return
    if max_candidates is None:
        max_candidates = _MAX_CANDIDATES if device.type == "cpu" else _MAX_CANDIDATES_ACCELERATOR
    grid = CellGrid(box, radius)
    src = _sort_sources(pos, box, grid, uid)
    out_it = src.it if index_dtype == torch.int32 else torch.int64  # of the pairs' rows
    # Per-dim contiguous columns: 1D gathers are several times faster than
    # gathering rows of a [n, d] tensor.
    cols = [pos[:, k].contiguous() for k in range(box.ndim)]
    scols = [c.index_select(0, src.order) for c in cols]  # sorted sources
    tables = _grid_tables(grid.shape, tuple(grid.dim_offsets()), box.periodic, device, src.it)
    n_seg = math.prod(len(per_offset) for per_offset in tables[0])  # segments per target
    block = max(1, (_MAX_SEGMENTS if device.type == "cpu" else _MAX_SEGMENTS_ACCELERATOR) // n_seg)
    r2 = radius * radius
    for t0 in range(0, n_query, block):
        t1 = min(n_query, t0 + block)
        start, cnt, per_target = _segment_ranges(grid, src, tables, t0, t1, n_seg)
        for c0, c1 in itertools.pairwise(_candidate_bounds(per_target, max_candidates)):
            if c1 <= c0:
                continue
            yield PairChunk(t0 + c0, t0 + c1, *_expand(
                cols, scols, src.order, box, r2, include_self, t0 + c0,
                start[:, c0:c1], cnt[:, c0:c1], per_target[c0:c1], with_delta, src.it, out_it,
            ))


_LOOKUP: str | None = None  # tests force "table", "rows" or "search"


def _table_budget(n_entries: int) -> int:
    """The most cells a table over every cell may have for ``n_entries`` entries."""
    return 8 * n_entries + 4096


def _cell_counter(entry_cell: Tensor, perm: Tensor, n_pcells: int, width: int,
                  it: torch.dtype) -> Callable[[Tensor], Tensor]:
    """``below(c)``: the number of entries in padded cells ``< c``, for ``c`` ``[...]`` ``it`` in
    ``[0, n_pcells]`` (a run of padded cells ``lo .. hi`` holds the sorted entries
    ``below(lo) .. below(hi + 1) - 1``).

    Three ways, the same counts: a table over every padded cell when cells are few per
    entry; else a table over the rows of cells (``width`` padded cells each) that hold
    entries, plus the count of entries before each row, when those are few (a small
    population in a large box, such as a rank's border agents); else a binary search of
    the sorted cells.

    Args:
        entry_cell: ``[E]`` ``it`` padded cell of every entry; ``perm``: ``[E]`` the entries
            sorted by cell.
    """
    device = entry_cell.device
    budget = _table_budget(entry_cell.shape[0])
    n_rows = n_pcells // width
    kind = _LOOKUP or ("table" if n_pcells <= budget else "rows" if n_rows < budget else "search")
    if kind == "rows":
        row = torch.div(entry_cell, width, rounding_mode="floor")
        per_row = torch.bincount(row, minlength=n_rows)
        held = flatnonzero(per_row > 0)
        k = held.shape[0]
        if (k + 1) * (width + 1) > budget and _LOOKUP is None:
            kind = "search"
        else:
            before = torch.zeros(n_rows + 1, dtype=it, device=device)  # entries in the rows before
            torch.cumsum(per_row, 0, dtype=it, out=before[1:])
            slot = torch.full((n_rows + 1,), k, dtype=it, device=device)  # row k: holds nothing
            slot[held] = torch.arange(k, dtype=it, device=device)
            key = slot.index_select(0, row) * (width + 1) + (entry_cell - row * width) + 1
            within = torch.bincount(key, minlength=(k + 1) * (width + 1)).view(k + 1, width + 1)
            within = within.cumsum(1, dtype=it).view(-1)  # [slot, o]: entries of the row in cells < o

            def below_rows(c: Tensor) -> Tensor:
                r = torch.div(c, width, rounding_mode="floor")
                return before.index_select(0, r) + within.index_select(
                    0, slot.index_select(0, r) * (width + 1) + (c - r * width))
            return below_rows
    if kind == "table":
        table = torch.zeros(n_pcells + 1, dtype=it, device=device)
        torch.cumsum(torch.bincount(entry_cell, minlength=n_pcells), 0, dtype=it, out=table[1:])
        return lambda c: table.index_select(0, c)
    skey = entry_cell.index_select(0, perm)
    return lambda c: torch.searchsorted(skey, c, out_int32=it == torch.int32)


def _stable_argsort(key: Tensor) -> Tensor:
    """``argsort(key, stable=True)`` (int64); on CPU by NumPy's, which is faster on the
    nearly sorted keys that a locality-sorted population gives.
    """
    if key.device.type == "cpu":
        return torch.from_numpy(np.argsort(key.numpy(), kind="stable"))
    return torch.argsort(key, stable=True)


def _source_order(cid: Tensor, uid: Tensor | None, n_cells: int) -> Tensor:
    """Rows sorted by ``(cell id, uid)``, ties (duplicate uids) in row order, ``[n]`` int64.

    One sort of the key ``cid * span + (uid - min uid)`` where it fits in int64, else a
    stable sort by uid, then by cell.
    """
    if uid is None:
        return _stable_argsort(cid)
    lo, hi = (int(v) for v in torch.aminmax(uid))
    span = hi - lo + 1
    if n_cells * span < 2**63:
        return _stable_argsort(cid.to(torch.int64) * span + (uid - lo))  # int64: no overflow
    by_uid = _stable_argsort(uid)
    return by_uid.index_select(0, _stable_argsort(cid.index_select(0, by_uid)))


@functools.lru_cache(maxsize=32)
def _grid_tables(shape: tuple[int, ...], dim_offsets: tuple[tuple[int, ...], ...], periodic: bool,
                 device: torch.device, dtype: torch.dtype) -> _GridTables:
    """The tables of a cell grid that every search on it uses, made once per grid.

    They depend on its shape alone, and a model searches the same grid every step (read only,
    never written):

    - per leading dim ``k`` and per offset ``o`` of it (in offset order): ``[shape_k]`` ``dtype``,
      the neighbor coordinate ``c + o`` of each coordinate ``c`` (wrapped when periodic), and, for
      a bounded box, ``[shape_k]`` bool, whether ``c + o`` is in the box (None when periodic);
    - ``lo_of``, ``hi_of`` ``[shape_last]``: the padded cell run ``[lo, hi)`` of a target's
      neighbors within a row, by its last coordinate.
    """
    tables = []
    for n_k, offsets in zip(shape[:-1], dim_offsets[:-1], strict=True):
        c = torch.arange(n_k, dtype=dtype, device=device)
        per_offset: list[tuple[Tensor, Tensor | None]] = []
        for o in offsets:
            if periodic:
                per_offset.append((torch.remainder(c + o, n_k), None))
            else:
                per_offset.append(((c + o).clamp(min=0, max=n_k - 1), (c + o >= 0) & (c + o < n_k)))
        tables.append(per_offset)
    n_last, offsets_last = shape[-1], dim_offsets[-1]
    cy_all = torch.arange(n_last, dtype=dtype, device=device)
    if periodic:
        lo_of = cy_all + (1 + offsets_last[0])
        hi_of = cy_all + (2 + offsets_last[-1])
    else:
        lo_of = (cy_all + offsets_last[0]).clamp_(min=0) + 1
        hi_of = (cy_all + offsets_last[-1]).clamp_(max=n_last - 1) + 2
    return tables, lo_of, hi_of


def _expand(
    cols: list[Tensor],
    scols: list[Tensor],
    order: Tensor,
    box: Box,
    r2: float,
    include_self: bool,
    t0: int,
    start: Tensor,
    cnt: Tensor,
    per_target: Tensor,
    with_delta: bool = False,
    it: torch.dtype = torch.int64,
    out_it: torch.dtype = torch.int64,
) -> tuple[Tensor, ...]:
    """Candidates of targets ``t0 .. t0 + T - 1`` filtered by radius.

    ``cols`` / ``scols`` are the ``[n]`` position columns, one per dim, in row order
    and in sorted-source order. ``start`` / ``cnt`` ``[K, T]`` are each target's ``K``
    segments (starts and lengths in the sorted sources) in canonical order, and
    ``per_target`` ``[T]`` their sums: laying the segments end to end, target by target,
    gives the candidates already in canonical order. ``it`` is the dtype of the
    candidate indices (int32 when rows fit: half the memory traffic), ``out_it`` that of
    the returned rows. Temporaries are dropped as soon as they are used, so that later
    ones reuse their (cached) memory.
    Returns ``(i, j)``, or ``(i, j, delta [d, m], dist2 [m])`` when ``with_delta``.
    """
    device = cols[0].device
    total = int(per_target.sum())
    if total == 0:
        empty = torch.empty(0, dtype=out_it, device=device)
        if with_delta:
            return (empty, empty, cols[0].new_empty((len(cols), 0)), cols[0].new_empty(0))
        return empty, empty
    fused = cpu_kernels.radius_expand(cols, scols, order, box.size, box.periodic, r2, include_self, t0, start, cnt,
                                      per_target)  # on the CPU: one pass, the same pairs and bits
    if fused is not None:
        i, j, delta, dist2 = fused
        i, j = i.to(out_it), j.to(out_it)
        return (i, j, delta, dist2) if with_delta else (i, j)
    # Sorted-source index s of each candidate: one past the previous candidate's, except
    # at the first candidate of a segment, which jumps to the segment's start. Written as
    # a cumulative sum of steps; an empty segment begins where the next one does, and
    # the jumps added at one place telescope.
    t_end = torch.cumsum(per_target, 0, dtype=it)  # [T]
    seg_begin = torch.cumsum(cnt, 0, dtype=it).sub_(cnt).add_(t_end - per_target)  # [K, T]
    seg_end = start + cnt  # one past each segment's last source
    prev_end = torch.empty_like(start)  # the same for the segment before, in canonical order
    prev_end[1:] = seg_end[:-1]
    prev_end[0, 1:] = seg_end[-1, :-1]
    prev_end[0, 0] = 1  # s starts from 0: the first jump is start - 1
    step = torch.ones(total + 1, dtype=it, device=device)
    step.index_add_(0, seg_begin.reshape(-1), (start - prev_end).reshape(-1))
    s = torch.cumsum(step[:total], 0, dtype=it)
    del step
    # Target row of each candidate: t0, plus one at the end of each target's run.
    tstep = torch.zeros(total + 1, dtype=it, device=device)
    tstep.index_add_(0, t_end, torch.ones_like(per_target, dtype=it))
    tstep[0] += t0
    ti = torch.cumsum(tstep[:total], 0, dtype=it)
    del tstep
    # Same arithmetic as Box.displacement(pos[i], pos[j]), one dim at a time.
    d2: Tensor | None = None
    deltas = []
    for k, length in enumerate(box.size):
        d = scols[k].index_select(0, s)
        d -= cols[k].index_select(0, ti)
        if box.periodic:
            d = min_image(d, length, inplace=True)
        if with_delta:
            deltas.append(d)
            d = d * d
        else:
            d *= d
        d2 = d if d2 is None else d2.add_(d)
    assert d2 is not None
    keep = d2 <= r2
    j = order.index_select(0, s)
    del s
    if not include_self:
        keep &= j != ti
    idx = flatnonzero(keep)
    del keep
    i = ti.index_select(0, idx).to(out_it)
    del ti
    j = j.index_select(0, idx).to(out_it)
    if not with_delta:
        return i, j
    delta = deltas[0].new_empty((len(deltas), idx.shape[0]))
    for k, d in enumerate(deltas):
        torch.index_select(d, 0, idx, out=delta[k])
    del deltas
    return i, j, delta, d2.index_select(0, idx)


def radius_pair_chunks(
    pos: Tensor,
    box: Box,
    radius: float,
    uid: Tensor | None = None,
    n_query: int | None = None,
    include_self: bool = False,
    with_delta: bool = False,
    index_dtype: torch.dtype = torch.int64,
) -> Iterator[PairChunk]:
    """:func:`radius_pairs` in pieces that a per-target reduction can consume one at a time.

    Yields :class:`PairChunk` ``(start, stop, i, j, delta, dist2)``: the chunks cover the
    targets ``0 .. n_query - 1`` in order, each holds *every* pair of its targets
    (possibly none), and concatenating their ``i`` and ``j`` gives exactly
    :func:`radius_pairs`'s output. A sum over each target's pairs therefore comes out
    the same, bit for bit, computed per chunk; and a chunk (at most about 2**18
    candidates on CPU) stays in cache, where the whole pair list of a million agents
    does not.

    Args:
        pos, box, radius, uid, n_query, include_self: As for :func:`radius_pairs`.
        with_delta: Also return each pair's displacement and squared distance (the
            search computes them anyway; a model that needs them saves two gathers
            and the minimum image per dim).
        index_dtype: ``torch.int64`` (default) or ``torch.int32``, the dtype of ``i`` and
            ``j``. int32 halves the memory traffic of the rows where a model reads them
            several times (``index_select``, ``index_add_`` and ``bincount`` take it; int64
            all the same when the rows do not fit int32). Same rows either way.

    Raises:
        ConfigError: if shapes, dtypes, ``radius``, ``n_query`` or ``index_dtype`` are invalid.

    Examples:
        >>> import torch
        >>> box = Box((10.0, 10.0), periodic=True)
        >>> pos = torch.tensor([[0.1, 5.0], [9.9, 5.0], [5.0, 5.0]])
        >>> [(c.start, c.stop, c.i.tolist(), c.j.tolist()) for c in radius_pair_chunks(pos, box, 1.0)]
        [(0, 3, [0, 1], [1, 0])]
    """
    radius = check_radius(radius)
    uid, n_query = _check_inputs(pos, box, uid, n_query)
    if box.query_limit is not None and radius > box.query_limit[0]:
        raise FieldAccessError(f"{box.query_limit[1]} but searches radius {radius}: on several ranks the "
                               "agents beyond its reach are not there; declare a reach that covers the search")
    if index_dtype not in (torch.int64, torch.int32):
        raise ConfigError(f"index_dtype: expected torch.int64 or torch.int32 (got {index_dtype!r}).")
    if not (pos.requires_grad and torch.is_grad_enabled()):
        yield from _iter_pair_chunks(pos, box, radius, uid, n_query, include_self, with_delta=with_delta,
                                     index_dtype=index_dtype)
        return
    # A differentiable run: the search (which pairs) on the values; the displacements again
    # from ``pos`` with autograd, by the same arithmetic (the same bits).
    for c in _iter_pair_chunks(pos.detach(), box, radius, uid, n_query, include_self, with_delta=False,
                               index_dtype=index_dtype):
        if with_delta:
            delta = _differentiable_delta(pos, box, c.i, c.j)
            dist2 = delta[0] * delta[0]
            for k in range(1, delta.shape[0]):
                dist2 = dist2 + delta[k] * delta[k]
            c = c._replace(delta=delta, dist2=dist2)
        yield c


def _differentiable_delta(pos: Tensor, box: Box, i: Tensor, j: Tensor) -> Tensor:
    """``[d, m]`` displacements ``pos[j] - pos[i]`` (minimum image when periodic), one dim at a
    time as the search computes them, with autograd (``pos`` ``[n, d]``; ``i``, ``j`` ``[m]`` rows).
    """
    rows = []
    for k, length in enumerate(box.size):
        d = pos[:, k].index_select(0, j) - pos[:, k].index_select(0, i)
        rows.append(min_image(d, length) if box.periodic else d)
    return torch.stack(rows)


def radius_pairs(
    pos: Tensor,
    box: Box,
    radius: float,
    uid: Tensor | None = None,
    n_query: int | None = None,
    include_self: bool = False,
) -> tuple[Tensor, Tensor]:
    """All pairs of rows within ``radius``, in canonical order.

    Returns every ``(i, j)`` with ``|displacement(pos[i], pos[j])| <= radius``,
    ``i < n_query``, ``j`` any row and ``i != j`` unless ``include_self``.
    Pairs are grouped by ascending ``i``; the sources of one target are ordered
    by (neighbor-cell offset, uid), which depends only on the sources'
    positions and uids (see the module docstring).

    Args:
        pos: Positions, ``[n, box.ndim]`` float (length units). Periodic
            positions may lie outside the box (they are wrapped for the cell
            lookup); bounded ones should lie in ``[0, L]``.
        box: The box.
        radius: Search radius, positive (length units).
        uid: Global agent ids, ``[n]`` integer, unique; default ``arange(n)``.
        n_query: Number of target rows (the first rows of ``pos``); default n.
        include_self: Whether to include the pairs ``(i, i)``.

    Returns:
        ``(i, j)``: two ``[n_pairs]`` int64 tensors of target and source rows.

    Raises:
        ConfigError: if shapes, dtypes, ``radius`` or ``n_query`` are invalid.

    Examples:
        >>> import torch
        >>> box = Box((4.0, 4.0), periodic=False)
        >>> pos = torch.tensor([[0.0, 0.0], [0.5, 0.0], [3.0, 3.0]])
        >>> i, j = radius_pairs(pos, box, radius=1.0, n_query=1)
        >>> i.tolist(), j.tolist()
        ([0], [1])
    """
    chunks = list(radius_pair_chunks(pos, box, radius, uid, n_query, include_self))
    if not chunks:
        empty = torch.empty(0, dtype=torch.int64, device=pos.device)
        return empty, empty.clone()
    if len(chunks) == 1:
        return chunks[0].i, chunks[0].j
    return torch.cat([c.i for c in chunks]), torch.cat([c.j for c in chunks])


class NeighborList:
    """Radius neighbor pairs in fixed-capacity buffers.

    Allocation is separate from update, as in ``jax_md.partition``: the
    ``[capacity]`` int64 buffers are allocated on the first :meth:`update`
    (sized from the data as ``ceil(n_pairs * growth)`` when ``capacity`` is
    None) and reused afterwards. When an update finds more pairs than
    ``capacity`` it sets :attr:`did_overflow`, grows the buffers to at least
    ``n_pairs * growth``, counts the regrowth in :attr:`n_reallocations`, and
    fills the new buffers: pairs are never silently truncated.

    The :class:`Pairs` returned are views into the buffers: the next update
    overwrites them (``clone()`` what must outlive it).

    Args:
        box: The box.
        radius: Search radius, positive (length units).
        capacity: Initial pair capacity, or None to size from the first update.
        growth: Factor (>= 1) applied to the needed size when (re)allocating.
        include_self: Whether to include the pairs ``(i, i)``.

    Attributes:
        did_overflow: Whether the last update needed more than the capacity
            it started with (and reallocated).
        n_reallocations: Number of regrowths so far (the first allocation
            from data is not counted).

    Examples:
        >>> import torch
        >>> nl = NeighborList(Box((10.0, 10.0)), radius=2.0, capacity=1)
        >>> pairs = nl.update(torch.tensor([[1.0, 1.0], [2.0, 1.0], [1.0, 2.0]]))
        >>> pairs.n_pairs, nl.did_overflow, nl.n_reallocations
        (6, True, 1)
    """

    def __init__(
        self,
        box: Box,
        radius: float,
        capacity: int | None = None,
        growth: float = 1.5,
        include_self: bool = False,
    ) -> None:
        if not isinstance(box, Box):
            raise ConfigError(f"Expected a Box (got {type(box).__name__}).")
        self.box = box
        self.radius = check_radius(radius)
        CellGrid(box, self.radius)  # validates the grid size once, up front
        if capacity is not None and (
            isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1
        ):
            raise ConfigError(f"Expected capacity to be None or an int >= 1 (got {capacity!r}).")
        try:
            growth_f = float(growth)
        except (TypeError, ValueError):
            raise ConfigError(f"Expected growth >= 1.0 (got {growth!r}).") from None
        if not (math.isfinite(growth_f) and growth_f >= 1.0):
            raise ConfigError(f"Expected growth >= 1.0 (got {growth!r}).")
        self.growth = growth_f
        self.include_self = bool(include_self)
        self._capacity = capacity
        self._i: Tensor | None = None
        self._j: Tensor | None = None
        self.did_overflow = False
        self.n_reallocations = 0

    @property
    def capacity(self) -> int | None:
        """Current pair capacity (None before the first update sizes it)."""
        return self._capacity

    def _allocate(self, capacity: int, device: torch.device) -> None:
        self._capacity = capacity
        self._i = torch.empty(capacity, dtype=torch.int64, device=device)
        self._j = torch.empty(capacity, dtype=torch.int64, device=device)

    def update(
        self, pos: Tensor, uid: Tensor | None = None, n_query: int | None = None
    ) -> Pairs:
        """Recompute the pairs into the buffers.

        Args:
            pos: Positions, ``[n, box.ndim]`` float (length units).
            uid: Global agent ids, ``[n]`` integer; default ``arange(n)``.
            n_query: Number of target rows (the first rows); default n.

        Returns:
            :class:`Pairs` in canonical order (views into the buffers).
        """
        uid, n_query = _check_inputs(pos, self.box, uid, n_query)
        chunks = list(
            _iter_pair_chunks(pos, self.box, self.radius, uid, n_query, self.include_self)
        )
        n_pairs = sum(int(c.i.shape[0]) for c in chunks)
        self.did_overflow = False
        needed = max(1, math.ceil(n_pairs * self.growth))
        if self._capacity is None:
            self._allocate(needed, pos.device)
        elif n_pairs > self._capacity:
            self.did_overflow = True
            self.n_reallocations += 1
            self._allocate(max(needed, self._capacity + 1), pos.device)
        elif self._i is None or self._i.device != pos.device:
            self._allocate(self._capacity, pos.device)
        assert self._i is not None and self._j is not None
        at = 0
        for c in chunks:
            m = int(c.i.shape[0])
            self._i[at : at + m].copy_(c.i)
            self._j[at : at + m].copy_(c.j)
            at += m
        return Pairs(
            i=self._i[:n_pairs], j=self._j[:n_pairs], n_query=n_query, n_source=pos.shape[0]
        )
