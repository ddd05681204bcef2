"""Tests of agentsim.space.grid against brute-force Python loops on small grids."""

from __future__ import annotations

import doctest
import itertools

import pytest
import torch

import agentsim.space.grid as grid_module
from agentsim.errors import ConfigError
from agentsim.space.grid import Grid

SHAPES = [(5, 7), (1, 1), (2, 3), (4, 1)]
KINDS = ["moore", "von_neumann"]


def ref_offsets(kind: str, radius: int, include_center: bool) -> list[tuple[int, int]]:
    out = []
    for dr in range(-radius, radius + 1):
        for dc in range(-radius, radius + 1):
            if kind == "moore" and max(abs(dr), abs(dc)) > radius:
                continue
            if kind == "von_neumann" and abs(dr) + abs(dc) > radius:
                continue
            if (dr, dc) == (0, 0) and not include_center:
                continue
            out.append((dr, dc))
    return out


def ref_neighbors(shape, periodic, kind, radius, include_center) -> list[list[int]]:
    h, w = shape
    rows = []
    for r in range(h):
        for c in range(w):
            row = []
            for dr, dc in ref_offsets(kind, radius, include_center):
                rr, cc = r + dr, c + dc
                if periodic:
                    row.append((rr % h) * w + cc % w)
                elif 0 <= rr < h and 0 <= cc < w:
                    row.append(rr * w + cc)
                else:
                    row.append(-1)
            rows.append(row)
    return rows


def test_doctests():
    result = doctest.testmod(grid_module)
    assert result.attempted > 0 and result.failed == 0


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("radius", [1, 2, 3])
@pytest.mark.parametrize("include_center", [False, True])
def test_offsets_match_reference(kind, radius, include_center):
    off = Grid((5, 7)).offsets(kind, radius, include_center)
    assert off.dtype == torch.int64
    assert [tuple(o) for o in off.tolist()] == ref_offsets(kind, radius, include_center)
    n = (2 * radius + 1) ** 2 if kind == "moore" else 2 * radius * (radius + 1) + 1
    assert off.shape == (n - (not include_center), 2)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("periodic", [True, False])
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("radius", [1, 2])
@pytest.mark.parametrize("include_center", [False, True])
def test_neighbor_cells_match_loops(shape, periodic, kind, radius, include_center):
    grid = Grid(shape, periodic=periodic)
    cells = torch.arange(grid.n_cells)
    got = grid.neighbor_cells(cells, kind, radius, include_center)
    assert got.dtype == torch.int64
    assert got.tolist() == ref_neighbors(shape, periodic, kind, radius, include_center)
    # Any shape of cells and int32 input work; rows are per cell.
    sub = torch.tensor([[0, grid.n_cells - 1]], dtype=torch.int32)
    assert torch.equal(grid.neighbor_cells(sub, kind, radius, include_center), got[sub.long()])


def test_neighbor_cells_corners_bounded():
    grid = Grid((5, 7), periodic=False)
    got = grid.neighbor_cells(torch.tensor([0, 6, 28, 34, 17]))
    # Moore r=1 order: (-1,-1) (-1,0) (-1,1) (0,-1) (0,1) (1,-1) (1,0) (1,1)
    assert got.tolist() == [
        [-1, -1, -1, -1, 1, -1, 7, 8],
        [-1, -1, -1, 5, -1, 12, 13, -1],
        [-1, 21, 22, -1, 29, -1, -1, -1],
        [26, 27, -1, 33, -1, -1, -1, -1],
        [9, 10, 11, 16, 18, 23, 24, 25],
    ]


def test_small_torus_keeps_duplicates():
    grid = Grid((2, 3), periodic=True)
    got = grid.neighbor_cells(torch.tensor([0]))
    # Rows -1 and +1 both wrap to row 1.
    assert got.tolist() == [[5, 3, 4, 2, 1, 5, 3, 4]]
    assert Grid((1, 1)).neighbor_cells(torch.tensor([0])).tolist() == [[0] * 8]


