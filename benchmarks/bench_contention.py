"""How much slower a kernel runs when W copies of it run at once on this machine.

Strong scaling on a small machine is bounded by what the cores share (memory bandwidth,
last-level cache, the host's other tenants), not only by the partitioner. This measures
that bound directly: each kernel runs alone in one process, then in ``--procs`` processes
started together (one torch thread each, released by one barrier), alternating for
``--repeats`` rounds. ``slowdown`` = median time of the slowest of the W processes /
median time alone; 1.00 means the cores do not get in each other's way for that kernel.

Kernels:

- ``compute``: 64 x 64 float32 matmuls (stays in the core's L1/L2);
- ``python``: an interpreter loop (no memory traffic to speak of);
- ``stream``: ``out = a + 1`` over 64 MB float32 arrays (memory bandwidth);
- ``boids``: steps of the boids model with ``--agents`` agents (default 500,000: a rank's
  share of the 1M-boid scaling run, so ``2 / slowdown`` is about that run's ceiling).

Usage::

    python benchmarks/bench_contention.py --procs 2 --repeats 5 \\
        --out benchmarks/results/contention.json

Writes JSON (machine, torch version, git commit, per-round times) and prints a table.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_models import git_commit

KERNELS = ("compute", "python", "stream", "boids")


def _prepare(kernel: str, agents: int, steps: int):
    """A zero-argument callable that runs the kernel once (its set-up and a warm-up done
    here, untimed)."""
    if kernel == "compute":
        a, c = torch.randn(64, 64), torch.empty(64, 64)

        def matmuls() -> None:
            for _ in range(20_000):
                torch.mm(a, a, out=c)
        matmuls()  # warm-up
        return matmuls
    if kernel == "python":
        def loop() -> int:
            x = 0
            for i in range(5_000_000):
                x += i * i
            return x
        return loop
    if kernel == "stream":
        a = torch.ones(16_000_000)
        b = torch.empty_like(a)
        torch.add(a, 1, out=b)  # warm-up: touch every page once

        def adds() -> None:
            for _ in range(40):
                torch.add(a, 1, out=b)
        return adds
    if kernel == "boids":
        from agentsim import Simulation, get_model
        sim = Simulation(get_model("boids"), agents=agents, seed=0)
        sim.run(1)  # warm-up
        return lambda: sim.run(steps)
    raise ValueError(f"kernel: expected one of {KERNELS} (got {kernel!r})")


def _worker(kernel: str, agents: int, steps: int, barrier, queue) -> None:
    torch.set_num_threads(1)
    run = _prepare(kernel, agents, steps)
    barrier.wait()
    t0 = time.perf_counter()
    run()
    queue.put(time.perf_counter() - t0)


def _timed(kernel: str, procs: int, agents: int, steps: int) -> float:
    """Seconds of the slowest of ``procs`` processes running ``kernel`` at the same time."""
    ctx = mp.get_context("spawn")
    barrier, queue = ctx.Barrier(procs), ctx.Queue()
    workers = [ctx.Process(target=_worker, args=(kernel, agents, steps, barrier, queue)) for _ in range(procs)]
    for w in workers:
        w.start()
    times = [queue.get(timeout=600) for _ in workers]
    for w in workers:
        w.join()
        if w.exitcode != 0:
            raise RuntimeError(f"{kernel}: a worker exited with code {w.exitcode}")
    return max(times)


def contention(kernels: list[str], procs: int = 2, repeats: int = 5, agents: int = 500_000,
               steps: int = 3) -> dict:
    out: dict = {"procs": procs, "repeats": repeats, "agents": agents, "steps": steps,
                 "cpu_count": os.cpu_count(), "torch": torch.__version__,
                 "python": platform.python_version(), "git_commit": git_commit(), "kernels": {}}
    for kernel in kernels:
        alone, together = [], []
        for _ in range(repeats):
            alone.append(_timed(kernel, 1, agents, steps))
            together.append(_timed(kernel, procs, agents, steps))
        a, t = statistics.median(alone), statistics.median(together)
        out["kernels"][kernel] = {"alone_seconds": a, "together_seconds": t, "slowdown": t / a,
                                  "alone_rounds": alone, "together_rounds": together}
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--kernels", nargs="+", default=list(KERNELS), choices=KERNELS)
    p.add_argument("--procs", type=int, default=2)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--agents", type=int, default=500_000, help="boids kernel: agents per process")
    p.add_argument("--steps", type=int, default=3, help="boids kernel: steps per timing")
    p.add_argument("--out", default=str(Path(__file__).parent / "results" / "contention.json"))
    a = p.parse_args()
    if a.procs < 2 or a.repeats < 1 or a.agents < 1 or a.steps < 1:
        p.error(f"expected --procs >= 2 and --repeats, --agents, --steps >= 1 "
                f"(got {a.procs}, {a.repeats}, {a.agents}, {a.steps})")
    figures = contention(a.kernels, a.procs, a.repeats, a.agents, a.steps)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(figures, f, indent=2)
    print(f"{a.procs} processes at once against one alone, median of {a.repeats} rounds "
          f"({figures['cpu_count']} CPUs)")
    print(f"{'kernel':8s} {'alone s':>8s} {'together s':>10s} {'slowdown':>8s}")
    for k, v in figures["kernels"].items():
        print(f"{k:8s} {v['alone_seconds']:8.3f} {v['together_seconds']:10.3f} {v['slowdown']:8.2f}")
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
