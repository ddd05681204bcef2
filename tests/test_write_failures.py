"""Every write failure is fatal at once: a trajectory, checkpoint or study file that cannot be
written stops the run with an OutputError naming the file and the cause, on one process and on
two, and nothing it left is marked complete.

Failures are injected with the test hook ``AGENTSIM_TEST_WRITE_FAULT`` (:mod:`agentsim.io.faults`:
writes to the named file fail from the N-th on, as on a full disk); being an environment
variable it reaches spawned ranks. One test fills a real 4 MB tmpfs (root only).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest

import agentsim as asim
from agentsim.cli.main import main
from agentsim.core.comm import LocalComm
from agentsim.errors import AgentsimError, OutputError
from agentsim.io import recording
from agentsim.io.checkpoint import latest_checkpoint
from agentsim.io.faults import ENV
from agentsim.io.hdf5 import read_trajectory
from agentsim.runner.launch import run_ranks
from agentsim.study.store import study_status

STEPS = 30
# Writes of a randomwalk run of 50 agents, every step recorded and flushed (FLUSH_SECONDS = 0):
# the file's creation is ~12, the first flush (which publishes the file) ends near 122, each later
# flush adds ~52, closing ~5 (measured with the hook's counter).
WHEN = {"first": "1", "mid-run": "200", "close": "close"}


def record(comm, out: str, fault: str | None, checkpoint_dir: str | None = None) -> None:
    """A short recorded run (every rank); the fault and a flush per step are set here, inside the
    worker, so that they hold in spawned ranks too.
    """
    if fault is not None:
        os.environ[ENV] = fault
    recording.FLUSH_SECONDS = 0.0
    sim = asim.Simulation(asim.get_model("randomwalk"), agents=50, seed=3, comm=comm)
    sim.run(STEPS, out, every=1, checkpoint_every=10 if checkpoint_dir else None, checkpoint_dir=checkpoint_dir)


def run_on(world_size: int, *args) -> str:
    """``record`` on 1 (in this process) or 2 ranks; the error's message."""
    with pytest.raises(AgentsimError) as info:
        if world_size == 1:
            try:
                record(LocalComm(), *args)
            finally:
                os.environ.pop(ENV, None)
                recording.FLUSH_SECONDS = 1.0
        else:
            run_ranks(record, world_size, args, timeout=60.0)
    return str(info.value)


def completed(path: Path) -> bool | None:
    """The file's ``completed`` attribute (None: no file)."""
    if not path.exists():
        return None
    with h5py.File(path, "r", swmr=True) as f:
        return bool(f.attrs["completed"])


@pytest.mark.timeout(120)
@pytest.mark.parametrize("world_size", [1, 2])
@pytest.mark.parametrize("when", list(WHEN))
def test_a_trajectory_write_failure_stops_the_run_and_the_file_is_not_complete(tmp_path, world_size, when):
    out = tmp_path / "run.h5"
    message = run_on(world_size, str(out), f"run.h5:{WHEN[when]}")
    first = message.splitlines()[0]
    assert f"'{out}'" in first and "No space left on device" in first, message
    if world_size == 2:
        assert first.startswith("rank 0 of 2 failed with OutputError"), message
    assert completed(out) in (None, False)
    if when == "first":
        assert not out.exists()  # no flush succeeded: nothing is published
        assert not list(tmp_path.glob(".run.h5.creating*"))
    else:
        assert completed(out) is False
        assert main(["inspect", str(out)]) == 0  # readable, and says it did not complete


def test_a_failed_close_never_marks_the_file_complete_and_the_writer_stays_broken(tmp_path, monkeypatch):
    from agentsim.io.hdf5 import TrajectoryWriter

    path = tmp_path / "w.h5"
    monkeypatch.setenv(ENV, "w.h5:close")
    w = TrajectoryWriter(path, model="m", params={}, seed=1, steps=2, compression=None)
    w.write_metrics(0, {"x": 1})
    w.flush()
    w.write_metrics(1, {"x": 2})
    with pytest.raises(OutputError, match="No space left on device"):
        w.close(completed=True)
    assert completed(path) is False
    with pytest.raises(OutputError, match="No space left on device"):
        w.write_metrics(2, {"x": 3})


@pytest.mark.timeout(120)
@pytest.mark.parametrize("world_size", [1, 2])
@pytest.mark.parametrize("target", ["shard", "manifest.json"])
def test_a_checkpoint_write_failure_stops_the_run_and_leaves_no_complete_checkpoint(tmp_path, world_size, target):
    name = f"rank-{world_size - 1:05d}-of-{world_size:05d}.pt" if target == "shard" else target
    ck = tmp_path / "ck"
    message = run_on(world_size, str(tmp_path / "run.h5"), f"{name}:1", str(ck))
    assert f"{name}'" in message and "No space left on device" in message, message
    assert latest_checkpoint(ck) is None
    assert completed(tmp_path / "run.h5") is False


