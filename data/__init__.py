"""Data sets that ship with agentsim, installed as ``agentsim.data`` (the top-level ``data/`` folder
of the repository).

``boarding_school_flu.csv``: the 1978 influenza outbreak in an English boarding school (763 boys,
one index case; boys confined to bed on days 1-14), the sources in the file's header. Read it with
:func:`agentsim.calibrate.read_series` and :func:`path`::

    from agentsim.calibrate import read_series
    from agentsim.data import path

    in_bed = read_series(path("boarding_school_flu.csv"), "in_bed")

``us_age_pyramid.csv`` and ``us_household_size.csv``: approximate US shares of the population by
5-year age band and of households by size (sources in each file's header), the default tables of
:mod:`agentsim.population`.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["path"]

_HERE = Path(__file__).resolve().parent


def path(name: str) -> Path:
    """The path of a data set that ships with agentsim.

    Args:
        name: The file's name, e.g. ``"boarding_school_flu.csv"``.

    Raises:
        FileNotFoundError: No such data set; the message lists the ones there are.
    """
    found = _HERE / name
    if found.parent != _HERE or not found.is_file():
        there = sorted(p.name for p in _HERE.iterdir() if p.is_file() and p.suffix != ".py")
        raise FileNotFoundError(f"no data set {name!r} in agentsim.data (there are: {', '.join(there)})")
    return found
