"""Tests of agentsim.space.graph: CSR invariants against brute-force edge sets, generators, CSV."""

from __future__ import annotations

import doctest
import time

import numpy as np
import pytest
import torch

import agentsim.space.graph as graph_module
import agentsim.space.graph.network as network_module
from agentsim.errors import ConfigError, OutputError
from agentsim.space.graph import Graph, erdos_renyi, from_edge_list_csv, layered_contacts, watts_strogatz


def edge_set(g: Graph) -> set[tuple[int, int]]:
    src, dst = g.edges()
    return set(zip(src.tolist(), dst.tolist()))


def ref_csr(src, dst, n, layer=None):
    """Brute-force CSR: dict of sets, smallest layer per undirected edge."""
    best: dict[tuple[int, int], int] = {}
    for i, (a, b) in enumerate(zip(src, dst)):
        if a == b:
            continue
        lay = 0 if layer is None else layer[i]
        for e in ((a, b), (b, a)):
            best[e] = min(best.get(e, lay), lay)
    indptr, indices, layers = [0], [], []
    for u in range(n):
        row = sorted(v for (x, v) in best if x == u)
        indices += row
        layers += [best[(u, v)] for v in row]
        indptr.append(len(indices))
    return indptr, indices, layers


def edge_keys(g: Graph) -> torch.Tensor:
    """Sorted int64 keys src * n + dst of the directed entries (CSR order is sorted)."""
    src, dst = g.edges()
    return src * g.n_nodes + dst


def assert_csr_invariants(g: Graph) -> None:
    n = g.n_nodes
    assert g.indptr.dtype == torch.int64 and g.indptr.shape == (n + 1,)
    assert g.indices.dtype == (torch.int32 if n < 2**31 else torch.int64)
    assert int(g.indptr[0]) == 0 and int(g.indptr[-1]) == g.indices.numel()
    src, dst = g.edges()
    assert bool((g.degree() >= 0).all())
    assert not bool((src == dst).any()), "self-loop"
    if dst.numel():
        assert int(dst.min()) >= 0 and int(dst.max()) < n
    # Sorted strictly within rows (also means no duplicates): keys strictly increasing.
    key = src * n + dst
    assert bool((key[1:] > key[:-1]).all())
    # Symmetric: the reversed keys, sorted, are the same set.
    rkey, _ = torch.sort(dst * n + src)
    assert torch.equal(rkey, key)
    if g.layer is not None:
        order = torch.argsort(dst * n + src)
        assert torch.equal(g.layer[order], g.layer), "layer differs between directions"


def assert_same_graph(a: Graph, b: Graph) -> None:
    assert a.n_nodes == b.n_nodes
    assert torch.equal(a.indptr, b.indptr) and torch.equal(a.indices, b.indices)
    assert (a.layer is None) == (b.layer is None)
    if a.layer is not None:
        assert torch.equal(a.layer, b.layer)
    assert a.layer_names == b.layer_names


def test_doctests():
    result = doctest.testmod(graph_module)
    assert result.attempted > 0 and result.failed == 0


# ------------------------------------------------------------------ from_edges
@pytest.mark.parametrize("trial", range(6))
def test_from_edges_matches_bruteforce(trial):
    gen = torch.Generator().manual_seed(trial)
    n = [1, 2, 5, 13, 40, 7][trial]
    m = [0, 3, 20, 60, 300, 49][trial]
    src = torch.randint(0, n, (m,), generator=gen)
    dst = torch.randint(0, n, (m,), generator=gen)
    layer = torch.randint(0, 3, (m,), generator=gen)
    g = Graph.from_edges(src, dst, n)
    assert_csr_invariants(g)
    indptr, indices, _ = ref_csr(src.tolist(), dst.tolist(), n)
    assert g.indptr.tolist() == indptr and g.indices.tolist() == indices
    assert g.n_edges == len(indices) // 2 and g.layer is None
    gl = Graph.from_edges(src, dst, n, layer=layer, layer_names=("a", "b", "c"))
    assert_csr_invariants(gl)
    indptr, indices, layers = ref_csr(src.tolist(), dst.tolist(), n, layer.tolist())
    assert gl.indptr.tolist() == indptr and gl.indices.tolist() == indices
    assert gl.layer.dtype == torch.int8 and gl.layer.tolist() == layers
    # The lexsort fallback (used when (n * n * n_layers) overflows int64) agrees.
    u, v, lay = src.numpy(), dst.numpy(), layer.numpy().astype(np.int8)
    keep = u != v
    for with_layer in (False, True):
        ll = lay[keep] if with_layer else None
        p1, i1, l1 = network_module.csr_by_lexsort(u[keep], v[keep], ll, n)
        node_bits = max(1, (n - 1).bit_length())
        ll = lay if with_layer else None  # the packed-key path drops self-loops itself
        pairs = np.stack([u, v])  # overwritten by the keys
        p2, i2, l2 = network_module.csr_by_key(pairs, ll, node_bits, 2 if with_layer else 0, n)
        assert np.array_equal(p1, p2) and np.array_equal(i1, i2)
        if with_layer:
            assert np.array_equal(l1, l2)


