"""The Covasim-class model (models/covid.py): its rules, its interventions, its invariance."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from agentsim import ConfigError, Simulation, get_model
from agentsim.runner.invariance import check_model

AGENTS, DAYS = 8000, 60


def run(**params):
    return Simulation(get_model("covid"), agents=AGENTS, seed=2, params={"initial_prevalence": 0.005, **params})


@pytest.fixture(scope="module")
def baseline():
    sim = run()
    return sim, sim.run(DAYS).metrics


def final_size(metrics) -> int:
    return AGENTS - int(metrics["S"][-1])


def test_compartments_add_up_and_flow_one_way(baseline):
    sim, m = baseline
    total = sum(m[k] for k in ("S", "E", "A", "I", "H", "R", "D"))
    assert np.all(total == AGENTS)
    assert np.all(np.diff(m["S"]) <= 0) and np.all(np.diff(m["D"]) >= 0) and np.all(np.diff(m["R"]) >= 0)
    assert final_size(m) > 0.2 * AGENTS  # an epidemic with Covasim's default transmission
    people = sim.state["person"]
    dead = people["state"] == 6
    assert int(dead.sum()) == int(m["D"][-1])
    assert float(people["age"][dead].float().mean()) > float(people["age"].float().mean())  # severity rises with age


@pytest.mark.parametrize("params", [
    {"school_close_day": 0},
    {"work_from_home_day": 0, "work_from_home": 0.2},
    {"test_day": 0, "test_rate": 0.5, "isolation_factor": 0.0},
    {"vaccine_day": 0, "vaccine_rate": 0.2, "vaccine_min_age": 0, "vaccine_efficacy": 0.9},
])
def test_each_intervention_lowers_the_final_size(baseline, params):
    assert final_size(run(**params).run(DAYS).metrics) < final_size(baseline[1])


def test_no_transmission_without_betas():
    m = run(beta_household=0.0, beta_school=0.0, beta_work=0.0, beta_community=0.0).run(30).metrics
    assert int(m["S"][-1]) == int(m["S"][0])


def test_interventions_switch_on_and_off_by_day():
    sim = run(test_day=10, test_rate=1.0, vaccine_day=5, vaccine_rate=0.5, vaccine_min_age=60)
    m = sim.run(20).metrics
    assert int(m["isolated"][:11].sum()) == 0 and int(m["isolated"][11:].max()) > 0  # row d + 1: after day d
    assert int(m["vaccinated"][5]) == 0 and int(m["vaccinated"][6]) > 0
    people = sim.state["person"]
    assert int(people["age"][people["vaccinated"]].min()) >= 60


def test_bad_intervention_days_are_refused():
    with pytest.raises(ConfigError, match="school_open_day .* is before school_close_day"):
        run(school_close_day=20, school_open_day=10)


def test_a_country_of_ones_own_from_csv_files(tmp_path):
    ages, households = tmp_path / "ages.csv", tmp_path / "households.csv"
    ages.write_text("# a young country\nage_from,age_to,percent\n0,14,50\n15,64,48\n65,99,2\n")
    households.write_text("size,percent\n4,50\n6,50\n")
    sim = run(age_pyramid=str(ages), household_sizes=str(households))
    sim.run(1)
    people = sim.state["person"]
    children, old = float((people["age"] <= 14).float().mean()), float((people["age"] >= 65).float().mean())
    assert children > 0.4 and old < 0.04  # the shipped US table gives about 24% and 15%
    sizes = torch.unique(people["household"], return_counts=True)[1]
    assert set(sizes.tolist()) <= {4, 6, 2, 1, 3, 5}  # 4 and 6; a locality's last household takes the rest
    assert float((sizes >= 4).float().mean()) > 0.9
    with pytest.raises(ConfigError, match=r"covid: household_sizes: cannot read .*nowhere.csv.*No such file"):
        run(household_sizes=str(tmp_path / "nowhere.csv"))
    with pytest.raises(ConfigError, match=r"covid: age_pyramid: .*households.csv, line 1: expected the columns "
                                          r"age_from, age_to, percent"):
        run(age_pyramid=str(households))


@pytest.mark.long
@pytest.mark.timeout(300)
def test_same_days_on_one_to_four_processes():
    params = {"initial_prevalence": 0.2, "test_day": 2, "vaccine_day": 1,  # and people in hospital by day 4:
              "latent_days": 1.5, "presymptomatic_days": 1.0, "onset_to_severe_days": 1.5,
              "people_per_locality": 100}  # 16 localities: every process holds people
    report = check_model("covid", agents=1500, steps=8, world_sizes=(1, 2, 4), params=params)
    assert report.identical, report.summary()
    one = Simulation(get_model("covid"), agents=1500, seed=1, params=params).run(8).metrics  # check_model's seed
    assert int(np.max(one["H"])) >= 5 and int(np.max(one["isolated"])) > 0


@pytest.mark.timeout(300)
def test_contact_groups_give_the_same_days_on_one_to_four_processes():
    params = {"initial_prevalence": 0.05, "contact_groups": 3, "contacts_per_group": 2.0, "people_per_locality": 300,
              "community_size": 40}  # small localities: workplaces (and so contact groups) span processes
    report = check_model("covid", agents=1500, steps=8, world_sizes=(1, 2, 3, 4), params=params)
    assert report.identical, report.summary()


def test_contact_groups_split_each_place_into_groups_of_about_the_contacts_asked():
    k, g = 4, 3.0
    sim = Simulation(get_model("covid"), agents=6000, seed=3, params={"contact_groups": k, "contacts_per_group": g,
                                                                       "people_per_locality": 3000})
    sim.run(1)
    people = sim.state["person"]
    for layer in ("school", "work", "community"):
        place, contacts = people[layer].to(torch.int64), people[f"{layer}_contacts"]
        assert contacts.shape == (6000, k)
        has = place >= 0
        assert bool((contacts[~has] == -1).all()) and bool((contacts[has] >= 0).all())
        assert torch.equal(contacts[has] >> 32, place[has].unsqueeze(1).expand(-1, k))  # within the person's place
        places, size = torch.unique(place[has], return_counts=True)
        groups, members = torch.unique(contacts[has], return_counts=True)
        want = torch.clamp(torch.round(k * (size - 1).double() / g), min=1)  # groups per place, at most
        per_place = torch.bincount(torch.searchsorted(places, groups >> 32), minlength=places.shape[0])
        assert bool((per_place <= want).all())
        big = (size.index_select(0, torch.searchsorted(places, groups >> 32)) > 50)  # places of more than 50
        others = (members[big].double() ** 2).sum() / members[big].sum() - 1  # a member's others, on average
        assert abs(float(others) - g) < 0.15 * g, (layer, float(others))
    none = Simulation(get_model("covid"), agents=600, seed=3).run(1)
    assert none.state["person"]["work_contacts"].shape == (600, 0)  # no contact groups: no memory


@pytest.mark.parametrize("groups", [0, 2])
def test_a_run_records_its_people_with_or_without_contact_groups(tmp_path, groups):
    from agentsim.io import read_trajectory

    out = tmp_path / "covid.h5"
    Simulation(get_model("covid"), agents=800, seed=1, params={"contact_groups": groups}).run(2, out=str(out))
    traj = read_trajectory(out)
    recorded = traj.fields("person")
    assert ("work_contacts" in recorded) == bool(groups)  # a field of no columns has nothing to record
    if groups:
        assert traj.agents("person", "work_contacts")["work_contacts"].shape == (800, groups)


def test_contact_groups_without_households_or_with_ids_too_wide_for_them(monkeypatch):
    params = {"contact_groups": 2, "beta_household": 0.0, "initial_prevalence": 0.05}
    m = Simulation(get_model("covid"), agents=1500, seed=2, params=params).run(10).metrics
    assert int(m["S"][0] - m["S"][-1]) > 20  # infected through contact groups alone
    from agentsim.population import synthetic

    with monkeypatch.context() as patched:  # place ids of int64, as beyond about 10M people in 10,000 localities
        patched.setattr(synthetic, "_compact_dtype", lambda layer, localities, slots=None: torch.int64)
        with pytest.raises(ConfigError, match=r"contact_groups: the school, work, community ids .*do not fit int32"):
            Simulation(get_model("covid"), agents=1500, seed=2, params={"contact_groups": 2})
    with pytest.raises(Exception, match=r"2\*\*32 contact groups or more"):
        Simulation(get_model("covid"), agents=1500, seed=2,
                   params={"contact_groups": 64, "contacts_per_group": 1e-9}).run(1)


def test_exposure_drawn_block_by_block_gives_the_same_days(baseline, monkeypatch):
    """transmit draws the exposure of a block of people at a time: any block size, the same bits."""
    import agentsim.models.covid as covid

    monkeypatch.setattr(covid, "BLOCK", 777)
    sim = run()
    metrics = sim.run(DAYS).metrics
    assert all(np.array_equal(metrics[k], baseline[1][k]) for k in metrics)
    assert final_size(metrics) > 100


def hard_uniforms(cdf: torch.Tensor, g: torch.Generator, n: int) -> torch.Tensor:
    """``n`` uniforms, and those where a guided draw can go wrong: on each boundary of ``cdf``, just
    below it, and in the far tail."""
    edges = cdf[:-1]
    return torch.cat([torch.rand(n, generator=g, dtype=torch.float64), edges,
                      torch.nextafter(edges, torch.zeros(1, dtype=torch.float64)),
                      1.0 - torch.rand(5_000, generator=g, dtype=torch.float64) * 1e-7,
                      torch.tensor([0.0, 1.0 - 2.0**-53], dtype=torch.float64)])


def test_guide_draws_the_days_of_searchsorted():
    from agentsim.models.covid import draw_days, duration_table

    g = torch.Generator().manual_seed(4)
    for mean, sd in [(4.5, 1.5), (1.1, 0.9), (18.1, 6.3), (12.2, 5.2), (3.0, 0.0), (0.3, 0.1), (1000.0, 1000.0)]:
        table = duration_table(mean, sd)
        u = hard_uniforms(table.cdf, g, 50_000)
        want = (torch.searchsorted(table.cdf, u, right=True) + 1).to(torch.int16)
        assert torch.equal(draw_days(table, u), want), (mean, sd)


def test_durations_follow_covasims_lognormals():
    from agentsim.models.covid import draw_days, duration_table

    u = (torch.arange(200_000, dtype=torch.float64) + 0.5) / 200_000  # an even grid of uniforms
    days = draw_days(duration_table(8.0, 2.0), u).double()
    assert int(days.min()) >= 1 and abs(float(days.mean()) - 8.0) < 0.05 and abs(float(days.std()) - 2.0) < 0.1
    assert draw_days(duration_table(3.0, 0.0), u[:5]).tolist() == [3] * 5  # no spread: always the mean


def test_init_builds_a_share_per_process_and_refuses_local_uids():
    from agentsim.core.context import InitContext
    from agentsim.core.params import Params
    from agentsim.core.random import CounterRNG

    ic = InitContext(Params({}), 10, CounterRNG(1).at(0, "init"), torch.device("cpu"), rank=1, world_size=3)
    assert ic.share() == (1, 3)
    with pytest.raises(ConfigError, match="after share"):
        ic.uids("person", 4)
    other = InitContext(Params({}), 10, CounterRNG(1).at(0, "init"), torch.device("cpu"))
    other.uids("person", 4)
    with pytest.raises(ConfigError, match="share\\(\\) after uids"):
        other.share()


@pytest.mark.timeout(120)
def test_the_reported_contact_cut_is_the_population_edge_cut():
    """The run's cut (pairs of place-mates on two processes) against a count over the whole population."""
    from agentsim import launch
    from agentsim.population import edge_cut, locality_grid, partition_localities, synthesize

    n, params = 20_000, {"people_per_locality": 2000}
    result = launch("covid", world_size=2, agents=n, steps=1, seed=4, params=params)
    pop = synthesize(n, seed=4, people_per_locality=2000)
    want = edge_cut(pop, partition_localities(locality_grid(n, 4, 2000), 2))
    for layer in ("household", "school", "work", "community"):
        assert result.groups[f"groups/person.{layer}/contact_cut_share"] == pytest.approx(want[layer], abs=1e-12)
    assert result.groups["groups/contact_cut_share"] == pytest.approx(want["all"], abs=1e-12)
    assert 0 < want["work"] < 0.5  # commuters across the border


