"""Region geometry of the spatial partitioner, as pure functions (no process group needed).

A :class:`Regions` value holds one axis-aligned rectangle ``[lo, hi)`` per rank in the
region coordinates of a space (:meth:`Space.region_coords <agentsim.space.base.Space.region_coords>`),
tiling ``[0, L0) x [0, L1)``. The outer borders of the space are open: a bounded box clamps
positions into ``[0, L]``, so a point at ``L`` belongs to the last region. Layouts:

- :func:`uniform`: ``strips`` (equal strips along axis 0) or ``blocks`` (a ``px x py`` grid
  of equal blocks, :func:`factor`);
- :func:`bisection`: recursive coordinate bisection of a count histogram (``rcb``);
- :func:`balanced`: strips or blocks whose cuts split a count histogram evenly.

Cuts fall on histogram bin edges (:func:`bin_edges`), integers for discrete spaces, so every
rank computes the same borders from the same global histogram.

Examples:
    >>> import torch
    >>> regions = uniform((10.0, 4.0), 2, "strips", discrete=False, periodic=True)
    >>> regions.lo.tolist(), regions.hi.tolist()
    ([[0.0, 0.0], [5.0, 0.0]], [[5.0, 4.0], [10.0, 4.0]])
    >>> owner_of(regions, torch.tensor([[1.0, 1.0], [7.5, 3.0], [10.0, 0.0]], dtype=torch.float64)).tolist()
    [0, 1, 1]
    >>> row, dest = halo_destinations(regions, torch.tensor([[4.5, 2.0], [2.0, 2.0]], dtype=torch.float64),
    ...                               "length", 1.0, rank=0)
    >>> row.tolist(), dest.tolist()  # within 1.0 of region 1: the first point only
    ([0], [1])
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["LAYOUTS", "Regions", "balanced", "bin_edges", "bisection", "border_distance", "bordered_axes",
           "contains", "factor", "halo_destinations", "halo_limit", "halo_margin", "histogram", "nearest_cut",
           "owner_of", "uniform"]

LAYOUTS = ("strips", "blocks", "rcb")

Column = Callable[[int], Tensor]  # axis -> [n] float64 region coordinates of the points


@dataclass(frozen=True)
class Regions:
    """One rectangle ``[lo[r], hi[r])`` per rank in region coordinates.

    Attributes:
        lo, hi: ``[W, 2]`` float64 corners.
        extent: ``(L0, L1)``, the extent of the region coordinates.
        periodic: Whether coordinates wrap around.
    """

    lo: Tensor
    hi: Tensor
    extent: tuple[float, float]
    periodic: bool

    @property
    def world_size(self) -> int:
        """Number of regions (ranks)."""
        return int(self.lo.shape[0])


def factor(world_size: int) -> tuple[int, int]:
    """``(px, py)`` with ``px * py = W`` and ``px >= py``, as close to square as possible."""
    py = max(d for d in range(1, math.isqrt(world_size) + 1) if world_size % d == 0)
    return world_size // py, py


def nearest_cut(counts: Tensor, fraction: float) -> int:
    """Index ``k`` in ``[0, len(counts)]``: the cut (before bin k) whose count to the left is
    nearest ``fraction`` of the total (the first of equals).
    """
    cum = torch.cat([counts.new_zeros(1), torch.cumsum(counts, 0)])
    target = float(cum[-1]) * fraction
    return int(torch.argmin((cum.to(torch.float64) - target).abs()))


def bin_edges(length: float, bins: int, discrete: bool) -> Tensor:
    """``[b + 1]`` float64 histogram edges over ``[0, length]``: ``bins`` equal bins, or, for
    discrete coordinates, at most ``length`` bins with integer edges.
    """
    if discrete:
        edges: Tensor = torch.unique(torch.round(torch.linspace(0, length, min(bins, int(length)) + 1,
                                                                dtype=torch.float64)))
        return edges
    return torch.linspace(0, length, bins + 1, dtype=torch.float64)


def histogram(coords: Tensor, ex: Tensor, ey: Tensor) -> Tensor:
    """``[len(ex) - 1, len(ey) - 1]`` int64 counts of the points ``coords`` ``[n, 2]`` (float64) in
    the bins with edges ``ex``, ``ey`` (a point on an inner edge counts in the bin to its right;
    points beyond the outer edges in the first or last bin).
    """
    bx = torch.bucketize(coords[:, 0].contiguous(), ex[1:-1], right=True)
    by = torch.bucketize(coords[:, 1].contiguous(), ey[1:-1], right=True)
    shape = (len(ex) - 1, len(ey) - 1)
    return torch.bincount(bx * shape[1] + by, minlength=shape[0] * shape[1]).reshape(shape)


def _uniform_cuts(length: float, parts: int, discrete: bool) -> list[float]:
    cuts = [length * k / parts for k in range(parts + 1)]
    return [float(round(c)) for c in cuts] if discrete else cuts


def uniform(extent: tuple[float, float], world_size: int, layout: str, discrete: bool, periodic: bool) -> Regions:
    """Equal strips along axis 0 (``layout="strips"``) or a ``px x py`` grid of equal blocks."""
    px, py = (world_size, 1) if layout == "strips" else factor(world_size)
    xs = _uniform_cuts(extent[0], px, discrete)
    ys = _uniform_cuts(extent[1], py, discrete)
    lo = [[xs[i], ys[j]] for i in range(px) for j in range(py)]
    hi = [[xs[i + 1], ys[j + 1]] for i in range(px) for j in range(py)]
    return Regions(torch.tensor(lo, dtype=torch.float64), torch.tensor(hi, dtype=torch.float64), extent, periodic)


def bisection(hist: Tensor, ex: Tensor, ey: Tensor, world_size: int, extent: tuple[float, float],
              periodic: bool) -> Regions:
    """Recursive coordinate bisection of the counts ``hist`` ``[bx, by]`` (bin edges ``ex``, ``ey``):
    split the longer side at the bin edge nearest the share of the ranks on each side.
    """
    lo = torch.zeros(world_size, 2, dtype=torch.float64)
    hi = torch.zeros(world_size, 2, dtype=torch.float64)

    def split(ranks: list[int], b: list[int]) -> None:  # b = [i0, i1, j0, j1] bin ranges
        if len(ranks) == 1:
            r = ranks[0]
            lo[r] = torch.tensor([ex[b[0]], ey[b[2]]])
            hi[r] = torch.tensor([ex[b[1]], ey[b[3]]])
            return
        side = [float(ex[b[1]] - ex[b[0]]), float(ey[b[3]] - ey[b[2]])]
        axis = 0 if side[0] >= side[1] else 1
        if b[2 * axis + 1] - b[2 * axis] < 2 and b[3 - 2 * axis] - b[2 - 2 * axis] >= 2:
            axis = 1 - axis
        marginal = hist[b[0]:b[1], b[2]:b[3]].sum(1 - axis)
        w1 = len(ranks) // 2
        k = b[2 * axis] + nearest_cut(marginal, w1 / len(ranks))
        left, right = list(b), list(b)
        left[2 * axis + 1] = k
        right[2 * axis] = k
        split(ranks[:w1], left)
        split(ranks[w1:], right)

    split(list(range(world_size)), [0, len(ex) - 1, 0, len(ey) - 1])
    return Regions(lo, hi, extent, periodic)


def balanced(hist: Tensor, ex: Tensor, ey: Tensor, world_size: int, layout: str, extent: tuple[float, float],
             periodic: bool) -> Regions:
    """Strips (``hist`` ``[bx, 1]``) or blocks (``[bx, by]``) whose cuts split the counts evenly:
    columns at the quantiles of the column counts, then, within each column, rows at the
    quantiles of its row counts.
    """
    px, py = (world_size, 1) if layout == "strips" else factor(world_size)
    col = hist.sum(1)
    xk = [0] + [nearest_cut(col, i / px) for i in range(1, px)] + [len(ex) - 1]
    xk = [max(xk[: i + 1]) for i in range(len(xk))]
    lo, hi = [], []
    for i in range(px):
        rows = hist[xk[i]:xk[i + 1]].sum(0)
        yk = [0] + [nearest_cut(rows, j / py) for j in range(1, py)] + [len(ey) - 1]
        yk = [max(yk[: j + 1]) for j in range(len(yk))]
        for j in range(py):
            lo.append([float(ex[xk[i]]), float(ey[yk[j]]) if py > 1 else 0.0])
            hi.append([float(ex[xk[i + 1]]), float(ey[yk[j + 1]]) if py > 1 else extent[1]])
    return Regions(torch.tensor(lo, dtype=torch.float64), torch.tensor(hi, dtype=torch.float64), extent, periodic)


def bordered_axes(regions: Regions, rank: int) -> list[int]:
    """The axes along which ``rank``'s region does not span the whole extent."""
    return [a for a in (0, 1) if regions.lo[rank, a] > 0 or regions.hi[rank, a] < regions.extent[a]]


