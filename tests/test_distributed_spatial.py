"""Multi-rank runs with the spatial partitioner: bitwise identical to one process.

Every model (boids with each layout) runs with ``partition="spatial"`` on 2, 3 and 4
ranks and must give the same bits as a one-process run (see equivalence.py; the fixtures
are in conftest.py). Migration and (wolfsheep) births and deaths happen in these runs; a
crowded random walk shows load balancing. Boids runs with the overlapped exchange
(agentsim.distributed.overlap; tests/test_overlap.py forces its rare paths). The region
geometry is tested without a process group in tests/test_regions.py.
"""

from __future__ import annotations

import h5py
import pytest
import torch
from equivalence import WORLD_SIZES, Case, check_figures, check_same_as_reference, run_cases

from agentsim import ConfigError, Simulation, get_model
from agentsim.core.comm import LocalComm
from agentsim.core.state import FieldSpec, Population, State
from agentsim.distributed import SpatialPartition
from agentsim.space.continuous import Box
from agentsim.space.grid import Grid

PARTITION = "spatial"
CROWDED = {"init_extent": 0.25}
CASES = [
    Case("sir", "sir", 2000),
    Case("boids-strips", "boids", 1000, options={"layout": "strips"}),
    Case("boids-blocks", "boids", 1000, options={"layout": "blocks"}),
    Case("boids-rcb", "boids", 1000, options={"layout": "rcb"}),
    Case("schelling", "schelling", 1500, options={"layout": "blocks"}),
    Case("schelling-r2", "schelling", 1500, {"radius": 2}, {"layout": "rcb"}),
    Case("wolfsheep", "wolfsheep", 300, options={"layout": "strips"}),
    Case("randomwalk", "randomwalk", 1000, options={"layout": "rcb"}),
    Case("circles", "circles", 800, options={"layout": "blocks"}),  # 3D, bounded
    Case("boids-tiny", "boids", 3, options={"layout": "blocks"}),          # ranks with no agents
    Case("wolfsheep-tiny", "wolfsheep", 12, options={"layout": "rcb"}),
    Case("randomwalk-tiny", "randomwalk", 2, options={"layout": "strips"}),
    Case("crowded", "randomwalk", 2000, CROWDED, {"layout": "strips", "balance_every": 1}),
    Case("crowded-blocks", "randomwalk", 2000, CROWDED, {"layout": "blocks", "balance_every": 2}),
    Case("wolfsheep-balance", "wolfsheep", 300, options={"layout": "blocks", "balance_every": 2,
                                                         "balance_threshold": 1.05}),
]
MOVING = ("boids-strips", "boids-blocks", "boids-rcb", "schelling", "wolfsheep", "randomwalk", "crowded")


class FourRanks(LocalComm):
    """A comm that says there are 4 ranks: enough to place agents (no collective runs)."""

    world_size = 4


def placed(layout: str, space, state: State) -> SpatialPartition:
    """A spatial partitioner whose regions were computed for 4 ranks (rank 0's view)."""
    part = SpatialPartition(layout)
    part.place(state.clone(), space, [], {}, FourRanks())
    return part


@pytest.mark.timeout(60)
def test_world_size_1_with_spatial_partition_is_the_one_process_run(reference, tmp_path):
    got = run_cases(LocalComm(), CASES, PARTITION, str(tmp_path))
    for case in CASES:
        check_same_as_reference(reference[case.key], got[case.key], f"{case.key} W=1")


@pytest.mark.timeout(240)
def test_spatial_partition_is_bitwise_identical_on_2_3_4_ranks(reference, multi_rank):
    for w in WORLD_SIZES:
        for case in CASES:
            got = multi_rank[w][case.key]
            check_same_as_reference(reference[case.key], got, f"{case.key} W={w}")
            check_figures(got["perf"], f"{case.key} W={w}")
            with h5py.File(got["path"], "r") as f:
                assert f.attrs["world_size"] == w and f.attrs["completed"]
                assert "agents/imbalance" in f["perf"] and "halo/bytes" in f["perf"]
        for case in CASES:  # boids and circles exchange once per step, overlapped with their work
            assert multi_rank[w][case.key]["overlap"] == (case.model in ("boids", "circles")), (case.key, w)
        for key in MOVING:  # agents crossed region borders
            assert sum(p["migrated"] for p in multi_rank[w][key]["perf"]) > 0, f"{key} W={w}: no migration"
        # Halos hold only agents near borders, not every agent (as the data partitioner's would).
        boids = multi_rank[w]["boids-strips"]["perf"]
        assert 0 < max(p["halo/rows"] for p in boids) < 1000 * (w - 1) / 2
        # sir: ghost nodes only.
        assert 0 < max(p["halo/rows"] for p in multi_rank[w]["sir"]["perf"]) < 2000 * (w - 1)
    ws = reference["wolfsheep"]
    for pop in ("sheep", "wolf"):
        n0 = int(ws["metrics"][f"n_{pop}"][0])
        uid = ws["agents"][pop]["uid"]
        assert (uid >= n0).any(), f"no {pop} born"
        assert (uid < n0).sum() < n0, f"no {pop} died"


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
        Simulation(get_model("sir"), agents=10, partition="data", layout="rcb")
    with pytest.raises(ConfigError, match="partition options .layout. need partition='spatial'"):
        Simulation(get_model("sir"), agents=10, layout="rcb")
    with pytest.raises(ConfigError, match="partition 'spatial' needs a space"):
        SpatialPartition().place(State({}), None, [], {}, LocalComm())


