"""Corrupt checkpoints at random and resume them: a clear refusal or the uninterrupted result, and
no payload ever runs (issue 33: files from elsewhere never execute code).

Each trial copies a valid checkpoint (a simulation checkpoint of randomwalk at step 2 of 4, or a
training checkpoint of spillover after update 1 of 3, at random), applies one random corruption,
and resumes it with the ``agentsim`` command (``run --resume`` or ``train --resume``):

- ``flip``: XOR a random byte of a random file with a random non-zero value;
- ``truncate``: cut a random file to a random length;
- ``malicious``: replace a random tensor file with a random crafted pickle whose ``__reduce__``
  would create a marker file (``open``, ``os.system``, ``exec``, ``eval``; a ``torch.save`` zip or
  a bare pickle of protocol 0-5), with its checksums made to match half of the time;
- ``manifest``: set a random field of the manifest (nested ones included) to a random value, or
  delete it, with the manifest's checksum made to match half of the time;
- ``pointer``: make ``latest`` or a manifest's file name point outside the directory (``..``,
  an absolute path, a symbolic link to a copy elsewhere);
- ``noop``: rewrite a file with its own bytes, or add an unrelated file.

A trial passes when the command either refuses (non-zero exit, an ``agentsim: error:`` line, no
traceback) or exits 0 with the uninterrupted result (the final agents of the simulation, the
trained network's parameters bit for bit), and no marker file exists.

Usage::

    python benchmarks/stress_untrusted_files.py --trials 200 --out benchmarks/results/untrusted_files.json
    python benchmarks/stress_untrusted_files.py --trials 20 --subprocess   # a fresh `agentsim` per resume

By default the command runs in this process (``agentsim.cli.main.main``, stderr captured; an exception
that escapes it counts as a traceback); ``--subprocess`` runs ``python -m agentsim`` instead.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import json
import os
import pickle
import random
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from collections import Counter
from pathlib import Path
from typing import Any

import torch

SIM_RUN = ["run", "randomwalk", "--agents", "60", "--quiet", "--seed", "3"]
TRAIN = ["train", "spillover", "--agents", "200", "--updates", "3", "--horizon", "4", "--hidden", "8",
         "--minibatches", "2", "--epochs", "1", "--seed", "5", "--quiet"]


# --------------------------------------------------------------------------- payloads
class _Open:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> Any:
        return (open, (self.marker, "w"))


class _System:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> Any:
        return (os.system, (f"touch '{self.marker}'",))


class _Exec:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> Any:
        return (exec, (f"open({self.marker!r}, 'w').close()",))


class _Eval:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> Any:
        return (eval, (f"open({self.marker!r}, 'w')",))


def malicious(marker: Path, rng: random.Random) -> tuple[bytes, str]:
    payload = rng.choice([_Open, _System, _Exec, _Eval])(str(marker))
    obj = rng.choice([{"agents": {"uid": payload}}, {"net": payload, "format": "agentsim-ppo-checkpoint"}, payload,
                      [torch.zeros(3), payload]])
    if rng.random() < 0.5:
        buf = io.BytesIO()
        torch.save(obj, buf)
        return buf.getvalue(), f"torch.save/{type(payload).__name__}"
    protocol = rng.randint(0, pickle.HIGHEST_PROTOCOL)
    return pickle.dumps(obj, protocol=protocol), f"pickle{protocol}/{type(payload).__name__}"


# --------------------------------------------------------------------------- the command
def agentsim(argv: list[str], use_subprocess: bool) -> tuple[int, str]:
    if use_subprocess:
        proc = subprocess.run([sys.executable, "-m", "agentsim", *argv], capture_output=True, text=True, timeout=300)
        return proc.returncode, proc.stderr
    from agentsim.cli.main import main

    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            code = main(argv)
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 2
        except BaseException:
            err.write(traceback.format_exc())
            code = 99
    return code, err.getvalue()


# --------------------------------------------------------------------------- baselines
def baselines(root: Path, use_subprocess: bool) -> dict[str, Any]:
    """The valid checkpoints and the uninterrupted results."""
    from agentsim.learn.checkpoint import load_latest

    sim_ck, train_ck = root / "sim-ck", root / "train-ck"
    code, err = agentsim([*SIM_RUN, "--steps", "2", "--checkpoint-every", "2", "--checkpoint-dir", str(sim_ck)],
                         use_subprocess)
    assert code == 0, err
    code, err = agentsim([*SIM_RUN, "--steps", "4", "--out", str(root / "sim-full.h5")], use_subprocess)
    assert code == 0, err
    full_train = root / "train-full"
    code, err = agentsim([*TRAIN, "--checkpoint-dir", str(full_train)], use_subprocess)
    assert code == 0, err
    _train_one_update(train_ck)
    full = load_latest(full_train)
    assert full is not None
    return {"sim": sim_ck, "train": train_ck, "sim_full": _final_agents(root / "sim-full.h5"),
            "train_net": _flat(full["net"])}


def _train_one_update(directory: Path) -> None:
    """Update 1 of TRAIN's 3, checkpointed (an interrupted training)."""
    from agentsim.models.spillover import MODEL

    from agentsim.learn import PPOConfig, Trainer

    config = PPOConfig(horizon=4, hidden=(8,), minibatches=2, epochs=1)
    Trainer(MODEL, agents=200, seed=5, updates=3, config=config).train(1, checkpoint_dir=directory)


