"""Files read while they are written (issue 58): trajectories and study files are written in
HDF5's single-writer / multiple-reader mode, so ``read_trajectory``, ``agentsim inspect`` and
``plot``, and h5py with ``swmr=True`` read the steps flushed so far while the run goes on (a reader
holding the file open does not stop the writer); a writer killed at any moment leaves a file that
reads, and that a resumed run continues.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import h5py
import numpy as np
import pytest

from agentsim.io.hdf5 import TrajectoryWriter, read_trajectory
from agentsim.study.store import StudyFile, read_study, study_status


def _wait_for(path: Path, proc: subprocess.Popen[bytes], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None, "the run ended before writing its file"
        assert time.monotonic() < deadline, "the run never wrote its file"
        time.sleep(0.05)


def _agentsim(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "agentsim", *args], capture_output=True, text=True, timeout=120)


# A reader that keeps the file open (a notebook in another process): the rows it sees, and after a
# while and a refresh. (Within one process HDF5 shares an open file: while any handle to it stays
# open, a new open in that process sees the file as it was at the first.)
HOLDER = """
import sys, time, h5py
with h5py.File(sys.argv[1], "r", swmr=True) as f:
    ds = f["metrics/step"]
    first = ds.shape[0]
    time.sleep(3.5)
    ds.refresh()
    print(first, ds.shape[0])
"""


@pytest.mark.timeout(180)
def test_a_running_trajectory_reads_and_grows_and_a_reader_never_stops_the_writer(tmp_path):
    out = tmp_path / "run.h5"
    proc = subprocess.Popen([sys.executable, "-m", "agentsim", "run", "randomwalk", "--agents", "2000", "--steps",
                             "10000000", "--every", "100", "--quiet", "--out", str(out)], start_new_session=True)
    try:
        _wait_for(out, proc)
        held = subprocess.Popen([sys.executable, "-c", HOLDER, str(out)], stdout=subprocess.PIPE, text=True)
        seen = []
        for _ in range(3):
            traj = read_trajectory(out)
            steps = traj.metrics["step"]
            assert traj.attrs["completed"] is False
            assert list(steps) == list(range(len(steps))) and traj.attrs["steps_completed"] == steps[-1]
            frames = traj.steps("walker")
            assert frames[0] == 0 and frames[-1] <= steps[-1]
            assert len(traj.agents("walker", "pos", step=int(frames[-1]))["uid"]) == 2000
            seen.append(int(steps[-1]))
            time.sleep(1.3)  # the recorder flushes at most once a second
        assert seen[0] < seen[1] < seen[2], seen
        first, later = map(int, held.communicate(timeout=60)[0].split())
        assert held.returncode == 0 and first < later  # it held the file open while the run went on
        shown = _agentsim("inspect", str(out))
        assert shown.returncode == 0 and "did not complete" in shown.stdout, shown.stderr
        drawn = _agentsim("plot", str(out), "--out", str(tmp_path / "live.png"))
        assert drawn.returncode == 0 and (tmp_path / "live.png").stat().st_size > 0, drawn.stderr
        assert proc.poll() is None  # still running
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    traj = read_trajectory(out)  # killed: what its last flush wrote
    assert traj.attrs["completed"] is False and traj.attrs["steps_completed"] >= seen[-1]


KILLED_WRITER = """
import os, signal, sys
import numpy as np
from agentsim.io.hdf5 import TrajectoryWriter
w = TrajectoryWriter(sys.argv[1], model="m", params={}, seed=1, steps=100, compression=None)
for step in range(60):
    w.write_metrics(step, {"x": step * 2})
    if step % 10 == 0:
        w.write_agents(step, "a", {"uid": np.arange(5), "v": np.full(5, float(step))})
    if step == 39:
        w.flush()
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_killed_writers_file_reads_and_a_resumed_writer_continues_it(tmp_path):
    path = tmp_path / "w.h5"
    done = subprocess.run([sys.executable, "-c", KILLED_WRITER, str(path)], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == -signal.SIGKILL, done.stderr
    with pytest.raises(OSError, match="already open for write"):
        h5py.File(path, "r")  # HDF5 marks the file of a writer that never closed it
    traj = read_trajectory(path)
    assert traj.attrs["steps_completed"] == 39 and list(traj.metrics["x"]) == list(range(0, 80, 2))
    assert list(traj.steps("a")) == [0, 10, 20, 30]
    w = TrajectoryWriter.continue_file(path, model="m", params={}, seed=1, before=25, steps=100)
    for step in range(25, 100):
        w.write_metrics(step, {"x": step * 2})
    w.write_agents(99, "a", {"uid": np.arange(5), "v": np.full(5, 99.0)})
    w.close(completed=True)
    with h5py.File(path, "r") as f:  # closed: plain h5py reads it again
        assert bool(f.attrs["completed"]) and list(f["metrics/x"][...]) == list(range(0, 200, 2))
        assert list(f["agents/a/step"][...]) == [0, 10, 20, 99]
    assert not list(tmp_path.glob(".w.h5.*"))  # the copy replaced the file


@pytest.mark.long
def test_a_study_file_reads_while_its_driver_writes_it(tmp_path):
    path = tmp_path / "s.h5"
    spec = {"model": "demo"}
    study = StudyFile(path, spec, total=3)
    series = {"step": np.arange(4), "n": np.array([5, 4, 3, 2])}
    reader = [sys.executable, "-c", "import sys, json; from agentsim.study.store import read_study, study_status; "
              "d = read_study(sys.argv[1]); print(json.dumps([sorted(d.runs), d.completed, "
              "study_status(sys.argv[1])['done']]))", str(path)]
    for i in range(3):
        study.write_run(f"c0000-r{i:04d}", {"beta": 0.1}, seed=i, combo=0, replicate=i, metrics=series, attempts=1,
                        seconds=0.1)
        seen = subprocess.run(reader, capture_output=True, text=True, timeout=60)
        assert seen.returncode == 0, seen.stderr
        assert seen.stdout.strip() == f'[{[f"c0000-r{j:04d}" for j in range(i + 1)]}, false, {i + 1}]'.replace(
            "'", '"'), seen.stdout
    study.finish([{"beta": 0.1}])
    study.file.close()
    data = read_study(path)
    assert data.completed and study_status(path)["done"] == 3


def test_a_metric_turned_float_is_promoted_while_a_reader_holds_the_file(tmp_path):
    # HDF5 cannot delete a dataset in SWMR mode: the writer leaves it for the promotion, whatever
    # readers hold the file open, and shares the file again.
    path = tmp_path / "w.h5"
    w = TrajectoryWriter(path, model="m", params={}, seed=1, steps=3, compression=None)
    w.write_metrics(0, {"share": 0, "n": 3})
    w.flush()
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time, h5py\nf = h5py.File(sys.argv[1], 'r', "
                               "swmr=True)\nprint(f['metrics/share'].dtype, flush=True)\ntime.sleep(3)", str(path)],
                              stdout=subprocess.PIPE, text=True)
    assert holder.stdout is not None and holder.stdout.readline().strip() == "int64"
    w.write_metrics(1, {"share": 0.5, "n": 2})
    w.flush()
    assert w._file.swmr_mode  # shared again
    w.write_metrics(2, {"share": 0.25, "n": 1})
    w.close(completed=True)
    holder.wait(timeout=30)
    traj = read_trajectory(path)
    assert traj.metrics["share"].tolist() == [0.0, 0.5, 0.25] and traj.metrics["n"].tolist() == [3, 2, 1]
    assert traj.metrics["share"].dtype == np.float64 and traj.metrics["n"].dtype == np.int64


