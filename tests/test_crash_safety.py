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
def test_ten_killed_writers_leave_readable_files_that_resume_to_the_uninterrupted_file(tmp_path):
    summary = run_trials(10, steps=120, every=7, seed=1, workdir=str(tmp_path))
    failed = [r for r in summary["rows"] if not (r["readable"] and r["identical"])]
    assert not failed, failed
    killed = [r for r in summary["rows"] if not r["finished_before_kill"]]
    assert len(killed) >= 8  # the kills landed while the runs were writing
