"""Kill a process while it writes checkpoints; the newest complete checkpoint must stay loadable.

Each trial starts a fresh process that runs ``--model`` with ``--agents`` agents and saves a
checkpoint after every step (``keep=2``), so that most of its time is spent writing shards and
manifests; once the first checkpoint is complete, it is SIGKILLed at a random moment. The trial
passes when :func:`agentsim.io.checkpoint.read_checkpoint` reads the newest complete checkpoint
(every checksum verified) and a simulation resumes from it. Also reported: the seconds a
checkpoint of this size takes (the overhead per saved step), from the same process's log.

Usage::

    python benchmarks/stress_checkpoint_kills.py --trials 50 --out benchmarks/results/checkpoint_kills.json
    python benchmarks/stress_checkpoint_kills.py --trials 50 --asynchronous   # background writes

With ``--asynchronous`` the checkpoints are written by the background thread
(``save_checkpoint(..., asynchronous=True)``) while the next step runs; the logged checkpoint
seconds are then what the step loop waited (the copy, and the previous write if still going).
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

WRITER = """
import sys, time, agentsim as asim
model, agents, directory, asynchronous = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4] == "1"
sim = asim.Simulation(asim.get_model(model), agents=agents, seed=1)
for _ in range(1000):
    t0 = time.perf_counter(); sim.step(); t1 = time.perf_counter()
    sim.save_checkpoint(directory, keep=2, asynchronous=asynchronous)
    print(f"step {t1 - t0:.4f} checkpoint {time.perf_counter() - t1:.4f}", flush=True)
"""


def trial(workdir: Path, model: str, agents: int, rng: random.Random, window: float,
          asynchronous: bool = False) -> dict[str, Any]:
    import agentsim as asim
    from agentsim.io.checkpoint import latest_checkpoint, read_checkpoint

    ckpt = workdir / "ckpt"
    proc = subprocess.Popen([sys.executable, "-c", WRITER, model, str(agents), str(ckpt), str(int(asynchronous))],
                            stdout=subprocess.PIPE, text=True)
    while not any(ckpt.glob("step-*/manifest.json")) and proc.poll() is None:
        time.sleep(0.005)
    time.sleep(rng.uniform(0.0, window))
    os.kill(proc.pid, signal.SIGKILL)
    log, _ = proc.communicate()
    row: dict[str, Any] = {"unfinished_dirs": 0}
    newest = latest_checkpoint(ckpt)
    row["unfinished_dirs"] = sum(1 for p in ckpt.glob("step-*") if not (p / "manifest.json").exists())
    try:
        assert newest is not None
        row["step"] = read_checkpoint(newest).step
        sim = asim.Simulation(asim.get_model(model), agents=agents, seed=1, resume=ckpt)
        row["loadable"] = sim.state.step == row["step"]
    except Exception as e:  # any failure to load is what this counts
        row.update(loadable=False, error=f"{type(e).__name__}: {e}")
    times = [line.split() for line in log.splitlines() if line.startswith("step ")]
    row["step_seconds"] = [float(t[1]) for t in times]
    row["checkpoint_seconds"] = [float(t[3]) for t in times]
    return row


def run_trials(trials: int, model: str = "randomwalk", agents: int = 1_000_000, window: float = 3.0, seed: int = 0,
               workdir: str | None = None, asynchronous: bool = False) -> dict[str, Any]:
    rng = random.Random(seed)
    base = Path(workdir or tempfile.mkdtemp(prefix="agentsim-checkpoint-kills-"))
    rows = []
    for k in range(trials):
        d = base / f"trial-{k:03d}"
        d.mkdir(parents=True, exist_ok=True)
        rows.append(trial(d, model, agents, rng, window, asynchronous))
    ck = sorted(s for r in rows for s in r["checkpoint_seconds"])
    st = sorted(s for r in rows for s in r["step_seconds"])
    return {"trials": trials, "model": model, "agents": agents, "asynchronous": asynchronous,
            "loadable": sum(r["loadable"] for r in rows),
            "killed_mid_write": sum(r["unfinished_dirs"] > 0 for r in rows),
            "median_checkpoint_seconds": ck[len(ck) // 2] if ck else None,
            "median_step_seconds": st[len(st) // 2] if st else None, "rows": rows}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=50)
    ap.add_argument("--model", default="randomwalk")
    ap.add_argument("--agents", type=int, default=1_000_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--asynchronous", action="store_true", help="write checkpoints in the background")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    s = run_trials(args.trials, args.model, args.agents, seed=args.seed, asynchronous=args.asynchronous)
    print(f"{s['trials']} kills while checkpointing {args.model} x {args.agents}: {s['loadable']} left a loadable "
          f"checkpoint ({s['killed_mid_write']} killed with an unfinished checkpoint on disk); a checkpoint takes "
          f"{s['median_checkpoint_seconds']} s, a step {s['median_step_seconds']} s (medians)")
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(s, indent=1) + "\n")
    return 0 if s["loadable"] == s["trials"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
