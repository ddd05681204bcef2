"""benchmarks/report.py, the generator of the documentation's benchmarks page, without Sphinx."""

from __future__ import annotations

import importlib.util
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


@pytest.fixture(scope="module")
def report():
    spec = importlib.util.spec_from_file_location("benchmarks_report_under_test", ROOT / "benchmarks" / "report.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _kept_json() -> list[str]:
    """The JSON results kept in git (a checkout may hold more, untracked, that no suite reads)."""
    try:
        out = subprocess.run(["git", "ls-files", "benchmarks/results"], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout.split()
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    return sorted(Path(p).relative_to("benchmarks/results").as_posix() for p in out if p.endswith(".json"))


def test_the_recorded_results_render_every_kept_file(report, tmp_path):
    kept = _kept_json()
    out, images = tmp_path / "page.md", tmp_path / "img"
    got = report.write(RESULTS, out, images)
    assert got is not None
    rendered = {f for s in got.sections for f in s.files}
    assert set(kept) <= rendered, sorted(set(kept) - rendered)
    assert not {rel for rel, _ in got.not_rendered} & set(kept)
    assert {"peers-sir", "peers-boids", "peers-sizes", "roofline", "scaling", "ab", "neighbors", "models",
            "parent_kills", "writer_kills", "untrusted_files", "stress_write_failures"} <= set(got.suites)
    text = out.read_text()
    for s in got.sections:  # one plot per suite, referenced from the page
        assert (images / f"{s.key}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert text.count(f"](img/{s.key}.png)") == 1
    assert sorted(p.name for p in images.glob("*.png")) == sorted(f"{k}.png" for k in got.suites)
    # provenance as recorded, and "not recorded" where it is not
    assert "| `roofline.json` | not recorded | 2026-11-25 | not recorded |" in text
    assert "| `ab_rng_kernel.json` | 2 CPUs, Python 3.11.7 | 2026-11-25 | 9da8025 -> f1a347e |" in text
    assert "| `ab_rng_kernel.json` | `randomwalk_ms_per_step` | 4,140 ms | 1,275 ms | 0.304 | 0.296-0.348 | 5 |" in text
    # unchanged inputs: nothing is redone
    assert report.write(RESULTS, out, images) is None


def test_the_output_is_deterministic(report):
    first, second = report.render(RESULTS), report.render(RESULTS)
    assert report.markdown(first, "img") == report.markdown(second, "img")
    pngs = []
    for rep in (first, second):
        buf = io.BytesIO()
        report._save(next(s for s in rep.sections if s.key == "scaling"), buf)
        pngs.append(buf.getvalue())
    assert pngs[0] == pngs[1]
    assert b"Software" not in pngs[0]  # no matplotlib version in the file


def test_missing_fields_and_unknown_files(report, tmp_path):
    results = tmp_path / "results"
    (results / "gpu").mkdir(parents=True)
    run = {"agents": 1000, "run_seconds": 0.5, "seconds_per_step": 0.005, "steps": 100}
    (results / "gpu" / "peers-sir-x.json").write_text(json.dumps({  # no commit, no date recorded
        "suite": "sir", "rounds": 2, "device": "cpu", "machine": "x86_64, 4 cores", "python": "3.12.0",
        "runs": {"agentsim": [run, {**run, "run_seconds": 0.7}]},
        "table": [["SIR, 1k, 100 days: run", "", "0.60 s", "", ">= 10x"]]}))
    (results / "mystery.json").write_text(json.dumps({"answer": 42}))
    (results / "ab_half.json").write_text(json.dumps({"rounds": 3}))
    (results / "broken.json").write_text("{not json")
    (results / "notes.log").write_text("a log\n")

    got = report.write(results, tmp_path / "out" / "page.md", tmp_path / "out" / "plots")
    text = (tmp_path / "out" / "page.md").read_text()
    assert got.suites == ["peers-sir"]
    row = "| `gpu/peers-sir-x.json` | x86_64, 4 cores, device cpu, Python 3.12.0 | not recorded | not recorded |"
    assert row in text
    assert "| SIR, 1k, 100 days: run |   | 0.60 s |   | >= 10x |" in text
    assert "](plots/peers-sir.png)" in text
    why = dict(got.not_rendered)
    assert set(why) == {"mystery.json", "ab_half.json", "broken.json"}
    assert why["mystery.json"].startswith("no suite reads this file name")
    assert "lacks `per_round`" in why["ab_half.json"]
    assert why["broken.json"].startswith("not valid JSON")
    assert "## Files not rendered" in text and "| `mystery.json` |" in text
    assert got.other_files == ["notes.log"] and "`notes.log`" in text


def test_covid_curves_from_the_files_that_recorded_them(report, tmp_path):
    results = tmp_path / "results"
    results.mkdir()

    def side(scale: float, with_curves: bool) -> dict:
        got = {"seconds_per_day": 0.01 * scale, "init_seconds": 1.0, "peak_rss_mib": 100.0, "final_size": 800,
               "peak_infectious": 30.0 * scale, "peak_day": 12, "deaths": 4, "peak_severe": 3.0}
        if with_curves:  # 25 days: day t has t * scale infectious and t // 10 severe
            got |= {"infectious_by_day": [t * scale for t in range(25)], "severe_by_day": [t // 10 for t in range(25)]}
        return got

    def bench(seeds: list[tuple[float, float]], with_curves: bool) -> dict:
        rounds = [{"seed": j, "covasim": side(c, with_curves), "agentsim": side(a, with_curves)}
                  for j, (c, a) in enumerate(seeds, 1)]
        return {"agents": 1000, "days": 25, "rounds": rounds, "summary": {"covasim": {}, "agentsim": {}}}

    (results / "covid-curves.json").write_text(json.dumps(bench([(1.0, 2.0), (3.0, 4.0), (2.0, 3.0)], True)))
    (results / "covid-old.json").write_text(json.dumps(bench([(1.0, 1.0)], False)))  # recorded before the curves
    got = report.write(results, tmp_path / "out" / "page.md", tmp_path / "out" / "plots")
    assert got.suites == ["covid", "covid-curves"]
    curves = got.sections[1]
    assert curves.files == ["covid-curves.json"]
    text = "\n".join(curves.lines)
    assert "| after day | 10 | 20 |" in text
    # day 10: Covasim's seeds 10, 30, 20, agentsim's 20, 40, 30; day 20 twice that; severe t // 10 on every seed
    assert "| covasim infectious | 20 (10 - 30) | 40 (20 - 60) |" in text
    assert "| agentsim infectious | 30 (20 - 40) | 60 (40 - 80) |" in text
    assert "| agentsim severe | 1 (1 - 1) | 2 (2 - 2) |" in text
    assert (tmp_path / "out" / "plots" / "covid-curves.png").read_bytes()[:4] == b"\x89PNG"
