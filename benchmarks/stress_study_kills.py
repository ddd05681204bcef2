"""Kill a study's driver at random moments; the resumed study must finish with every run once.

Each trial starts a study (``study_models:flaky``, 4 rates x 3 replicates, a slow step, 2
workers) in a fresh driver process, SIGKILLs the driver once a random number (0-11) of its runs
are done plus a random 0-0.3 s (so kills land before, between and while runs are written), and
resumes it (in this process) to the end. The trial passes when the study file was readable
after the kill, the resumed study completes with every run, each run's metrics equal a solo run,
and no run that was complete at the kill started again afterwards (each run logs its seed when
it starts).

Usage::

    python benchmarks/stress_study_kills.py --trials 20 --out benchmarks/results/study_kills.json
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

TESTS = str(Path(__file__).resolve().parents[1] / "tests")
sys.path.insert(0, TESTS)

DRIVER = """
import sys
sys.path.insert(0, sys.argv[3])
from agentsim.study import Study
study = Study("study_models:flaky", {"rate": [0.1, 0.2, 0.3, 0.4], "log": [sys.argv[2]], "sleep": [0.1]},
              replicates=3, seed=2, agents=20, steps=4)
study.run(sys.argv[1], workers=2)
"""


def _study(log: Path) -> Any:
    from agentsim.study import Study

    return Study("study_models:flaky", {"rate": [0.1, 0.2, 0.3, 0.4], "log": [str(log)], "sleep": [0.1]},
                 replicates=3, seed=2, agents=20, steps=4)


def trial(workdir: Path, rng: random.Random, window: float) -> dict[str, Any]:
    import numpy as np

    import agentsim as asim
    from agentsim.study import read_study, study_status

    out, log = workdir / "study.h5", workdir / "log.txt"
    proc = subprocess.Popen([sys.executable, "-c", DRIVER, str(out), str(log), TESTS])
    target = rng.randint(0, 11)  # kill once this many runs are done (0: before the first), then a bit later
    deadline = time.monotonic() + window
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if out.exists() and study_status(out)["done"] >= target:
                break
        except asim.OutputError:
            pass
        time.sleep(0.02)
    time.sleep(rng.uniform(0.0, 0.3))
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    row: dict[str, Any] = {"killed_after_runs": None}
    try:
        done = set(read_study(out).runs) if out.exists() else set()
        row["killed_after_runs"] = len(done)
        started = len(log.read_text().split()) if log.exists() else 0
        time.sleep(0.5)  # let orphaned workers finish starting what they had queued
        study = _study(log)
        result = study.run(out, workers=2, resume=out.exists(), overwrite=not out.exists())
        data = read_study(out)
        executions = log.read_text().split()
        seeds = {r.run_id: str(r.seed) for r in study.runs}
        twice = sorted(k for k in done if seeds[k] in executions[started:])
        same = all(np.array_equal(data.runs[r.run_id]["metrics"]["total_size"],
                                  asim.Simulation(asim.get_model("study_models:flaky").configure(params=r.params),
                                                  agents=20, seed=r.seed).run(4).metrics["total_size"])
                   for r in study.runs)
        row.update(completed=data.completed, runs=len(data.runs), executed=result.executed, skipped=result.skipped,
                   started_again=twice, same_as_solo=same,
                   ok=data.completed and len(data.runs) == 12 and not twice and same)
    except Exception as e:  # any failure to read or resume is what this counts
        row.update(ok=False, error=f"{type(e).__name__}: {e}")
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=20)
    ap.add_argument("--window", type=float, default=60.0, help="kill by this many seconds after the start")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    rng = random.Random(args.seed)
    base = Path(tempfile.mkdtemp(prefix="agentsim-study-kills-"))
    rows = []
    for k in range(args.trials):
        d = base / f"trial-{k:03d}"
        d.mkdir()
        rows.append(trial(d, rng, args.window))
        print(json.dumps(rows[-1]), flush=True)
    ok = sum(r["ok"] for r in rows)
    print(f"{args.trials} driver kills: {ok} resumed to a complete study with no finished run started again "
          f"(killed after {sorted(r['killed_after_runs'] for r in rows if r['killed_after_runs'] is not None)} runs)")
    if args.out is not None:
        args.out.write_text(json.dumps({"trials": args.trials, "ok": ok, "rows": rows}, indent=1) + "\n")
    return 0 if ok == args.trials else 1


if __name__ == "__main__":
    raise SystemExit(main())
