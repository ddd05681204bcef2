"""Checkpoints of a run: per-rank shards of the agents by uid and a manifest committed last.

A checkpoint of step ``k`` is a directory ``DIR/step-0000000k/`` holding

- ``rank-R-of-W.pt``: rank R's agents (every field of every population, ``torch.save`` of
  CPU tensors), one file per rank of the run that saved it;
- ``env.pt``: the environment, whole (written by rank 0 after the spatial partitioner made
  per-cell layers whole), and each population's ``next_uid`` again (``NEXT_UID_KEY``);
- ``manifest.json``, written last: the format, the agentsim version, the model's name and
  fingerprint (its populations' fields with dtypes and shapes, and its substeps), the
  parameters, the seed, the step, each population's ``next_uid``, each file with its
  SHA-256 and row counts, ``run``: what else defines the run that saved it (the number of
  agents at step 0, the substeps' order, ``sync_every``, and, if it wrote a trajectory file,
  that file's ``record`` and ``every``), and ``checksum``: the SHA-256 of the manifest's other
  fields as canonical JSON (:func:`manifest_checksum`: keys sorted, no spaces), so that an
  edited manifest (a changed step, say) is refused like a changed shard. A resume that differs
  in anything of ``run`` (or in model, parameters or seed) is refused with a message listing each
  difference; the number of processes and the partitioner may change. A manifest without
  ``run`` (an older agentsim) is refused too: the resume could not be checked.

Every file is written to a temporary name, flushed, ``fsync``-ed and renamed into place
(:func:`atomic_write`), and the manifest only after every shard is in place: a checkpoint
whose manifest is missing was not finished and is never used; one whose files do not match
their checksums is refused with a message naming the file.

Reading a checkpoint never executes code, wherever it came from: the manifest is JSON, checked
key by key; every file it names must be a plain name inside the checkpoint's directory; shards
are loaded with ``torch.load(..., weights_only=True)`` (tensors and plain data only), and a file
that asks for anything else (a pickle with a ``__reduce__`` payload, say) is refused with a
:class:`CheckpointError` before anything in it runs. The checksums catch corruption and edits,
not a forger who recomputes them (there is no secret key); what the manifest says is also checked
against the files (the step against the directory's name, row counts and next uids against the
shards), so a forged checkpoint can hold other agents, but never runs code.

Resuming reads every shard on every rank, puts the agents in uid order, and lets the
partitioner place them as it places an initial state: a checkpoint saved on W ranks resumes
on any number of ranks, with either partitioner. The run then continues the same trajectory
bit for bit, because nothing in a step depends on which rank holds an agent or on row order
(random draws are keyed by seed, uid and step; sums are exact).

Writing can overlap the next steps (:func:`start_checkpoint`, ``asynchronous=True``): the
state is copied to CPU first, on the calling thread, then a background thread on each rank
serializes, hashes and writes its shard, and publishes the shard's checksum and row counts in a
small side file ``rank-R-of-W.json``; rank 0's thread waits for every rank's side file (or a
``.failed`` one), then commits the manifest and prunes. No collective runs off the main thread.
:meth:`CheckpointWrite.wait` (every rank together) ends a write and raises its errors on every
rank; at most one write is in flight per simulation.

``agentsim run --checkpoint-every K --resume DIR --max-restarts N`` and
:meth:`Simulation.run <agentsim.engine.simulation.Simulation.run>` (``checkpoint_every``, ``append``) use
them to continue a run and its trajectory file after an interruption.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import pickle
import re
import shutil
import threading
import time
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from agentsim.core.comm import Comm
from agentsim.core.state import UID, Population, State
from agentsim.errors import ConfigError, FieldAccessError, OutputError, write_cause
from agentsim.io.faults import write_fault

if TYPE_CHECKING:
    from agentsim.core.model import Model

__all__ = ["FORMAT", "Checkpoint", "CheckpointError", "CheckpointWrite", "agree_checkpoint", "atomic_write",
           "check_keep", "checkpoint_step", "file_differences", "file_inside", "file_record", "latest_checkpoint",
           "load_tensors", "manifest_checksum", "mismatch_message", "read_checkpoint", "read_manifest", "read_verified",
           "resolve_checkpoint", "run_differences", "run_record", "start_checkpoint", "tensor_bytes"]

#: 2: the manifest carries ``checksum`` (format 1 manifests had none and are refused).
FORMAT = 2
MANIFEST = "manifest.json"
#: Seconds rank 0's writer waits for the other ranks' shards before giving the checkpoint up.
SHARD_WAIT_SECONDS = 600.0
_STEP_DIR = re.compile(r"^step-(\d{8,})$")


class CheckpointError(ConfigError):
    """A checkpoint that cannot be used: missing, unfinished, corrupt, or from another run."""


def atomic_write(path: str | os.PathLike[str], data: bytes) -> str:
    """Write ``data`` to ``path`` atomically: a temporary file in the same directory, flushed
    and fsync-ed, renamed over ``path``, then the directory fsync-ed. A reader sees the old
    file or the new one, never a part. Returns the SHA-256 (hex) of ``data``.

    Raises:
        OutputError: The file cannot be written (the temporary file is removed).
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        fault = write_fault(path, shared=True)  # a test hook; None in normal runs
        if fault is not None:
            fault.check(str(path))
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        _fsync_dir(path.parent)
    except OSError as e:
        raise OutputError(f"cannot write checkpoint file '{path}': {write_cause(e)}") from e
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
    return hashlib.sha256(data).hexdigest()


