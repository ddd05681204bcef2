"""Observed time series for calibration: a CSV column against a time column.

Lines starting with ``#`` are comments (where the data came from); the first other line is the
header. ``read_series("data/boarding_school_flu.csv", "in_bed")`` gives the days and the
counts of boys confined to bed.
"""

from __future__ import annotations

import csv
import itertools
import math
import os
from dataclasses import dataclass

from agentsim.errors import ConfigError

__all__ = ["Series", "read_series"]


@dataclass(frozen=True)
class Series:
    """Observations ``values[k]`` at times ``times[k]`` (in the model's time unit, e.g. days)."""

    times: tuple[float, ...]
    values: tuple[float, ...]
    name: str = ""
    source: str = ""


def read_series(path: str | os.PathLike[str], column: str, time_column: str = "day") -> Series:
    """Read ``column`` against ``time_column`` from a CSV file (``#`` lines are comments).

    Raises:
        ConfigError: a missing file or column (naming the columns there), a value that is not a
            number, times that do not increase, or no rows.
    """
    try:
        with open(path, newline="") as f:
            lines = [line for line in f if line.strip() and not line.lstrip().startswith("#")]
    except OSError as e:
        raise ConfigError(f"data: cannot read {os.fspath(path)!r} ({e.strerror})") from None
    rows = list(csv.DictReader(lines))
    header = list(rows[0]) if rows else next(csv.reader(lines[:1]), [])
    for name in (time_column, column):
        if name not in header:
            raise ConfigError(f"data: {os.fspath(path)!r} has no column {name!r} (columns: {', '.join(header)})")
    if not rows:
        raise ConfigError(f"data: {os.fspath(path)!r} has no rows")
    times, values = [], []
    for k, row in enumerate(rows, start=1):
        try:
            t, v = float(row[time_column]), float(row[column])
        except (TypeError, ValueError):
            raise ConfigError(f"data: row {k} of {os.fspath(path)!r}: expected numbers in {time_column!r} and "
                              f"{column!r} (got {row[time_column]!r}, {row[column]!r})") from None
        if not (math.isfinite(t) and math.isfinite(v)):
            raise ConfigError(f"data: row {k} of {os.fspath(path)!r}: not a finite number")
        times.append(t)
        values.append(v)
    if any(b <= a for a, b in itertools.pairwise(times)):
        raise ConfigError(f"data: the times in {time_column!r} must increase")
    return Series(tuple(times), tuple(values), column, os.fspath(path))
