"""Kill one rank of a multi-process run at a random moment; the job must restart itself and finish
the same file as one uninterrupted process.

Each trial starts, in a fresh process group, either

- ``agentsim run wolfsheep --nprocs W --max-restarts 3 ...`` (``--launcher nprocs``), or
- ``torchrun --standalone --nproc_per_node W --max-restarts 3 -m agentsim run wolfsheep ...``
  (``--launcher torchrun``),

with ``--partition spatial --out run.h5 --every 5 --checkpoint-every K``; once the first
checkpoint is complete it sleeps a random time within the run and SIGKILLs one worker process
chosen at random. The trial recovers when the job exits 0 and its file equals the file of one
uninterrupted process bit for bit (``/agents``, ``/env``, ``/metrics``).

Usage::

    python benchmarks/stress_rank_kills.py --trials 20 --world-sizes 2 4 --launcher nprocs \\
        --out benchmarks/results/rank_kills_nprocs.json

Writes JSON (every trial: world size, kill time, killed pid, exit code, recovered).
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

from stress_writer_kills import _datasets, _same

MODEL = ["wolfsheep", "--agents", "600", "--seed", "3"]


def _workers(pid: int) -> list[int]:
    """The worker processes under ``pid`` (Linux /proc): descendants that run agentsim steps
    (children of multiprocessing's fork server or spawn children, or torchrun's ``-m agentsim``
    workers), not helpers (the fork server itself, the resource tracker)."""
    out, todo = [], [(pid, "")]
    while todo:
        p, parent_cmd = todo.pop()
        try:
            children = []
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    children += [int(c) for c in f.read().split()]
        except OSError:
            continue
        for c in children:
            try:
                with open(f"/proc/{c}/cmdline", "rb") as f:
                    cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if "resource_tracker" in cmd:
                continue
            forked = "multiprocessing.forkserver" in cmd and "multiprocessing.forkserver" in parent_cmd
            if "spawn_main" in cmd or "-m agentsim" in cmd or forked:
                out.append(c)
            todo.append((c, cmd))
    return sorted(set(out))


def command(launcher: str, world_size: int, steps: int, every: int, out: Path, ckpt: Path) -> list[str]:
    args = ["run", *MODEL, "--quiet", "--steps", str(steps), "--every", "5", "--out", str(out),
            "--partition", "spatial", "--checkpoint-every", str(every), "--checkpoint-dir", str(ckpt), "--keep", "2",
            "--timeout", "20"]
    if launcher == "torchrun":
        return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(world_size),
                "--max-restarts", "3", "-m", "agentsim", *args]
    return [sys.executable, "-m", "agentsim", *args, "--nprocs", str(world_size), "--max-restarts", "3"]


def trial(workdir: Path, launcher: str, world_size: int, steps: int, every: int, rng: random.Random,
          want: dict[str, Any], duration: float) -> dict[str, Any]:
    out, ckpt = workdir / "run.h5", workdir / "ckpt"
    proc = subprocess.Popen(command(launcher, world_size, steps, every, out, ckpt), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    t0 = time.monotonic()
    while not any(ckpt.glob("step-*/manifest.json")) and proc.poll() is None and time.monotonic() - t0 < 120:
        time.sleep(0.01)
    time.sleep(rng.uniform(0.0, duration))
    row: dict[str, Any] = {"launcher": launcher, "world_size": world_size}
    workers = _workers(proc.pid) if proc.poll() is None else []
    if workers:
        victim = rng.choice(workers)
        row.update(killed_pid=victim, workers=len(workers))
        try:
            os.kill(victim, signal.SIGKILL)
        except ProcessLookupError:
            row["killed_pid"] = None
    else:
        row["killed_pid"] = None  # the run ended first
    try:
        err, _ = proc.communicate(timeout=600)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        err, _ = proc.communicate()
        row["hung"] = True
    row["exit_code"] = proc.returncode
    row["restarted"] = "restart" in err.lower() or "(exitcode: -9)" in err  # agentsim's, torchrun's messages
    row["recovered"] = proc.returncode == 0 and out.exists() and _same(_datasets(out), want)
    row["log_tail"] = err[-1500:]
    return row


def run_trials(trials: int, world_sizes: list[int], launcher: str = "nprocs", steps: int = 120, every: int = 10,
               seed: int = 0, workdir: str | None = None) -> dict[str, Any]:
    """``trials`` kills per world size (see the module docstring)."""
    rng = random.Random(seed)
    base = Path(workdir or tempfile.mkdtemp(prefix="agentsim-rank-kills-"))
    ref = base / "reference.h5"
    t0 = time.monotonic()
    subprocess.run([sys.executable, "-m", "agentsim", "run", *MODEL, "--quiet", "--steps", str(steps), "--every",
                    "5", "--out", str(ref)], check=True)
    duration = (time.monotonic() - t0) * 0.5  # kills land in the first half or so of a run's steps
    want = _datasets(ref)
    rows = []
    for w in world_sizes:
        for k in range(trials):
            d = base / f"w{w}-{k:03d}"
            d.mkdir(parents=True, exist_ok=True)
            rows.append(trial(d, launcher, w, steps, every, rng, want, duration))
    killed = [r for r in rows if r["killed_pid"] is not None]
    return {"launcher": launcher, "trials": len(rows), "killed": len(killed),
            "recovered": sum(r["recovered"] for r in rows),
            "killed_and_recovered": sum(r["recovered"] for r in killed), "rows": rows}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=20, help="kills per world size")
    ap.add_argument("--world-sizes", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--launcher", choices=["nprocs", "torchrun"], default="nprocs")
    ap.add_argument("--steps", type=int, default=120)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    s = run_trials(args.trials, args.world_sizes, args.launcher, args.steps, seed=args.seed)
    print(f"{args.launcher}: {s['killed']} of {s['trials']} trials killed a rank; {s['killed_and_recovered']} of "
          f"those recovered with the uninterrupted file ({s['recovered']} of {s['trials']} in all)")
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(s, indent=1) + "\n")
    return 0 if s["recovered"] == s["trials"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