def check_keep(keep: object, name: str = "keep") -> int | None:
    """Validate how many checkpoints to keep (None: all, or an int >= 1); ``name`` for the message."""
    if keep is not None and (isinstance(keep, bool) or not isinstance(keep, int) or keep < 1):
        raise ConfigError(f"{name}: expected an int >= 1 (got {keep!r})")
    return keep


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def tensor_bytes(obj: Any) -> bytes:
    """``torch.save`` of ``obj`` as bytes; ``obj`` must be tensors and plain data (dicts, lists,
    tuples, strings, numbers, bools, None), what :func:`load_tensors` reads back.
    """
    _check_plain(obj, "")
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def _check_plain(obj: Any, where: str) -> None:
    if obj is None or isinstance(obj, (bool, int, float, str, Tensor)):
        return
    if isinstance(obj, dict):
        for k, v in obj.items():
            if not isinstance(k, (str, int)):
                raise TypeError(f"checkpoint data{where}: key {k!r} is not a str or int")
            _check_plain(v, f"{where}[{k!r}]")
        return
    if isinstance(obj, (list, tuple)) and type(obj) in (list, tuple):  # not a namedtuple
        for i, v in enumerate(obj):
            _check_plain(v, f"{where}[{i}]")
        return
    raise TypeError(f"checkpoint data{where}: {type(obj).__name__} is not a tensor or plain data "
                    "(convert it to dicts, lists and numbers)")


def load_tensors(data: bytes, where: str) -> Any:
    """``torch.load`` of ``data`` with ``weights_only=True``: tensors and plain data only, never
    code. ``where`` names the file in the messages.

    Raises:
        CheckpointError: The file holds anything else (nothing in it has run), or is not a
            ``torch.save`` file.
    """
    try:
        with warnings.catch_warnings():  # torch warns about a foreign pickle protocol: the refusal says more
            warnings.simplefilter("ignore", UserWarning)
            return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        raise CheckpointError(f"{where} holds objects other than tensors and plain data: refused, nothing in it "
                              "was run (agentsim checkpoints never execute code)") from None
    except Exception as e:  # a damaged or foreign file: whatever torch's reader raises
        detail = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CheckpointError(f"{where} cannot be read as a checkpoint file ({detail[:200]})") from None


def manifest_checksum(manifest: Mapping[str, Any]) -> str:
    """SHA-256 (hex) of ``manifest``'s fields other than ``checksum`` as canonical JSON (keys
    sorted, separators without spaces, ASCII): the ``checksum`` a manifest carries.
    """
    body = {k: v for k, v in manifest.items() if k != "checksum"}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def file_inside(directory: Path, name: object, what: str) -> Path:
    """The file ``name`` (from a manifest or a pointer file, ``what``) in ``directory``, refused
    unless it is a plain name that stays inside: no absolute path, no ``..``, no separator, no
    symbolic link to somewhere else.
    """
    if (not isinstance(name, str) or name in ("", ".", "..") or "/" in name or "\\" in name or "\0" in name
            or os.path.isabs(name)):
        raise CheckpointError(f"{what} names {name!r}, not a file in {directory}: a checkpoint may only name "
                              "files in its own directory")
    path = directory / name
    if os.path.dirname(os.path.realpath(path)) != os.path.realpath(directory):
        raise CheckpointError(f"{what} names {name!r}, a link that leaves {directory}: a checkpoint may only name "
                              "files in its own directory")
    return path


def model_fingerprint(model: Model, state: State) -> str:
    """SHA-256 (first 16 hex digits) of what a checkpoint's agents must fit: every population's
    fields (dtype, shape), the env tensors' names, and the substeps' names.
    """
    parts = [model.name]
    for name in sorted(state.populations):
        pop = state.populations[name]
        parts += [f"{name}.{k}:{s.dtype}:{tuple(s.shape)}" for k, s in sorted(pop.specs.items())]
    parts += [f"env.{k}" for k in sorted(state.env)]
    parts += [f"substep.{s.name}" for s in model.substeps]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def json_params(params: Mapping[str, Any]) -> dict[str, Any]:
    """Parameters as JSON values (0-dim tensors as numbers; anything else as its repr)."""
    out: dict[str, Any] = {}
    for k, v in params.items():
        if isinstance(v, Tensor) and v.dim() == 0:
            v = v.item()
        out[k] = v if isinstance(v, (bool, int, float, str)) or v is None else repr(v)
    return out


