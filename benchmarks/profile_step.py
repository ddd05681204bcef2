"""Where a model's step spends its time: torch's profiler over a few steps, on any device.

    python benchmarks/profile_step.py boids --agents 10000 --steps 20 --device cuda
    python benchmarks/profile_step.py circles --agents 1000000 --steps 3 --device cuda --rows 25

Prints the seconds per step (wall, the engine's per-substep figures), the number of operator
calls and (on a GPU) kernel launches per step, and the operators with the most self time on
the host and on the device. Not part of the test run.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agentsim import Simulation, get_model


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model")
    ap.add_argument("--agents", type=int, default=None)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--rows", type=int, default=15, help="operators listed per table")
    args = ap.parse_args(argv)
    cuda = args.device.startswith("cuda")
    sim = Simulation(get_model(args.model), agents=args.agents, seed=1, device=args.device)
    sim.run(args.warmup)
    wall = []
    for _ in range(args.steps):  # unprofiled steps first: the profiler's own cost is not in them
        t0 = time.perf_counter()
        sim.step()
        if cuda:
            torch.cuda.synchronize()
        wall.append(time.perf_counter() - t0)
    substeps = {k: statistics.median(v[-args.steps:]) * 1e3 for k, v in sim.substep_seconds.items()}
    print(f"{args.model}, {sim.n_agents:,} agents on {args.device}: {statistics.median(wall) * 1e3:.2f} ms per step "
          f"(median of {args.steps}); substeps (ms): " + ", ".join(f"{k} {v:.2f}" for k, v in substeps.items()))
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        for _ in range(args.steps):
            sim.step()
        if cuda:
            torch.cuda.synchronize()
    events = prof.key_averages()
    calls = sum(e.count for e in events if not e.key.startswith(("cuda", "Profiler")))
    print(f"operator calls per step: {calls / args.steps:.0f}")
    if cuda:
        launch_calls = ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC")
        launches = sum(e.count for e in events if e.key in launch_calls)
        syncs = sum(e.count for e in events if e.key in ("cudaStreamSynchronize", "cudaDeviceSynchronize",
                                                         "cudaMemcpyAsync"))
        print(f"kernel launches per step: {launches / args.steps:.0f}; synchronizing calls and copies per step: "
              f"{syncs / args.steps:.0f}")
        print(events.table(sort_by="self_cuda_time_total", row_limit=args.rows))
    print(events.table(sort_by="self_cpu_time_total", row_limit=args.rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
