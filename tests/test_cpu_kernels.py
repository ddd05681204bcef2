"""The compiled CPU kernels (agentsim._native.kernels) against torch ops and brute-force loops."""

from __future__ import annotations

import math
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from agentsim._native import build as native
from agentsim._native import kernels as cpu_kernels
from agentsim.core import ops
from agentsim.errors import ConfigError
from agentsim.space.graph import Graph


@pytest.fixture(scope="module")
def built():
    # with AGENTSIM_REQUIRE_KERNELS=1 (CI) a missing library raises here: the tests fail, not skip
    if cpu_kernels._kernels() is None:
        pytest.skip("the CPU kernels could not be built here (no C compiler)")


def _graph_with_a_hub(n: int = 9000, hub_degree: int = 6000) -> Graph:
    """A random graph plus one node linked to ``hub_degree`` others (a CSR run longer than the
    kernel's 4096-id buffer).
    """
    g = torch.Generator().manual_seed(5)
    src = torch.randint(0, n, (40_000,), generator=g)
    dst = torch.randint(0, n, (40_000,), generator=g)
    hub = torch.full((hub_degree,), 7)
    others = torch.randperm(n, generator=g)[:hub_degree]
    others = others[others != 7]
    src, dst = torch.cat([src, hub[:others.numel()]]), torch.cat([dst, others])
    keep = src != dst
    pairs = torch.unique(torch.stack([torch.minimum(src, dst), torch.maximum(src, dst)])[:, keep], dim=1)
    return Graph.from_edges(pairs[0], pairs[1], n)


def test_push_count_is_the_brute_force_count(built, torch_ops):
    graph = _graph_with_a_hub()
    nodes = torch.cat([torch.randperm(graph.n_nodes, generator=torch.Generator().manual_seed(2))[:3000],
                       torch.tensor([7, 7])])  # the hub, and a repeat (counted again)
    got = graph.count_neighbors_in(nodes)
    eager = torch_ops(lambda: graph.count_neighbors_in(nodes))
    assert got.dtype == eager.dtype == torch.int32
    assert torch.equal(got, eager)
    indptr, indices = graph.indptr.tolist(), graph.indices.tolist()
    expect = [0] * graph.n_nodes
    for u in nodes.tolist():
        for v in indices[indptr[u]:indptr[u + 1]]:
            expect[v] += 1
    assert got.tolist() == expect


def test_is_iota(built):
    assert cpu_kernels.is_iota(torch.arange(100_000)) is True
    assert cpu_kernels.is_iota(torch.arange(0)) is True
    for where in (0, 5, 99_999):
        x = torch.arange(100_000)
        x[where] += 1
        assert cpu_kernels.is_iota(x) is False
    assert cpu_kernels.is_iota(torch.arange(1, 10)) is False
    assert cpu_kernels.is_iota(torch.arange(10, dtype=torch.int32)) is None  # not the kernel's dtype
    assert cpu_kernels.is_iota(torch.arange(20)[::2]) is None  # not contiguous


def test_push_count_refuses_a_node_out_of_range(built):
    graph = _graph_with_a_hub(100, 10)
    with pytest.raises(IndexError, match="node id 100 out of range for a graph of 100 nodes"):
        graph.count_neighbors_in(torch.tensor([3, 100]))
    with pytest.raises(IndexError, match="node id -1"):
        graph.count_neighbors_in(torch.tensor([-1]))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_fixed_sum_is_the_bits_of_torch(built, dtype):
    g = torch.Generator().manual_seed(0)
    ties = torch.arange(-50, 50, dtype=torch.float64) * 2.0**-25  # x * 2**24 = k / 2: ties, half of them odd
    values = torch.cat([torch.randn(100_003, dtype=torch.float64, generator=g) * 1e3, ties,
                        torch.tensor([0.0, -0.0, 2.0**-30, -(2.0**-25), 1e9])]).to(dtype)
    for x in (values, values[:0], values.reshape(-1, 1)[::3]):  # empty, strided
        fused = cpu_kernels.fixed_sum(x, 24)
        assert fused is not None and fused.dtype == torch.int64
        assert int(fused) == int(ops.to_fixed(x.to(torch.float64), 24).sum())


def test_fixed_sum_blocks_with_large_values_and_any_thread_count(built):
    # most blocks take the vectorized path (|x * 2**24| < 2**51), a few hold one value in [2**51, 2**63)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(400_000, dtype=torch.float64, generator=g) * 1e4
    x[[5, 77_777, 300_001]] = torch.tensor([2.0**28 + 0.5, -(2.0**36) - 3.0, 2.0**27 * 3 + 2.0**-24 * 1.5],
                                        dtype=torch.float64)
    want = int(ops.to_fixed(x, 24).sum())
    threads = torch.get_num_threads()
    try:
        for t in (1, 2, 3):
            torch.set_num_threads(t)
            assert int(cpu_kernels.fixed_sum(x, 24)) == want
            assert int(cpu_kernels.fixed_sum(x.float(), 24)) == int(ops.to_fixed(x.float().double(), 24).sum())
    finally:
        torch.set_num_threads(threads)


