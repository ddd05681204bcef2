"""Synthetic populations (agentsim.population): the same people however they are built, the
tables' distributions, places where they belong, the locality partition and its edge cut."""

from __future__ import annotations

import pytest
import torch

import agentsim.population.synthetic as synthetic
from agentsim import ConfigError
from agentsim.population import (
    AgePyramid,
    HouseholdSizes,
    PopulationTables,
    edge_cut,
    partition_localities,
    synthesize,
)

N, SEED, PER = 120_000, 5, 4000


@pytest.fixture(scope="module")
def pop():
    return synthesize(N, seed=SEED, people_per_locality=PER)


def _same(a, b) -> None:
    for f in synthetic._COLUMNS:
        assert torch.equal(getattr(a, f), getattr(b, f)), f


@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_built_by_localities_equals_built_whole(pop, world_size):
    owner = partition_localities(pop.localities, world_size)
    parts = [synthesize(N, seed=SEED, people_per_locality=PER, localities=torch.nonzero(owner == r).flatten())
             for r in range(world_size)]
    order = torch.argsort(torch.cat([p.uid for p in parts]))
    for f in synthetic._COLUMNS:
        assert torch.equal(torch.cat([getattr(p, f) for p in parts])[order], getattr(pop, f)), f
    assert sum(len(p) for p in parts) == N


@pytest.mark.parametrize("batch", [1, 15_000, 10**9])  # a locality at a time, a few, all at once
def test_batches_give_the_same_people(pop, monkeypatch, batch):
    monkeypatch.setattr(synthetic, "_BATCH_PEOPLE", batch)
    monkeypatch.setattr(synthetic, "_MIN_BATCH_PEOPLE", batch)
    _same(synthesize(N, seed=SEED, people_per_locality=PER), pop)
    owner = partition_localities(pop.localities, 3)
    mine = torch.nonzero(owner == 1).flatten()
    part = synthesize(N, seed=SEED, people_per_locality=PER, localities=mine)
    rows = torch.nonzero(torch.isin(pop.locality.long(), mine)).flatten()
    for f in synthetic._COLUMNS:
        assert torch.equal(getattr(part, f), getattr(pop, f)[rows]), f


@pytest.mark.parametrize("world_size", [1, 3])
def test_built_compact_the_same_places_without_their_int64_ids(pop, world_size):
    owner = partition_localities(pop.localities, world_size)
    for r in range(world_size):
        mine = torch.nonzero(owner == r).flatten()
        wide = synthesize(N, seed=SEED, people_per_locality=PER, localities=mine)
        small = synthesize(N, seed=SEED, people_per_locality=PER, localities=mine, compact=True)
        assert small.compacted and not wide.compacted
        for f in ("uid", "age", "locality"):
            assert torch.equal(getattr(small, f), getattr(wide, f)), f
        for layer in synthetic.LAYERS:
            assert small.compact(layer) is getattr(small, layer)  # the column itself: no copy
            assert torch.equal(small.compact(layer), wide.compact(layer)), layer
            assert torch.equal(small.layer(layer), wide.layer(layer)), layer  # the int64 ids back
        assert small.nbytes() == 30 * len(small)
    whole = synthesize(N, seed=SEED, people_per_locality=PER, compact=True)
    m, want = whole.memberships("work"), pop.memberships("work")
    assert torch.equal(m.place, want.place) and torch.equal(m.members, want.members)


def test_localities_without_people():
    """More localities than people: some have none, on any share."""
    whole = synthesize(5, seed=1, people_per_locality=1)
    assert whole.localities.n_localities == 9 and int((whole.localities.population == 0).sum()) == 4
    owner = partition_localities(whole.localities, 3)
    parts = [synthesize(5, seed=1, people_per_locality=1, localities=torch.nonzero(owner == r).flatten())
             for r in range(3)]
    order = torch.argsort(torch.cat([p.uid for p in parts]))
    for f in synthetic._COLUMNS:
        assert torch.equal(torch.cat([getattr(p, f) for p in parts])[order], getattr(whole, f)), f


def test_seeds(pop):
    _same(synthesize(N, seed=SEED, people_per_locality=PER), pop)
    other = synthesize(N, seed=SEED + 1, people_per_locality=PER)
    assert not torch.equal(other.age, pop.age)


def test_people_and_households(pop):
    assert torch.equal(pop.uid, torch.arange(N))
    loc = pop.localities
    assert int(loc.population.sum()) == N and int(loc.population.min()) > 0
    assert torch.equal(torch.bincount(pop.locality.long(), minlength=loc.n_localities), loc.population)
    # a household's id is its first member's uid; members are consecutive uids in one locality
    heads, sizes = torch.unique(pop.household, return_counts=True)
    assert torch.equal(pop.age[heads] >= 18, torch.ones_like(heads, dtype=torch.bool))
    assert bool((pop.locality[heads] == pop.locality[heads + sizes - 1]).all())
    table = HouseholdSizes.default()
    share = torch.bincount(sizes.clamp(max=table.size[-1]), minlength=table.size[-1] + 1)[1:].double() / len(sizes)
    want = torch.tensor(table.weight, dtype=torch.float64) / sum(table.weight)
    assert (share - want).abs().max() < 0.01  # cut households (one per locality) aside


