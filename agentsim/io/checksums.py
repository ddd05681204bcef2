"""CRC-32 checksums of a trajectory's rows and frames (format version 2 of :mod:`agentsim.io.hdf5`).

HDF5's own Fletcher-32 filter checksums whole chunks, and a run rewrites the last chunk of every
dataset in place at each flush: a writer killed during that rewrite would leave a chunk whose
checksum fails, losing the rows flushed to it before. These checksums cover one row (a metric or
perf row) or one field of one frame (agents, env) each, written after the data they cover, so a
torn write can only affect the newest row or frame, and a flipped bit anywhere is found on reading.

Every value is CRC-32 (:func:`zlib.crc32`) of the little-endian bytes of the values as stored.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping

import numpy as np

CHECKSUMS = "checksums"  # the dataset's name in /metrics, /perf, /env and /agents/<population>


def _little_endian(a: np.ndarray) -> np.ndarray:
    """``a`` contiguous, little-endian, at least 1-D (a view where it already is)."""
    a = np.ascontiguousarray(a)
    if a.dtype.byteorder == ">" or (a.dtype.byteorder == "=" and np.little_endian is False):
        a = a.astype(a.dtype.newbyteorder("<"))
    return a


def crc32(a: np.ndarray, start: int = 0) -> int:
    """CRC-32 of the bytes of ``a`` (any shape and dtype), continuing from the checksum ``start``."""
    return zlib.crc32(_little_endian(a).reshape(-1).view(np.uint8).data, start)


def frame_checksum(step: int, value: np.ndarray) -> int:
    """The checksum of one field of the frame of ``step``: CRC-32 of the step (int64) then the
    field's rows ``[n, ...]`` (agents) or the layer (env).
    """
    return crc32(value, crc32(np.asarray([step], dtype=np.int64)))


def frame_checksums(step: int, fields: Mapping[str, np.ndarray]) -> np.ndarray:
    """One checksum per field of the frame of ``step`` (:func:`frame_checksum`), uint32 ``[F]``,
    in the order of the fields' sorted names.
    """
    return np.array([frame_checksum(step, fields[name]) for name in sorted(fields)], dtype=np.uint32)


def row_checksums(step: np.ndarray, columns: Mapping[str, np.ndarray]) -> np.ndarray:
    """One checksum per row of a metrics or perf table, uint32 ``[T]``.

    Args:
        step: The rows' steps, int64 ``[T]``.
        columns: Name to ``[T]`` or ``[T, K]`` values (int64 or float64, as stored); a row's
            bytes are its step's then each column's, in the order of the sorted names.
    """
    rows = len(step)
    if rows == 0:
        return np.zeros(0, dtype=np.uint32)
    parts = [_little_endian(np.asarray(step, dtype=np.int64)).reshape(rows, -1).view(np.uint8)]
    parts += [_little_endian(columns[name]).reshape(rows, -1).view(np.uint8) for name in sorted(columns)]
    table = np.ascontiguousarray(np.concatenate(parts, axis=1))
    return np.fromiter((zlib.crc32(row) for row in table), dtype=np.uint32, count=rows)


def first_mismatch(stored: np.ndarray, computed: np.ndarray) -> int | None:
    """The index of the first entry where ``stored`` and ``computed`` differ (None: all agree)."""
    bad = np.nonzero(np.asarray(stored, dtype=np.uint32) != computed)[0]
    return int(bad[0]) if bad.size else None
