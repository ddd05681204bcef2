"""Multi-rank runs with the spatial partitioner: bitwise identical to one process.

Every model (boids with each layout) runs with ``partition="spatial"`` on 2, 3 and 4
ranks (sub-groups of ONE 4-rank gloo job, as in ``test_distributed.py``) and must give
the same bits as a one-process run: metrics, final agents sorted by uid, and the HDF5
``/agents``, ``/env`` and ``/metrics``. Migration and (wolfsheep) births and deaths happen
in these runs; a crowded random walk shows load balancing. Boids runs with the
overlapped exchange (agentsim.distributed.overlap; tests/test_overlap.py forces its rare paths).
"""

from __future__ import annotations

import os

import h5py
import pytest
import torch
import torch.distributed as dist

from agentsim import ConfigError, Simulation, get_model
from agentsim.comm import LocalComm
from agentsim.distributed import DistributedSimulation, SpatialPartition, TorchComm, run_ranks
from agentsim.state import FieldSpec, Population, State
from test_distributed import assert_same_bits, h5_datasets, sorted_fields

STEPS = 15
EVERY = 5
SEED = 7
WORLD_SIZES = (2, 3, 4)
CROWDED = {"init_extent": 0.25}
# (key, model, agents, params, partition options)
RUNS = [
    ("sir", "sir", 2000, {}, {}),
    ("boids-strips", "boids", 1000, {}, {"layout": "strips"}),
    ("boids-blocks", "boids", 1000, {}, {"layout": "blocks"}),
    ("boids-rcb", "boids", 1000, {}, {"layout": "rcb"}),
    ("schelling", "schelling", 1500, {}, {"layout": "blocks"}),
    ("schelling-r2", "schelling", 1500, {"radius": 2}, {"layout": "rcb"}),
    ("wolfsheep", "wolfsheep", 300, {}, {"layout": "strips"}),
    ("randomwalk", "randomwalk", 1000, {}, {"layout": "rcb"}),
    ("boids-tiny", "boids", 3, {}, {"layout": "blocks"}),          # ranks with no agents
    ("wolfsheep-tiny", "wolfsheep", 12, {}, {"layout": "rcb"}),
    ("randomwalk-tiny", "randomwalk", 2, {}, {"layout": "strips"}),
    ("crowded", "randomwalk", 2000, CROWDED, {"layout": "strips", "balance_every": 1}),
    ("crowded-blocks", "randomwalk", 2000, CROWDED, {"layout": "blocks", "balance_every": 2}),
    ("wolfsheep-balance", "wolfsheep", 300, {}, {"layout": "blocks", "balance_every": 2,
                                                 "balance_threshold": 1.05}),
]
MOVING = ("boids-strips", "boids-blocks", "boids-rcb", "schelling", "wolfsheep", "randomwalk", "crowded")


def model_of(name: str, params: dict):
    model = get_model(name)
    return model.configure(params=params) if params else model


def run_models(comm, out_dir: str) -> dict | None:
    results = {}
    for key, name, n, params, options in RUNS:
        sim = DistributedSimulation(model_of(name, params), agents=n, seed=SEED, comm=comm,
                                    partition="spatial", **options)
        path = os.path.join(out_dir, f"{key}_w{comm.world_size}.h5")
        result = sim.run(STEPS, out=path, every=EVERY)
        agents = {pop: comm.gather_rows(p.fields()) for pop, p in sim.state.populations.items()}
        if comm.rank == 0:
            results[key] = {"metrics": result.metrics, "path": path, "perf": sim.perf_steps,
                            "overlap": sim.overlap is not None,
                            "agents": {pop: sorted_fields(f) for pop, f in agents.items()}}
    return results if comm.rank == 0 else None