def step_dir(directory: str | os.PathLike[str], step: int) -> Path:
    """The directory of the checkpoint of ``step`` under ``directory``."""
    return Path(directory) / f"step-{step:08d}"


def start_checkpoint(directory: str | os.PathLike[str], state: State, comm: Comm, run: Mapping[str, Any],
                     keep: int | None = None, asynchronous: bool = False) -> CheckpointWrite:
    """Begin saving ``state`` (this rank's rows, settled: after its last step) under ``directory``
    (a collective: every rank calls it). ``run``: what the manifest records of the run besides the
    state (model, fingerprint, params, seed, partition, run and file settings; rank 0's is written).

    The state is copied to CPU before this returns; with ``asynchronous`` the files are written
    by a background thread while the caller goes on (call :meth:`CheckpointWrite.wait`, every
    rank together, before the next checkpoint and at the end), else before this returns.
    """
    check_keep(keep)
    path = step_dir(directory, state.step)
    if comm.rank == 0:
        try:
            fault = write_fault(path, shared=True)  # a test hook; None in normal runs
            if fault is not None:
                fault.check(str(path))
            if path.exists():  # an unfinished (or superseded) earlier attempt at this step: its side files are stale
                shutil.rmtree(path)
            path.mkdir(parents=True)
        except OSError as e:  # read-only or full disk, not a directory, ...: the run stops (rank 0's error)
            raise OutputError(f"cannot create checkpoint directory '{path}': {write_cause(e)}") from e
    _barrier(comm)  # the directory exists for everyone
    shard = {name: {k: v.detach().to("cpu", copy=True) for k, v in pop.fields().items()}
             for name, pop in state.populations.items()}
    rows = {name: pop.n for name, pop in state.populations.items()}
    manifest = env = None
    if comm.rank == 0:
        env = {k: v.detach().to("cpu", copy=True) for k, v in state.env.items()}
        env.update({f"{NEXT_UID_KEY}{k}": torch.tensor(int(p.next_uid)) for k, p in state.populations.items()})
        manifest = {
            "format": FORMAT, "agentsim": _version(), **run, "step": state.step, "world_size": comm.world_size,
            "next_uid": {k: int(p.next_uid) for k, p in state.populations.items()},
        }
    write = CheckpointWrite(path, comm)
    job = _ShardJob(path, comm.rank, comm.world_size, shard, rows, env, manifest, keep, write.cancelled)
    if asynchronous:
        write.thread = threading.Thread(target=job.run, name=f"agentsim-checkpoint-{state.step}", daemon=True)
        write.thread.start()
        write.job = job
    else:
        job.run()
        write.job = job
        write.wait()
    return write


#: The key in ``env.pt`` of each population's ``next_uid`` (a second record of the manifest's,
#: which a manifest edited with its checksum recomputed then contradicts); no env layer's name
#: holds a colon.
NEXT_UID_KEY = "agentsim:next_uid:"


def _shard_name(rank: int, world_size: int) -> str:
    return f"rank-{rank:05d}-of-{world_size:05d}"


