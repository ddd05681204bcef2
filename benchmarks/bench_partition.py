"""How the synthetic population's localities split over processes: recursive coordinate bisection
(``rcb``) against a METIS graph partition (``metis``, the ``metis`` extra).

For each population size and number of processes ``W``: the share of contacts (pairs of
place-mates) whose two people are on different processes, per layer and overall
(:func:`agentsim.population.edge_cut`), the imbalance (the most people on a process over the
mean) and the seconds the partition took. Needs the whole population on one process.

Usage::

    python benchmarks/bench_partition.py --agents 10000000 --ranks 2 4 8 16 \\
        --out benchmarks/results/partition-10m.json

Not part of the test run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import time
from pathlib import Path

import torch

from agentsim.population import PARTITION_METHODS, edge_cut, locality_grid, partition_localities, synthesize


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--agents", type=int, nargs="+", default=[10_000_000])
    p.add_argument("--ranks", type=int, nargs="+", default=[2, 4, 8, 16])
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    out: dict = {"machine": platform.node(), "cpu_count": os.cpu_count(), "python": platform.python_version(),
                 "date": time.strftime("%Y-%m-%d %H:%M:%S"),
                 "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                          check=False).stdout.strip(),
                 "seed": args.seed, "rows": []}
    for n in args.agents:
        grid = locality_grid(n, args.seed)
        pop = synthesize(n, seed=args.seed)
        people = grid.population.to(torch.float64)
        for world_size in args.ranks:
            for method in PARTITION_METHODS:
                start = time.perf_counter()
                owner = partition_localities(grid, world_size, method)
                seconds = time.perf_counter() - start
                per_rank = torch.zeros(world_size, dtype=torch.float64).index_add_(0, owner, people)
                row = {"agents": n, "localities": grid.n_localities, "world_size": world_size, "method": method,
                       "seconds": seconds, "imbalance": float(per_rank.max() / per_rank.mean()),
                       "contacts_cut": edge_cut(pop, owner)}
                out["rows"].append(row)
                print(f"{n:>12,} W={world_size:<3} {method:<6} cut {row['contacts_cut']['all']:.4f} "
                      f"(work {row['contacts_cut']['work']:.4f}), imbalance {row['imbalance']:.3f}, "
                      f"{seconds:.3f} s", flush=True)
                Path(args.out).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