def ref_neighbor_sum(layer, shape, periodic, kind, radius, include_center):
    flat = layer.reshape(-1).tolist()
    out = []
    for row in ref_neighbors(shape, periodic, kind, radius, include_center):
        out.append(sum(flat[c] for c in row if c >= 0))
    return out


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("periodic", [True, False])
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("radius", [1, 2])
@pytest.mark.parametrize("include_center", [False, True])
def test_neighbor_sum_integer_exact(shape, periodic, kind, radius, include_center):
    grid = Grid(shape, periodic=periodic)
    g = torch.Generator().manual_seed(hash((shape, periodic, kind, radius)) % 2**31)
    layer = torch.randint(-(2**40), 2**40, shape, generator=g, dtype=torch.int64)
    got = grid.neighbor_sum(layer, kind, radius, include_center)
    assert got.dtype == torch.int64 and got.shape == shape
    assert got.reshape(-1).tolist() == ref_neighbor_sum(layer, shape, periodic, kind, radius, include_center)
    # Consistent with neighbor_cells (zero for -1).
    nb = grid.neighbor_cells(torch.arange(grid.n_cells), kind, radius, include_center)
    vals = torch.where(nb >= 0, layer.reshape(-1)[nb.clamp(min=0)], 0)
    assert torch.equal(vals.sum(1), got.reshape(-1))


@pytest.mark.parametrize("periodic", [True, False])
@pytest.mark.parametrize("kind", KINDS)
def test_neighbor_sum_float_and_batched(periodic, kind):
    grid = Grid((5, 7), periodic=periodic)
    g = torch.Generator().manual_seed(3)
    layer = torch.rand(3, 5, 7, generator=g, dtype=torch.float64)
    got = grid.neighbor_sum(layer, kind, radius=2)
    assert got.dtype == torch.float64 and got.shape == (3, 5, 7)
    for b in range(3):
        ref = torch.tensor(ref_neighbor_sum(layer[b], (5, 7), periodic, kind, 2, False), dtype=torch.float64)
        torch.testing.assert_close(got[b].reshape(-1), ref, rtol=1e-12, atol=1e-12)
    f32 = grid.neighbor_sum(layer.float(), kind)
    assert f32.dtype == torch.float32


def test_neighbor_sum_small_int_dtypes_do_not_overflow():
    grid = Grid((5, 7))
    layer = torch.full((5, 7), 127, dtype=torch.int8)
    got = grid.neighbor_sum(layer, radius=2, include_center=True)
    assert got.dtype == torch.int64
    assert torch.all(got == 127 * 25)
    ones = grid.neighbor_sum(torch.ones(5, 7, dtype=torch.bool))
    assert torch.all(ones == 8)


def test_neighbor_sum_inf_stays_local():
    grid = Grid((5, 7), periodic=False)
    layer = torch.zeros(5, 7)
    layer[0, 0] = float("inf")
    got = grid.neighbor_sum(layer)
    assert got[0, 0] == 0  # own value excluded, no inf - inf
    assert torch.isinf(got[1, 1]) and got[3, 3] == 0


def test_occupancy_matches_loop_count():
    grid = Grid((5, 7))
    g = torch.Generator().manual_seed(0)
    cells = torch.randint(0, grid.n_cells, (200,), generator=g)
    ref = [0] * grid.n_cells
    for c in cells.tolist():
        ref[c] += 1
    got = grid.occupancy(cells)
    assert got.dtype == torch.int64 and got.tolist() == ref
    w = torch.randint(0, 10, (200,), generator=g)
    refw = [0] * grid.n_cells
    for c, x in zip(cells.tolist(), w.tolist()):
        refw[c] += x
    assert grid.occupancy(cells, w).tolist() == refw
    wf = torch.rand(200, 2, generator=g, dtype=torch.float64)
    gotf = grid.occupancy(cells, wf)
    assert gotf.shape == (grid.n_cells, 2)
    torch.testing.assert_close(gotf.sum(0), wf.sum(0))
    assert grid.occupancy(torch.zeros(0, dtype=torch.int64)).tolist() == [0] * grid.n_cells