def test_from_edges_duplicate_keeps_smallest_layer():
    g = Graph.from_edges(
        torch.tensor([0, 1, 1, 2, 2]),
        torch.tensor([1, 0, 2, 1, 2]),
        n_nodes=3,
        layer=torch.tensor([2, 1, 1, 0, 0]),
        layer_names=("x", "y", "z"),
    )
    assert g.indices.tolist() == [1, 0, 2, 1]
    assert g.layer.tolist() == [1, 1, 0, 0]


def test_from_edges_validation():
    t = torch.tensor
    with pytest.raises(ConfigError, match=r"Expected n_nodes >= 1 \(got 0\)"):
        Graph.from_edges(t([0]), t([0]), 0)
    with pytest.raises(ConfigError, match=r"Expected node ids in \[0, n_nodes = 3\) \(got 3\)"):
        Graph.from_edges(t([0, 3]), t([1, 1]), 3)
    with pytest.raises(ConfigError, match=r"Expected node ids in \[0, n_nodes = 3\) \(got -1\)"):
        Graph.from_edges(t([0, 1]), t([-1, 1]), 3)
    with pytest.raises(ConfigError, match="Expected src to be an integer tensor"):
        Graph.from_edges(t([0.0]), t([1]), 3)
    with pytest.raises(ConfigError, match=r"Expected src and dst of the same shape \(got \[2\] and \[1\]\)"):
        Graph.from_edges(t([0, 1]), t([1]), 3)
    with pytest.raises(ConfigError, match=r"Expected layer ids in \[0, 1\] \(got 2\)"):
        Graph.from_edges(t([0]), t([1]), 3, layer=t([2]), layer_names=("a", "b"))
    with pytest.raises(ConfigError, match="Expected a layer tensor with layer_names"):
        Graph.from_edges(t([0]), t([1]), 3, layer_names=("a",))
    with pytest.raises(ConfigError, match=r"Expected indptr of shape \[4\]"):
        Graph(t([0, 1]), t([0], dtype=torch.int32), 3)


def test_empty_and_tiny_graphs():
    g = Graph.from_edges(torch.zeros(0, dtype=torch.int64), torch.zeros(0, dtype=torch.int64), 4)
    assert g.indptr.tolist() == [0] * 5 and g.n_edges == 0
    assert g.neighbor_sum(torch.ones(4)).tolist() == [0.0] * 4
    assert g.neighbor_sum(torch.ones(4, dtype=torch.int64)).tolist() == [0] * 4
    assert erdos_renyi(1, 0.0, seed=0).n_edges == 0
    assert watts_strogatz(1, 0, 0.5, seed=0).n_edges == 0
    assert repr(g) == "Graph(n_nodes=4, n_edges=0)"


# ---------------------------------------------------------------- neighbor_sum
def test_neighbor_sum_matches_loop():
    g = erdos_renyi(60, 6.0, seed=3)
    gen = torch.Generator().manual_seed(0)
    vals = torch.rand(60, 3, generator=gen, dtype=torch.float64)
    ivals = torch.randint(-(2**60), 2**60, (60,), generator=gen)
    src, dst = g.edges()
    ref = [[0.0] * 3 for _ in range(60)]
    iref = [0] * 60
    vl, il = vals.tolist(), ivals.tolist()
    for s, d in zip(src.tolist(), dst.tolist()):
        ref[s] = [a + b for a, b in zip(ref[s], vl[d])]
        iref[s] = (iref[s] + il[d] + 2**63) % 2**64 - 2**63  # int64 wraparound
    torch.testing.assert_close(g.neighbor_sum(vals), torch.tensor(ref, dtype=torch.float64), rtol=1e-14, atol=1e-14)
    got = g.neighbor_sum(ivals)
    assert got.dtype == torch.int64 and got.tolist() == iref
    small = torch.randint(0, 2, (60,), generator=gen, dtype=torch.int8)
    assert torch.equal(g.neighbor_sum(small), g.neighbor_sum(small.to(torch.int64)))
    assert torch.equal(g.neighbor_sum(small.bool()), g.neighbor_sum(small.to(torch.int64)))
    f32 = g.neighbor_sum(vals.float())
    assert f32.dtype == torch.float32
    with pytest.raises(ConfigError, match=r"Expected values of shape \[60, \.\.\.\] \(got \[59\]\)"):
        g.neighbor_sum(torch.ones(59))


