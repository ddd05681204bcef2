"""neighbor_reduce against brute-force references in every space, and its errors."""

import numpy as np
import pytest
import torch

import agentsim as asim
from agentsim import Box, ConfigError, Graph, Grid, neighbor_reduce
from agentsim.core import ops
from agentsim.space.continuous import radius_pairs

REDUCTIONS = ("sum", "mean", "min", "max", "count")


def agents(n: int, seed: int, pos=None, cell=None, uid_offset: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    out = {
        "uid": torch.randperm(n, generator=g) + uid_offset,  # rows not in uid order
        "w": torch.rand(n, generator=g, dtype=torch.float64) - 0.5,
        "v": torch.rand(n, 2, generator=g),  # float32
        "k": torch.randint(-5, 6, (n,), generator=g),  # int64
    }
    if pos is not None:
        out["pos"] = pos
    if cell is not None:
        out["cell"] = cell
    return out


def rule(pair):
    """Messages of int and float fields, of the target and of the source."""
    return {
        "w": pair.source["w"] * (1.0 + pair.target["w"]),  # float64 [m]
        "v": pair.source["v"] - pair.target["v"],  # float32 [m, 2]
        "k": pair.source["k"] * pair.target["k"],  # int64 [m]
    }


def dense_messages(tgt: dict, src: dict) -> dict:
    """``rule`` for every (target, source): ``[T, S, ...]`` as numpy."""
    w_t, w_s = tgt["w"].numpy(), src["w"].numpy()
    v_t, v_s = tgt["v"].numpy(), src["v"].numpy()
    k_t, k_s = tgt["k"].numpy(), src["k"].numpy()
    return {
        "w": w_s[None, :] * (1.0 + w_t[:, None]),
        "v": v_s[None, :, :] - v_t[:, None, :],
        "k": k_s[None, :] * k_t[:, None],
    }


def dense_reduce(adj: np.ndarray, msg: np.ndarray, how: str) -> np.ndarray:
    """The reduction of ``msg[t, s]`` over the sources ``s`` with ``adj[t, s]``; ``adj`` counts pairs
    (a source adjacent twice counts twice)."""
    out = []
    for t in range(adj.shape[0]):
        sel = np.repeat(msg[t], adj[t].astype(int), axis=0)
        if how == "sum":
            out.append(sel.sum(0) if len(sel) else np.zeros(msg.shape[2:], msg.dtype))
        elif how == "mean":
            if np.issubdtype(msg.dtype, np.integer):
                out.append(sel.sum(0) // max(len(sel), 1))
            else:
                out.append(sel.sum(0) / max(len(sel), 1) if len(sel) else np.zeros(msg.shape[2:], msg.dtype))
        elif how in ("min", "max"):
            if len(sel):
                out.append(sel.min(0) if how == "min" else sel.max(0))
            elif np.issubdtype(msg.dtype, np.integer):
                info = np.iinfo(msg.dtype)
                out.append(np.full(msg.shape[2:], info.max if how == "min" else info.min, msg.dtype))
            else:
                out.append(np.full(msg.shape[2:], np.inf if how == "min" else -np.inf, msg.dtype))
        else:
            out.append(len(sel))
    return np.array(out)


def check_against_dense(got: dict, adj: np.ndarray, tgt: dict, src: dict, how: str) -> None:
    want_msgs = dense_messages(tgt, src)
    if how == "count":
        assert got["n"].dtype == torch.int32
        assert np.array_equal(got["n"].numpy(), adj.sum(1))
        return
    for key, msg in want_msgs.items():
        want = dense_reduce(adj, msg, how)
        g = got[key].numpy()
        assert g.shape == want.shape, key
        if np.issubdtype(msg.dtype, np.integer) or how in ("min", "max"):
            assert np.array_equal(g, want), (key, how)
        else:
            assert np.allclose(g, want, rtol=1e-5, atol=1e-5), (key, how)


def counting_rule(pair):
    return {"n": True}


def reduce_all(space, tgt, how, **kw):
    if how == "count":
        return neighbor_reduce(space, tgt, counting_rule, how, **kw)
    return neighbor_reduce(space, tgt, rule, how, **kw)


# --------------------------------------------------------------------------- continuous
def min_image(d: np.ndarray, size: np.ndarray, periodic: bool) -> np.ndarray:
    return d - size * np.round(d / size) if periodic else d


def box_adjacency(tpos, spos, box, radius, same):
    size = np.asarray(box.size)
    d = min_image(spos.numpy()[None].astype(np.float64) - tpos.numpy()[:, None].astype(np.float64), size,
                  box.periodic)
    adj = (d ** 2).sum(-1) <= radius ** 2
    if same:
        np.fill_diagonal(adj, False)
    return adj


@pytest.mark.parametrize("periodic", [True, False])
@pytest.mark.parametrize("how", REDUCTIONS)
def test_box_matches_brute_force(periodic, how):
    box = Box((10.0, 8.0), periodic=periodic)
    g = torch.Generator().manual_seed(1)
    pos = torch.rand(120, 2, generator=g) * torch.tensor([10.0, 8.0])
    pos[0] = torch.tensor([5.0, 4.0])  # a lone target: empty neighborhood
    pos[1:4] = torch.tensor([0.1, 0.1])  # three at one place
    a = agents(120, 2, pos=pos)
    far = (pos - pos[0]).norm(dim=1) > 1.2
    far[0] = True
    a = {k: v[far] for k, v in a.items()}
    got = reduce_all(box, a, how, radius=1.2)
    adj = box_adjacency(a["pos"], a["pos"], box, 1.2, same=True)
    assert adj.sum(1).min() == 0 and adj.sum() > 50
    check_against_dense(got, adj, a, a, how)


def test_box_sums_have_the_bits_of_radius_pairs_and_scatter_sum():
    """Canonical order: the same bits as summing radius_pairs' pairs with index_add_."""
    box = Box((20.0, 20.0), periodic=True)
    g = torch.Generator().manual_seed(3)
    a = agents(800, 4, pos=torch.rand(800, 2, generator=g) * 20)
    got = neighbor_reduce(box, a, lambda p: {"v": p.source["v"] * p.dist2.unsqueeze(1), "d": p.delta}, radius=2.0)
    i, j = radius_pairs(a["pos"], box, 2.0, uid=a["uid"])
    d = box.displacement(a["pos"][i], a["pos"][j])
    d2 = d[:, 0] * d[:, 0] + d[:, 1] * d[:, 1]
    assert torch.equal(got["v"], ops.scatter_sum(a["v"][j] * d2.unsqueeze(1), i, 800))
    assert torch.equal(got["d"], ops.scatter_sum(d, i, 800))


def by_uid(out: torch.Tensor, uid: torch.Tensor) -> torch.Tensor:
    return out[torch.argsort(uid)]


def test_box_result_does_not_depend_on_row_order_or_chunking(monkeypatch):
    box = Box((30.0, 30.0), periodic=True)
    g = torch.Generator().manual_seed(5)
    a = agents(3000, 6, pos=torch.rand(3000, 2, generator=g) * 30)
    perm = torch.randperm(3000, generator=g)
    b = {k: v[perm] for k, v in a.items()}
    ra = neighbor_reduce(box, a, rule, radius=1.5)
    import agentsim.space.continuous.search as search

    monkeypatch.setattr(search, "_MAX_CANDIDATES", 512)  # many small chunks
    rb = neighbor_reduce(box, b, rule, radius=1.5)
    for key in ra:
        assert torch.equal(by_uid(ra[key], a["uid"]), by_uid(rb[key], b["uid"])), key


def test_box_two_populations_and_halo_targets():
    """Targets are the first n_targets rows of one population, sources all rows of another."""
    box = Box((12.0, 12.0), periodic=True)
    g = torch.Generator().manual_seed(7)
    wolves = agents(40, 8, pos=torch.rand(40, 2, generator=g) * 12)
    sheep = agents(150, 9, pos=torch.rand(150, 2, generator=g) * 12)  # uids overlap the wolves'
    n_t = 30  # the last 10 wolf rows are a halo: sources only (here: nobody's)
    for how in REDUCTIONS:
        got = reduce_all(box, wolves, how, sources=sheep, radius=2.0, n_targets=n_t)
        tgt = {k: v[:n_t] for k, v in wolves.items()}
        adj = box_adjacency(tgt["pos"], sheep["pos"], box, 2.0, same=False)
        check_against_dense(got, adj, tgt, sheep, how)


def test_box_three_dims_and_per_source_values():
    box = Box((6.0, 6.0, 6.0), periodic=False)
    g = torch.Generator().manual_seed(11)
    a = agents(300, 12, pos=torch.rand(300, 3, generator=g) * 6)
    got = neighbor_reduce(box, a, {"w": a["w"], "v": a["v"], "n": True}, {"n": "count"}, radius=1.0)
    pair = neighbor_reduce(box, a, lambda p: {"w": p.source["w"], "v": p.source["v"], "n": True}, {"n": "count"},
                           radius=1.0)
    for key in got:
        assert torch.equal(got[key], pair[key]), key
    adj = box_adjacency(a["pos"], a["pos"], box, 1.0, same=True)
    assert np.allclose(got["w"].numpy(), adj @ a["w"].numpy())
    assert np.array_equal(got["n"].numpy(), adj.sum(1))


def test_box_gradients_flow_through_sum_and_mean():
    box = Box((5.0, 5.0), periodic=True)
    g = torch.Generator().manual_seed(13)
    pos = (torch.rand(60, 2, generator=g, dtype=torch.float64) * 5).requires_grad_()
    w = torch.rand(60, generator=g, dtype=torch.float64).requires_grad_()

    v = torch.rand(60, 2, generator=g, dtype=torch.float64).requires_grad_()

    def f(pos, w, v):
        a = {"pos": pos, "w": w, "v": v}
        out = neighbor_reduce(box, a, lambda p: {"s": p.source["w"] * p.dist2, "m": p.delta * p.target["w"][:, None],
                                                 "v": p.source["v"] * p.target["v"]}, {"m": "mean"}, radius=1.0)
        return out["s"].sum() + (out["m"] ** 2).sum() + (out["v"] ** 2).sum()

    f(pos, w, v).backward()
    assert all(x.grad is not None and float(x.grad.abs().sum()) > 0 for x in (pos, w, v))
    assert torch.autograd.gradcheck(f, tuple(x.detach().requires_grad_() for x in (pos, w, v)))


def test_box_no_targets_and_no_pairs():
    box = Box((10.0, 10.0))
    a = agents(3, 14, pos=torch.tensor([[1.0, 1.0], [5.0, 5.0], [9.0, 1.0]]))
    for how in REDUCTIONS:
        got = reduce_all(box, a, how, radius=0.5)
        check_against_dense(got, np.zeros((3, 3), bool), a, a, how)
        none = reduce_all(box, a, how, radius=0.5, n_targets=0)
        assert all(v.shape[0] == 0 for v in none.values())
    assert neighbor_reduce(box, a, rule, "max", radius=0.5, fill=7)["k"].tolist() == [7, 7, 7]


# --------------------------------------------------------------------------- grid
def grid_adjacency(grid, tcell, scell, kind, radius, include_center, same):
    h, w = grid.shape
    tr, tc = np.divmod(tcell.numpy(), w)
    sr, sc = np.divmod(scell.numpy(), w)
    dr = sr[None] - tr[:, None]
    dc = sc[None] - tc[:, None]
    if grid.periodic:
        dr = (dr + h // 2) % h - h // 2
        dc = (dc + w // 2) % w - w // 2
    center = (dr == 0) & (dc == 0)
    if kind == "cell":
        adj = center
    else:
        near = np.maximum(abs(dr), abs(dc)) <= radius if kind == "moore" else abs(dr) + abs(dc) <= radius
        adj = near if include_center else near & ~center
    if same:
        np.fill_diagonal(adj, False)
    return adj


GRID_CASES = [("moore", 1, False, True), ("moore", 2, True, False), ("von_neumann", 2, False, True),
              ("von_neumann", 1, True, True), ("cell", 1, False, False)]


@pytest.mark.parametrize(("kind", "radius", "include_center", "periodic"), GRID_CASES)
@pytest.mark.parametrize("how", REDUCTIONS)
def test_grid_matches_brute_force(kind, radius, include_center, periodic, how):
    grid = Grid((9, 11), periodic=periodic)
    g = torch.Generator().manual_seed(21)
    cell = torch.randint(0, grid.n_cells, (150,), generator=g)  # shared cells included
    near_row_3 = (cell // 11 - 3).abs() <= 2
    cell = torch.where(near_row_3, 77 + cell % 11, cell)  # rows 1-5 emptied into row 7
    cell[0] = 40  # row 3: no neighbor within 2 rows
    a = agents(150, 22, cell=cell)
    got = reduce_all(grid, a, how, kind=kind, radius=radius, include_center=include_center)
    adj = grid_adjacency(grid, cell, cell, kind, radius, include_center, same=True)
    assert adj[0].sum() == 0 and adj.sum() > 20  # a target with no neighbors
    check_against_dense(got, adj, a, a, how)


@pytest.mark.parametrize(("kind", "radius", "include_center", "periodic"), GRID_CASES)
def test_grid_per_source_counts_and_sums_match_the_pairs(kind, radius, include_center, periodic):
    """Integer per-source values take cell layers: the same result as the pairs."""
    grid = Grid((7, 8), periodic=periodic)
    g = torch.Generator().manual_seed(23)
    for n, shared in ((40, False), (90, True)):
        cell = torch.randperm(grid.n_cells, generator=g)[:40] if not shared else torch.randint(0, 56, (n,), generator=g)
        a = agents(cell.shape[0], 24, cell=cell)
        flag = a["k"] > 0
        kw = dict(kind=kind, radius=radius, include_center=include_center, n_targets=cell.shape[0] - 5)
        layers = neighbor_reduce(grid, a, {"all": True, "pos": flag, "k": a["k"]}, {"all": "count", "pos": "count"},
                                 **kw)
        pairs = neighbor_reduce(grid, a, lambda p: {"all": True, "pos": p.source["k"] > 0, "k": p.source["k"]},
                                {"all": "count", "pos": "count"}, **kw)
        for key in layers:
            assert layers[key].dtype == pairs[key].dtype and torch.equal(layers[key], pairs[key]), key


@pytest.mark.parametrize("include_center", [False, True])
def test_grid_smaller_than_the_neighborhood_counts_wrapped_offsets_as_neighbor_sum(include_center):
    """On a 2 x 3 torus a Moore radius 1 wraps onto the same cells: every offset counts (the agent's
    own cell too, except itself through the center), per source values and pairs alike."""
    grid = Grid((2, 3))
    cell = torch.tensor([0, 0, 1, 4, 5, 5, 5])
    a = agents(7, 33, cell=cell)
    kw = dict(include_center=include_center)
    layers = neighbor_reduce(grid, a, {"n": True, "k": a["k"]}, {"n": "count"}, **kw)
    pairs = neighbor_reduce(grid, a, lambda p: {"n": True, "k": p.source["k"]}, {"n": "count"}, **kw)
    occupancy = grid.occupancy(cell).reshape(grid.shape)
    want = grid.neighbor_sum(occupancy, "moore", 1, include_center).reshape(-1)[cell] - int(include_center)
    ksum = grid.neighbor_sum(grid.occupancy(cell, a["k"]).reshape(grid.shape), "moore", 1, include_center)
    want_k = ksum.reshape(-1)[cell] - int(include_center) * a["k"]
    assert torch.equal(layers["n"], want.to(torch.int32)) and torch.equal(pairs["n"], layers["n"])
    assert torch.equal(layers["k"], want_k) and torch.equal(pairs["k"], want_k)


def test_grid_two_populations_in_one_cell():
    grid = Grid((5, 5))
    wolves = agents(6, 31, cell=torch.tensor([0, 0, 3, 7, 24, 12]))
    sheep = agents(8, 32, cell=torch.tensor([0, 3, 3, 3, 12, 12, 1, 0]))
    got = neighbor_reduce(grid, wolves, True, "count", sources=sheep, kind="cell")
    assert got.tolist() == [2, 2, 3, 0, 0, 2]
    pairs = neighbor_reduce(grid, wolves, lambda p: p.source["k"], "sum", sources=sheep, kind="cell")
    k = sheep["k"]
    assert pairs.tolist() == [int(k[[0, 7]].sum()), int(k[[0, 7]].sum()), int(k[1:4].sum()), 0, 0,
                              int(k[4:6].sum())]


def test_grid_float_sums_in_offset_then_uid_order():
    """Per target: sources by neighborhood offset (lexicographic), then uid; any row order."""
    grid = Grid((6, 6))
    cell = torch.tensor([14, 7, 7, 8, 21, 14])
    uid = torch.tensor([0, 5, 2, 9, 4, 1])
    x = torch.tensor([1.0, 1e8, -1e8, 3.0, 0.5, 0.25], dtype=torch.float32)
    a = {"cell": cell, "uid": uid, "x": x}
    got = neighbor_reduce(grid, a, lambda p: p.source["x"], "sum", n_targets=1)
    # target 0 (cell 14 = row 2, col 2): offset (-1, -1) is cell 7 with uids 2 then 5, (-1, 0) cell 8, (1, 1) cell 21,
    # and the other agent of cell 14 (offset (0, 0)) is not a neighbor without include_center.
    want = torch.zeros((), dtype=torch.float32)
    for v in (-1e8, 1e8, 3.0, 0.5):
        want = want + torch.tensor(v, dtype=torch.float32)
    assert torch.equal(got, want.reshape(1))
    perm = torch.tensor([5, 3, 1, 0, 4, 2])
    b = {k: v[perm] for k, v in a.items()}
    got_b = neighbor_reduce(grid, b, lambda p: p.source["x"], "sum")
    assert torch.equal(got_b[3], got[0])


@pytest.mark.parametrize("space", ["box", "grid", "graph"])
def test_no_sources_at_all(space):
    """Another population that is empty (extinct): every target has no pairs, on every path."""
    g = torch.Generator().manual_seed(35)
    if space == "box":
        where, kw = Box((5.0, 5.0)), {"radius": 1.0}
        tgt, none = agents(4, 36, pos=torch.rand(4, 2, generator=g) * 5), agents(0, 37, pos=torch.zeros(0, 2))
    elif space == "grid":
        where, kw = Grid((4, 4)), {"kind": "cell"}
        tgt = agents(4, 36, cell=torch.tensor([0, 5, 5, 9]))
        none = agents(0, 37, cell=torch.zeros(0, dtype=torch.int64))
    else:
        where, kw = Graph.from_edges(torch.tensor([0, 1]), torch.tensor([1, 2]), 4), {}
        tgt, none = agents(4, 36), agents(0, 37)
    for how in REDUCTIONS:
        got = reduce_all(where, tgt, how, sources=none, **kw)
        check_against_dense(got, np.zeros((4, 0), bool), tgt, none, how)
    counts = neighbor_reduce(where, tgt, {"all": True, "pos": none["k"] > 0}, "count", sources=none, **kw)
    assert counts["all"].tolist() == counts["pos"].tolist() == [0, 0, 0, 0]


# --------------------------------------------------------------------------- graph
def graph_case(seed: int):
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(0, 60, (150,), generator=g)
    dst = torch.randint(0, 60, (150,), generator=g)
    graph = Graph.from_edges(src, dst, 62)  # nodes 60, 61: no edges
    a = agents(62, seed + 1)
    a["uid"] = torch.randperm(62, generator=g)  # rows are nodes uid
    return graph, a


def graph_adjacency(graph, tuid, suid):
    dense = np.zeros((graph.n_nodes, graph.n_nodes), bool)
    s, d = graph.edges()
    dense[s.numpy(), d.numpy()] = True
    return dense[np.ix_(tuid.numpy(), suid.numpy())]


@pytest.mark.parametrize("how", REDUCTIONS)
def test_graph_matches_brute_force(how):
    graph, a = graph_case(41)
    got = reduce_all(graph, a, how)
    adj = graph_adjacency(graph, a["uid"], a["uid"])
    assert adj.sum(1).min() == 0
    check_against_dense(got, adj, a, a, how)


def test_graph_halo_sources_and_per_source_counts():
    """Targets: the first rows; sources: the rows present (a neighbor not among them is not counted)."""
    graph, a = graph_case(43)
    keep = {k: v[:50] for k, v in a.items()}  # 12 nodes absent from this rank
    flag = keep["k"] > 0
    pushed = neighbor_reduce(graph, keep, flag, "count", n_targets=35)
    pairs = neighbor_reduce(graph, keep, lambda p: p.source["k"] > 0, "count", n_targets=35)
    assert pushed.dtype == pairs.dtype == torch.int32 and torch.equal(pushed, pairs)
    adj = graph_adjacency(graph, keep["uid"][:35], keep["uid"])
    assert np.array_equal(pushed.numpy(), (adj & flag.numpy()[None]).sum(1))
    sums = neighbor_reduce(graph, keep, lambda p: p.source["w"], n_targets=35)
    order = torch.argsort(keep["uid"])  # CSR order: by node id
    want = [float(sum(float(keep["w"][j]) for j in order.tolist() if adj[t, j])) for t in range(35)]
    assert np.allclose(sums.numpy(), want)


# --------------------------------------------------------------------------- errors
def test_unknown_reduction_names_the_valid_ones():
    a = agents(5, 51, pos=torch.rand(5, 2))
    with pytest.raises(ConfigError, match=r"unknown reduction 'summ'.*sum, mean, min, max, count.*meant 'sum'"):
        neighbor_reduce(Box((1.0, 1.0)), a, rule, "summ", radius=0.3)
    with pytest.raises(ConfigError, match=r"unknown reduction 'median' for message 'w'"):
        neighbor_reduce(Box((1.0, 1.0)), a, rule, {"w": "median"}, radius=0.3)
    with pytest.raises(ConfigError, match=r"reduce names \['x'\] but the messages are"):
        neighbor_reduce(Box((1.0, 1.0)), a, rule, {"x": "sum"}, radius=0.3)


def test_a_message_of_the_wrong_shape_is_refused():
    box = Box((4.0, 4.0))
    a = agents(20, 52, pos=torch.rand(20, 2) * 4)
    with pytest.raises(ConfigError, match=r"message 'w': expected a tensor \[\d+, \.\.\.\], one row per pair"):
        neighbor_reduce(box, a, lambda p: {"w": a["w"]}, radius=2.0)  # per agent, not per pair
    with pytest.raises(ConfigError, match=r"message 'n': 'count' counts the pairs whose message is True"):
        neighbor_reduce(box, a, lambda p: {"n": p.dist2}, "count", radius=2.0)
    with pytest.raises(ConfigError, match=r"message 'n' is True \(every pair\), which only 'count'"):
        neighbor_reduce(box, a, lambda p: {"n": True}, "sum", radius=2.0)
    with pytest.raises(ConfigError, match=r"expected a tensor \[20, \.\.\.\], one row per source row"):
        neighbor_reduce(box, a, a["w"][:5], radius=2.0)


def test_bad_space_arguments_are_refused():
    a = agents(5, 53, pos=torch.rand(5, 2), cell=torch.arange(5))
    with pytest.raises(ConfigError, match="continuous space needs radius"):
        neighbor_reduce(Box((1.0, 1.0)), a, rule)
    with pytest.raises(ConfigError, match=r"unknown grid neighborhood kind 'mooore'.*Perhaps you meant 'moore'"):
        neighbor_reduce(Grid((3, 3)), a, rule, kind="mooore")
    with pytest.raises(ConfigError, match="grid radius is a number of cells"):
        neighbor_reduce(Grid((3, 3)), a, rule, radius=1.5)
    with pytest.raises(ConfigError, match="pair.delta: pairs have a displacement in continuous space"):
        neighbor_reduce(Grid((3, 3)), a, lambda p: p.delta)
    with pytest.raises(ConfigError, match="expected a Box, Grid or Graph"):
        neighbor_reduce(None, a, rule)
    with pytest.raises(ConfigError, match="has no field 'pos'"):
        neighbor_reduce(Box((1.0, 1.0)), {"cell": a["cell"]}, rule, radius=0.5)


def test_graph_refuses_a_radius_a_grid_kind_and_a_node_given_twice():
    g = asim.erdos_renyi(30, 4.0, seed=3)
    agents = {"uid": torch.arange(30)}
    with pytest.raises(ConfigError, match="radius= does not apply"):
        neighbor_reduce(g, agents, True, "count", radius=2.0)
    with pytest.raises(ConfigError, match="kind= and include_center= are for a Grid"):
        neighbor_reduce(g, agents, True, "count", kind="von_neumann")
    twice = {"uid": torch.tensor([0, 1, 1, 2])}
    for message in (True, lambda pair: {"n": True}):  # the count fast path and the per-pair path
        with pytest.raises(ConfigError, match="hold a node twice"):
            neighbor_reduce(g, agents, message, "count", sources=twice)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64])
def test_scatter_add_columns_adds_into_slices_in_pair_order(dtype):
    """ops.scatter_add_columns_ into views of longer columns equals index_add_ on fresh zeros (the
    bits neighbor_reduce's chunked sums rely on), and refuses mismatched columns."""
    g = torch.Generator().manual_seed(5)
    whole = torch.zeros((3, 50), dtype=dtype)
    index = torch.randint(0, 20, (400,), generator=g)
    values = [(torch.randn(400, generator=g) * 100).to(dtype) for _ in range(3)]
    ops.scatter_add_columns_([whole[k, 10:30] for k in range(3)], index.to(torch.int32), values)
    for k in range(3):
        expected = torch.zeros(20, dtype=dtype).index_add_(0, index, values[k])
        assert torch.equal(whole[k, 10:30], expected)
        assert not whole[k, :10].any() and not whole[k, 30:].any()
    with pytest.raises(ConfigError, match="as many output columns"):
        ops.scatter_add_columns_([whole[0, :20]], index, values)
    with pytest.raises(ConfigError, match="contiguous 1-D output columns"):
        ops.scatter_add_columns_([whole[:, 0]], index, values[:1])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_box_counts_of_a_mask_beside_float_sums_are_exact_int32(dtype, monkeypatch):
    """A bool message counted next to float sums (one add pass, the count as a float column) gives
    the pairs' int32 counts, over many small chunks as over one."""
    from agentsim.space.continuous import search

    box = Box((6.0, 6.0), periodic=True)
    g = torch.Generator().manual_seed(7)
    pos = (torch.rand(300, 2, generator=g) * 6.0).to(dtype)
    a = {"pos": pos, "uid": torch.arange(300), "w": torch.rand(300, generator=g).to(dtype)}

    def rule(pair):
        near = pair.dist2 < 0.25
        return {"w": pair.source["w"] * near, "near": near, "all": True}

    how = {"w": "sum", "near": "count", "all": "count"}
    whole = neighbor_reduce(box, a, rule, how, radius=0.9)
    monkeypatch.setattr(search, "_MAX_CANDIDATES", 50)
    chunked = neighbor_reduce(box, a, rule, how, radius=0.9)
    adj = box_adjacency(pos, pos, box, 0.9, same=True)
    d = min_image(pos.numpy()[None].astype(np.float64) - pos.numpy()[:, None].astype(np.float64), np.array([6.0, 6.0]),
                  True)
    near = adj & ((d ** 2).sum(-1) < 0.25)
    for got in (whole, chunked):
        assert got["near"].dtype == torch.int32 and got["all"].dtype == torch.int32
        assert got["near"].tolist() == near.sum(1).tolist()
        assert got["all"].tolist() == adj.sum(1).tolist()
    assert torch.equal(whole["w"], chunked["w"])
