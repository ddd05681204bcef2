"""Multi-rank runs with the data partitioner: bitwise identical to one process; failures reported.

Path equivalence: every model runs on world sizes 1, 2, 3 and 4 and must give the
same bits as a one-process run (see equivalence.py; the fixtures are in conftest.py).
"""

from __future__ import annotations

import os
import time

import h5py
import numpy as np
import pytest
import torch
from equivalence import (
    WORLD_SIZES,
    Case,
    assert_same_bits,
    check_figures,
    check_same_as_reference,
    h5_datasets,
    run_cases,
)

import agentsim as asim
from agentsim import AgentsimError, ConfigError, Simulation, get_model, launch
from agentsim.cli.main import main as cli_main
from agentsim.core.comm import LocalComm
from agentsim.distributed import DataPartition
from agentsim.distributed.comm import pack_rows, row_counts, unpack_rows
from agentsim.runner.launch import run_ranks

PARTITION = "data"
# Agents per model: small, but enough for every rank to hold agents, neighbors across
# ranks, and (wolfsheep) births and deaths on several ranks.
SIZES = {"sir": 2000, "boids": 1000, "schelling": 1500, "wolfsheep": 300, "randomwalk": 1000}
# And tiny runs, in which some ranks hold no agents at all.
TINY = {"boids": 3, "wolfsheep": 12, "randomwalk": 2}
# Stale neighbor reads (sync_every = 3): still the same bits on any number of ranks.
STALE = {"sir": 2000, "boids": 1000, "schelling": 1500, "wolfsheep": 300}
SYNC = 3
CASES = ([Case(name, name, n) for name, n in SIZES.items()]
         + [Case(f"{name}-tiny", name, n) for name, n in TINY.items()]
         + [Case(f"{name}-stale", name, n, sync_every=SYNC) for name, n in STALE.items()])


@pytest.mark.timeout(60)
def test_world_size_1_with_data_partition_is_the_one_process_run(reference, tmp_path):
    got = run_cases(LocalComm(), CASES, PARTITION, str(tmp_path))
    for case in CASES:
        check_same_as_reference(reference[case.key], got[case.key], f"{case.key} W=1")


@pytest.mark.timeout(150)
def test_data_partition_is_bitwise_identical_on_2_3_4_ranks(reference, multi_rank):
    for w in WORLD_SIZES:
        for case in CASES:
            got = multi_rank[w][case.key]
            check_same_as_reference(reference[case.key], got, f"{case.key} W={w}")
            check_figures(got["perf"], f"{case.key} W={w}")
            with h5py.File(got["path"], "r") as f:
                assert f.attrs["world_size"] == w and f.attrs["completed"]
            # Really split: rank 0 held only its share at the end.
            for pop, n_local in got["local"].items():
                assert n_local < len(got["agents"][pop]["uid"]) or len(got["agents"][pop]["uid"]) <= 1
        # sync_every = 3: neighbor halos travel on refresh steps (1, 4, 7, ...) only.
        for name in STALE:
            halo = [p["halo/rows"] for p in multi_rank[w][f"{name}-stale"]["perf"]]
            assert all((h > 0) == (step % SYNC == 0) for step, h in enumerate(halo)), (name, w, halo)
    # Births and deaths happened (the uid bookkeeping across ranks was exercised).
    ws = reference["wolfsheep"]
    for pop in ("sheep", "wolf"):
        n0 = int(ws["metrics"][f"n_{pop}"][0])
        uid = ws["agents"][pop]["uid"]
        assert (uid >= n0).any(), f"no {pop} born"
        assert (uid < n0).sum() < n0, f"no {pop} died"


# --------------------------------------------------------------------------- pieces
def test_pack_rows_round_trip_keeps_bits():
    fields = {"uid": torch.tensor([5, -3, 2**62]),
              "pos": torch.tensor([[float("nan"), -0.0], [1e-30, 2.5], [3.0, 4.0]]),
              "flag": torch.tensor([True, False, True]), "small": torch.tensor([[1, 2, 3]] * 3, dtype=torch.int16)}
    back = unpack_rows(pack_rows(fields), fields)
    for k, v in fields.items():
        assert back[k].dtype == v.dtype and back[k].shape == v.shape
        assert back[k].view(torch.uint8).flatten().tolist() == v.view(torch.uint8).flatten().tolist()
    empty = {k: v[:0] for k, v in fields.items()}
    assert unpack_rows(pack_rows(empty), empty)["pos"].shape == (0, 2)
    # An empty transposed view counts as contiguous with a last stride other than 1.
    odd = {"pos": torch.zeros(2, 3)[:, :0].clone().t()}
    assert odd["pos"].stride(-1) != 1 and pack_rows(odd).shape == (0, 8)
    # uid 8 + pos 2 x 4 + flag 1 + small 3 x 2 bytes per row
    assert row_counts(fields) == (3, 3 * (8 + 8 + 1 + 6)) and row_counts(empty) == (0, 0) and row_counts({}) == (0, 0)


