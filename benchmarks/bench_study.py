"""Overhead per run of each study executor: many short runs of a small model, local pool vs Ray.

``--runs`` runs (a grid of ``--runs / replicates`` beta values x ``--replicates``) of ``sir`` at
``--agents`` agents for ``--steps`` steps, with ``--workers`` workers, on the local process pool
and on a local Ray instance; each executor ``--repeats`` times (alternating). Reported: the wall
time of ``Study.run`` (start-up included), runs/s, and the median seconds a run itself took
inside its worker, so that ``wall * workers / runs - run seconds`` is the executor's overhead per
run. The two executors' study files are compared (same runs, same metrics).

Usage::

    python benchmarks/bench_study.py --runs 1000 --agents 1000 --steps 20 --workers 2 \\
        --out benchmarks/results/study_executors.json
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import h5py
import numpy as np
from bench_models import git_commit

from agentsim.study import Study, read_study


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=1000)
    ap.add_argument("--replicates", type=int, default=10)
    ap.add_argument("--agents", type=int, default=1000)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--executors", nargs="+", default=["local", "ray"])
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    combos = max(1, args.runs // args.replicates)
    betas = [round(0.01 + 0.05 * k / max(1, combos - 1), 6) for k in range(combos)]
    study = Study("sir", {"beta": betas}, replicates=args.replicates, seed=3, agents=args.agents, steps=args.steps)
    tmp = Path(tempfile.mkdtemp(prefix="agentsim-bench-study-"))
    walls: dict[str, list[float]] = {e: [] for e in args.executors}
    run_seconds: dict[str, float] = {}
    for rep in range(args.repeats):
        for ex in args.executors:
            out = tmp / f"{ex}-{rep}.h5"
            t0 = time.perf_counter()
            study.run(out, workers=args.workers, executor=ex, overwrite=True)
            walls[ex].append(time.perf_counter() - t0)
            with h5py.File(out) as f:
                run_seconds[ex] = float(np.median([g.attrs["seconds"] for g in f["runs"].values()]))
    files = {ex: read_study(tmp / f"{ex}-0.h5") for ex in args.executors}
    first = files[args.executors[0]]
    same = all(sorted(d.runs) == sorted(first.runs) and all(
        np.array_equal(d.runs[k]["metrics"]["I"], first.runs[k]["metrics"]["I"]) for k in first.runs)
        for d in files.values())
    rows = {}
    for ex in args.executors:
        wall = statistics.median(walls[ex])
        rows[ex] = {"wall_seconds": walls[ex], "median_wall": wall, "runs_per_second": len(study.runs) / wall,
                    "median_run_seconds_in_worker": run_seconds[ex],
                    "overhead_per_run": wall * args.workers / len(study.runs) - run_seconds[ex]}
        print(f"{ex}: {len(study.runs)} runs in {wall:.1f} s ({rows[ex]['runs_per_second']:.1f} runs/s); a run "
              f"takes {run_seconds[ex] * 1000:.1f} ms in its worker; overhead "
              f"{rows[ex]['overhead_per_run'] * 1000:.1f} ms per run (worker-seconds)", flush=True)
    print(f"same study files: {same}")
    result = {"runs": len(study.runs), "agents": args.agents, "steps": args.steps, "workers": args.workers,
              "executors": rows, "same_files": same, "commit": git_commit(), "python": platform.python_version()}
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    main()
