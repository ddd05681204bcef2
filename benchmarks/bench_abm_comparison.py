"""The ABM framework comparison's workloads (JuliaDynamics/ABMFrameworksComparison): agentsim beside
that repository's own Mesa implementations, in alternating rounds, one thread each.

    # a checkout of JuliaDynamics/ABMFrameworksComparison (553c394) in /tmp/abm-comparison: not kept here
    python benchmarks/bench_peers.py install          # Mesa 3.5.1 in benchmarks/peers/venvs/mesa
    python benchmarks/bench_abm_comparison.py --comparison /tmp/abm-comparison --rounds 5

Workloads, per each model's ``DECLARATION.md`` (sizes, parameters, steps):

- ``flocking-small``: 200 birds in a periodic 100 x 100 box, vision 5, 100 steps;
- ``flocking-large``: 400 birds in 150 x 150, vision 15, 100 steps;
- ``schelling-small``: 40 x 40 cells, 1,000 agents, Chebyshev radius 1, 3 similar to be happy, 20 steps;
- ``schelling-large``: 100 x 100 cells, 8,000 agents, radius 2, 8 similar to be happy, 20 steps;
- ``wolfsheep-small``: 25 x 25 cells, 60 sheep, 40 wolves, regrowth 20, reproduction 0.2 / 0.1, 100 steps;
- ``wolfsheep-large``: 100 x 100 cells, 1,000 sheep, 500 wolves, regrowth 10, reproduction 0.4 / 0.2,
  100 steps (energy gains 5 for sheep, 13 for wolves).

Each round runs, in fresh processes and in alternating order, the Mesa model (its ``Flocking.py`` /
``Schelling.py`` from ``--comparison``, run from their own folder as their ``benchmark_*.py`` do) and
agentsim's reference model (``boids``: the same rules as that Mesa model; ``schelling``; ``wolfsheep``), ``--runs``
runs of each with seeds 1, 2, ...; it records the seconds of a run (building the model and every
step, as the comparison times it) and of the steps alone, and the dynamics at the end: the flock's
polarization (length of the mean unit heading), Schelling's share of happy agents, the sheep and wolves.

Where agentsim differs from the declarations, on purpose: every agent decides from the same state
(synchronous; the declarations activate agents one at a time in random order), and movers settle
conflicts by random keys; agentsim's boids hold float32 positions; Schelling runs on a bounded
grid as declared (``torus=False``); its wolves and sheep start with integer energies in
``[0, 2 gain)`` (the declaration: ``[1, 2 gain]``). So the trajectories differ; the aggregate
dynamics are compared.
Published time ratios to Mesa (Mesa 3.2.0): Agents.jl 9.4x, 3.3x (WolfSheep small, large), 159x, 60x
(Flocking), 30x, 27x (Schelling); Ark.jl about 28x, 23x, 218x, 165x, 49x, 45x.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
MESA_PYTHON = HERE / "peers" / "venvs" / "mesa" / "bin" / "python"

#: name: (kind, agents, side, steps, vision or radius or wolves, homophily or regrowth time)
WORKLOADS = {
    "flocking-small": ("flocking", 200, 100, 100, 5.0, 0),
    "flocking-large": ("flocking", 400, 150, 100, 15.0, 0),
    "schelling-small": ("schelling", 1000, 40, 20, 1, 3),
    "schelling-large": ("schelling", 8000, 100, 20, 2, 8),
    "wolfsheep-small": ("wolfsheep", 100, 25, 100, 40, 20),
    "wolfsheep-large": ("wolfsheep", 1500, 100, 100, 500, 10),
}
#: The published Mesa / Agents.jl time ratios (README of the comparison, Mesa 3.2.0).
AGENTS_JL = {"flocking-small": 159.29, "flocking-large": 59.5, "schelling-small": 29.73, "schelling-large": 26.66,
             "wolfsheep-small": 9.38, "wolfsheep-large": 3.28}

_MESA = r"""
import json, os, sys, time
import numpy as np
sys.path.insert(0, os.getcwd())
kind, agents, side, steps, reach, homophily, runs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), \
    int(sys.argv[4]), float(sys.argv[5]), int(sys.argv[6]), int(sys.argv[7])