def test_data_partition_blocks_cover_every_row_once():
    for n in (0, 1, 7, 100):
        for w in (1, 2, 3, 4):
            blocks = [DataPartition.block(n, r, w) for r in range(w)]
            assert blocks[0][0] == 0 and blocks[-1][1] == n
            assert all(blocks[r][1] == blocks[r + 1][0] for r in range(w - 1))


def test_stale_runs_really_are_stale(reference):
    """sync_every = 3 changes every reference model's trajectory (and the same seed with 1 does not)."""
    for name in STALE:
        fresh, stale = reference[name]["metrics"], reference[f"{name}-stale"]["metrics"]
        assert any(not np.array_equal(fresh[k], stale[k]) for k in fresh), name


def test_bad_sync_every_and_partitions_are_config_errors():
    with pytest.raises(ConfigError, match="sync_every=3 needs partition 'data'"):
        launch("sir", world_size=2, agents=100, steps=1, partition="spatial", sync_every=3)
    with pytest.raises(ConfigError, match=r"sync_every: expected an int >= 1 \(got 0\)"):
        launch("sir", world_size=2, agents=100, steps=1, sync_every=0)
    with pytest.raises(ConfigError, match="unknown layout 'rbc'.*Perhaps you meant 'rcb'"):
        launch("sir", world_size=2, agents=100, steps=1, partition="spatial", layout="rbc")
    with pytest.raises(ConfigError, match="unknown partition 'dta'.*Perhaps you meant 'data'"):
        launch("sir", world_size=2, agents=100, steps=1, partition="dta")


# --------------------------------------------------------------------------- failures
def raise_on_rank_1(comm):
    comm.sum_int64(torch.tensor([1]))
    if comm.rank == 1:
        raise ValueError("deliberate failure on rank 1")
    comm.sum_int64(torch.tensor([1]))  # rank 0 waits here for a peer that is gone


def exit_on_rank_1(comm):
    comm.sum_int64(torch.tensor([1]))
    if comm.rank == 1:
        os._exit(3)
    comm.sum_int64(torch.tensor([1]))


@pytest.mark.timeout(60)
def test_a_rank_that_raises_is_named_with_its_traceback():
    with pytest.raises(AgentsimError, match=r"(?s)rank 1 of 2 failed with ValueError: deliberate failure.*"
                                            r"traceback of rank 1.*raise_on_rank_1"):
        run_ranks(raise_on_rank_1, 2, timeout=30.0)


@pytest.mark.timeout(60)
def test_a_rank_that_exits_is_named_with_its_exit_code():
    with pytest.raises(AgentsimError, match=r"rank 1 of 2 died \(exit code 3\)"):
        run_ranks(exit_on_rank_1, 2, timeout=30.0)


def register_cleanup(comm, folder):
    """Leave, at exit, a file written by an atexit handler and one by a finalizer of garbage."""
    import atexit
    import weakref

    atexit.register(lambda: open(os.path.join(folder, f"atexit-{comm.rank}"), "w").close())

    class Cycle:  # unreachable at exit, in a reference cycle: only a collection finalizes it
        pass

    cycle = Cycle()
    cycle.me = cycle
    collected = weakref.finalize(cycle, lambda: open(os.path.join(folder, f"collected-{comm.rank}"), "w").close())
    collected.atexit = False  # (else atexit would call it)
    print(f"rank {comm.rank} done", flush=False)
    return comm.rank


@pytest.mark.timeout(60)
def test_a_worker_that_reported_runs_its_exit_handlers_and_flushes_its_output(tmp_path, capfd):
    assert run_ranks(register_cleanup, 2, (str(tmp_path),), timeout=30.0) == [0, 1]
    assert sorted(os.listdir(tmp_path)) == ["atexit-0", "atexit-1", "collected-0", "collected-1"]
    out = capfd.readouterr().out
    assert "rank 0 done" in out and "rank 1 done" in out


def global_state(comm):
    """What a worker starts with: its global generators' draws and an environment variable."""
    return torch.initial_seed(), float(np.random.random()), os.environ.get("AGENTSIM_TEST_CALL")


