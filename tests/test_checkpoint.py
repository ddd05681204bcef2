"""Checkpoints: a run saved on W ranks resumes on W' ranks (and with the other partitioner) and
continues the uninterrupted trajectory bit for bit; unfinished, corrupt and foreign checkpoints
are refused with messages."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

import agentsim as asim
from agentsim.core.comm import LocalComm
from agentsim.io.checkpoint import CheckpointError, atomic_write, latest_checkpoint, read_checkpoint
from agentsim.runner.launch import run_ranks

AGENTS = {"boids": 600, "wolfsheep": 300}
SEED = 5
SAVE_AT, TOTAL = 4, 9


def _sim(comm, model, partition, resume=None):
    return asim.Simulation(asim.get_model(model), agents=AGENTS[model], seed=SEED, comm=comm,
                           partition=partition if comm.world_size > 1 else None, resume=resume)


def final(sim) -> dict[str, np.ndarray] | None:
    """Every field of every agent in uid order and the env, on rank 0 (None elsewhere)."""
    sim.partition.sync_env(sim.state, sim.comm)
    out = {}
    for name, pop in sim.state.populations.items():
        rows = sim.comm.gather_rows(pop.fields())
        if rows is not None:
            order = torch.argsort(rows["uid"])
            out.update({f"{name}.{k}": v[order].numpy() for k, v in rows.items()})
    if sim.comm.rank != 0:
        return None
    out.update({f"env.{k}": v.cpu().numpy() for k, v in sim.state.env.items()})
    return out


def save_at(comm, model, partition, directory):
    sim = _sim(comm, model, partition)
    sim.run(SAVE_AT)
    sim.save_checkpoint(directory, keep=2)


def resume_each(comm, model, partition, directories):
    """Resume every checkpoint, run to TOTAL steps; (final state, metrics) of each on rank 0."""
    out = []
    for d in directories:
        sim = _sim(comm, model, partition, resume=d)
        assert sim.state.step == SAVE_AT
        result = sim.run(TOTAL - SAVE_AT)
        out.append((final(sim), result.metrics))
    return out


def uninterrupted(model):
    sim = _sim(LocalComm(), model, None)
    result = sim.run(TOTAL)
    return final(sim), {k: v[SAVE_AT:] for k, v in result.metrics.items()}


def assert_same_run(got, want, label):
    (state, metrics), (want_state, want_metrics) = got, want
    assert state.keys() == want_state.keys(), label
    for k in want_state:
        assert np.array_equal(state[k], want_state[k]), (label, k)
    for k in want_metrics:
        if k != "seconds" and not k.startswith(("step_seconds", "substep_seconds", "perf", "comm")):
            assert np.array_equal(metrics[k], want_metrics[k], equal_nan=True), (label, k)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("model", [pytest.param("boids", marks=pytest.mark.long), "wolfsheep"])
def test_resume_on_any_number_of_ranks_continues_the_run_bit_for_bit(model, tmp_path):
    want = uninterrupted(model)
    saved = {}
    for w in (1, 2, 3):
        saved[w] = str(tmp_path / f"saved-on-{w}")
        if w == 1:
            save_at(LocalComm(), model, "spatial", saved[w])
        else:
            run_ranks(save_at, w, (model, "spatial", saved[w]), timeout=120.0)
    dirs = [saved[w] for w in (1, 2, 3)]
    for w in (1, 2, 3):
        got = resume_each(LocalComm(), model, "spatial", dirs) if w == 1 else \
            run_ranks(resume_each, w, (model, "spatial", dirs), timeout=120.0)[0]
        for w_saved, one in zip((1, 2, 3), got, strict=True):
            assert_same_run(one, want, f"{model} saved on {w_saved}, resumed on {w}")


@pytest.mark.timeout(300)
def test_a_checkpoint_of_one_partitioner_resumes_with_the_other(tmp_path):
    want = uninterrupted("wolfsheep")
    run_ranks(save_at, 2, ("wolfsheep", "spatial", str(tmp_path / "spatial")), timeout=120.0)
    run_ranks(save_at, 3, ("wolfsheep", "data", str(tmp_path / "data")), timeout=120.0)
    got = run_ranks(resume_each, 3, ("wolfsheep", "data", [str(tmp_path / "spatial")]), timeout=120.0)[0]
    assert_same_run(got[0], want, "spatial on 2 -> data on 3")
    got = run_ranks(resume_each, 2, ("wolfsheep", "spatial", [str(tmp_path / "data")]), timeout=120.0)[0]
    assert_same_run(got[0], want, "data on 3 -> spatial on 2")


def test_unfinished_corrupt_and_foreign_checkpoints_are_refused(tmp_path):
    sim = _sim(LocalComm(), "wolfsheep", None)
    sim.run(2)
    first = sim.save_checkpoint(tmp_path)
    sim.run(1)
    second = sim.save_checkpoint(tmp_path)
    model = asim.get_model("wolfsheep")
    # an unfinished checkpoint (no manifest) is skipped: the newest complete one is used
    (tmp_path / "step-00000009").mkdir()
    assert str(latest_checkpoint(tmp_path)) == second
    assert asim.Simulation(model, agents=300, seed=SEED, resume=tmp_path).state.step == 3
    with pytest.raises(CheckpointError, match=r"no complete checkpoint in .*\(1 unfinished: no manifest.json\)"):
        read_checkpoint(_only_unfinished(tmp_path))
    with pytest.raises(CheckpointError, match="saved with seed 5, not 6"):
        asim.Simulation(model, agents=300, seed=6, resume=first)
    with pytest.raises(CheckpointError, match=r"other parameters \(regrowth_time: saved 30, now 10\)"):
        asim.Simulation(model, agents=300, seed=SEED, params={"regrowth_time": 10}, resume=first)
    with pytest.raises(CheckpointError, match="is of model 'wolfsheep', not 'boids'"):
        asim.Simulation(asim.get_model("boids"), agents=300, seed=SEED, resume=first)
    manifest = json.loads((tmp_path / "step-00000002" / "manifest.json").read_text())
    atomic_write(tmp_path / "step-00000002" / "manifest.json", json.dumps({**manifest, "format": 99}).encode())
    with pytest.raises(CheckpointError, match="has format 99; .* reads formats up to 2: upgrade agentsim"):
        read_checkpoint(first)
    shard = tmp_path / "step-00000003" / "rank-00000-of-00001.pt"
    shard.write_bytes(shard.read_bytes()[:-10])
    with pytest.raises(CheckpointError, match="rank-00000-of-00001.pt does not match its checksum"):
        read_checkpoint(second)
    with pytest.raises(CheckpointError, match="no checkpoint at"):
        read_checkpoint(tmp_path / "nowhere")
    with pytest.raises(asim.ConfigError, match="keep: expected an int >= 1"):
        sim.save_checkpoint(tmp_path, keep=0)


def _only_unfinished(tmp_path):
    d = tmp_path / "unfinished-only"
    (d / "step-00000001").mkdir(parents=True)
    return d


def test_keep_prunes_old_checkpoints(tmp_path):
    sim = _sim(LocalComm(), "boids", None)
    for _ in range(4):
        sim.step()
        sim.save_checkpoint(tmp_path, keep=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-00000003", "step-00000004"]
    shutil.rmtree(tmp_path / "step-00000004")
    assert read_checkpoint(tmp_path).step == 3


def _final_line(capsys) -> str:
    out = capsys.readouterr().out
    return next(line for line in out.splitlines() if line.startswith("final: "))


@pytest.mark.timeout(300)
def test_the_cli_saves_checkpoints_and_resumes_on_other_process_counts(tmp_path, capsys):
    from agentsim.cli.main import main

    common = ["wolfsheep", "--agents", "300", "--seed", "5"]
    assert main(["run", *common, "--steps", "10"]) == 0
    want = _final_line(capsys)
    ckpt = str(tmp_path / "ck")
    assert main(["run", *common, "--steps", "6", "--nprocs", "2", "--partition", "spatial",
                 "--checkpoint-every", "2", "--checkpoint-dir", ckpt, "--keep", "2"]) == 0
    capsys.readouterr()
    assert sorted(p.name for p in (tmp_path / "ck").iterdir()) == ["step-00000004", "step-00000006"]
    assert main(["run", *common, "--steps", "10", "--nprocs", "3", "--resume", ckpt]) == 0
    out = capsys.readouterr().out
    assert "10 steps (resumed from" in out and "at step 6)" in out
    assert next(line for line in out.splitlines() if line.startswith("final: ")) == want
    assert main(["run", *common, "--steps", "10", "--resume", ckpt]) == 0  # and on one process
    assert _final_line(capsys) == want


@pytest.mark.parametrize("args, message", [
    (["--keep", "2"], "--keep needs --checkpoint-every K"),
    (["--checkpoint-dir", "x"], "--checkpoint-dir needs --checkpoint-every K"),
    (["--checkpoint-every", "0"], "checkpoint_every: expected an int >= 1"),
    (["--checkpoint-every", "2", "--keep", "0"], "--keep: expected an int >= 1"),
    (["--resume", "/nonexistent/ck"], "no checkpoint at /nonexistent/ck"),
    (["--max-restarts", "2"], "--max-restarts restarts the processes of --nprocs W"),
])
def test_bad_checkpoint_options_get_clear_messages(args, message, capsys, tmp_path, monkeypatch):
    from agentsim.cli.main import main

    monkeypatch.chdir(tmp_path)
    assert main(["run", "wolfsheep", "--agents", "50", "--steps", "2", "--quiet", *args]) == 2
    assert message in capsys.readouterr().err


def test_resuming_past_the_total_steps_is_refused(tmp_path, capsys):
    from agentsim.cli.main import main

    assert main(["run", "boids", "--agents", "50", "--steps", "3", "--quiet", "--checkpoint-every", "3",
                 "--checkpoint-dir", str(tmp_path)]) == 0
    assert main(["run", "boids", "--agents", "50", "--steps", "2", "--quiet", "--resume", str(tmp_path)]) == 2
    assert "the checkpoint is at step 3, past --steps 2" in capsys.readouterr().err


def run_part(comm, out, directory, steps, resume=None, append=False, asynchronous=False):
    """wolfsheep with trajectory ``out`` (agents every 3 steps), a checkpoint every 4 steps."""
    sim = _sim(comm, "wolfsheep", "spatial", resume=resume)
    sim.run(steps, out=out, every=3, checkpoint_every=4, checkpoint_dir=directory, append=append,
            checkpoint_async=asynchronous)


@pytest.mark.timeout(300)
def test_a_resumed_run_writes_on_into_the_same_file_as_one_uninterrupted_run(tmp_path):
    from equivalence import assert_same_bits, h5_datasets

    from agentsim.io.hdf5 import read_trajectory

    full = str(tmp_path / "full.h5")
    _sim(LocalComm(), "wolfsheep", None).run(10, out=full, every=3)
    part, ck = str(tmp_path / "part.h5"), str(tmp_path / "ck")
    run_part(LocalComm(), part, ck, 6)  # "interrupted" after step 6: frames 0, 3, 6; checkpoints at 4
    assert read_trajectory(part).attrs["steps_completed"] == 6
    run_ranks(run_part, 3, (part, ck, 6, ck, True, True), timeout=120.0)  # resumed at step 4, on 3 ranks (async)
    assert_same_bits(h5_datasets(full), h5_datasets(part), "file")
    traj = read_trajectory(part)
    assert traj.attrs["completed"] and traj.attrs["steps"] == 10 and traj.attrs["steps_completed"] == 10
    with pytest.raises(asim.ConfigError, match="it holds a run with seed 5, not 6"):
        asim.Simulation(asim.get_model("wolfsheep"), agents=300, seed=6).run(2, out=part, append=True)
    with pytest.raises(asim.OutputError, match="append: no trajectory file to continue"):
        _sim(LocalComm(), "wolfsheep", None).run(2, out=str(tmp_path / "none.h5"), append=True)


def checkpoint_files(directory) -> dict[str, bytes]:
    """Every file of every checkpoint under ``directory`` by relative path (manifests without
    the agentsim version, the run's id and the checksum that covers them)."""
    from pathlib import Path

    out = {}
    for p in sorted(Path(directory).rglob("*")):
        if p.is_file():
            data = p.read_bytes()
            if p.name == "manifest.json":
                data = json.dumps({k: v for k, v in json.loads(data).items()
                                   if k not in ("agentsim", "run_id", "checksum")}).encode()
            out[str(p.relative_to(directory))] = data
    return out


def run_checkpointed(comm, directory, asynchronous):
    _sim(comm, "wolfsheep", "spatial").run(7, checkpoint_every=2, checkpoint_dir=directory, keep=2,
                                           checkpoint_async=asynchronous)


@pytest.mark.timeout(300)
def test_asynchronous_checkpoints_write_the_same_files_as_synchronous_ones(tmp_path):
    sync, asyn = tmp_path / "sync", tmp_path / "async"
    run_ranks(run_checkpointed, 2, (str(sync), False), timeout=120.0)
    run_ranks(run_checkpointed, 2, (str(asyn), True), timeout=120.0)
    want, got = checkpoint_files(sync), checkpoint_files(asyn)
    assert sorted(got) == sorted(want) == [f"step-0000000{s}/{f}" for s in (4, 6) for f in
                                           ("env.pt", "manifest.json", "rank-00000-of-00002.pt",
                                            "rank-00001-of-00002.pt")]
    assert got == want


def _break_writes(monkeypatch_target, rank_to_break):
    import agentsim.io.checkpoint as ck

    def fail(obj):
        raise OSError(28, "No space left on device")
    if rank_to_break is None or monkeypatch_target.rank == rank_to_break:
        ck.tensor_bytes = fail


def run_with_broken_writer(comm, directory, out, rank_to_break):
    _break_writes(comm, rank_to_break)
    sim = _sim(comm, "wolfsheep", "spatial")
    try:
        sim.run(5, out=out, checkpoint_every=2, checkpoint_dir=directory, checkpoint_async=True)
    except asim.OutputError as e:
        return str(e), sim.state.step
    return None, sim.state.step


@pytest.mark.timeout(300)
def test_a_failed_background_write_raises_on_every_rank(tmp_path):
    from agentsim.io.hdf5 import read_trajectory

    out = str(tmp_path / "run.h5")
    got = run_ranks(run_with_broken_writer, 2, (str(tmp_path / "ck"), out, 1), timeout=120.0)
    for message, step in got:
        assert message is not None and "was not written (ranks 1 failed)" not in message
        assert "checkpoint" in message and "step-00000002 was not written (rank 1 failed)" in message
        assert step == 4  # raised when the next checkpoint waited for this one
    assert "No space left on device" in got[1][0]
    assert latest_checkpoint(tmp_path / "ck") is None
    traj = read_trajectory(out)
    assert not traj.attrs["completed"] and traj.attrs["steps_completed"] == 4


def test_the_cli_writes_asynchronous_checkpoints_equal_to_synchronous_ones(tmp_path):
    from agentsim.cli.main import main

    for mode, extra in (("sync", []), ("async", ["--checkpoint-async"])):
        assert main(["run", "boids", "--agents", "80", "--steps", "5", "--quiet", "--checkpoint-every", "2",
                     "--checkpoint-dir", str(tmp_path / mode), *extra]) == 0
    assert checkpoint_files(tmp_path / "async") == checkpoint_files(tmp_path / "sync")
    assert sorted(p.name for p in (tmp_path / "async").iterdir()) == ["step-00000002", "step-00000004"]
