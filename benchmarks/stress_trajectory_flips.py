"""Stress: one flipped bit in a trajectory file, thousands of times; every reader's answer counted.

Writes a small wolf-sheep trajectory (two populations, env layers, metric and perf rows), then
flips one random bit of a copy per trial: half the trials in a byte a reader serves (the rows of
the datasets, each byte as likely), half anywhere in the file. A worker process reads each copy the
way a user does (``read_trajectory``, every frame of every population and env layer,
``Trajectory.verify``) and reports a digest of what it served; the parent kills a worker that
takes longer than ``--timeout`` seconds on one file (a hang) and starts another. Outcomes:

- ``refused``: an ``OutputError`` of one line;
- ``unchanged``: everything served equals the original file's (the bit landed where nothing is read);
- ``perf_dropped``: the same, with the machine's figures (``/perf``) dropped as unreadable;
- ``wrong``: something served differs from the original: a silent wrong result;
- ``traceback``: any other exception; ``hang``: no answer within the timeout.

Usage: ``python benchmarks/stress_trajectory_flips.py --trials 1000 [--json FILE]``; prints the
counts and writes them as JSON, with one row per trial that was neither refused nor unchanged, and
per flip in served bytes that read unchanged.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import queue
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
RUN = ["run", "wolfsheep", "--agents", "60", "--steps", "6", "--every", "2", "--quiet"]


def served(path: str) -> dict[str, Any]:
    """What the readers serve of ``path``: ``{"outcome": "read", "digest", "perf"}`` or the error."""
    from agentsim.errors import OutputError
    from agentsim.io.hdf5 import read_trajectory

    try:
        traj = read_trajectory(path)
        h = hashlib.sha256(json.dumps(traj.attrs, sort_keys=True, default=str).encode())
        parts: list[tuple[str, np.ndarray]] = sorted(traj.metrics.items())
        for pop in traj.populations:
            for step in traj.steps(pop).tolist():
                parts += [(f"{pop}@{step}/{k}", v) for k, v in traj.agents(pop, step=step).items()]
        for name in traj.env_names:
            parts += [(f"env/{name}@{s}", np.asarray(traj.env(name, s))) for s in traj.env_steps().tolist()]
        getattr(traj, "verify", int)()  # (absent before format 2: the script also runs on older trees)
        for key, value in parts:
            h.update(key.encode() + str(value.dtype).encode() + str(value.shape).encode() + value.tobytes())
        perf = hashlib.sha256(b"".join(k.encode() + v.tobytes() for k, v in sorted(traj.perf.items())))
        return {"outcome": "read", "digest": h.hexdigest(), "perf": perf.hexdigest() if traj.perf else None}
    except OutputError as e:
        return {"outcome": "refused" if "\n" not in str(e) else "traceback", "error": str(e)[:300]}
    except Exception as e:  # (counted: any other exception is a finding)
        return {"outcome": "traceback", "error": f"{type(e).__name__}: {e}"[:300]}


def worker() -> None:
    """Read the paths given on stdin, one per line; answer each with one JSON line."""
    for line in sys.stdin:
        print(json.dumps(served(line.strip())), flush=True)


class Reader:
    """A worker process, killed and replaced when one file takes too long."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen([sys.executable, __file__, "--worker"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, cwd=ROOT)
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)

    def read(self, path: str, timeout: float) -> dict[str, Any] | None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(path + "\n")
        self.proc.stdin.flush()
        try:
            return dict(json.loads(self.lines.get(timeout=timeout)))
        except queue.Empty:
            self.proc.kill()
            return None


