"""Threads on a busy machine: agentsim's default threads against one thread and against a fixed
thread count, on an idle machine and beside one CPU-bound process, in alternating rounds.

Each measurement runs in a fresh process (so the thread settings start as a user's would): it
builds the model, takes one step, then times ``--steps`` steps. The modes:

- ``default``: nothing set (agentsim adapts its threads to the load, :mod:`agentsim.threads`);
- ``one``: ``AGENTSIM_THREADS=1``;
- ``fixed``: ``AGENTSIM_THREADS=<usable cores>`` (torch's threads, never adapted: the default before
  the governor);
- ``passive``: as ``fixed``, with ``OMP_WAIT_POLICY=PASSIVE`` (torch's threads sleep at their barriers
  instead of spinning): the alternative to adapting.

The busy condition starts ``--busy`` Python processes spinning in a loop for the whole of each
measurement. Figures: the median seconds of each (workload, condition, mode), of the timed steps and of the
whole run (building the model, its initialization and every step), and the ratios default/one
(busy: the target is at most 1.15) and default/fixed (idle: no slower than before).

    python benchmarks/bench_busy.py --rounds 5 --out benchmarks/results/busy-threads.json
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

WORKLOADS = {"sir": ("sir", 1_000_000, 50), "sugarscape": ("sugarscape", 100_000, 30), "boids": ("boids", 20_000, 100),
             # a short run as users start one (about 1 s): the plain traffic model, 200k cars on 1M cells
             "traffic": ("benchmarks/plain/traffic.py:MODEL", 200_000, 100)}
MODES = ("default", "one", "fixed", "passive")

_TIMED = """
import sys, time, json
import agentsim as asim
model = asim.get_model(sys.argv[1])
start = time.perf_counter()
sim = asim.Simulation(model, agents=int(sys.argv[2]), seed=1)
sim.step()
t = time.perf_counter()
for _ in range(int(sys.argv[3])):
    sim.step()
seconds = time.perf_counter() - t
print(json.dumps({"seconds": seconds, "whole": time.perf_counter() - start,
                  "threads": sim.threads.summary() if sim.threads else ""}))
"""


def measure(workload: str, mode: str, cores: int) -> dict[str, object]:
    """One fresh process: seconds for the workload's steps, and the threads it ran with."""
    model, agents, steps = WORKLOADS[workload]
    env = {k: v for k, v in os.environ.items() if k not in ("AGENTSIM_THREADS", "OMP_NUM_THREADS", "OMP_WAIT_POLICY")}
    if mode == "one":
        env["AGENTSIM_THREADS"] = "1"
    elif mode in ("fixed", "passive"):
        env["AGENTSIM_THREADS"] = str(cores)
        if mode == "passive":
            env["OMP_WAIT_POLICY"] = "PASSIVE"
    done = subprocess.run([sys.executable, "-c", _TIMED, model, str(agents), str(steps)], env=env,
                          capture_output=True, text=True, check=True, timeout=600)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=list(WORKLOADS))
    ap.add_argument("--busy", type=int, default=1, help="CPU-bound processes beside the run (busy condition)")
    ap.add_argument("--out", default="benchmarks/results/busy-threads.json")
    args = ap.parse_args()
    from agentsim.threads import usable_cores

    cores = usable_cores()
    times: dict[str, dict[str, dict[str, list[float]]]] = {
        w: {c: {m: [] for m in MODES} for c in ("idle", "busy")} for w in args.workloads}
    whole: dict[str, dict[str, dict[str, list[float]]]] = {
        w: {c: {m: [] for m in MODES} for c in ("idle", "busy")} for w in args.workloads}
    threads: dict[str, dict[str, dict[str, list[str]]]] = {
        w: {c: {m: [] for m in MODES} for c in ("idle", "busy")} for w in args.workloads}
    for r in range(args.rounds):
        for condition in ("idle", "busy"):
            spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
                        for _ in range(args.busy if condition == "busy" else 0)]
            try:
                time.sleep(0.5 if spinners else 0.0)
                for workload in args.workloads:
                    order = MODES if r % 2 == 0 else tuple(reversed(MODES))  # alternate the order too
                    for mode in order:
                        got = measure(workload, mode, cores)
                        times[workload][condition][mode].append(float(got["seconds"]))  # type: ignore[arg-type]
                        whole[workload][condition][mode].append(float(got["whole"]))  # type: ignore[arg-type]
                        threads[workload][condition][mode].append(str(got["threads"]))
                        print(f"round {r} {condition:4} {workload:10} {mode:7} {got['seconds']:.3f} s "
                              f"(whole run {got['whole']:.3f} s)  "
                              f"{got['threads']}", flush=True)
            finally:
                for p in spinners:
                    p.kill()
                    p.wait()
    summary = {}
    for w, by in times.items():
        med = {c: {m: statistics.median(v) for m, v in modes.items()} for c, modes in by.items()}
        run = {c: {m: statistics.median(v) for m, v in modes.items()} for c, modes in whole[w].items()}
        summary[w] = {"median_seconds": med, "median_whole_seconds": run,
                      "busy_default_over_one": med["busy"]["default"] / med["busy"]["one"],
                      "busy_default_over_one_whole": run["busy"]["default"] / run["busy"]["one"],
                      "idle_default_over_fixed_whole": run["idle"]["default"] / run["idle"]["fixed"],
                      "busy_fixed_over_one": med["busy"]["fixed"] / med["busy"]["one"],
                      "busy_passive_over_one": med["busy"]["passive"] / med["busy"]["one"],
                      "idle_default_over_fixed": med["idle"]["default"] / med["idle"]["fixed"],
                      "idle_passive_over_fixed": med["idle"]["passive"] / med["idle"]["fixed"],
                      "idle_one_over_default": med["idle"]["one"] / med["idle"]["default"]}
        print(f"{w}: busy default/one {summary[w]['busy_default_over_one']:.2f}x, whole run "
              f"{summary[w]['busy_default_over_one_whole']:.2f}x (fixed/one "
              f"{summary[w]['busy_fixed_over_one']:.2f}x, passive/one {summary[w]['busy_passive_over_one']:.2f}x); "
              f"idle default/fixed {summary[w]['idle_default_over_fixed']:.2f}x (passive/fixed "
              f"{summary[w]['idle_passive_over_fixed']:.2f}x)")
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            check=False).stdout.strip()
    out = {"suite": "busy-threads", "date": time.strftime("%Y-%m-%d %H:%M"), "git_commit": commit,
           "machine": platform.node(), "usable_cores": cores, "busy_processes": args.busy, "rounds": args.rounds,
           "workloads": {w: list(WORKLOADS[w]) for w in args.workloads}, "seconds": times,
           "whole_seconds": whole, "threads": threads,
           "summary": summary}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
