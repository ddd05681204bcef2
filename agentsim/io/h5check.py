"""HDF5 files from elsewhere, read only inside themselves.

An HDF5 file may keep a dataset's bytes in other files (external storage, virtual datasets), link
to objects of other files (external links), or declare datasets far larger than what it stores.
Read as they are, such a trajectory or study file shows the bytes of any file the reader may read
(``/metrics/x`` backed by ``~/.aws/credentials``), hangs on a FIFO, or asks for terabytes. Every
agentsim reader opens its file through :func:`check_self_contained` first, which walks every link
and dataset once and refuses:

- external links, and links of a class h5py does not know;
- datasets with external storage or virtual (mapped from other datasets or files);
- datasets of a kind the formats never write (compound, variable-length, references, ...), unless
  the caller allows strings;
- datasets declaring more bytes than ``_MAX_RATIO`` times what they store, plus ``_SLACK`` (rows a
  failed flush sized but never filled stay readable; no compression reaches the ratio).
"""

from __future__ import annotations

import os
from typing import Any

import h5py
import numpy as np

from agentsim.errors import OutputError
from agentsim.io.locks import special_file

__all__ = ["DamagedFileError", "check_regular", "check_self_contained", "dataset_problem"]

_MAX_RATIO = 1100  # declared bytes per stored byte at most (gzip's ceiling is about 1032)
_SLACK = 16 << 20  # bytes a dataset may declare beyond that (small unfilled tails)
_NUMERIC = "biuf"  # bool, int, uint, float


class DamagedFileError(OutputError):
    """The file's links cannot all be read (a write that failed part way, or a crafted file)."""


def check_regular(path: str, what: str) -> None:
    """An OutputError unless ``path`` is a regular file (through links): a FIFO or a device is
    never opened (opening a FIFO waits for a writer).
    """
    kind = special_file(path)
    if kind is not None:
        raise OutputError(f"cannot read {what} '{path}': it is {kind}, not a regular file")
    if not os.path.isfile(path):
        raise OutputError(f"cannot read {what} '{path}': no such file")


def dataset_problem(ds: h5py.Dataset, strings: bool = False) -> str | None:
    """Why ``ds`` may not be read, or None."""
    if ds.external:
        return "keeps its data in other files (external storage)"
    if ds.is_virtual:
        return "is a virtual dataset (its data lives in other datasets or files)"
    dtype = ds.dtype
    allowed = dtype.kind in _NUMERIC or (strings and (dtype.kind in "SU" or h5py.check_string_dtype(dtype)))
    if not allowed or dtype.fields is not None or dtype.subdtype is not None:
        return f"has dtype {dtype}, which agentsim files never hold"
    declared = int(np.prod(ds.shape, dtype=np.float64) * dtype.itemsize) if ds.shape else dtype.itemsize
    stored = int(ds.id.get_storage_size())
    if declared > _MAX_RATIO * stored + _SLACK:
        return f"declares {declared:,} bytes but stores {stored:,} (crafted or damaged sizes)"
    return None


_ERRORS = (OSError, RuntimeError, KeyError, ValueError)  # what h5py raises on a damaged object


def check_self_contained(file: h5py.File, path: str, what: str, strings: bool = False,
                         damaged_ok: bool = False) -> list[str]:
    """An OutputError naming the first object of ``file`` that reads outside it or is not what
    agentsim writes (see the module docstring). Groups and objects whose headers cannot be read
    (a write that failed part way) raise a :class:`DamagedFileError`, or with ``damaged_ok`` are
    returned (their paths) for the caller to leave out: nothing in them is read. ``strings``:
    string datasets are allowed (a study's summary).
    """
    damaged: list[str] = []
    seen: set[Any] = set()
    todo: list[tuple[str, h5py.Group]] = [("", file)]
    while todo:
        prefix, group = todo.pop()
        try:
            names = list(group.keys())
        except _ERRORS as e:
            if not damaged_ok:
                raise DamagedFileError(f"'{path}' is a damaged {what}: {e}") from e
            damaged.append(prefix or "/")
            continue
        for name in names:
            where = f"{prefix}/{name}"
            try:
                link = group.get(name, getlink=True)
                if isinstance(link, h5py.ExternalLink):
                    problem: str | None = f"'{where}' is an external link to '{link.filename}:{link.path}'"
                elif isinstance(link, h5py.SoftLink):
                    continue  # (its target is visited as the hard link it names, or is missing)
                elif not isinstance(link, h5py.HardLink):
                    problem = f"'{where}' is a link of an unknown class"
                else:
                    obj = group[name]
                    key = obj.id.__hash__()
                    if key in seen:
                        continue
                    seen.add(key)
                    if isinstance(obj, h5py.Group):
                        todo.append((where, obj))
                        continue
                    why = dataset_problem(obj, strings) if isinstance(obj, h5py.Dataset) else None
                    problem = None if why is None else f"dataset '{where}' {why}"
            except _ERRORS as e:
                if not damaged_ok:
                    raise DamagedFileError(f"'{path}' is a damaged {what}: {e}") from e
                damaged.append(where)
                continue
            if problem is not None:
                raise OutputError(f"cannot read {what} '{path}': {problem}; agentsim reads only what a file holds "
                                  "itself")
    return damaged
