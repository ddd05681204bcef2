"""End-to-end PPO throughput (collect + GAE + update) on the spillover model, one torch thread,
and the update's throughput on 2 ranks against 1 and against what this host allows.

Sizes are *acting* agents: N people, each choosing every day (the spillover model also simulates
N reservoir hosts, which do not act). One agent-step is one person-day: one sample of PPO.

- ``--sizes``: for each N, a fresh process trains ``--updates`` updates (the first is also timed:
  PPO has no warm-up to speak of) and reports per update the seconds of collect (the episode with
  the network acting), of GAE with the advantage statistics, and of the optimization (epochs x
  minibatches of forward, backward, exact gradient sums, Adam), agent-steps/s end to end, and the
  process's peak resident memory.
- ``--scaling-agents N``: in ``--repeats`` alternating rounds, one update's optimization at W = 1,
  at W = 2 (gloo, one thread per rank, the same N agents split), and the host's ceiling: two
  independent one-process trainers of N/2 agents started together (no collectives; what two
  cores sharing memory bandwidth give), as ``bench_scaling.py`` measures it for the simulation.
  Also the replica check's cost (a checksum of the parameters, gathered) against the update.

Usage::

    python benchmarks/bench_ppo.py --sizes 10000 100000 1000000 --scaling-agents 50000 \\
        --out benchmarks/results/ppo.json

Writes JSON (machine, torch, git commit, every round) and prints a table.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import resource
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_models import git_commit

from agentsim.learn import PPOConfig, Trainer


def _config(horizon: int) -> PPOConfig:
    return PPOConfig(horizon=horizon)


def _model() -> Any:
    from agentsim.models.spillover import MODEL

    return MODEL


def one_update(trainer: Trainer) -> dict[str, float]:
    """One update, with GAE timed apart from the optimization (same code path as Trainer.update)."""
    t0 = time.perf_counter()
    row = trainer.update()
    wall = time.perf_counter() - t0
    gae_seconds = wall - row["collect_seconds"] - row["update_seconds"]  # GAE, statistics, batch set-up
    return {"collect_seconds": row["collect_seconds"], "gae_seconds": gae_seconds,
            "optimize_seconds": row["update_seconds"], "wall_seconds": wall, "samples": row["samples"],
            "agent_steps_per_s": row["samples"] / wall, "allreduce_seconds": row["allreduce_seconds"]}


def _size_worker(people: int, updates: int, horizon: int, queue: Any) -> None:
    torch.set_num_threads(1)
    trainer = Trainer(_model(), agents=2 * people, seed=1, updates=max(updates, 2), config=_config(horizon))
    rows = [one_update(trainer) for _ in range(updates)]
    queue.put({"rows": rows, "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024})


def throughput(people: int, updates: int, horizon: int) -> dict[str, Any]:
    """Figures of ``updates`` updates at ``people`` acting agents, in a fresh process."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    p = ctx.Process(target=_size_worker, args=(people, updates, horizon, queue))
    p.start()
    got = queue.get()
    p.join()
    rows = got["rows"]
    med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
    return {"people": people, "agents_simulated": 2 * people, "updates": updates, "median": med, "rows": rows,
            "peak_rss_mib": got["peak_rss_mib"]}


def _optimize_seconds(comm: Any, people: int, horizon: int) -> dict[str, float] | None:
    torch.set_num_threads(1)
    trainer = Trainer(_model(), agents=2 * people, seed=1, updates=2, config=_config(horizon), comm=comm)
    row = trainer.update()
    t0 = time.perf_counter()
    for _ in range(5):
        trainer.check_replicas()
    check = (time.perf_counter() - t0) / 5
    return {"optimize_seconds": row["update_seconds"], "samples": row["samples"], "replica_check_seconds": check,
            "allreduce_seconds": row["allreduce_seconds"]} if comm.rank == 0 else None


def _alone_worker(people: int, horizon: int, barrier: Any, queue: Any) -> None:
    from agentsim.core.comm import LocalComm

    torch.set_num_threads(1)
    trainer = Trainer(_model(), agents=2 * people, seed=1, updates=2, config=_config(horizon), comm=LocalComm())
    rollout, mean_ret, _ = trainer.collect(1)
    barrier.wait()
    row = trainer.learn(rollout, mean_ret)  # the optimization, as timed at W = 1 and 2
    queue.put(row["update_seconds"])


