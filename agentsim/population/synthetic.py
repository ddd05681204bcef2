"""A synthetic population: people with ages in households, schools, workplaces and community
venues, on a grid of localities of varying density.

Contacts are **memberships in places** (a bipartite person-place structure, as Loimos, FRED and
JUNE use), one column per layer: every person has a household, a community venue, and a school
or a workplace or neither. Memory and work grow with memberships, not with the square of place
sizes: about 46 bytes per person for the six columns.

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
   last one cut to fit); the first member is an adult, the second a child with probability
   ``child_share[0]``, later ones with ``child_share[1]``; ages from the pyramid's adult or child
   part.
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
    """

    uid: Tensor
    age: Tensor
    locality: Tensor
    household: Tensor
    school: Tensor
    work: Tensor
    community: Tensor
    localities: Localities

    def __len__(self) -> int:
        return int(self.uid.shape[0])

    def layer(self, name: str) -> Tensor:
        """A layer's column (``[n]`` int64 place id, -1 where the person has none)."""
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
        ``group * K + number``, ``K`` the most people a locality has (no locality has more places
        of a kind than people). Distinct places keep distinct ids, the same whatever localities
        were built (``K`` comes from the whole grid).

        Examples:
            >>> pop = synthesize(2000, seed=1, people_per_locality=500)
            >>> compact = pop.compact("work")
            >>> compact.dtype, torch.unique(compact).numel() == torch.unique(pop.work).numel()
            (torch.int32, True)
        """
        ids = self.layer(layer)
        population = self.localities.population
        people = int(population.max()) + 1 if population.numel() else 1
        if layer == "household":
            return ids.to(torch.int32) if int(population.sum()) < 2**31 else ids
        group, number, per_locality = _group_and_number(layer, ids)
        if population.shape[0] * per_locality * people >= 2**31:
            return ids
        return torch.where(ids >= 0, group * people + number, -1).to(torch.int32)

    def nbytes(self) -> int:
        """Bytes of the person columns (without the locality table)."""
        return sum(t.element_size() * t.numel() for t in (self.uid, self.age, self.locality, self.household,
                                                          self.school, self.work, self.community))


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
    """uid, locality, household, age and the work-related draws of the people of ``localities``."""
    pop = loc.population.index_select(0, localities)
    first = loc.first_uid.index_select(0, localities)
    total = int(pop.sum())
    at = torch.repeat_interleave(torch.arange(localities.shape[0]), pop, output_size=total)  # [total]
    begin = torch.cumsum(pop, 0) - pop
    within = torch.arange(total) - begin.index_select(0, at)  # index of the person in the locality
    uid = first.index_select(0, at) + within
    # Households: one candidate size per person slot (sizes >= 1 house everyone), laid end to end.
    size = torch.as_tensor(tables.households.size).index_select(
        0, _inverse_cdf(tables.households.weight, rng.uniform(uid, step=0, stream="household_size",
                                                              dtype=torch.float64)))
    csum = torch.cumsum(size, 0)
    start = csum - size - (csum - size).index_select(0, begin).index_select(0, at)  # first slot, within
    lives = pop.index_select(0, at)
    kept = torch.nonzero(start < lives).flatten()
    start_k = start.index_select(0, kept)
    size_k = torch.minimum(size.index_select(0, kept), lives.index_select(0, kept) - start_k)
    head = first.index_select(0, at.index_select(0, kept)) + start_k
    household = torch.repeat_interleave(head, size_k, output_size=total)
    member = uid - household
    # Ages: adults and children from the two parts of the pyramid.
    u = rng.uniform(uid, step=0, stream="age", draws=3, dtype=torch.float64)  # [total, 3]
    p_child = torch.where(member == 0, 0.0, torch.where(member == 1, tables.child_share[0], tables.child_share[1]))
    child = u[:, 0] < p_child
    age = torch.empty(total, dtype=torch.int64)
    for is_child in (False, True):
        rows = torch.nonzero(child == is_child).flatten()
        lo, hi, wt = _age_table(tables, adult=not is_child)
        band = _inverse_cdf(wt, u[rows, 1])
        width = (hi - lo + 1).index_select(0, band)
        age[rows] = lo.index_select(0, band) + torch.floor(u[rows, 2] * width).to(torch.int64).clamp(max=width - 1)
    return {"uid": uid, "locality": localities.index_select(0, at), "household": household, "age": age}


def _work_locality(loc: Localities, people: dict[str, Tensor], tables: PopulationTables,
                   rng: CounterRNG) -> Tensor:
    """``[n]`` int64 the locality each person works in, -1 for those who do not work."""
    uid, age, home = people["uid"], people["age"], people["locality"]
    u = rng.uniform(uid, step=0, stream="work", draws=3, dtype=torch.float64)
    works = (age >= tables.adult_age) & (age < tables.retirement_age) & (u[:, 0] < tables.employment_rate)
    n_near = (loc.neighbors >= 0).sum(1).index_select(0, home)
    pick = torch.floor(u[:, 2] * n_near).to(torch.int64).clamp(min=0, max=7)
    away = loc.neighbors[home, pick]
    commutes = (u[:, 1] < tables.commute) & (n_near > 0)
    where = torch.where(commutes, away, home)
    return torch.where(works, where, torch.full_like(where, -1))


def _workplaces(loc: Localities, uid: Tensor, work_loc: Tensor, for_localities: Tensor,
                tables: PopulationTables, rng: CounterRNG) -> Tensor:
    """Workplace ids of the workers ``uid`` (with their work localities): each locality of
    ``for_localities`` has all its workers among them. ``[n]`` int64, -1 for non-workers and for
    workers of other localities.
    """
    out = torch.full_like(uid, -1)
    mine = _member_of(work_loc, for_localities, loc.n_localities)
    rows = torch.nonzero(mine).flatten()
    if rows.numel() == 0:
        return out
    w_uid, w_loc = uid.index_select(0, rows), work_loc.index_select(0, rows)
    # a random order of each locality's workers: by (locality, random key, uid)
    # one sort of (locality in the high 31 bits, 32 random bits), ties in uid order (stable)
    key = rng.bits(w_uid, step=0, stream="work_order")
    order = torch.argsort((w_loc << 32) | ((key >> 32) & 0xFFFFFFFF), stable=True)
    w_loc_sorted = w_loc.index_select(0, order)
    locs, counts = torch.unique_consecutive(w_loc_sorted, return_counts=True)
    begin = torch.cumsum(counts, 0) - counts
    at = torch.repeat_interleave(torch.arange(locs.shape[0]), counts)
    position = torch.arange(w_loc_sorted.shape[0]) - begin.index_select(0, at)  # place in the locality's line
    # workplace sizes: one candidate per worker slot, keyed by (locality, slot)
    sizes = torch.arange(1, tables.workplace_max + 1, dtype=torch.float64)
    weights = sizes ** -tables.workplace_exponent
    slot_key = loc.first_uid.index_select(0, locs).index_select(0, at) + position
    size = _inverse_cdf(weights, rng.uniform(slot_key, step=0, stream="workplace_size", dtype=torch.float64)) + 1
    csum = torch.cumsum(size, 0)
    end_within = csum - (csum - size).index_select(0, begin).index_select(0, at)  # one past each place's last
    # worker p of a locality fills the first place whose end_within > p (places in slot order)
    flat_end = end_within + at * (2 * int(size.sum()) + 2)  # sorted across localities
    flat_p = position + at * (2 * int(size.sum()) + 2)
    place = torch.searchsorted(flat_end, flat_p, right=True) - begin.index_select(0, at)
    ids = (locs.index_select(0, at) << 32) | place
    placed = torch.empty_like(ids)
    placed[order] = ids
    out[rows] = placed
    return out


def synthesize(n: int, seed: int = 0, tables: PopulationTables | None = None, *, people_per_locality: int = 10_000,
               spread: float = 0.8, localities: Tensor | None = None) -> SyntheticPopulation:
    """Draw a synthetic population (see the module docstring).

    Args:
        n: People (>= 1).
        seed: Seed of every draw.
        tables: The age pyramid, household sizes and place parameters (default: approximate US).
        people_per_locality: Mean people per locality.
        spread: Standard deviation of the log of the localities' weights.
        localities: Build only the people living in these localities (``[k]`` int ids, as a rank
            builds its own: the same rows the whole population has for them).

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
    rng = CounterRNG(seed)
    # In batches of localities (runs of ids: rows of the grid) of about _BATCH_PEOPLE people, so that
    # the temporaries of a large population stay a fraction of its columns.
    people_of = loc.population.index_select(0, own)
    if own.numel() > 1 and int(people_of.sum()) > _BATCH_PEOPLE:
        cuts = torch.searchsorted(torch.cumsum(people_of, 0),
                                  torch.arange(_BATCH_PEOPLE, int(people_of.sum()), _BATCH_PEOPLE), right=True)
        bounds = [0, *sorted({int(c) for c in cuts.tolist() if 0 < int(c) < own.numel()}), own.numel()]
        columns: dict[str, Tensor] = {}
        at = 0
        for a, b in itertools.pairwise(bounds):  # each batch written into the columns (no second copy)
            part = _synthesize_localities(loc, own[a:b], tables, rng)
            for f in _COLUMNS:
                got = getattr(part, f)
                if f not in columns:
                    columns[f] = got.new_empty(int(people_of.sum()))
                columns[f][at:at + len(part)] = got
            at += len(part)
            del part
        return SyntheticPopulation(**columns, localities=loc)
    return _synthesize_localities(loc, own, tables, rng)


