"""Region geometry of the spatial partitioner (agentsim.distributed.regions), without a process group:
tiling, ownership, balanced cuts, and halo destinations against brute force."""

from __future__ import annotations

import pytest
import torch

from agentsim.distributed import regions as geo
from agentsim.space.continuous import Box
from agentsim.space.grid import Grid

W = 4


def box_points(n: int, extent: tuple[float, float], seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.rand(n, 2, generator=g, dtype=torch.float64) * torch.tensor(extent, dtype=torch.float64)


def regions_for(layout: str, coords: torch.Tensor, extent: tuple[float, float], periodic: bool,
                discrete: bool = False) -> geo.Regions:
    """The regions the partitioner would compute for these points (rcb: from their histogram)."""
    if layout != "rcb":
        return geo.uniform(extent, W, layout, discrete, periodic)
    ex, ey = geo.bin_edges(extent[0], 256, discrete), geo.bin_edges(extent[1], 256, discrete)
    return geo.bisection(geo.histogram(coords, ex, ey), ex, ey, W, extent, periodic)


@pytest.mark.parametrize("layout", ["strips", "blocks", "rcb"])
def test_regions_tile_the_extent_and_every_point_has_one_owner(layout):
    extent = (80.0, 50.0)
    coords = box_points(500, extent, seed=1)
    reg = regions_for(layout, coords, extent, periodic=True)
    area = (reg.hi - reg.lo).clamp(min=0).prod(-1).sum()
    assert torch.isclose(area, torch.tensor(extent[0] * extent[1], dtype=torch.float64))
    owner = geo.owner_of(reg, coords)
    inside = torch.stack([geo.contains(reg, r, len(coords), lambda a: coords[:, a]) for r in range(W)])
    assert torch.equal(inside.sum(0), torch.ones(len(coords), dtype=torch.int64))  # exactly one region each
    assert torch.equal(inside.to(torch.int64).argmax(0), owner)
    counts = torch.bincount(owner, minlength=W)
    if layout == "rcb":  # bisection of the points: near-equal counts
        assert counts.max() / counts.float().mean() < 1.1


@pytest.mark.parametrize("layout", ["strips", "blocks"])
def test_balanced_cuts_even_out_a_crowded_start(layout):
    extent = (100.0, 100.0)
    coords = box_points(4000, (25.0, 25.0), seed=2)  # every point in one corner
    edges = geo.bin_edges(extent[0], 1024, False)
    ey = geo.bin_edges(extent[1], 256, False)
    if layout == "strips":
        hist = geo.histogram(coords, edges, torch.tensor([0.0, extent[1]], dtype=torch.float64))
        reg = geo.balanced(hist, edges, ey, W, layout, extent, False)
    else:
        ex = geo.bin_edges(extent[0], 256, False)
        reg = geo.balanced(geo.histogram(coords, ex, ey), ex, ey, W, layout, extent, False)
    counts = torch.bincount(geo.owner_of(reg, coords), minlength=W)
    assert counts.max() / counts.float().mean() < 1.1, counts


def test_factor_and_nearest_cut():
    assert [geo.factor(w) for w in (1, 2, 3, 4, 6, 8, 9)] == [(1, 1), (2, 1), (3, 1), (2, 2), (3, 2), (4, 2),
                                                             (3, 3)]
    counts = torch.tensor([1, 1, 1, 7])
    assert geo.nearest_cut(counts, 0.5) == 3 and geo.nearest_cut(counts, 0.0) == 0
    assert geo.bin_edges(5.0, 1024, discrete=True).tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]