def contains(regions: Regions, rank: int, n: int, column: Column) -> Tensor:
    """``[n]`` bool: which points lie in region ``rank``, half-open ``[lo, hi)``. The outer borders
    are open, so only the axes where the region has a border are compared, and only they are
    asked of ``column(axis)`` (``[n]`` float64 coordinates).
    """
    lo, hi = regions.lo[rank].tolist(), regions.hi[rank].tolist()
    inside = torch.full((n,), hi[0] > lo[0] and hi[1] > lo[1], dtype=torch.bool)
    for axis in bordered_axes(regions, rank):
        v = column(axis)
        if lo[axis] > 0:
            inside &= v >= lo[axis]
        if hi[axis] < regions.extent[axis]:
            inside &= v < hi[axis]
    return inside


def owner_of(regions: Regions, coords: Tensor) -> Tensor:
    """``[n]`` int64 owner of the points ``coords`` ``[n, 2]``: the first region that contains each."""
    owner = torch.zeros(coords.shape[0], dtype=torch.int64)
    for r in reversed(range(regions.world_size)):
        owner.masked_fill_(contains(regions, r, coords.shape[0], lambda axis: coords[:, axis]), r)
    return owner


def border_distance(regions: Regions, rank: int, n: int, column: Column, last: int = 0) -> Tensor:
    """``[n]`` float64 distance from each point to the nearest border of ``rank``'s region, over the
    axes where it has borders: ``min(v - lo, hi + last - v)``; negative outside the region,
    ``inf`` if it has none (``last=-1``: cells, whose last one is ``hi - 1``).
    """
    lo, hi = regions.lo[rank].tolist(), regions.hi[rank].tolist()
    d = torch.full((n,), math.inf, dtype=torch.float64)
    for axis in bordered_axes(regions, rank):
        v = column(axis)
        d = torch.minimum(d, torch.minimum(v - lo[axis], hi[axis] + last - v))
    return d