def _checked_by_torch(x: torch.Tensor, limit: float) -> tuple[int, bool, float]:
    """The brute force of fixed_sum_checked: the torch sum, the magnitude check, sum(floor(|x|)) in float64."""
    v = x.to(torch.float64)
    total = int(ops.to_fixed(torch.nan_to_num(v, nan=0.0, posinf=0.0, neginf=0.0).clamp(-1e9, 1e9), 24).sum())
    invalid = bool((v.isnan() | (v.abs() >= limit)).any())
    return total, invalid, float(x.abs().floor().sum(dtype=torch.float64))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_fixed_sum_checked_is_the_sum_and_its_checks_on_any_thread_count(built, dtype):
    g = torch.Generator().manual_seed(2)
    limit = 2.0**38
    x = (torch.randn(300_001, dtype=torch.float64, generator=g) * 1e5).to(dtype)
    threads = torch.get_num_threads()
    try:
        for t in (1, 2, 3):
            torch.set_num_threads(t)
            for part in (x, x[:1000], x[:0], x[::7]):  # several threads' pieces, one, none, strided
                got = cpu_kernels.fixed_sum_checked(part, 24, limit)
                assert got is not None
                total, invalid, floors = _checked_by_torch(part, limit)
                assert (got.total, got.invalid, got.floors) == (total, invalid, floors)
                assert got.total == int(cpu_kernels.fixed_sum(part, 24))
            for bad in (float("nan"), float("inf"), -float("inf"), limit, -limit * 3):
                y = x.clone()
                y[123_456] = bad
                got = cpu_kernels.fixed_sum_checked(y, 24, limit)
                assert got is not None and got.invalid, (t, bad)
            y = x.clone()
            y[5] = float(torch.tensor(limit, dtype=dtype).nextafter(torch.tensor(0.0, dtype=dtype)))  # just below
            got = cpu_kernels.fixed_sum_checked(y, 24, limit)
            assert got is not None and not got.invalid
    finally:
        torch.set_num_threads(threads)


def test_fixed_sum_declines_what_it_does_not_cover():
    assert cpu_kernels.fixed_sum(torch.ones(3, dtype=torch.float16), 24) is None
    assert cpu_kernels.fixed_sum(torch.ones(3, requires_grad=True), 24) is None
    assert cpu_kernels.fixed_sum_checked(torch.ones(3, dtype=torch.float16), 24, 2.0**38) is None
    assert cpu_kernels.fixed_sum_checked(torch.ones(3, requires_grad=True), 24, 2.0**38) is None


def test_without_a_compiler_the_torch_ops_run_with_one_warning(tmp_path):
    code = ("import torch, warnings\n"
            "from agentsim.space.graph import erdos_renyi\n"
            "from agentsim.core import metrics\n"
            "with warnings.catch_warnings(record=True) as w:\n"
            "    warnings.simplefilter('always')\n"
            "    g = erdos_renyi(2000, 5.0, seed=1)\n"
            "    c = g.count_neighbors_in(torch.arange(0, 2000, 3))\n"
            "    s = metrics._exact_sum(torch.linspace(-3, 3, 1001))\n"
            "print(len([x for x in w if 'CPU kernel library' in str(x.message)]))\n"
            "torch.save((c, s), 'out.pt')")
    # AGENTSIM_KERNELS=cache: as an install without the install-time library
    env = {**os.environ, "CC": str(tmp_path / "no-such-cc"), "AGENTSIM_KERNEL_DIR": str(tmp_path / "k"),
           "AGENTSIM_KERNELS": "cache"}
    env.pop("AGENTSIM_REQUIRE_KERNELS", None)
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["1"]
    counts, total = torch.load(tmp_path / "out.pt")
    from agentsim.core import metrics
    from agentsim.space.graph import erdos_renyi

    assert torch.equal(counts, erdos_renyi(2000, 5.0, seed=1).count_neighbors_in(torch.arange(0, 2000, 3)))
    assert int(total) == int(metrics._exact_sum(torch.linspace(-3, 3, 1001)))


def test_csr_from_pair_chunks_is_build_csr(built):
    from agentsim.space.graph.network import build_csr

    g = torch.Generator().manual_seed(9)
    n = 3000
    u = torch.cat([torch.randint(0, n, (20_000,), generator=g), torch.full((500,), 5), torch.arange(40)])
    v = torch.cat([torch.randint(0, n, (20_000,), generator=g), torch.randint(0, 300, (500,), generator=g),
                   torch.arange(40)])  # a hub (row 5: > 32 entries, repeats) and 40 self-loops
    chunks = lambda: ((u[i:i + 4096], v[i:i + 4096]) for i in range(0, u.numel(), 4096))  # noqa: E731
    got = cpu_kernels.csr_from_pair_chunks(chunks, n)
    assert got is not None
    expect = build_csr(torch.stack([u, v]).contiguous(), n, None, ())
    assert torch.equal(got[0], expect.indptr)
    assert torch.equal(got[1], expect.indices) and got[1].dtype == torch.int32


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_csr_from_pair_chunks_on_threads_is_build_csr(built, monkeypatch, threads):
    """Counting, placing and sorting split over threads (atomic increments, rows filled in any
    order): the same CSR as the sorted-key build, whatever the number of threads."""
    from agentsim.space.graph.network import build_csr

    monkeypatch.setattr(cpu_kernels, "_PARALLEL_MIN", 500)  # small pieces: every step runs on `threads`
    before = torch.get_num_threads()
    g = torch.Generator().manual_seed(threads)
    n = 5000
    u = torch.cat([torch.randint(0, n, (60_000,), generator=g), torch.full((700,), 7)])
    v = torch.cat([torch.randint(0, n, (60_000,), generator=g), torch.randint(0, 200, (700,), generator=g)])
    chunks = lambda: ((u[i:i + 9000], v[i:i + 9000]) for i in range(0, u.numel(), 9000))  # noqa: E731
    try:
        torch.set_num_threads(threads)
        assert len(native.thread_ranges(9000, cpu_kernels._PARALLEL_MIN)) == threads
        got = cpu_kernels.csr_from_pair_chunks(chunks, n)
    finally:
        torch.set_num_threads(before)
    assert got is not None
    expect = build_csr(torch.stack([u, v]).contiguous(), n, None, ())
    assert torch.equal(got[0], expect.indptr) and torch.equal(got[1], expect.indices)


