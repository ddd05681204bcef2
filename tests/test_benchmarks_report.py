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

    def side(scale: float, severe_every: int, with_curves: bool) -> dict:
        got = {"seconds_per_day": 0.01 * scale, "init_seconds": 1.0, "peak_rss_mib": 100.0, "final_size": 800,
               "peak_infectious": 30.0 * scale, "peak_day": 12, "deaths": 4, "peak_severe": 3.0}
        if with_curves:  # 20 days (0 .. 19): day t has t * scale infectious and t // severe_every severe
            got |= {"infectious_by_day": [t * scale for t in range(20)],
                    "severe_by_day": [t // severe_every for t in range(20)]}
        return got

    def bench(seeds: list[tuple[float, float]], with_curves: bool) -> dict:
        rounds = [{"seed": j, "covasim": side(c, 5, with_curves), "agentsim": side(a, 2, with_curves)}
                  for j, (c, a) in enumerate(seeds, 1)]
        return {"agents": 1000, "days": 20, "rounds": rounds, "summary": {"covasim": {}, "agentsim": {}},
                "commit": "abc1234"}

    curves = bench([(1.0, 2.0), (3.0, 4.0), (2.0, 3.0), (4.0, 6.0)], True)
    curves["rounds"][3]["agentsim"] = {"error": "out of memory"}  # a seed that failed on one side
    curves["summary"] |= {"speedup_per_day_median": 20.0, "speedup_all_days_median": 7.5}  # first day apart
    (results / "covid-curves.json").write_text(json.dumps(curves))
    (results / "covid-old.json").write_text(json.dumps(bench([(1.0, 1.0)], False)))  # recorded before the curves
    got = report.write(results, tmp_path / "out" / "page.md", tmp_path / "out" / "plots")
    assert got.suites == ["covid", "covid-curves"]
    times = "\n".join(got.sections[0].lines)
    assert "median of the seeds: 20.0 after the first day, 7.50 over every day." in times
    assert "Seconds per day over every day (the first day included)." in times  # the old file
    section = got.sections[1]
    assert section.files == ["covid-curves.json"]
    text = "\n".join(section.lines)
    assert "| `covid-curves.json` |" in text and "abc1234" in text  # provenance
    assert "the curves of 4 (Covasim) and 3 (agentsim) of 4 seeds" in text
    assert "| after day | 10 |\n" in text  # day 20 is past the run's 20 days
    # day 10: Covasim's four seeds 10, 30, 20, 40 (median 25), agentsim's three 20, 40, 30; severe 10 // 5, 10 // 2
    assert "| covasim infectious | 25 (10 - 40) |" in text
    assert "| covasim severe | 2 (2 - 2) |" in text
    assert "| agentsim infectious | 30 (20 - 40) |" in text
    assert "| agentsim severe | 5 (5 - 5) |" in text
    assert (tmp_path / "out" / "plots" / "covid-curves.png").read_bytes()[:4] == b"\x89PNG"


def test_half_people_in_a_median_of_two(report):
    assert [report._count(x) for x in (22727.0, 1895.5, 1234567)] == ["22,727", "1,895.5", "1,234,567"]
