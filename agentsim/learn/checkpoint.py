"""Training checkpoints, written atomically by rank 0.

A checkpoint is one file ``ppo-<update>.pt`` (``torch.save`` of the trainer's state: network,
optimizer, updates done, the log's rows, and what the training is). It is written to a temporary
file in the same directory, flushed to disk (``fsync``), then renamed into place, and only then is
``latest`` (a text file with the name) replaced the same way: a crash at any moment leaves the
previous checkpoint in place and named. Older checkpoints beyond ``keep`` are removed.

Examples:
    >>> import tempfile
    >>> where = tempfile.mkdtemp()
    >>> path = save(where, {"update": 3, "net": {}}, 3)
    >>> load_latest(where)["update"]
    3
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from ..checkpoint import atomic_write, tensor_bytes
from ..errors import ConfigError, OutputError

__all__ = ["FORMAT", "load_latest", "save"]

FORMAT = "agentsim-ppo-checkpoint"
VERSION = 1
_LATEST = "latest"


def save(directory: str | os.PathLike[str], state: dict[str, Any], update: int, keep: int = 3) -> str:
    """Write ``state`` as the checkpoint of ``update`` and point ``latest`` at it; keep the newest
    ``keep`` checkpoints. Returns the file's path.
    """
    where = Path(directory)
    try:
        where.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise OutputError(f"cannot create checkpoint directory '{where}': {e}") from e
    path = where / f"ppo-{update:06d}.pt"
    atomic_write(path, tensor_bytes({"format": FORMAT, "version": VERSION, **state}))
    atomic_write(where / _LATEST, path.name.encode())
    for old in sorted(where.glob("ppo-*.pt"))[:-max(keep, 1)]:
        old.unlink()
    return str(path)


def load_latest(directory: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The newest complete checkpoint in ``directory`` (the one ``latest`` names), or None."""
    where = Path(directory)
    pointer = where / _LATEST
    if not pointer.is_file():
        return None
    path = where / pointer.read_text().strip()
    try:
        state = torch.load(path, map_location="cpu", weights_only=False)
    except (OSError, RuntimeError, EOFError) as e:
        raise ConfigError(f"checkpoint '{path}' cannot be read ({e})") from None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise ConfigError(f"'{path}' is not an agentsim PPO checkpoint")
    if state.get("version", 0) > VERSION:
        raise ConfigError(f"checkpoint '{path}' has format version {state['version']}, newer than this agentsim's "
                          f"{VERSION}")
    return state