def test_erdos_renyi_is_the_same_graph_without_the_kernel(torch_ops):
    from agentsim.space.graph import erdos_renyi

    lean = erdos_renyi(20_000, 8.0, seed=4)
    sorted_keys = torch_ops(lambda: erdos_renyi(20_000, 8.0, seed=4))
    assert torch.equal(lean.indptr, sorted_keys.indptr) and torch.equal(lean.indices, sorted_keys.indices)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("size", [(7.25, 7.25), (3162.2776601683795, 1.0, 0.3)])
def test_box_move_gives_the_bits_of_add_then_wrap(built, torch_ops, dtype, size):
    """Every branch of the kernel's wrap (inside, one box over, just below 0, far away, a result
    that rounds to L) against remainder + masked_fill_, bit for bit."""
    from agentsim import Box

    box = Box(size)
    g = torch.Generator().manual_seed(len(size))
    n, d = 200_000, len(size)
    side = torch.tensor(size, dtype=torch.float64)
    pos = (torch.rand(n, d, generator=g, dtype=torch.float64) * side).to(dtype)
    scales = torch.tensor([1e-30, 1e-7, 0.1, 1.0, 3.0, 1e6], dtype=torch.float64)
    delta = (torch.randn(n, d, generator=g, dtype=torch.float64) * side
             * scales[torch.randint(0, 6, (n, 1), generator=g)]).to(dtype)
    delta[:5] = -pos[:5]  # exactly 0
    delta[5:10] = (side - pos[5:10].to(torch.float64)).to(dtype)  # about L
    delta[10:15] = -pos[10:15] - torch.tensor(1e-30, dtype=dtype)  # a tiny negative: rounds to L, then 0
    got = box.move(pos.clone(), delta)
    expect = torch_ops(lambda: box.move(pos.clone(), delta))
    assert torch.equal(expect, box.wrap(pos.clone().add_(delta)))
    assert torch.equal(got.view(torch.int64 if dtype == torch.float64 else torch.int32),
                       expect.view(torch.int64 if dtype == torch.float64 else torch.int32))
    assert bool(((got >= 0) & (got < side.to(dtype))).all())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_box_move_blocks_mostly_near_with_a_few_far_or_nan(built, torch_ops, dtype):
    """Steps of a tenth of a unit (the vectorized path for nearly every block) with a far jump,
    an inf and a NaN in a few blocks (those blocks again one entry at a time)."""
    from agentsim import Box

    box = Box((50.0, 20.0, 9.5))
    g = torch.Generator().manual_seed(3)
    n = 100_000
    pos = (torch.rand(n, 3, generator=g, dtype=torch.float64) * torch.tensor(box.size)).to(dtype)
    delta = (torch.randn(n, 3, generator=g, dtype=torch.float64) * 0.1).to(dtype)
    delta[1000, 1], delta[50_000, 0], delta[50_001, 2], delta[99_999, 2] = 1e5, float("inf"), float("nan"), -75.0
    got = box.move(pos.clone(), delta)
    expect = torch_ops(lambda: box.move(pos.clone(), delta))
    nan = torch.isnan(expect)
    assert torch.equal(torch.isnan(got), nan) and int(nan.sum()) == 2  # the inf and the NaN
    bits = torch.int64 if dtype == torch.float64 else torch.int32
    assert torch.equal(got[~nan].view(bits), expect[~nan].view(bits))


def test_box_move_in_place_and_bounded(built):
    from agentsim import Box

    pos = torch.tensor([[9.5, 0.5], [1.0, 1.0]])
    out = Box((10.0, 10.0)).move(pos, torch.tensor([[1.0, -1.0], [0.0, 0.0]]))
    assert out.data_ptr() == pos.data_ptr() and out.tolist() == [[0.5, 9.5], [1.0, 1.0]]
    strided = torch.tensor([[9.5, 0.0, 0.5]])[:, ::2]  # not contiguous: the torch ops
    assert Box((10.0, 10.0)).move(strided, torch.tensor([[1.0, -1.0]])).tolist() == [[0.5, 9.5]]
    bounded = torch.tensor([[9.5, 0.5]])
    assert Box((10.0, 10.0), periodic=False).move(bounded, torch.tensor([[1.0, -1.0]])).tolist() == [[10.0, 0.0]]
    assert bounded.tolist() == [[10.0, 0.0]]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("k", [1, 2, 3])