def data_spans(path: str) -> list[tuple[str, int, int]]:
    """(dataset, first byte, bytes in use) of every chunk of every dataset with rows (uncompressed)."""
    import h5py

    spans: list[tuple[str, int, int]] = []

    def visit(name: str, obj: Any) -> None:
        if isinstance(obj, h5py.Dataset) and obj.shape and obj.shape[0]:
            row_bytes = obj.dtype.itemsize * int(np.prod(obj.shape[1:]))
            for i in range(obj.id.get_num_chunks()):
                info = obj.id.get_chunk_info(i)  # (a chunk past the last row holds none in use)
                rows_from_here = max(0, obj.shape[0] - info.chunk_offset[0])
                spans.append((name, info.byte_offset, min(info.size, rows_from_here * row_bytes)))

    with h5py.File(path, "r") as f:
        f.visititems(visit)
    return spans


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=30.0, help="seconds one file may take before it counts as a hang")
    ap.add_argument("--json", default=str(ROOT / "benchmarks" / "results" / "stress_trajectory_flips.json"))
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker()
        return
    t0 = time.perf_counter()
    rng = np.random.default_rng(args.seed)
    counts = {k: 0 for k in ("refused", "unchanged", "perf_dropped", "wrong", "traceback", "hang")}
    by_place: dict[str, dict[str, int]] = {"data": dict.fromkeys(counts, 0), "anywhere": dict.fromkeys(counts, 0)}
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        original = os.path.join(tmp, "run.h5")
        done = subprocess.run([sys.executable, "-m", "agentsim", *RUN, "--out", original], cwd=ROOT,
                              capture_output=True, text=True)
        if done.returncode:
            raise SystemExit(done.stderr)
        data = Path(original).read_bytes()
        spans = data_spans(original)
        ends = np.cumsum([used for _, _, used in spans])
        total = int(ends[-1])
        reader = Reader()
        want = reader.read(original, args.timeout)
        if want is None or want["outcome"] != "read":
            raise SystemExit(f"the original file does not read: {want}")
        copy = os.path.join(tmp, "flipped.h5")
        for trial in range(args.trials):
            place = "data" if trial % 2 == 0 else "anywhere"
            if place == "data":
                at = int(rng.integers(total))  # a byte in use, each as likely
                k = int(np.searchsorted(ends, at, side="right"))
                name, first, _ = spans[k]
                at = first + at - (int(ends[k - 1]) if k else 0)
            else:
                name, at = "", int(rng.integers(len(data)))
            bit = int(rng.integers(8))
            flipped = bytearray(data)
            flipped[at] ^= 1 << bit
            Path(copy).write_bytes(bytes(flipped))
            got = reader.read(copy, args.timeout)
            if got is None:
                outcome, reader = "hang", Reader()
            elif got["outcome"] != "read":
                outcome = got["outcome"]
            elif got["digest"] != want["digest"]:
                outcome = "wrong"
            elif got["perf"] != want["perf"]:
                outcome = "perf_dropped" if got["perf"] is None else "wrong"
            else:
                outcome = "unchanged"
            counts[outcome] += 1
            by_place[place][outcome] += 1
            if outcome not in ("refused", "unchanged") or (place == "data" and outcome == "unchanged"):
                rows.append({"trial": trial, "byte": at, "bit": bit, "dataset": name, "outcome": outcome,
                             "error": (got or {}).get("error", "")})
            if (trial + 1) % 100 == 0:
                print(f"{trial + 1} trials: {counts}", flush=True)
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip() or None
    meta = {"machine": f"{platform.machine()}, {os.cpu_count()} cores", "python": platform.python_version(),
            "date": time.strftime("%Y-%m-%d"), "commit": commit, "file_bytes": len(data),
            "data_bytes": sum(u for _, _, u in spans), "command": "agentsim " + " ".join(RUN), "seed": args.seed,
            "timeout_s": args.timeout, "seconds": round(time.perf_counter() - t0, 1)}
    print(json.dumps({"counts": counts, "by_place": by_place}))
    Path(args.json).write_text(json.dumps({"meta": meta, "counts": counts, "by_place": by_place, "rows": rows},
                                          indent=1) + "\n")
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
