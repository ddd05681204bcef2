"""benchmarks/bench_ab.py runs end to end on tiny sizes (no timing is asserted). Behind ``slow``:
it starts about a dozen processes."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "bench_ab.py"


@pytest.mark.timeout(300)
def test_writes_paired_figures_of_two_checkouts(tmp_path):
    out = tmp_path / "ab.json"
    done = subprocess.run([sys.executable, str(SCRIPT), "--old", str(ROOT), "--new", str(ROOT), "--rounds", "1",
                           "--sir-agents", "2000", "--boids-agents", "2000", "--steps", "2", "--out", str(out)],
                          capture_output=True, text=True, timeout=280)
    assert done.returncode == 0, done.stderr
    figures = json.loads(out.read_text())
    assert figures["same_final_sir"] and figures["rounds"] == 1
    for v in ("old", "new"):
        assert all(len(x) == 1 and x[0] >= 0 for x in figures["per_round"][v].values())
        assert figures["per_round"][v]["boids_w2_ms_per_step"][0] > 0
    assert set(figures["median_ratio_new_over_old"]) == set(figures["median"]["old"])


def test_rejects_a_directory_that_is_no_checkout(tmp_path):
    done = subprocess.run([sys.executable, str(SCRIPT), "--old", str(tmp_path)], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2 and "is not an agentsim checkout" in done.stderr