class _ShardJob:
    """What one rank writes for a checkpoint (on the caller's thread or a background one): its
    shard, then its side file; rank 0 also the env, then, once every rank's side file is there,
    the manifest. Records the first error in ``error`` instead of raising.
    """

    def __init__(self, path: Path, rank: int, world_size: int, shard: dict[str, dict[str, Tensor]],
                 rows: dict[str, int], env: dict[str, Tensor] | None, manifest: dict[str, Any] | None,
                 keep: int | None, cancelled: threading.Event) -> None:
        self.path, self.rank, self.world_size = path, rank, world_size
        self.shard, self.rows, self.env, self.manifest, self.keep = shard, rows, env, manifest, keep
        self.cancelled = cancelled
        self.error: str | None = None

    def run(self) -> None:
        name = _shard_name(self.rank, self.world_size)
        try:
            digest = atomic_write(self.path / f"{name}.pt", tensor_bytes(self.shard))
            self.shard = {}  # the copy is on disk: let it go
            atomic_write(self.path / f"{name}.json", json.dumps({"sha256": digest, "rows": self.rows}).encode())
            if self.manifest is not None:
                self._commit()
        except _OtherRankFailed:
            pass  # no manifest; that rank reports its error, wait() names it on every rank
        except Exception as e:  # reported by CheckpointWrite.wait on every rank
            self.error = f"{type(e).__name__}: {e}"
            if not (self.path / f"{name}.failed").exists():
                try:
                    (self.path / f"{name}.failed").write_text(self.error)
                except OSError:
                    pass  # the error is still raised by wait() on this rank

    def _commit(self) -> None:
        """Rank 0: the env, then (every shard written) the manifest, then pruning."""
        assert self.manifest is not None and self.env is not None
        env_digest = atomic_write(self.path / "env.pt", tensor_bytes(self.env))
        shards = []
        deadline = time.monotonic() + SHARD_WAIT_SECONDS
        for r in range(self.world_size):
            name = _shard_name(r, self.world_size)
            side = self.path / f"{name}.json"
            while not side.exists():
                if (self.path / f"{name}.failed").exists():
                    raise _OtherRankFailed
                if self.cancelled.is_set():
                    raise OutputError("cancelled (the run stopped)")
                if time.monotonic() > deadline:
                    raise OutputError(f"rank {r} did not write its shard within {SHARD_WAIT_SECONDS:.0f} s")
                time.sleep(0.002)
            info = json.loads(side.read_text())
            shards.append({"file": f"{name}.pt", "sha256": info["sha256"], "rows": info["rows"]})
        manifest = {**self.manifest, "shards": shards, "env": {"file": "env.pt", "sha256": env_digest}}
        manifest["checksum"] = manifest_checksum(manifest)
        atomic_write(self.path / MANIFEST, (json.dumps(manifest, indent=1) + "\n").encode())
        for r in range(self.world_size):
            (self.path / f"{_shard_name(r, self.world_size)}.json").unlink(missing_ok=True)
        if self.keep is not None:
            _prune(self.path.parent, self.keep, manifest.get("run_id"))


class _OtherRankFailed(Exception):
    """Rank 0 gives a checkpoint up because another rank could not write its shard."""


class CheckpointWrite:
    """A checkpoint being written (see :func:`start_checkpoint`).

    Attributes:
        path: The checkpoint's directory (complete once :meth:`wait` returns).
    """

    def __init__(self, path: Path, comm: Comm) -> None:
        self.path, self.comm = path, comm
        self.thread: threading.Thread | None = None
        self.job: _ShardJob | None = None
        self.cancelled = threading.Event()
        self._waited = False

    def done(self) -> bool:
        """Whether this rank's part of the write has ended (rank 0: the manifest is committed)."""
        return self.thread is None or not self.thread.is_alive()

    def wait(self) -> Path:
        """End the write (every rank together): wait for this rank's files, then raise an
        :class:`~agentsim.errors.OutputError` on every rank if any rank failed. Returns the path.
        """
        if self.thread is not None:
            self.thread.join()
        if self._waited:
            return self.path
        self._waited = True
        error = self.job.error if self.job is not None else None
        failed = [r for r, f in enumerate(_gather_flags(self.comm, error is not None)) if f]
        if failed:
            if error is None:  # another rank failed: its side file says why
                for r in failed:
                    with contextlib.suppress(OSError):
                        error = (self.path / f"{_shard_name(r, self.comm.world_size)}.failed").read_text()
                        break
            detail = f": {error}" if error is not None else ""
            raise OutputError(f"checkpoint {self.path} was not written (rank{'s' * (len(failed) > 1)} "
                              f"{', '.join(map(str, failed))} failed){detail}")
        return self.path

    def cancel(self) -> None:
        """Give the write up without a collective (on an error path): rank 0 commits no manifest
        unless it already has; this rank's thread is joined.
        """
        self.cancelled.set()
        if self.thread is not None:
            self.thread.join()
        self._waited = True


def _gather_flags(comm: Comm, flag: bool) -> list[bool]:
    """Every rank's ``flag`` (a collective)."""
    if comm.world_size == 1:
        return [flag]
    got = comm.all_gather_rows({"f": torch.tensor([[int(flag)]], dtype=torch.uint8)}, rows_per_rank=1)
    return [bool(v) for v in got["f"][:, 0].tolist()]


def _version() -> str:
    from agentsim._version import __version__

    return __version__


def _barrier(comm: Comm) -> None:
    if comm.world_size > 1:
        comm.all_gather_rows({"b": torch.zeros(1, 1, dtype=torch.uint8)}, rows_per_rank=1)


def _steps(directory: Path) -> list[tuple[int, Path]]:
    if not directory.is_dir():
        return []
    out = [(int(m.group(1)), p) for p in directory.iterdir() if (m := _STEP_DIR.match(p.name)) and p.is_dir()]
    return sorted(out)


def _run_id(path: Path) -> str | None:
    """The ``run_id`` of the checkpoint at ``path`` (None: unreadable, or written before runs had ids)."""
    try:
        run_id = json.loads((path / MANIFEST).read_text()).get("run_id")
    except (OSError, ValueError, AttributeError):
        return None
    return run_id if isinstance(run_id, str) else None