def test_neighbor_sum_has_gradients():
    g = watts_strogatz(10, 4, 0.0, seed=0)
    x = torch.ones(10, dtype=torch.float64, requires_grad=True)
    g.neighbor_sum(x).sum().backward()
    assert torch.equal(x.grad, g.degree().double())


# ----------------------------------------------------------------- Erdős–Rényi
def test_erdos_renyi_degree_distribution():
    n, d = 100_000, 10.0
    g = erdos_renyi(n, d, seed=0)
    assert_csr_invariants(g)
    deg = g.degree().double()
    # Lost edges (self-loops, duplicates) are about d/2 + d^2/4 = 30 of 500k.
    assert 500_000 - 100 <= g.n_edges <= 500_000
    assert abs(deg.mean().item() - d) < 0.01
    # Poisson(d): variance close to the mean, P(k) close to exp(-d) d^k / k!.
    assert abs(deg.var().item() / deg.mean().item() - 1.0) < 0.03
    counts = torch.bincount(g.degree())
    for k in (5, 10, 15):
        p = float(np.exp(-d + k * np.log(d) - sum(np.log(np.arange(1, k + 1)))))
        assert abs(counts[k].item() / n - p) < 4 * np.sqrt(p / n) + 1e-3


def test_erdos_renyi_seeds():
    a = erdos_renyi(2000, 5.0, seed=1)
    assert_same_graph(a, erdos_renyi(2000, 5.0, seed=1))
    b = erdos_renyi(2000, 5.0, seed=2)
    assert not torch.equal(edge_keys(a), edge_keys(b))


def test_erdos_renyi_validation():
    with pytest.raises(ConfigError, match=r"Expected 0 <= mean_degree < n_nodes = 10 \(got 10.0\)"):
        erdos_renyi(10, 10.0, seed=0)
    with pytest.raises(ConfigError, match=r"Expected 0 <= mean_degree < n_nodes = 10 \(got -1.0\)"):
        erdos_renyi(10, -1, seed=0)
    with pytest.raises(ConfigError, match=r"Expected n_nodes >= 1 \(got 0\)"):
        erdos_renyi(0, 1.0, seed=0)
    with pytest.raises(ConfigError, match="Expected n_nodes to be an int"):
        erdos_renyi(10.0, 1.0, seed=0)
    with pytest.raises(ConfigError, match="Expected mean_degree to be finite"):
        erdos_renyi(10, float("nan"), seed=0)
    with pytest.raises(ConfigError, match="Expected seed to be an int"):
        erdos_renyi(10, 1.0, seed="x")


@pytest.mark.slow
def test_erdos_renyi_ten_million_nodes():
    # About 2.5 GB peak and 10-30 s on 2 CPU cores.
    start = time.perf_counter()
    g = erdos_renyi(10_000_000, 10.0, seed=0)
    elapsed = time.perf_counter() - start
    assert g.indices.dtype == torch.int32
    assert 50_000_000 - 200 <= g.n_edges <= 50_000_000
    deg = g.degree()
    assert abs(deg.double().mean().item() - 10.0) < 1e-3
    assert elapsed < 120, f"10M-node Erdős–Rényi took {elapsed:.1f} s"


