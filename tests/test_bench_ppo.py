"""benchmarks/bench_ppo.py runs end to end on tiny sizes (no timing is asserted). Behind the
``slow`` marker: it starts several processes (``python -m pytest -m slow`` runs it)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_ppo.py"


def test_writes_throughput_and_scaling_figures(tmp_path):
    out = tmp_path / "ppo.json"
    done = subprocess.run([sys.executable, str(SCRIPT), "--sizes", "600", "--updates", "2", "--horizon", "6",
                           "--scaling-agents", "600", "--repeats", "1", "--out", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    figures = json.loads(out.read_text())
    (size,) = figures["sizes"]
    assert size["people"] == 600 and len(size["rows"]) == 2 and size["peak_rss_mib"] > 0
    assert all(r["samples"] == 600 * 6 for r in size["rows"])
    s = figures["scaling"]
    assert len(s["rounds"]) == 1 and s["speedup"] == s["median"]["w1_seconds"] / s["median"]["w2_seconds"]
    assert 0 < s["replica_check_share"] < 1
    assert "agent-steps/s" in done.stdout and str(out) in done.stdout


def test_rejects_bad_sizes(tmp_path):
    done = subprocess.run([sys.executable, str(SCRIPT), "--sizes", "0", "--out", str(tmp_path / "x.json")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "expected sizes" in done.stderr