@pytest.mark.timeout(60)
def test_workers_start_with_fresh_generators_and_the_callers_environment_now(monkeypatch):
    seen = []
    for call in ("first", "second"):  # (the fork server, once started, keeps its own environment)
        monkeypatch.setenv("AGENTSIM_TEST_CALL", call)
        ranks = run_ranks(global_state, 2, timeout=30.0)
        assert [env for _, _, env in ranks] == [call, call]
        seen += [(seed, draw) for seed, draw, _ in ranks]
    assert len({seed for seed, _ in seen}) == 4 and len({draw for _, draw in seen}) == 4


def stuck_on_rank_1(comm):
    comm.sum_int64(torch.tensor([1]))
    if comm.rank == 1:
        time.sleep(600)
    comm.sum_int64(torch.tensor([1]))


@pytest.mark.timeout(60)
def test_a_stuck_rank_makes_the_others_time_out_instead_of_hanging():
    t0 = time.monotonic()
    with pytest.raises(AgentsimError, match=r"(?s)rank 0 of 2 failed.*Timed out.*still running, terminated: rank 1"):
        run_ranks(stuck_on_rank_1, 2, timeout=3.0)
    assert time.monotonic() - t0 < 40


# --------------------------------------------------------------------------- launch / CLI
def test_launch_refuses_a_copy_that_declares_more_than_its_definition():
    """Workers rebuild a model from its name: a copy with its own metric is another model, which
    they could not rebuild (it would run without the metric), so launch says so."""
    copy = get_model("randomwalk").configure(params={"step_size": 0.5})
    copy.metric(name="extra")(lambda state: state["walker"]["disp"][:, 0])
    with pytest.raises(ConfigError, match="cannot find it to import on the worker processes"):
        launch(copy, world_size=2, agents=10, steps=1)
    plain = get_model("randomwalk").configure(params={"step_size": 0.5})
    assert plain.same_definition(get_model("randomwalk")) and not copy.same_definition(get_model("randomwalk"))


@pytest.mark.timeout(60)
def test_launch_returns_the_one_process_metrics():
    model = get_model("sir").configure(params={"beta": 0.2})
    ref = Simulation(model, agents=1000, seed=5).run(6).metrics
    got = launch(model, world_size=2, agents=1000, steps=6, seed=5)
    assert got.world_size == 2 and got.path is None and len(got.comm_bytes) == 6
    assert_same_bits(ref, got.metrics, "launch metrics")


def sir_without_all_gather_single(comm):
    """A spatial SIR run on a torch without ``dist.all_gather_single`` (before 2.13)."""
    import torch.distributed as dist

    del dist.all_gather_single  # this rank's process only
    sim = Simulation(get_model("sir"), agents=1000, seed=5, comm=comm, partition="spatial")
    return sim.run(6).metrics


@pytest.mark.timeout(60)
@pytest.mark.skipif(not hasattr(torch.distributed, "all_gather_single"), reason="this torch has no all_gather_single")
def test_all_gathers_fall_back_where_torch_has_no_all_gather_single():
    ref = Simulation(get_model("sir"), agents=1000, seed=5).run(6).metrics
    got = run_ranks(sir_without_all_gather_single, 2, timeout=45.0)
    for metrics in got:
        assert_same_bits(ref, metrics, "metrics without all_gather_single")


# --------------------------------------------------------------------------- CLI
@pytest.mark.timeout(90)
def test_cli_nprocs_2_writes_the_one_process_file(tmp_path, capsys):
    common = ["run", "wolfsheep", "--agents", "300", "--steps", "8", "--seed", "3", "--every", "4", "--quiet"]
    one, two = str(tmp_path / "one.h5"), str(tmp_path / "two.h5")
    assert cli_main([*common, "--out", one]) == 0
    assert cli_main([*common, "--out", two, "--nprocs", "2", "--partition", "data"]) == 0
    assert_same_bits(h5_datasets(one), h5_datasets(two), "CLI --nprocs 2")
    with h5py.File(two, "r") as f:
        assert f.attrs["world_size"] == 2
    three = str(tmp_path / "three.h5")
    assert cli_main([*common, "--out", three, "--nprocs", "2", "--partition", "spatial", "--layout", "rcb",
                     "--balance-every", "2"]) == 0
    assert_same_bits(h5_datasets(one), h5_datasets(three), "CLI --nprocs 2 --partition spatial")
    with h5py.File(three, "r") as f:
        assert "agents/imbalance" in f["perf"] and "comm/bytes_sent" in f["perf"]
    assert cli_main([*common[:-1], "--nprocs", "2", "--partition", "spatial"]) == 0
    assert "halo" in capsys.readouterr().out  # the communication summary
    assert cli_main([*common, "--nprocs", "2", "--partition", "data", "--layout", "rcb"]) == 2
    assert "partition 'data' takes no options" in capsys.readouterr().err


