"""Paired A/B of two checkouts of agentsim on the same work, in alternating rounds.

    git worktree add /tmp/agentsim-old <commit>
    python benchmarks/bench_ab.py --old /tmp/agentsim-old --new . --rounds 7 --out benchmarks/results/ab.json

Each round runs, in fresh processes and in alternating order (old first in even rounds,
new first in odd ones, so slow phases of a shared machine hit both alike):

- ``sir``: the README's main job, ``agentsim run sir --agents N --steps 100 --out FILE`` (the
  simulation seconds it prints, and its init seconds);
- ``boids_w1``: boids on one process, ms per step over ``--steps`` steps after 2 warm-up steps;
- ``boids_w2``: the same on 2 ranks with the spatial partitioner (the overlapped exchange);
- ``randomwalk``, ``schelling``, ``circles`` (with ``--work``): ms per step of that model on one
  process at ``--walk-agents`` / ``--schelling-agents`` / ``--circles-agents``.

``--work`` picks the items (default: ``sir boids_w1 boids_w2``).

It writes every round's figures, their medians and the median of the per-round ratios
new / old (JSON), and checks that both give the same final SIR counts. A checkout is used
through ``PYTHONPATH`` (its own ``agentsim`` first, and its own ``models/`` as ``agentsim.models``:
``checkout_site/sitecustomize.py``), with one torch thread per process.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench_peers import checkout_env

HERE = Path(__file__).resolve().parent
WORK = ("sir", "boids_w1", "boids_w2", "randomwalk", "schelling", "circles")


# ---------------------------------------------------------------- run inside a checkout's processes
def _simulation(model: str, agents: int, comm: Any = None, partition: str | None = None) -> Any:
    import agentsim

    if comm is None:
        return agentsim.Simulation(agentsim.get_model(model), agents=agents, seed=0)
    if hasattr(agentsim, "run"):  # 0.2 and later: one Simulation with a partitioner
        return agentsim.Simulation(agentsim.get_model(model), agents=agents, seed=0, comm=comm, partition=partition)
    from agentsim.distributed import DistributedSimulation  # 0.1

    return DistributedSimulation(agentsim.get_model(model), agents=agents, seed=0, comm=comm, partition=partition)


def seconds_per_step(comm: Any, model: str, agents: int, steps: int, partition: str | None) -> float:
    """One rank's (or the one process's) seconds per step, after two warm-up steps."""
    sim = _simulation(model, agents, comm, partition)
    sim.run(2)
    return float(sim.run(steps).seconds) / steps


# ---------------------------------------------------------------- the driver
def _env(root: Path) -> dict[str, str]:
    env = checkout_env(root, HERE)  # its own agentsim and models
    env["OMP_NUM_THREADS"] = "1"
    return env


def _sir(root: Path, agents: int, out: Path) -> tuple[float, float, str]:
    done = subprocess.run([sys.executable, "-W", "ignore", "-m", "agentsim", "run", "sir", "--agents", str(agents),
                           "--steps", "100", "--out", str(out)], capture_output=True, text=True, env=_env(root),
                          cwd=root)
    if done.returncode:
        raise SystemExit(f"{root}: agentsim run sir failed:\n{done.stderr[-2000:]}")
    times = re.search(r"init ([\d.]+) s; simulation ([\d.]+) s", done.stdout)
    final = re.search(r"final: (.*)", done.stdout)
    assert times is not None and final is not None, done.stdout
    return float(times.group(2)), float(times.group(1)), final.group(1)


def _per_step(root: Path, model: str, agents: int, steps: int, world_size: int) -> float:
    if world_size == 1:
        code = f"import bench_ab; print(bench_ab.seconds_per_step(None, {model!r}, {agents}, {steps}, None))"
    else:
        code = ("try:\n    from agentsim.runner.launch import run_ranks\n"  # 0.3 and later
                "except ImportError:\n    from agentsim.distributed import run_ranks\n"
                "import bench_ab\n"
                f"print(run_ranks(bench_ab.seconds_per_step, {world_size}, ({model!r}, {agents}, {steps}, 'spatial'), "
                "timeout=600)[0])")
    done = subprocess.run([sys.executable, "-W", "ignore", "-c", code], capture_output=True, text=True, env=_env(root),
                          cwd=root)
    if done.returncode:
        raise SystemExit(f"{root}: {model} on {world_size} failed:\n{done.stderr[-2000:]}")
    return float(done.stdout.strip().splitlines()[-1]) * 1e3


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--old", required=True, help="checkout of the baseline (a git worktree)")
    ap.add_argument("--new", default=".", help="checkout under test (default: this one)")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--sir-agents", type=int, default=1_000_000)
    ap.add_argument("--boids-agents", type=int, default=1_000_000)
    ap.add_argument("--walk-agents", type=int, default=10_000_000)
    ap.add_argument("--schelling-agents", type=int, default=1_000_000)
    ap.add_argument("--circles-agents", type=int, default=100_000)
    ap.add_argument("--steps", type=int, default=10, help="timed steps per run (boids, randomwalk, schelling)")
    ap.add_argument("--work", nargs="+", choices=WORK, default=["sir", "boids_w1", "boids_w2"])
    ap.add_argument("--out", help="JSON path (default: benchmarks/results/ab-<time>.json)")
    args = ap.parse_args(argv)
    roots = {"old": Path(args.old).resolve(), "new": Path(args.new).resolve()}
    for name, root in roots.items():
        if not (root / "agentsim" / "__init__.py").is_file():
            print(f"bench_ab: --{name} {root} is not an agentsim checkout", file=sys.stderr)
            return 2
    if args.rounds < 1:
        print(f"bench_ab: --rounds >= 1 (got {args.rounds})", file=sys.stderr)
        return 2
    per_step = {"boids_w1": ("boids", args.boids_agents, 1), "boids_w2": ("boids", args.boids_agents, 2),
                "randomwalk": ("randomwalk", args.walk_agents, 1), "schelling": ("schelling", args.schelling_agents, 1),
                "circles": ("circles", args.circles_agents, 1)}
    keys = tuple((["sir_seconds", "sir_init_seconds"] if "sir" in args.work else [])
                 + [f"{w}_ms_per_step" for w in args.work if w != "sir"])
    rounds: dict[str, dict[str, list[float]]] = {v: {k: [] for k in keys} for v in roots}
    finals: dict[str, set[str]] = {v: set() for v in roots}
    scratch = Path(os.environ.get("TMPDIR", "/tmp"))
    for r in range(args.rounds):
        order = ["old", "new"] if r % 2 == 0 else ["new", "old"]
        for work in args.work:
            for v in order:
                if work == "sir":
                    seconds, init, final = _sir(roots[v], args.sir_agents, scratch / f"bench_ab_sir_{v}.h5")
                    rounds[v]["sir_seconds"].append(seconds)
                    rounds[v]["sir_init_seconds"].append(init)
                    finals[v].add(final)
                else:
                    model, agents, world_size = per_step[work]
                    rounds[v][f"{work}_ms_per_step"].append(_per_step(roots[v], model, agents, args.steps,
                                                                      world_size))
        print(f"round {r + 1}/{args.rounds}: " + "; ".join(
            f"{k}: old {rounds['old'][k][-1]:.3f} new {rounds['new'][k][-1]:.3f}" for k in keys), flush=True)
    ratios = {}
    for k in keys:  # a figure printed as 0.00 s (a tiny run) has no ratio
        per_round = [n / o for o, n in zip(rounds["old"][k], rounds["new"][k], strict=True) if o > 0]
        ratios[k] = statistics.median(per_round) if per_round else float("nan")
    figures = {
        "old": str(roots["old"]), "new": str(roots["new"]), "rounds": args.rounds, "per_round": rounds,
        "median": {v: {k: statistics.median(x) for k, x in rounds[v].items()} for v in roots},
        "median_ratio_new_over_old": ratios, "same_final_sir": finals["old"] == finals["new"],
        "final_sir": {v: sorted(f) for v, f in finals.items()},
        "commits": {v: _commit(root) for v, root in roots.items()},
        "cpu_count": os.cpu_count(), "python": platform.python_version(), "date": time.strftime("%Y-%m-%d"),
    }
    out = Path(args.out) if args.out else HERE / "results" / f"ab-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(figures, indent=1) + "\n")
    for k in keys:
        print(f"{k}: median old {figures['median']['old'][k]:.3f}, new {figures['median']['new'][k]:.3f}; "
              f"new/old per round, median {ratios[k]:.3f}")
    print(f"same final SIR counts: {figures['same_final_sir']}; wrote {out}")
    return 0


def _commit(root: Path) -> str | None:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True,
                              cwd=root).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


if __name__ == "__main__":
    sys.exit(main())
