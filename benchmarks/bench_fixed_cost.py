"""The engine's fixed cost per step on one process, one thread: small models where the engine's own
work is the run time, against an older checkout in alternating rounds.

Work (each in a fresh process, inside ``Simulation.run`` with its metrics recorded every step, in
memory):

- ``bare``: a one-substep model of 1,000 agents whose substep declares ``writes=["a.x"]`` (a float
  field) and does nothing: every millisecond is the engine's (the step, the NaN check of the
  written field, the count of agents, the report, the figures, the metrics row);
- ``bare_calls``: the Python function calls of one ``bare`` step (cProfile's count; machine-independent);
- ``randomwalk``: the reference random walk at 1,000 agents (one draw, one move, one exact metric);
- ``boids``: the reference boids at 200 agents (the comparison's Flocking small size).

    python benchmarks/bench_fixed_cost.py --rounds 5 --old /tmp/agentsim-old --out benchmarks/results/fixed-cost.json

Without ``--old`` it measures this checkout only.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench_peers import checkout_env

HERE = Path(__file__).resolve().parent
WORK = {"bare": (1000, 2000), "randomwalk": (1000, 2000), "boids": (200, 500)}

_CODE = """
import cProfile, json, pstats, sys
import torch
import agentsim as asim
torch.set_num_threads(1)
work, agents, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
if work in ("bare", "bare_calls"):
    model = asim.Model("bare", params={}, default_agents=agents)
    model.substep(name="touch", writes=["a.x"])(lambda ctx: None)

    @model.init
    def init(ic):
        ic.add("a", uid=ic.uids("a", ic.n_agents), x=torch.zeros(ic.n_agents))
        return asim.Box((10.0, 10.0))
else:
    model = asim.get_model(work)
sim = asim.Simulation(model, agents=agents, seed=1)
sim.run(20)
if work == "bare_calls":
    profile = cProfile.Profile()
    profile.enable()
    sim.run(steps)
    profile.disable()
    print(json.dumps(pstats.Stats(profile).total_calls / steps))
else:
    print(json.dumps(sim.run(steps).seconds / steps * 1e3))
"""


def measure(root: Path, work: str) -> float:
    """ms per step (or calls per step) of ``work`` in a fresh process of the checkout ``root``."""
    agents, steps = WORK["bare" if work == "bare_calls" else work]
    env = {**checkout_env(root, HERE), "OMP_NUM_THREADS": "1", "AGENTSIM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-W", "ignore", "-c", _CODE, work, str(agents),
                           str(200 if work == "bare_calls" else steps)], capture_output=True, text=True, env=env,
                          cwd=root, timeout=600, check=False)
    if done.returncode:
        raise SystemExit(f"{root}: {work} failed:\n{done.stderr[-2000:]}")
    return float(json.loads(done.stdout.strip().splitlines()[-1]))


def _commit(root: Path) -> str:
    return subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                          check=False).stdout.strip()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--new", type=Path, default=HERE.parent)
    ap.add_argument("--old", type=Path, default=None, help="an older checkout (git worktree add PATH COMMIT)")
    ap.add_argument("--work", nargs="+", default=[*WORK, "bare_calls"], choices=[*WORK, "bare_calls"])
    ap.add_argument("--out", default="benchmarks/results/fixed-cost.json")
    args = ap.parse_args()
    sides = {"new": args.new.resolve(), **({"old": args.old.resolve()} if args.old else {})}
    rounds: dict[str, dict[str, list[float]]] = {w: {s: [] for s in sides} for w in args.work}
    for r in range(args.rounds):
        order = list(sides) if r % 2 == 0 else list(reversed(sides))
        for work in args.work:
            for side in order:
                value = measure(sides[side], work)
                rounds[work][side].append(value)
                print(f"round {r} {work:10} {side}: {value:.4f}", flush=True)
    median = {w: {s: statistics.median(v) for s, v in by.items()} for w, by in rounds.items()}
    ratio = {w: statistics.median(n / o for n, o in zip(by["new"], by["old"], strict=True))
             for w, by in rounds.items() if "old" in by}
    for w in args.work:
        print(f"{w}: " + ", ".join(f"{s} {v:.4f}" for s, v in median[w].items())
              + (f"; new/old {ratio[w]:.3f}" if w in ratio else ""))
    out = {"suite": "fixed-cost", "date": time.strftime("%Y-%m-%d %H:%M"), "machine": platform.node(),
           "git_commit": _commit(sides["new"]), "old_commit": _commit(sides["old"]) if "old" in sides else None,
           "threads": 1, "rounds": args.rounds, "work": {w: list(WORK["bare" if w == "bare_calls" else w])
                                                         for w in args.work},
           "units": {w: "calls per step" if w == "bare_calls" else "ms per step" for w in args.work},
           "per_round": rounds, "median": median, "median_ratio_new_over_old": ratio}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
