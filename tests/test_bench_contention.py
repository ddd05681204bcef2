"""benchmarks/bench_contention.py runs end to end (no timing is asserted). Behind the ``slow``
marker: it starts several timed processes (``python -m pytest -m slow`` runs it)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_contention.py"


def test_writes_the_kernel_figures(tmp_path):
    out = tmp_path / "contention.json"
    done = subprocess.run([sys.executable, str(SCRIPT), "--kernels", "compute", "--repeats", "1",
                           "--out", str(out)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    figures = json.loads(out.read_text())
    assert figures["procs"] == 2 and figures["repeats"] == 1
    assert set(figures["kernels"]) == {"compute"}
    for v in figures["kernels"].values():
        assert len(v["alone_rounds"]) == len(v["together_rounds"]) == 1
        assert v["alone_seconds"] > 0 and v["slowdown"] == v["together_seconds"] / v["alone_seconds"]
    assert "compute" in done.stdout and str(out) in done.stdout


def test_rejects_a_single_process():
    done = subprocess.run([sys.executable, str(SCRIPT), "--procs", "1"], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2 and "--procs >= 2" in done.stderr and "got 1" in done.stderr