@pytest.mark.parametrize("layout", ["strips", "blocks", "rcb"])
@pytest.mark.parametrize("periodic", [True, False])
def test_halo_destinations_are_exactly_the_points_within_reach_of_a_region(layout, periodic):
    """Against brute force: the distance from each point to each region over all 9 images."""
    extent = (120.0, 90.0)
    c = box_points(400, extent, seed=3)
    reg = regions_for(layout, c, extent, periodic)
    reach = 10.0
    L = torch.tensor(extent, dtype=torch.float64)
    shifts = [(a, b) for a in (-1, 0, 1) for b in (-1, 0, 1)] if periodic else [(0, 0)]
    for rank in range(W):
        row, dest = geo.halo_destinations(reg, c, "length", reach, rank)
        got = set(zip(row.tolist(), dest.tolist(), strict=True))
        want = set()
        for r in range(W):
            lo, hi = reg.lo[r], reg.hi[r]
            if r == rank or not (hi > lo).all():
                continue
            d = torch.stack([(torch.maximum(torch.minimum(c + torch.tensor(s) * L, hi), lo)
                              - (c + torch.tensor(s) * L)).norm(dim=-1) for s in shifts]).amin(0)
            want |= {(i, r) for i in torch.nonzero(d <= reach).squeeze(-1).tolist()}
        assert want <= got, (rank, sorted(want - got))  # nobody within reach is missed
        assert len(got - want) <= 2, got - want  # only the safety margin adds points
        # The path the partitioner takes: points near the border first, then the exact test.
        limit = geo.halo_limit(reach, extent)
        near = torch.nonzero(geo.border_distance(reg, rank, len(c), lambda a: c[:, a]) <= limit).squeeze(-1)
        row2, dest2 = geo.halo_destinations(reg, c[near], "length", reach, rank)
        assert set(zip(near[row2].tolist(), dest2.tolist(), strict=True)) == got, rank


@pytest.mark.parametrize("layout", ["strips", "blocks", "rcb"])
@pytest.mark.parametrize("radius", [1, 2])
@pytest.mark.parametrize("periodic", [True, False])
def test_moore_halo_destinations_are_exactly_the_cells_within_radius(layout, radius, periodic):
    """Against brute force: Chebyshev distance (with wrap on a torus) from every cell to every
    cell of each other region."""
    grid = Grid((13, 11), periodic=periodic)
    cells = torch.arange(grid.n_cells)
    c = grid.region_coords(cells)
    reg = regions_for(layout, c, grid.region_extent, periodic, discrete=True)
    owner = geo.owner_of(reg, c)
    rc = c.to(torch.int64)
    diff = (rc[:, None, :] - rc[None, :, :]).abs()
    if periodic:
        diff = torch.minimum(diff, torch.tensor([13, 11]) - diff)
    cheb = diff.amax(-1)
    for rank in range(W):
        row, dest = geo.halo_destinations(reg, c, "moore", float(radius), rank)
        got = set(zip(row.tolist(), dest.tolist(), strict=True))
        want = set()
        for r in range(W):
            in_r = owner == r
            if r != rank and in_r.any():
                want |= {(i, r) for i in torch.nonzero((cheb[:, in_r] <= radius).any(1)).squeeze(-1).tolist()}
        assert got == want, (rank, sorted(want - got), sorted(got - want))
        near = torch.nonzero(geo.border_distance(reg, rank, len(c), lambda a: c[:, a], last=-1)
                             <= geo.halo_limit(float(radius), grid.region_extent)).squeeze(-1)
        row2, dest2 = geo.halo_destinations(reg, c[near], "moore", float(radius), rank)
        assert set(zip(near[row2].tolist(), dest2.tolist(), strict=True)) == want, rank


def test_region_coordinates_of_the_three_spaces():
    box = Box((10.0, 6.0, 4.0))
    pos = torch.tensor([[1.0, 2.0, 3.0]], dtype=torch.float32)
    assert box.region_coords(pos).tolist() == [[1.0, 2.0]] and box.region_extent == (10.0, 6.0)
    grid = Grid((3, 5))
    assert grid.region_coords(torch.tensor([7])).tolist() == [[1.0, 2.0]] and grid.region_extent == (3.0, 5.0)
    assert grid.region_coords(torch.tensor([7]), axis=1).tolist() == [2.0]
