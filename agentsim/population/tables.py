"""The tables a synthetic population is drawn from: an age pyramid, household sizes, and the
parameters of schools, workplaces and community venues.

The defaults are approximate US figures shipped with agentsim (``agentsim.data``:
``us_age_pyramid.csv``, ``us_household_size.csv``; the sources are in each file's header).
Load your own from CSV files of the same columns (lines starting with ``#`` are comments)::

    from agentsim.population import AgePyramid, HouseholdSizes, PopulationTables
    tables = PopulationTables(ages=AgePyramid.from_csv("my_ages.csv"),
                              households=HouseholdSizes.from_csv("my_households.csv"))
"""

from __future__ import annotations

import csv
import importlib.resources
import math
import os
from dataclasses import dataclass, field
from typing import Any

from agentsim.errors import ConfigError

__all__ = ["AgePyramid", "HouseholdSizes", "PopulationTables"]


def _rows(path: str | os.PathLike[str], columns: tuple[str, ...]) -> list[list[float]]:
    """The numeric rows of a CSV file with the header ``columns`` (``#`` lines skipped)."""
    with open(path, newline="") as f:
        lines = [(k, line) for k, line in enumerate(f, 1) if line.strip() and not line.lstrip().startswith("#")]
    if not lines:
        raise ConfigError(f"{path}: no header and no rows (expected the columns {', '.join(columns)})")
    header = [c.strip() for c in next(csv.reader([lines[0][1]]))]
    if tuple(header) != columns:
        raise ConfigError(f"{path}, line {lines[0][0]}: expected the columns {', '.join(columns)} (got "
                          f"{', '.join(header)})")
    rows = []
    for k, line in lines[1:]:
        cells = next(csv.reader([line]))
        try:
            values = [float(c) for c in cells]
        except ValueError:
            raise ConfigError(f"{path}, line {k}: expected {len(columns)} numbers (got {line.strip()!r})") from None
        if len(values) != len(columns) or not all(math.isfinite(v) for v in values):
            raise ConfigError(f"{path}, line {k}: expected {len(columns)} finite numbers (got {line.strip()!r})")
        rows.append(values)
    return rows


def _shipped(name: str) -> Any:
    """A data set of ``agentsim.data`` (the repository's ``data/``), located without importing the facade."""
    return importlib.resources.files("agentsim.data") / name


def _check_weights(what: str, weights: tuple[float, ...]) -> None:
    if not weights or any(not math.isfinite(w) or w < 0 for w in weights) or sum(weights) <= 0:
        raise ConfigError(f"{what}: expected finite weights >= 0 with a positive sum (got {list(weights)})")


@dataclass(frozen=True)
class AgePyramid:
    """Shares of the population by age band (whole years, inclusive bounds, from 0, contiguous).

    Attributes:
        age_from, age_to: ``[B]`` first and last age of each band.
        weight: ``[B]`` share of each band (any positive scale: normalized).
    """

    age_from: tuple[int, ...]
    age_to: tuple[int, ...]
    weight: tuple[float, ...]

    def __post_init__(self) -> None:
        n = len(self.age_from)
        if not n or len(self.age_to) != n or len(self.weight) != n:
            raise ConfigError(f"AgePyramid: expected as many age_from, age_to and weight values, one or more (got "
                              f"{len(self.age_from)}, {len(self.age_to)}, {len(self.weight)})")
        if self.age_from[0] != 0 or any(b < a for a, b in zip(self.age_from, self.age_to, strict=True)) or any(
                self.age_from[k + 1] != self.age_to[k] + 1 for k in range(n - 1)) or self.age_to[-1] > 120:
            raise ConfigError(f"AgePyramid: expected contiguous bands from age 0 to at most 120, each "
                              f"age_from <= age_to (got {list(zip(self.age_from, self.age_to, strict=True))})")
        _check_weights("AgePyramid", self.weight)

    @classmethod
    def from_csv(cls, path: str | os.PathLike[str]) -> AgePyramid:
        """Read the columns ``age_from,age_to,percent``."""
        rows = _rows(path, ("age_from", "age_to", "percent"))
        if any(r[0] != int(r[0]) or r[1] != int(r[1]) for r in rows):
            raise ConfigError(f"{path}: ages are whole years")
        return cls(tuple(int(r[0]) for r in rows), tuple(int(r[1]) for r in rows), tuple(r[2] for r in rows))

    def share_below(self, age: int) -> float:
        """The share of the population younger than ``age`` (years; a band's weight spread evenly over its ages)."""
        below = sum(w * min(max(age - a, 0), b - a + 1) / (b - a + 1)
                    for a, b, w in zip(self.age_from, self.age_to, self.weight, strict=True))
        return below / sum(self.weight)

    @classmethod
    def default(cls) -> AgePyramid:
        """The United States (``agentsim.data``'s ``us_age_pyramid.csv``, approximate)."""
        return cls.from_csv(_shipped("us_age_pyramid.csv"))