def _prune(directory: Path, keep: int, run_id: str | None = None) -> None:
    """Keep the newest ``keep`` complete checkpoints of the run ``run_id`` under ``directory``;
    remove its older ones and the unfinished checkpoints older than its newest. Another run's
    checkpoints (another ``run_id``, or none) are never touched: a directory may be shared.
    """
    entries = _steps(directory)
    complete = [(s, p) for s, p in entries if (p / MANIFEST).is_file() and (run_id is None or _run_id(p) == run_id)]
    if not complete:
        return
    kept = {p for _, p in complete[-keep:]}
    newest = complete[-1][0]
    ours = {p for _, p in complete}
    for s, p in entries:
        if p not in kept and (p in ours or (s < newest and not (p / MANIFEST).is_file())):
            shutil.rmtree(p, ignore_errors=True)


def checkpoint_step(path: str | os.PathLike[str]) -> int:
    """The step of the checkpoint :func:`read_checkpoint` would read at ``path`` (its manifest only)."""
    return int(_manifest(_resolve(Path(path)))[1]["step"])


def latest_checkpoint(directory: str | os.PathLike[str]) -> Path | None:
    """The newest checkpoint under ``directory`` whose manifest was committed (None if none)."""
    complete = [p for _, p in _steps(Path(directory)) if (p / MANIFEST).is_file()]
    return complete[-1] if complete else None


class Checkpoint:
    """A checkpoint read back: the manifest and the whole state in uid order.

    Attributes:
        path: The checkpoint's directory.
        manifest: The manifest (see the module docstring).
        step: The step it was saved after.
    """

    def __init__(self, path: Path, manifest: dict[str, Any], fields: dict[str, dict[str, Tensor]],
                 env: dict[str, Tensor]) -> None:
        self.path, self.manifest = path, manifest
        self.step = int(manifest["step"])
        self._fields, self._env = fields, env

    def check_run(self, model: Model, state: State, params: Mapping[str, Any], seed: int,
                  agents: int | None = None, sync_every: int = 1) -> None:
        """Raise a :class:`CheckpointError` unless the checkpoint was saved by this run: this model,
        fields and substeps, parameters, seed, number of agents and ``sync_every`` (not the number
        of processes or the partitioner, which may change). The message lists every difference.
        """
        m = self.manifest
        if m["model"] != model.name:
            raise CheckpointError(f"checkpoint {self.path} is of model '{m['model']}', not '{model.name}'")
        diffs = run_differences(self.path, m, model, params, seed, agents, sync_every)
        if m["fingerprint"] != model_fingerprint(model, state) and not any(d.startswith("substeps") for d in diffs):
            diffs.append(f"model '{model.name}' as it was then (its fields, env or substeps have changed since)")
        if diffs:
            raise CheckpointError(mismatch_message(self.path, diffs))

    def state(self, like: State) -> State:
        """The saved state, global and in uid order, in populations with ``like``'s field specs."""
        pops = {}
        for name, pop in like.populations.items():
            fields = self._fields.get(name)
            if fields is None:
                raise CheckpointError(f"checkpoint {self.path} has no population '{name}'")
            if set(fields) != set(pop.specs):
                raise CheckpointError(f"checkpoint {self.path}: population '{name}' has fields {sorted(fields)}, "
                                      f"the model {sorted(pop.specs)}")
            order = torch.argsort(fields[UID], stable=True)
            device = pop[UID].device
            try:
                pops[name] = Population(name, pop.specs, {k: v.index_select(0, order).to(device)
                                                          for k, v in fields.items()},
                                        next_uid=int(self.manifest["next_uid"][name]))
            except (ConfigError, FieldAccessError) as e:
                raise CheckpointError(f"checkpoint {self.path}: {e}") from None
        missing = sorted(set(like.env) - set(self._env))
        if missing:
            raise CheckpointError(f"checkpoint {self.path}: env.pt has no {', '.join(map(repr, missing))}")
        env = {k: self._env[k].to(v.device) for k, v in like.env.items()}
        return State(pops, env, self.step)


#: What a resume must give as the run that saved the checkpoint did (``--agents``, ``--seed`` ...).
_HINT = ("a resume continues the run that saved the checkpoint: give the same model, --agents, --seed, --set, "
         "--sync-every, --record and --every, or start a new run without --resume")


def mismatch_message(path: str | os.PathLike[str], diffs: list[str]) -> str:
    """The refusal of a resume whose run differs from the checkpoint's (``diffs``: "what saved, not now")."""
    return f"checkpoint {os.fspath(path)} was saved with {'; '.join(diffs)} ({_HINT})"