def run_on_subgroups(comm, out_dir: str) -> dict | None:
    groups = {w: dist.new_group(list(range(w))) for w in WORLD_SIZES}
    out = {}
    for w in WORLD_SIZES:
        if comm.rank < w:
            out[w] = run_models(TorchComm(group=groups[w]), out_dir)
        dist.barrier()
    return out if comm.rank == 0 else None


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    out_dir = tmp_path_factory.mktemp("reference")
    ref = {}
    for key, name, n, params, _ in RUNS:
        if key in ref:
            continue
        sim = Simulation(model_of(name, params), agents=n, seed=SEED)
        path = str(out_dir / f"{key}.h5")
        result = sim.run(STEPS, out=path, every=EVERY)
        ref[key] = {"metrics": result.metrics, "path": path,
                    "agents": {pop: sorted_fields(p.fields()) for pop, p in sim.state.populations.items()}}
    return ref


@pytest.fixture(scope="module")
def multi_rank(tmp_path_factory):
    out_dir = str(tmp_path_factory.mktemp("multi_rank_spatial"))
    return run_ranks(run_on_subgroups, 4, (out_dir,), timeout=120.0)[0]


def check_same_as_reference(ref: dict, got: dict, what: str) -> None:
    assert_same_bits(ref["metrics"], got["metrics"], f"{what} metrics")
    assert sorted(ref["agents"]) == sorted(got["agents"])
    for pop in ref["agents"]:
        assert_same_bits(ref["agents"][pop], got["agents"][pop], f"{what} final {pop}")
    assert_same_bits(h5_datasets(ref["path"]), h5_datasets(got["path"]), f"{what} HDF5")


@pytest.mark.timeout(60)
def test_world_size_1_with_spatial_partition_is_the_one_process_run(reference, tmp_path):
    got = run_models(LocalComm(), str(tmp_path))
    for key, *_ in RUNS:
        check_same_as_reference(reference[key], got[key], f"{key} W=1")


@pytest.mark.timeout(240)
def test_spatial_partition_is_bitwise_identical_on_2_3_4_ranks(reference, multi_rank):
    for w in WORLD_SIZES:
        for key, *_ in RUNS:
            got = multi_rank[w][key]
            check_same_as_reference(reference[key], got, f"{key} W={w}")
            with h5py.File(got["path"], "r") as f:
                assert f.attrs["world_size"] == w and f.attrs["completed"]
                assert "agents/imbalance" in f["perf"] and "halo/bytes" in f["perf"]
        for key, name, *_ in RUNS:  # boids exchanges once per step, overlapped with its work
            assert multi_rank[w][key]["overlap"] == (name == "boids"), (key, w)
        for key in MOVING:  # agents crossed region borders
            assert sum(p["migrated"] for p in multi_rank[w][key]["perf"]) > 0, f"{key} W={w}: no migration"
        # Halos hold only agents near borders, not every agent (as the data partitioner's would).
        boids = multi_rank[w]["boids-strips"]["perf"]
        assert 0 < max(p["halo/rows"] for p in boids) < 1000 * (w - 1) / 2
        # sir: ghost nodes only.
        assert 0 < max(p["halo/rows"] for p in multi_rank[w]["sir"]["perf"]) < 2000 * (w - 1)
    ws = reference["wolfsheep"]
    for pop, first_uid in (("sheep", 0), ("wolf", 1 << 40)):
        n0 = int(ws["metrics"][f"n_{pop}"][0])
        uid = ws["agents"][pop]["uid"]
        assert (uid >= first_uid + n0).any(), f"no {pop} born"
        assert (uid < first_uid + n0).sum() < n0, f"no {pop} died"


