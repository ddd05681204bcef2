"""A synthetic population: people with ages in households, schools, workplaces and community
venues, on a grid of localities of varying density.

Contacts are **memberships in places** (a bipartite person-place structure, as Loimos, FRED and
JUNE use), one column per layer: every person has a household, a community venue, and a school
or a workplace or neither. Memory and work grow with memberships, not with the square of place
sizes: about 46 bytes per person for the six columns (30 built with ``compact=True``: the place
ids a model keeps, int32 where they fit, as they do on the default grid up to 100M people; 38
for the US, whose workplace and venue ids take int64).

Every draw is a counter-based random number keyed by (seed, a global id, a stream), and every
id is global (a person's uid, a household's is its first member's uid, a place's encodes its
locality), so a population is the same however it is built: whole, or locality by locality on
the ranks that own them (:func:`synthesize` with ``localities=``), each rank drawing only its
localities and the two rings of neighbors whose commuters reach them.

How it is drawn:

1. **Localities**: a ``gx x gy`` grid (``n / people_per_locality`` of them); locality ``l`` gets
   the weight ``exp(spread * z_l)`` (``z_l`` standard normal) and ``n`` people are apportioned by
   weight (largest remainders), so density varies from place to place.
2. **Households**: sizes from the household table until the locality's people are housed (the
   last one cut to fit); the first member is an adult, the second a child with one probability,
   later ones with another (:meth:`PopulationTables.child_probabilities`: by default such that the
   share of children is the pyramid's); ages from the pyramid's adult or child part.
3. **Schools**: the children in each school band go to one of the
   ``max(1, round(pupils / school_size))`` schools of their locality and band.
4. **Workplaces**: persons aged ``adult_age .. retirement_age - 1`` work with probability
   ``employment_rate``, in a neighboring locality (one of up to 8) with probability ``commute``;
   each locality's workers, in a random order, fill workplaces of power-law sizes.
5. **Community**: each person belongs to one of the ``max(1, round(people / community_size))``
   venues of their locality.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import torch
from torch import Tensor

from agentsim._native import kernels as cpu_kernels
from agentsim.core.random import CounterRNG
from agentsim.errors import ConfigError
from agentsim.population.tables import PopulationTables

__all__ = ["LAYERS", "Localities", "Memberships", "SyntheticPopulation", "edge_cut", "locality_grid",
           "partition_localities", "synthesize"]

#: The membership layers, in column order.
LAYERS: tuple[str, ...] = ("household", "school", "work", "community")
_NEIGHBORS = [(-1, -1), (-1, 0), (-1, 1), (0, -1), (0, 1), (1, -1), (1, 0), (1, 1)]


@dataclass(frozen=True)
class Localities:
    """The grid of localities: who lives where.

    Attributes:
        shape: ``(gx, gy)``; locality ``l`` is at grid cell ``(l // gy, l % gy)``.
        population: ``[L]`` int64 people living in each locality.
        first_uid: ``[L]`` int64 uid of each locality's first person (its people are
            ``first_uid[l] .. first_uid[l] + population[l] - 1``).
        neighbors: ``[L, 8]`` int64 the neighboring localities (Moore), valid ones first, -1 after.
    """

    shape: tuple[int, int]
    population: Tensor
    first_uid: Tensor
    neighbors: Tensor

    @property
    def n_localities(self) -> int:
        """Number of localities."""
        return int(self.population.shape[0])

    @property
    def coords(self) -> Tensor:
        """``[L, 2]`` float64 grid coordinates (cell centres, in locality widths)."""
        ids = torch.arange(self.n_localities)
        return torch.stack([ids // self.shape[1], ids % self.shape[1]], 1).to(torch.float64) + 0.5


@dataclass
class Memberships:
    """One layer's places numbered ``0 .. n_places - 1`` among the people built, with their member lists.

    Attributes:
        place: ``[n]`` int32 place number of each person, ``n_places`` for a person with none.
        size: ``[n_places + 1]`` int32 members of each place (the last entry, "none": 0).
        start: ``[n_places + 1]`` int64: the members of place ``k`` are ``members[start[k]:start[k + 1]]``.
        members: ``[m]`` uids (int32 when they fit, else int64), place by place, ascending within a place.
    """

    place: Tensor
    size: Tensor
    start: Tensor
    members: Tensor

    @property
    def n_places(self) -> int:
        """Number of places (some may be empty: a community venue or school nobody drew)."""
        return int(self.size.shape[0]) - 1


@dataclass
class SyntheticPopulation:
    """The people of some localities (all of them unless built for a subset), sorted by uid.

    Attributes:
        uid: ``[n]`` int64 person ids (global: the same whatever was built).
        age: ``[n]`` int16 age in years.
        locality: ``[n]`` int32 the locality the person lives in.
        household: ``[n]`` int64 household id (the uid of its first member).
        school: ``[n]`` int64 school id, -1 for none.
        work: ``[n]`` int64 workplace id, -1 for none.
        community: ``[n]`` int64 community venue id.
        localities: The locality grid (all localities).
        compacted: The four place columns hold the ids :meth:`compact` gives (int32 where they
            fit), not the int64 ids above (``synthesize(..., compact=True)``); :meth:`layer` still
            gives the int64 ids.
        school_slots: ``(bands, schools)``: the school bands of the tables it was drawn with, and
            the most schools one band of a locality can have (``1 + p // school_size``, ``p`` the
            most people a locality has): the compact school ids number that many per band and
            locality. None: 256 bands of ``p + 1`` (any tables).
    """

    uid: Tensor
    age: Tensor
    locality: Tensor
    household: Tensor
    school: Tensor
    work: Tensor
    community: Tensor
    localities: Localities
    compacted: bool = False
    school_slots: tuple[int, int] | None = None

    def __len__(self) -> int:
        return int(self.uid.shape[0])

    def layer(self, name: str) -> Tensor:
        """A layer's column (``[n]`` int64 place id, -1 where the person has none)."""
        column = self._column(name)
        return _expand_ids(name, column, self.localities, self.school_slots) if self.compacted else column

    def _column(self, name: str) -> Tensor:
        if name not in LAYERS:
            raise ConfigError(f"unknown layer {name!r} (valid: {', '.join(LAYERS)})")
        column: Tensor = getattr(self, name)
        return column

    def memberships(self, layer: str) -> Memberships:
        """The layer's places numbered densely and their member lists, in time and memory linear in
        the people (no sort: households are runs of consecutive uids, other places are numbered
        within their locality, and the lists come from one counting sort).
        """
        ids = self.layer(layer)
        n = len(self)
        if layer == "household":  # people sorted by uid; a household is a run of consecutive uids
            has = torch.ones(n, dtype=torch.bool)
            number = torch.cumsum(ids == self.uid, 0) - 1
            n_places = int(number[-1]) + 1 if n else 0
        else:
            has = ids >= 0
            group, low, per_locality = _group_and_number(layer, ids)
            group = torch.where(has, group, 0)
            n_groups = self.localities.n_localities * per_locality
            count = torch.zeros(n_groups, dtype=torch.int64).scatter_reduce_(
                0, group[has], low[has] + 1, reduce="amax")
            base = torch.cumsum(count, 0) - count
            n_places = int(count.sum())
            number = torch.where(has, base.index_select(0, group) + low, n_places)
        if n_places >= 2**31:
            raise ConfigError(f"memberships: {n_places} {layer} places do not fit int32 numbers")
        number = number.to(torch.int32)
        numbered = number[has].contiguous()
        size = torch.bincount(numbered, minlength=n_places)
        counted = cpu_kernels.cell_sort(numbered, None, n_places)  # stable: uid order within a place
        if counted is not None:
            order, start = counted
        else:
            order = torch.argsort(numbered, stable=True)
            start = torch.cat([torch.zeros(1, dtype=torch.int64), torch.cumsum(size, 0)])
        uid = self.uid[has]
        members = uid.index_select(0, order).to(torch.int32 if n == 0 or int(self.uid.max()) < 2**31 else torch.int64)
        return Memberships(number, torch.cat([size, size.new_zeros(1)]).to(torch.int32), start.to(torch.int64), members)

    def compact(self, layer: str) -> Tensor:
        """A layer's place ids as ``[n]`` int32 where they fit (int64 otherwise), -1 for none: a
        household's id is its first member's uid; another place's ``(group, number)`` (its
        locality, and for a school the band within it; its number there) becomes
        ``group * K + number``, ``K`` the most places of the kind a group can have: for a
        workplace or a venue the most people a locality has, plus one (no locality has more places
        of a kind than people), for a school the most schools of one band (``school_slots``).
        Distinct places keep distinct ids, the same whatever localities were built (``K`` comes
        from the whole grid).

        Examples:
            >>> pop = synthesize(2000, seed=1, people_per_locality=500)
            >>> compact = pop.compact("work")
            >>> compact.dtype, torch.unique(compact).numel() == torch.unique(pop.work).numel()
            (torch.int32, True)
        """
        column = self._column(layer)
        if self.compacted or _compact_dtype(layer, self.localities, self.school_slots) == torch.int64:
            return column
        out = torch.empty(column.shape[0], dtype=torch.int32)
        for a in range(0, column.shape[0], _BATCH_PEOPLE):  # by batches: no int64 temporaries of every person
            out[a:a + _BATCH_PEOPLE] = _compact_ids(layer, column[a:a + _BATCH_PEOPLE], self.localities,
                                                    self.school_slots)
        return out

    def nbytes(self) -> int:
        """Bytes of the person columns (without the locality table)."""
        return sum(t.element_size() * t.numel() for t in (self.uid, self.age, self.locality, self.household,
                                                          self.school, self.work, self.community))


