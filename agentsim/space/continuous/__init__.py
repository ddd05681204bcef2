"""Continuous 2D/3D boxes and radius neighbor search with a cell list.

Modules: :mod:`.box` (the :class:`Box`: wrap, displacement), :mod:`.cells` (the
:class:`CellGrid` of a box for a radius) and :mod:`.search` (:func:`radius_pairs`,
:func:`radius_pair_chunks`, :class:`NeighborList`).

A :class:`Box` is the domain ``[0, L_0) x ... x [0, L_{d-1})`` with ``d`` in
``{2, 3}``, either periodic (positions wrap, distances use the minimum image) or
bounded (positions are clamped into ``[0, L]``, distances are Euclidean).

:func:`radius_pairs` returns every pair ``(i, j)`` of rows with
``|displacement(pos[i], pos[j])| <= radius``, where the targets ``i`` are the
first ``n_query`` rows and the sources ``j`` are all rows. :class:`NeighborList`
wraps it in fixed-capacity buffers, allocated apart from the update, in the
manner of ``jax_md.partition``: an update that needs more room records
``did_overflow``, grows, and never truncates.

Canonical order (the contract that makes results identical on any number of
ranks): the pairs are grouped by target in ascending ``i``; the sources of one
target come in an order that depends only on the sources' positions and uids,
not on the row order of ``pos`` and not on which other agents are present.
It is built from a global cell grid aligned to the box (see :class:`CellGrid`):

1. sources are sorted by ``(cell id, uid)``;
2. for each target the neighbor-cell offsets are visited in one fixed order,
   lexicographic over ``{-1, 0, 1}^d``; a periodic dim with fewer than 3 cells
   maps several offsets to one cell, and only the first such offset is kept,
   so no pair appears twice;
3. within a cell the sources come in ascending uid; those within ``radius``
   are kept.

The search is fully vectorized (no Python loop over agents or cells). Cell ids
are row-major, so the neighbor cells of one target that differ only in the
last dim hold one contiguous run of sorted sources. In a periodic box each
row of cells gets ghost cells at both ends holding copies of the sources of
the row's last and first cell, so the run stays contiguous, and in canonical
order, across the wrap (cell ``n-1`` before cell ``0``). Run bounds are looked up per
(target, leading offset) in a dense per-cell table built with ``bincount``,
or by ``searchsorted`` when the grid has many more cells than agents, and a
cumulative sum lays the candidates out directly in canonical order, so the
output needs no sort. Targets are processed in blocks of at most ``2**17``
segments and chunks of at most about ``2**18`` candidates on CPU (``2**24`` on
accelerators), which keeps the temporaries in cache; candidate indices are
int32 where the rows allow it.

Distances are compared as ``(d * d).sum(-1) <= radius * radius`` with ``d`` the
(minimum-image) displacement in the dtype of ``pos``, the same arithmetic as
:meth:`Box.displacement`. Cell coordinates are computed in float64. The one
pair the cell list can miss is one the test accepts only through rounding
(true distance above ``radius`` by an ulp) when the cell side equals the
radius exactly and the two agents sit two cells apart.

Examples:
    >>> import torch
    >>> box = Box((10.0, 10.0), periodic=True)
    >>> pos = torch.tensor([[0.1, 5.0], [9.9, 5.0], [5.0, 5.0]])
    >>> i, j = radius_pairs(pos, box, radius=1.0)
    >>> i.tolist(), j.tolist()
    ([0, 1], [1, 0])
    >>> nl = NeighborList(box, radius=1.0)
    >>> pairs = nl.update(pos)
    >>> pairs.n_pairs, nl.capacity >= 2
    (2, True)
"""

from __future__ import annotations

from agentsim.space.continuous.box import Box
from agentsim.space.continuous.cells import CellGrid
from agentsim.space.continuous.search import NeighborList, PairChunk, Pairs, radius_pair_chunks, radius_pairs

__all__ = ["Box", "CellGrid", "NeighborList", "PairChunk", "Pairs", "radius_pair_chunks", "radius_pairs"]
