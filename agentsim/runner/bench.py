"""Strong scaling of one model with the spatial partitioner: 1 process against W (default 2).

Each run starts fresh processes (one torch thread per rank, gloo), takes ``warmup``
untimed steps, then ``steps`` timed steps. Runs at 1 and W processes alternate for
``repeats`` rounds, so slow phases of a shared machine hit both alike; every figure is
the median over the rounds. Figures (from rank 0's loop wall time, and the per-step
figures over ranks of
:attr:`RunResult.perf <agentsim.engine.simulation.RunResult.perf>`, see :mod:`agentsim.engine.perf`):

- ``seconds_per_step``: wall time of the stepping loop per step (metrics and the
  per-step figures included);
- ``speedup`` = seconds_per_step(W=1) / seconds_per_step(W); ``efficiency`` = speedup / W;
  ``speedups``: the speedup of each round (their spread says how noisy the machine was);
- ``comm_share``: mean over steps of (seconds in collectives of the slowest rank) /
  (step time of the slowest rank); waiting for a slower rank inside a collective counts
  as communication;
- ``halo_bytes_per_step``, ``bytes_sent_per_step``: summed over ranks, mean over steps;
- ``imbalance``: max/mean agents per rank at the end;
- the machine's ceiling, measured in the same rounds: W *independent* processes, each
  running ``agents / W`` agents alone (same density, no partitioner, no collectives) at
  the same time. ``ceiling_speedup`` = seconds_per_step(W=1) / seconds_per_step(slowest
  independent process) is what W cores sharing memory bandwidth and caches allow;
  ``partition_overhead`` = seconds_per_step(W) / that, the cost of the partitioner itself
  (halos, migration, waiting for the slower rank);
- the same independent processes held in step by a barrier after every step
  (``lockstep_seconds_per_step``, ``lockstep_speedup``): what a run that synchronizes
  every step, as any exact partitioned run must, could reach at best. The gap between the
  two ceilings is the cost of running in step on this machine (each step waits for the
  slower process; both hit memory-heavy phases at once).

On a machine with fewer free cores than W the processes share cores and the speedup
says little; the JSON records ``os.cpu_count()`` beside the figures.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import time
from typing import Any

import torch

from agentsim.core.catalog import get_model
from agentsim.engine.simulation import Simulation, check_agents
from agentsim.errors import ConfigError
from agentsim.runner.launch import run_ranks

__all__ = ["format_scaling", "scaling"]


def _bench_rank(comm: Any, model: str, agents: int, steps: int, warmup: int, seed: int,
                layout: str) -> dict[str, Any] | None:
    sim = Simulation(get_model(model), agents=agents, seed=seed, comm=comm, partition="spatial", layout=layout)
    if warmup:
        sim.run(warmup)
    result = sim.run(steps)
    perf = result.perf
    if comm.rank != 0:
        return None
    mean = lambda k: sum(p[k] for p in perf) / max(len(perf), 1)  # noqa: E731
    step, coll = mean("rank_step_seconds/max"), mean("comm/seconds_max")
    return {"seconds": result.seconds, "seconds_per_step": result.seconds / max(steps, 1),
            "comm_seconds_per_step": coll, "comm_share": coll / step if step > 0 else 0.0,
            "halo_bytes_per_step": mean("halo/bytes"), "halo_rows_per_step": mean("halo/rows"),
            "bytes_sent_per_step": mean("comm/bytes_sent"),
            "imbalance": perf[-1]["agents/imbalance"] if perf else 1.0,
            "migrated_per_step": mean("migrated")}


def _bench_independent(comm: Any, model: str, agents: int, steps: int, warmup: int, seed: int,
                       lockstep: bool) -> float:
    """One rank's share of the agents as a separate one-process run (the ceilings' baseline);
    with ``lockstep``, a barrier after every step.
    """
    sim = Simulation(get_model(model), agents=agents, seed=seed)
    comm.barrier()  # world_size >= 2: a TorchComm; start the timed parts together
    if warmup:
        sim.run(warmup)
    t0 = time.perf_counter()
    for _ in range(steps):
        sim.step()
        sim.metrics()  # as Simulation.run does after every step
        if lockstep:
            comm.barrier()
    return (time.perf_counter() - t0) / steps


def _git_commit() -> str | None:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True,
                              cwd=os.path.dirname(__file__)).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def scaling(model: str, agents: int | None = None, steps: int = 20, warmup: int = 2, seed: int = 0,
            layout: str = "strips", world_size: int = 2, repeats: int = 3, out: str | None = None,
            timeout: float = 600.0) -> dict[str, Any]:
    """Run ``model`` on 1 and ``world_size`` processes, ``repeats`` rounds; return (and optionally
    write as JSON) the median figures (see the module docstring).
    """
    resolved = get_model(model)
    agents = check_agents(resolved.default_agents if agents is None else agents)
    for name, value, low in (("steps", steps, 1), ("warmup", warmup, 0), ("repeats", repeats, 1),
                             ("world_size", world_size, 2)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ConfigError(f"{name}: expected an int >= {low} (got {value!r})")
    rounds: dict[int, list[dict[str, Any]]] = {1: [], world_size: []}
    independent: list[float] = []
    lockstep: list[float] = []
    share = max(1, agents // world_size)
    for _ in range(repeats):
        for w in rounds:
            rounds[w].append(run_ranks(_bench_rank, w, (model, agents, steps, warmup, seed, layout),
                                       timeout=timeout)[0])
        for held, times in ((False, independent), (True, lockstep)):
            times.append(max(run_ranks(_bench_independent, world_size,
                                       (model, share, steps, warmup, seed, held), timeout=timeout)))
    runs = {w: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for w, rs in rounds.items()}
    speedups = [a["seconds_per_step"] / b["seconds_per_step"]
                for a, b in zip(rounds[1], rounds[world_size], strict=True)]
    speedup = runs[1]["seconds_per_step"] / runs[world_size]["seconds_per_step"]
    t_independent, t_lockstep = statistics.median(independent), statistics.median(lockstep)
    figures = {
        "model": model, "agents": agents, "steps": steps, "warmup": warmup, "layout": layout,
        "world_size": world_size, "repeats": repeats, "speedup": speedup, "efficiency": speedup / world_size,
        "speedups": speedups, "runs": {str(w): r for w, r in runs.items()},
        "rounds": {str(w): rs for w, rs in rounds.items()},
        "independent_seconds_per_step": t_independent, "independent_rounds": independent,
        "ceiling_speedup": runs[1]["seconds_per_step"] / t_independent,
        "partition_overhead": runs[world_size]["seconds_per_step"] / t_independent,
        "lockstep_seconds_per_step": t_lockstep, "lockstep_rounds": lockstep,
        "lockstep_speedup": runs[1]["seconds_per_step"] / t_lockstep,
        "device": "cpu", "cpu_count": os.cpu_count(), "torch": torch.__version__,
        "python": platform.python_version(), "git_commit": _git_commit(), "threads_per_rank": 1,
    }
    if out:
        with open(out, "w") as f:
            json.dump(figures, f, indent=2)
    return figures


def format_scaling(f: dict[str, Any]) -> str:
    """The figures of :func:`scaling` as a few lines of text."""
    w = f["world_size"]
    r1, rw = f["runs"]["1"], f["runs"][str(w)]
    spread = ", ".join(f"{x:.2f}" for x in f["speedups"])
    return (f"{f['model']}: {f['agents']} agents, {f['steps']} steps, spatial ({f['layout']}), "
            f"{f['cpu_count']} CPUs, median of {f['repeats']} rounds (speedups {spread})\n"
            f"  W=1: {r1['seconds_per_step'] * 1e3:.2f} ms/step\n"
            f"  W={w}: {rw['seconds_per_step'] * 1e3:.2f} ms/step; speedup {f['speedup']:.2f}, "
            f"parallel efficiency {f['efficiency']:.0%}, communication {rw['comm_share']:.0%} of step time, "
            f"halo {rw['halo_bytes_per_step'] / 1e3:.1f} kB/step, sent {rw['bytes_sent_per_step'] / 1e3:.1f} kB/step, "
            f"max/mean agents {rw['imbalance']:.3f}\n"
            f"  ceiling: {w} independent processes of {f['agents'] // w} agents at once, "
            f"{f['independent_seconds_per_step'] * 1e3:.2f} ms/step: speedup {f['ceiling_speedup']:.2f} "
            f"without any partitioner; the partitioned run takes {f['partition_overhead']:.2f}x that\n"
            f"  in step (a barrier after every step): {f['lockstep_seconds_per_step'] * 1e3:.2f} ms/step, "
            f"speedup {f['lockstep_speedup']:.2f}")
