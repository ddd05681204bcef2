"""GPU figures of issue 31 in one run: step times, CPU = GPU bits, the largest runs, PPO.

Each figure runs in a fresh process (clean memory figures; an out-of-memory ends that figure
only). Per step: the median of the steps' own seconds (``Simulation.step_seconds``) after one
warm-up step; the fused radius kernel (``AGENTSIM_FUSED=auto``) against the torch ops
(``AGENTSIM_FUSED=never``) in the same run, on the same GPU.

- ``steps``: circles 1M (fused and torch ops), boids 10M, random walk 10M and 10k, SIR 10M;
- ``bits``: every reference model on the CPU and on the GPU, and the GPU twice: identical or the
  first field or metric that differs (circles and boids also at 1M);
- ``largest``: bytes per agent at 1e8 (peak GPU allocation over agents), then one step of the
  largest random walk and SIR that fit (85% of the GPU's memory);
- ``ppo``: agent-steps per second of PPO (collect + GAE + update) on spillover, 1M people.

Usage (on a machine with a CUDA GPU; ``--small`` checks the script on a CPU in a minute)::

    python benchmarks/bench_gpu.py --out benchmarks/results/h100/gpu.json
    python benchmarks/bench_gpu.py --small --device cpu --out /tmp/gpu-small.json
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench_peers import checkout_env, child_json

ROOT = Path(__file__).resolve().parent.parent

STEP = r"""
import json, statistics, sys, time, torch, agentsim
model, n, steps, device = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
cuda = device.startswith("cuda")
t0 = time.perf_counter()
sim = agentsim.Simulation(agentsim.get_model(model), agents=n, seed=1, device=device)
if cuda: torch.cuda.synchronize()
init = time.perf_counter() - t0
sim.run(1)
res = sim.run(steps)
times = list(sim.step_seconds)[-steps:]
from agentsim.space import fused
print(json.dumps({"model": model, "agents": n, "steps": steps, "init_seconds": init,
                  "seconds_per_step": statistics.median(times), "path": fused.status(),
                  "peak_gpu_bytes": torch.cuda.max_memory_allocated() if cuda else 0,
                  "bytes_per_agent": torch.cuda.max_memory_allocated() / n if cuda else None}))
"""

BITS = r"""
import json, sys, numpy as np, torch, agentsim
model, n, steps, device = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
def run(dev):
    sim = agentsim.Simulation(agentsim.get_model(model), agents=n, seed=1, device=dev)
    metrics = sim.run(steps).metrics
    state = {}
    for name, pop in sim.state.populations.items():
        order = torch.argsort(pop["uid"].cpu())
        for field in pop.keys():
            state[f"{name}.{field}"] = pop[field].detach().cpu()[order].numpy()
    return metrics, state
def first_difference(a, b):
    (ma, sa), (mb, sb) = a, b
    for k in sorted(ma):
        if k not in mb or ma[k].dtype != mb[k].dtype or not np.array_equal(ma[k], mb[k]):
            return f"metric {k}"
    for k in sorted(sa):
        x, y = sa[k], sb.get(k)
        if y is None or x.shape != y.shape or x.tobytes() != y.tobytes():
            return f"field {k}"
    return None
cpu = run("cpu")
gpu = run(device)
again = run(device)
from agentsim.space import fused
print(json.dumps({"model": model, "agents": n, "steps": steps, "cpu_vs_gpu": first_difference(cpu, gpu) or "identical",
                  "gpu_run_to_run": first_difference(gpu, again) or "identical", "path": fused.status()}))
"""

PPO = r"""
import json, sys, time, torch
from agentsim.learn import PPOConfig, Trainer
from agentsim.models.spillover import MODEL
people, device = int(sys.argv[1]), sys.argv[2]
trainer = Trainer(MODEL, agents=2 * people, seed=1, updates=3, config=PPOConfig(horizon=40), device=device)
rows = []
for _ in range(2):
    t0 = time.perf_counter()
    row = trainer.update()
    if device.startswith("cuda"): torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    rows.append({"wall_seconds": wall, "samples": row["samples"], "agent_steps_per_s": row["samples"] / wall,
                 "collect_seconds": row["collect_seconds"], "update_seconds": row["update_seconds"]})
