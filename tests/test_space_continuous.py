"""Tests of agentsim.space.continuous against an all-pairs brute force."""

from __future__ import annotations

import pytest
import torch

from agentsim.errors import ConfigError
from agentsim.space.continuous import Box, CellGrid, NeighborList, Pairs, radius_pair_chunks, radius_pairs


def _positions(box: Box, n: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Random positions plus agents exactly on 0 and just below L."""
    g = torch.Generator().manual_seed(seed)
    size = torch.tensor(box.size, dtype=torch.float64)
    pos = torch.rand(n, box.ndim, generator=g, dtype=torch.float64) * size
    # Border agents: on 0, and near L in the same dims, so wrap-around pairs exist.
    pos[0] = 0.0
    pos[1] = size - 0.05
    pos[2, 0] = 0.0
    pos[3, 0] = size[0] - 0.3
    pos[3, 1:] = pos[2, 1:]
    return pos.to(dtype)


def _brute(pos: torch.Tensor, box: Box, radius: float, n_query: int, include_self: bool = False):
    """All-pairs reference with the same dtype and formula as the search."""
    n = pos.shape[0]
    d = box.displacement(pos[:n_query, None, :], pos[None, :, :])
    keep = (d * d).sum(-1) <= radius * radius
    if not include_self:
        keep &= ~torch.eye(n_query, n, dtype=torch.bool)
    i, j = keep.nonzero(as_tuple=True)
    return i, j


def _uid_set(i, j, uid):
    return set(zip(uid[i].tolist(), uid[j].tolist()))


def _sequences(i, j, uid) -> dict[int, list[int]]:
    """For each target uid, the ordered list of its source uids."""
    out: dict[int, list[int]] = {}
    for a, b in zip(uid[i].tolist(), uid[j].tolist()):
        out.setdefault(a, []).append(b)
    return out


BOXES = [
    ((10.0, 10.0), True),
    ((10.0, 10.0), False),
    ((10.0, 7.0, 12.0), True),
    ((10.0, 7.0, 12.0), False),
]


@pytest.mark.parametrize("size,periodic", BOXES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("radius", [0.7, 1.9, 4.0, 6.0])
def test_radius_pairs_matches_brute_force(size, periodic, dtype, radius):
    box = Box(size, periodic=periodic)
    n = 300 if radius < 3 else 150  # large radii pair almost everything
    pos = _positions(box, n, dtype, seed=len(size) * 100 + int(radius * 10))
    uid = torch.randperm(n, generator=torch.Generator().manual_seed(1)) * 7 + 3
    i, j = radius_pairs(pos, box, radius, uid=uid)
    bi, bj = _brute(pos, box, radius, n)
    assert i.dtype == torch.int64 and j.dtype == torch.int64
    assert len(i) == len(j) == len(bi)
    assert _uid_set(i, j, uid) == _uid_set(bi, bj, uid)
    assert bool((i[1:] >= i[:-1]).all()), "targets must be ascending"
    assert bool((i != j).all())


def test_wrap_around_pairs_are_found():
    box = Box((10.0, 10.0))
    pos = torch.tensor([[0.0, 5.0], [9.95, 5.0], [5.0, 0.0], [5.0, 9.9], [0.0, 0.0], [9.9, 9.9]])
    for radius in (0.5, 4.0, 6.0):
        i, j = radius_pairs(pos, box, radius)
        pairs = set(zip(i.tolist(), j.tolist()))
        assert {(0, 1), (1, 0), (2, 3), (3, 2), (4, 5), (5, 4)} <= pairs
    # Unwrapped periodic positions (shifted by whole boxes) give the same pairs.
    i, j = radius_pairs(pos, box, 0.5)
    shift = torch.tensor([[10.0, -20.0]]) * torch.arange(6)[:, None]
    i2, j2 = radius_pairs(pos + shift, box, 0.5)
    assert torch.equal(i, i2) and torch.equal(j, j2)
    # Bounded: nothing wraps.
    i, j = radius_pairs(pos, Box((10.0, 10.0), periodic=False), 0.5)
    assert len(i) == 0


def test_few_cells_per_dim_have_no_duplicates():
    # Box 10, radius 4 -> 2 cells per dim; radius 6 -> 1 cell: offsets collapse.
    for radius, shape in ((4.0, (2, 2)), (6.0, (1, 1))):
        box = Box((10.0, 10.0))
        assert CellGrid(box, radius).shape == shape
        pos = _positions(box, 120, torch.float64, seed=5)
        i, j = radius_pairs(pos, box, radius)
        pairs = list(zip(i.tolist(), j.tolist()))
        assert len(pairs) == len(set(pairs))
        bi, bj = _brute(pos, box, radius, 120)
        assert set(pairs) == set(zip(bi.tolist(), bj.tolist()))


def test_include_self():
    box = Box((10.0, 10.0, 10.0), periodic=False)
    pos = _positions(box, 100, torch.float32, seed=3)
    i, j = radius_pairs(pos, box, 2.0, include_self=True)
    bi, bj = _brute(pos, box, 2.0, 100, include_self=True)
    assert set(zip(i.tolist(), j.tolist())) == set(zip(bi.tolist(), bj.tolist()))
    assert int((i == j).sum()) == 100


@pytest.mark.parametrize("periodic", [True, False])
def test_n_query_subset_of_targets(periodic):
    box = Box((10.0, 10.0, 10.0), periodic=periodic)
    pos = _positions(box, 300, torch.float32, seed=11)
    uid = torch.arange(300) + 1000
    i, j = radius_pairs(pos, box, 1.9, uid=uid, n_query=120)
    assert int(i.max()) < 120 and int(j.max()) >= 120
    bi, bj = _brute(pos, box, 1.9, 120)
    assert _uid_set(i, j, uid) == _uid_set(bi, bj, uid)


def _spec_order(pos, box, radius, uid, n_query):
    """The ordering contract written out literally, with Python loops."""
    import itertools

    grid = CellGrid(box, radius)
    coords = grid.coords(pos).tolist()
    cells: dict[tuple, list[int]] = {}
    for row, c in enumerate(coords):
        cells.setdefault(tuple(c), []).append(row)
    out_i, out_j = [], []
    for t in range(n_query):
        seen = set()
        for off in itertools.product((-1, 0, 1), repeat=box.ndim):
            c = [a + o for a, o in zip(coords[t], off)]
            if box.periodic:
                c = [a % n for a, n in zip(c, grid.shape)]
            elif any(a < 0 or a >= n for a, n in zip(c, grid.shape)):
                continue
            if tuple(c) in seen:
                continue
            seen.add(tuple(c))
            for s in sorted(cells.get(tuple(c), []), key=lambda r: int(uid[r])):
                d = box.displacement(pos[t], pos[s])
                if s != t and float((d * d).sum()) <= float(torch.tensor(radius * radius, dtype=pos.dtype)):
                    out_i.append(t)
                    out_j.append(s)
    return out_i, out_j


@pytest.mark.parametrize("size,periodic", BOXES)
@pytest.mark.parametrize("radius", [1.3, 4.0, 6.0])
def test_order_matches_the_contract_literally(size, periodic, radius):
    box = Box(size, periodic=periodic)
    pos = _positions(box, 80, torch.float64, seed=21)
    uid = torch.randperm(80, generator=torch.Generator().manual_seed(5)) * 11
    i, j = radius_pairs(pos, box, radius, uid=uid, n_query=60)
    ri, rj = _spec_order(pos, box, radius, uid, 60)
    assert i.tolist() == ri and j.tolist() == rj


def test_order_matches_the_contract_on_the_sparse_path():
    box = Box((3000.0, 2000.0))
    g = torch.Generator().manual_seed(6)
    pos = torch.rand(100, 2, generator=g, dtype=torch.float64) * 6.0
    pos[:30] = torch.remainder(-pos[:30], torch.tensor(box.size, dtype=torch.float64))
    uid = torch.randperm(100, generator=g)
    i, j = radius_pairs(pos, box, 1.5, uid=uid)
    ri, rj = _spec_order(pos, box, 1.5, uid, 100)
    assert len(ri) > 50
    assert i.tolist() == ri and j.tolist() == rj


@pytest.mark.parametrize("size,periodic", BOXES)
@pytest.mark.parametrize("radius", [1.9, 4.0, 6.0])
def test_order_is_canonical_under_row_shuffle(size, periodic, radius):
    box = Box(size, periodic=periodic)
    n = 300 if radius < 3 else 150
    pos = _positions(box, n, torch.float32, seed=7)
    uid = torch.randperm(n, generator=torch.Generator().manual_seed(2)) + 50
    i, j = radius_pairs(pos, box, radius, uid=uid)
    ref = _sequences(i, j, uid)
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(3))
    i2, j2 = radius_pairs(pos[perm], box, radius, uid=uid[perm])
    got = _sequences(i2, j2, uid[perm])
    assert got == ref
    # Targets are grouped in ascending row order of the input.
    assert i2.tolist() == sorted(i2.tolist())


@pytest.mark.parametrize("periodic", [True, False])
def test_order_is_unchanged_when_out_of_range_agents_are_dropped(periodic):
    box = Box((20.0, 20.0), periodic=periodic)
    n, radius = 300, 2.5
    pos = _positions(box, n, torch.float64, seed=9)
    uid = torch.arange(n) * 3
    i, j = radius_pairs(pos, box, radius, uid=uid)
    ref = _sequences(i, j, uid)
    # Chosen targets: rows within x < 8; keep everything within radius of them.
    chosen = (pos[:, 0] < 8.0).nonzero().flatten()
    d = box.distance(pos[chosen][:, None, :], pos[None, :, :])
    near = (d <= radius).any(0)
    keep_rows = (near | (torch.rand(n, generator=torch.Generator().manual_seed(4)) < 0.3))
    assert int((~keep_rows).sum()) > 30, "the test should actually drop agents"
    # Put the chosen targets first (a local block), the rest as sources only.
    others = keep_rows.clone()
    others[chosen] = False
    rows = torch.cat([chosen, others.nonzero().flatten()])
    i2, j2 = radius_pairs(pos[rows], box, radius, uid=uid[rows], n_query=len(chosen))
    got = _sequences(i2, j2, uid[rows])
    for t in uid[chosen].tolist():
        assert got.get(t, []) == ref.get(t, [])


@pytest.mark.parametrize("periodic", [True, False])
def test_chunked_search_gives_same_order(periodic, monkeypatch):
    from agentsim.space.continuous import search as continuous

    box = Box((10.0, 10.0, 10.0), periodic=periodic)
    pos = _positions(box, 300, torch.float32, seed=13)
    uid = torch.randperm(300, generator=torch.Generator().manual_seed(8))
    i, j = radius_pairs(pos, box, 1.5, uid=uid)
    # Blocks of 100 targets (18 segments each), split into ~500-candidate chunks.
    monkeypatch.setattr(continuous, "_MAX_SEGMENTS", 1800)
    chunks = list(
        continuous._iter_pair_chunks(pos, box, 1.5, uid, 300, False, max_candidates=500)
    )
    assert len(chunks) > 3 * 2
    assert torch.equal(torch.cat([c.i for c in chunks]), i)
    assert torch.equal(torch.cat([c.j for c in chunks]), j)
    # The chunks cover the targets in order, and hold every pair of their targets.
    assert [c.start for c in chunks] == [0] + [c.stop for c in chunks[:-1]] and chunks[-1].stop == 300
    assert all(bool(((c.i >= c.start) & (c.i < c.stop)).all()) for c in chunks)
    public = list(continuous.radius_pair_chunks(pos, box, 1.5, uid=uid, n_query=250))
    assert public[-1].stop == 250 and torch.equal(torch.cat([c.j for c in public]),
                                                  radius_pairs(pos, box, 1.5, uid=uid, n_query=250)[1])


def test_sparse_cell_lookup_matches_dense():
    # Many more cells than agents -> searchsorted path.
    box = Box((5000.0, 5000.0))
    assert CellGrid(box, 1.0).n_cells > 4 * 200 + 1_000_000
    g = torch.Generator().manual_seed(0)
    pos = torch.rand(200, 2, generator=g, dtype=torch.float64) * 30.0
    pos[:5] = 5000.0 - pos[:5]
    i, j = radius_pairs(pos, box, 3.0)
    bi, bj = _brute(pos, box, 3.0, 200)
    assert set(zip(i.tolist(), j.tolist())) == set(zip(bi.tolist(), bj.tolist()))


def test_empty_inputs():
    box = Box((10.0, 10.0))
    i, j = radius_pairs(torch.zeros(0, 2), box, 1.0)
    assert i.shape == (0,) and j.shape == (0,) and i.dtype == torch.int64
    i, j = radius_pairs(torch.rand(10, 2), box, 1.0, n_query=0)
    assert len(i) == 0


def test_neighbor_list_overflow_grows_without_truncation():
    box = Box((10.0, 10.0, 10.0))
    pos = _positions(box, 300, torch.float32, seed=17)
    nl = NeighborList(box, 2.0, capacity=1)
    pairs = nl.update(pos)
    assert isinstance(pairs, Pairs)
    assert nl.did_overflow and nl.n_reallocations == 1
    assert nl.capacity >= pairs.n_pairs * 1.5
    i, j = radius_pairs(pos, box, 2.0)
    assert torch.equal(pairs.i, i) and torch.equal(pairs.j, j)
    assert pairs.n_query == 300 and pairs.n_source == 300
    # Fits now: no overflow, no reallocation.
    pairs = nl.update(pos + 0.01)
    assert not nl.did_overflow and nl.n_reallocations == 1
    # Denser configuration overflows again and is still complete.
    dense = pos * 0.5
    pairs = nl.update(dense)
    bi, bj = _brute(dense, box, 2.0, 300)
    assert nl.did_overflow and nl.n_reallocations == 2
    assert set(zip(pairs.i.tolist(), pairs.j.tolist())) == set(zip(bi.tolist(), bj.tolist()))


def test_neighbor_list_allocates_from_data():
    box = Box((10.0, 10.0))
    pos = _positions(box, 200, torch.float64, seed=19)
    nl = NeighborList(box, 1.5)
    assert nl.capacity is None
    pairs = nl.update(pos, uid=torch.arange(200) + 9, n_query=150)
    assert nl.n_reallocations == 0 and not nl.did_overflow
    assert nl.capacity >= pairs.n_pairs
    bi, bj = _brute(pos, box, 1.5, 150)
    assert set(zip(pairs.i.tolist(), pairs.j.tolist())) == set(zip(bi.tolist(), bj.tolist()))


@pytest.mark.parametrize(
    "size,match",
    [
        ((10.0,), "2 or 3 side lengths"),
        ((1.0, 2.0, 3.0, 4.0), "2 or 3 side lengths"),
        ((10.0, 0.0), "positive finite Box side lengths"),
        ((10.0, -1.0), "positive finite Box side lengths"),
        ((10.0, float("inf")), "positive finite Box side lengths"),
        (("a", 1.0), "tuple of 2 or 3 numbers"),
    ],
)
def test_box_validation(size, match):
    with pytest.raises(ConfigError, match=match):
        Box(size)


def test_input_validation():
    box = Box((10.0, 10.0))
    with pytest.raises(ConfigError, match=r"Expected pos of shape \[n, 2\] \(got \(5, 3\)\)"):
        radius_pairs(torch.rand(5, 3), box, 1.0)
    with pytest.raises(ConfigError, match="positive finite radius"):
        radius_pairs(torch.rand(5, 2), box, 0.0)
    with pytest.raises(ConfigError, match="n_query"):
        radius_pairs(torch.rand(5, 2), box, 1.0, n_query=6)
    with pytest.raises(ConfigError, match="uid of shape"):
        radius_pairs(torch.rand(5, 2), box, 1.0, uid=torch.arange(4))
    with pytest.raises(ConfigError, match="integer uid"):
        radius_pairs(torch.rand(5, 2), box, 1.0, uid=torch.rand(5))
    with pytest.raises(ConfigError, match="capacity"):
        NeighborList(box, 1.0, capacity=0)
    with pytest.raises(ConfigError, match="growth"):
        NeighborList(box, 1.0, growth=0.5)


def test_box_wrap_and_displacement():
    box = Box((10.0, 8.0))
    assert box.ndim == 2
    a = torch.tensor([9.9, 7.9])
    b = torch.tensor([0.1, 0.1])
    assert torch.allclose(box.displacement(a, b), torch.tensor([0.2, 0.2]), atol=1e-5)
    assert torch.allclose(box.distance(a, b), torch.tensor(0.2 * 2**0.5), atol=1e-5)
    w = box.wrap(torch.tensor([[10.0, -0.5], [25.0, 8.5], [-1e-9, 3.0]]))
    assert torch.allclose(w, torch.tensor([[0.0, 7.5], [5.0, 0.5], [0.0, 3.0]]))
    assert bool((w < torch.tensor(box.size)).all()) and bool((w >= 0).all())
    # float32 remainder of a tiny negative number would give exactly L.
    w32 = box.wrap(torch.tensor([[-1e-9, -1e-9]], dtype=torch.float32))
    assert bool((w32 < torch.tensor([10.0, 8.0])).all())
    bounded = Box((10.0, 8.0), periodic=False)
    assert torch.allclose(bounded.displacement(a, b), torch.tensor([-9.8, -7.8]))
    assert torch.equal(
        bounded.wrap(torch.tensor([[11.0, -1.0]])), torch.tensor([[10.0, 0.0]])
    )
    assert Box([3, 4]).size == (3.0, 4.0)


@pytest.mark.parametrize("size,periodic", BOXES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_pair_chunks_with_delta_give_displacement_bits(size, periodic, dtype):
    # The search's displacement and squared distance are the bits Box.displacement gives.
    box = Box(size, periodic=periodic)
    pos = _positions(box, 400, dtype, seed=11)
    chunks = list(radius_pair_chunks(pos, box, 1.9, n_query=300, with_delta=True))
    i = torch.cat([c.i for c in chunks])
    j = torch.cat([c.j for c in chunks])
    ri, rj = radius_pairs(pos, box, 1.9, n_query=300)
    assert torch.equal(i, ri) and torch.equal(j, rj) and i.dtype == j.dtype == torch.int64
    ref = box.displacement(pos[i], pos[j])
    assert torch.equal(torch.cat([c.delta for c in chunks], 1).t(), ref)
    assert torch.equal(torch.cat([c.dist2 for c in chunks]), (ref * ref).sum(-1))
    assert all(c.delta is None and c.dist2 is None for c in radius_pair_chunks(pos, box, 1.9))


@pytest.mark.parametrize("size,periodic", BOXES)
@pytest.mark.parametrize("with_delta", [False, True])
def test_pair_chunks_with_int32_rows_give_the_same_chunks(size, periodic, with_delta, monkeypatch):
    # index_dtype=torch.int32 changes the dtype of i and j only: the same chunks, rows and
    # displacement bits as the int64 default (small chunks, so that there are many).
    from agentsim.space.continuous import search as continuous

    monkeypatch.setattr(continuous, "_MAX_CANDIDATES", 64)
    box = Box(size, periodic=periodic)
    pos = _positions(box, 400, torch.float32, seed=5)
    wide = list(radius_pair_chunks(pos, box, 1.9, n_query=300, with_delta=with_delta))
    narrow = list(radius_pair_chunks(pos, box, 1.9, n_query=300, with_delta=with_delta, index_dtype=torch.int32))
    assert len(wide) == len(narrow) > 3
    for a, b in zip(wide, narrow):
        assert (a.start, a.stop) == (b.start, b.stop)
        assert a.i.dtype == a.j.dtype == torch.int64 and b.i.dtype == b.j.dtype == torch.int32
        assert torch.equal(a.i, b.i.long()) and torch.equal(a.j, b.j.long())
        if with_delta:
            assert torch.equal(a.delta, b.delta) and torch.equal(a.dist2, b.dist2)
    ri, rj = radius_pairs(pos, box, 1.9, n_query=300)
    assert torch.equal(torch.cat([c.i for c in narrow]).long(), ri)
    assert torch.equal(torch.cat([c.j for c in narrow]).long(), rj)


def test_pair_chunks_reject_other_index_dtypes():
    pos = torch.rand(10, 2)
    with pytest.raises(ConfigError, match=r"index_dtype: expected torch.int64 or torch.int32 \(got torch.int16\)"):
        list(radius_pair_chunks(pos, Box((1.0, 1.0)), 0.1, index_dtype=torch.int16))


@pytest.mark.parametrize("size", [(10.0, 10.0), (10.0, 7.0, 12.0)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_wrap_and_cell_coords_match_the_broadcast_formulas(size, dtype):
    # wrap and coords work one dim at a time with scalar lengths; same bits as the formulas
    # with a [ndim] tensor of lengths.
    box = Box(size)
    g = torch.Generator().manual_seed(3)
    length = torch.tensor(size, dtype=dtype)
    pos = ((torch.rand(5000, len(size), generator=g, dtype=torch.float64) - 0.5) * 60).to(dtype)
    pos[:4] = torch.tensor([-1e-9, 0.0, -0.0, 1e-30], dtype=dtype)[:, None]
    pos[4] = length  # exactly L wraps to 0
    r = torch.remainder(pos, length)
    expected = torch.where(r >= length, torch.zeros_like(r), r)
    assert torch.equal(box.wrap(pos), expected)
    assert torch.equal(box.wrap(pos[::2]), expected[::2])  # strided input
    grid = CellGrid(box, 1.3)
    x64 = pos.to(torch.float64)
    r64 = torch.remainder(x64, torch.tensor(size, dtype=torch.float64))
    x64 = torch.where(r64 >= torch.tensor(size, dtype=torch.float64), torch.zeros_like(r64), r64)
    c = torch.floor(x64 / torch.tensor(grid.side, dtype=torch.float64)).to(torch.int64)
    c = torch.minimum(c.clamp(min=0), torch.tensor(grid.shape) - 1)
    assert torch.equal(grid.coords(pos), c)
    assert torch.equal(grid.cell_id(pos), grid.linear(c))


def test_source_order_without_room_for_a_combined_key(monkeypatch, torch_ops):
    # uids too large for the one-sort key (cell * uid span) fall back to two stable sorts (the
    # torch path; the CPU kernel's counting sort compares the uids themselves): same pairs.
    from agentsim.space.continuous import search as continuous

    sorts = []
    real = continuous._stable_argsort
    monkeypatch.setattr(continuous, "_stable_argsort", lambda key: sorts.append(1) or real(key))
    box = Box((50.0, 50.0))
    pos = _positions(box, 500, torch.float32, seed=5)
    uid = torch.randperm(500, generator=torch.Generator().manual_seed(0))
    small = torch_ops(lambda: radius_pairs(pos, box, 2.0, uid=uid))
    assert len(sorts) == 1
    huge = torch_ops(lambda: radius_pairs(pos, box, 2.0, uid=uid * 2**52))  # same order of uids
    assert len(sorts) == 3
    assert torch.equal(small[0], huge[0]) and torch.equal(small[1], huge[1])
    for got in (radius_pairs(pos, box, 2.0, uid=uid), radius_pairs(pos, box, 2.0, uid=uid * 2**52)):
        assert torch.equal(got[0], small[0]) and torch.equal(got[1], small[1])


@pytest.mark.parametrize("lookup", ["table", "rows", "search"])
@pytest.mark.parametrize("size,periodic", [((40.0, 30.0), True), ((40.0, 30.0), False), ((12.0, 9.0, 7.0), True),
                                           ((3000.0, 2000.0), True)])
def test_every_cell_lookup_gives_the_same_pairs(lookup, size, periodic, monkeypatch):
    """The three ways of counting entries per cell (a table of every cell, a table of the rows
    that hold entries, a binary search) give the same pairs in the same order, against brute force."""
    from agentsim.space.continuous import search as continuous

    box = Box(size, periodic=periodic)
    g = torch.Generator().manual_seed(len(size) + int(periodic))
    pos = _positions(box, 150, torch.float32, seed=31)
    if size[0] > 1000:  # a few crowded strips of a large box, across the periodic border
        pos[:, 0] = torch.remainder(torch.rand(150, generator=g) * 8.0 - 4.0, size[0])
    uid = torch.randperm(150, generator=g) * 3
    want = radius_pairs(pos, box, 2.5, uid=uid, n_query=110)
    bi, bj = _brute(pos, box, 2.5, 110)
    assert set(zip(want[0].tolist(), want[1].tolist())) == set(zip(bi.tolist(), bj.tolist()))
    monkeypatch.setattr(continuous, "_LOOKUP", lookup)
    got = radius_pairs(pos, box, 2.5, uid=uid, n_query=110)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