def test_squared_norm_gives_the_bits_of_the_torch_ops(built, torch_ops, dtype, k):
    g = torch.Generator().manual_seed(k)
    x = (torch.randn(150_000, k, generator=g, dtype=torch.float64)
         * 10 ** torch.randint(-20, 20, (150_000, 1), generator=g)).to(dtype)
    x[0] = -0.0
    before = x.clone()
    got = ops.squared_norm(x)
    eager = torch_ops(lambda: ops.squared_norm(x))
    d = x.to(torch.float64) ** 2
    brute = d[:, 0].clone()
    for j in range(1, k):
        brute = brute + d[:, j]
    assert got.dtype == torch.float64 and torch.equal(got, eager) and torch.equal(got, brute)
    assert torch.equal(x, before)  # the input is not touched (either path)


def test_squared_norm_refuses_bad_input():
    with pytest.raises(ValueError, match=r"expected a float \[n, k\] tensor"):
        ops.squared_norm(torch.ones(3))
    with pytest.raises(ValueError, match="int64"):
        ops.squared_norm(torch.ones(3, 2, dtype=torch.int64))
    grad = torch.ones(4, 2, requires_grad=True)
    ops.squared_norm(grad).sum().backward()  # differentiable off the kernel
    assert grad.grad is not None and torch.equal(grad.grad, torch.full((4, 2), 2.0))