@pytest.mark.slow  # 14 process starts: python -m pytest -m slow
@pytest.mark.timeout(120)
def test_bench_scaling_writes_its_figures(tmp_path, capsys):
    from agentsim.cli.main import main as cli_main

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
@pytest.mark.parametrize("space", ["box", "bounded", "grid"])
def test_owner_from_a_ranks_view_equals_the_full_search(layout, space):
    """owner(rank=r) takes a shortcut for agents inside r's region; it must give every agent,
    wherever it is, the owner the full search gives."""
    g = torch.Generator().manual_seed(5)
    if space == "grid":
        where = Grid((17, 13), periodic=True)
        cells = torch.randint(0, 17 * 13, (500,), generator=g)
        pop = Population("a", {"cell": FieldSpec(torch.int64)}, {"uid": torch.arange(500), "cell": cells})
    else:
        where = Box((50.0, 30.0), periodic=space == "box")
        pos = torch.rand(500, 2, generator=g) * torch.tensor([50.0, 30.0])
        pos[:20] = torch.tensor([[0.0, 0.0], [50.0, 30.0], [25.0, 15.0], [12.5, 0.0]]).repeat(5, 1)  # on borders
        pop = Population("a", {"pos": FieldSpec(torch.float32, (2,))}, {"uid": torch.arange(500), "pos": pos})
    part = placed(layout, where, State({"a": pop}))
    full = part.owner("a", pop)
    assert len(set(full.tolist())) > 1
    for rank in range(4):
        assert torch.equal(part.owner("a", pop, rank=rank), full), rank


@pytest.mark.parametrize("layout", ["strips", "blocks", "rcb"])
@pytest.mark.parametrize("space", ["box", "bounded", "grid"])
def test_the_border_filter_keeps_every_halo_agent(layout, space):
    """The partitioner's path to a halo (border_candidates, then halo_destinations on those) gives the
    destinations of halo_destinations over every agent, for every rank (length and Moore reaches)."""
    g = torch.Generator().manual_seed(11)
    if space == "grid":
        where, kind, reach = Grid((23, 17), periodic=True), "moore", 2.0
        pop = Population("a", {"cell": FieldSpec(torch.int64)},
                         {"uid": torch.arange(400), "cell": torch.randint(0, 23 * 17, (400,), generator=g)})
    else:
        where, kind, reach = Box((60.0, 40.0), periodic=space == "box"), "length", 4.0
        pos = torch.rand(400, 2, generator=g) * torch.tensor([60.0, 40.0])
        pop = Population("a", {"pos": FieldSpec(torch.float32, (2,))}, {"uid": torch.arange(400), "pos": pos})
    part = placed(layout, where, State({"a": pop}))
    coords = part.coords("a", pop)
    for rank in range(4):
        row, dest = part.halo_destinations(coords, kind, reach, rank)
        want = set(zip(row.tolist(), dest.tolist()))
        assert want, rank  # agents near the borders exist
        near = part.border_candidates("a", pop, kind, reach, rank)
        row2, dest2 = part.halo_destinations(part.coords("a", pop, near), kind, reach, rank)
        assert set(zip(near[row2].tolist(), dest2.tolist())) == want, rank


@pytest.mark.parametrize("layout", ["strips", "blocks", "rcb"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_near_border_finds_the_rows_of_the_full_border_distance(layout, dtype):
    """near_border filters the raw position columns before the exact distance: the same rows
    and distances as border_distance over every agent, also for agents exactly at, just
    off or far outside the borders."""
    g = torch.Generator().manual_seed(7)
    pos = (torch.rand(3000, 2, generator=g, dtype=torch.float64) * torch.tensor([50.0, 30.0])).to(dtype)
    pop = Population("a", {"pos": FieldSpec(dtype, (2,))}, {"uid": torch.arange(3000), "pos": pos})
    part = placed(layout, Box((50.0, 30.0), periodic=True), State({"a": pop}))
    # Points on, and one ulp either side of, every border.
    cuts = torch.cat([part.regions.lo, part.regions.hi]).to(dtype)
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