print(json.dumps({"people": people, "device": device, "updates": rows,
                  "agent_steps_per_s": rows[-1]["agent_steps_per_s"]}))
"""


def _child(code: str, *args: Any, env: dict[str, str] | None = None, timeout: float = 300) -> dict[str, Any]:
    """Run ``code`` with ``args`` in a fresh Python on this checkout; its JSON line, or why not."""
    got = child_json([sys.executable, "-W", "ignore", "-c", code, *map(str, args)],
                     env={**checkout_env(ROOT), **(env or {})}, timeout=timeout)
    return {**got, "args": list(map(str, args))} if "error" in got else got


def _report(row: dict[str, Any]) -> None:
    print(json.dumps(row), flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda")
    p.add_argument("--small", action="store_true", help="tiny sizes: check the script itself")
    p.add_argument("--parts", nargs="*", default=["steps", "bits", "ppo", "largest"])
    p.add_argument("--largest-models", nargs="*", default=["randomwalk", "sir"])
    p.add_argument("--max-agents", type=int, default=0, help="cap of the largest runs (0: what fits)")
    p.add_argument("--out", required=True)
    args = p.parse_args()
    dev, small = args.device, args.small
    scale = (lambda n: max(200, n // 5000)) if small else (lambda n: n)
    out: dict[str, Any] = {"machine": platform.node(), "python": platform.python_version(),
                           "date": time.strftime("%Y-%m-%d %H:%M:%S"), "device": dev, "small": small}
    try:
        import torch
        out["torch"] = torch.__version__
        out["gpu"] = torch.cuda.get_device_name() if dev.startswith("cuda") else "cpu"
        out["gpu_memory_bytes"] = torch.cuda.get_device_properties(0).total_memory if dev.startswith("cuda") else 0
    except Exception as exc:  # report, do not stop
        out["torch_error"] = repr(exc)
    try:
        out["commit"] = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                       cwd=ROOT).stdout.strip()
    except OSError:
        out["commit"] = None
    path = Path(args.out)
    path.parent.mkdir(parents=True, exist_ok=True)

    def save() -> None:
        path.write_text(json.dumps(out, indent=1))

    if "steps" in args.parts:
        out["steps"] = []
        for model, n, steps, mode in [("circles", 1_000_000, 10, "auto"), ("circles", 1_000_000, 3, "never"),
                                      ("boids", 10_000_000, 3, "auto"), ("boids", 1_000_000, 5, "never"),
                                      ("randomwalk", 10_000_000, 10, "auto"), ("randomwalk", 10_000, 50, "auto"),
                                      ("sir", 10_000_000, 10, "auto")]:
            row = _child(STEP, model, scale(n), steps, dev, env={"AGENTSIM_FUSED": mode})
            row["fused_mode"] = mode
            _report(row)
            out["steps"].append(row)
            save()
    if "bits" in args.parts:
        out["bits"] = []
        cases = [(m, 2000, 5) for m in ("boids", "circles", "sir", "schelling", "randomwalk", "wolfsheep",
                                         "sugarscape", "flu", "spillover")]
        cases += [("circles", scale(1_000_000), 2), ("boids", scale(1_000_000), 2)]
        for model, n, steps in cases:
            row = _child(BITS, model, n, steps, dev)
            _report(row)
            out["bits"].append(row)
            save()
    if "ppo" in args.parts:
        row = _child(PPO, scale(1_000_000), dev, timeout=120)
        _report(row)
        out["ppo"] = row
        save()
    if "largest" in args.parts:
        out["largest"] = []
        memory = out.get("gpu_memory_bytes") or 0
        for model in args.largest_models:
            probe = _child(STEP, model, scale(100_000_000), 1, dev, timeout=120)
            _report(probe)
            out["largest"].append(probe)
            per_agent = probe.get("bytes_per_agent")
            if per_agent and memory:
                n = int(0.85 * memory / per_agent) // 1_000_000 * 1_000_000
                n = min(n, args.max_agents) if args.max_agents else n
                row = _child(STEP, model, n, 1, dev, timeout=150)
                _report(row)
                out["largest"].append(row)
            save()
    save()
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