@pytest.mark.slow  # three processes; a METIS share is any share of whole localities (tests/test_population.py)
@pytest.mark.timeout(120)
def test_a_metis_partition_gives_the_same_days():
    pytest.importorskip("pymetis")
    from agentsim import launch
    from agentsim.population import edge_cut, locality_grid, partition_localities, synthesize

    n, params = 20_000, {"people_per_locality": 2000, "initial_prevalence": 0.01, "locality_partition": "metis"}
    one = Simulation(get_model("covid"), agents=n, seed=4, params=params).run(6)
    three = launch("covid", world_size=3, agents=n, steps=6, seed=4, params=params)
    assert all(np.array_equal(one.metrics[k], three.metrics[k]) for k in one.metrics)
    want = edge_cut(synthesize(n, seed=4, people_per_locality=2000),
                    partition_localities(locality_grid(n, 4, 2000), 3, "metis"))
    assert three.groups["groups/contact_cut_share"] == pytest.approx(want["all"], abs=1e-12) and want["all"] > 0


def test_the_days_of_a_state_are_drawn_apart_from_those_of_the_one_before(monkeypatch):
    """A 1-day latent period must not bring short infectious periods (one uniform per duration)."""
    import agentsim.models.covid as covid

    monkeypatch.setattr(covid, "SYMPTOMATIC", (0.0,) * 10)  # every case asymptomatic: A for infectious_days
    params = {"initial_prevalence": 1.0, "latent_days": 2.0, "latent_sd": 1.5, "infectious_days": 8.0,
              "infectious_sd": 2.0, **{f"beta_{k}": 0.0 for k in ("household", "school", "work", "community")}}
    m = Simulation(get_model("covid"), agents=20_000, seed=3, params=params).run(60).metrics
    assert m["R"][-1] == 20_000
    mean_days = float(np.sum(m["A"])) / 20_000  # each case is counted once per day in A
    assert abs(mean_days - 8.0) < 0.1