def test_ages_follow_the_pyramid(pop):
    ages = AgePyramid.default()
    assert int(pop.age.min()) >= 0 and int(pop.age.max()) <= ages.age_to[-1]
    total = sum(ages.weight)
    for a, b, w in zip(ages.age_from, ages.age_to, ages.weight, strict=True):
        share = float(((pop.age >= a) & (pop.age <= b)).double().mean())
        assert abs(share - w / total) < 0.005, (a, b, share, w / total)  # sd of a share: under 0.001
    assert abs(float((pop.age < 18).double().mean()) - ages.share_below(18)) < 0.005


def test_child_probabilities_match_the_pyramid_as_far_as_households_allow():
    def tables(ages, households, **kw):
        return PopulationTables(ages=AgePyramid((0, 18), (17, 99), ages), households=HouseholdSizes(
            tuple(range(1, len(households) + 1)), households), **kw)

    def children_per_person(t):  # the expected share of children of households drawn from the table
        second, later = t.child_probabilities()
        sizes, w = t.households.size, t.households.weight
        kids = sum(wk * (second * (s >= 2) + later * max(s - 2, 0)) for s, wk in zip(sizes, w, strict=True))
        return kids / sum(s * wk for s, wk in zip(sizes, w, strict=True))

    middle = tables((30, 70), (20, 30, 30, 20))
    assert children_per_person(middle) == pytest.approx(0.3)
    second, later = middle.child_probabilities()
    assert later / second == pytest.approx(0.75 / 0.2)  # the relative odds kept
    many = tables((60, 40), (0, 0, 50, 50))  # every third and fourth member a child, the second makes up the rest
    assert many.child_probabilities()[1] == 1.0 and children_per_person(many) == pytest.approx(0.6)
    assert tables((90, 10), (50, 50)).child_probabilities() == (1.0, 1.0)  # households allow at most a third
    assert tables((30, 70), (100,)).child_probabilities() == (0.0, 0.0)  # nobody lives with anyone
    assert tables((30, 70), (20, 30, 30, 20), child_share=(0.5, 0.5)).child_probabilities() == (0.5, 0.5)
    young = synthesize(40_000, seed=3, tables=middle, people_per_locality=4000)
    assert abs(float((young.age < 18).double().mean()) - 0.3) < 0.01


def test_schools_workplaces_and_community(pop):
    t = PopulationTables()
    pupil = pop.school >= 0
    in_band = torch.zeros_like(pupil)
    for a, b in t.school_bands:
        in_band |= (pop.age >= a) & (pop.age <= b)
    assert torch.equal(pupil, in_band)
    assert torch.equal(pop.school[pupil] >> 32, pop.locality[pupil].long())  # schools of the home locality
    worker = pop.work >= 0
    assert bool(((pop.age[worker] >= t.adult_age) & (pop.age[worker] < t.retirement_age)).all())
    working_age = (pop.age >= t.adult_age) & (pop.age < t.retirement_age)
    rate = float(worker.sum()) / float(working_age.sum())
    assert abs(rate - t.employment_rate) < 0.01
    away = float(((pop.work[worker] >> 32) != pop.locality[worker].long()).double().mean())
    assert abs(away - t.commute) < 0.01
    _, size = torch.unique(pop.work[worker], return_counts=True)
    assert int(size.max()) <= t.workplace_max and int(size.max()) > 100  # heavy tailed
    assert float(size.double().median()) <= 3
    assert torch.equal(pop.community >> 32, pop.locality.long())
    assert pop.nbytes() / N == 46


def test_partition_balances_people_and_cuts_only_commuting(pop):
    big = synthesize(400_000, seed=1, people_per_locality=400)  # 1024 localities
    for world in (2, 4, 8):
        owner = partition_localities(big.localities, world)
        people = torch.bincount(owner.index_select(0, big.locality.long()), minlength=world)
        assert int(people.min()) > 0 and float(people.max()) / float(people.float().mean()) < 1.05
        cut = edge_cut(big, owner)
        assert cut["household"] == cut["school"] == cut["community"] == 0.0
        assert 0 < cut["work"] < 0.5 and cut["all"] < 0.1
    assert torch.equal(partition_localities(big.localities, 1), torch.zeros(big.localities.n_localities,
                                                                            dtype=torch.int64))