def _places_per_group(localities: Localities) -> int:
    """``K`` of :meth:`SyntheticPopulation.compact` for a workplace or a venue: the most people a
    locality has, plus one.
    """
    population = localities.population
    return int(population.max()) + 1 if population.numel() else 1


def _school_slots(tables: PopulationTables, localities: Localities) -> tuple[int, int]:
    """``SyntheticPopulation.school_slots``: the bands, and the most schools one band of a locality can
    have: ``max(1, round(pupils / school_size))`` with at most ``p`` pupils, ``p`` the most people a
    locality has, is at most ``1 + p // school_size``.
    """
    population = localities.population
    most = int(population.max()) if population.numel() else 0
    return len(tables.school_bands), 1 + most // tables.school_size


def _groups_and_places(layer: str, localities: Localities, slots: tuple[int, int] | None) -> tuple[int, int]:
    """A layer's groups per locality and ``K``, its places per group, in the compact ids."""
    if layer == "school":
        return slots if slots is not None else (256, _places_per_group(localities))
    return 1, _places_per_group(localities)


def _compact_dtype(layer: str, localities: Localities, slots: tuple[int, int] | None = None) -> torch.dtype:
    """The dtype of a layer's compact ids (:meth:`SyntheticPopulation.compact`): int32 where they fit."""
    population = localities.population
    if layer == "household":
        return torch.int32 if int(population.sum()) < 2**31 else torch.int64
    per_locality, places = _groups_and_places(layer, localities, slots)
    fits = population.shape[0] * per_locality * places < 2**31
    return torch.int32 if fits else torch.int64