REPRODUCE = {25: (0.2, 0.1), 100: (0.4, 0.2)}
if kind == "flocking":
    from Flocking import BoidFlockers
elif kind == "schelling":
    from Schelling import SchellingModel
else:
    from agents import Sheep, Wolf
    from WolfSheep import WolfSheep
out = []
for seed in range(1, runs + 1):
    t0 = time.perf_counter()
    if kind == "flocking":
        model = BoidFlockers(seed, agents, side, side, reach)
    elif kind == "schelling":
        model = SchellingModel(seed, side, side, homophily, int(reach), agents / side**2)
    else:
        wolves = int(reach)
        model = WolfSheep(seed, side, side, agents - wolves, wolves, *REPRODUCE[side], homophily)
    t1 = time.perf_counter()
    for _ in range(steps):
        model.step()
    t2 = time.perf_counter()
    end2 = 0.0
    if kind == "flocking":
        d = np.array([a.direction for a in model.agents])
        end = float(np.linalg.norm(d.mean(0)))
    elif kind == "schelling":
        happy = sum(sum(n.type == a.type for n in a.cell.get_neighborhood(radius=int(reach)).agents) >= homophily
                    for a in model.agents)
        end = happy / len(model.agents)
    else:
        end, end2 = float(len(model.agents_by_type[Sheep])), float(len(model.agents_by_type[Wolf]))
    out.append({"run": t2 - t0, "steps": t2 - t1, "end": end, "end2": end2, "agents": len(model.agents)})
import mesa
print(json.dumps({"version": mesa.__version__, "runs": out}))
"""

_AGENTSIM = r"""
import json, sys, time
import torch
import agentsim as asim
torch.set_num_threads(1)
kind, agents, side, steps, reach, homophily, runs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), \
    int(sys.argv[4]), float(sys.argv[5]), int(sys.argv[6]), int(sys.argv[7])
if kind == "flocking":
    model = asim.get_model("boids").configure(params={"density": agents / side**2, "vision": reach})
elif kind == "schelling":
    model = asim.get_model("schelling").configure(params={"density": agents / side**2, "radius": int(reach),
                                                          "homophily": homophily, "torus": False})
else:
    sheep_p, wolf_p = {25: (0.2, 0.1), 100: (0.4, 0.2)}[side]
    model = asim.get_model("wolfsheep").configure(params={
        "density": agents / side**2, "wolf_fraction": reach / agents, "sheep_reproduce": sheep_p,
        "wolf_reproduce": wolf_p, "sheep_gain": 5.0, "wolf_gain": 13.0, "regrowth_time": homophily})
asim.Simulation(model, agents=agents, seed=0).run(2)  # imports and first calls, outside the timing
out = []
for seed in range(1, runs + 1):
    t0 = time.perf_counter()
    sim = asim.Simulation(model, agents=agents, seed=seed)
    t1 = time.perf_counter()
    result = sim.run(steps)
    t2 = time.perf_counter()
    m = {k: v[-1] for k, v in result.metrics.items()}
    end2 = 0.0
    if kind == "flocking":
        end = float(m["polarization"])
    elif kind == "schelling":
        end = float(m["happy"]) / float(m["n_resident"])
    else:
        end, end2 = float(m["n_sheep"]), float(m["n_wolf"])
    out.append({"run": t2 - t0, "steps": t2 - t1, "end": end, "end2": end2, "agents": agents})