def _search_positions(size: tuple[float, ...], n: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Random positions, plus agents on 0, on -0.0, just below L, and pairs at exactly the radius
    (1.5) and at a float32 rounding of it.
    """
    from agentsim.space.continuous import Box

    g = torch.Generator().manual_seed(seed)
    side = torch.tensor(size, dtype=torch.float64)
    pos = torch.rand(n, len(size), generator=g, dtype=torch.float64) * side
    pos[0] = 0.0
    pos[1] = -0.0
    pos[2] = side - 1e-6
    pos[3] = side / 2
    pos[4] = pos[3]
    pos[4, 0] += 1.5  # exactly the radius away
    pos[5] = pos[3]
    pos[5, 1] -= 1.5000000596046448  # float32(1.5 + a little): on the edge in float32, not in float64
    pos[6] = pos[0]
    pos[6, 0] = size[0] - 1.5  # across the periodic wrap, exactly the radius
    return Box(size, periodic=True).wrap(pos).to(dtype) if seed % 2 else pos.to(dtype)


@pytest.mark.parametrize("size,periodic", [((20.0, 20.0), True), ((20.0, 20.0), False), ((9.0, 7.0, 12.0), True),
                                           ((9.0, 7.0, 12.0), False), ((4.0, 4.0), True)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("threads", [1, 3])
def test_radius_search_kernel_gives_the_chunks_of_the_torch_ops(built, torch_ops, monkeypatch, size, periodic, dtype,
                                                               threads):
    # The compiled filter (radius_expand) against the torch ops: the same chunks, rows, row dtypes,
    # displacement and distance bits, with and without self pairs, on 1 and 3 threads (small
    # pieces: the threaded pieces are moved together); small chunks, so that there are many.
    from agentsim.space.continuous import Box, radius_pair_chunks
    from agentsim.space.continuous import search as continuous

    monkeypatch.setattr(continuous, "_MAX_CANDIDATES", 3000)
    monkeypatch.setattr(cpu_kernels, "_SEARCH_MIN", 40)
    box = Box(size, periodic=periodic)
    called = []
    real = cpu_kernels.radius_expand
    monkeypatch.setattr(cpu_kernels, "radius_expand", lambda *a: called.append(1) or real(*a))
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for seed in (1, 2):
            pos = _search_positions(size, 700, dtype, seed)
            uid = torch.randperm(700, generator=torch.Generator().manual_seed(seed)) * 3
            for include_self in (False, True):
                for index_dtype in (torch.int32, torch.int64):
                    def search(pos=pos, uid=uid, include_self=include_self, index_dtype=index_dtype):
                        return list(radius_pair_chunks(pos, box, 1.5, uid=uid, n_query=600, include_self=include_self,
                                                       with_delta=True, index_dtype=index_dtype))
                    got, want = search(), torch_ops(search)
                    assert len(got) == len(want) > 3
                    for a, b in zip(got, want, strict=True):
                        assert (a.start, a.stop) == (b.start, b.stop)
                        assert a.i.dtype == b.i.dtype == index_dtype and a.j.dtype == index_dtype
                        assert torch.equal(a.i, b.i) and torch.equal(a.j, b.j)
                        assert a.delta.dtype == a.dist2.dtype == dtype
                        assert torch.equal(a.delta, b.delta) and torch.equal(a.dist2, b.dist2)
                        # signed zeros too (torch.equal takes -0.0 == 0.0)
                        assert torch.equal(torch.signbit(a.delta), torch.signbit(b.delta))
    finally:
        torch.set_num_threads(before)
    assert called


def test_radius_search_kernel_keeps_pairs_at_the_float32_radius_as_torch_does(built, torch_ops):
    # float32 positions: a squared distance equal to float32(r2) but above r2 itself is kept
    # (torch compares a float32 tensor with a Python float in float32).
    from agentsim.space.continuous import Box, radius_pairs

    box = Box((10.0, 10.0), periodic=True)
    r = math.sqrt(0.0625 - 1e-12)  # r * r is below 0.25**2, float32(r * r) is 0.25**2
    assert r * r < 0.0625 and float(torch.tensor(r * r, dtype=torch.float32)) == 0.0625
    pos = torch.tensor([[5.0, 5.0], [5.25, 5.0], [5.1, 5.0], [9.9, 9.9]], dtype=torch.float32)
    got = radius_pairs(pos, box, r)
    want = torch_ops(lambda: radius_pairs(pos, box, r))
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
    assert (0, 1) in list(zip(got[0].tolist(), got[1].tolist()))  # 0.25 apart: kept


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("k", [1, 6, 11])  # 11: a call of 8 columns and one of 3
def test_scatter_sum_columns_gives_the_bits_of_index_add(built, torch_ops, dtype, index_dtype, k):
    # Each column in pair order, as index_add_ adds on the CPU and as a Python loop does: repeats
    # of an index, runs and jumps (sorted and shuffled parts), values of mixed magnitude, so that
    # another order would change the last bits.
    g = torch.Generator().manual_seed(k)
    index = torch.cat([torch.sort(torch.randint(0, 60, (3000,), generator=g)).values,
                       torch.randint(0, 60, (3000,), generator=g)]).to(index_dtype)
    cols = [(torch.randn(6000, generator=g, dtype=torch.float64)
             * 10.0 ** torch.randint(-6, 7, (6000,), generator=g)).to(dtype) for _ in range(k)]
    got = ops.scatter_sum_columns(cols, index, 60)
    want = torch_ops(lambda: ops.scatter_sum_columns(cols, index, 60))
    assert len(got) == k and all(g_.dtype == dtype and g_.shape == (60,) for g_ in got)
    for c, col in enumerate(cols):
        assert torch.equal(got[c], want[c])
        assert torch.equal(got[c], torch.zeros(60, dtype=dtype).index_add_(0, index, col))
    loop = [0.0] * 60
    for t, v in zip(index.tolist(), cols[-1].tolist(), strict=True):
        loop[t] = float(torch.tensor(loop[t], dtype=dtype) + torch.tensor(v, dtype=dtype))
    assert got[-1].tolist() == loop
    assert [t.tolist() for t in ops.scatter_sum_columns([c[:0] for c in cols], index[:0], 3)] == [[0.0] * 3] * k


def test_scatter_sum_columns_refuses_bad_input_and_adds_nothing(built):
    with pytest.raises(IndexError, match="index 4 is out of range for 4 targets"):
        ops.scatter_sum_columns([torch.ones(3), torch.ones(3)], torch.tensor([0, 4, 1]), 4)
    with pytest.raises(IndexError):
        ops.scatter_sum_columns([torch.ones(1)], torch.tensor([-1], dtype=torch.int32), 4)
    with pytest.raises(ConfigError, match="expected one or more value columns"):
        ops.scatter_sum_columns([], torch.tensor([0]), 1)
    with pytest.raises(ConfigError, match=r"1-D columns of one dtype, each of index's length 2"):
        ops.scatter_sum_columns([torch.ones(2), torch.ones(2, dtype=torch.float64)], torch.tensor([0, 1]), 2)
    with pytest.raises(ConfigError, match="index: expected an int32 or int64"):
        ops.scatter_sum_columns([torch.ones(2)], torch.tensor([0.0, 1.0]), 2)
    out = torch.zeros(4)
    with pytest.raises(IndexError):
        cpu_kernels.add_columns([out], torch.tensor([0, 9]), [torch.ones(2)])
    assert torch.equal(out, torch.zeros(4))  # checked before anything is added
    assert cpu_kernels.add_columns([torch.zeros(2, 2)], torch.tensor([0]), [torch.ones(1, 2)]) is False  # 2-D
    src = torch.ones(3, requires_grad=True)  # autograd: index_add_ per column
    (a,) = ops.scatter_sum_columns([src * 2.0], torch.tensor([1, 1, 0]), 2)
    a.sum().backward()
    assert src.grad.tolist() == [2.0, 2.0, 2.0]


@pytest.mark.parametrize("cell_dtype", [torch.int32, torch.int64])
def test_cell_sort_is_a_stable_sort_by_cell_and_uid(built, cell_dtype):
    # Against a brute-force sort of (cell, uid, entry): short runs (insertion sort) and long ones
    # (qsort of pairs), duplicate uids (ties in entry order), empty cells, no uid (by cell only).
    from agentsim.space.continuous import search as continuous

    g = torch.Generator().manual_seed(4)
    cell = torch.cat([torch.randint(0, 300, (2000,), generator=g), torch.full((500,), 17),
                      torch.full((40,), 299)])[torch.randperm(2540, generator=g)].to(cell_dtype)
    uid = torch.randint(0, 400, (2540,), generator=g)  # many duplicates
    for ids in (uid, None):
        perm, table = cpu_kernels.cell_sort(cell, ids, 310)
        keys = [(c, 0 if ids is None else u, e) for e, (c, u) in enumerate(zip(cell.tolist(), uid.tolist()))]
        assert perm.tolist() == [e for _, _, e in sorted(keys)]
        assert table.dtype == cell_dtype
        assert table.tolist() == [sum(1 for c in cell.tolist() if c < b) for b in range(311)]
        assert torch.equal(perm, continuous._source_order(cell, ids, 310))
    with pytest.raises(IndexError, match="cell 310 is out of range for 310 cells"):
        cpu_kernels.cell_sort(torch.tensor([3, 310], dtype=cell_dtype), None, 310)
    assert cpu_kernels.cell_sort(cell, uid.to(torch.int32), 310) is None  # ids not int64: torch


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("k", [1, 2, 3])
def test_sum_of_squares_is_the_exact_sum_of_squared_norm(built, torch_ops, monkeypatch, dtype, k):
    # One pass gives fixed_sum(squared_norm(x)) bit for bit: near-2**51 blocks (the fallback), a
    # NaN, any thread count (small pieces), and without the kernel.
    from agentsim.core.metrics import METRIC_FRAC_BITS, ExactSum, sum_of_squares

    monkeypatch.setattr(cpu_kernels, "_PARALLEL_MIN", 500)
    g = torch.Generator().manual_seed(k)
    x = (torch.randn(9000, k, generator=g, dtype=torch.float64) * 10.0 ** torch.randint(-4, 4, (9000, 1), generator=g))
    x[4000] = 2.0**14  # its square times 2**24 is above 2**51: that block is rounded with nearbyint
    x = x.to(dtype)
    want = ops.to_fixed(ops.squared_norm(x), METRIC_FRAC_BITS).sum()
    for threads in (1, 3):
        before = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            got = sum_of_squares(x)
        finally:
            torch.set_num_threads(before)
        assert isinstance(got, ExactSum) and got.n_values == 9000
        assert got.total.dtype == torch.int64 and int(got.total) == int(want)
    assert int(torch_ops(lambda: sum_of_squares(x)).total) == int(want)
    assert int(cpu_kernels.squared_norm_fixed_sum(x[:0], METRIC_FRAC_BITS)) == 0
    assert cpu_kernels.squared_norm_fixed_sum(x[:, :1].t(), METRIC_FRAC_BITS) is None or k == 1  # not contiguous


def test_a_metric_may_return_an_exact_sum():
    # sum and mean of an ExactSum metric equal those of the per-agent values it sums.
    from agentsim.core.context import MetricsContext
    from agentsim.core.metrics import Metric, local_sums, metric_row, sum_of_squares
    from agentsim.core.state import FieldSpec, Population, State

    disp = torch.tensor([[1.0, 2.0], [-3.0, 0.5], [0.25, 0.0]])
    walkers = Population("walker", {"disp": FieldSpec(torch.float32, (2,))}, {"uid": torch.arange(3), "disp": disp})
    mc = MetricsContext(State({"walker": walkers}), {}, None, 0)
    for reduce in ("sum", "mean"):
        fused = Metric(lambda s: sum_of_squares(s["walker"]["disp"]), name="sq", reduce=reduce)
        plain = Metric(lambda s: ops.squared_norm(s["walker"]["disp"]), name="sq", reduce=reduce)
        rows = [metric_row(0, local_sums([m], mc), [m]) for m in (fused, plain)]
        assert rows[0] == rows[1] and rows[0]["sq"] == pytest.approx(14.3125 / (3 if reduce == "mean" else 1))
    with pytest.raises(ConfigError, match="per-agent values or an ExactSum"):
        local_sums([Metric(lambda s: 3.0, name="bad")], mc)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_exp_gives_the_bits_of_the_torch_ops(built, torch_ops, dtype):
    from agentsim.core import portable

    g = torch.Generator().manual_seed(11)
    edges = [0.0, -0.0, 1e-30, -1e-30, -700.0, 700.0, -701.0, 701.0, -87.0, 88.0, -88.0, 89.0, 0.34657359,
             -0.34657359, math.inf, -math.inf, math.nan]
    x = torch.cat([torch.randn(200_000, generator=g, dtype=torch.float64) * 40,
                   torch.tensor(edges, dtype=torch.float64),
                   (torch.rand(100_000, generator=g, dtype=torch.float64) - 0.5) * 1500]).to(dtype)
    got = portable.exp(x)
    eager = torch_ops(lambda: portable.exp(x))
    bits = torch.int64 if dtype == torch.float64 else torch.int32
    same = (got.view(bits) == eager.view(bits)) | (got.isnan() & eager.isnan())
    assert bool(same.all()), x[~same][:5].tolist()
    assert got.isnan().tolist() == x.isnan().tolist()
    mid = x[(x.abs() < 80) & ~x.isnan()].to(torch.float64)
    close = torch.exp(mid)  # within a few units in the last place of the true value
    ulp = 2.0**-52 if dtype == torch.float64 else 2.0**-23
    assert float(((portable.exp(mid.to(dtype)).to(torch.float64) - close).abs() / close).max()) < 4 * ulp
    block = x[:30].reshape(10, 3).t()  # not contiguous: the same values
    assert torch.equal(portable.exp(block), portable.exp(x[:30]).reshape(10, 3).t())


@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("threads", [1, 2])
def test_gather_sum_gives_the_bits_of_adding_the_gathers(built, torch_ops, index_dtype, threads, monkeypatch):
    monkeypatch.setattr(torch, "get_num_threads", lambda: threads)  # the kernel's split over threads
    g = torch.Generator().manual_seed(3)
    n, sizes = 300_000, [90_001, 3, 701, 1]
    tables = [torch.randn(s, generator=g, dtype=torch.float64) * 10.0 ** torch.randint(-9, 9, (s,), generator=g)
              for s in sizes]
    numbers = [torch.randint(0, s, (n,), generator=g).to(index_dtype) for s in sizes]
    rows = torch.randperm(n, generator=g)[:200_000]
    for at in (rows, None):
        got = ops.gather_sum(tables, numbers, at)
        eager = torch_ops(lambda at=at: ops.gather_sum(tables, numbers, at))
        brute = torch.zeros(n if at is None else at.shape[0], dtype=torch.float64)
        for table, number in zip(tables, numbers, strict=True):
            brute = brute + table[number if at is None else number[at]]
        assert torch.equal(got.view(torch.int64), eager.view(torch.int64))
        assert torch.equal(got.view(torch.int64), brute.view(torch.int64))


@pytest.mark.parametrize("threads", [1, 2])
def test_gather_sum_reads_int64_tables_with_scales_as_their_float_copies(built, torch_ops, threads, monkeypatch):
    monkeypatch.setattr(torch, "get_num_threads", lambda: threads)
    g = torch.Generator().manual_seed(4)
    n = 200_000
    floats = torch.randn(5_001, generator=g, dtype=torch.float64)
    ints = [torch.randint(-2**62, 2**62, (n,), generator=g), torch.randint(0, 2**40, (n,), generator=g)]
    ints[0][::7] = torch.randint(-1000, 1000, (ints[0][::7].shape[0],), generator=g)  # small ones too
    tables, scales = [floats, ints[0], ints[1]], [None, 0.1 / 3.0, 2.0**-24 * 0.192 / 20]
    numbers = [torch.randint(0, 5_001, (n,), generator=g).to(torch.int32), torch.randperm(n, generator=g).to(
        torch.int32), None]  # (None: the table has an entry per row, read at the row)
    rows = torch.randperm(n, generator=g)[:150_000]
    for at in (rows, None):
        pick = (lambda x: x) if at is None else (lambda x, at=at: x[at])
        # the model's former way: each int64 table made float64, times its scale, then gathered
        brute = (torch.zeros(n if at is None else at.shape[0], dtype=torch.float64) + floats[pick(numbers[0])]
                 + (ints[0].to(torch.float64) * scales[1])[pick(numbers[1])]
                 + (ints[1].to(torch.float64) * scales[2])[pick(torch.arange(n))])
        got = ops.gather_sum(tables, numbers, at, scales)
        eager = torch_ops(lambda at=at: ops.gather_sum(tables, numbers, at, scales))
        assert torch.equal(got.view(torch.int64), brute.view(torch.int64))
        assert torch.equal(eager.view(torch.int64), brute.view(torch.int64))


def test_gather_sum_refuses_bad_input(built):
    tables, numbers = [torch.zeros(3, dtype=torch.float64)], [torch.tensor([0, 2, 1])]
    with pytest.raises(IndexError, match="row 1 has a group number outside its table"):
        ops.gather_sum(tables, [torch.tensor([0, 3, 1])])
    with pytest.raises(ValueError, match="one number column per table"):
        ops.gather_sum(tables, numbers * 2)
    with pytest.raises(ValueError, match="float64, or int64 where scales gives a scale"):
        ops.gather_sum([torch.zeros(3)], numbers)
    with pytest.raises(ValueError, match="float64, or int64 where scales gives a scale"):
        ops.gather_sum([torch.zeros(3, dtype=torch.int64)], numbers)  # an int64 table without a scale
    with pytest.raises(ValueError, match="float64, or int64 where scales gives a scale"):
        ops.gather_sum(tables, numbers, None, [0.5])  # a scale for a float64 table
    with pytest.raises(ValueError, match="float64, or int64 where scales gives a scale"):
        ops.gather_sum(tables, numbers, None, [None, None])  # not one scale per table
    with pytest.raises(ValueError, match="expected a table of 3 entries \\(one per row\\)"):
        ops.gather_sum([tables[0], torch.zeros(4, dtype=torch.float64)], [numbers[0], None])
    per_row = ops.gather_sum([torch.tensor([1.0, 2.0, 4.0], dtype=torch.float64)], [None], torch.tensor([2, 0]))
    assert per_row.tolist() == [4.0, 1.0]
    with pytest.raises(ValueError, match="one int32 or int64 dtype"):
        ops.gather_sum(tables * 2, [numbers[0], numbers[0].to(torch.int32)])
    with pytest.raises(ValueError, match="rows"):
        ops.gather_sum(tables, numbers, torch.tensor([0.0]))
    for row in (3, -1):  # rows outside the number columns: an error, never a read out of bounds
        with pytest.raises(IndexError, match="outside the 3 rows"):
            ops.gather_sum(tables, numbers, torch.tensor([0, row]))


def test_equal_compares_as_torch_does():
    cases = [(torch.tensor([255, 3], dtype=torch.uint8), (-1,)), (torch.tensor([127, -3], dtype=torch.int8), (383, -3)),
             (torch.tensor([16777217, 2]), (16777216.0,)), (torch.tensor([1, 0, 2], dtype=torch.int8), (1, 2)),
             (torch.tensor([True, False]), (1,)), (torch.tensor([True, False]), (False,)),
             (torch.tensor([0.1, 0.2], dtype=torch.float32), (0.1,)), (torch.tensor([1.0, float("nan")]), (1, 7))]
    for x, values in cases:
        want = x == values[0]
        for v in values[1:]:
            want = want | (x == v)
        assert ops.equal(x, *values).tolist() == want.tolist(), (x, values)
    with pytest.raises(ConfigError, match="at least one value"):
        ops.equal(torch.zeros(2))


def _masks(n: int, g: torch.Generator) -> list[torch.Tensor]:
    """Masks of ``n`` entries that a selection kernel can get wrong: every density from none to all,
    True only at the ends, runs of 64 False entries (skipped whole) ending right before a True.
    """
    masks = [torch.rand(n, generator=g) < p for p in (0.0, 1e-4, 0.01, 0.37, 0.9, 1.0)]
    ends = torch.zeros(n, dtype=torch.bool)
    ends[[0, n - 1]] = True
    runs = torch.zeros(n, dtype=torch.bool)
    runs[64::65] = True
    masks += [ends, runs, ~runs]
    return masks


@pytest.mark.parametrize("threads", [2, 3, 7])
def test_flatnonzero_kernel_is_numpys_on_any_split(built, monkeypatch, threads):
    monkeypatch.setattr(torch, "get_num_threads", lambda: threads)
    monkeypatch.setattr(cpu_kernels, "_SELECT_MIN", 100)  # pieces of about n / threads rows
    g = torch.Generator().manual_seed(11)
    for n in (1_000, 12_345, (1 << 16) + 7):
        for mask in _masks(n, g):
            want = torch.from_numpy(np.flatnonzero(mask.numpy()))
            got = cpu_kernels.flatnonzero(mask)
            assert got is not None and got.dtype == torch.int64
            assert torch.equal(got, want), (n, int(mask.sum()))
            assert torch.equal(ops.flatnonzero(mask), want)


def test_flatnonzero_kernel_declines_what_it_does_not_cover(built, monkeypatch):
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    big = torch.ones(3 << 20, dtype=torch.bool)
    assert cpu_kernels.flatnonzero(big[::2]) is None  # not contiguous
    assert cpu_kernels.flatnonzero(big.to(torch.uint8)) is None  # not bool
    assert cpu_kernels.flatnonzero(big[: 1 << 20]) is None  # one thread's worth: NumPy's pass
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
    assert cpu_kernels.flatnonzero(big) is None
    assert torch.equal(ops.flatnonzero(big), torch.arange(3 << 20))


_EQUAL_CASES = [
    (torch.int8, (-128, 127, 0)), (torch.int16, (-32768, 5)), (torch.int32, (2**31 - 1, -7, 0, 3, 9)),
    (torch.int64, (-(2**63), 2**63 - 1, 1)), (torch.uint8, (255, 0)), (torch.float32, (0.5, -0.0)),
    (torch.float64, (0.1, float("nan"), -0.0, float("inf"))),
]


@pytest.mark.parametrize(("dtype", "values"), _EQUAL_CASES, ids=[str(d) for d, _ in _EQUAL_CASES])
@pytest.mark.parametrize("threads", [2, 3])
def test_equal_any_kernel_is_the_brute_force_comparison(built, monkeypatch, dtype, values, threads):
    monkeypatch.setattr(torch, "get_num_threads", lambda: threads)
    monkeypatch.setattr(cpu_kernels, "_SELECT_MIN", 100)
    g = torch.Generator().manual_seed(12)
    n = 54_321
    pool = torch.tensor([*values, 1, 2, -1, 0.0] if dtype.is_floating_point else [*values, 1, 2, 3], dtype=dtype)
    if dtype.is_floating_point:
        pool = torch.cat([pool, torch.tensor([float("nan"), 0.0, float("-inf")], dtype=dtype)])
    x = pool[torch.randint(0, pool.shape[0], (n,), generator=g)]
    for k in range(1, len(values) + 1):
        want = [any(a == v for v in values[:k]) for a in x.tolist()]  # Python's comparison, one entry at a time
        got = cpu_kernels.equal_any(x, values[:k])
        assert got is not None and got.tolist() == want, (dtype, values[:k])
        assert ops.equal(x, *values[:k]).tolist() == want
        assert ops.equal(x.reshape(3, -1) if n % 3 == 0 else x, *values[:k]).reshape(-1).tolist() == want


def test_equal_through_the_kernel_compares_as_torch_does(built, monkeypatch):
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    monkeypatch.setattr(cpu_kernels, "_SELECT_MIN", 4)
    cases = [(torch.tensor([127, -3, 5, 0, 1, -128, 3, 2], dtype=torch.int8), (383, -3)),  # 383: NumPy/torch path
             (torch.tensor([16777217, 2, 0, 16777216, 5, 6, 7, 8]), (16777216.0,)),
             (torch.tensor([0.1, 0.2, 0.1, 0.3, float("inf"), 0, 3, 0.1], dtype=torch.float32), (0.1, 0.3)),
             (torch.tensor([1.0, float("nan"), 7, 7, -0.0, 0.0, 2, 1]), (1, 7, 0.0))]
    for x, values in cases:
        want = x == values[0]
        for v in values[1:]:
            want = want | (x == v)
        assert ops.equal(x, *values).tolist() == want.tolist(), (x, values)
    assert cpu_kernels.equal_any(torch.zeros(8, dtype=torch.bool), (False,)) is None
    assert cpu_kernels.equal_any(torch.zeros(8), (0.1,)) is None  # a value float32 rounds: NumPy's comparison
    assert cpu_kernels.equal_any(torch.zeros(8), (0.5, 0.0)).tolist() == [True] * 8
    assert cpu_kernels.equal_any(torch.zeros(8)[::2], (0.0,)) is None  # not contiguous
