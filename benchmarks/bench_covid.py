"""agentsim's covid model beside Covasim's hybrid population: run time, memory, epidemic curves.

Both start from Covasim's default disease parameters (agentsim's betas are Covasim's per-contact
beta times its layer weights and contacts, its durations Covasim's lognormals, see
``models/covid.py``), immunity for life after an infection (Covasim's ``use_waning=False``), the
same population size, days and share of people infected at day 0, the same kind of contacts
(fixed contacts against Covasim's fixed random networks, ``FIXED_CONTACTS`` below; mixing in
whole places against Covasim's contacts redrawn every day, ``--covasim-dynamic``), and a
population made comparable to Covasim's hybrid one (``COMPARABLE`` below) and drawn from Covasim's own tables: its
age distribution and its households' sizes (a Poisson number of persons, empty households skipped),
read from the Covasim installation and given to agentsim as the CSV files of its ``age_pyramid`` and
``household_sizes`` parameters (``--own-tables``: agentsim's shipped US tables instead); each seed runs
both, alternating (Covasim first),
each in a fresh process with one thread. Reported per side: init seconds (the population, and
Covasim's contacts), the seconds of the first day apart (agentsim draws and indexes its fixed
contact groups then), seconds per simulated day over the days after the first, the same over
every day (``seconds_per_day_all_days``), peak resident memory of the process,
and the epidemic: final size (everyone ever infected), peak of the infectious (asymptomatic,
symptomatic and severe; Covasim's ``n_infectious``), deaths, and the peak of the severe (in hospital:
agentsim's H; Covasim's ``n_severe``, its critical cases included); and the numbers of infectious and
severe after each day (the curves).

Covasim runs from its own virtual environment (``benchmarks/peers/venvs/covasim``, Python 3.12,
``pip install covasim==4.0.1``), not installed with agentsim.

Usage::

    python benchmarks/bench_covid.py --agents 100000 --days 180 --seeds 10 --out benchmarks/results/covid-100k.json
    python benchmarks/bench_covid.py --agents 1000000 --days 120 --seeds 3 --out benchmarks/results/covid-1m.json
    python benchmarks/bench_covid.py --agents 100000 --days 180 --seeds 10 --location usa \
        --out benchmarks/results/covid-100k-usa.json     # both sides with Covasim's US ages and household sizes
    python benchmarks/bench_covid.py --agents 100000 --days 180 --seeds 10 --covasim-dynamic \
        --out benchmarks/results/covid-100k-dynamic.json     # Covasim's contacts redrawn every day, agentsim's places
    python benchmarks/bench_covid.py --agents 100000 --days 180 --seeds 10 --no-superspreading \
        --out benchmarks/results/covid-100k-alike.json     # everyone equally infectious, on both sides
"""

from __future__ import annotations

import argparse
import atexit
import json
import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench_peers import checkout_env, child_json

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
COVASIM = HERE / "peers" / "venvs" / "covasim" / "bin" / "python"

AGENTSIM = r"""
import json, resource, sys, time, torch
torch.set_num_threads(1)
from agentsim import Simulation, get_model
n, days, seed, prevalence = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
params = {"initial_prevalence": prevalence, **json.loads(sys.argv[5])}
t0 = time.perf_counter()
sim = Simulation(get_model("covid"), agents=n, seed=seed, params=params)
t1 = time.perf_counter()
first = sim.run(1).metrics  # the first day apart: it draws the fixed contact groups and indexes them
t2 = time.perf_counter()
rest = sim.run(days - 1).metrics  # (its row 0: the state after the first day)
t3 = time.perf_counter()
m = {k: torch.cat([torch.as_tensor(first[k]), torch.as_tensor(rest[k])[1:]]) for k in first}
infectious = (m["A"] + m["I"] + m["H"]).tolist()[1:]  # after day 0, 1, ... (row 0: before the first day), as
# Covasim's results (index t: after day t); severe cases infect too (as Covasim's)
severe = m["H"].tolist()[1:]
print(json.dumps({"init_seconds": t1 - t0, "first_day_seconds": t2 - t1, "seconds_per_day": (t3 - t2) / (days - 1),
                  "seconds_per_day_all_days": (t3 - t1) / days, "final_size": int(n - m["S"][-1]),
                  "peak_infectious": max(infectious), "peak_day": infectious.index(max(infectious)),
                  "deaths": int(m["D"][-1]), "peak_severe": max(severe),
                  "infectious_by_day": infectious, "severe_by_day": severe,
                  "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""

COVASIM_RUN = r"""
import json, os, resource, sys, time
os.environ.setdefault("NUMBA_NUM_THREADS", "1")
import covasim as cv
n, days, seed, prevalence = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
location, dynamic, alike = sys.argv[5], sys.argv[6] == "1", sys.argv[7] == "1"
layers = {"dynam_layer": {"h": 0, "s": 1, "w": 1, "c": 1}} if dynamic else {}  # contacts redrawn every day
if alike:  # every person's transmissibility 1: no superspreading
    layers["beta_dist"] = {"dist": "uniform", "par1": 1.0, "par2": 1.0}