@pytest.mark.parametrize("periodic", [True, False])
def test_cell_index_and_coords_round_trip(periodic):
    grid = Grid((5, 7), periodic=periodic)
    rows, cols = zip(*itertools.product(range(5), range(7)))
    flat = grid.cell_index(torch.tensor(rows), torch.tensor(cols))
    assert torch.equal(flat, torch.arange(35))
    r, c = grid.coords(flat)
    assert r.tolist() == list(rows) and c.tolist() == list(cols)
    assert int(grid.cell_index(2, 3)) == 17
    outside = grid.cell_index(torch.tensor([-1, 5, 0]), torch.tensor([0, 0, 7]))
    assert outside.tolist() == ([28, 0, 0] if periodic else [-1, -1, -1])


def test_validation_errors():
    with pytest.raises(ConfigError, match=r"Expected shape to be a pair \(height, width\) \(got \(5,\)\)"):
        Grid((5,))
    with pytest.raises(ConfigError, match=r"Expected width \(shape\[1\]\) >= 1 \(got 0\)"):
        Grid((5, 0))
    with pytest.raises(ConfigError, match=r"Expected height \(shape\[0\]\) to be an int"):
        Grid((5.0, 3))
    with pytest.raises(ConfigError, match="Expected periodic to be a bool"):
        Grid((5, 3), periodic="yes")
    grid = Grid([5, 7])
    assert grid.shape == (5, 7)
    with pytest.raises(ConfigError, match=r"kind in \('moore', 'von_neumann'\) \(got 'hex'\)"):
        grid.offsets("hex")
    with pytest.raises(ConfigError, match="Perhaps you meant 'von_neumann'"):
        grid.neighbor_cells(torch.tensor([0]), kind="von_neuman")
    with pytest.raises(ConfigError, match=r"Expected radius >= 1 \(got 0\)"):
        grid.neighbor_sum(torch.zeros(5, 7), radius=0)
    with pytest.raises(ConfigError, match=r"Expected layer of shape \[\.\.\., 5, 7\] \(got \[7, 5\]\)"):
        grid.neighbor_sum(torch.zeros(7, 5))
    with pytest.raises(ConfigError, match="Expected cells to be an integer tensor"):
        grid.neighbor_cells(torch.tensor([0.5]))
    with pytest.raises(ConfigError, match=r"Expected weights of shape \[3, \.\.\.\]"):
        grid.occupancy(torch.tensor([0, 1, 2]), torch.ones(2))
    assert issubclass(ConfigError, ValueError)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("radius", [1, 3])
def test_neighbor_sum_integer_kernel_equals_torch_ops(torch_ops, kind, radius):
    """The one-pass kernel (rows split over threads, several grids) against the torch ops."""
    grid = Grid((37, 53))
    g = torch.Generator().manual_seed(radius)
    layer = torch.randint(-(2**40), 2**40, (3, 37, 53), generator=g, dtype=torch.int64)
    got = grid.neighbor_sum(layer, kind, radius)
    assert torch.equal(got, torch_ops(lambda: grid.neighbor_sum(layer, kind, radius)))
    assert torch.equal(got[1].reshape(-1), torch.tensor(ref_neighbor_sum(layer[1], (37, 53), True, kind, radius,
                                                                         False)))


@pytest.mark.parametrize("radius", [1, 2])
def test_neighbor_sum_float_periodic_adds_in_roll_order(radius):
    """Periodic float sums: the padded views add the same terms in the same order as rolling the
    layer once per offset did, so the same bits."""
    grid = Grid((9, 11))
    layer = torch.randn(2, 9, 11, generator=torch.Generator().manual_seed(radius), dtype=torch.float32) * 1e3
    span = range(-radius, radius + 1)

    def rolled(x, offsets):
        out = torch.zeros_like(x)
        for dr, dc in offsets:
            out += torch.roll(x, shifts=(-dr, -dc), dims=(-2, -1))
        return out

    expect = rolled(rolled(layer, [(d, 0) for d in span if d != 0]), [(0, d) for d in span])
    expect += rolled(layer, [(0, d) for d in span if d != 0])
    assert torch.equal(grid.neighbor_sum(layer, "moore", radius), expect)