def _flat(net: dict[str, torch.Tensor]) -> torch.Tensor:
    return torch.cat([v.flatten().to(torch.float64) for v in net.values()])


def _final_agents(path: Path) -> dict[str, Any]:
    """The last frame of every population (in uid order) and the last row of every metric."""
    import h5py
    import numpy as np

    out: dict[str, Any] = {}
    with h5py.File(path, "r") as f:
        for pop, g in f["agents"].items():
            lo, hi = int(g["offsets"][-2]), int(g["offsets"][-1])
            order = np.argsort(g["uid"][lo:hi], kind="stable")
            out[f"{pop}/step"] = np.asarray(g["step"][-1])
            for name, ds in g.items():
                if name not in ("offsets", "step"):
                    out[f"{pop}/{name}"] = np.asarray(ds[lo:hi])[order]
        for name, ds in f["metrics"].items():
            out[f"metrics/{name}"] = np.asarray(ds[-1])
    return out


def same_result(kind: str, work: Path, base: dict[str, Any]) -> bool:
    import numpy as np

    from agentsim.learn.checkpoint import load_latest

    if kind == "train":
        got = load_latest(work / "ck")
        return got is not None and int(got["update"]) == 3 and torch.equal(_flat(got["net"]), base["train_net"])
    got = _final_agents(work / "resumed.h5")
    return got.keys() == base["sim_full"].keys() and all(
        np.array_equal(got[k], base["sim_full"][k]) for k in got)


# --------------------------------------------------------------------------- corruptions
def _files(ck: Path, kind: str) -> list[Path]:
    if kind == "sim":
        step = next(ck.glob("step-*"))
        return sorted(p for p in step.iterdir() if p.is_file())
    return sorted(p for p in ck.iterdir() if p.is_file())


def _manifest_path(ck: Path, kind: str) -> Path:
    if kind == "sim":
        return next(ck.glob("step-*")) / "manifest.json"
    return ck / (ck / "latest").read_text().strip()


def _reseal(ck: Path, kind: str, changed: Path | None = None) -> None:
    """Make the manifest match ``changed``'s bytes and itself (what a forger would do)."""
    from agentsim.io.checkpoint import manifest_checksum

    path = _manifest_path(ck, kind)
    m = json.loads(path.read_text())
    if changed is not None:
        digest = hashlib.sha256(changed.read_bytes()).hexdigest()
        entries = [*m["shards"], m["env"]] if kind == "sim" else [m]
        for e in entries:
            if e.get("file") == changed.name:
                e["sha256"] = digest
    m["checksum"] = manifest_checksum(m)
    path.write_text(json.dumps(m))


