"""Issue 33: a killed parent takes its workers with it; one writer per output file and checkpoint
directory (a lock naming its holder); a resume loads the checkpoint chosen at launch on every rank and
is refused when its run differs from the checkpoint's."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import h5py
import pytest
from equivalence import assert_same_bits, h5_datasets

from agentsim.cli.main import main
from agentsim.errors import OutputError
from agentsim.io import locks
from agentsim.io.checkpoint import CheckpointError
from agentsim.io.locks import LockedError, lock_file, lock_run

ROOT = Path(__file__).resolve().parents[1]
QUIET = ["run", "randomwalk", "--quiet", "--agents", "300"]


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    env.update(extra)
    return env


def _marked(marker: str) -> list[int]:
    """The pids of live processes whose environment holds ``AGENTSIM_TEST_MARKER=marker``."""
    want = f"AGENTSIM_TEST_MARKER={marker}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if want not in f.read().split(b"\0"):
                    continue
            with open(f"/proc/{entry}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    continue
        except OSError:
            continue
        found.append(int(entry))
    return found


def _holder(target: Path, kind: str) -> subprocess.Popen[str]:
    """Another process holding the lock of ``target`` (a file or a checkpoint directory) until killed."""
    code = ("import sys, time; from agentsim.io.locks import lock_run; "
            "lock_run(sys.argv[1]) if sys.argv[2] == 'file' else lock_run(None, sys.argv[1]); "
            "print('ready', flush=True); time.sleep(120)")
    proc = subprocess.Popen([sys.executable, "-c", code, str(target), kind], stdout=subprocess.PIPE, text=True,
                            env=_env())
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc


# --------------------------------------------------------------------------- parent death
@pytest.mark.skipif(not os.path.isdir("/proc"), reason="finds the workers in /proc")
@pytest.mark.timeout(180)
def test_the_workers_of_a_killed_run_die_with_it_and_stop_writing(tmp_path):
    marker = uuid.uuid4().hex
    out = tmp_path / "run.h5"
    proc = subprocess.Popen([sys.executable, "-m", "agentsim", "run", "randomwalk", "--quiet", "--agents", "400000",
                             "--steps", "100000", "--nprocs", "2", "--out", str(out), "--every", "1",
                             "--checkpoint-every", "20", "--checkpoint-dir", str(tmp_path / "ck")],
                            env=_env(AGENTSIM_TEST_MARKER=marker), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while not (out.exists() and len([p for p in _marked(marker) if p != proc.pid]) >= 2):
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            assert time.monotonic() < deadline, "the run did not start writing"
            time.sleep(0.1)
        workers = [p for p in _marked(marker) if p != proc.pid]
        time.sleep(0.5)  # writing
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        deadline = time.monotonic() + 5
        while _marked(marker) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _marked(marker), f"workers {workers} outlived their parent"
        seen = out.stat().st_mtime_ns, out.stat().st_size
        time.sleep(1.5)
        assert (out.stat().st_mtime_ns, out.stat().st_size) == seen, "the file is still being written"
    finally:
        for pid in _marked(marker):
            os.kill(pid, signal.SIGKILL)
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.long
@pytest.mark.parametrize("fallback", [False, True], ids=["prctl", "watchdog"])
def test_a_process_that_called_die_with_parent_dies_with_its_parent(fallback):
    child = ("import sys, time, agentsim.runner.lifeline as l\n"
             f"if {fallback}: l.parent_death_signal = lambda *a: False\n"
             "print(l.die_with_parent(int(sys.argv[1])), flush=True); time.sleep(60)\n")
    parent = ("import os, subprocess, sys, time\n"
              "p = subprocess.Popen([sys.executable, '-c', sys.argv[1], str(os.getpid())], stdout=subprocess.PIPE, "
              "text=True)\n"
              "print(p.pid, p.stdout.readline().strip(), flush=True); time.sleep(60)\n")
    proc = subprocess.Popen([sys.executable, "-c", parent, child], stdout=subprocess.PIPE, text=True, env=_env())
    assert proc.stdout is not None
    pid, how = proc.stdout.readline().split()
    assert how == ("watchdog" if fallback else "prctl")
    proc.kill()
    proc.wait()
    deadline = time.monotonic() + 5
    while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    break
        except OSError:
            break
        time.sleep(0.05)
    else:
        if os.path.exists(f"/proc/{pid}"):
            os.kill(int(pid), signal.SIGKILL)
            pytest.fail("the child outlived its parent")


@pytest.mark.parametrize("fallback", [False, True], ids=["pidfd", "poll"])
def test_a_process_that_called_die_with_dies_with_the_process_it_follows(fallback):
    """A process started by one (its parent, alive) that follows another, as a worker started by the
    fork server follows the launcher."""
    followed = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=_env())
    follower = ("import os, sys, time, agentsim.runner.lifeline as l\n"
                f"if {fallback}: del os.pidfd_open\n"
                "print(l.die_with(int(sys.argv[1])), flush=True); time.sleep(60)\n")
    proc = subprocess.Popen([sys.executable, "-c", follower, str(followed.pid)], stdout=subprocess.PIPE, text=True,
                            env=_env())
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == ("poll" if fallback else "pidfd")
        followed.kill()
        followed.wait()
        assert proc.wait(timeout=5) == -signal.SIGKILL
    finally:
        for p in (followed, proc):
            if p.poll() is None:
                p.kill()
                p.wait()


def test_die_with_exits_at_once_when_the_process_is_already_gone():
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # (reaped: its pid names no process, until the system reuses it)
    code = f"import agentsim.runner.lifeline as l; l.die_with({gone.pid}); print('survived')"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_env(), timeout=60)
    assert done.returncode == 1 and "survived" not in done.stdout


def test_die_with_parent_exits_at_once_when_the_parent_is_already_gone():
    code = "import agentsim.runner.lifeline as l; l.die_with_parent(1); print('survived')"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_env(), timeout=60)
    assert done.returncode == 1 and "survived" not in done.stdout


# --------------------------------------------------------------------------- one resume decision
@pytest.mark.timeout(180)
def test_a_checkpoint_committed_after_the_launch_decided_is_not_used(tmp_path, monkeypatch, capsys):
    """The overshoot of issue 33, made deterministic: a newer checkpoint appears in --resume DIR
    between the command line's choice and the ranks' loading (as when a killed run's workers were
    still checkpointing). The ranks load the chosen one: the run ends at its --steps, with the
    uninterrupted run's file."""
    import agentsim.runner.launch as launch_module

    assert main([*QUIET, "--steps", "30", "--out", str(tmp_path / "ref.h5")]) == 0
    assert main([*QUIET, "--steps", "30", "--checkpoint-every", "10", "--checkpoint-dir", str(tmp_path / "full")]) == 0
    run = tmp_path / "run.h5"
    assert main([*QUIET, "--steps", "10", "--checkpoint-every", "10", "--checkpoint-dir", str(tmp_path / "ck"),
                 "--out", str(run)]) == 0
    real = launch_module.run_ranks

    def newer_checkpoint_arrives(*args, **kwargs):
        shutil.copytree(tmp_path / "full" / "step-00000020", tmp_path / "ck" / "step-00000020")
        return real(*args, **kwargs)

    monkeypatch.setattr(launch_module, "run_ranks", newer_checkpoint_arrives)
    capsys.readouterr()
    assert main(["run", "randomwalk", "--agents", "300", "--steps", "30", "--nprocs", "2", "--resume",
                 str(tmp_path / "ck"), "--out", str(run)]) == 0
    assert "at step 10" in capsys.readouterr().out
    assert (tmp_path / "ck" / "step-00000020").is_dir()  # it was there, and not used
    with h5py.File(run, "r") as f:
        assert int(f.attrs["steps_completed"]) == 30 and int(f.attrs["steps"]) == 30 and bool(f.attrs["completed"])
    assert_same_bits(h5_datasets(str(tmp_path / "ref.h5")), h5_datasets(str(run)), "resumed vs uninterrupted")