def test_transmissibility_is_covasims_negative_binomial():
    """Each person's infectiousness in hundredths: a negative binomial of mean 100 and dispersion k
    (variance 100 + 100**2 / k; Covasim's beta_dist), drawn through the guide as searchsorted would."""
    from agentsim.models.covid import TRANSMISSIBILITY_MAX, draw_days, transmissibility_table

    for k in (0.45, 1.0, 0.05):
        table = transmissibility_table(k)
        pmf = torch.diff(table.cdf, prepend=torch.zeros(1, dtype=torch.float64))
        values = torch.arange(pmf.shape[0], dtype=torch.float64)
        mean = float((pmf * values).sum())
        variance = float((pmf * (values - mean) ** 2).sum())
        assert mean == pytest.approx(100.0, rel=1e-8), k  # (at 0.05 the tail beyond 327.67 is folded in)
        assert variance == pytest.approx(100.0 + 100.0**2 / k, rel=1e-5), k
        assert float(pmf[0]) == pytest.approx((k / (k + 100.0)) ** k, rel=1e-12)  # infect nobody: 8.8% at 0.45
        for j in (1, 7, 100, 1000):  # the negative binomial's own formula
            log_p = (math.lgamma(j + k) - math.lgamma(k) - math.lgamma(j + 1) + k * math.log(k / (k + 100.0))
                     + j * math.log(100.0 / (k + 100.0)))
            assert float(pmf[j]) == pytest.approx(math.exp(log_p), rel=1e-9), (k, j)
        u = hard_uniforms(table.cdf, torch.Generator().manual_seed(5), 20_000)
        drawn = draw_days(table, u).long() - 1
        assert torch.equal(drawn, torch.searchsorted(table.cdf, u, right=True))
        assert int(drawn.min()) >= 0 and int(drawn.max()) <= TRANSMISSIBILITY_MAX  # no int16 wrap
    assert draw_days(transmissibility_table(0.0), torch.tensor([0.0, 0.5, 1 - 2**-53], dtype=torch.float64)).tolist() \
        == [101] * 3  # no spread: everyone the mean
    for bad in (0.01, 2e6, math.inf):
        with pytest.raises(ConfigError, match=r"dispersion: expected 0 or a value in \[0.05, 1e\+06\] \(got "):
            run(transmissibility_dispersion=bad)
    poisson = transmissibility_table(1e6)  # nearly Poisson(100)
    assert float(torch.diff(poisson.cdf)[99]) == pytest.approx(math.exp(99 * math.log(100) - 100 - math.lgamma(100)),
                                                               rel=1e-3)