@pytest.mark.timeout(60)
def test_a_read_only_checkpoint_directory_is_an_output_error_naming_it(tmp_path, capsys):
    ro = tmp_path / "ro"
    ro.mkdir()
    mounted = False
    if os.geteuid() == 0:  # root writes through permissions: use a read-only mount
        if shutil.which("mount") is None or subprocess.run(
                ["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(ro)], capture_output=True).returncode:
            pytest.skip("running as root and cannot mount a read-only tmpfs here")
        mounted = True
    else:
        ro.chmod(0o555)
    try:
        code = main(["run", "boids", "--agents", "40", "--steps", "2", "--quiet", "--checkpoint-every", "2",
                     "--checkpoint-dir", str(ro / "ck")])
        err = capsys.readouterr().err
    finally:
        if mounted:
            subprocess.run(["umount", str(ro)], check=False)
        else:
            ro.chmod(0o755)
    assert code == 1 and "Traceback" not in err
    assert (f"cannot create checkpoint directory '{ro / 'ck'}" in err and "file system" in err.lower()) or \
        "Permission denied" in err, err


@pytest.mark.long
@pytest.mark.timeout(300)
def test_a_study_run_whose_group_write_fails_is_not_complete_and_resume_runs_it(tmp_path, monkeypatch, capsys):
    out = tmp_path / "s.h5"
    sweep = ["sweep", "sir", "--grid", "beta=0.02,0.04", "--replicates", "2", "--agents", "200", "--steps", "10",
             "--out", str(out), "--workers", "1"]
    monkeypatch.setenv(ENV, f"{out}:8")  # the study file's 8th write: inside the first run's flush
    assert main(sweep) == 1
    err = capsys.readouterr().err
    assert f"writing study file '{out}' failed (run c0000-r0000)" in err and "No space left" in err, err
    assert "Traceback" not in err
    monkeypatch.delenv(ENV)
    assert main([*sweep, "--resume"]) == 0
    data = asim.read_study(out)
    assert data.completed and len(data.runs) == 4


def _same_study(a: Path, b: Path) -> None:
    """Two study files with the same runs, summary and bands (bit for bit)."""
    x, y = asim.read_study(a), asim.read_study(b)
    assert x.completed and y.completed
    assert sorted(x.runs) == sorted(y.runs)
    for k in x.runs:
        for m, v in x.runs[k]["metrics"].items():
            np.testing.assert_array_equal(v, y.runs[k]["metrics"][m])
    assert sorted(x.summary) == sorted(y.summary)
    for col, v in x.summary.items():
        np.testing.assert_array_equal(v, y.summary[col])
    assert sorted(x.bands) == sorted(y.bands)
    for cid, band in x.bands.items():
        for m, v in band.items():
            if isinstance(v, np.ndarray):
                np.testing.assert_array_equal(v, y.bands[cid][m])


@pytest.mark.timeout(300)
def test_a_failed_summary_leaves_the_study_file_unchanged_and_resume_writes_it(tmp_path, monkeypatch, capsys):
    out, whole = tmp_path / "s.h5", tmp_path / "whole.h5"
    sweep = ["sweep", "sir", "--grid", "beta=0.02,0.04", "--replicates", "2", "--agents", "200", "--steps", "10",
             "--workers", "1"]
    assert main([*sweep, "--out", str(whole)]) == 0
    monkeypatch.setenv(ENV, ".s.h5.finishing:3")  # the summary's copy: its 3rd write fails
    assert main([*sweep, "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert f"writing study file '{out}' failed: No space left" in err and "--resume writes the summary" in err, err
    assert "Traceback" not in err and "Exception ignored" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.h5", "s.h5.status.json", "whole.h5",
                                                          "whole.h5.status.json"]
    status = study_status(out)
    assert (status["done"], status["remaining"], status["completed"]) == (4, 0, False)
    assert "summary" not in h5py.File(out, "r", swmr=True)
    monkeypatch.delenv(ENV)
    assert main([*sweep, "--out", str(out), "--resume"]) == 0
    _same_study(out, whole)


@pytest.mark.long
@pytest.mark.timeout(400)
def test_a_study_on_a_real_full_disk_fails_in_one_line_and_resumes_to_the_whole_study(tmp_path):
    """Disks sized so the runs fit and the summary may not: one line, no crash, a file that
    ``study status`` reads and ``--resume`` completes into the uninterrupted study.
    """
    disk = tmp_path / "disk"
    disk.mkdir()
    if os.geteuid() != 0 or shutil.which("mount") is None or subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(disk)], capture_output=True).returncode:
        pytest.skip("mounting a tmpfs needs root and mount permission (a container may refuse it)")
    sweep = [sys.executable, "-m", "agentsim", "sweep", "sir", "--grid", "beta=0.02,0.04", "--replicates", "4",
             "--agents", "300", "--steps", "200", "--workers", "1", "--quiet"]
    try:
        whole = tmp_path / "whole.h5"
        subprocess.run([*sweep, "--out", str(whole)], check=True, capture_output=True, timeout=200)
        failed = 0
        for fraction in (0.8, 1.5):  # of the finished file's size: a run fails / the summary fails
            size = int(whole.stat().st_size * fraction) // 4096 * 4096
            subprocess.run(["mount", "-o", f"remount,size={size}", str(disk)], check=True)
            out = disk / "s.h5"
            proc = subprocess.run([*sweep, "--out", str(out)], capture_output=True, text=True, timeout=200)
            assert proc.returncode in (0, 1) and "Traceback" not in proc.stderr, (size, proc.returncode,
                                                                                   proc.stderr[-3000:])
            if proc.returncode:
                failed += 1
                assert "No space left" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
                try:
                    status = study_status(out)
                    assert status["completed"] is False
                except OutputError as e:  # a run group a failed flush damaged: said, and rebuilt by --resume
                    assert "damaged" in str(e), e
            subprocess.run(["mount", "-o", "remount,size=16m", str(disk)], check=True)
            resumed = subprocess.run([*sweep, "--out", str(out), "--resume"], capture_output=True, text=True,
                                     timeout=200)
            assert resumed.returncode == 0, resumed.stderr[-3000:]
            _same_study(out, whole)
            assert sorted(p.name for p in disk.iterdir()) == ["s.h5", "s.h5.status.json"]
            for p in disk.iterdir():
                p.unlink()
        assert failed == 2  # the disk was full both times
    finally:
        subprocess.run(["umount", str(disk)], check=False)


@pytest.mark.long
@pytest.mark.timeout(400)
def test_a_real_full_disk_stops_the_run_on_one_and_two_processes(tmp_path):
    disk = tmp_path / "disk"
    disk.mkdir()
    if os.geteuid() != 0 or shutil.which("mount") is None or subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(disk)], capture_output=True).returncode:
        pytest.skip("mounting a 4 MB tmpfs needs root and mount permission (a container may refuse it)")
    try:
        for nprocs in ("1", "2"):
            out = disk / f"run{nprocs}.h5"
            proc = subprocess.run([sys.executable, "-m", "agentsim", "run", "randomwalk", "--agents", "300", "--steps",
                                   "3000", "--every", "1", "--quiet", "--nprocs", nprocs, "--out", str(out)],
                                  capture_output=True, text=True, timeout=100)
            assert proc.returncode == 1, (proc.returncode, proc.stderr[-2000:])
            assert f"'{out}'" in proc.stderr and "No space left on device" in proc.stderr, proc.stderr
            assert "Traceback" not in proc.stderr and "Exception ignored" not in proc.stderr, proc.stderr
            assert completed(out) in (None, False)
            for f in disk.iterdir():
                f.unlink()
        # every step a failed flush left readable is served, nothing else (on 1 and 2 processes,
        # at sizes where the failure meets the first frames, the metrics or the later frames)
        for nprocs, sizes in (("1", ("4m",)), ("2", ("3m", "4m", "9m"))):
            for size in sizes:
                subprocess.run(["mount", "-o", f"remount,size={size}", str(disk)], check=True)
                out, ck = disk / "w.h5", disk / "ck"
                proc = subprocess.run([sys.executable, "-m", "agentsim", "run", "wolfsheep", "--agents", "40000",
                                       "--steps", "40", "--every", "5", "--checkpoint-every", "5", "--checkpoint-dir",
                                       str(ck), "--quiet", "--nprocs", nprocs, "--out", str(out)],
                                      capture_output=True, text=True, timeout=100)
                assert proc.returncode == 1 and "No space left" in proc.stderr, proc.stderr[-2000:]
                if out.exists():
                    traj = read_trajectory(out)
                    steps = traj.metrics["step"]
                    assert list(steps) == list(range(len(steps))) and traj.attrs["steps_completed"] == steps[-1]
                    for population in traj.populations:
                        for step in traj.steps(population):
                            assert step <= steps[-1]
                            energy = traj.agents(population, "energy", step=int(step))
                            assert (np.asarray(energy) != 0).mean() > 0.5, (nprocs, size, population, step)
                shutil.rmtree(ck, ignore_errors=True)
                out.unlink(missing_ok=True)
    finally:
        subprocess.run(["umount", str(disk)], check=False)