def halo_margin(reach: float, extent: tuple[float, float]) -> float:
    """A small safety margin added to a length reach: extra halo agents never change results."""
    return reach * 1e-5 + 1e-6 * max(extent)


def halo_limit(reach: float, extent: tuple[float, float]) -> float:
    """Distance to a region border within which an agent may be within ``reach`` (plus the
    safety margin) of another region.
    """
    return reach + 2 * halo_margin(reach, extent)


def halo_destinations(regions: Regions, coords: Tensor, kind: str, reach: float, rank: int,
                      exclude: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """(row of ``coords``, destination rank) for every point of ``coords`` ``[n, 2]`` within
    ``reach`` of another rank's region: the distance to each region, over periodic images.

    Args:
        kind: ``"length"`` (Euclidean, plus :func:`halo_margin`) or ``"moore"`` (Chebyshev, in
            cells; a region's last cell is ``hi - 1``).
        rank: The sending rank, skipped as a destination.
        exclude: ``[n]`` int64: point ``k`` skips rank ``exclude[k]`` instead of ``rank``.
    """
    margin = halo_margin(reach, regions.extent)
    lo, hi = regions.lo[None], regions.hi[None]
    if kind == "moore":
        hi = hi - 1  # last cell of the region
    x = coords[:, None, :]
    d = torch.clamp(torch.maximum(lo - x, x - hi), min=0)
    if regions.periodic:
        # Coordinates and borders lie in [0, L]: the images x + L (right of hi) and x - L
        # (left of lo) are at distances x + L - hi and lo + L - x, so one pass covers all three.
        size = torch.tensor(regions.extent, dtype=torch.float64)
        d = torch.minimum(d, torch.minimum(x + size - hi, lo + size - x))
    if kind == "moore":
        near = d.amax(-1) <= reach
    else:
        near = (d * d).sum(-1) <= (reach + margin) ** 2
    near &= (regions.hi > regions.lo).all(-1)[None]
    if exclude is None:
        near[:, rank] = False
    else:
        near[torch.arange(coords.shape[0]), exclude] = False
    row, dest = torch.nonzero(near, as_tuple=True)
    return row, dest
