"""Training checkpoints, written atomically by rank 0; reading one never executes code.

A checkpoint of update ``u`` is two files:

- ``ppo-<u>.pt``: ``torch.save`` of the trainer's state as tensors and plain data (network,
  optimizer state, updates done, the log's rows, and what the training is: dicts, lists,
  numbers and strings only);
- ``ppo-<u>.json``, its manifest: the format, the version, the update, the file's name and
  SHA-256, and ``checksum``, the SHA-256 of the manifest's other fields as canonical JSON
  (:func:`agentsim.io.checkpoint.manifest_checksum`).

Each is written to a temporary file in the same directory, flushed to disk (``fsync``), then
renamed into place, the manifest after the state, and only then is ``latest`` (a text file with
the manifest's name) replaced the same way: a crash at any moment leaves the previous checkpoint
in place and named. Older checkpoints beyond ``keep`` are removed.

Loading checks that ``latest`` and the manifest name files inside the directory (no absolute
path, no ``..``, no link to elsewhere), the manifest's checksum and the state's SHA-256, and loads
the state with ``torch.load(..., weights_only=True)``: a file that asks for anything but tensors
and plain data is refused (a :class:`~agentsim.io.checkpoint.CheckpointError`) before anything in
it runs. Checkpoints of version 1 (one pickled file, no checksums) are refused as of an older
format.

Examples:
    >>> import tempfile
    >>> where = tempfile.mkdtemp()
    >>> path = save(where, {"update": 3, "net": {}}, 3)
    >>> load_latest(where)["update"]
    3
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from agentsim.errors import OutputError
from agentsim.io.checkpoint import (
    CheckpointError,
    atomic_write,
    file_inside,
    load_tensors,
    manifest_checksum,
    read_verified,
    tensor_bytes,
)

__all__ = ["FORMAT", "load_latest", "save"]

FORMAT = "agentsim-ppo-checkpoint"
#: 2: a manifest with checksums next to a state of tensors and plain data (1: one pickled file).
VERSION = 2
_LATEST = "latest"
_MANIFEST_KEYS: dict[str, type] = {"format": str, "version": int, "update": int, "file": str, "sha256": str,
                                   "checksum": str}


def save(directory: str | os.PathLike[str], state: dict[str, Any], update: int, keep: int = 3,
         run_id: str | None = None) -> str:
    """Write ``state`` (tensors and plain data) as the checkpoint of ``update`` and point
    ``latest`` at it; keep the newest ``keep`` checkpoints of the training ``run_id`` (recorded
    in the manifest as ``run``): another training's checkpoints in the directory are never
    removed (without ``run_id``, the newest ``keep`` of any). Returns the state file's path.
    """
    where = Path(directory)
    try:
        where.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise OutputError(f"cannot create checkpoint directory '{where}': {e}") from e
    path = where / f"ppo-{update:06d}.pt"
    digest = atomic_write(path, tensor_bytes({"format": FORMAT, "version": VERSION, **state}))
    manifest: dict[str, Any] = {"format": FORMAT, "version": VERSION, "update": int(update), "file": path.name,
                                "sha256": digest, **({"run": run_id} if run_id is not None else {})}
    manifest["checksum"] = manifest_checksum(manifest)
    name = f"ppo-{update:06d}.json"
    atomic_write(where / name, (json.dumps(manifest, indent=1) + "\n").encode())
    atomic_write(where / _LATEST, name.encode())
    ours = [m for m in sorted(where.glob("ppo-*.json")) if run_id is None or _run_of(m) == run_id]
    for old in ours[:-max(keep, 1)]:
        old.unlink()
        old.with_suffix(".pt").unlink(missing_ok=True)
    return str(path)


def _run_of(manifest: Path) -> str | None:
    """The training a checkpoint manifest belongs to (its ``run``), or None."""
    try:
        run = json.loads(manifest.read_text()).get("run")
    except (OSError, ValueError, AttributeError):
        return None
    return run if isinstance(run, str) else None


def load_latest(directory: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The newest complete checkpoint in ``directory`` (the one ``latest`` names), verified, or
    None if there is none.

    Raises:
        CheckpointError: ``latest`` or the manifest names a file outside ``directory``, a file does
            not match its checksum, the state holds anything but tensors and plain data, or the
            checkpoint is of another (older or newer) format.
    """
    where = Path(directory)
    pointer = where / _LATEST
    if not pointer.exists() and not pointer.is_symlink():
        return None
    if pointer.is_symlink() or not pointer.is_file():
        raise CheckpointError(f"checkpoint pointer '{pointer}' is not a plain file (a link or a directory): "
                              "refused")
    try:
        name = pointer.read_bytes().decode("utf-8").strip()
    except (OSError, UnicodeDecodeError) as e:
        raise CheckpointError(f"checkpoint pointer '{pointer}' cannot be read ({e})") from None
    manifest_path = file_inside(where, name, f"checkpoint pointer '{pointer}'")
    if name.endswith(".pt"):
        raise CheckpointError(f"'{where}' holds a training checkpoint of an older format (version 1: one pickled "
                              "file without checksums), which this agentsim does not load: start the training "
                              "again, or finish it with the agentsim that started it")
    manifest = _manifest(manifest_path)
    path = file_inside(where, manifest["file"], f"checkpoint manifest '{manifest_path}'")
    state = load_tensors(read_verified(path, manifest["sha256"], f"checkpoint '{path}'"), f"checkpoint '{path}'")
    if not isinstance(state, dict) or state.get("format") != FORMAT or state.get("version") != VERSION:
        raise CheckpointError(f"'{path}' is not an agentsim PPO checkpoint of version {VERSION}")
    if state.get("update") != manifest["update"] or manifest["file"] != f"ppo-{manifest['update']:06d}.pt":
        raise CheckpointError(f"checkpoint '{path}' is of update {state.get('update')!r}, its manifest "
                              f"'{manifest_path.name}' says {manifest['update']} (file {manifest['file']!r})")
    for key, kind in (("update", int), ("net", dict), ("optimizer", dict), ("history", list), ("identity", dict)):
        if key in state and not isinstance(state[key], kind):
            raise CheckpointError(f"checkpoint '{path}': '{key}' is a {type(state[key]).__name__}, expected a "
                                  f"{kind.__name__}")
    return state


