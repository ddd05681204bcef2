"""Stress: a write failure injected at a random moment is fatal at once, on 1 or 2 processes.

Each trial runs ``agentsim run randomwalk ... --out run.h5 --checkpoint-every 20`` in a new
process session with ``AGENTSIM_TEST_WRITE_FAULT`` (:mod:`agentsim.io.faults`) naming a random
target (the trajectory file, a rank's checkpoint shard, the checkpoint's env file or its
manifest) and a random write call from which writes fail (a full disk stays full), on 1 or 2
processes at random, and checks:

- the run exits non-zero, and its error names the file that failed (if the failure was hit:
  a write index past the run's last write lets the run finish, exit 0, with a complete file);
- the trajectory file, if any, is not marked complete (``completed`` False), and ``agentsim
  inspect`` does not call it complete;
- no checkpoint whose write failed is complete (a manifest-less directory at most);
- no process of the run is left running (its session is empty once it exits).

Usage: ``python benchmarks/stress_write_failures.py --trials 40 [--seed 0] [--json FILE]``;
prints one line per trial and a summary line, and writes the rows and counts as JSON.
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

ROOT = Path(__file__).resolve().parents[1]
STEPS, CHECKPOINT_EVERY = 60, 20
RESULTS = ROOT / "benchmarks" / "results" / "stress_write_failures.json"


def _completed(path: Path) -> bool | None:
    import h5py

    if not path.exists():
        return None
    with h5py.File(path, "r") as f:
        return bool(f.attrs.get("completed", False))


def _session_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def trial(k: int, rng: random.Random, workdir: Path) -> dict:
    d = workdir / f"t{k:03d}"
    d.mkdir(parents=True)
    nprocs = rng.choice([1, 2])
    kind = rng.choice(["trajectory", "trajectory", "shard", "env", "manifest"])
    if kind == "trajectory":
        target, when = "run.h5", rng.randint(1, 400)
    else:
        rank = rng.randrange(nprocs)
        target = {"shard": f"rank-{rank:05d}-of-{nprocs:05d}.pt", "env": "env.pt", "manifest": "manifest.json"}[kind]
        when = rng.randint(1, STEPS // CHECKPOINT_EVERY)
    out, ck = d / "run.h5", d / "ck"
    env = {**os.environ, "AGENTSIM_TEST_WRITE_FAULT": f"{target}:{when}",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, "-m", "agentsim", "run", "randomwalk", "--agents", "400", "--steps", str(STEPS),
           "--every", "1", "--quiet", "--nprocs", str(nprocs), "--out", str(out),
           "--checkpoint-every", str(CHECKPOINT_EVERY), "--checkpoint-dir", str(ck)]
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, env=env, cwd=d, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        _, err = proc.communicate(timeout=120)
        timed_out = False
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        _, err = proc.communicate()
        timed_out = True
    seconds = time.monotonic() - t0
    deadline = time.monotonic() + 3.0  # the session's last processes (multiprocessing's resource tracker
    while _session_alive(proc.pid) and time.monotonic() < deadline:  # ends on its pipe's EOF) go briefly
        time.sleep(0.05)
    left_running = _session_alive(proc.pid)
    left = ""
    if left_running:
        left = subprocess.run(["ps", "-o", "pid,etimes,cmd", "-g", str(proc.pid)], capture_output=True,
                              text=True).stdout
        os.killpg(proc.pid, signal.SIGKILL)
    error_line = next((line for line in err.splitlines() if line.startswith("agentsim: error:")), "")
    hit = proc.returncode != 0 or "injected by AGENTSIM_TEST_WRITE_FAULT" in err
    try:
        complete = _completed(out)
    except OSError:
        complete = None  # unreadable: not complete either
    inspect = subprocess.run([sys.executable, "-m", "agentsim", "inspect", str(out)], env=env,
                             capture_output=True, text=True) if out.exists() else None
    inspect_says_complete = inspect is not None and inspect.returncode == 0 and ", completed" in inspect.stdout
    from agentsim.io.checkpoint import latest_checkpoint

    newest = latest_checkpoint(ck)
    failed_step = None
    if hit and kind != "trajectory":
        failed_step = when * CHECKPOINT_EVERY  # the checkpoint whose write failed
    bad_checkpoint = failed_step is not None and newest is not None and newest.name == f"step-{failed_step:08d}"
    if hit:
        ok = (proc.returncode not in (0, None) and not timed_out and target in error_line
              and "Traceback" not in err and not complete and not inspect_says_complete
              and not bad_checkpoint and not left_running)
    else:  # the write index was past the run's last write: a normal, complete run
        ok = proc.returncode == 0 and complete is True and not left_running
    return {"trial": k, "nprocs": nprocs, "target": target, "kind": kind, "from_write": when, "hit": hit,
            "exit": proc.returncode, "timed_out": timed_out, "seconds": round(seconds, 2),
            "names_file": target in error_line, "traceback": "Traceback" in err, "completed": complete,
            "inspect_says_complete": inspect_says_complete, "failed_checkpoint_complete": bad_checkpoint,
            "left_running": left_running, "left": left[-600:], "error": error_line[:300], "ok": ok}


def run_trials(trials: int, seed: int = 0, workdir: str | None = None) -> dict:
    rng = random.Random(seed)
    base = Path(workdir or tempfile.mkdtemp(prefix="stress-write-failures-"))
    rows = []
    for k in range(trials):
        row = trial(k, rng, base)
        rows.append(row)
        print(f"trial {k:3d}: nprocs {row['nprocs']} {row['target']}:{row['from_write']} -> exit {row['exit']} "
              f"({'hit' if row['hit'] else 'not hit'}, {row['seconds']} s) {'ok' if row['ok'] else 'FAILED'} "
              f"{row['error'][:140]}", flush=True)
    hit = [r for r in rows if r["hit"]]
    counts = {
        "trials": len(rows), "hit": len(hit), "not_hit_finished_complete": sum(r["ok"] for r in rows if not r["hit"]),
        "nonzero_exit": sum(r["exit"] not in (0, None) for r in hit),
        "names_file": sum(r["names_file"] for r in hit),
        "not_marked_complete": sum(not r["completed"] and not r["inspect_says_complete"] for r in hit),
        "no_failed_checkpoint_complete": sum(not r["failed_checkpoint_complete"] for r in hit),
        "no_process_left": sum(not r["left_running"] for r in rows),
        "tracebacks": sum(r["traceback"] for r in rows), "timed_out": sum(r["timed_out"] for r in rows),
        "ok": sum(r["ok"] for r in rows),
        "one_process": sum(r["nprocs"] == 1 for r in rows), "two_processes": sum(r["nprocs"] == 2 for r in rows),
    }
    return {"counts": counts, "rows": rows}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=40)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=str(RESULTS), help="where the rows and counts go")
    ap.add_argument("--workdir", default=None)
    args = ap.parse_args()
    t0 = time.monotonic()
    summary = run_trials(args.trials, args.seed, args.workdir)
    c = summary["counts"]
    summary["seconds"] = round(time.monotonic() - t0, 1)
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(summary, indent=1) + "\n")
    print(f"write failures: {c['ok']} of {c['trials']} trials ok; {c['hit']} hit a failure: {c['nonzero_exit']} "
          f"exited non-zero, {c['names_file']} named the file, {c['not_marked_complete']} left no file marked "
          f"complete, {c['no_failed_checkpoint_complete']} no failed checkpoint complete; "
          f"{c['not_hit_finished_complete']} not hit finished complete; {c['no_process_left']} left no process; "
          f"{c['tracebacks']} tracebacks; {c['one_process']} on 1 process, {c['two_processes']} on 2 "
          f"({summary['seconds']} s; {args.json})")
    return 0 if c["ok"] == c["trials"] else 1


if __name__ == "__main__":
    sys.exit(main())