def test_each_person_has_a_transmissibility_for_life(baseline):
    sim, _ = baseline
    weight = sim.state["person"]["transmissibility"]
    assert weight.dtype == torch.int16
    assert float(weight.double().mean()) == pytest.approx(100, rel=0.1)
    assert 0.06 < float((weight == 0).double().mean()) < 0.12  # 8.8% of people infect nobody
    alike = run(transmissibility_dispersion=0.0)
    assert torch.all(alike.state["person"]["transmissibility"] == 100)
    assert final_size(alike.run(DAYS).metrics) > final_size(baseline[1])  # superspreading wastes infections


def test_severe_cases_infect_unless_hospitals_isolate_them(monkeypatch):
    """Every case severe, 2 days in I and 18 in hospital: nearly all its infections come from H."""
    import agentsim.models.covid as covid

    monkeypatch.setattr(covid, "SYMPTOMATIC", (1.0,) * 10)
    monkeypatch.setattr(covid, "SEVERE", (1.0,) * 10)
    params = {"presymptomatic_days": 1.0, "presymptomatic_sd": 0.0, "onset_to_severe_days": 1.0,
              "onset_to_severe_sd": 0.0, "severe_days": 18.0, "severe_sd": 0.0}
    infectious = final_size(run(**params).run(DAYS).metrics)
    isolating = final_size(run(severe_factor=0.0, **params).run(DAYS).metrics)
    assert isolating < 0.1 * AGENTS < 0.5 * AGENTS < infectious