def run_record(model: Model, agents: int, sync_every: int) -> dict[str, Any]:
    """What defines a run beyond model, parameters and seed (the manifest's ``run``): the number of
    agents at step 0, the substeps' order and ``sync_every``; the trajectory file's ``record`` and
    ``every`` are added by a run that writes one (``file``).
    """
    return {"agents": int(agents), "substeps": [s.name for s in model.substeps], "sync_every": int(sync_every),
            "file": None}


def file_record(record: Any, every: int | None) -> dict[str, Any]:
    """A run's trajectory settings as the manifest's ``run.file`` holds them."""
    return {"record": None if record is None else sorted(str(r) for r in record),
            "every": None if every is None else int(every)}


def run_differences(path: str | os.PathLike[str], manifest: Mapping[str, Any], model: Model,
                    params: Mapping[str, Any], seed: int, agents: int | None, sync_every: int) -> list[str]:
    """How this run differs from the one that saved the checkpoint (``"X saved, not Y"`` items; empty
    if it is the same run). Model names must already agree.

    Raises:
        CheckpointError: The manifest is of an older agentsim and does not record the run
            (its agents, substeps, sync_every): the resume cannot be checked.
    """
    run = manifest.get("run")
    if not isinstance(run, dict) or not {"agents", "substeps", "sync_every"} <= set(run):
        raise CheckpointError(f"checkpoint {os.fspath(path)} is of an older format: its manifest does not record "
                              "the run that saved it (agents, substeps, sync_every), so this resume cannot be "
                              "checked to continue the same run; start the run again to get resumable checkpoints")
    diffs = []
    if int(manifest["seed"]) != seed:
        diffs.append(f"seed {manifest['seed']}, not {seed}")
    mine, saved = json_params(params), manifest["params"]
    keys = sorted(k for k in set(mine) | set(saved) if mine.get(k) != saved.get(k))
    if keys:
        diffs.append("other parameters (" + ", ".join(f"{k}: saved {saved.get(k)!r}, now {mine.get(k)!r}"
                                                       for k in keys) + ")")
    if agents is not None and int(run["agents"]) != int(agents):
        diffs.append(f"agents {run['agents']}, not {agents}")
    substeps = [s.name for s in model.substeps]
    if list(run["substeps"]) != substeps:
        diffs.append(f"substeps {', '.join(run['substeps'])}, not {', '.join(substeps)}")
    if int(run["sync_every"]) != int(sync_every):
        diffs.append(f"sync_every {run['sync_every']}, not {sync_every}")
    return diffs


def file_differences(manifest: Mapping[str, Any], record: Any, every: int | None) -> list[str]:
    """How a resumed run's trajectory settings differ from those of the run that saved the checkpoint
    (only when that run wrote a file; a resumed run that continues the file must write it the same way).
    """
    saved = (manifest.get("run") or {}).get("file")
    if not isinstance(saved, dict):
        return []
    now = file_record(record, every)
    diffs = []
    if saved.get("record") != now["record"]:
        shown = ", ".join(saved["record"]) if saved.get("record") else "every field"
        diffs.append(f"record {shown}, not {', '.join(now['record']) if now['record'] else 'every field'}")
    if saved.get("every") != now["every"]:
        diffs.append(f"every {saved.get('every') or 'unset'}, not {now['every'] or 'unset'}")
    return diffs


def resolve_checkpoint(path: str | os.PathLike[str]) -> Path:
    """The one checkpoint ``path`` names now: ``path`` itself if it is a checkpoint, else the newest
    complete checkpoint in it. A run decides this once, before its processes start, and every rank
    loads exactly that checkpoint (one committed later is not used).

    Raises:
        CheckpointError: No checkpoint there.
    """
    return _resolve(Path(path))


def agree_checkpoint(path: str | os.PathLike[str], comm: Comm) -> Path:
    """:func:`resolve_checkpoint` on every rank of ``comm`` (a collective), rank 0's choice for all:
    a directory of checkpoints in which a newer one is committed while the ranks look gives the
    same checkpoint on every rank. A rank that finds none raises its error; the others say which
    rank failed.
    """
    error: CheckpointError | None = None
    found = Path(path)
    try:
        found = resolve_checkpoint(path)
        step = checkpoint_step(found)
    except CheckpointError as e:
        error, step = e, -1
    if comm.world_size == 1:
        if error is not None:
            raise error
        return found
    got = comm.all_gather_rows({"s": torch.tensor([[step]], dtype=torch.int64)}, rows_per_rank=1)["s"][:, 0].tolist()
    if error is not None:
        raise error
    failed = [r for r, s in enumerate(got) if s < 0]
    if failed:
        raise CheckpointError(f"checkpoint {os.fspath(path)}: rank{'s' * (len(failed) > 1)} "
                              f"{', '.join(map(str, failed))} cannot read it (see that rank's error)")
    if got[0] != step:
        if found == Path(path):
            raise CheckpointError(f"checkpoint {found}: rank 0 read step {got[0]}, rank {comm.rank} step {step} "
                                  "(the checkpoint changed while the ranks read it)")
        found = step_dir(path, got[0])
    return found