def _manifest(path: Path) -> dict[str, Any]:
    """A training checkpoint's manifest, checked: keys, types, format, version, checksum."""
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise CheckpointError(f"checkpoint manifest '{path}' cannot be read ({e})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise CheckpointError(f"'{path}' is not an agentsim PPO checkpoint manifest")
    version = manifest.get("version")
    if isinstance(version, int) and not isinstance(version, bool) and version > VERSION:
        raise CheckpointError(f"checkpoint '{path}' has format version {version}, newer than this agentsim's "
                              f"{VERSION}: upgrade agentsim")
    for key, kind in _MANIFEST_KEYS.items():
        if key not in manifest:
            raise CheckpointError(f"checkpoint manifest '{path}' has no key '{key}'")
        if not isinstance(manifest[key], kind) or isinstance(manifest[key], bool):
            raise CheckpointError(f"checkpoint manifest '{path}': '{key}' is a {type(manifest[key]).__name__}, "
                                  f"expected a {kind.__name__}")
    if manifest["version"] < VERSION:
        raise CheckpointError(f"checkpoint '{path}' has format version {manifest['version']}, older than this "
                              f"agentsim's {VERSION}: start the training again")
    if manifest["checksum"] != manifest_checksum(manifest):
        raise CheckpointError(f"checkpoint manifest '{path}' does not match its checksum (edited or corrupt after "
                              "the checkpoint was written)")
    return manifest
