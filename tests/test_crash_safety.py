"""A run killed (SIGKILL) at random moments while it writes its trajectory and checkpoints leaves a
readable file, and resuming finishes the same file as one uninterrupted run, bit for bit (ten kills;
``benchmarks/stress_writer_kills.py`` runs a hundred)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from stress_writer_kills import run_trials


@pytest.mark.timeout(600)
@pytest.mark.parametrize("trials", [2, pytest.param(4, marks=pytest.mark.long),
                                    pytest.param(10, marks=pytest.mark.slow)])
def test_killed_writers_leave_readable_files_that_resume_to_the_uninterrupted_file(tmp_path, trials):
    summary = run_trials(trials, steps=120, every=7, seed=1, workdir=str(tmp_path))
    failed = [r for r in summary["rows"] if not (r["readable"] and r["identical"])]
    assert not failed, failed
    killed = [r for r in summary["rows"] if not r["finished_before_kill"]]
    assert len(killed) >= trials - 2  # the kills landed while the runs were writing


@pytest.mark.timeout(300)
@pytest.mark.long
@pytest.mark.parametrize("launcher", ["nprocs", "torchrun"])
def test_a_killed_rank_restarts_the_job_from_its_checkpoint_with_the_uninterrupted_file(tmp_path, launcher):
    from stress_rank_kills import run_trials as kill_ranks

    summary = kill_ranks(1, [2], launcher, steps=120, seed=2, workdir=str(tmp_path))
    row = summary["rows"][0]
    assert row["killed_pid"] is not None and row["restarted"], row
    assert row["recovered"], row