def read_manifest(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The manifest of the checkpoint ``path`` (a checkpoint directory), checked to be one this version reads."""
    return _manifest(_resolve(Path(path)))[1]


def read_checkpoint(path: str | os.PathLike[str]) -> Checkpoint:
    """Read and verify a checkpoint: ``path`` is a checkpoint directory, or a directory of
    checkpoints (the newest complete one is read).
    """
    path, manifest = _manifest(_resolve(Path(path)))
    world = manifest["world_size"]
    want = [f"{_shard_name(r, world)}.pt" for r in range(world)] if 1 <= world <= 1 << 16 else None
    if [entry["file"] for entry in manifest["shards"]] != want:
        listed = [str(entry["file"])[:60] for entry in manifest["shards"][:8]]
        raise CheckpointError(f"checkpoint {path}: {MANIFEST} lists the shards {listed}"
                              f"{' ...' if len(manifest['shards']) > 8 else ''}, not one shard of each of its "
                              f"{world} processes in rank order")
    shards = [_load(path, entry) for entry in manifest["shards"]]
    for entry, shard in zip(manifest["shards"], shards, strict=True):
        rows = {name: _rows(t) for name, t in shard.items()}
        if rows != entry["rows"]:
            raise CheckpointError(f"checkpoint {path}: {entry['file']} holds rows {rows}, its manifest says "
                                  f"{entry['rows']}")
    fields: dict[str, dict[str, Tensor]] = {}
    for name in manifest["next_uid"]:
        parts = [s.get(name) for s in shards]
        if not parts or any(not isinstance(p, dict) or not p for p in parts) or any(
                set(p) != set(parts[0]) for p in parts):
            raise CheckpointError(f"checkpoint {path}: the shards do not all hold population '{name}' with the same "
                                  "fields")
        try:
            fields[name] = {k: torch.cat([p[k] for p in parts]) for k in parts[0]}
        except RuntimeError as e:
            raise CheckpointError(f"checkpoint {path}: population '{name}' does not fit together across the shards "
                                  f"({str(e).splitlines()[0]})") from None
        uids = fields[name].get(UID)
        if uids is not None and uids.numel() and int(uids.max()) >= manifest["next_uid"][name]:
            raise CheckpointError(f"checkpoint {path}: {MANIFEST}: 'next_uid.{name}' is {manifest['next_uid'][name]}, "
                                  f"not above the largest uid {int(uids.max())}")
        repeated = uids.numel() - torch.unique(uids).numel() if uids is not None and uids.dim() == 1 else 0
        if repeated:
            raise CheckpointError(f"checkpoint {path}: population '{name}' holds {repeated} repeated uids (a shard "
                                  "listed or written twice?)")
    env = _load(path, manifest["env"], shard=False)
    for name, n in manifest["next_uid"].items():  # (checkpoints before 0.4 record it in the manifest only)
        saved = env.pop(f"{NEXT_UID_KEY}{name}", None)
        if saved is not None and (saved.numel() != 1 or int(saved) != n):
            raise CheckpointError(f"checkpoint {path}: {MANIFEST}: 'next_uid.{name}' is {n}, but env.pt (the "
                                  f"file its sha256 names) records {saved.flatten()[:4].tolist()}: the manifest "
                                  "was edited after the checkpoint was written")
    return Checkpoint(path, manifest, fields, env)


def _rows(fields: Mapping[str, Tensor]) -> int:
    """The row count of a population's fields (-1 if they disagree or one is a scalar)."""
    counts = {int(v.shape[0]) if v.dim() else -1 for v in fields.values()}
    return counts.pop() if len(counts) == 1 else (0 if not counts else -1)


def _resolve(path: Path) -> Path:
    """A checkpoint directory: ``path`` itself, or the newest complete checkpoint in it."""
    if not path.exists():
        raise CheckpointError(f"no checkpoint at {path} (no such file or directory)")
    if (path / MANIFEST).is_file():
        return path
    newest = latest_checkpoint(path)
    if newest is None:
        unfinished = _steps(path)
        raise CheckpointError(f"no complete checkpoint in {path}" + (
            f" ({len(unfinished)} unfinished: no {MANIFEST})" if unfinished else
            " (expected step-NNNNNNNN directories with a manifest.json)"))
    file_inside(path, newest.name, f"{path}: the newest checkpoint")  # not a link to elsewhere
    return newest


_SCHEMA: dict[str, type | tuple[type, ...]] = {
    "format": int, "agentsim": str, "model": str, "fingerprint": str, "params": dict, "seed": int, "step": int,
    "world_size": int, "partition": str, "next_uid": dict, "shards": list, "env": dict, "checksum": str}


def _manifest(path: Path) -> tuple[Path, dict[str, Any]]:
    """The checkpoint's manifest, checked to be one this version reads, unchanged (its checksum)
    and of the expected shape (every key, with its type).
    """
    try:
        manifest = json.loads((path / MANIFEST).read_text())
    except (OSError, ValueError) as e:
        raise CheckpointError(f"checkpoint {path}: unreadable {MANIFEST} ({e})") from None
    if not isinstance(manifest, dict) or "format" not in manifest:
        raise CheckpointError(f"checkpoint {path}: {MANIFEST} is not an agentsim checkpoint manifest")
    fmt = manifest["format"]
    if not isinstance(fmt, int) or isinstance(fmt, bool) or fmt > FORMAT:
        raise CheckpointError(f"checkpoint {path} has format {fmt!r}; this agentsim ({_version()}) "
                              f"reads formats up to {FORMAT}: upgrade agentsim")
    if fmt < FORMAT:
        raise CheckpointError(f"checkpoint {path} has format {fmt}, older than this agentsim's {FORMAT} (its "
                              f"{MANIFEST} carries no checksum): start the run again, or resume it with the agentsim "
                              "that wrote it")
    where = f"checkpoint {path}: {MANIFEST}"
    for key, kind in _SCHEMA.items():
        if key not in manifest:
            raise CheckpointError(f"{where} has no key '{key}'")
        if not isinstance(manifest[key], kind) or isinstance(manifest[key], bool):
            raise CheckpointError(f"{where}: '{key}' is a {type(manifest[key]).__name__}, expected a "
                                  f"{getattr(kind, '__name__', 'value')}")
    if manifest["checksum"] != manifest_checksum(manifest):
        raise CheckpointError(f"{where} does not match its checksum (edited or corrupt after the checkpoint was "
                              "written)")
    if manifest["step"] < 0:
        raise CheckpointError(f"checkpoint {path}: {MANIFEST}: 'step' is {manifest['step']}, expected >= 0")
    named = _STEP_DIR.match(path.name)
    if named and int(named.group(1)) != manifest["step"]:
        raise CheckpointError(f"checkpoint {path}: {MANIFEST} says step {manifest['step']}, its directory step "
                              f"{int(named.group(1))}")
    for name, n in manifest["next_uid"].items():
        if not isinstance(n, int) or isinstance(n, bool) or n < 0:
            raise CheckpointError(f"checkpoint {path}: {MANIFEST}: 'next_uid.{name}' is {n!r}, expected an int >= 0")
    if not manifest["shards"]:
        raise CheckpointError(f"checkpoint {path}: {MANIFEST}: 'shards' is empty")
    for i, entry in enumerate([*manifest["shards"], manifest["env"]]):
        key = f"shards[{i}]" if i < len(manifest["shards"]) else "env"
        if not isinstance(entry, dict):
            raise CheckpointError(f"checkpoint {path}: {MANIFEST}: '{key}' is a {type(entry).__name__}, "
                                  "expected an object")
        for sub in ("file", "sha256"):
            if not isinstance(entry.get(sub), str):
                raise CheckpointError(f"checkpoint {path}: {MANIFEST}: '{key}.{sub}' is missing or not a string")
        if key != "env" and not (isinstance(entry.get("rows"), dict) and all(
                isinstance(n, int) and not isinstance(n, bool) for n in entry["rows"].values())):
            raise CheckpointError(f"checkpoint {path}: {MANIFEST}: '{key}.rows' is missing or not an object of "
                                  "row counts")
    return path, manifest


def read_verified(file: Path, sha256: object, label: str) -> bytes:
    """The bytes of ``file`` after checking them against their SHA-256 (hex) from a manifest;
    ``label`` names the file in the CheckpointError of an unreadable or changed file.
    """
    try:
        data = file.read_bytes()
    except OSError as e:
        raise CheckpointError(f"{label} cannot be read ({e.strerror})") from None
    if hashlib.sha256(data).hexdigest() != sha256:
        raise CheckpointError(f"{label} does not match its checksum (corrupt or changed after the checkpoint was "
                              "written)")
    return data


def _load(path: Path, entry: Mapping[str, Any], shard: bool = True) -> Any:
    label = f"checkpoint {path}: {entry['file']}"
    data = read_verified(file_inside(path, entry["file"], f"checkpoint {path}: {MANIFEST}"), entry["sha256"], label)
    obj = load_tensors(data, label)
    tables = obj.values() if shard and isinstance(obj, dict) else [obj]
    if not isinstance(obj, dict) or not all(isinstance(t, dict) and all(
            isinstance(k, str) and isinstance(v, Tensor) for k, v in t.items()) for t in tables):
        raise CheckpointError(f"checkpoint {path}: {entry['file']} does not hold "
                              f"{'populations of tensors' if shard else 'tensors by name'}")
    return obj