def test_isolation_lasts_through_hospital():
    sim = run(test_day=0, test_rate=0.3, onset_to_severe_days=2.0)
    people = sim.state["person"]
    isolated_in_hospital = 0
    for _ in range(40):
        before = people["isolated"].clone()
        sim.run(1)
        ill = (people["state"] == 3) | (people["state"] == 4)  # I or H
        assert torch.all(people["isolated"][before & ill])  # no one leaves isolation while I or H
        assert not torch.any(people["isolated"] & ~ill)  # and everyone leaves it after
        isolated_in_hospital += int((before & (people["state"] == 4)).sum())
    assert isolated_in_hospital > 0


def test_school_ages_and_adult_age_define_who_goes_to_school():
    sim = run(school_ages="6-21", adult_age=22)
    people = sim.state["person"]
    pupils = people["age"][people["school"] >= 0]
    assert int(pupils.min()) == 6 and int(pupils.max()) == 21
    assert int(people["age"][people["work"] >= 0].min()) == 22
    assert not bool((run(school_ages="").state["person"]["school"] >= 0).any())  # no schools
    for bad in ("6-,7-9", "5-²"):
        with pytest.raises(ConfigError, match=r"^covid: school_ages: expected inclusive age ranges such as "
                                              rf"'5-10,11-13,14-17' \(got '[^']+' in '{bad}'\)$"):
            run(school_ages=bad)
    with pytest.raises(ConfigError, match=r"^covid: school_ages: '5-18' reaches adult_age 18; expected school ages "
                                          r"younger than adult_age \(raise adult_age, or end the range at 17\)$"):
        run(school_ages="5-18")
    with pytest.raises(ConfigError, match=r"^covid: school_ages: '10-12' overlaps 5-10 in '5-10,10-12'; expected "
                                          "levels that do not overlap$"):
        run(school_ages="5-10,10-12")


def test_critical_cases_stay_in_hospital_for_the_critical_days(monkeypatch):
    """Half the cases severe; of those, 60% critical and 20% dying (one draw decides both): the
    dying stay dying_days, the critical who recover critical_days, the others severe_days."""
    import agentsim.models.covid as covid

    monkeypatch.setattr(covid, "SYMPTOMATIC", (1.0,) * 10)
    monkeypatch.setattr(covid, "SEVERE", (0.5,) * 10)
    monkeypatch.setattr(covid, "CRITICAL", (0.3,) * 10)
    monkeypatch.setattr(covid, "DEATH", (0.1,) * 10)
    sim = run(severe_days=6.0, severe_sd=0.0, critical_days=11.0, critical_sd=0.0, dying_days=3.0, dying_sd=0.0)
    state = sim.state["person"]["state"]
    days_in_hospital = torch.zeros(state.shape[0], dtype=torch.int64)
    admitted = torch.full((state.shape[0],), DAYS, dtype=torch.int64)  # the day each person came to hospital
    for day in range(DAYS):
        sim.run(1)
        in_hospital = state == covid.H
        admitted = torch.where(in_hospital & (admitted == DAYS), day, admitted)
        days_in_hospital += in_hospital
    ended = admitted < DAYS - 11  # the stays that ended, whatever their length
    died, recovered = days_in_hospital[ended & (state == covid.D)], days_in_hospital[ended & (state == covid.R)]
    assert died.shape[0] + recovered.shape[0] == int(ended.sum()) > 300
    assert set(died.unique().tolist()) == {3} and set(recovered.unique().tolist()) == {6, 11}
    assert 0.15 < died.shape[0] / int(ended.sum()) < 0.25  # death / severe = 0.2
    assert 0.4 < float((recovered == 11).double().mean()) < 0.6  # (critical - death) / (severe - death) = 0.5
