"""Checkpoint overhead per step: no checkpoints, synchronous and asynchronous writes.

For ``--model`` at ``--agents`` agents, ``--steps`` steps with a checkpoint every ``--every``
steps (``keep=2``, into a temporary directory on the same disk as ``--tmp``), each mode runs
``--repeats`` times, alternating, on 1 process and on each of ``--world-sizes`` (gloo,
:func:`agentsim.runner.launch`):

- ``none``: no checkpoints (the baseline of the same run);
- ``sync``: ``checkpoint_every`` (the step waits while every rank writes its shard and rank 0
  the manifest);
- ``async``: ``checkpoint_async=True`` (the state is copied, the files are written by a
  background thread while the next steps run; the run waits for the last one at its end).

Reported: the median run seconds (``RunResult.seconds``, which includes waiting for the last
checkpoint) and the overhead per step and per checkpoint against ``none`` of the same world size.

Usage::

    python benchmarks/bench_checkpoint.py --agents 1000000 --steps 40 --every 5 --world-sizes 2 \\
        --out benchmarks/results/checkpoint_overhead.json
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_models import git_commit

import agentsim as asim
from agentsim.runner.launch import launch

MODES = ("none", "sync", "async")


def one_run(model: str, agents: int, steps: int, every: int, world_size: int, mode: str, tmp: str) -> float:
    directory = tempfile.mkdtemp(prefix="ckpt-", dir=tmp)
    options: dict[str, Any] = {} if mode == "none" else {
        "checkpoint_every": every, "checkpoint_dir": directory, "keep": 2, "checkpoint_async": mode == "async"}
    try:
        if world_size == 1:
            result = asim.Simulation(asim.get_model(model), agents=agents, seed=1).run(steps, **options)
        else:
            result = launch(model, world_size, agents=agents, steps=steps, seed=1, timeout=600.0, **options)
        if mode != "none":
            assert (Path(directory) / f"step-{steps - steps % every:08d}" / "manifest.json").is_file()
        return float(result.seconds)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="randomwalk")
    ap.add_argument("--agents", type=int, default=1_000_000)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--every", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--world-sizes", dest="world_sizes", type=int, nargs="*", default=[2])
    ap.add_argument("--tmp", default=None, help="directory for the checkpoints (default: the system's temp dir)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    checkpoints = args.steps // args.every
    rows = []
    for w in [1, *args.world_sizes]:
        seconds: dict[str, list[float]] = {m: [] for m in MODES}
        for _ in range(args.repeats):
            for m in MODES:  # alternating, so drifts of the shared machine hit every mode alike
                seconds[m].append(one_run(args.model, args.agents, args.steps, args.every, w, m, args.tmp))
        med = {m: statistics.median(v) for m, v in seconds.items()}
        row: dict[str, Any] = {"world_size": w, "seconds": seconds, "median_seconds": med,
                               "step_seconds_none": med["none"] / args.steps}
        for m in ("sync", "async"):
            extra = med[m] - med["none"]
            row[f"overhead_per_step_{m}"] = extra / args.steps
            row[f"overhead_per_checkpoint_{m}"] = extra / checkpoints
            row[f"overhead_fraction_{m}"] = extra / med["none"]
        rows.append(row)
        print(f"W={w}: none {med['none']:.2f} s, sync {med['sync']:.2f} s "
              f"(+{row['overhead_per_checkpoint_sync']:.3f} s/checkpoint, "
              f"{100 * row['overhead_fraction_sync']:.1f}%), async {med['async']:.2f} s "
              f"(+{row['overhead_per_checkpoint_async']:.3f} s/checkpoint, "
              f"{100 * row['overhead_fraction_async']:.1f}%)", flush=True)
    out = {"model": args.model, "agents": args.agents, "steps": args.steps, "every": args.every,
           "checkpoints": checkpoints, "repeats": args.repeats, "rows": rows, "commit": git_commit(),
           "python": platform.python_version(), "machine": platform.machine()}
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    return out


if __name__ == "__main__":
    main()