@pytest.mark.timeout(240)
def test_load_balancing_evens_out_a_crowded_start(multi_rank):
    for w in WORLD_SIZES:
        for key, every in (("crowded", 1), ("crowded-blocks", 2)):
            perf = multi_rank[w][key]["perf"]
            first = next(i for i, p in enumerate(perf) if p["rebalanced"])
            assert first == every - 1, (key, w)  # the first step at which a check is due
            # Before: every walker in the first region. After: max/mean below 1.1, and kept there.
            assert perf[first]["agents/imbalance_before_balance"] > 1.5, (key, w, perf[first])
            assert perf[first]["agents/imbalance"] < 1.1, (key, w, perf[first])
            assert perf[-1]["agents/imbalance"] < 1.1, (key, w, perf[-1])
        # Borders of a grid moved too (env layers change owners with them).
        assert any(p["rebalanced"] for p in multi_rank[w]["wolfsheep-balance"]["perf"]), w


# --------------------------------------------------------------------------- pieces
def test_spatial_partition_options_are_checked():
    with pytest.raises(ConfigError, match="unknown layout 'strip'.*Perhaps you meant 'strips'"):
        SpatialPartition("strip")
    with pytest.raises(ConfigError, match="balance_threshold: expected a number >= 1"):
        SpatialPartition(balance_threshold=0.5)
    with pytest.raises(ConfigError, match="partition 'data' takes no options"):
        DistributedSimulation(get_model("sir"), agents=10, comm=LocalComm(), partition="data", layout="rcb")


@pytest.mark.parametrize("layout", ["strips", "blocks", "rcb"])
def test_regions_tile_the_box_and_every_agent_has_one_owner(layout):
    sim = Simulation(get_model("boids"), agents=500, seed=1)
    part = SpatialPartition(layout)
    part.bind(sim.space, sim.params)

    class FakeComm(LocalComm):
        world_size = 4

    part.scatter(sim.state.clone(), FakeComm())
    area = ((part.hi - part.lo).clamp(min=0)).prod(-1).sum()
    assert torch.isclose(area, torch.tensor(sim.space.size[0] * sim.space.size[1], dtype=torch.float64))
    owner = part.owner("boid", sim.state["boid"])
    assert owner.min() >= 0 and owner.max() < 4
    counts = torch.bincount(owner, minlength=4)
    if layout == "rcb":  # bisection of the initial positions: near-equal counts
        assert counts.max() / counts.float().mean() < 1.1


@pytest.mark.timeout(120)
def test_bench_scaling_writes_its_figures(tmp_path, capsys):
    from agentsim.cli import main as cli_main

    path = str(tmp_path / "scaling.json")
    assert cli_main(["bench", "--scaling", "randomwalk", "--agents", "400", "--steps", "3", "--warmup", "1",
                     "--repeats", "2", "--out", path]) == 0
    out = capsys.readouterr().out
    assert "speedup" in out and "parallel efficiency" in out
    import json

    with open(path) as f:
        figures = json.load(f)
    assert figures["world_size"] == 2 and set(figures["runs"]) == {"1", "2"}
    assert figures["repeats"] == 2 and len(figures["speedups"]) == 2 and len(figures["rounds"]["2"]) == 2
    per_round = [r["seconds_per_step"] for r in figures["rounds"]["2"]]
    assert min(per_round) <= figures["runs"]["2"]["seconds_per_step"] <= max(per_round)  # the median
    assert figures["runs"]["2"]["migrated_per_step"] > 0 and 0 <= figures["runs"]["2"]["comm_share"] <= 1
    assert {"torch", "git_commit", "cpu_count", "speedup", "efficiency"} <= set(figures)
    assert len(figures["independent_rounds"]) == 2 and figures["ceiling_speedup"] > 0
    assert figures["partition_overhead"] == pytest.approx(
        figures["runs"]["2"]["seconds_per_step"] / figures["independent_seconds_per_step"])
    assert "ceiling" in out and "in step" in out
    assert len(figures["lockstep_rounds"]) == 2 and figures["lockstep_speedup"] > 0


