"""Graceful stops (issue 58): SIGINT (Ctrl-C) and SIGTERM end ``agentsim run`` at the next step
boundary on every process, with a final checkpoint, a file that is not completed but holds every
step so far, one line that says how to resume, and the shell's status (130, 143); the resumed run
ends with the uninterrupted run's bits. A second Ctrl-C stops at once; other commands end with one
line too.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import h5py
import pytest
from equivalence import assert_same_bits, h5_datasets

from agentsim.engine import stops

RUN = ["run", "randomwalk", "--agents", "100000", "--every", "10", "--quiet"]


def _start(args: list[str], cwd: Path) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "agentsim", *args], cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def _once_writing(proc: subprocess.Popen[str], path: Path, timeout: float = 120.0) -> None:
    """Wait until ``path`` holds a few steps (the file appears after step 1)."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the run never wrote its file"
        time.sleep(0.05)
    time.sleep(0.3)


def _steps_completed(path: Path) -> int:
    with h5py.File(path, "r") as f:
        assert not bool(f.attrs["completed"])
        return int(f.attrs["steps_completed"])


@pytest.mark.timeout(300)
@pytest.mark.parametrize(("nprocs", "sig", "group"), [("1", signal.SIGINT, True),
                                                      pytest.param("2", signal.SIGINT, True, marks=pytest.mark.long),
                                                      pytest.param("2", signal.SIGTERM, False, marks=pytest.mark.long)])
def test_a_stopped_run_says_how_to_resume_and_the_resume_is_the_uninterrupted_run(tmp_path, nprocs, sig, group):
    # Ctrl-C reaches the whole process group; a scheduler's SIGTERM often only the launcher
    out, ck = tmp_path / "run.h5", tmp_path / "ck"
    args = [*RUN, "--steps", "100000", "--nprocs", nprocs, "--checkpoint-every", "100000", "--checkpoint-dir",
            str(ck), "--out", str(out)]
    proc = _start(args, tmp_path)
    _once_writing(proc, out)
    (os.killpg if group else os.kill)(proc.pid, sig)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + sig, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    step = _steps_completed(out)
    assert step >= 1
    assert lines[0].startswith(f"agentsim: stopped by {signal.Signals(sig).name} after step {step}; "), lines
    assert f"final checkpoint {ck / f'step-{step:08d}'}; resume with: agentsim run" in lines[0]
    assert (ck / f"step-{step:08d}" / "manifest.json").exists()
    total = step + 15  # resumed to a nearby end, against the same run uninterrupted
    done = subprocess.run([sys.executable, "-m", "agentsim", *args[:args.index("--steps")], "--steps", str(total),
                           *args[args.index("--steps") + 2:], "--resume", str(ck)], cwd=tmp_path,
                          capture_output=True, text=True, timeout=200)
    assert done.returncode == 0, done.stderr
    whole = tmp_path / "whole.h5"
    done = subprocess.run([sys.executable, "-m", "agentsim", *RUN, "--steps", str(total), "--out", str(whole)],
                          capture_output=True, text=True, timeout=200)
    assert done.returncode == 0, done.stderr
    assert_same_bits(h5_datasets(str(whole)), h5_datasets(str(out)), f"stopped at {step} and resumed")


@pytest.mark.long
@pytest.mark.timeout(200)
def test_a_second_ctrl_c_stops_at_once_and_other_commands_end_with_one_line(tmp_path):
    proc = _start([*RUN, "--steps", "100000", "--out", str(tmp_path / "a.h5")], tmp_path)
    _once_writing(proc, tmp_path / "a.h5")
    os.killpg(proc.pid, signal.SIGINT)
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    for args, sig in ((["sweep", "randomwalk", "--agents", "100000", "--steps", "100000", "--seeds", "1,2",
                        "--workers", "2", "--out", str(tmp_path / "s.h5"), "--quiet"], signal.SIGINT),):
        proc = _start(args, tmp_path)
        time.sleep(5)
        assert proc.poll() is None
        os.killpg(proc.pid, sig)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 128 + sig, err
        assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err


def test_outside_the_command_nothing_is_installed_and_requests_do_not_outlive_the_block():
    before = signal.getsignal(signal.SIGINT)
    with stops.graceful_stops():
        assert signal.getsignal(signal.SIGINT) is not before
        stops.request(signal.SIGTERM)
        stops.request(signal.SIGINT)  # the first request is kept
        assert stops.requested() == signal.SIGTERM
    assert stops.requested() == 0 and signal.getsignal(signal.SIGINT) is before


@pytest.mark.timeout(300)
@pytest.mark.long
@pytest.mark.parametrize(("nprocs", "sig"), [("1", signal.SIGTERM), ("2", signal.SIGINT)])
def test_a_stopped_training_writes_a_final_checkpoint_and_resumes(tmp_path, nprocs, sig):
    ck = tmp_path / "ck"
    args = ["train", "spillover", "--agents", "2000", "--horizon", "8", "--hidden", "16", "--updates", "100000",
            "--checkpoint-dir", str(ck), "--checkpoint-every", "100000", "--quiet", "--nprocs", nprocs]
    updates = []
    for again in ([], ["--resume"]):  # stopped, then resumed from the final checkpoint and stopped again
        proc = _start([*args, *again], tmp_path)
        time.sleep(6)
        assert proc.poll() is None, proc.communicate()
        os.killpg(proc.pid, sig)
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 128 + sig, err
        lines = err.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in err, err
        latest = (ck / "latest").read_text()
        updates.append(int(latest[len("ppo-"):-len(".json")]))
        assert lines[0].startswith(f"agentsim: stopped by {signal.Signals(sig).name} after update {updates[-1]}; "
                                   f"final checkpoint {ck / f'ppo-{updates[-1]:06d}.pt'}; resume with: agentsim train"
                                   ), lines
    assert updates[1] > updates[0] >= 1


@pytest.mark.long
@pytest.mark.timeout(300)
def test_running_out_of_memory_under_a_limit_is_one_line(tmp_path):
    import resource

    def limit() -> None:  # ulimit -v 3 GiB
        resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))

    for extra in ([], ["--nprocs", "2"]):
        done = subprocess.run([sys.executable, "-m", "agentsim", "run", "sir", "--agents", "200000000", "--steps", "2",
                               "--quiet", *extra], capture_output=True, text=True, preexec_fn=limit, timeout=250,
                              env={**os.environ, "AGENTSIM_MEMORY_CHECK": "0"}, cwd=tmp_path)
        assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr[-3000:]
        assert "out of memory (can't allocate memory" in done.stderr and len(done.stderr.splitlines()) <= 2, \
            done.stderr