def _side_by_side(people: int, horizon: int, procs: int) -> float:
    ctx = mp.get_context("spawn")
    barrier, queue = ctx.Barrier(procs), ctx.Queue()
    workers = [ctx.Process(target=_alone_worker, args=(people, horizon, barrier, queue)) for _ in range(procs)]
    for w in workers:
        w.start()
    times = [queue.get(timeout=1800) for _ in workers]
    for w in workers:
        w.join()
    return max(times)


def scaling(people: int, horizon: int, repeats: int) -> dict[str, Any]:
    """W = 1, W = 2 and two independent half-size trainers, alternating, medians of ``repeats``."""
    from agentsim.core.comm import LocalComm
    from agentsim.runner.launch import run_ranks

    rounds = []
    for _ in range(repeats):
        one = _optimize_seconds(LocalComm(), people, horizon)
        assert one is not None
        two = run_ranks(_optimize_seconds, 2, (people, horizon), timeout=1800.0)[0]
        apart = _side_by_side(people // 2, horizon, 2)
        rounds.append({"w1_seconds": one["optimize_seconds"], "w2_seconds": two["optimize_seconds"],
                       "apart_seconds": apart, "samples": one["samples"],
                       "w2_allreduce_seconds": two["allreduce_seconds"],
                       "w2_replica_check_seconds": two["replica_check_seconds"]})
    med = {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}
    return {"people": people, "repeats": repeats, "median": med, "rounds": rounds,
            "speedup": med["w1_seconds"] / med["w2_seconds"],
            "ceiling": med["w1_seconds"] / med["apart_seconds"],
            "speedup_per_round": [r["w1_seconds"] / r["w2_seconds"] for r in rounds],
            "ceiling_per_round": [r["w1_seconds"] / r["apart_seconds"] for r in rounds],
            "speedup_median_of_rounds": statistics.median(r["w1_seconds"] / r["w2_seconds"] for r in rounds),
            "replica_check_share": med["w2_replica_check_seconds"] / med["w2_seconds"]}


def _range(values: list[float]) -> str:
    return f"median {statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sizes", type=int, nargs="*", default=[10_000, 100_000], help="acting agents (people)")
    p.add_argument("--updates", type=int, default=2, help="updates per size (1M: use 1)")
    p.add_argument("--updates-large", type=int, default=1, help="updates for sizes of 1M and more")
    p.add_argument("--horizon", type=int, default=40)
    p.add_argument("--scaling-agents", type=int, default=50_000, help="people of the W=2/W=1 rounds (0: skip)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", default=str(Path(__file__).parent / "results" / "ppo.json"))
    a = p.parse_args()
    if any(n < 2 for n in a.sizes) or a.updates < 1 or a.repeats < 1 or a.horizon < 1 or a.scaling_agents < 0:
        p.error("expected sizes >= 2, --updates, --repeats, --horizon >= 1, --scaling-agents >= 0")
    out: dict[str, Any] = {"cpu_count": os.cpu_count(), "torch": torch.__version__,
                           "python": platform.python_version(), "machine": platform.machine(),
                           "git_commit": git_commit(), "horizon": a.horizon, "config": _config(a.horizon).to_dict(),
                           "sizes": [], "scaling": None}
    for n in a.sizes:
        fig = throughput(n, a.updates if n < 1_000_000 else a.updates_large, a.horizon)
        out["sizes"].append(fig)
        m = fig["median"]
        print(f"{n:>9,} people: {m['agent_steps_per_s']:>9,.0f} agent-steps/s (collect {m['collect_seconds']:.2f} s, "
              f"GAE {m['gae_seconds']:.2f} s, optimize {m['optimize_seconds']:.2f} s per update; "
              f"peak {fig['peak_rss_mib']:,.0f} MiB)", flush=True)
    if a.scaling_agents:
        s = scaling(a.scaling_agents, a.horizon, a.repeats)
        out["scaling"] = s
        m = s["median"]
        print(f"update at {a.scaling_agents:,} people: W=1 {m['w1_seconds']:.2f} s, W=2 {m['w2_seconds']:.2f} s "
              f"(speedup {s['speedup']:.2f}), two independent halves {m['apart_seconds']:.2f} s (host ceiling "
              f"{s['ceiling']:.2f}); per round: speedup {_range(s['speedup_per_round'])}, ceiling "
              f"{_range(s['ceiling_per_round'])}; all-reduce {m['w2_allreduce_seconds']:.3f} s; replica check "
              f"{m['w2_replica_check_seconds'] * 1e3:.2f} ms ({s['replica_check_share']:.3%} of the update)")
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(out, f, indent=2)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