cv.options.set(verbose=0, show=False)
t0 = time.perf_counter()
sim = cv.Sim(pop_size=n, pop_type="hybrid", n_days=days - 1, rand_seed=seed, pop_infected=max(1, round(prevalence * n)),
             use_waning=False, location=location or None, verbose=0, **layers)  # immunity for life, as agentsim's
sim.initialize()  # (days 0 .. n_days: the same number of days as agentsim's run)
t1 = time.perf_counter()
sim.run(until=1)  # the first day apart, as agentsim's (the same results as one run)
t2 = time.perf_counter()
sim.run()
t3 = time.perf_counter()
r = sim.results
infectious = [float(x) for x in r["n_infectious"].values]
severe = [float(x) for x in r["n_severe"].values]  # (critical cases are severe too)
print(json.dumps({"init_seconds": t1 - t0, "first_day_seconds": t2 - t1, "seconds_per_day": (t3 - t2) / (days - 1),
                  "seconds_per_day_all_days": (t3 - t1) / days, "final_size": int(r["cum_infections"].values[-1]),
                  "peak_infectious": max(infectious),
                  "peak_day": infectious.index(max(infectious)), "deaths": int(r["cum_deaths"].values[-1]),
                  "peak_severe": max(severe), "infectious_by_day": infectious, "severe_by_day": severe,
                  "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "version": cv.__version__}))
"""

COVASIM_TABLES = r"""
import json, sys
import covasim as cv
from covasim import parameters
location = sys.argv[1]
layers = dict(pop_type="hybrid", contacts=None)
parameters.reset_layer_pars(layers)
ages, household = cv.defaults.default_age_data, layers["contacts"]["h"]
if location:  # as cv.Sim(location=...): its ages, and households of Poisson(mean size - 1) persons, where it has them
    try:
        ages = cv.data.get_age_distribution(location)
    except ValueError:
        pass
    try:
        household = cv.data.get_household_size(location) - 1
    except ValueError:
        pass
print(json.dumps({"ages": [[int(a), int(b), float(w)] for a, b, w in ages],
                  "household_poisson_mean": float(household)}))
"""


def write_covasim_tables(tables: dict[str, Any], folder: Path) -> dict[str, str]:
    """Covasim's age distribution and household sizes as the CSV files of agentsim's ``age_pyramid``
    and ``household_sizes`` parameters. Covasim draws each household's size from a Poisson law of
    mean ``household_poisson_mean`` and skips households of none: sizes ``k >= 1`` in proportion to
    ``lam**k / k!``, the tail past ``1e-12`` folded into the last size."""
    ages, households = folder / "covasim_ages.csv", folder / "covasim_households.csv"
    ages.write_text("# Covasim's age distribution\nage_from,age_to,percent\n"
                    + "".join(f"{a},{b},{100 * w!r}\n" for a, b, w in tables["ages"]))
    lam = tables["household_poisson_mean"]
    shares, k = [], 1
    while True:
        shares.append(math.exp(-lam) * lam ** k / math.factorial(k) / -math.expm1(-lam))
        if 1 - sum(shares) < 1e-12 or k == 60:
            break
        k += 1
    shares[-1] += max(0.0, 1 - sum(shares))
    households.write_text(f"# Covasim's households: Poisson({lam}) persons, empty households skipped\nsize,percent\n"
                          + "".join(f"{size},{100 * w!r}\n" for size, w in enumerate(shares, 1)))
    return {"age_pyramid": str(ages), "household_sizes": str(households)}


# agentsim's population beside Covasim's hybrid one, which has no geography and whose school, work
# and community layers are random networks over all pupils, all workers and everyone (20, 16 and 20
# contacts each, no places): one locality (people_per_locality, set to the population), the same
# people at school (6 to 21 years) and at work (everyone from 22 to 64), one school and one community
# venue for everyone, workplaces of flat sizes (exponent 0.5: most workers in places of hundreds).
# Disease parameters: the defaults.
COMPARABLE: dict[str, Any] = {"school_size": 10**9, "school_ages": "6-21", "adult_age": 22,
                              "workplace_exponent": 0.5, "employment_rate": 1.0, "community_size": 10**9}
# Covasim's contacts are fixed for the run: in agentsim, fixed contact groups of one other person,
# 20 per person and layer (about Covasim's 20 contacts, a random network); with Covasim's contacts
# redrawn every day (--covasim-dynamic), agentsim's mixing within the whole place.
FIXED_CONTACTS: dict[str, Any] = {"contact_groups": 20, "contacts_per_group": 1.0}


SUMMARIZED = ("init_seconds", "first_day_seconds", "seconds_per_day", "seconds_per_day_all_days", "final_size",
              "peak_infectious", "peak_day", "deaths", "peak_severe", "peak_rss_mib")  # per side: medians, ranges


def _run(python: str, code: str, args: list[Any], env: dict[str, str]) -> dict[str, Any]:
    return child_json([python, "-W", "ignore", "-c", code, *map(str, args)], env=env)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--agents", type=int, default=100_000)
    p.add_argument("--days", type=int, default=180)
    p.add_argument("--seeds", type=int, default=10)
    p.add_argument("--prevalence", type=float, default=0.001, help="share infected at day 0")
    p.add_argument("--location", default="",
                   help="Covasim's location, e.g. 'usa': its age distribution and household sizes, on both sides "
                        "(default: Covasim's default tables)")
    p.add_argument("--own-tables", action="store_true",
                   help="agentsim's population from its shipped US tables instead of Covasim's")
    p.add_argument("--covasim-dynamic", action="store_true",
                   help="Covasim's school, work and community contacts redrawn every day (its dynam_layer), not "
                        "fixed for the run: mixing within a layer as in agentsim's places, without a fixed set of "
                        "contacts per person")
    p.add_argument("--no-superspreading", action="store_true",
                   help="every person equally infectious on both sides (Covasim's beta_dist a constant 1, "
                        "agentsim's transmissibility_dispersion 0) instead of Covasim's default spread")
    p.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                   help="an agentsim covid parameter (repeatable; the comparable configuration is the default)")
    p.add_argument("--out", required=True)
    args = p.parse_args()
    if args.days < 2:
        p.error(f"--days: at least 2 (the first day is timed apart from the others), got {args.days}")
    if not COVASIM.exists():
        raise SystemExit(f"bench_covid: Covasim is not installed at {COVASIM} (python3.12 -m venv "
                         f"{COVASIM.parent.parent} && {COVASIM.parent}/pip install covasim==4.0.1)")
    single = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "NUMBA_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
    mine = {**checkout_env(ROOT), **single}  # this checkout's agentsim and models
    theirs = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | single
    folder = Path(tempfile.mkdtemp(prefix="bench_covid_"))  # the tables' CSV files, for this run only
    atexit.register(shutil.rmtree, folder, True)
    tables: dict[str, Any] = {}
    if not args.own_tables:
        tables = _run(str(COVASIM), COVASIM_TABLES, [args.location], theirs)
    params = {**COMPARABLE, "people_per_locality": args.agents, **({} if args.covasim_dynamic else FIXED_CONTACTS),
              **(write_covasim_tables(tables, folder) if tables else {}),
              **({"transmissibility_dispersion": 0} if args.no_superspreading else {}),
              **{k: json.loads(v) for k, v in (item.split("=", 1) for item in args.set)}}
    rounds = []
    for seed in range(1, args.seeds + 1):
        run_args = [args.agents, args.days, seed, args.prevalence]
        covasim = _run(str(COVASIM), COVASIM_RUN, [*run_args, args.location, int(args.covasim_dynamic),
                                                     int(args.no_superspreading)], theirs)
        agentsim = _run(sys.executable, AGENTSIM, [*run_args, json.dumps(params)], mine)
        rounds.append({"seed": seed, "covasim": covasim, "agentsim": agentsim})
        brief = {side: {k: v for k, v in rounds[-1][side].items() if not k.endswith("_by_day")}  # (no curves)
                 for side in ("covasim", "agentsim")}
        print(json.dumps({"seed": seed, **brief}), flush=True)
    summary: dict[str, Any] = {}
    for side in ("covasim", "agentsim"):
        ok = [r[side] for r in rounds if "error" not in r[side]]
        summary[side] = {k: {"median": statistics.median(x[k] for x in ok), "min": min(x[k] for x in ok),
                             "max": max(x[k] for x in ok)} for k in SUMMARIZED if all(k in x for x in ok)} if ok else {}
    both = [r for r in rounds if "error" not in r["covasim"] and "error" not in r["agentsim"]]
    for key, ratio in (("seconds_per_day", "speedup_per_day_median"),
                       ("seconds_per_day_all_days", "speedup_all_days_median")):
        ratios = [r["covasim"][key] / r["agentsim"][key] for r in both]
        summary[ratio] = statistics.median(ratios) if ratios else None
    out = {"machine": platform.node(), "python": platform.python_version(), "date": time.strftime("%Y-%m-%d %H:%M:%S"),
           "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                    cwd=ROOT).stdout.strip(),
           "agents": args.agents, "days": args.days, "prevalence": args.prevalence, "threads": 1,
           "agentsim_params": params, "covasim_location": args.location, "covasim_tables": tables,
           "covasim_dynamic": args.covasim_dynamic, "no_superspreading": args.no_superspreading,
           "rounds": rounds, "summary": summary}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1))
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