@pytest.mark.parametrize("layout", ["strips", "blocks", "rcb"])
@pytest.mark.parametrize("periodic", [True, False])
def test_halo_sends_exactly_the_agents_within_reach_of_a_region(layout, periodic):
    """Against brute force: the distance from each agent to each region over all 9 images,
    for every sending rank (its own agents, and agents anywhere: the test must not assume
    that a rank holds only agents of its region)."""
    from agentsim.space.continuous import Box

    sim = Simulation(get_model("boids"), agents=400, seed=3)
    box = Box(sim.space.size, periodic=periodic)
    part = SpatialPartition(layout)
    part.bind(box, sim.params)

    class FakeComm(LocalComm):
        world_size = 4

    part.scatter(sim.state.clone(), FakeComm())
    c = part.coords("boid", sim.state["boid"])
    owner = part.owner("boid", sim.state["boid"])
    reach = 10.0
    L = torch.tensor(box.size[:2], dtype=torch.float64)
    shifts = [(a, b) for a in (-1, 0, 1) for b in (-1, 0, 1)] if periodic else [(0, 0)]
    for rank in range(4):
        row, dest = part._near(c, "length", reach, rank=rank)
        got = set(zip(row.tolist(), dest.tolist()))
        want = set()
        for r in range(4):
            lo, hi = part.lo[r], part.hi[r]
            if r == rank or not (hi > lo).all():
                continue
            d = torch.stack([(torch.maximum(torch.minimum(c + torch.tensor(s) * L, hi), lo)
                              - (c + torch.tensor(s) * L)).norm(dim=-1) for s in shifts]).amin(0)
            want |= {(i, r) for i in torch.nonzero(d <= reach).squeeze(-1).tolist()}
        assert want <= got, (rank, sorted(want - got))  # nobody within reach is missed
        margin = {(i, r) for i, r in got - want}
        assert len(margin) <= 2, margin  # only the safety margin adds agents
        # The path before_substep takes: the border pre-filter, then the test on the candidates.
        near = part._near_border("boid", sim.state["boid"], "length", reach, rank)
        row2, dest2 = part._near(part.coords("boid", sim.state["boid"], near), "length", reach, rank)
        assert set(zip(near[row2].tolist(), dest2.tolist())) == got, rank
        own = set(torch.nonzero(owner == rank).squeeze(-1).tolist())
        assert any(i in own for i, _ in want), rank  # the rank's own agents were tested too


