"""benchmarks/bench_models.py runs end to end on a tiny size and writes its figures (no timing is
asserted; about 3 s)."""

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_models.py"


def test_writes_the_figures_of_each_model(tmp_path):
    out = tmp_path / "models.json"
    done = subprocess.run([sys.executable, str(SCRIPT), "--models", "randomwalk", "boids", "--agents", "500",
                           "--repeats", "1", "--out", str(out)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    figures = json.loads(out.read_text())
    assert [r["model"] for r in figures["results"]] == ["randomwalk", "boids"]
    for r in figures["results"]:
        assert r["agents"] == 500 and r["median_step_s"] > 0 and set(r["substep_ms"]) >= {"move"}
    assert figures["results"][0]["cost_vs_randomwalk"] == 1.0 and figures["meta"]["world_size"] == 1