def _paths(obj: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix] if prefix else []
    if isinstance(obj, dict):
        for k, v in obj.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            out += _paths(v, (*prefix, i))
    return out


def corrupt(ck: Path, kind: str, work: Path, marker: Path, rng: random.Random) -> str:
    """Apply one random corruption to the checkpoint ``ck``; return what was done."""
    how = rng.choice(["flip", "truncate", "malicious", "manifest", "pointer", "noop"])
    files = _files(ck, kind)
    if how == "flip":
        f = rng.choice(files)
        data = bytearray(f.read_bytes())
        i = rng.randrange(len(data))
        data[i] ^= rng.randint(1, 255)
        f.write_bytes(bytes(data))
        return f"flip {f.name}@{i}"
    if how == "truncate":
        f = rng.choice(files)
        data = f.read_bytes()
        n = rng.randrange(len(data))
        f.write_bytes(data[:n])
        return f"truncate {f.name} to {n}"
    if how == "malicious":
        f = rng.choice([p for p in files if p.suffix == ".pt"])
        data, what = malicious(marker, rng)
        f.write_bytes(data)
        sealed = rng.random() < 0.5
        if sealed:
            _reseal(ck, kind, f)
        return f"malicious {f.name} {what}{' resealed' if sealed else ''}"
    if how == "manifest":
        path = _manifest_path(ck, kind)
        m = json.loads(path.read_text())
        keys = [p for p in _paths(m) if p != ("checksum",)]
        where = rng.choice(keys)
        parent = m
        for k in where[:-1]:
            parent = parent[k]
        value = rng.choice([None, "x", -1, 0, 1, 2.5, True, [], {}, "../x", "/etc/passwd", 10**20, "delete"])
        if isinstance(parent[where[-1]], int) and not isinstance(parent[where[-1]], bool) and rng.random() < 0.5:
            value = parent[where[-1]] + rng.choice([-1, 1])
        if value == "delete" and isinstance(parent, dict):
            del parent[where[-1]]
        else:
            parent[where[-1]] = value
        path.write_text(json.dumps(m))
        sealed = rng.random() < 0.5
        if sealed:
            from agentsim.io.checkpoint import manifest_checksum

            m["checksum"] = manifest_checksum(m)
            path.write_text(json.dumps(m))
        return f"manifest {'.'.join(map(str, where))}={value!r}{' resealed' if sealed else ''}"
    if how == "pointer":
        outside = work / "outside"
        outside.mkdir(exist_ok=True)
        if kind == "train" and rng.random() < 0.6:
            name = (ck / "latest").read_text().strip()
            shutil.copy(ck / name, outside / name)
            target = rng.choice([f"../outside/{name}", str(outside / name), "link"])
            if target == "link":
                (ck / "latest").unlink()
                (ck / "latest").symlink_to(outside / name)
            else:
                (ck / "latest").write_text(target)
            return f"pointer latest -> {target}"
        path = _manifest_path(ck, kind)
        m = json.loads(path.read_text())
        entry = rng.choice([*m["shards"], m["env"]]) if kind == "sim" else m
        src = path.parent / entry["file"]
        shutil.copy(src, outside / src.name)
        choice = rng.choice(["dotdot", "absolute", "link"])
        if choice == "link":
            src.unlink()
            src.symlink_to(outside / src.name)
            return f"pointer {src.name} is a link outside"
        entry["file"] = f"../{'../' if kind == 'sim' else ''}outside/{src.name}" if choice == "dotdot" \
            else str(outside / src.name)
        from agentsim.io.checkpoint import manifest_checksum

        m["checksum"] = manifest_checksum(m)
        path.write_text(json.dumps(m))
        return f"pointer manifest file -> {entry['file']}"
    f = rng.choice(files)
    if rng.random() < 0.5:
        f.write_bytes(f.read_bytes())
        return f"noop rewrite {f.name}"
    (f.parent / "notes.txt").write_text("unrelated\n")
    return "noop extra file"


