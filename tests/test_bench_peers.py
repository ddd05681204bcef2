"""benchmarks/bench_peers.py and bench_roofline.py: agentsim's side runs and reports; a missing peer
is named (no peer is installed in the default test run; no timing is asserted)."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import bench_peers  # noqa: E402
import bench_roofline  # noqa: E402


@pytest.mark.long
@pytest.mark.timeout(120)
def test_agentsim_side_reports_time_memory_and_the_final_state():
    sir = bench_peers.agentsim_run("sir", 3000, 5)
    assert sir["steps"] == 5 and sir["run_seconds"] > 0 and sir["peak_rss_bytes"] > 10**7
    assert sum(sir["final"][k] for k in ("S", "I", "R")) == 3000
    walk = bench_peers.agentsim_run("randomwalk", 3000, 3)
    assert walk["seconds_per_step"] > 0 and walk["final"] == {}


def test_a_peer_not_installed_is_named(monkeypatch, tmp_path):
    monkeypatch.setattr(bench_peers, "VENVS", tmp_path)
    with pytest.raises(SystemExit, match="starsim is not installed"):
        bench_peers.peer_run("starsim", "starsim_sir.py", 10, 1)


def test_bad_rounds_is_refused():
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_peers.py"), "sir", "--rounds", "0"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "--rounds >= 1" in done.stderr


@pytest.mark.long
@pytest.mark.timeout(120)
def test_agentsim_only_runs_no_peer_and_writes_its_table(monkeypatch, tmp_path):
    monkeypatch.setattr(bench_peers, "VENVS", tmp_path)  # no peer installed: none may be asked for
    monkeypatch.setattr(bench_peers, "ROOT", tmp_path)  # results under tmp_path/benchmarks/results
    assert bench_peers.main(["boids", "--agentsim-only", "--agents", "300", "--rounds", "1", "--tag=-t"]) == 0
    table = (tmp_path / "benchmarks" / "results" / "peers-boids-t.md").read_text()
    assert "not run (--agentsim-only)" in table and ">= 1000x" in table
    assert bench_peers.main(["circles", "--agents", "400", "--rounds", "1", "--tag=-t"]) == 0
    table = (tmp_path / "benchmarks" / "results" / "peers-circles-t.md").read_text()
    assert "FLAME GPU 2 (published, not run here)" in table and "x its time" in table


def test_bandwidth_is_measured_in_bytes_per_second():
    bw = bench_roofline.bandwidth(1, repeats=1, n=1 << 22)
    assert 1e8 < bw["copy"] < 1e12 and 1e8 < bw["triad"] < 1e12
