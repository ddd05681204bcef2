"""Kill the launcher of a multi-process run (SIGKILL) at a random moment and resume at once.

Each trial starts ``agentsim run wolfsheep --nprocs 2 --out run.h5 --every 5 --checkpoint-every K``
with a marker in its environment (``AGENTSIM_STRESS_MARKER``, inherited by its workers), waits for
its first complete checkpoint, sleeps a random time within the first 80 % of the rest of the run
(as long as the uninterrupted run took) and SIGKILLs the
launcher (the parent), never a worker. At once it starts the resume, ``agentsim run ... --nprocs 2
--resume ckpt --out run.h5`` with the same total ``--steps`` (it finds the launcher's locks free, and
waits for the killed run's workers, recorded in the lock file, if they are still alive), while it
polls ``/proc`` for the killed run's workers. A trial passes when

- no worker of the killed run is alive ``--grace`` seconds (default 3) after the kill (``orphans``),
- the resume exits 0, its file says ``steps_completed`` = ``--steps`` and completed, and its
  ``/agents``, ``/env`` and ``/metrics`` equal the uninterrupted run's file bit for bit.

Usage::

    python benchmarks/stress_parent_kills.py --trials 10 --out benchmarks/results/parent_kills.json
    python benchmarks/stress_parent_kills.py --minutes 5      # as many trials as fit

Prints the counts and writes JSON (every trial: kill time, the checkpoint step at the kill, how
long the workers outlived their parent, the resume's exit code and step count, identical).
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
import uuid
from pathlib import Path
from typing import Any

from stress_writer_kills import _datasets, _same

MODEL = ["wolfsheep", "--agents", "600", "--seed", "3"]
ROOT = Path(__file__).resolve().parents[1]


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "agentsim", "run", *MODEL, "--quiet", "--every", "5", *args]


def _env(marker: str | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    if marker is not None:
        env["AGENTSIM_STRESS_MARKER"] = marker
    return env


def marked(marker: str, exclude: int | None = None) -> list[int]:
    """Live (not zombie) processes whose environment holds the marker."""
    want = f"AGENTSIM_STRESS_MARKER={marker}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == exclude:
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if want not in f.read().split(b"\0"):
                    continue
            with open(f"/proc/{entry}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    continue
        except OSError:
            continue
        found.append(int(entry))
    return found


def reference(workdir: Path, steps: int, every: int) -> tuple[dict[str, Any], float]:
    """The uninterrupted run's file, and its seconds from the first checkpoint to the end."""
    out, ckpt = workdir / "reference.h5", workdir / "reference-ckpt"
    proc = subprocess.Popen(_cli("--steps", str(steps), "--nprocs", "2", "--out", str(out),
                                 "--checkpoint-every", str(every), "--checkpoint-dir", str(ckpt)), env=_env())
    from agentsim.io.checkpoint import latest_checkpoint

    while latest_checkpoint(ckpt) is None and proc.poll() is None:
        time.sleep(0.01)
    t0 = time.monotonic()
    if proc.wait() != 0:
        raise RuntimeError("the reference run failed")
    return _datasets(out), time.monotonic() - t0


def trial(workdir: Path, steps: int, every: int, kill_after: float, want: dict[str, Any],
          grace: float) -> dict[str, Any]:
    """One kill of the launcher, the immediate resume and its checks (see the module docstring)."""
    import h5py

    from agentsim.io.checkpoint import checkpoint_step, latest_checkpoint

    out, ckpt = workdir / "run.h5", workdir / "ckpt"
    marker = uuid.uuid4().hex
    args = ["--steps", str(steps), "--nprocs", "2", "--out", str(out), "--checkpoint-every", str(every),
            "--checkpoint-dir", str(ckpt)]
    proc = subprocess.Popen(_cli(*args), env=_env(marker), stderr=subprocess.DEVNULL)
    while latest_checkpoint(ckpt) is None and proc.poll() is None:
        time.sleep(0.005)
    time.sleep(kill_after)
    row: dict[str, Any] = {"kill_after": round(kill_after, 3), "finished_before_kill": proc.poll() is not None}
    workers_before = marked(marker, exclude=proc.pid)
    newest = latest_checkpoint(ckpt)
    row["checkpoint_step_at_kill"] = None if newest is None else checkpoint_step(newest)
    if not row["finished_before_kill"]:
        try:
            os.kill(proc.pid, signal.SIGKILL)
        except ProcessLookupError:  # it ended just now
            row["finished_before_kill"] = True
    t_kill = time.monotonic()
    proc.wait()
    # at once: the resume, while the killed run's workers may still be on their way out
    resume = subprocess.Popen(_cli(*args[:-4], "--resume", str(ckpt), "--checkpoint-every", str(every),
                                   "--checkpoint-dir", str(ckpt)),
                              env=_env(), stderr=subprocess.PIPE, text=True)
    survived = 0.0
    while True:
        alive = marked(marker, exclude=proc.pid)
        if not alive:
            break
        survived = time.monotonic() - t_kill
        if survived > 30:
            for p in alive:
                os.kill(p, signal.SIGKILL)
            break
        time.sleep(0.01)
    row["workers_at_kill"] = len(workers_before)
    row["workers_outlived_parent_s"] = round(survived, 3)
    row["orphans"] = survived > grace
    _, err = resume.communicate()
    row["resume_exit"] = resume.returncode
    row["took_over_lock"] = "taking it over" in err
    if resume.returncode != 0:
        row["resume_error"] = err[-800:]
    try:
        with h5py.File(out, "r") as f:
            row["steps_completed"] = int(f.attrs["steps_completed"])
            row["completed"] = bool(f.attrs["completed"])
        row["identical"] = _same(_datasets(out), want)
    except Exception as e:  # any failure to read counts
        row.update(steps_completed=None, completed=False, identical=False, read_error=f"{type(e).__name__}: {e}")
    row["ok"] = (not row["orphans"] and row["resume_exit"] == 0 and row["steps_completed"] == steps
                 and row["completed"] and row["identical"])
    return row


