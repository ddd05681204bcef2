"""Stress: a long run's resident memory, and how long the network waits take to fail.

Runs a tiny model (randomwalk, a few agents) for ``--steps`` steps in one ``Simulation.run``,
reading the resident set size (``/proc/self/statm``) every ``--every`` steps (through the
engine's trace hook), and prints the growth in bytes per step after the first sample. Then
times ``--trials`` failures of each bounded network wait: ``--executor ray --address`` at a
closed port on 127.0.0.1 and at a host name under the reserved ``.invalid`` TLD (which never
resolves and sends no traffic), and a process group's rendezvous with nobody listening.
Writes everything as JSON (``--out``).

    python benchmarks/stress_long_runs.py --steps 300000 --out stress_long_runs.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import agentsim as asim
from agentsim.engine.simulation import Simulation
from agentsim.errors import NetworkError


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def long_run(steps: int, every: int, agents: int, file: str | None) -> dict:
    sim = Simulation(asim.get_model("randomwalk"), agents=agents, seed=1)
    samples: list[tuple[int, int, float]] = []
    t0 = time.perf_counter()

    def trace(s: Simulation, _substep: object) -> None:  # after the (one) substep of step s.state.step + 1
        if (s.state.step + 1) % every == 0:
            samples.append((s.state.step + 1, rss(), time.perf_counter() - t0))
            print(f"  step {samples[-1][0]:>9,}: RSS {samples[-1][1] / 1e6:8.1f} MB, {samples[-1][2]:7.1f} s",
                  flush=True)

    sim.trace = trace
    result = sim.run(steps, out=file)
    first, last = samples[0], samples[-1]
    growth = (last[1] - first[1]) / (last[0] - first[0]) if last[0] > first[0] else 0.0
    return {"steps": steps, "agents": agents, "every": every, "file": file, "seconds": result.seconds,
            "steps_per_second": steps / result.seconds if result.seconds else None,
            "samples": [{"step": s, "rss": r, "seconds": t} for s, r, t in samples],
            "rss_first": first[1], "rss_last": last[1], "growth_bytes_per_step": growth,
            "metric_bytes_per_step": 8 * len(result.metrics), "perf_kept": len(result.perf)}


def timed(fn) -> dict:
    times, messages = [], []
    for fn_trial in fn:
        t0 = time.perf_counter()
        try:
            fn_trial()
            messages.append("no error (unexpected)")
        except NetworkError as e:
            messages.append(str(e))
        times.append(time.perf_counter() - t0)
    return {"trials": len(times), "seconds": times, "median_seconds": statistics.median(times),
            "max_seconds": max(times), "message": messages[-1]}


def network(trials: int, timeout: float) -> dict:
    from agentsim.distributed.process_group import init
    from agentsim.study.executors import make_executor

    out = {}
    try:
        import ray  # noqa: F401
        have_ray = True
    except ImportError:
        have_ray = False
    if have_ray:
        out["ray_closed_port"] = timed(
            (lambda: make_executor("ray", 1, f"127.0.0.1:{closed_port()}", connect_timeout=timeout))
            for _ in range(trials))
        out["ray_unknown_host"] = timed(
            (lambda: make_executor("ray", 1, "no-such-host.invalid:6379", connect_timeout=timeout))
            for _ in range(trials))
    out["rendezvous_closed_port"] = timed((lambda: init(1, 2, "127.0.0.1", closed_port(), timeout=timeout))
                                          for _ in range(trials))
    out["rendezvous_unknown_host"] = timed((lambda: init(1, 2, "no-such-host.invalid", 29500, timeout=timeout))
                                           for _ in range(trials))
    out["timeout"] = timeout
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=300_000,
                   help="steps of the long run (default 300,000: about 5 minutes on a busy 2-core machine)")
    p.add_argument("--every", type=int, default=10_000, help="read the RSS every this many steps")
    p.add_argument("--agents", type=int, default=4)
    p.add_argument("--file", help="also write the trajectory (and /perf) to this HDF5 file")
    p.add_argument("--trials", type=int, default=3, help="failures timed per network check")
    p.add_argument("--timeout", type=float, default=15.0, help="connect timeout of the network checks (s)")
    p.add_argument("--out", default="stress_long_runs.json")
    args = p.parse_args()
    print(f"long run: {args.steps:,} steps of randomwalk with {args.agents} agents")
    run = long_run(args.steps, args.every, args.agents, args.file)
    print(f"RSS {run['rss_first'] / 1e6:.1f} MB at step {run['samples'][0]['step']:,}, "
          f"{run['rss_last'] / 1e6:.1f} MB at step {run['samples'][-1]['step']:,}: "
          f"growth {run['growth_bytes_per_step']:.1f} bytes per step (the run's metric columns: "
          f"{run['metric_bytes_per_step']} bytes per step); {run['steps_per_second']:.0f} steps/s")
    print(f"network waits ({args.trials} trials each, timeout {args.timeout:g} s):")
    net = network(args.trials, args.timeout)
    for name, got in net.items():
        if isinstance(got, dict):
            print(f"  {name}: median {got['median_seconds']:.2f} s, max {got['max_seconds']:.2f} s: {got['message']}")
    commit = subprocess.run(["git", "-C", str(Path(__file__).resolve().parents[1]), "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip() or None
    meta = {"machine": f"{platform.machine()}, {os.cpu_count()} cores", "python": platform.python_version(),
            "date": time.strftime("%Y-%m-%d"), "commit": commit}
    Path(args.out).write_text(json.dumps({"meta": meta, "long_run": run, "network": net}, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
