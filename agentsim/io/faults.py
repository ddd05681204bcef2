"""Test hook: make writes to chosen files fail, as on a full disk (for tests and stress scripts).

Set ``AGENTSIM_TEST_WRITE_FAULT=TARGET:N[:ERRNO]`` (or several, separated by ``;``) and every
write to a file matching ``TARGET``, from its ``N``-th on (1-based; counted per open HDF5 file,
and per process for checkpoint files), raises
``OSError(ERRNO)`` (default ``ENOSPC``): a full disk stays full. ``TARGET`` matches a file by its
full path, its base name, or a directory above it. ``N`` may be ``close``: writes fail once the
trajectory writer starts closing the file.

What a "write" is: for an HDF5 file (trajectory, study file) one ``write()`` call of the HDF5
library on the file (the file is then opened through h5py's ``fileobj`` driver, so HDF5 sees the
failure exactly as it sees ``ENOSPC``); for a checkpoint one file written by
:func:`agentsim.io.checkpoint.atomic_write`, or the creation of a checkpoint's directory.

Normal runs pay one ``os.environ`` lookup per file opened (:func:`write_fault`); nothing else.
Being read from the environment, the hook reaches spawned worker processes too.
"""

from __future__ import annotations

import errno as _errno
import os
from dataclasses import dataclass
from typing import Any

__all__ = ["ENV", "FailingFile", "Fault", "write_fault"]

ENV = "AGENTSIM_TEST_WRITE_FAULT"
_counts: dict[str, int] = {}  # writes per target so far in this process


@dataclass
class Fault:
    """Writes to one file fail from the ``start``-th on (``None``: once ``closing`` is set)."""

    target: str
    start: int | None
    code: int
    closing: bool = False
    shared: bool = False  # count in the process-wide counter of the target (else per open file)
    count: int = 0
    tripped: OSError | None = None  # the error raised, for the message (HDF5 reports only its own)

    def hit(self) -> bool:
        """Count one write; whether it fails."""
        if self.start is None:
            return self.closing
        if self.shared:
            _counts[self.target] = n = _counts.get(self.target, 0) + 1
        else:
            self.count = n = self.count + 1
            _counts[self.target] = max(_counts.get(self.target, 0), n)
        return n >= self.start

    def error(self, path: str) -> OSError:
        """The injected error, for ``path``."""
        return OSError(self.code, f"{os.strerror(self.code)} (injected by {ENV})", path)

    def check(self, path: str) -> None:
        """Count one write of ``path``; raise the injected error if it fails."""
        if self.hit():
            self.tripped = self.error(path)
            raise self.tripped


def _matches(target: str, path: str) -> bool:
    full = os.path.abspath(path)
    return target in (path, full, os.path.basename(full)) or full.startswith(os.path.abspath(target) + os.sep)


def write_fault(path: str | os.PathLike[str], shared: bool = False) -> Fault | None:
    """The fault injected into writes of ``path`` (None, the normal case, without the variable).
    ``shared``: count this write in the target's process-wide counter (one file per write, as a
    checkpoint's files); else the fault counts the writes of one open file (an HDF5 file).
    """
    spec = os.environ.get(ENV)
    if not spec:
        return None
    path = os.fspath(path)
    for item in spec.split(";"):
        target, _, rest = item.strip().partition(":")  # TARGET holds no ':'
        if not target or not _matches(target, path):
            continue
        when, _, code = rest.partition(":")
        number = getattr(_errno, code, None) if code else _errno.ENOSPC
        return Fault(target, None if when == "close" else int(when), int(number or _errno.ENOSPC), shared=shared)
    return None


class FailingFile:
    """A binary file whose writes fail as ``fault`` says (for h5py's ``fileobj`` driver); every
    other method is the underlying file's.
    """

    def __init__(self, path: str, mode: str, fault: Fault) -> None:
        self.path, self.fault = path, fault
        self.discard = False  # set by a writer giving the file up: later writes go nowhere
        self._f = open(path, mode)

    def write(self, b: Any) -> int:
        """Write ``b``, unless the fault makes this write fail."""
        if self.discard:
            return len(memoryview(b))
        self.fault.check(self.path)
        return self._f.write(b)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._f, name)