@pytest.mark.timeout(60)
def test_a_reader_that_holds_the_file_for_a_moment_does_not_stop_a_writer_from_opening_it(tmp_path, monkeypatch):
    """A study's resume once failed ("open in another process") because `study status` had the
    file open at that moment: a writer waits for such a reader (agentsim.io.live.LOCK_WAIT_SECONDS).
    """
    import functools

    from agentsim.io import live
    from agentsim.io.hdf5 import open_for_writing

    path = tmp_path / "f.h5"
    with h5py.File(path, "w", libver=live.LIBVER) as f:
        f["x"] = np.arange(3)
    opener = functools.partial(open_for_writing, fault=None)
    hold = f"from agentsim.io.live import open_to_read; import time\nf = open_to_read({str(path)!r})\n" \
           "print('open', flush=True); time.sleep(1.0); f.close()"
    for wait, opens in ((0.0, False), (live.LOCK_WAIT_SECONDS, True)):
        monkeypatch.setattr(live, "LOCK_WAIT_SECONDS", wait)
        reader = subprocess.Popen([sys.executable, "-c", hold], stdout=subprocess.PIPE, text=True)
        assert reader.stdout is not None and reader.stdout.readline() == "open\n"
        try:
            if opens:
                live.reopen_to_write(str(path), "a", opener).close()
            else:
                with pytest.raises(OSError, match="unable to lock file"):
                    live.reopen_to_write(str(path), "a", opener)
        finally:
            reader.wait(timeout=30)