def run_trials(trials: int | None, steps: int = 150, every: int = 10, seed: int = 0, grace: float = 3.0,
               minutes: float | None = None, workdir: str | None = None) -> dict[str, Any]:
    """``trials`` kills (or as many as fit in ``minutes``); returns the summary and every trial."""
    rng = random.Random(seed)
    base = Path(workdir or tempfile.mkdtemp(prefix="agentsim-parent-kills-"))
    t0 = time.monotonic()
    want, duration = reference(base, steps, every)
    rows: list[dict[str, Any]] = []
    while trials is None or len(rows) < trials:
        if minutes is not None and rows and time.monotonic() - t0 > minutes * 60:
            break
        d = base / f"trial-{len(rows):03d}"
        d.mkdir(parents=True, exist_ok=True)
        rows.append(trial(d, steps, every, rng.uniform(0.0, 0.8 * duration), want, grace))
        r = rows[-1]
        print(f"trial {len(rows)}: kill after {r['kill_after']} s (checkpoint {r['checkpoint_step_at_kill']}"
              f"{', already finished' if r['finished_before_kill'] else ''}), "
              f"workers gone after {r['workers_outlived_parent_s']} s, resume exit {r['resume_exit']}, "
              f"{r['steps_completed']} of {steps} steps, identical {r['identical']}", flush=True)
    n = len(rows)
    return {"trials": n, "steps": steps, "checkpoint_every": every, "grace_seconds": grace,
            "run_seconds_after_first_checkpoint": round(duration, 3),
            "killed_while_running": sum(not r["finished_before_kill"] for r in rows),
            "no_orphans": sum(not r["orphans"] for r in rows),
            "max_worker_survival_s": max((r["workers_outlived_parent_s"] for r in rows), default=0.0),
            "resumed_exit_0": sum(r["resume_exit"] == 0 for r in rows),
            "steps_completed_equals_total": sum(r["steps_completed"] == steps for r in rows),
            "identical": sum(bool(r["identical"]) for r in rows), "ok": sum(r["ok"] for r in rows),
            "seconds": round(time.monotonic() - t0, 1), "rows": rows}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=None, help="number of kills (default: --minutes decides)")
    ap.add_argument("--minutes", type=float, default=None, help="stop starting trials after this long")
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--checkpoint-every", type=int, default=10)
    ap.add_argument("--grace", type=float, default=3.0, help="seconds a worker may outlive its parent")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    if args.trials is None and args.minutes is None:
        args.trials = 10
    summary = run_trials(args.trials, args.steps, args.checkpoint_every, args.seed, args.grace, args.minutes)
    print(f"{summary['trials']} launcher kills ({summary['killed_while_running']} while running): "
          f"{summary['no_orphans']} left no worker alive after {args.grace} s (longest "
          f"{summary['max_worker_survival_s']} s), {summary['resumed_exit_0']} resumes exited 0, "
          f"{summary['steps_completed_equals_total']} with steps_completed = {args.steps}, "
          f"{summary['identical']} identical to the uninterrupted file; {summary['ok']} of {summary['trials']} ok "
          f"[{summary['seconds']} s]")
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(summary, indent=1) + "\n")
    return 0 if summary["ok"] == summary["trials"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