# --------------------------------------------------------------------------- trials
def trial(k: int, root: Path, base: dict[str, Any], rng: random.Random, use_subprocess: bool) -> dict[str, Any]:
    kind = rng.choice(["sim", "train"])
    work = root / f"t{k}"
    work.mkdir()
    ck = work / "ck"
    shutil.copytree(base[kind], ck, symlinks=True)
    marker = work / "MARKER"
    what = corrupt(ck, kind, work, marker, rng)
    if kind == "sim":
        argv = [*SIM_RUN, "--steps", "4", "--resume", str(ck), "--out", str(work / "resumed.h5")]
    else:
        argv = [*TRAIN, "--checkpoint-dir", str(ck), "--resume"]
    t0 = time.perf_counter()
    code, err = agentsim(argv, use_subprocess)
    row: dict[str, Any] = {"trial": k, "kind": kind, "corruption": what, "code": code,
                           "seconds": round(time.perf_counter() - t0, 3)}
    error_line = next((s for s in err.splitlines() if s.startswith("agentsim: error:")), "")
    row["message"] = error_line[:300]
    if marker.exists():
        row["outcome"] = "PAYLOAD RAN"
    elif "Traceback" in err:
        row["outcome"] = "traceback"
        row["stderr"] = err[-2000:]
    elif code != 0:
        row["outcome"] = "refused" if error_line else "no error line"
        if not error_line:
            row["stderr"] = err[-2000:]
    else:
        row["outcome"] = "same result" if same_result(kind, work, base) else "DIFFERENT RESULT"
    shutil.rmtree(work, ignore_errors=True)
    return row


def _shape(message: str) -> str:
    """A refusal without its paths and numbers, to count the kinds of messages."""
    import re

    return re.sub(r"'[^']*'|\S*/\S*|\d+", "_", message)[:160]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=50)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--seconds", type=float, default=None, help="stop starting trials after this many seconds")
    ap.add_argument("--subprocess", action="store_true", help="run `python -m agentsim` for each resume")
    ap.add_argument("--out", default="untrusted_files.json")
    ap.add_argument("--rows", action="store_true", help="write every trial's row to --out (else the failures)")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    rows = []
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="agentsim-untrusted-") as tmp:
        root = Path(tmp)
        base = baselines(root, args.subprocess)
        for k in range(args.trials):
            if args.seconds is not None and time.monotonic() - t0 > args.seconds:
                break
            row = trial(k, root, base, rng, args.subprocess)
            rows.append(row)
            if row["outcome"] not in ("refused", "same result"):
                print(f"trial {k}: {row['outcome']}: {row['kind']} {row['corruption']}", file=sys.stderr)
    outcomes = Counter(r["outcome"] for r in rows)
    by_kind = Counter(f"{r['kind']} {r['corruption'].split()[0]} -> {r['outcome']}" for r in rows)
    bad = [r for r in rows if r["outcome"] not in ("refused", "same result")]
    summary = {"trials": len(rows), "seed": args.seed, "subprocess": args.subprocess,
               "seconds": round(time.monotonic() - t0, 1), "outcomes": dict(outcomes),
               "by_corruption": dict(sorted(by_kind.items())), "payload_ran": outcomes.get("PAYLOAD RAN", 0),
               "messages": dict(Counter(_shape(r["message"]) for r in rows if r["message"]).most_common()),
               "failures": bad, **({"rows": rows} if args.rows else {})}
    Path(args.out).write_text(json.dumps(summary, indent=1) + "\n")
    print(f"{len(rows)} trials in {summary['seconds']} s: " + ", ".join(f"{k} {v}" for k, v in outcomes.items()))
    for key, n in sorted(by_kind.items()):
        print(f"  {key}: {n}")
    print(f"payloads that ran: {summary['payload_ran']}; wrote {args.out}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