def _compact_ids(layer: str, ids: Tensor, localities: Localities, slots: tuple[int, int] | None = None) -> Tensor:
    """A layer's int64 place ids (any subset of the people) as :meth:`SyntheticPopulation.compact` gives them."""
    if _compact_dtype(layer, localities, slots) == torch.int64:
        return ids
    if layer == "household":
        return ids.to(torch.int32)
    group, number, _ = _group_and_number(layer, ids)
    per_locality, places = _groups_and_places(layer, localities, slots)
    if layer == "school":  # (locality, band) numbered with per_locality bands, not 256
        group = (group >> 8) * per_locality + (group & 255)
    return torch.where(ids >= 0, group * places + number, -1).to(torch.int32)


def _expand_ids(layer: str, compact: Tensor, localities: Localities, slots: tuple[int, int] | None = None) -> Tensor:
    """The int64 place ids back from :func:`_compact_ids`."""
    if compact.dtype == torch.int64:  # kept whole (they did not fit int32)
        return compact
    wide = compact.to(torch.int64)
    if layer == "household":
        return wide
    per_locality, places = _groups_and_places(layer, localities, slots)
    group, number = wide // places, wide % places
    if layer == "school":
        ids = ((group // per_locality) << 32) | ((group % per_locality) << 24) | number
    else:
        ids = (group << 32) | number
    return torch.where(compact >= 0, ids, -1)


def _group_and_number(layer: str, ids: Tensor) -> tuple[Tensor, Tensor, int]:
    """Place ids of a layer other than households taken apart: ``(group, number, groups per
    locality)``: the group is the locality (a school's, ``locality * 256 + band``), the number
    the place's within its group (meaningless where ``ids < 0``).
    """
    group, number = ids >> 32, ids & 0xFFFFFFFF
    if layer == "school":  # (locality, band): numbered within each; bands < 256 (PopulationTables)
        return group * 256 + (number >> 24), number & 0xFFFFFF, 256
    return group, number, 1


def locality_grid(n: int, seed: int = 0, people_per_locality: int = 10_000, spread: float = 0.8) -> Localities:
    """The localities of a population of ``n`` people (see the module docstring, step 1).

    Args:
        n: People (>= 1).
        seed: The population's seed.
        people_per_locality: Mean people per locality (sets the grid: ``ceil(sqrt(n / it))``
            localities a side, at least 1).
        spread: Standard deviation of the log of the localities' weights (0: all equal).

    Raises:
        ConfigError: An argument out of range.
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ConfigError(f"synthetic population: expected n >= 1 people (got {n!r})")
    if isinstance(people_per_locality, bool) or not isinstance(people_per_locality, int) or people_per_locality < 1:
        raise ConfigError(f"synthetic population: expected people_per_locality >= 1 (got {people_per_locality!r})")
    if not (math.isfinite(spread) and spread >= 0):
        raise ConfigError(f"synthetic population: expected spread >= 0 (got {spread!r})")
    side = max(1, math.ceil(math.sqrt(n / people_per_locality)))
    shape = (side, side)
    count = side * side
    rng = CounterRNG(seed)
    weight = torch.exp(rng.normal(torch.arange(count), step=0, stream="locality_weight",
                                  dtype=torch.float64) * spread)
    quota = weight / weight.sum() * n  # float64 on the CPU: the same on every rank
    population = torch.floor(quota).to(torch.int64)
    short = n - int(population.sum())
    if short:
        # largest remainders, ties by locality id
        order = torch.argsort(-(quota - population.to(torch.float64)), stable=True)
        population[order[:short]] += 1
    first_uid = torch.cumsum(population, 0) - population
    ids = torch.arange(count)
    gx, gy = ids // side, ids % side
    table = torch.full((count, 8), -1, dtype=torch.int64)
    valid = torch.zeros(count, dtype=torch.int64)
    for dx, dy in _NEIGHBORS:
        x, y = gx + dx, gy + dy
        inside = (x >= 0) & (x < side) & (y >= 0) & (y < side)
        rows = torch.nonzero(inside).flatten()
        table[rows, valid[rows]] = (x * side + y)[rows]
        valid += inside.to(torch.int64)
    return Localities(shape, population, first_uid, table)


def _ring(loc: Localities, selected: Tensor) -> Tensor:
    """``selected`` (sorted locality ids) and their neighbors, sorted."""
    near = loc.neighbors.index_select(0, selected).reshape(-1)
    ring: Tensor = torch.unique(torch.cat([selected, near[near >= 0]]))
    return ring


def _member_of(localities: Tensor, chosen: Tensor, n_localities: int) -> Tensor:
    """``[n]`` bool: whether each locality id (-1: none) is one of ``chosen`` (a lookup table, not a sort)."""
    table = torch.zeros(n_localities + 1, dtype=torch.bool)
    table[chosen] = True
    return table.index_select(0, torch.where(localities < 0, n_localities, localities))


def _inverse_cdf(weights: tuple[float, ...] | Tensor, u: Tensor) -> Tensor:
    """Index drawn from ``weights`` (normalized) by uniforms ``u`` ``[m]``: int64 ``[m]``."""
    w = torch.as_tensor(weights, dtype=torch.float64)
    cdf = torch.cumsum(w, 0) / w.sum()
    return torch.searchsorted(cdf, u.to(torch.float64), right=True).clamp(max=w.shape[0] - 1)


def _age_table(tables: PopulationTables, adult: bool) -> tuple[Tensor, Tensor, Tensor]:
    """The pyramid's bands cut at ``adult_age``: (first age, last age, weight) of its adult or child part."""
    cut = tables.adult_age
    lo, hi, wt = [], [], []
    for a, b, w in zip(tables.ages.age_from, tables.ages.age_to, tables.ages.weight, strict=True):
        a2, b2 = (max(a, cut), b) if adult else (a, min(b, cut - 1))
        if a2 <= b2:
            lo.append(a2)
            hi.append(b2)
            wt.append(w * (b2 - a2 + 1) / (b - a + 1))
    if not wt or sum(wt) <= 0:
        raise ConfigError(f"PopulationTables: the age pyramid has no {'adults' if adult else 'children'} "
                          f"(adult_age {cut})")
    return torch.tensor(lo), torch.tensor(hi), torch.tensor(wt, dtype=torch.float64)


def _people(loc: Localities, localities: Tensor, tables: PopulationTables, rng: CounterRNG) -> dict[str, Tensor]:
    """uid, locality, household and age (``[n]`` int64) of the people of ``localities``."""
    pop = loc.population.index_select(0, localities)
    first = loc.first_uid.index_select(0, localities)
    total = int(pop.sum())
    at = torch.repeat_interleave(torch.arange(localities.shape[0]), pop, output_size=total)  # [total]
    begin = (torch.cumsum(pop, 0) - pop).index_select(0, at)  # each person's locality's first row
    uid = first.index_select(0, at).sub_(begin).add_(torch.arange(total))  # first + index in the locality
    # Households: one candidate size per person slot (sizes >= 1 house everyone), laid end to end.
    size = torch.as_tensor(tables.households.size).index_select(
        0, _inverse_cdf(tables.households.weight, rng.uniform(uid, step=0, stream="household_size",
                                                              dtype=torch.float64)))
    slot = torch.cumsum(size, 0).sub_(size)
    start = slot - slot.index_select(0, begin)  # first slot, within the locality
    del slot, begin
    lives = pop.index_select(0, at)
    kept = torch.nonzero(start < lives).flatten()
    start_k = start.index_select(0, kept)
    size_k = torch.minimum(size.index_select(0, kept), lives.index_select(0, kept) - start_k)
    del start, size, lives
    head = first.index_select(0, at.index_select(0, kept)).add_(start_k)
    del kept, start_k
    household = torch.repeat_interleave(head, size_k, output_size=total)
    del head, size_k
    member = uid - household
    # Ages: adults and children from the two parts of the pyramid.
    u = rng.uniform(uid, step=0, stream="age", draws=3, dtype=torch.float64)  # [total, 3]
    second, later = tables.child_probabilities()  # float64 whatever torch's default dtype
    p_child = torch.tensor([0.0, second, later], dtype=torch.float64).index_select(0, member.clamp(max=2))
    del member
    child = u[:, 0] < p_child
    del p_child
    age = torch.empty(total, dtype=torch.int64)
    for is_child in (False, True):
        rows = torch.nonzero(child == is_child).flatten()
        if not rows.numel():  # (a pyramid without children gives households none)
            continue
        lo, hi, wt = _age_table(tables, adult=not is_child)
        band = _inverse_cdf(wt, u[rows, 1])
        width = (hi - lo + 1).index_select(0, band)
        age[rows] = lo.index_select(0, band) + torch.floor(u[rows, 2] * width).to(torch.int64).clamp(max=width - 1)
    return {"uid": uid, "locality": localities.index_select(0, at), "household": household, "age": age}


_HOME = 8  # a worker's code (_work_code) for working in the home locality; 0 .. 7: that neighbor; -1: no work


def _work_code(loc: Localities, people: dict[str, Tensor], tables: PopulationTables, rng: CounterRNG) -> Tensor:
    """``[n]`` int8 where each person works: -1 nowhere, ``_HOME`` in their locality, ``k`` in
    their ``k``-th neighbor (a commuter).
    """
    uid, age, home = people["uid"], people["age"], people["locality"]
    u = rng.uniform(uid, step=0, stream="work", draws=3, dtype=torch.float64)
    works = (age >= tables.adult_age) & (age < tables.retirement_age) & (u[:, 0] < tables.employment_rate)
    n_near = (loc.neighbors >= 0).sum(1).index_select(0, home)
    pick = torch.floor(u[:, 2] * n_near).to(torch.int8).clamp(min=0, max=7)  # [0, 8): exact in int8
    commutes = (u[:, 1] < tables.commute) & (n_near > 0)
    del u, n_near
    code = torch.where(commutes, pick, _HOME)
    return code.masked_fill_(~works, -1)


def _place_workers(loc: Localities, w_uid: Tensor, w_loc: Tensor, tables: PopulationTables,
                   rng: CounterRNG) -> Tensor:
    """Workplace ids (``[m]`` int64) of the workers ``w_uid`` (ascending) with their work
    localities ``w_loc``: every worker of each of these localities is among them.
    """
    # a random order of each locality's workers: by (locality, random key, uid)
    # one sort of (locality in the high 31 bits, 32 random bits), ties in uid order (stable)
    key = rng.bits(w_uid, step=0, stream="work_order")
    order = torch.argsort((w_loc << 32) | ((key >> 32) & 0xFFFFFFFF), stable=True)
    del key
    w_loc_sorted = w_loc.index_select(0, order)
    locs, counts = torch.unique_consecutive(w_loc_sorted, return_counts=True)
    del w_loc_sorted
    begin = torch.cumsum(counts, 0) - counts
    at = torch.repeat_interleave(torch.arange(locs.shape[0]), counts, output_size=int(w_uid.shape[0]))
    position = torch.arange(at.shape[0]) - begin.index_select(0, at)  # place in the locality's line
    # workplace sizes: one candidate per worker slot, keyed by (locality, slot)
    sizes = torch.arange(1, tables.workplace_max + 1, dtype=torch.float64)
    weights = sizes ** -tables.workplace_exponent
    slot_key = loc.first_uid.index_select(0, locs).index_select(0, at) + position
    size = _inverse_cdf(weights, rng.uniform(slot_key, step=0, stream="workplace_size", dtype=torch.float64)) + 1
    del slot_key
    csum = torch.cumsum(size, 0)
    end_within = csum - (csum - size).index_select(0, begin).index_select(0, at)  # one past each place's last
    del csum
    # worker p of a locality fills the first place whose end_within > p (places in slot order)
    spacing = 2 * int(size.sum()) + 2
    del size
    flat_end = end_within.add_(at * spacing)  # sorted across localities
    flat_p = position.add_(at * spacing)
    place = torch.searchsorted(flat_end, flat_p, right=True).sub_(begin.index_select(0, at))
    del flat_end, flat_p
    ids = place.bitwise_or_(locs.index_select(0, at) << 32)
    placed = torch.empty_like(ids)
    placed[order] = ids
    return placed


def _schools_and_venues(loc: Localities, uid: Tensor, age: Tensor, home: Tensor, tables: PopulationTables,
                        rng: CounterRNG) -> tuple[Tensor, Tensor]:
    """School ids (-1 for none) and community venue ids (``[n]`` int64) of people of whole localities."""
    # Schools: per (locality, band), pupils spread over the band's schools of the locality.
    school = torch.full_like(uid, -1)
    u_school = rng.uniform(uid, step=0, stream="school", dtype=torch.float64)
    for b, (first_age, last_age) in enumerate(tables.school_bands):
        rows = torch.nonzero((age >= first_age) & (age <= last_age)).flatten()
        pupils = torch.bincount(home.index_select(0, rows), minlength=loc.n_localities)
        n_schools = torch.clamp(torch.round(pupils.to(torch.float64) / tables.school_size), min=1).to(torch.int64)
        k = n_schools.index_select(0, home.index_select(0, rows))
        idx = torch.floor(u_school.index_select(0, rows) * k).to(torch.int64).clamp(max=k - 1)
        school[rows] = (home.index_select(0, rows) << 32) | (b << 24) | idx  # bands < 256: PopulationTables
    del u_school
    # Community venues of the home locality.
    n_venues = torch.clamp(torch.round(loc.population.to(torch.float64) / tables.community_size), min=1).to(
        torch.int64).index_select(0, home)
    venue = torch.floor(rng.uniform(uid, step=0, stream="community", dtype=torch.float64) * n_venues).to(
        torch.int64).clamp(max=n_venues - 1)
    return school, venue.bitwise_or_(home << 32)


def synthesize(n: int, seed: int = 0, tables: PopulationTables | None = None, *, people_per_locality: int = 10_000,
               spread: float = 0.8, localities: Tensor | None = None, compact: bool = False) -> SyntheticPopulation:
    """Draw a synthetic population (see the module docstring).

    Args:
        n: People (>= 1).
        seed: Seed of every draw.
        tables: The age pyramid, household sizes and place parameters (default: approximate US).
        people_per_locality: Mean people per locality.
        spread: Standard deviation of the log of the localities' weights.
        localities: Build only the people living in these localities (``[k]`` int ids, as a rank
            builds its own: the same rows the whole population has for them).
        compact: Give the place columns as :meth:`SyntheticPopulation.compact` gives them (int32
            where they fit; ``compacted``): 30 to 38 bytes per person instead of 46, and the int64
            ids of every person are never held (what a model's init keeps, at scale).

    Returns:
        The people (of ``localities``, or everyone), sorted by uid.

    Raises:
        ConfigError: An argument out of range or a locality id outside the grid.

    Examples:
        >>> pop = synthesize(2000, seed=1, people_per_locality=500)
        >>> len(pop), pop.localities.shape, int(pop.age.min()) >= 0
        (2000, (2, 2), True)
    """
    tables = PopulationTables() if tables is None else tables
    loc = locality_grid(n, seed, people_per_locality, spread)
    if localities is None:
        own = torch.arange(loc.n_localities)
    else:
        own = torch.unique(torch.as_tensor(localities, dtype=torch.int64).reshape(-1))
        if own.numel() and (int(own.min()) < 0 or int(own.max()) >= loc.n_localities):
            raise ConfigError(f"synthetic population: locality ids are 0 .. {loc.n_localities - 1} (got "
                              f"{int(own.min())} .. {int(own.max())})")
    return _build(loc, own, tables, CounterRNG(seed), compact)


#: The most people drawn at once (whole localities: a locality may have more): the temporaries
#: of a batch are a few hundred bytes per person drawn.
_BATCH_PEOPLE = 2**20
_MIN_BATCH_PEOPLE = 2**16  # a batch smaller than this costs more in per-batch work than it saves
_BATCHES = 32  # batches of at least this many for a population of more than _MIN_BATCH_PEOPLE * _BATCHES
_COLUMNS = ("uid", "age", "locality", "household", "school", "work", "community")


def _batches(population: Tensor, batch: int) -> list[tuple[int, int]]:
    """Runs ``[a, b)`` of consecutive localities (of ``population`` people each) of about ``batch`` people."""
    total = int(population.sum())
    if population.numel() <= 1 or total <= batch:
        return [(0, population.numel())] if population.numel() else []
    cuts = torch.searchsorted(torch.cumsum(population, 0), torch.arange(batch, total, batch), right=True)
    bounds = [0, *sorted({int(c) for c in cuts.tolist() if 0 < int(c) < population.numel()}), population.numel()]
    return list(itertools.pairwise(bounds))


def _build(loc: Localities, own: Tensor, tables: PopulationTables, rng: CounterRNG,
           compact: bool) -> SyntheticPopulation:
    """The people of the localities ``own`` (sorted ids), batch by batch into their final columns.

    The workers of a locality live in it or next to it; a resident of ``own`` may work one ring
    out, where workers come from two rings out: the people of those rings are drawn too, each
    locality once. First pass, batches of these localities: every person's work locality (one
    byte: -1, home or which neighbor) and, for residents of ``own``, every column but ``work``.
    Second pass, batches of the work localities one ring out: their workers (from the byte
    column, a range of localities) get workplaces; residents of ``own`` keep theirs.
    """
    n_loc = loc.n_localities
    ring1 = _ring(loc, own)
    ring2 = _ring(loc, ring1)
    pop2 = loc.population.index_select(0, ring2)
    start2 = torch.cumsum(pop2, 0) - pop2  # each locality's first person among those drawn
    pop_own = loc.population.index_select(0, own)
    n_own = int(pop_own.sum())
    # a person of locality l is row uid - shift[l] of the drawn (shift2) and of the built (shift_own)
    shift2 = torch.zeros(n_loc, dtype=torch.int64)
    shift2[ring2] = loc.first_uid.index_select(0, ring2) - start2
    shift_own = torch.zeros(n_loc, dtype=torch.int64)
    shift_own[own] = loc.first_uid.index_select(0, own) - (torch.cumsum(pop_own, 0) - pop_own)
    is_own = torch.zeros(n_loc + 1, dtype=torch.bool)  # + 1: "none" (-1) is not
    is_own[own] = True

    slots = _school_slots(tables, loc)

    def place_dtype(layer: str) -> torch.dtype:
        return _compact_dtype(layer, loc, slots) if compact else torch.int64

    def encode(layer: str, ids: Tensor) -> Tensor:
        return _compact_ids(layer, ids, loc, slots) if compact else ids

    columns = {"uid": torch.empty(n_own, dtype=torch.int64), "age": torch.empty(n_own, dtype=torch.int16),
               "locality": torch.empty(n_own, dtype=torch.int32),
               **{layer: torch.empty(n_own, dtype=place_dtype(layer)) for layer in ("household", "school",
                                                                                   "community")},
               "work": torch.full((n_own,), -1, dtype=place_dtype("work"))}
    code = torch.empty(int(pop2.sum()), dtype=torch.int8)
    batch = min(_BATCH_PEOPLE, max(_MIN_BATCH_PEOPLE, int(pop2.sum()) // _BATCHES))
    for a, b in _batches(pop2, batch):  # every person drawn: where they work; residents: their columns
        drawn = _people(loc, ring2[a:b], tables, rng)
        first = int(start2[a])
        code[first:first + drawn["uid"].shape[0]] = _work_code(loc, drawn, tables, rng)
        mine = is_own.index_select(0, ring2[a:b])
        if not bool(mine.any()):
            continue
        if not bool(mine.all()):
            keep = torch.nonzero(is_own.index_select(0, drawn["locality"])).flatten()
            drawn = {k: v.index_select(0, keep) for k, v in drawn.items()}
            del keep
        uid, age, home = drawn["uid"], drawn["age"], drawn["locality"]
        first_own = int(ring2[a:b][mine][0])
        at = int(loc.first_uid[first_own] - shift_own[first_own])
        span = slice(at, at + uid.shape[0])
        school, community = _schools_and_venues(loc, uid, age, home, tables, rng)
        columns["uid"][span] = uid
        columns["age"][span] = age
        columns["locality"][span] = home
        columns["household"][span] = encode("household", drawn["household"])
        columns["school"][span] = encode("school", school)
        columns["community"][span] = encode("community", community)
        del drawn, uid, age, home, school, community
    pop1 = loc.population.index_select(0, ring1)
    work = columns["work"]
    for a, b in _batches(pop1, batch):  # the workers of these localities, from those drawn around them
        here = ring1[a:b]
        near = _ring(loc, here)
        lo = int(torch.searchsorted(ring2, near[0]))
        hi = int(torch.searchsorted(ring2, near[-1], right=True))
        first = int(start2[lo])
        last = int(start2[hi]) if hi < ring2.shape[0] else code.shape[0]
        rows = torch.nonzero(code[first:last] >= 0).flatten().add_(first)  # the workers among those drawn
        home = ring2.index_select(0, torch.searchsorted(start2, rows, right=True).sub_(1))
        c = code.index_select(0, rows).to(torch.int64)
        at_home = c == _HOME
        where = torch.where(at_home, home, loc.neighbors[home, c.clamp_(max=7)])
        del c, at_home
        keep = torch.nonzero(_member_of(where, here, n_loc)).flatten()
        rows, home, where = rows.index_select(0, keep), home.index_select(0, keep), where.index_select(0, keep)
        del keep
        w_uid = rows.add_(shift2.index_select(0, home))
        ids = _place_workers(loc, w_uid, where, tables, rng)
        del where
        resident = torch.nonzero(is_own.index_select(0, home)).flatten()
        target = w_uid.index_select(0, resident).sub_(shift_own.index_select(0, home.index_select(0, resident)))
        work[target] = encode("work", ids.index_select(0, resident))
        del w_uid, home, ids, resident, target
    return SyntheticPopulation(**columns, localities=loc, compacted=compact, school_slots=slots)


PARTITION_METHODS = ("rcb", "metis")


def partition_localities(loc: Localities, world_size: int, method: str = "rcb") -> Tensor:
    """Owner rank of each locality (``[L]`` int64), the same on every process.

    Two methods (``method``):

    - ``"rcb"``: recursive coordinate bisection of the grid, each cut splitting the people (not
      the localities) in proportion to the ranks on each side: regions of the map.
    - ``"metis"``: a graph partition by METIS (the ``metis`` extra: ``pip install
      'agentsim[metis]'``) of the localities' graph, each weighted by its people, each pair of
      neighbors by the commuters expected between them (a worker commutes to one of its
      locality's neighbors with probability ``commute``): parts of equal population with the
      fewest commuters between them. Deterministic (METIS's fixed seed).

    Raises:
        ConfigError: ``world_size`` below 1, an unknown method, or ``"metis"`` without pymetis.
    """
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ConfigError(f"partition_localities: expected world_size >= 1 (got {world_size!r})")
    if method not in PARTITION_METHODS:
        raise ConfigError(f"partition_localities: unknown method {method!r}; valid: {', '.join(PARTITION_METHODS)}")
    if method == "metis":
        return _metis_partition(loc, world_size)
    owner = torch.zeros(loc.n_localities, dtype=torch.int64)
    coords = loc.coords
    weight = loc.population.to(torch.float64)

    def split(ids: Tensor, first_rank: int, ranks: int) -> None:
        if ranks == 1 or ids.numel() <= 1:
            owner[ids] = first_rank
            return
        c = coords.index_select(0, ids)
        extent = c.max(0).values - c.min(0).values
        axis = int(torch.argmax(extent))
        order = ids.index_select(0, torch.argsort(c[:, axis] * loc.n_localities + ids.to(torch.float64),
                                                  stable=True))
        left_ranks = ranks // 2
        csum = torch.cumsum(weight.index_select(0, order), 0)
        target = csum[-1] * left_ranks / ranks
        cut = int(torch.searchsorted(csum, target)) + 1
        cut = min(max(cut, 1), order.numel() - 1)
        split(order[:cut], first_rank, left_ranks)
        split(order[cut:], first_rank + left_ranks, ranks - left_ranks)

    split(torch.arange(loc.n_localities), 0, world_size)
    return owner


def _metis_partition(loc: Localities, world_size: int) -> Tensor:
    """:func:`partition_localities` by METIS (see there)."""
    try:
        import pymetis
    except ImportError:
        raise ConfigError("partition_localities(method='metis') needs pymetis: pip install 'agentsim[metis]' "
                          "(or pymetis); method='rcb' needs nothing") from None
    if world_size == 1 or loc.n_localities <= 1:
        return torch.zeros(loc.n_localities, dtype=torch.int64)
    valid = loc.neighbors >= 0
    near = valid.sum(1)
    xadj = torch.zeros(loc.n_localities + 1, dtype=torch.int64)
    torch.cumsum(near, 0, out=xadj[1:])
    source = torch.repeat_interleave(torch.arange(loc.n_localities), near)
    target = loc.neighbors[valid]  # row by row: each locality's neighbors
    outflow = loc.population.to(torch.float64) / near.clamp(min=1)  # commuters to each neighbor (relative)
    weight = torch.clamp(torch.round(outflow[source] + outflow[target]), min=1).to(torch.int64)
    options = pymetis.Options(seed=0)
    _, parts = pymetis.part_graph(world_size, adjacency=pymetis.CSRAdjacency(xadj.tolist(), target.tolist()),
                                  vweights=loc.population.clamp(min=1).tolist(), eweights=weight.tolist(),
                                  options=options)
    return torch.tensor(parts, dtype=torch.int64)

def edge_cut(pop: SyntheticPopulation, owner: Tensor) -> dict[str, float]:
    """Share of contacts that cross ranks, per layer and overall, when each person is on the rank
    that owns their locality (``owner``: ``[L]`` rank of each locality).

    A place of ``m`` members has ``m (m - 1) / 2`` contacts; those between members on different
    ranks cross. Needs the whole population (one process).
    """
    rank = owner.index_select(0, pop.locality.to(torch.int64))
    world = int(owner.max()) + 1 if owner.numel() else 1
    out: dict[str, float] = {}
    crossing = total = 0.0
    for name in LAYERS:
        place = pop.layer(name)
        rows = torch.nonzero(place >= 0).flatten()
        kept, dense = torch.unique(place.index_select(0, rows), return_inverse=True)
        per_rank = torch.bincount(dense * world + rank.index_select(0, rows), minlength=kept.numel() * world)
        per_rank = per_rank.view(-1, world).to(torch.float64)  # [place, rank] members
        members = per_rank.sum(1)
        pairs = float((members * (members - 1) / 2).sum())
        within = float((per_rank * (per_rank - 1) / 2).sum())
        out[name] = (pairs - within) / pairs if pairs else 0.0
        crossing += pairs - within
        total += pairs
    out["all"] = crossing / total if total else 0.0
    return out