def test_tables_from_csv_and_their_errors(tmp_path):
    ages = tmp_path / "ages.csv"
    ages.write_text("# mine\nage_from,age_to,percent\n0,17,30\n18,64,55\n65,90,15\n")
    households = tmp_path / "hh.csv"
    households.write_text("size,percent\n1,50\n2,50\n")
    tables = PopulationTables(ages=AgePyramid.from_csv(ages), households=HouseholdSizes.from_csv(households))
    small = synthesize(5000, seed=1, tables=tables, people_per_locality=1000)
    assert int(torch.unique(small.household, return_counts=True)[1].max()) <= 2
    bad = tmp_path / "bad.csv"
    bad.write_text("age,percent\n0,1\n")
    with pytest.raises(ConfigError, match="expected the columns age_from, age_to, percent"):
        AgePyramid.from_csv(bad)
    bad.write_text("age_from,age_to,percent\n0,10,x\n")
    with pytest.raises(ConfigError, match="line 2: expected 3 numbers"):
        AgePyramid.from_csv(bad)
    bad.write_text("age_from,age_to,percent\n0,10,5\n12,20,5\n")
    with pytest.raises(ConfigError, match="contiguous bands"):
        AgePyramid.from_csv(bad)
    with pytest.raises(ConfigError, match="increasing sizes"):
        HouseholdSizes((2, 1), (1.0, 1.0))
    with pytest.raises(ConfigError, match="commute: expected in"):
        PopulationTables(commute=1.5)
    with pytest.raises(ConfigError, match=r"school_bands: expected .* not overlapping \(got \(\(5, 10\), \(10, "):
        PopulationTables(school_bands=((5, 10), (10, 12)))


def test_bad_arguments():
    with pytest.raises(ConfigError, match="n >= 1"):
        synthesize(0)
    with pytest.raises(ConfigError, match="locality ids are 0 .. 3"):
        synthesize(1000, people_per_locality=300, localities=torch.tensor([7]))
    with pytest.raises(ConfigError, match="world_size >= 1"):
        partition_localities(synthesize(100).localities, 0)


@pytest.mark.parametrize("layer", ["household", "school", "work", "community"])
def test_memberships_number_the_places_and_list_their_members(pop, layer):
    m = pop.memberships(layer)
    ids = pop.layer(layer)
    has = ids >= 0
    assert torch.equal(m.place == m.n_places, ~has)
    # the same places: two people share a number exactly when they share an id
    pairs = torch.unique(torch.stack([ids[has], m.place[has].long()], 1), dim=0)
    assert pairs.shape[0] == torch.unique(ids[has]).numel() == torch.unique(m.place[has]).numel()
    assert torch.equal(m.size[:-1].long(), torch.bincount(m.place[has].long(), minlength=m.n_places))
    assert int(m.size[-1]) == 0 and int(m.start[-1]) == int(has.sum())
    k = int(m.place[has][len(m.place[has]) // 2])  # one place's list: its members, ascending
    got = m.members[m.start[k]:m.start[k + 1]].long()
    assert torch.equal(got, pop.uid[m.place == k])


@pytest.mark.parametrize("layer", ["household", "school", "work", "community"])
def test_compact_place_ids_keep_places_apart_and_are_the_same_for_any_share(layer):
    pop = synthesize(6000, seed=3, people_per_locality=1000)
    ids, compact = pop.layer(layer), pop.compact(layer)
    assert compact.dtype == torch.int32
    assert torch.equal(compact < 0, ids < 0)
    pairs = torch.unique(torch.stack([ids, compact.long()], 1), dim=0)  # one compact id per place and back
    assert torch.unique(pairs[:, 0]).numel() == torch.unique(pairs[:, 1]).numel() == pairs.shape[0]
    owner = partition_localities(pop.localities, 3)
    parts = [synthesize(6000, seed=3, people_per_locality=1000, localities=torch.nonzero(owner == r).flatten())
             for r in range(3)]
    joined = torch.cat([p.compact(layer) for p in parts])[torch.argsort(torch.cat([p.uid for p in parts]))]
    assert torch.equal(joined, compact)


@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_metis_partition_balances_people_and_cuts_few_commuters(pop, world_size):
    pytest.importorskip("pymetis")  # the metis extra (in dev)
    grid = pop.localities
    owner = partition_localities(grid, world_size, "metis")
    assert torch.equal(owner, partition_localities(grid, world_size, "metis"))  # the same on every process
    assert owner.shape == (grid.n_localities,) and sorted(set(owner.tolist())) == list(range(world_size))
    people = torch.zeros(world_size, dtype=torch.float64).index_add_(0, owner, grid.population.double())
    assert float(people.max() / people.mean()) < 1.35
    cut = edge_cut(pop, owner)
    assert cut["household"] == 0 and cut["community"] == 0  # whole localities
    scattered = torch.randperm(grid.n_localities, generator=torch.Generator().manual_seed(1)) % world_size
    assert cut["all"] < 0.5 * edge_cut(pop, scattered)["all"]  # neighbors kept together


def test_partition_methods_are_checked(pop, monkeypatch):
    import sys

    with pytest.raises(ConfigError, match="unknown method 'kahip'; valid: rcb, metis"):
        partition_localities(pop.localities, 2, "kahip")
    monkeypatch.setitem(sys.modules, "pymetis", None)  # as without the extra
    with pytest.raises(ConfigError, match=r"needs pymetis: pip install 'agentsim\[metis\]'"):
        partition_localities(pop.localities, 2, "metis")
    assert partition_localities(pop.localities, 2).shape == (pop.localities.n_localities,)  # rcb needs nothing