# -------------------------------------------------------------- Watts–Strogatz
@pytest.mark.parametrize("n,k", [(10, 4), (7, 6), (12, 2), (5, 0), (9, 8)])
def test_watts_strogatz_p0_is_ring_lattice(n, k):
    g = watts_strogatz(n, k, 0.0, seed=5)
    assert_csr_invariants(g)
    ref = {(i, (i + j) % n) for i in range(n) for j in range(-k // 2, k // 2 + 1) if j != 0}
    assert edge_set(g) == ref
    assert bool((g.degree() == k).all())


def test_watts_strogatz_rewired():
    n, k = 20_000, 10
    g1 = watts_strogatz(n, k, 1.0, seed=0)
    assert_csr_invariants(g1)
    mean = g1.degree().double().mean().item()
    assert k - 0.01 < mean <= k  # duplicates lose about p k^2 / n = 0.005
    # With p = 1 almost no lattice edge survives.
    i = torch.arange(n).repeat_interleave(k // 2)
    lattice = i * n + (i + torch.arange(1, k // 2 + 1).repeat(n)) % n
    assert torch.isin(lattice, edge_keys(g1)).double().mean().item() < 0.01
    g_half = watts_strogatz(n, k, 0.5, seed=0)
    assert_csr_invariants(g_half)
    kept = torch.isin(lattice, edge_keys(g_half)).double().mean().item()
    assert 0.48 < kept < 0.52  # 1 - p, plus rewired edges that land back on the lattice
    assert_same_graph(g_half, watts_strogatz(n, k, 0.5, seed=0))
    assert not torch.equal(edge_keys(g_half), edge_keys(watts_strogatz(n, k, 0.5, seed=1)))


def test_watts_strogatz_validation():
    with pytest.raises(ConfigError, match=r"Expected k even and < n_nodes = 10 \(got 3\)"):
        watts_strogatz(10, 3, 0.1, seed=0)
    with pytest.raises(ConfigError, match=r"Expected k even and < n_nodes = 10 \(got 10\)"):
        watts_strogatz(10, 10, 0.1, seed=0)
    with pytest.raises(ConfigError, match=r"Expected k >= 0 \(got -2\)"):
        watts_strogatz(10, -2, 0.1, seed=0)
    with pytest.raises(ConfigError, match=r"Expected 0 <= p <= 1 \(got 1.5\)"):
        watts_strogatz(10, 4, 1.5, seed=0)


# ------------------------------------------------------------ layered contacts
def test_layered_contacts_structure():
    n = 50_000
    g = layered_contacts(n, seed=0)
    assert_csr_invariants(g)
    assert g.layer_names == ("household", "workplace", "community")
    assert set(torch.unique(g.layer).tolist()) == {0, 1, 2}

    # Households: each node's household neighbors plus itself form a contiguous
    # block [lo, hi], and all nodes of a block report the same block (cliques).
    hh = g.select_layers("household")
    assert_csr_invariants(hh)
    deg = hh.degree()
    src, dst = hh.edges()
    node = torch.arange(n)
    lo = torch.minimum(node, torch.full((n,), n).scatter_reduce(0, src, dst, "amin"))
    hi = torch.maximum(node, torch.full((n,), -1).scatter_reduce(0, src, dst, "amax"))
    assert torch.equal(hi - lo, deg), "household neighbors are not a contiguous block"
    assert torch.equal(lo[src], lo[dst]) and torch.equal(hi[src], hi[dst])
    starts = lo.unique()
    assert int(starts[0]) == 0
    sizes = torch.diff(torch.cat([starts, torch.tensor([n])]))
    assert torch.equal(hi[starts] - lo[starts] + 1, sizes), "blocks do not tile the nodes"
    assert abs(sizes.double().mean().item() - 2.5) < 0.03
    # Size 1 + Poisson(1.5): P(size = 1) = exp(-1.5).
    assert abs((sizes == 1).double().mean().item() - np.exp(-1.5)) < 0.01
    s = sizes.double()
    expected_hh = (s * (s - 1)).sum().item() / n
    assert deg.double().mean().item() == pytest.approx(expected_hh)
    assert abs(expected_hh - 2.1) < 0.05

    work = g.select_layers("workplace").degree().double().mean().item()
    comm = g.select_layers("community").degree().double().mean().item()
    assert abs(work - 8.0) < 0.2, work
    assert abs(comm - 4.0) < 0.1, comm
    assert g.n_edges * 2 == sum(g.select_layers(x).indices.numel() for x in g.layer_names)

    # Workplace edges join nodes within groups: far fewer distinct groups than
    # edges, so the workplace layer is clustered (triangles), community is not.
    wg = g.select_layers("workplace")
    cg = g.select_layers("community")
    assert local_clustering(wg) > 0.2 > 0.01 > local_clustering(cg)


def local_clustering(g: Graph, n_sample: int = 300) -> float:
    """Mean local clustering coefficient of the first n_sample nodes (brute force)."""
    indptr, indices = g.indptr.tolist(), g.indices.tolist()

    def row(u: int) -> set[int]:
        return set(indices[indptr[u] : indptr[u + 1]])

    vals = []
    for u in range(n_sample):
        nb = sorted(row(u))
        rows = {a: row(a) for a in nb}
        if len(nb) < 2:
            continue
        links = sum(1 for i, a in enumerate(nb) for b in nb[i + 1 :] if b in rows[a])
        vals.append(2 * links / (len(nb) * (len(nb) - 1)))
    return float(np.mean(vals))


def test_layered_contacts_parameters_and_seeds():
    g = layered_contacts(3000, seed=1, household_size=1.0, workplace_size=5.0, workplace_degree=50.0,
                         community_degree=0.0)
    assert g.select_layers("household").n_edges == 0  # all households of size 1
    assert g.select_layers("community").n_edges == 0
    # workplace_degree >= size - 1: every workplace is a clique.
    wg = g.select_layers("workplace")
    src, dst = wg.edges()
    deg = wg.degree()
    # In a clique all members have the same degree, so neighbors share degree.
    assert torch.equal(deg[src], deg[dst])
    a = layered_contacts(5000, seed=7)
    assert_same_graph(a, layered_contacts(5000, seed=7))
    assert not torch.equal(edge_keys(a), edge_keys(layered_contacts(5000, seed=8)))
    tiny = layered_contacts(1, seed=0, community_degree=0.0)
    assert tiny.n_edges == 0 and tiny.n_nodes == 1


def test_layered_contacts_validation():
    with pytest.raises(ConfigError, match=r"Expected household_size >= 1 \(got 0.5\)"):
        layered_contacts(100, 0, household_size=0.5)
    with pytest.raises(ConfigError, match=r"Expected workplace_size >= 1 \(got 0.0\)"):
        layered_contacts(100, 0, workplace_size=0)
    with pytest.raises(ConfigError, match=r"Expected workplace_degree >= 0 \(got -1.0\)"):
        layered_contacts(100, 0, workplace_degree=-1)
    with pytest.raises(ConfigError, match=r"Expected 0 <= community_degree < n_nodes = 100 \(got 100.0\)"):
        layered_contacts(100, 0, community_degree=100)
    g = layered_contacts(100, 0)
    with pytest.raises(ConfigError, match="Perhaps you meant 'household'"):
        g.select_layers("households")
    with pytest.raises(ConfigError, match="Expected a layered graph"):
        erdos_renyi(10, 2, seed=0).select_layers("household")


# ------------------------------------------------------------------------- CSV
def test_csv_round_trip(tmp_path):
    g = erdos_renyi(500, 4.0, seed=11)
    src, dst = g.edges()
    half = src < dst
    path = tmp_path / "edges.csv"
    lines = ["source,target", "# a comment line"]
    lines += [f"{a},{b}" for a, b in zip(src[half].tolist(), dst[half].tolist())]
    path.write_text("\n".join(lines) + "\n\n")
    assert_same_graph(from_edge_list_csv(path, n_nodes=500), g)
    assert_same_graph(from_edge_list_csv(str(path), n_nodes=500), g)
    # Both directions listed, read as a symmetric directed list.
    both = tmp_path / "both.csv"
    both.write_text("\n".join(f"{a},{b}" for a, b in zip(src.tolist(), dst.tolist())))
    assert_same_graph(from_edge_list_csv(both, n_nodes=500, directed=True), g)
    # Whitespace-separated, no header, n_nodes inferred from the largest id.
    ws = tmp_path / "edges.txt"
    ws.write_text("0 1\n1 2  # trailing comment\n\n2 5\n")
    h = from_edge_list_csv(ws)
    assert h.n_nodes == 6 and edge_set(h) == {(0, 1), (1, 0), (1, 2), (2, 1), (2, 5), (5, 2)}
    empty = tmp_path / "empty.csv"
    empty.write_text("source,target\n")
    assert from_edge_list_csv(empty, n_nodes=3).n_edges == 0


def test_csv_errors(tmp_path):
    with pytest.raises(OutputError, match="no such file"):
        from_edge_list_csv(tmp_path / "missing.csv")
    bad = tmp_path / "bad.csv"
    bad.write_text("source,target\n0,1\n# comment\n1,x\n2,3\n")
    with pytest.raises(ConfigError, match=r"line 4: expected two integer columns 'source,target' \(got '1,x'\)"):
        from_edge_list_csv(bad)
    three = tmp_path / "three.csv"
    three.write_text("0,1\n1,2,3\n")
    with pytest.raises(ConfigError, match=r"line 2: expected two integer columns .*'1,2,3'"):
        from_edge_list_csv(three)
    neg = tmp_path / "neg.csv"
    neg.write_text("0,1\n\n2,-3\n")
    with pytest.raises(ConfigError, match=r"line 3: expected node ids >= 0 \(got '2,-3'\)"):
        from_edge_list_csv(neg)
    big = tmp_path / "big.csv"
    big.write_text("# header comment\n0,1\n1,9\n")
    with pytest.raises(ConfigError, match=r"line 3: expected node ids < n_nodes = 5 \(got '1,9'\)"):
        from_edge_list_csv(big, n_nodes=5)
    asym = tmp_path / "asym.csv"
    asym.write_text("0,1\n1,0\n1,2\n")
    with pytest.raises(ConfigError, match=r"line 3: directed=True needs a symmetric edge list"):
        from_edge_list_csv(asym, directed=True)
    assert from_edge_list_csv(asym).n_edges == 2
    empty = tmp_path / "empty.csv"
    empty.write_text("# nothing\n")
    with pytest.raises(ConfigError, match="has no edges: pass n_nodes"):
        from_edge_list_csv(empty)
    binary = tmp_path / "binary.csv"
    binary.write_bytes(b"\xff\xfe\x00\x01")
    with pytest.raises(OutputError, match="Cannot read edge list"):
        from_edge_list_csv(binary)


def test_characters_outside_ascii_are_refused_in_data_and_allowed_in_comments(tmp_path):
    # numpy's reader took this character (U+A3BF4, then a vertical tab) for a number, and at
    # times crashed the process: the reader must never see it
    odd = tmp_path / "odd.csv"
    odd.write_bytes(b"0 1\n\xf2\xa3\xaf\xb4\x0b\n")
    refused = r"line 2: expected two integer columns 'source target' \(got '\\U000a3bf4'\)"
    with pytest.raises(ConfigError, match=refused):
        from_edge_list_csv(odd, n_nodes=5)
    digits = tmp_path / "digits.csv"
    digits.write_text("0,1\n1,\u0663\n", encoding="utf-8")  # an Arabic-Indic 3, which int() would read
    with pytest.raises(ConfigError, match=r"line 2: expected two integer columns 'source,target'"):
        from_edge_list_csv(digits, n_nodes=5)
    commented = tmp_path / "commented.csv"
    commented.write_text("# réseau de contacts\nsource,cible\n0,1\n1,2  # été\n", encoding="utf-8")
    assert sorted(from_edge_list_csv(commented).indices.tolist()) == [0, 1, 1, 2]
    header = tmp_path / "header.csv"
    header.write_text("quelle,où\n0,1\n", encoding="utf-8")
    assert from_edge_list_csv(header).n_edges == 1


def test_count_neighbors_in_matches_loop():
    from agentsim.space.graph import erdos_renyi

    g = erdos_renyi(500, 6.0, seed=3)
    nodes = torch.randperm(500, generator=torch.Generator().manual_seed(1))[:120]
    chosen = set(nodes.tolist())
    got = g.count_neighbors_in(nodes)
    indptr, indices = g.indptr.tolist(), g.indices.tolist()
    for u in range(500):
        expect = sum(1 for v in indices[indptr[u]:indptr[u + 1]] if v in chosen)
        assert got[u] == expect
    assert torch.equal(g.count_neighbors_in(nodes.flip(0)), got)
    assert g.count_neighbors_in(torch.zeros(0, dtype=torch.int64)).sum() == 0
    assert got.dtype == torch.int32
    # at=: the counts of the given nodes (an agent type's uid column), in their order
    perm = torch.randperm(500, generator=torch.Generator().manual_seed(2))
    assert torch.equal(g.count_neighbors_in(nodes, at=perm), got[perm])
    assert torch.equal(g.count_neighbors_in(nodes, at=perm[:7]), got[perm[:7]])
    assert torch.equal(g.count_neighbors_in(nodes, at=torch.arange(500)), got)  # the identity: no copy needed
