"""The covid model at country scale: population sizes on one process, and strong scaling over processes.

Each configuration runs in fresh processes (``agentsim.runner.launch.run_ranks``), so peak memory is
the run's own. Per run: init seconds (each process builds its share of the synthetic population:
``InitContext.share``), seconds per simulated day (the slowest rank's run over the days; the
first day, which numbers each rank's places, and the median of the later days, slowest rank),
peak resident memory summed over the processes (and the same less each process's resident memory
after importing agentsim and torch, its baseline), bytes per person, the cut of each place layer
(share of members whose place has members on another process) and the epidemic (final size,
peak of the infectious), which must be the same on any number of processes.

Usage::

    python benchmarks/bench_covid_scale.py --agents 1000000 10000000 --ranks 1 --days 10 --threads 2 \\
        --out benchmarks/results/covid-scale.json
    python benchmarks/bench_covid_scale.py --agents 10000000 --ranks 1 2 4 8 --days 120 \\
        --out benchmarks/results/covid-ranks-10m.json        # strong scaling (one thread per process)
    python benchmarks/bench_covid_scale.py --agents 10000000 --ranks 1 8 --rounds 3 --days 120 \\
        --out benchmarks/results/covid-ranks-10m-rounds.json # alternating rounds: 1 8, 8 1, 1 8
    python benchmarks/bench_covid_scale.py --agents 1000000 --ranks 1 2 --rounds 3 --ceiling --days 120 \\
        --param contact_groups=20 --param contacts_per_group=1 --out F  # fixed contacts, with the ceiling

With ``--rounds R`` the processes' list runs R times, every other round in reverse order, and
the file's ``summary`` gives per size and number of processes the median seconds per day over
the rounds, the speedup of the medians over one process, and each round's own speedup (over that
round's one-process run).

With ``--ceiling`` each run on W > 1 processes is followed by the host's ceiling for it: W
independent one-process runs of N/W people each, started together (no partition, no messages; what
W cores give when each does an Wth of the work, sharing the memory bus and the caches as the
partitioned run does). Its rows have ``"independent": true``, as has their own entry in the
summary, whose ``speedup_of_medians`` is then the ceiling: the one-process median over theirs
(each run's slowest process's seconds per day).

On several processes each keeps the people it built (``partition="data"`` with the model's share:
whole localities, recursive bisection of the map by population, :func:`agentsim.population.partition_localities`);
the model reads other people only through per-place sums (``ctx.group_table``), so no agent
travels. Not part of the test run.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import resource
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def _rss_bytes() -> int:
    """Peak resident memory of this process so far (bytes)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _current_rss_bytes() -> int:
    """Resident memory of this process now (bytes)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _rank(comm: Any, n: int, days: int, seed: int, params: dict[str, float], threads: int,
          progress: bool = False, alone: bool = False) -> dict[str, Any]:
    """One process of a run: build its share, run ``days`` days; its figures. ``alone``: a
    population of its own of ``n / W`` people instead (the ceiling runs; ``comm`` is not used).
    """
    import torch

    from agentsim import Simulation, get_model

    torch.set_num_threads(threads)
    baseline = _current_rss_bytes()
    shared = comm.world_size > 1 and not alone
    options: dict[str, Any] = {"partition": "data"} if shared else {}
    t0 = time.perf_counter()
    people = n // comm.world_size if alone else n  # (all of a run's people: metrics are sums over its processes)
    sim = Simulation(get_model("covid"), agents=people, seed=seed, params=params,
                     comm=comm if shared else None, **options)
    init = time.perf_counter() - t0
    after_init = _rss_bytes()
    last_substep, started = sim.model.substeps[-1], time.perf_counter()
    busy = [time.thread_time()]  # this process's main thread's CPU time at the end of each day (no waiting)

    def report(s: Any, substep: Any) -> None:
        if substep is not last_substep:
            return
        busy.append(time.thread_time())
        if progress and comm.rank == 0 and (s.state.step + 1) % 10 == 0:  # a run stopped at a limit shows its pace
            print(f"  {n:,} people W={comm.world_size}: day {s.state.step + 1} after "
                  f"{time.perf_counter() - started:.1f} s (init {init:.1f} s)", flush=True)
    sim.trace = report
    cpu0 = time.process_time()
    result = sim.run(days)
    cpu = time.process_time() - cpu0  # this process's CPU time over the days (not waiting): its share of the work
    m = result.metrics
    infectious = (m["A"] + m["I"] + m["H"]).tolist()  # everyone who infects
    return {"rank": comm.rank, "people": sim.state["person"].n, "init_seconds": init,
            "run_seconds": result.seconds, "seconds_per_day": result.seconds / days,
            "first_day_seconds": result.perf[0]["rank_step_seconds/max"] if result.perf else None,
            "later_days_median_seconds": statistics.median(p["rank_step_seconds/max"] for p in result.perf[1:])
            if len(result.perf) > 1 else None,
            "day_seconds": [p["rank_step_seconds/max"] for p in result.perf],
            "comm_seconds": sum(result.comm_seconds), "cpu_seconds": cpu,
            "busy_day_seconds": [b - a for a, b in itertools.pairwise(busy)], "baseline_rss_bytes": baseline,
            "peak_rss_after_init_bytes": after_init, "peak_rss_bytes": _rss_bytes(),
            "groups": result.groups, "final_size": int(people - m["S"][-1]), "peak_infectious": int(max(infectious)),
            "peak_day": infectious.index(max(infectious)), "deaths": int(m["D"][-1]),
            "infectious_by_day": [int(x) for x in infectious]}


def _busy_figures(per_rank: list[list[float]]) -> dict[str, float]:
    """The ranks' work apart from waiting: per day each rank's CPU time in its main thread (a
    process's own work, whatever the machine's cores). ``busy_seconds_max_sum``: the days' slowest
    rank's, added over the days (the run's time were every rank on its own core, with no wait for
    messages); ``busy_imbalance``: that over the mean rank's.
    """
    days = list(zip(*per_rank, strict=True))  # every rank ran the same days
    worst = sum(max(day) for day in days)
    mean = sum(sum(day) / len(day) for day in days)
    return {"busy_seconds_max_sum": worst, "busy_seconds_mean_sum": mean,
            "busy_imbalance": worst / mean if mean > 0 else 1.0}


def measure(n: int, world_size: int, days: int, seed: int, params: dict[str, float], threads: int,
            progress: bool = False, independent: bool = False) -> dict[str, Any]:
    """One run on ``world_size`` processes: the figures over ranks. ``independent``: the ceiling
    run (``world_size`` one-process runs of ``n / world_size`` people at once).
    """
    from agentsim.runner.launch import run_ranks

    t0 = time.perf_counter()
    ranks = run_ranks(_rank, world_size, (n, days, seed, params, threads, progress, independent),
                      timeout=1800.0)
    wall = time.perf_counter() - t0
    peak = sum(r["peak_rss_bytes"] for r in ranks)
    above = sum(r["peak_rss_bytes"] - r["baseline_rss_bytes"] for r in ranks)
    first = ranks[0]
    return {"agents": n, "world_size": world_size, "independent": independent, "days": days,
            "threads_per_rank": threads, "wall_seconds": wall,
            "init_seconds": max(r["init_seconds"] for r in ranks),
            "seconds_per_day": max(r["seconds_per_day"] for r in ranks),
            "first_day_seconds": first["first_day_seconds"],
            "later_days_median_seconds": first["later_days_median_seconds"],
            "day_seconds": first["day_seconds"],  # each day, slowest rank
            "comm_seconds_max": max(r["comm_seconds"] for r in ranks),
            "cpu_seconds_per_rank": [r["cpu_seconds"] for r in ranks],
            **_busy_figures([r["busy_day_seconds"] for r in ranks]),
            "people_per_rank": [r["people"] for r in ranks],
            "peak_rss_bytes": peak, "peak_rss_bytes_per_agent": peak / n,
            "peak_rss_above_baseline_bytes_per_agent": above / n,
            "groups": first["groups"], "final_size": first["final_size"], "peak_infectious": first["peak_infectious"],
            "peak_day": first["peak_day"], "deaths": first["deaths"], "infectious_by_day": first["infectious_by_day"],
            "same_epidemic_on_every_rank": len({(r["final_size"], r["peak_infectious"]) for r in ranks}) == 1}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--agents", type=int, nargs="+", default=[10_000_000])
    p.add_argument("--ranks", type=int, nargs="+", default=[1])
    p.add_argument("--days", type=int, default=120)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--prevalence", type=float, default=0.001, help="share exposed at day 0")
    p.add_argument("--param", action="append", default=[], metavar="NAME=VALUE",
                   help="another parameter of the covid model (a number), e.g. contact_groups=20")
    p.add_argument("--threads", type=int, default=1, help="torch threads per process")
    p.add_argument("--progress", action="store_true", help="print the elapsed time every 10 days (rank 0)")
    p.add_argument("--rounds", type=int, default=1, help="run the --ranks list this many times, every other round "
                   "reversed (a summary of medians)")
    p.add_argument("--ceiling", action="store_true", help="after each run on W > 1 processes, W independent "
                   "one-process runs of N/W people at once (the host's ceiling)")
    p.add_argument("--note", default="", help="what the machine and the run were (kept in the file)")
    p.add_argument("--out", required=True)
    args = p.parse_args()
    if args.rounds < 1:
        p.error(f"--rounds: expected >= 1 (got {args.rounds})")
    params = {"initial_prevalence": args.prevalence}
    for item in args.param:
        name, _, value = item.partition("=")
        try:
            params[name] = float(value)
        except ValueError:
            p.error(f"--param: expected NAME=NUMBER (got {item!r})")
    rows: list[dict[str, Any]] = []
    summary: list[dict[str, Any]] = []
    out = {"machine": platform.node(), "cpu_count": os.cpu_count(), "python": platform.python_version(),
           "date": time.strftime("%Y-%m-%d %H:%M:%S"),
           "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                    cwd=ROOT).stdout.strip(),
           "prevalence": args.prevalence, "params": params, "seed": args.seed, "note": args.note,
           "rounds": args.rounds,
           "ceiling": args.ceiling,
           "rows": rows, "summary": summary}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    for n in args.agents:
        for round_ in range(args.rounds):
            order = args.ranks if round_ % 2 == 0 else args.ranks[::-1]
            for w, independent in [(w, alone) for w in order for alone in (False, True)
                                   if not alone or (args.ceiling and w > 1)]:
                row = measure(n, w, args.days, args.seed, params, args.threads, args.progress,
                              independent)
                row["round"] = round_
                rows.append(row)
                _pair(rows, n, round_)
                summary[:] = _summarize(rows)
                Path(args.out).write_text(json.dumps(out, indent=1))  # after each run: a cut-off run keeps the rest
                cut = row["groups"].get("groups/cut_share")
                cut_text = f", memberships cut {cut:.2%}" if cut is not None else ""
                what = f"{w} apart" if independent else f"W={w:<2}"
                print(f"{n:>11,} people {what}: init {row['init_seconds']:7.2f} s, "
                      f"{row['seconds_per_day']:8.4f} s/day (first {row['first_day_seconds']:.3f}, later median "
                      f"{row['later_days_median_seconds']:.4f}), {row['peak_rss_bytes_per_agent']:6.1f} B/person at "
                      f"the peak ({row['peak_rss_above_baseline_bytes_per_agent']:.1f} above the processes' "
                      f"baseline){cut_text}; final size {row['final_size']:,}", flush=True)
    for s in summary:
        if s["world_size"] > 1 and s["speedup_of_medians"] is not None:
            what = f"{s['world_size']} apart (the ceiling)" if s["independent"] else f"W={s['world_size']:<2}"
            print(f"{s['agents']:>11,} people {what}: median {s['seconds_per_day_median']:.4f} s/day, "
                  f"speedup of the medians {s['speedup_of_medians']:.2f}, by round "
                  + ", ".join(f"{x:.2f}" for x in s["speedups_by_round"]), flush=True)


def _pair(rows: list[dict[str, Any]], n: int, round_: int) -> None:
    """Each run of ``n`` people in ``round_`` on several processes against that round's one-process
    run (once both ran): its speedup, and (partitioned runs) whether the epidemic is the same. A
    ceiling run's speedup is the ceiling: one process's time over the slowest independent one's.
    """
    mine = [r for r in rows if r["agents"] == n and r["round"] == round_]
    base = next((r for r in mine if r["world_size"] == 1), None)
    if base is None:
        return
    for row in mine:
        if row["world_size"] > 1:
            row["speedup"] = base["seconds_per_day"] / row["seconds_per_day"]
            if not row.get("independent"):
                row["same_epidemic_as_one_process"] = (row["final_size"], row["peak_infectious"]) == (
                    base["final_size"], base["peak_infectious"])


def _summarize(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per size, number of processes and kind (partitioned, or independent: the ceiling), over the
    rounds: the median seconds per day, the speedup of the medians over one process (None without a
    one-process run) and each round's speedup.
    """
    out = []
    for n, w, alone in sorted({(r["agents"], r["world_size"], bool(r.get("independent"))) for r in rows}):
        mine = [r for r in rows if r["agents"] == n and r["world_size"] == w and bool(r.get("independent")) == alone]
        one = [r["seconds_per_day"] for r in rows if r["agents"] == n and r["world_size"] == 1]
        median = statistics.median(r["seconds_per_day"] for r in mine)
        out.append({"agents": n, "world_size": w, "independent": alone, "runs": len(mine),
                    "seconds_per_day_median": median,
                    "speedup_of_medians": statistics.median(one) / median if one and w > 1 else None,
                    "speedups_by_round": [r["speedup"] for r in mine if "speedup" in r],
                    "same_epidemic_as_one_process": all(r.get("same_epidemic_as_one_process", True) for r in mine)})
    return out


if __name__ == "__main__":
    main()