@dataclass(frozen=True)
class HouseholdSizes:
    """Shares of households by number of persons.

    Attributes:
        size: ``[K]`` household sizes (persons, >= 1, increasing).
        weight: ``[K]`` share of households of each size (normalized).
    """

    size: tuple[int, ...]
    weight: tuple[float, ...]

    def __post_init__(self) -> None:
        if not self.size or len(self.weight) != len(self.size) or self.size[0] < 1 or any(
                b <= a for a, b in zip(self.size, self.size[1:], strict=False)):
            raise ConfigError(f"HouseholdSizes: expected increasing sizes >= 1 and one weight each (got sizes "
                              f"{list(self.size)}, {len(self.weight)} weights)")
        _check_weights("HouseholdSizes", self.weight)

    @classmethod
    def from_csv(cls, path: str | os.PathLike[str]) -> HouseholdSizes:
        """Read the columns ``size,percent``."""
        rows = _rows(path, ("size", "percent"))
        if any(r[0] != int(r[0]) for r in rows):
            raise ConfigError(f"{path}: household sizes are whole numbers of persons")
        return cls(tuple(int(r[0]) for r in rows), tuple(r[1] for r in rows))

    @classmethod
    def default(cls) -> HouseholdSizes:
        """The United States (``agentsim.data``'s ``us_household_size.csv``, approximate)."""
        return cls.from_csv(_shipped("us_household_size.csv"))

    @property
    def mean(self) -> float:
        """Mean household size (persons)."""
        return sum(s * w for s, w in zip(self.size, self.weight, strict=True)) / sum(self.weight)


CHILD_SHARE = (0.2, 0.75)
"""Relative odds that a household's second member, and each later one, is a child (scaled to the age
pyramid by :meth:`PopulationTables.child_probabilities`)."""


@dataclass(frozen=True)
class PopulationTables:
    """Everything a synthetic population is drawn from besides its size and seed.

    Attributes:
        ages: The age pyramid (default: the United States, approximate).
        households: Household sizes (default: the United States, approximate).
        adult_age: Household heads are at least this old; younger persons are children (years).
        child_share: Probability that a household's second member is a child, and that its third
            and later members are (the rest are adults). Default ``None``: the pyramid's share of
            children (see :meth:`child_probabilities`).
        school_bands: Inclusive age bands of school levels, not overlapping (schools per level and
            locality).
        school_size: Mean pupils per school (persons).
        employment_rate: Share of persons aged ``adult_age`` to ``retirement_age`` who work.
        retirement_age: First age at which nobody works (years).
        workplace_exponent: ``a`` of the workplace sizes' power law ``p(s) ~ s**-a``, ``s`` in
            ``1 .. workplace_max`` (firm sizes follow a Zipf law: Axtell, Science 293, 2001).
        workplace_max: Largest workplace (persons).
        community_size: Mean persons per community venue (a locality's venues).
        commute: Share of workers whose workplace is in a neighboring locality.
    """

    ages: AgePyramid = field(default_factory=AgePyramid.default)
    households: HouseholdSizes = field(default_factory=HouseholdSizes.default)
    adult_age: int = 18
    child_share: tuple[float, float] | None = None
    school_bands: tuple[tuple[int, int], ...] = ((5, 10), (11, 13), (14, 17))
    school_size: int = 500
    employment_rate: float = 0.7
    retirement_age: int = 65
    workplace_exponent: float = 2.0
    workplace_max: int = 2000
    community_size: int = 200
    commute: float = 0.2

    def __post_init__(self) -> None:
        checks = [
            ("adult_age", 0 < self.adult_age <= self.ages.age_to[-1], "in 1 .. the pyramid's last age"),
            ("child_share", self.child_share is None or (
                len(self.child_share) == 2 and all(0 <= p <= 1 for p in self.child_share)),
             "two probabilities or None"),
            ("school_bands", all(0 <= a <= b < self.adult_age for a, b in self.school_bands) and len(
                self.school_bands) <= 255 and all(b1 < a2 or b2 < a1 for i, (a1, b1) in enumerate(self.school_bands)
                                                  for a2, b2 in self.school_bands[i + 1:]),
             "inclusive (first, last) ages below adult_age, not overlapping"),
            ("school_size", self.school_size >= 1, ">= 1"),
            ("employment_rate", 0 <= self.employment_rate <= 1, "in [0, 1]"),
            ("retirement_age", self.retirement_age > self.adult_age, "> adult_age"),
            ("workplace_exponent", math.isfinite(self.workplace_exponent) and self.workplace_exponent > 0, "> 0"),
            ("workplace_max", 1 <= self.workplace_max <= 2**20, "in 1 .. 2**20"),
            ("community_size", self.community_size >= 1, ">= 1"),
            ("commute", 0 <= self.commute <= 1, "in [0, 1]"),
        ]
        for name, ok, expected in checks:
            if not ok:
                raise ConfigError(f"PopulationTables.{name}: expected {expected} (got {getattr(self, name)!r})")

    def child_probabilities(self) -> tuple[float, float]:
        """The probabilities that a household's second member is a child, and that each later member is.

        ``child_share`` where it is given. By default, ``CHILD_SHARE`` (0.2, 0.75: a second member is more
        often a partner, later ones more often children) times one factor chosen so that the expected
        share of children (younger than ``adult_age``) over households drawn from the household table
        is the age pyramid's; where that would take a probability above 1, later members are all
        children and the second member makes up the rest, as far as households allow (each has an
        adult head).
        """
        if self.child_share is not None:
            return self.child_share
        sizes = list(zip(self.households.size, self.households.weight, strict=True))
        total = sum(self.households.weight)
        second = sum(w for s, w in sizes if s >= 2) / total  # households with a second member
        later = sum(w * (s - 2) for s, w in sizes if s >= 3) / total  # later members per household
        wanted = self.ages.share_below(self.adult_age) * self.households.mean  # children per household
        weighted = CHILD_SHARE[0] * second + CHILD_SHARE[1] * later
        scale = wanted / weighted if weighted > 0 else 0.0
        first, rest = min(1.0, scale * CHILD_SHARE[0]), min(1.0, scale * CHILD_SHARE[1])
        if rest == 1.0 and second > 0:
            first = min(1.0, max(0.0, (wanted - later) / second))
        return first, rest
