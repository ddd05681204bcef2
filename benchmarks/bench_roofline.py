"""How close each model's step comes to the machine's memory bandwidth.

    python benchmarks/bench_roofline.py --rounds 3

Measures the host's streaming bandwidth with torch (a 1 GiB float32 copy, read + write counted,
and a triad ``a = b + 2 c``; default threads and one thread; medians), then runs each model in a
fresh process (:func:`bench_peers.agentsim_run`) and compares its seconds per step with the time
the bytes its step must move take at that bandwidth. The bytes per agent per step are a lower
bound from the model's state (what any implementation must read and write once per step):

- ``randomwalk``: read ``uid`` (8 B), read and write ``pos`` and ``disp`` (2 x float32 each): 40 B;
- ``schelling``: read each agent's cell (int64) and group (int8), and the occupancy of its
  neighborhood (1.25 int8 cells per agent at density 0.8, each read once from cache): 10 B;
- ``sir``: read every status (int8), and for the infectious agents (on average 8.7% of people
  over the 100 days) their 10 contacts (int32) and the contacts' status: about 5.3 B;
- ``boids``: read and write ``pos`` and ``heading`` (2 x float32 each): 32 B (its neighbor sums are
  compute bound: about 3 neighbors per boid, from cache).

Writes ``benchmarks/results/roofline.json`` and ``roofline.md``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_peers import agentsim_run

BYTES_PER_AGENT = {"randomwalk": 40.0, "schelling": 10.0, "sir": 5.3, "boids": 32.0}
WORK = {"randomwalk": (10_000_000, 5), "schelling": (1_000_000, 10), "sir": (1_000_000, 100),
        "boids": (1_000_000, 3)}


def bandwidth(threads: int, repeats: int = 7, n: int = 1 << 28) -> dict[str, float]:
    """Streaming bandwidth in bytes/s of float32 arrays of ``n`` elements (default 1 GiB): copy
    (2 arrays moved) and triad (3).
    """
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        a, b, c = torch.empty(n), torch.rand(n), torch.rand(n)
        a.copy_(b)
        copy, triad = [], []
        for _ in range(repeats):
            t = time.perf_counter()
            a.copy_(b)
            copy.append(2 * 4 * n / (time.perf_counter() - t))
            t = time.perf_counter()
            torch.add(b, c, alpha=2.0, out=a)
            triad.append(3 * 4 * n / (time.perf_counter() - t))
        return {"copy": statistics.median(copy), "triad": statistics.median(triad)}
    finally:
        torch.set_num_threads(before)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--models", nargs="+", choices=list(WORK), default=list(WORK))
    args = ap.parse_args(argv)
    bw = {"default_threads": bandwidth(torch.get_num_threads()), "one_thread": bandwidth(1),
          "threads": torch.get_num_threads()}
    bound = max(bw["default_threads"]["copy"], bw["default_threads"]["triad"])
    print(f"bandwidth: {json.dumps(bw)}", flush=True)
    rows, runs = [], {}
    for model in args.models:
        n, steps = WORK[model]
        got = [agentsim_run(model, n, steps) for _ in range(args.rounds)]
        runs[model] = got
        per_step = statistics.median(r["run_seconds"] / r["steps"] if model == "sir" else r["seconds_per_step"]
                                     for r in got)
        ideal = BYTES_PER_AGENT[model] * n / bound
        rows.append({"model": model, "agents": n, "seconds_per_step": per_step,
                     "bytes_per_agent": BYTES_PER_AGENT[model], "bound_seconds": ideal,
                     "fraction_of_bound": ideal / per_step})
        print(rows[-1], flush=True)
    table = [f"Bandwidth (torch, {bw['threads']} threads): copy {bw['default_threads']['copy'] / 1e9:.1f} GB/s, "
             f"triad {bw['default_threads']['triad'] / 1e9:.1f} GB/s; one thread: copy "
             f"{bw['one_thread']['copy'] / 1e9:.1f} GB/s", "",
             "| model | agents | B/agent/step (lower bound) | bound per step | measured per step | fraction of bound |",
             "| --- | --- | --- | --- | --- | --- |"]
    table += [f"| {r['model']} | {r['agents']:,} | {r['bytes_per_agent']:g} | {r['bound_seconds'] * 1e3:.1f} ms | "
              f"{r['seconds_per_step'] * 1e3:.1f} ms | {r['fraction_of_bound']:.0%} |" for r in rows]
    out = Path(__file__).resolve().parent / "results"
    out.mkdir(exist_ok=True)
    (out / "roofline.json").write_text(json.dumps({"bandwidth": bw, "rows": rows, "runs": runs,
                                                   "date": time.strftime("%Y-%m-%d")}, indent=1) + "\n")
    (out / "roofline.md").write_text("\n".join(table) + "\n")
    print("\n".join(table))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
