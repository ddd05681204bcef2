"""Steps/s and agent-updates/s of every reference model at several sizes.

Each (model, agents) pair: build the simulation, run one warm-up step, then time
``repeats`` blocks of ``steps`` steps and keep the median seconds per step. The
random walk, the cheapest model, is measured in the same run at every size and
each model's cost is also given as a ratio to it, so results from noisy or
different machines compare by ratio.

Usage::

    python benchmarks/bench_models.py                       # 10k, 100k, 1M agents
    python benchmarks/bench_models.py --agents 10000 --models sir boids --device cuda

Writes ``benchmarks/results/models-<timestamp>.json`` (device, torch version, git
commit, threads, world size 1) and prints a table.
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

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agentsim import Simulation, get_model
from agentsim.core.catalog import BUILTIN


def git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                              cwd=Path(__file__).parent, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


# Steps run before timing. SIR's cost grows with the number of infectious people, so it
# is timed around the epidemic peak (day ~45 with the defaults), not in the first days.
WARMUP = {"sir": 40}


def measure(model_name: str, agents: int, steps: int, repeats: int, device: str, seed: int = 0) -> dict:
    t0 = time.perf_counter()
    sim = Simulation(get_model(model_name), agents=agents, seed=seed, device=device)
    init_s = time.perf_counter() - t0
    for _ in range(WARMUP.get(model_name, 1)):
        sim.step()
    per_step = []
    for _ in range(repeats):
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(steps):
            sim.step()
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        per_step.append((time.perf_counter() - t) / steps)
    sec = statistics.median(per_step)
    substeps = {k: statistics.median(v[1:]) * 1e3 for k, v in sim.substep_seconds.items()}
    return {"model": model_name, "agents": agents, "warmup_steps": WARMUP.get(model_name, 1),
            "steps_timed": steps * repeats, "repeats": repeats,
            "init_s": init_s, "median_step_s": sec, "steps_per_s": 1 / sec,
            "agent_updates_per_s": agents / sec, "all_step_s": per_step, "substep_ms": substeps}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=list(BUILTIN), choices=list(BUILTIN))
    ap.add_argument("--agents", nargs="+", type=int, default=[10_000, 100_000, 1_000_000])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--out", default=None, help="JSON path (default benchmarks/results/models-<time>.json)")
    args = ap.parse_args()

    results = []
    for n in args.agents:
        steps = 20 if n <= 10_000 else 10 if n <= 100_000 else 3
        base = measure("randomwalk", n, steps, args.repeats, args.device)
        for name in args.models:
            r = base if name == "randomwalk" else measure(name, n, steps, args.repeats, args.device)
            r["cost_vs_randomwalk"] = r["median_step_s"] / base["median_step_s"]
            results.append(r)
            print(f"{name:>10} {n:>9,d} agents  {r['steps_per_s']:9.2f} steps/s  "
                  f"{r['agent_updates_per_s']:10.3g} agent-updates/s  "
                  f"{r['cost_vs_randomwalk']:6.1f}x randomwalk  (init {r['init_s']:.2f} s)", flush=True)
    meta = {"benchmark": "models", "device": args.device,
            "device_name": (torch.cuda.get_device_name() if args.device.startswith("cuda")
                            else platform.processor() or platform.machine()),
            "torch": torch.__version__, "python": platform.python_version(), "git_commit": git_commit(),
            "threads": torch.get_num_threads(), "cpu_count": os.cpu_count(), "world_size": 1,
            "time": time.strftime("%Y-%m-%dT%H:%M:%S")}
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out = Path(args.out) if args.out else Path(__file__).parent / "results" / f"models-{stamp}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"meta": meta, "results": results}, indent=2))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
