"""Stress: a study on a real full disk, at every size from a few runs to the whole file.

Runs ``agentsim sweep sir ...`` once on an ordinary disk (the uninterrupted study), then on a
tmpfs (root only) sized from ``--low`` to ``--high`` times that file's size in ``--trials`` steps,
so the disk fills in the file's creation, in a run's group, in the summary or not at all. Each
trial checks:

- the sweep exits 0, or 1 with one line naming the cause (no traceback, no crash);
- ``agentsim study status`` exits 0 or 1 without a traceback;
- after the disk is made large, ``--resume`` exits 0 and the file equals the uninterrupted
  study (runs, summary and bands, bit for bit);
- nothing but the study file and its status file is left on the disk.

Usage: ``python benchmarks/stress_study_full_disk.py --trials 30 [--json FILE]``; prints one line
per trial and the counts, and writes the rows and counts as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import agentsim as asim  # noqa: E402

SWEEP = ["sweep", "sir", "--grid", "beta=0.02,0.03,0.04,0.05", "--replicates", "4", "--agents", "300", "--steps",
         "200", "--workers", "2", "--quiet"]


def _agentsim(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "agentsim", *args], capture_output=True, text=True, timeout=600,
                          cwd=ROOT)


def same_study(a: Path, b: Path) -> bool:
    """Whether two study files hold the same runs, summary and bands, bit for bit."""
    x, y = asim.read_study(a), asim.read_study(b)
    if not (x.completed and y.completed) or sorted(x.runs) != sorted(y.runs) or sorted(x.bands) != sorted(y.bands):
        return False
    pairs = [(v, y.runs[k]["metrics"].get(m)) for k in x.runs for m, v in x.runs[k]["metrics"].items()]
    pairs += [(v, y.summary.get(c)) for c, v in x.summary.items()]
    pairs += [(v, y.bands[c].get(m)) for c, band in x.bands.items() for m, v in band.items()
              if isinstance(v, np.ndarray)]
    return all(w is not None and np.array_equal(v, w) for v, w in pairs)


def trial(disk: Path, whole: Path, size: int) -> dict[str, object]:
    subprocess.run(["mount", "-o", f"remount,size={size}", str(disk)], check=True)
    out = disk / "s.h5"
    first = _agentsim(*SWEEP, "--out", str(out))
    status = _agentsim("study", "status", str(out)) if out.exists() else None
    subprocess.run(["mount", "-o", "remount,size=64m", str(disk)], check=True)
    resumed = _agentsim(*SWEEP, "--out", str(out), "--resume")
    row: dict[str, object] = {
        "size": size, "rc": first.returncode, "error": first.stderr.strip().splitlines()[-1:] or [""],
        "one_line": first.returncode == 0 or len(first.stderr.strip().splitlines()) == 1,
        "traceback": "Traceback" in first.stderr or "Exception ignored" in first.stderr,
        "crashed": first.returncode not in (0, 1),
        "status_ok": status is None or (status.returncode in (0, 1) and "Traceback" not in status.stderr),
        "resume_rc": resumed.returncode, "identical": resumed.returncode == 0 and same_study(out, whole),
        "left": sorted(p.name for p in disk.iterdir() if p.name not in ("s.h5", "s.h5.status.json")),
    }
    row["error"] = str(row["error"][0])[:300]  # type: ignore[index]
    row["ok"] = bool(row["one_line"] and not row["traceback"] and not row["crashed"] and row["status_ok"]
                     and row["identical"] and not row["left"])
    for p in disk.iterdir():
        p.unlink()
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=30)
    ap.add_argument("--low", type=float, default=0.05, help="smallest disk, times the finished file's size")
    ap.add_argument("--high", type=float, default=2.2, help="largest disk, times the finished file's size")
    ap.add_argument("--json", default=str(ROOT / "benchmarks" / "results" / "stress_study_full_disk.json"))
    args = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("needs root (it mounts a tmpfs)")
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        whole, disk = Path(tmp) / "whole.h5", Path(tmp) / "disk"
        done = _agentsim(*SWEEP, "--out", str(whole))
        if done.returncode:
            raise SystemExit(done.stderr)
        disk.mkdir()
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(disk)], check=True)
        rows = []
        try:
            full = whole.stat().st_size
            for k in range(args.trials):
                size = int(full * (args.low + (args.high - args.low) * k / max(1, args.trials - 1)))
                size = max(4096, size // 4096 * 4096)
                row = trial(disk, whole, size)
                rows.append(row)
                print(f"{size:>9,} B: rc {row['rc']}, resume rc {row['resume_rc']}, identical {row['identical']}, "
                      f"ok {row['ok']}: {row['error']}", flush=True)
        finally:
            subprocess.run(["umount", str(disk)], check=False)
    counts = {"trials": len(rows), "disk_full": sum(r["rc"] == 1 for r in rows),
              "finished": sum(r["rc"] == 0 for r in rows), "tracebacks": sum(bool(r["traceback"]) for r in rows),
              "crashes": sum(bool(r["crashed"]) for r in rows),
              "more_than_one_line": sum(not r["one_line"] for r in rows),
              "status_failed": sum(not r["status_ok"] for r in rows),
              "resume_not_identical": sum(not r["identical"] for r in rows),
              "files_left": sum(bool(r["left"]) for r in rows), "ok": sum(bool(r["ok"]) for r in rows)}
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip() or None
    meta = {"machine": f"{platform.machine()}, {os.cpu_count()} cores", "python": platform.python_version(),
            "date": time.strftime("%Y-%m-%d"), "commit": commit, "whole_file_bytes": full,
            "command": "agentsim " + " ".join(SWEEP), "seconds": round(time.perf_counter() - t0, 1)}
    print(json.dumps(counts))
    Path(args.json).write_text(json.dumps({"meta": meta, "counts": counts, "rows": rows}, indent=1) + "\n")
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
