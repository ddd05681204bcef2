"""User models at the speed of plain NumPy: three models written as plainly as the tutorials teach
(``benchmarks/plain/``: no ``agentsim.ops``, no kernels), each beside a plain NumPy version of the
same algorithm, in alternating rounds.

- ``bacteria``: 200,000 bacteria on a 500 x 500 torus with a diffusing float64 attractant layer
  they share and eat, divisions and deaths (100 steps);
- ``traffic``: one-lane Nagel-Schreckenberg traffic, 200,000 cars on a ring of 1,000,000 cells
  (100 steps);
- ``metapop``: a metapopulation SEIR, 1,000,000 people in 1,000 cities, daily travel (50 days);
- ``traffic10m``: the traffic model on a ring of 10,000,000 cells with 2,000,000 cars (100 steps).

Each measurement is a fresh process that imports its side, then times ``run(steps, seed)`` (the
model's set-up and every step: what a user waits for), then ``run(0, seed)`` (the set-up alone,
warm): their difference over the steps is the time of a step (``step_ms``). agentsim runs with one thread
(``AGENTSIM_THREADS=1``) and with its default threads; NumPy with one thread. Figures: per model,
the median seconds of each side and the ratios agentsim/NumPy (the target: at most 1.0 on one
thread, at most 1/1.5 on two threads of an idle machine); and each side's summary at the last
step (a check that the two implement the same dynamics: other random streams, so close, not equal).

    python benchmarks/bench_plain.py --rounds 3 --out benchmarks/results/plain-models.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench_peers import checkout_env, child_json

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
# name: (the model's file in plain/, steps, sizes passed to run())
MODELS: dict[str, tuple[str, int, dict[str, int]]] = {
    "bacteria": ("bacteria", 100, {}), "traffic": ("traffic", 100, {}), "metapop": ("metapop", 50, {}),
    "traffic10m": ("traffic", 100, {"length": 10_000_000, "agents": 2_000_000}),
}
DEFAULT_MODELS = ("bacteria", "traffic", "metapop")
SIDES = ("numpy", "agentsim-1", "agentsim")  # NumPy; agentsim on one thread; agentsim's default threads

_TIMED = """
import importlib.util, json, sys, time
name, steps, side, sizes = sys.argv[1], int(sys.argv[2]), sys.argv[3], json.loads(sys.argv[5])
path = f"{sys.argv[4]}/{name}{'_numpy' if side == 'numpy' else ''}.py"
spec = importlib.util.spec_from_file_location(name, path)
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
t0 = time.perf_counter()
out = module.run(steps, 1, **sizes)
seconds = time.perf_counter() - t0
t0 = time.perf_counter()
module.run(0, 1, **sizes)  # the set-up alone (after the whole run: warm), to tell the steps' share
init_seconds = time.perf_counter() - t0
last = {k: float(v[-1]) for k, v in out.items()}
print(json.dumps({"seconds": seconds, "init_seconds": init_seconds, "last": last}))
"""


def _measure(name: str, side: str) -> dict[str, Any]:
    file, steps, sizes = MODELS[name]
    single = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
    env = checkout_env(ROOT)
    if side != "agentsim":
        env.update(single, AGENTSIM_THREADS="1")
    return child_json([sys.executable, "-c", _TIMED, file, str(steps), side, str(HERE / "plain"), json.dumps(sizes)],
                      env=env)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--models", default=",".join(DEFAULT_MODELS), help="comma-separated: " + ", ".join(MODELS))
    p.add_argument("--out", required=True)
    args = p.parse_args()
    names = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = [m for m in names if m not in MODELS]
    if unknown:
        p.error(f"--models: unknown {', '.join(unknown)} (valid: {', '.join(MODELS)})")
    rounds: list[dict[str, Any]] = []
    for r in range(args.rounds):
        for name in names:
            for side in (SIDES if r % 2 == 0 else SIDES[::-1]):  # alternating order
                got = _measure(name, side)
                rounds.append({"round": r, "model": name, "side": side, **got})
                print(json.dumps(rounds[-1]), flush=True)
    summary: dict[str, Any] = {}
    for name in names:
        med = {side: statistics.median(x["seconds"] for x in rounds if x["model"] == name and x["side"] == side
                                       and "seconds" in x) for side in SIDES}
        last = {side: next(x["last"] for x in rounds if x["model"] == name and x["side"] == side and "last" in x)
                for side in SIDES}
        steps_ms = {side: 1e3 * statistics.median(x["seconds"] - x["init_seconds"] for x in rounds
                                                   if x["model"] == name and x["side"] == side and "init_seconds" in x)
                    / MODELS[name][1] for side in SIDES}
        summary[name] = {"steps": MODELS[name][1], "sizes": MODELS[name][2], "seconds": med,
                         "step_ms": steps_ms,
                         "agentsim_one_thread_step_over_numpy": steps_ms["agentsim-1"] / steps_ms["numpy"],
                         "agentsim_one_thread_over_numpy": med["agentsim-1"] / med["numpy"],
                         "agentsim_default_over_numpy": med["agentsim"] / med["numpy"], "last_step": last}
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    result = {"machine": f"{platform.machine()}, {os.cpu_count()} cores", "python": platform.python_version(),
              "date": time.strftime("%Y-%m-%d"), "commit": commit, "rounds": rounds, "summary": summary}
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