# --------------------------------------------------------------------------- torchrun
@pytest.mark.timeout(180)
@pytest.mark.parametrize("partition", [
    ["--partition", "data"], pytest.param(["--partition", "spatial", "--layout", "rcb"], marks=pytest.mark.long)])
def test_torchrun_writes_the_one_process_file(tmp_path, partition):
    import subprocess
    import sys

    common = ["run", "wolfsheep", "--agents", "300", "--steps", "8", "--seed", "3", "--every", "4", "--quiet"]
    one, two = str(tmp_path / "one.h5"), str(tmp_path / "torchrun.h5")
    assert cli_main([*common, "--out", one]) == 0
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                           "-m", "agentsim", *common, "--out", two, "--timeout", "60", *partition],
                          capture_output=True, text=True, timeout=150)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert_same_bits(h5_datasets(one), h5_datasets(two), f"torchrun {partition}")
    with h5py.File(two, "r") as f:
        assert f.attrs["world_size"] == 2 and f.attrs["completed"]


# --------------------------------------------------------------------------- error flags
def nan_on_one_agent(comm):
    """uid 0 (on rank 0 of 2) gets a NaN size at step 3: every rank must raise at that step."""
    from agentsim import SimulationError

    model = asim.Model("flagged")

    @model.substep(writes=["a.x"], neighbors={"a": ["x"]})
    def grow(ctx: asim.Context) -> None:
        a = ctx["a"]
        x = a["x"] + ctx.neighbors("a")["x"].sum() * 0
        a["x"] = torch.where((a["uid"] == 0) & (ctx.step == 3), float("nan"), x)

    @model.init
    def init(ic: asim.InitContext) -> None:
        uid = ic.uids("a", ic.n_agents)
        ic.add("a", uid=uid, x=uid.to(torch.float64))

    sim = Simulation(model, agents=10, comm=comm, partition="data")
    try:
        sim.run(6)
    except SimulationError as e:
        return comm.rank, sim.state.step, str(e), sim.state["a"]["uid"].tolist()
    return comm.rank, sim.state.step, None, sim.state["a"]["uid"].tolist()


def flag_before_the_next_substeps(comm, partition):
    """uid 0 gets a NaN at step 3 and a flag; the second substep would fail on a NaN from step 4
    on. Inside a run the report travels into the next step: the flag must be raised after step
    4's first substep, before its second, on every rank. Returns what each rank saw.
    """
    from agentsim import SimulationError

    model = asim.Model("flag_then_use")

    @model.substep(reads=["a.x"], writes=["a.x"])
    def grow(ctx: asim.Context) -> None:
        a = ctx["a"]
        a["x"] = torch.where((a["uid"] == 0) & (ctx.step == 3), float("nan"), a["x"] + 1.0)

    @model.substep(reads=["a.x"])
    def use(ctx: asim.Context) -> None:
        if ctx.step > 3 and bool(ctx["a"]["x"].isnan().any()):
            raise RuntimeError("the step went on past a flagged step")

    @model.init
    def init(ic: asim.InitContext) -> asim.Box:
        uid = ic.uids("a", ic.n_agents)
        pos = torch.stack([uid * 10.0 / ic.n_agents, torch.zeros(ic.n_agents)], -1)
        ic.add("a", uid=uid, x=uid.to(torch.float64), pos=pos.to(torch.float32))
        return asim.Box((10.0, 1.0))

    sim = Simulation(model, agents=10, comm=comm, partition=partition)
    in_flight = []
    sim.trace = lambda s, substep: in_flight.append(getattr(s.partition, "_in_flight", None) is not None)
    try:
        sim.run(6)
    except SimulationError as e:
        return sim.state.step, str(e), any(in_flight)
    return sim.state.step, None, any(in_flight)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("partition", ["data", "spatial"])
def test_a_report_in_flight_raises_its_flags_before_the_next_step_goes_on(partition):
    results = run_ranks(flag_before_the_next_substeps, 2, (partition,), timeout=30.0)
    assert [r[:2] for r in results] == [(3, "step 3: grow: NaN in a.x")] * 2  # as on one process
    assert all(r[2] for r in results)  # the report did travel into the next step


@pytest.mark.timeout(60)
def test_a_flag_on_one_rank_is_raised_on_every_rank_at_the_same_step():
    results = run_ranks(nan_on_one_agent, 2, timeout=30.0)
    (_, step0, err0, uids0), (_, step1, err1, uids1) = results
    assert 0 in uids0 and 0 not in uids1  # the NaN is on rank 0 only
    assert step0 == step1 == 3
    assert err0 == err1 == "step 3: grow: NaN in a.x"
