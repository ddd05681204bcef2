"""benchmarks/bench_covid.py: Covasim's tables written as agentsim's CSV files (Covasim itself is
not installed in the default test run; no timing is asserted)."""

import json
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import bench_covid  # noqa: E402

from agentsim.population import AgePyramid, HouseholdSizes  # noqa: E402


def test_covasim_tables_become_the_csv_files_of_agentsims_parameters(tmp_path):
    ages = [[0, 4, 0.0605], [5, 89, 0.9328], [90, 99, 0.0067]]
    files = bench_covid.write_covasim_tables({"ages": ages, "household_poisson_mean": 2.0}, tmp_path)
    assert set(files) == {"age_pyramid", "household_sizes"}
    pyramid = AgePyramid.from_csv(files["age_pyramid"])
    assert pyramid.age_from == (0, 5, 90) and pyramid.age_to == (4, 89, 99)
    assert [w / 100 for w in pyramid.weight] == [w for _, _, w in ages]
    households = HouseholdSizes.from_csv(files["household_sizes"])
    assert households.size[0] == 1 and math.isclose(sum(households.weight), 100.0, rel_tol=1e-12)
    lam = 2.0  # a Poisson number of persons, households of none skipped: its mean is lam / (1 - e**-lam)
    assert math.isclose(households.mean, lam / -math.expm1(-lam), rel_tol=1e-9)
    assert math.isclose(households.weight[1] / households.weight[0], lam / 2, rel_tol=1e-12)  # p(2) / p(1)


def test_agentsims_side_reports_its_curves_and_their_peaks():
    got = bench_covid._run(sys.executable, bench_covid.AGENTSIM,
                           [3000, 30, 2, 0.01, json.dumps({**bench_covid.COMPARABLE, "people_per_locality": 3000})],
                           bench_covid.checkout_env(ROOT))
    assert "error" not in got, got
    infectious, severe = got["infectious_by_day"], got["severe_by_day"]
    assert len(infectious) == len(severe) == 30  # after day 0 .. 29
    assert got["peak_infectious"] == max(infectious) > 0 and got["peak_day"] == infectious.index(max(infectious))
    assert got["peak_severe"] == max(severe) and all(s <= i for s, i in zip(severe, infectious, strict=True))
    # the first day is timed apart, and the curves of the two runs joined are those of one run
    assert got["first_day_seconds"] > 0 and got["seconds_per_day"] > 0 and got["seconds_per_day_all_days"] > 0
    from agentsim import Simulation, get_model
    params = {"initial_prevalence": 0.01, **bench_covid.COMPARABLE, "people_per_locality": 3000}
    m = Simulation(get_model("covid"), agents=3000, seed=2, params=params).run(30).metrics
    assert infectious == (m["A"] + m["I"] + m["H"]).tolist()[1:]


def test_the_scaling_summary_keeps_the_ceiling_runs_apart_from_the_partitioned_ones():
    import bench_covid_scale

    def row(w: int, seconds: float, round_: int, independent: bool = False, final: int = 70) -> dict:
        return {"agents": 800, "world_size": w, "independent": independent, "seconds_per_day": seconds,
                "round": round_, "final_size": final if not independent else 9, "peak_infectious": 30}

    rows: list[dict] = []
    for round_, (one, eight, apart) in enumerate([(4.0, 1.0, 0.5), (6.0, 1.5, 0.75), (5.0, 2.0, 0.625)]):
        rows += [row(1, one, round_), row(8, eight, round_), row(8, apart, round_, independent=True)]
        bench_covid_scale._pair(rows, 800, round_)
    summary = {(s["world_size"], s["independent"]): s for s in bench_covid_scale._summarize(rows)}
    assert set(summary) == {(1, False), (8, False), (8, True)}
    assert summary[(8, False)]["seconds_per_day_median"] == 1.5
    assert summary[(8, False)]["speedup_of_medians"] == 5.0 / 1.5
    assert summary[(8, False)]["speedups_by_round"] == [4.0, 4.0, 2.5]
    assert summary[(8, True)]["speedup_of_medians"] == 5.0 / 0.625  # the ceiling
    assert summary[(8, True)]["speedups_by_round"] == [8.0, 8.0, 8.0]
    # the independent runs have epidemics of their own: only the partitioned runs are compared
    assert summary[(8, False)]["same_epidemic_as_one_process"] is True
    assert all("same_epidemic_as_one_process" not in r for r in rows if r["independent"])
    rows.append(row(8, 1.0, 2, final=71))
    bench_covid_scale._pair(rows, 800, 2)
    assert bench_covid_scale._summarize(rows)[1]["same_epidemic_as_one_process"] is False