print(json.dumps({"version": asim.__version__, "runs": out}))
"""


def _side(code: str, python: Path | str, cwd: Path, args: list[str]) -> dict[str, object]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "AGENTSIM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    done = subprocess.run([str(python), "-W", "ignore", "-c", code, *args], capture_output=True, text=True, cwd=cwd,
                          env=env, timeout=1800, check=False)
    if done.returncode:
        raise SystemExit(f"{python} in {cwd} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--comparison", type=Path, required=True, help="a checkout of ABMFrameworksComparison")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--runs", type=int, default=3, help="runs (seeds) of each side per round")
    ap.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=list(WORKLOADS))
    ap.add_argument("--comparison-commit", help="its commit, where --comparison is no git checkout")
    ap.add_argument("--out", default="benchmarks/results/abm-comparison.json")
    args = ap.parse_args()
    if not MESA_PYTHON.exists():
        raise SystemExit(f"no Mesa venv at {MESA_PYTHON}: python benchmarks/bench_peers.py install")
    per_round: dict[str, dict[str, list[dict[str, object]]]] = {w: {"mesa": [], "agentsim": []} for w in args.workloads}
    versions: dict[str, str] = {}
    for r in range(args.rounds):
        for w in args.workloads:
            kind, agents, side, steps, reach, homophily = WORKLOADS[w]
            argv = [kind, str(agents), str(side), str(steps), str(reach), str(homophily), str(args.runs)]
            folder = args.comparison / {"flocking": "Flocking", "schelling": "Schelling",
                                        "wolfsheep": "WolfSheep"}[kind] / "Mesa"
            sides = [("mesa", _MESA, MESA_PYTHON, folder), ("agentsim", _AGENTSIM, sys.executable, HERE.parent)]
            for name, code, python, cwd in (sides if r % 2 == 0 else sides[::-1]):
                got = _side(code, python, cwd, argv)
                versions[name] = str(got["version"])
                per_round[w][name] += got["runs"]  # type: ignore[arg-type]
            m, a = (statistics.median(float(x["run"]) for x in per_round[w][s][-args.runs:])  # type: ignore[arg-type]
                    for s in ("mesa", "agentsim"))
            print(f"round {r} {w:16} mesa {m * 1e3:9.2f} ms  agentsim {a * 1e3:8.2f} ms  ratio {m / a:6.1f}x",
                  flush=True)
    summary = {}
    for w, by in per_round.items():
        med = {s: {k: statistics.median(float(x[k]) for x in runs) for k in ("run", "steps", "end", "end2")}  # type: ignore[arg-type]
               for s, runs in by.items()}
        steps = WORKLOADS[w][3]
        summary[w] = {"median": med, "mesa_over_agentsim_run": med["mesa"]["run"] / med["agentsim"]["run"],
                      "mesa_over_agentsim_steps": med["mesa"]["steps"] / med["agentsim"]["steps"],
                      "agentsim_ms_per_step": med["agentsim"]["steps"] / steps * 1e3,
                      "mesa_ms_per_step": med["mesa"]["steps"] / steps * 1e3,
                      "agents_jl_published_ratio": AGENTS_JL[w]}
        s = summary[w]
        print(f"{w}: Mesa / agentsim {s['mesa_over_agentsim_run']:.1f}x a run, {s['mesa_over_agentsim_steps']:.1f}x "
              f"the steps (Agents.jl published {AGENTS_JL[w]}x); end state mesa {med['mesa']['end']:.3f} "
              f"{med['mesa']['end2']:.0f}, agentsim {med['agentsim']['end']:.3f} {med['agentsim']['end2']:.0f}")
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=HERE,
                            check=False).stdout.strip()
    comparison = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                cwd=args.comparison, check=False).stdout.strip()
    out = {"suite": "abm-comparison", "date": time.strftime("%Y-%m-%d %H:%M"), "machine": platform.node(),
           "git_commit": commit, "comparison_commit": comparison or args.comparison_commit, "versions": versions,
           "threads": 1,
           "rounds": args.rounds, "runs_per_round": args.runs,
           "workloads": {w: list(WORKLOADS[w]) for w in per_round},
           "per_round": per_round, "summary": summary}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
