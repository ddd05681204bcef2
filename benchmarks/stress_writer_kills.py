"""Kill a run that writes a trajectory and checkpoints at random moments; check every file, resume it.

Each trial starts ``agentsim run wolfsheep --out run.h5 --every 5 --checkpoint-every K`` in a
fresh process, waits until the file exists, sleeps a random time within the run's duration,
and SIGKILLs it. Then it checks that

- the file opens with :func:`agentsim.io.hdf5.read_trajectory` (``readable``), says it did not
  complete, and holds metric rows for steps 0, 1, ..., ``steps_completed`` exactly once;
- resuming (``--resume CKPT --out run.h5``, or a fresh run when no checkpoint was complete yet)
  finishes the file, which then equals the file of one uninterrupted run bit for bit
  (``/agents``, ``/env``, ``/metrics``; ``identical``), with no step missing or repeated.

Usage::

    python benchmarks/stress_writer_kills.py --trials 100 --out benchmarks/results/writer_kills.json

Writes JSON (every trial: kill time, steps in the file, checkpoint step, readable, identical).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import h5py
import numpy as np

MODEL = ["wolfsheep", "--agents", "400", "--seed", "3"]


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "agentsim", "run", *MODEL, "--quiet", *args]


def _datasets(path: Path) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    with h5py.File(path, "r") as f:
        for group in ("agents", "env", "metrics"):
            if group in f:
                f[group].visititems(lambda name, obj, g=group: out.__setitem__(f"{g}/{name}", obj[...])
                                    if isinstance(obj, h5py.Dataset) else None)
    return out


def _same(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> bool:
    return sorted(a) == sorted(b) and all(a[k].shape == b[k].shape and np.array_equal(a[k], b[k]) for k in a)


def reference(workdir: Path, steps: int) -> tuple[dict[str, np.ndarray], float]:
    """The uninterrupted run's file, and how long the process ran (seconds after the file appeared)."""
    path = workdir / "reference.h5"
    proc = subprocess.Popen(_cli("--steps", str(steps), "--every", "5", "--out", str(path)))
    while not path.exists() and proc.poll() is None:
        time.sleep(0.005)
    t0 = time.monotonic()
    if proc.wait() != 0:
        raise RuntimeError("the reference run failed")
    return _datasets(path), time.monotonic() - t0


def trial(workdir: Path, steps: int, every: int, kill_after: float, want: dict[str, np.ndarray]) -> dict[str, Any]:
    """One kill and its checks (see the module docstring)."""
    from agentsim.io.checkpoint import checkpoint_step, latest_checkpoint
    from agentsim.io.hdf5 import read_trajectory

    out, ckpt = workdir / "run.h5", workdir / "ckpt"
    proc = subprocess.Popen(_cli("--steps", str(steps), "--every", "5", "--out", str(out),
                                 "--checkpoint-every", str(every), "--checkpoint-dir", str(ckpt), "--keep", "2"))
    while not out.exists() and proc.poll() is None:
        time.sleep(0.002)
    time.sleep(kill_after)
    finished = proc.poll() is not None
    if not finished:
        os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    row: dict[str, Any] = {"kill_after": round(kill_after, 4), "finished_before_kill": finished}
    try:
        traj = read_trajectory(out)
        metric_steps = traj.metrics.get("step", np.zeros(0, dtype=np.int64))  # none before the first flush
        row["steps_in_file"] = int(traj.attrs["steps_completed"])
        row["completed_flag"] = bool(traj.attrs["completed"])
        # every step once, from 0; "completed" only on a file that holds the last step
        row["readable"] = bool(np.array_equal(metric_steps, np.arange(len(metric_steps)))) and \
            (not row["completed_flag"] or row["steps_in_file"] == steps)
    except Exception as e:  # any failure to read is what this counts
        row.update(readable=False, error=f"{type(e).__name__}: {e}")
    newest = latest_checkpoint(ckpt)
    row["checkpoint_step"] = None if newest is None else checkpoint_step(newest)
    args = ["--steps", str(steps), "--every", "5", "--out", str(out)]
    resume = subprocess.run(_cli(*args, *(["--resume", str(ckpt)] if newest is not None else [])),
                            capture_output=True, text=True)
    row["resumed"] = resume.returncode == 0
    if not row["resumed"]:
        row["resume_error"] = resume.stderr[-500:]
    row["identical"] = row["resumed"] and _same(_datasets(out), want)
    return row


def run_trials(trials: int, steps: int = 400, every: int = 7, seed: int = 0,
               workdir: str | None = None) -> dict[str, Any]:
    """``trials`` kills (see the module docstring); returns the summary and every trial."""
    rng = random.Random(seed)
    base = Path(workdir or tempfile.mkdtemp(prefix="agentsim-kills-"))
    want, duration = reference(base, steps)
    rows = []
    for k in range(trials):
        d = base / f"trial-{k:03d}"
        d.mkdir(parents=True, exist_ok=True)
        rows.append(trial(d, steps, every, rng.uniform(0.0, duration), want))
    return {"trials": trials, "steps": steps, "checkpoint_every": every, "run_seconds": round(duration, 3),
            "readable": sum(r["readable"] for r in rows), "identical_after_resume": sum(r["identical"] for r in rows),
            "rows": rows}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=100)
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--checkpoint-every", type=int, default=7)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    summary = run_trials(args.trials, args.steps, args.checkpoint_every, args.seed)
    print(f"{summary['trials']} kills of a {summary['run_seconds']} s run: {summary['readable']} files readable, "
          f"{summary['identical_after_resume']} identical to the uninterrupted run after resuming")
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(summary, indent=1) + "\n")
    return 0 if summary["readable"] == summary["identical_after_resume"] == summary["trials"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