def _agree(comm, directory):
    import agentsim.io.checkpoint as ck

    if comm.rank == 0:  # rank 0 looked before step 20 was committed, rank 1 after
        real = ck.resolve_checkpoint
        ck.resolve_checkpoint = lambda p: real(Path(p) / "step-00000010") if Path(p) == Path(directory) else real(p)
    return str(ck.agree_checkpoint(directory, comm))


@pytest.mark.timeout(120)
def test_under_torchrun_every_rank_loads_the_checkpoint_rank_0_chose(tmp_path):
    from agentsim.runner.launch import run_ranks

    assert main([*QUIET, "--steps", "20", "--checkpoint-every", "10", "--checkpoint-dir", str(tmp_path / "ck")]) == 0
    got = run_ranks(_agree, 2, (str(tmp_path / "ck"),), timeout=30)
    assert got == [str(tmp_path / "ck" / "step-00000010")] * 2


# --------------------------------------------------------------------------- locks
@pytest.mark.timeout(180)
def test_a_second_run_on_the_same_out_fails_fast_naming_the_first(tmp_path, capsys):
    out = tmp_path / "run.h5"
    first = subprocess.Popen([sys.executable, "-m", "agentsim", "run", "randomwalk", "--quiet", "--agents", "100000",
                              "--steps", "1000000", "--out", str(out)], env=_env(), stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while not Path(lock_file(out, "file")).exists() or not Path(lock_file(out, "file")).read_text().strip():
            assert first.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        t0 = time.monotonic()
        assert main([*QUIET, "--steps", "3", "--out", str(out)]) == 1
        assert time.monotonic() - t0 < 10
        err = capsys.readouterr().err
        assert f"trajectory file '{out}' is being written by another run: pid {first.pid} on host" in err
        assert "started 20" in err and "command: " in err and "agentsim run randomwalk" in err
        assert first.poll() is None  # the first run goes on
    finally:
        first.kill()
        first.wait()
    # killed: its lock is free, the next run takes it over (and says so)
    assert main([*QUIET, "--steps", "3", "--out", str(out)]) == 0
    assert "ended without releasing it (killed?); taking it over" in capsys.readouterr().err
    assert not Path(lock_file(out, "file")).exists()


def test_a_locked_checkpoint_directory_is_refused_and_freed_when_its_holder_dies(tmp_path, capsys):
    holder = _holder(tmp_path / "ck", "dir")
    try:
        assert main([*QUIET, "--steps", "4", "--checkpoint-every", "2", "--checkpoint-dir", str(tmp_path / "ck")]) == 1
        assert (f"checkpoint directory '{tmp_path / 'ck'}' is being written by another run: pid {holder.pid}"
                in capsys.readouterr().err)
        assert not list((tmp_path / "ck").glob("step-*"))
    finally:
        holder.kill()
        holder.wait()
    assert main([*QUIET, "--steps", "4", "--checkpoint-every", "2", "--checkpoint-dir", str(tmp_path / "ck")]) == 0
    assert sorted(p.name for p in (tmp_path / "ck").iterdir()) == ["step-00000002", "step-00000004"]


@pytest.mark.timeout(120)
def test_nprocs_and_training_runs_are_refused_before_starting_processes(tmp_path, capsys):
    from agentsim.learn import train

    holder = _holder(tmp_path / "log.h5", "file")
    try:
        t0 = time.monotonic()
        assert main([*QUIET, "--steps", "4", "--nprocs", "2", "--out", str(tmp_path / "log.h5")]) == 1
        assert "is being written by another run" in capsys.readouterr().err
        with pytest.raises(LockedError, match=f"training log '{tmp_path / 'log.h5'}' is being written by another run"):
            train("spillover", agents=20, updates=1, out=tmp_path / "log.h5")
        with pytest.raises(LockedError, match="training log"):
            train("spillover", agents=20, updates=1, world_size=2, out=tmp_path / "log.h5")
        assert time.monotonic() - t0 < 30
    finally:
        holder.kill()
        holder.wait()


def test_locks_are_counted_per_process_and_removed_when_released(tmp_path):
    first = lock_run(tmp_path / "a.h5", tmp_path / "ck")
    again = lock_run(tmp_path / "a.h5")
    assert again[0] is first[0]
    info = json.loads(Path(lock_file(tmp_path / "a.h5", "file")).read_text())
    assert info["pid"] == os.getpid() and info["what"] == "trajectory file"
    for lock in again + first:
        lock.release()
    assert not Path(lock_file(tmp_path / "a.h5", "file")).exists()
    assert not (tmp_path / "ck" / ".lock").exists()


def test_a_new_holder_waits_for_the_workers_of_a_dead_holder(tmp_path, monkeypatch):
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    path = Path(lock_file(tmp_path / "a.h5", "file"))
    start = locks._process_start(sleeper.pid)
    path.write_text(json.dumps({"pid": 1, "host": __import__("socket").gethostname(), "started": "then",
                                "command": "agentsim run", "workers": [[sleeper.pid, start]]}))
    threading.Timer(1.0, sleeper.kill).start()
    t0 = time.monotonic()
    taken = lock_run(tmp_path / "a.h5")
    assert time.monotonic() - t0 >= 0.9
    for lock in taken:
        lock.release()
    sleeper.wait()
    # a worker that never exits: refused, naming it
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    path.write_text(json.dumps({"pid": 1, "host": __import__("socket").gethostname(), "started": "then",
                                "command": "agentsim run", "workers": [[sleeper.pid, None]]}))
    monkeypatch.setattr(locks, "WORKER_WAIT_SECONDS", 0.5)
    try:
        with pytest.raises(LockedError, match=f"worker processes {sleeper.pid} of the run that held it"):
            lock_run(tmp_path / "a.h5")
    finally:
        sleeper.kill()
        sleeper.wait()


# --------------------------------------------------------------------------- resume checks
def _checkpointed(tmp_path: Path, *extra: str) -> Path:
    assert main([*QUIET, "--steps", "4", "--checkpoint-every", "2", "--checkpoint-dir", str(tmp_path / "ck"),
                 "--out", str(tmp_path / "run.h5"), *extra]) == 0
    return tmp_path / "ck"


@pytest.mark.parametrize("nprocs", [1, 2])
def test_a_resume_with_other_agents_is_refused_listing_the_differences(tmp_path, capsys, nprocs):
    ck = _checkpointed(tmp_path)
    capsys.readouterr()
    base = ["run", "randomwalk", "--quiet", "--steps", "6", "--resume", str(ck), "--nprocs", str(nprocs)]
    assert main([*base, "--agents", "600"]) == 2
    err = capsys.readouterr().err
    assert f"checkpoint {ck / 'step-00000004'} was saved with agents 300, not 600 (a resume continues" in err
    assert main([*base, "--agents", "600", "--seed", "5", "--out", str(tmp_path / "run.h5"), "--every", "2"]) == 2
    err = capsys.readouterr().err
    assert "was saved with seed 0, not 5; agents 300, not 600; every unset, not 2 (" in err
    with h5py.File(tmp_path / "run.h5", "r") as f:  # refused before the file was touched
        assert int(f.attrs["steps_completed"]) == 4 and bool(f.attrs["completed"])


@pytest.mark.parametrize("nprocs", [1, 2])
def test_a_resume_into_a_file_of_another_run_is_refused_before_anything_is_cut(tmp_path, capsys, nprocs):
    ck = _checkpointed(tmp_path)  # 300 walkers
    other = tmp_path / "other.h5"
    assert main(["run", "randomwalk", "--quiet", "--agents", "600", "--steps", "6", "--out", str(other)]) == 0
    before = other.read_bytes()
    capsys.readouterr()
    assert main([*QUIET, "--steps", "6", "--resume", str(ck), "--nprocs", str(nprocs),
                 "--out", str(other)]) == 2
    assert f"cannot continue '{other}': it holds a run with agents 600, not 300" in capsys.readouterr().err
    assert other.read_bytes() == before  # not cut, not marked


def test_the_python_api_refuses_the_same_differences(tmp_path):
    from agentsim import Simulation, get_model

    ck = _checkpointed(tmp_path)
    with pytest.raises(CheckpointError, match="agents 300, not 301"):
        Simulation(get_model("randomwalk"), agents=301, resume=ck)
    sim = Simulation(get_model("randomwalk"), agents=300, resume=ck)
    with pytest.raises(CheckpointError, match="record every field, not walker.pos"):
        sim.run(2, out=tmp_path / "run.h5", append=True, record=["walker.pos"])
    assert Simulation(get_model("randomwalk"), agents=300, resume=ck).run(2, out=tmp_path / "run.h5",
                                                                         append=True).metrics["step"][-1] == 6


def test_a_manifest_of_an_older_format_is_refused(tmp_path, capsys):
    ck = _checkpointed(tmp_path)
    manifest = ck / "step-00000004" / "manifest.json"
    data = json.loads(manifest.read_text())
    del data["run"], data["checksum"]
    from agentsim.io.checkpoint import manifest_checksum

    data["checksum"] = manifest_checksum(data)  # a manifest written without 'run', checksum and all
    manifest.write_text(json.dumps(data))
    capsys.readouterr()
    assert main([*QUIET, "--steps", "6", "--resume", str(ck)]) == 2
    assert "is of an older format: its manifest does not record the run" in capsys.readouterr().err


@pytest.mark.parametrize("kind", ["fifo", "device", "link to a device"])
def test_special_files_are_refused_as_outputs_and_left_as_they_are(tmp_path, capsys, kind):
    from agentsim import Simulation, get_model
    from agentsim.io.hdf5 import TrajectoryWriter
    from agentsim.learn import train
    from agentsim.study import Study

    path = tmp_path / "out.h5"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "device":
        path = Path(os.devnull)
    else:
        path.symlink_to(os.devnull)
    what = "a FIFO (named pipe)" if kind == "fifo" else "a character device"
    before = os.stat(path)
    for nprocs in ("1", "2"):
        assert main([*QUIET, "--steps", "2", "--nprocs", nprocs, "--out", str(path)]) == 1
        assert f"it is {what}; an output must be a regular file" in capsys.readouterr().err
    assert main(["sweep", "randomwalk", "--agents", "50", "--steps", "2", "--seeds", "2", "--out", str(path)]) == 1
    assert f"study file '{path}': it is {what}" in capsys.readouterr().err
    with pytest.raises(OutputError, match=re.escape(f"training log '{path}': it is {what}")):
        train("spillover", agents=20, updates=1, out=path)
    for write in (lambda: Simulation(get_model("randomwalk"), agents=50, seed=1).run(2, out=path),
                  lambda: TrajectoryWriter(path, model="demo", params={}, seed=1, steps=1, overwrite=True),
                  lambda: Study("randomwalk", seeds=[1], steps=2, agents=50).run(out=path)):
        with pytest.raises(OutputError, match=re.escape(f"it is {what}")):
            write()
    after = os.stat(path)
    assert (after.st_mode, after.st_ino, after.st_rdev) == (before.st_mode, before.st_ino, before.st_rdev)
    assert not os.path.exists(f"{path}.lock") or kind == "device"


def test_keep_prunes_only_the_checkpoints_of_the_run_that_writes(tmp_path, capsys):
    ck = tmp_path / "ck"
    first = ["run", "randomwalk", "--quiet", "--agents", "200", "--checkpoint-every", "2", "--keep", "2",
             "--checkpoint-dir", str(ck)]
    assert main([*first, "--steps", "10"]) == 0
    assert sorted(p.name for p in ck.glob("step-*")) == ["step-00000008", "step-00000010"]
    assert main([*first, "--steps", "6", "--seed", "3"]) == 0  # another run, the same directory
    assert sorted(p.name for p in ck.glob("step-*")) == ["step-00000004", "step-00000006", "step-00000008",
                                                        "step-00000010"]
    # a resumed run goes on as the same run: its own checkpoints are pruned, the other's kept
    assert main([*first, "--steps", "14", "--resume", str(ck / "step-00000010")]) == 0
    assert sorted(p.name for p in ck.glob("step-*")) == ["step-00000004", "step-00000006", "step-00000012",
                                                        "step-00000014"]


def test_keep_prunes_only_the_checkpoints_of_the_training_that_writes(tmp_path):
    from agentsim.learn.checkpoint import load_latest

    ck = tmp_path / "ck"
    train = ["train", "spillover", "--agents", "60", "--horizon", "4", "--hidden", "8", "--minibatches", "1",
             "--epochs", "1", "--quiet", "--checkpoint-dir", str(ck), "--keep", "2"]
    assert main([*train, "--updates", "6"]) == 0
    assert sorted(p.name for p in ck.glob("ppo-*.json")) == ["ppo-000005.json", "ppo-000006.json"]
    assert main([*train, "--updates", "3", "--seed", "4"]) == 0  # a second training in the same directory
    assert sorted(p.name for p in ck.glob("ppo-*.json")) == ["ppo-000002.json", "ppo-000003.json",
                                                            "ppo-000005.json", "ppo-000006.json"]
    latest = load_latest(ck)  # names the second training's newest, which exists
    assert latest is not None and latest["update"] == 3