@pytest.mark.parametrize("layout", ["strips", "blocks", "rcb"])
@pytest.mark.parametrize("radius", [1, 2])
@pytest.mark.parametrize("periodic", [True, False])
def test_grid_halo_sends_exactly_the_cells_within_moore_radius(layout, radius, periodic):
    """Against brute force: Chebyshev distance (with wrap on a torus) from every cell to
    every cell of each other region."""
    from agentsim.space.grid import Grid

    grid = Grid((13, 11), periodic=periodic)
    part = SpatialPartition(layout)
    part.bind(grid, {})
    cells = torch.arange(grid.n_cells)
    rc = torch.stack([cells // 11, cells % 11], -1)

    class FakeComm(LocalComm):
        world_size = 4

    uid = torch.arange(grid.n_cells)
    pop = Population("a", {"cell": FieldSpec(torch.int64)}, {"uid": uid, "cell": cells})
    part.scatter(State({"a": pop.clone()}), FakeComm())
    owner = part.owner("a", pop)
    c = part.coords("a", pop)
    diff = (rc[:, None, :] - rc[None, :, :]).abs()  # [cells, cells, 2]
    if periodic:
        size = torch.tensor([13, 11])
        diff = torch.minimum(diff, size - diff)
    cheb = diff.amax(-1)
    for rank in range(4):
        row, dest = part._near(c, "moore", float(radius), rank=rank)
        got = set(zip(row.tolist(), dest.tolist()))
        want = set()
        for r in range(4):
            if r == rank:
                continue
            in_r = owner == r
            if in_r.any():
                near = (cheb[:, in_r] <= radius).any(1)
                want |= {(i, r) for i in torch.nonzero(near).squeeze(-1).tolist()}
        assert got == want, (rank, sorted(want - got), sorted(got - want))
        near = part._near_border("a", pop, "moore", float(radius), rank)
        row2, dest2 = part._near(part.coords("a", pop, near), "moore", float(radius), rank)
        assert set(zip(near[row2].tolist(), dest2.tolist())) == want, rank


@pytest.mark.parametrize("layout", ["strips", "blocks", "rcb"])
@pytest.mark.parametrize("space", ["box", "bounded", "grid"])
def test_owner_from_a_ranks_view_equals_the_full_search(layout, space):
    """owner(rank=r) takes a shortcut for agents inside r's region; it must give every agent,
    wherever it is, the owner the full search gives."""
    from agentsim.space.continuous import Box
    from agentsim.space.grid import Grid

    class FakeComm(LocalComm):
        world_size = 4

    part = SpatialPartition(layout)
    g = torch.Generator().manual_seed(5)
    if space == "grid":
        part.bind(Grid((17, 13), periodic=True), {})
        cells = torch.randint(0, 17 * 13, (500,), generator=g)
        pop = Population("a", {"cell": FieldSpec(torch.int64)}, {"uid": torch.arange(500), "cell": cells})
    else:
        box = Box((50.0, 30.0), periodic=space == "box")
        part.bind(box, {})
        pos = torch.rand(500, 2, generator=g) * torch.tensor([50.0, 30.0])
        pos[:20] = torch.tensor([[0.0, 0.0], [50.0, 30.0], [25.0, 15.0], [12.5, 0.0]]).repeat(5, 1)  # on borders
        pop = Population("a", {"pos": FieldSpec(torch.float32, (2,))}, {"uid": torch.arange(500), "pos": pos})
    part.scatter(State({"a": pop.clone()}), FakeComm())
    full = part.owner("a", pop)
    assert len(set(full.tolist())) > 1
    for rank in range(4):
        assert torch.equal(part.owner("a", pop, rank=rank), full), rank


@pytest.mark.parametrize("layout", ["strips", "blocks", "rcb"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_near_border_finds_the_rows_of_the_full_border_distance(layout, dtype):
    """near_border filters the raw position columns before the exact distance: the same rows
    and distances as border_distance over every agent, also for agents exactly at, just
    off or far outside the borders."""
    from agentsim.space.continuous import Box

    class FakeComm(LocalComm):
        world_size = 4

    part = SpatialPartition(layout)
    part.bind(Box((50.0, 30.0), periodic=True), {})
    g = torch.Generator().manual_seed(7)
    pos = (torch.rand(3000, 2, generator=g, dtype=torch.float64) * torch.tensor([50.0, 30.0])).to(dtype)
    pop = Population("a", {"pos": FieldSpec(dtype, (2,))}, {"uid": torch.arange(3000), "pos": pos})
    part.scatter(State({"a": pop.clone()}), FakeComm())
    cuts = torch.cat([part.lo, part.hi]).to(dtype)  # points on, and one ulp either side of, every border
    on = torch.cat([cuts, torch.nextafter(cuts, cuts + 1), torch.nextafter(cuts, cuts - 1), cuts + 2.0])
    pos = torch.cat([pos, on, torch.tensor([[float("nan"), 1.0], [-5.0, 60.0]], dtype=dtype)])
    pop = Population("a", {"pos": FieldSpec(dtype, (2,))}, {"uid": torch.arange(pos.shape[0]), "pos": pos})
    for rank in range(4):
        full = part.border_distance("a", pop, rank)
        for width in (0.0, 2.0, 2.0 + 1e-9, 7.5):
            rows, dist = part.near_border("a", pop, rank, width)
            want = torch.nonzero(full <= width).squeeze(-1)
            assert torch.equal(rows, want), (rank, width)
            assert torch.equal(dist, full[want])
