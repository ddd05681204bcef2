"""Memory of a differentiable rollout: the whole graph against state checkpoints (one process).

For the ``flu`` model (straight-through draws, 4 steps a day) at ``--agents`` agents over
``--steps`` steps, each mode runs in a fresh process and reports its peak resident memory, the
resident memory once the simulation is built, the wall time and d loss / d(beta, gamma) for

- ``none``: the run without ``grad`` (no history; the floor);
- ``graph``: ``grad`` with the autograd graph of every step kept until one backward pass;
- ``rollout:K``: :meth:`Simulation.rollout_gradients` with a state checkpoint every K steps.

The loss: the sum over steps of ``(I_t / N - 0.1)^2`` with ``I_t`` the infectious total.
``graph`` and every ``rollout`` mode should give the same gradients (to float rounding).

Usage::

    python benchmarks/bench_grad_memory.py --agents 1000000 --steps 100 \\
        --modes none graph rollout:1 rollout:10 rollout:100 --out benchmarks/results/grad_memory.json
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import platform
import resource
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_models import git_commit

import agentsim as asim
from agentsim.grad.autograd import sum_over_ranks

PARAMS = {"steps_per_day": 4, "relax": "straight_through"}


def _rss_mib() -> float:
    """Resident memory now (MiB), from /proc (Linux)."""
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * resource.getpagesize() / 2**20


def _observe(sim: asim.Simulation) -> torch.Tensor:
    local = sim.state["person"]["i"].sum().reshape(1)
    return sum_over_ranks(local, sim.comm)


def run_mode(mode: str, agents: int, steps: int, queue: Any) -> None:
    """One mode in this (fresh) process; puts its figures on ``queue``."""
    torch.set_num_threads(1)
    grad = mode != "none"
    sim = asim.Simulation(asim.get_model("flu"), agents=agents, seed=0, params=PARAMS,
                          grad=["beta", "gamma"] if grad else False)
    built = _rss_mib()

    def loss(y: torch.Tensor) -> torch.Tensor:
        return ((y / agents - 0.1) ** 2).sum()

    t0 = time.perf_counter()
    grads: dict[str, float] = {}
    if mode.startswith("rollout:"):
        value, g = sim.rollout_gradients(steps, _observe, loss, checkpoint_every=int(mode.split(":")[1]))
        grads = {k: float(v) for k, v in g.items()}
    else:
        ys = []
        for _ in range(steps):
            sim.step()
            ys.append(_observe(sim))
        value = loss(torch.stack(ys))
        if grad:
            grads = {k: float(v) for k, v in sim.parameter_gradients(value).items()}
    seconds = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    queue.put({"mode": mode, "agents": agents, "steps": steps, "peak_rss_mib": round(peak, 1),
               "built_rss_mib": round(built, 1), "seconds": round(seconds, 2), "loss": float(value.detach()),
               "grads": grads})


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--agents", type=int, default=1_000_000)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--modes", nargs="+", default=["none", "graph", "rollout:1", "rollout:10", "rollout:100"])
    ap.add_argument("--out", type=Path, default=None, help="JSON file to write")
    args = ap.parse_args(argv)
    ctx = mp.get_context("spawn")
    rows = []
    for mode in args.modes:
        queue = ctx.Queue()
        proc = ctx.Process(target=run_mode, args=(mode, args.agents, args.steps, queue))
        proc.start()
        row = queue.get()
        proc.join()
        rows.append(row)
        g = " ".join(f"{k} {v:.6e}" for k, v in row["grads"].items())
        print(f"{mode:>12}: peak {row['peak_rss_mib']:8.0f} MiB (built {row['built_rss_mib']:.0f}), "
              f"{row['seconds']:7.1f} s  {g}", flush=True)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        doc = {"benchmark": "grad_memory", "machine": platform.platform(), "torch": torch.__version__,
               "commit": git_commit(), "params": PARAMS, "rows": rows}
        args.out.write_text(json.dumps(doc, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