@pytest.mark.timeout(120)
def test_max_restarts_does_not_restart_a_failed_write(tmp_path, monkeypatch, capsys):
    out = tmp_path / "run.h5"
    monkeypatch.setenv(ENV, f"{out}:close")
    code = main(["run", "randomwalk", "--agents", "50", "--steps", "4", "--quiet", "--nprocs", "2",
                 "--max-restarts", "2", "--checkpoint-every", "2", "--checkpoint-dir", str(tmp_path / "ck"),
                 "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 1 and "restarting" not in err, err
    assert f"writing trajectory '{out}' failed: No space left on device" in err, err
    assert completed(out) is False


def test_rows_a_failed_flush_sized_but_never_filled_are_not_read(tmp_path, capsys):
    # On a full disk a failing flush may record a dataset's new length without its data: the file
    # ends in rows of zeros. Steps increase strictly in every series, so readers stop before them.
    import h5py
    import numpy as np

    from agentsim.cli.main import main
    from agentsim.io.hdf5 import read_trajectory

    path = tmp_path / "run.h5"
    assert main(["run", "randomwalk", "--agents", "20", "--steps", "6", "--every", "2", "--quiet",
                 "--out", str(path)]) == 0
    want = read_trajectory(path)
    with h5py.File(path, "r+") as f:
        for group in ("metrics", "perf", "env", "agents/walker"):
            if group not in f:
                continue
            for ds in f[group].values():
                if isinstance(ds, h5py.Dataset) and ds.maxshape[0] is None:
                    ds.resize(ds.shape[0] + 3, axis=0)  # zero rows, as a failed flush leaves them
        f.attrs["completed"] = False
        f.attrs["steps_completed"] = 9
    got = read_trajectory(path)
    for name, values in want.metrics.items():
        assert np.array_equal(got.metrics[name], values), name
    assert list(got.steps("walker")) == list(want.steps("walker")) == [0, 2, 4, 6]
    assert got.attrs["steps_completed"] == 6 and got.attrs["completed"] is False
    assert main(["inspect", str(path)]) == 0
    out = capsys.readouterr().out
    assert "6 of 6 steps, did not complete" in out and "step=6" in out


def test_a_resume_into_a_file_a_failed_flush_left_cuts_it_at_the_resumed_step(tmp_path, capsys):
    # A full disk at step 10 of 10: /metrics ends in zero rows a failed flush sized (steps
    # [0 .. 5, 0, 0, 0]), the frame of step 10 has its step but zeros for rows, and steps_completed
    # may say 10. Readers stop at step 5; a resume from the checkpoint of step 5 into the file
    # cuts it at step 5 exactly and ends with the uninterrupted run's data.
    import h5py
    import numpy as np

    from agentsim.cli.main import main
    from agentsim.io.hdf5 import read_trajectory

    run = ["run", "randomwalk", "--agents", "200", "--steps", "10", "--every", "5", "--quiet",
           "--checkpoint-every", "5", "--checkpoint-dir", str(tmp_path / "ck")]
    whole, path = tmp_path / "whole.h5", tmp_path / "run.h5"
    assert main([*run, "--out", str(whole)]) == 0
    shutil.rmtree(tmp_path / "ck" / "step-00000010")
    shutil.copy(whole, path)
    with h5py.File(path, "r+") as f:
        for ds in f["metrics"].values():
            ds.resize(6, axis=0)  # steps 0 .. 5 written
            ds.resize(9, axis=0)  # and three rows sized, never filled
        group = f["agents/walker"]
        first = int(group["offsets"][2])  # the frame of step 10: its step, zero rows
        for name, ds in group.items():
            if name not in ("step", "offsets", "checksums"):
                ds[first:] = 0
        f.attrs["completed"] = False
        f.attrs["steps_completed"] = 10
    assert list(f_steps(path)) == [0, 1, 2, 3, 4, 5, 0, 0, 0]
    got = read_trajectory(path)
    assert got.attrs["steps_completed"] == 5 and list(got.steps("walker")) == [0, 5]  # no frame of zeros
    assert main([*run, "--resume", str(tmp_path / "ck"), "--out", str(path)]) == 0
    capsys.readouterr()
    with h5py.File(whole, "r") as a, h5py.File(path, "r", swmr=True) as b:
        assert bool(b.attrs["completed"]) and int(b.attrs["steps_completed"]) == 10
        for group in ("metrics", "agents/walker", "env"):
            if group in a:
                for name, ds in a[group].items():
                    assert np.array_equal(ds[...], b[group][name][...]), f"{group}/{name}"


def f_steps(path):
    import h5py

    with h5py.File(path, "r", swmr=True) as f:
        return f["metrics/step"][...]