_BATCH_PEOPLE = 2**22
_COLUMNS = ("uid", "age", "locality", "household", "school", "work", "community")


def _synthesize_localities(loc: Localities, own: Tensor, tables: PopulationTables,
                           rng: CounterRNG) -> SyntheticPopulation:
    """The people of the localities ``own`` (sorted ids)."""
    # The workers of a locality live in it or next to it; a resident of `own` may work one ring out,
    # where workers come from two rings out: draw those people too (the whole grid when it is small).
    ring1 = _ring(loc, own)
    ring2 = _ring(loc, ring1)
    drawn = _people(loc, ring2, tables, rng)
    work_loc = _work_locality(loc, drawn, tables, rng)
    work = _workplaces(loc, drawn["uid"], work_loc, ring1, tables, rng)
    keep = torch.nonzero(_member_of(drawn["locality"], own, loc.n_localities)).flatten()
    people = {k: v.index_select(0, keep) for k, v in drawn.items()}
    work = work.index_select(0, keep)
    uid, age, home = people["uid"], people["age"], people["locality"]
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
    # Community venues of the home locality.
    n_venues = torch.clamp(torch.round(loc.population.to(torch.float64) / tables.community_size), min=1).to(
        torch.int64).index_select(0, home)
    venue = torch.floor(rng.uniform(uid, step=0, stream="community", dtype=torch.float64) * n_venues).to(
        torch.int64).clamp(max=n_venues - 1)
    return SyntheticPopulation(uid=uid, age=age.to(torch.int16), locality=home.to(torch.int32),
                               household=people["household"], school=school, work=work,
                               community=(home << 32) | venue, localities=loc)


def partition_localities(loc: Localities, world_size: int) -> Tensor:
    """Owner rank of each locality (``[L]`` int64): recursive coordinate bisection of the grid,
    each cut splitting the people (not the localities) in proportion to the ranks on each side.

    Raises:
        ConfigError: ``world_size`` below 1.
    """
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ConfigError(f"partition_localities: expected world_size >= 1 (got {world_size!r})")
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
