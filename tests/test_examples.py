"""Every example runs (small sizes) and writes what it says, with the numbers it should."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
PNG = b"\x89PNG\r\n\x1a\n"


def run_example(script: str, *args: str) -> str:
    # An example uses no deprecated API: a DeprecationWarning fails it.
    proc = subprocess.run([sys.executable, "-W", "error::DeprecationWarning", str(ROOT / "examples" / script), *args],
                          capture_output=True, text=True, timeout=240, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def assert_png(path: Path) -> None:
    data = path.read_bytes()
    assert data[:8] == PNG and len(data) > 10_000, path  # a real figure, not an empty canvas


def test_sir_curve_writes_the_epidemic_and_follows_the_reference(tmp_path):
    out = run_example("sir_curve.py", "--agents", "20000", "--steps", "40", "--out", str(tmp_path / "ex"))
    with h5py.File(tmp_path / "ex.h5") as f:
        s, i, r = (f["metrics"][k][:] for k in ("S", "I", "R"))
        assert f.attrs["completed"] and list(f["metrics"]["step"][:]) == list(range(41))
    assert np.array_equal(s + i + r, np.full(41, 20000)) and r[-1] > 0
    size, ref = map(float, re.search(r"final size ([\d.]+) \(reference ([\d.]+)\)", out).groups())
    assert abs(size - ref) < 0.02, out
    assert_png(tmp_path / "ex.png")


def test_wolfsheep_populations_writes_both_populations(tmp_path):
    run_example("wolfsheep_populations.py", "--agents", "300", "--steps", "20", "--out", str(tmp_path / "ex"))
    with h5py.File(tmp_path / "ex.h5") as f:
        sheep, wolves, grass = (f["metrics"][k][:] for k in ("n_sheep", "n_wolf", "grass"))
    assert len(sheep) == len(wolves) == len(grass) == 21 and sheep[0] + wolves[0] == 300
    assert (sheep >= 0).all() and (wolves >= 0).all() and grass.max() > 0
    assert_png(tmp_path / "ex.png")


def test_custom_model_gives_the_known_mean_squared_displacement(tmp_path):
    out = run_example("custom_model.py", "--out", str(tmp_path / "walk"), "--steps", "20")
    msd, expected = map(float, re.search(r"MSD after 20 steps: ([\d.]+) \(expected .* = ([\d.]+)\)", out).groups())
    assert expected == 10.0 and abs(msd - expected) < 1.5, out  # 1000 walkers: about 3% noise
    assert "move" in out and "ms/step" in out  # the plan with the run's timings
    with h5py.File(tmp_path / "walk.h5") as f:
        assert f["metrics"]["msd"][-1] == pytest.approx(msd, abs=1e-3)
        assert f["agents"]["walker"]["pos"].shape == (2000, 2)  # the first and last frames of 1000 walkers
