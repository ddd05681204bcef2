"""Every example runs (small sizes) and writes what it says."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("script, args, outputs", [
    ("sir_curve.py", ["--agents", "20000", "--steps", "30"], ["ex.h5", "ex.png"]),
    ("wolfsheep_populations.py", ["--agents", "300", "--steps", "20"], ["ex.h5", "ex.png"]),
    ("custom_model.py", [], []),
])
def test_example_runs(script, args, outputs, tmp_path):
    extra = ["--out", str(tmp_path / "ex")] if outputs else []
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / script), *args, *extra],
                          capture_output=True, text=True, timeout=240, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    for name in outputs:
        assert (tmp_path / name).stat().st_size > 0
