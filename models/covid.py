"""A Covasim-class COVID-19 model on a synthetic population: SEIR with age-dependent
susceptibility and severity, asymptomatic and symptomatic branches, transmission within
households, schools, workplaces and community venues, and interventions that switch on by day.

People come from :func:`agentsim.population.synthesize` (ages, households, schools, workplaces,
community venues on a grid of localities). Contacts are memberships in places: each day, with
``c_l(p)`` the infectious members of place ``p`` of layer ``l`` (symptomatic ones count 1,
asymptomatic ones ``asymptomatic_factor``, isolated ones ``isolation_factor`` of that outside
their household) and ``m_l(p)`` its members, a susceptible person of age ``a`` is exposed with
probability ``1 - exp(-sus(a) * v * sum_l f_l(p))``, where

- ``f_household = beta_household * c`` (per infectious housemate),
- ``f_l = beta_l * c / max(m - 1, 1)`` for school, work and community (frequency dependent:
  ``beta_l`` is the daily rate of a person whose every place-mate is infectious),
- ``v = 1 - vaccine_efficacy`` for the vaccinated, 1 otherwise.

The course of an infection, one draw a day per state (mean durations, geometric):

- exposed (E) becomes infectious after ``latent_days`` on average: symptomatic (I) with
  probability ``symp(a)``, else asymptomatic (A);
- A recovers (R) after ``infectious_days``; I leaves after ``infectious_days``: severe (H, in
  hospital: infects nobody) with probability ``severe(a) / symp(a)``, else R;
- H leaves after ``severe_days``: dead (D) with probability ``death(a) / severe(a)``, else R.

Age tables (per decade of age, the last 90+) are Covasim's default prognoses (Kerr et al. 2021,
PLoS Comput Biol; after Verity et al. 2020 and Ferguson et al. 2020), as absolute probabilities
per infection; the betas are Covasim's per-contact beta 0.016 times its layer weights (household
3, school 0.6, work 0.6, community 0.3) and contacts per day (school 20, work 16, community 20).

Interventions (days counted from 0, the first step; the metrics' row ``d + 1`` is the state after
day ``d``; -1: never): schools closed from ``school_close_day`` to
``school_open_day``; work transmission times ``work_from_home`` from ``work_from_home_day``;
from ``test_day`` a symptomatic person is tested each day with probability ``test_rate`` and
isolates until no longer infectious; from ``vaccine_day`` each susceptible person aged
``vaccine_min_age`` or more is vaccinated each day with probability ``vaccine_rate``.

Counts per place are integers (``bincount``) and every draw is keyed by uid: the same days on any
number of processes. ``exp`` is :func:`agentsim.core.portable.exp`: the same bits on a GPU.
"""

from __future__ import annotations

import torch

from agentsim import ConfigError, Context, Grid, InitContext, MetricsContext, Model, Param
from agentsim.core import ops, portable
from agentsim.population import LAYERS, locality_grid, partition_localities, synthesize

S, E, A, I, H, R, D = range(7)  # noqa: E741  the compartments
STATES = ("S", "E", "A", "I", "H", "R", "D")

# Per decade of age (0-9, ..., 80-89, 90+): Covasim's default prognoses, per infection.
SUSCEPTIBILITY = (0.34, 0.67, 1.00, 1.00, 1.00, 1.00, 1.24, 1.47, 1.47, 1.47)
SYMPTOMATIC = (0.50, 0.55, 0.60, 0.65, 0.70, 0.75, 0.80, 0.85, 0.90, 0.90)
SEVERE = (0.00050, 0.00165, 0.00720, 0.02080, 0.03430, 0.07650, 0.13280, 0.20655, 0.24570, 0.24570)
DEATH = (0.00002, 0.00002, 0.00010, 0.00032, 0.00098, 0.00265, 0.00766, 0.02439, 0.08292, 0.16190)

model = Model(
    "covid",
    params={
        "beta_household": Param(0.048, "daily infection rate per infectious housemate", ge=0),
        "beta_school": Param(0.192, "daily rate when every school-mate is infectious", ge=0),
        "beta_work": Param(0.154, "daily rate when every co-worker is infectious", ge=0),
        "beta_community": Param(0.096, "daily rate when every venue-mate is infectious", ge=0),
        "asymptomatic_factor": Param(1.0, "infectiousness of an asymptomatic case (symptomatic: 1)", ge=0),
        "latent_days": Param(4.5, "mean days from exposure to infectiousness", ge=1),
        "infectious_days": Param(8.0, "mean days infectious (A and I)", ge=1),
        "severe_days": Param(14.0, "mean days severe (H)", ge=1),
        "initial_prevalence": Param(0.001, "share of people exposed at day 0", ge=0, le=1),
        "people_per_locality": Param(10_000, "mean people per locality of the synthetic population", ge=1),
        "locality_spread": Param(0.8, "spread of the localities' densities (log scale)", ge=0),
        "school_close_day": Param(-1, "first day schools are closed (-1: never)", ge=-1),
        "school_open_day": Param(-1, "first day schools are open again (-1: never)", ge=-1),
        "work_from_home_day": Param(-1, "first day of working from home (-1: never)", ge=-1),
        "work_from_home": Param(0.5, "work transmission kept while working from home", ge=0, le=1),
        "test_day": Param(-1, "first day symptomatic people are tested (-1: never)", ge=-1),
        "test_rate": Param(0.2, "daily probability a symptomatic person is tested", ge=0, le=1),
        "isolation_factor": Param(0.1, "transmission kept outside the household by an isolated case", ge=0, le=1),
        "vaccine_day": Param(-1, "first day of vaccination (-1: never)", ge=-1),
        "vaccine_rate": Param(0.01, "daily probability an eligible susceptible person is vaccinated", ge=0, le=1),
        "vaccine_min_age": Param(60, "youngest age vaccinated (years)", ge=0),
        "vaccine_efficacy": Param(0.9, "protection of the vaccinated against infection", ge=0, le=1),
    },
    description="COVID-19 on a synthetic population: age-dependent SEIR in households, schools, workplaces, "
                "communities, with interventions",
    default_agents=100_000,
)


def decade(age: torch.Tensor) -> torch.Tensor:
    """Index into the per-decade tables: ``min(age // 10, 9)``, int64."""
    return torch.clamp(torch.div(age.to(torch.int64), 10, rounding_mode="floor"), max=9)


def per_age(table: tuple[float, ...], age: torch.Tensor) -> torch.Tensor:
    """``table[decade(age)]`` as float64, one per person."""
    return torch.tensor(table, dtype=torch.float64, device=age.device).index_select(0, decade(age))


def active(day: int, start: int, stop: int = -1) -> bool:
    """Whether an intervention starting on ``start`` (-1: never) and ending on ``stop`` (-1: never) is on."""
    return start >= 0 and day >= start and (stop < 0 or day < stop)


@model.substep(reads=["person.state", "person.age", "person.isolated"], writes=["person.state", "person.isolated"])
def progress(ctx: Context) -> None:
    """E -> A or I, A -> R, I -> H or R, H -> D or R: one draw of leaving and one of the branch."""
    p, people = ctx.params, ctx["person"]
    state = people["state"]
    sick = ops.flatnonzero((state >= E) & (state <= H))  # draws keyed by uid: drawing for these alone is the same
    now, age = state.index_select(0, sick), people["age"].index_select(0, sick)
    u = ctx.rng.uniform(people["uid"].index_select(0, sick), draws=2, dtype=torch.float64)
    leave, branch = u[:, 0], u[:, 1]
    symp, severe, death = per_age(SYMPTOMATIC, age), per_age(SEVERE, age), per_age(DEATH, age)
    mean_days = torch.where(now == E, p["latent_days"], torch.where(now == H, p["severe_days"], p["infectious_days"]))
    leaves = leave < 1.0 / mean_days
    after = torch.where(now == E, torch.where(branch < symp, I, A),
                        torch.where(now == A, R,
                                    torch.where(now == I, torch.where(branch < severe / symp, H, R),
                                                torch.where(branch < death / severe, D, R))))
    moved = ops.flatnonzero(leaves)
    rows = sick.index_select(0, moved)
    state.index_copy_(0, rows, after.index_select(0, moved).to(state.dtype))  # in place (declared writes)
    isolated = people["isolated"]
    isolated.index_copy_(0, rows, isolated.index_select(0, rows) & (state.index_select(0, rows) <= I))  # ends with I


# In a layer where the places holding an infectious person have few members (households, and
# most layers at the start and the end of an epidemic), those members are found through the
# places' member lists (ctx.group_index) instead of reading every susceptible person's place:
# the same hazards, added in the same layer order.
SPARSE_SHARE = 0.125  # a layer uses its lists while the members reached are below this share of the people


@model.substep(reads=["person.state", "person.age", "person.isolated", "person.vaccinated",
                      *(f"person.{layer}" for layer in LAYERS)],
               writes=["person.state"])
def transmit(ctx: Context) -> None:
    """S -> E with probability ``1 - exp(-hazard)``, the hazard summed over the person's places."""
    p, day, people = ctx.params, ctx.step - 1, ctx["person"]  # day 0: the first step
    state = people["state"]
    # the infectious, by kind: 0 symptomatic, 1 asymptomatic, + 2 when isolated; counted per place
    sick = ops.flatnonzero((state == I) | (state == A))
    kind = (state.index_select(0, sick) == A).to(torch.int64) + 2 * people["isolated"].index_select(0, sick)
    one_hot = torch.nn.functional.one_hot(kind, 4)
    betas = {"household": p["beta_household"], "school": p["beta_school"], "work": p["beta_work"],
             "community": p["beta_community"]}
    if active(day, p["school_close_day"], p["school_open_day"]):
        betas["school"] = 0.0
    if active(day, p["work_from_home_day"]):
        betas["work"] *= p["work_from_home"]
    hazard = torch.zeros(state.shape[0], dtype=torch.float64, device=state.device)
    susceptible: torch.Tensor | None = None
    for layer in LAYERS:  # in layer order: each person's sum in that order
        if betas[layer] == 0.0:
            continue
        # the places with an infectious member (on any process): infectious members by kind, all members
        places, c = ctx.group_totals(f"person.{layer}", sick, one_hot)
        index = ctx.group_index(f"person.{layer}")
        numbers = index.find(places)
        c = c.to(torch.float64)
        iso = 1.0 if layer == "household" else p["isolation_factor"]
        infectious = c[:, 0] + p["asymptomatic_factor"] * c[:, 1] + iso * (c[:, 2] + p["asymptomatic_factor"] * c[:, 3])
        force = betas[layer] * infectious
        if layer != "household":
            force = force / torch.clamp(index.size.index_select(0, numbers) - 1, min=1).to(torch.float64)
        if index.local_members(numbers) < SPARSE_SHARE * state.shape[0]:  # the members of these places
            rows, which = index.members(numbers)
            take = ops.flatnonzero(state.index_select(0, rows) == S)
            hazard.index_add_(0, rows.index_select(0, take), force.index_select(0, which.index_select(0, take)))
        else:  # every susceptible person's place
            if susceptible is None:
                susceptible = ops.flatnonzero(state == S)
            per_place = torch.zeros(index.ids.shape[0] + 1, dtype=torch.float64, device=state.device)
            per_place.index_copy_(0, numbers, force)  # the last entry: no place, 0
            at = index.of.index_select(0, susceptible)
            at = torch.where(at < 0, index.ids.shape[0], at)
            hazard.index_add_(0, susceptible, per_place.index_select(0, at))
    who = ops.flatnonzero(hazard > 0)
    vaccinated = people["vaccinated"].index_select(0, who)
    protection = torch.where(vaccinated, 1.0 - p["vaccine_efficacy"], 1.0)
    h = hazard.index_select(0, who) * per_age(SUSCEPTIBILITY, people["age"].index_select(0, who)) * protection
    u = ctx.rng.uniform(people["uid"].index_select(0, who), dtype=torch.float64)
    state.index_fill_(0, who.index_select(0, ops.flatnonzero(u < 1.0 - portable.exp(-h))), E)  # in place


@model.substep(reads=["person.state", "person.age", "person.isolated", "person.vaccinated"],
               writes=["person.isolated", "person.vaccinated"])
def interventions(ctx: Context) -> None:
    """Testing and isolation of symptomatic people; vaccination by age."""
    p, day, people = ctx.params, ctx.step - 1, ctx["person"]
    state, uid = people["state"], people["uid"]
    if active(day, p["test_day"]):
        ill = ops.flatnonzero((state == I) & ~people["isolated"])
        tested = ctx.rng.uniform(uid.index_select(0, ill), "test", dtype=torch.float64) < p["test_rate"]
        people["isolated"].index_fill_(0, ill.index_select(0, ops.flatnonzero(tested)), True)
    if active(day, p["vaccine_day"]):
        eligible = ops.flatnonzero((state == S) & ~people["vaccinated"] & (people["age"] >= p["vaccine_min_age"]))
        shot = ctx.rng.uniform(uid.index_select(0, eligible), "vaccine", dtype=torch.float64) < p["vaccine_rate"]
        people["vaccinated"].index_fill_(0, eligible.index_select(0, ops.flatnonzero(shot)), True)


@model.init
def init(ic: InitContext) -> Grid:
    """The synthetic population, ``initial_prevalence`` of it exposed; the space is the grid of
    localities (a person's ``cell``), so that the spatial partitioner gives each process whole
    localities, in regions of the map. Each process builds the people of its share of the
    localities (recursive bisection by population): the same people, ids and places on any number
    of processes, and no process holds the whole population.
    """
    p, n = ic.params, ic.n_agents
    if p["school_open_day"] >= 0 and p["school_open_day"] < p["school_close_day"]:
        raise ConfigError(f"covid: school_open_day ({p['school_open_day']}) is before school_close_day "
                          f"({p['school_close_day']})")
    rank, world_size = ic.share()
    people_per_locality, spread = int(p["people_per_locality"]), float(p["locality_spread"])
    grid = locality_grid(n, ic.seed, people_per_locality, spread)
    mine = ops.flatnonzero(partition_localities(grid, world_size) == rank)
    pop = synthesize(n, seed=ic.seed, people_per_locality=people_per_locality, spread=spread, localities=mine)
    uid = pop.uid
    exposed = ic.rng.uniform(uid, "seed_infections", dtype=torch.float64) < p["initial_prevalence"]
    places = {layer: narrow(layer, pop.layer(layer), grid.population) for layer in LAYERS}
    ic.add("person", uid=uid.to(ic.device), age=pop.age.to(ic.device), cell=pop.locality.to(ic.device),
           state=torch.where(exposed, E, S).to(torch.int8).to(ic.device),
           isolated=torch.zeros(len(pop), dtype=torch.bool, device=ic.device),
           vaccinated=torch.zeros(len(pop), dtype=torch.bool, device=ic.device),
           **{k: v.to(ic.device) for k, v in places.items()})  # place ids, -1 for none
    return Grid(grid.shape, periodic=False)  # a person's cell: their locality


def narrow(layer: str, ids: torch.Tensor, population: torch.Tensor) -> torch.Tensor:
    """A layer's place ids (``[n]`` int64 from :func:`agentsim.population.synthesize`, -1 for none) as
    int32 where they fit, for memory: a household's id is its first member's uid; another place's,
    ``(locality << 32) | number`` (a school's number ``(band << 24) | k``) becomes
    ``locality * K + number`` (schools ``(locality * 256 + band) * K + k``), ``K`` the most people a
    locality has (no locality has more places of a kind than people). Ids stay distinct and the
    same on any number of processes (``population``: the people of every locality).
    """
    people = int(population.max()) + 1 if population.numel() else 1
    if layer == "household":
        top = int(population.sum())
        return ids.to(torch.int32) if top < 2**31 else ids
    slots = population.shape[0] * people * (256 if layer == "school" else 1)
    if slots >= 2**31:
        return ids
    some = ids >= 0
    low, locality = ids & 0xFFFFFFFF, ids >> 32
    if layer == "school":
        locality, low = locality * 256 + (low >> 24), low & 0xFFFFFF
    return torch.where(some, locality * people + low, -1).to(torch.int32)


def _compartment(code: int, label: str, color: str) -> None:
    """Declare the metric counting the people in compartment ``code``."""
    @model.metric(name=STATES[code], label=label, color=color, panel="compartments", share_of=list(STATES),
                  unit="fraction of the population")
    def count(state: MetricsContext) -> torch.Tensor:
        return state["person"]["state"] == code
    count.__doc__ = f"People {label}."


for _code, _label, _color in [(S, "susceptible", "tab:blue"), (E, "exposed", "tab:orange"),
                              (A, "asymptomatic", "tab:olive"), (I, "symptomatic", "tab:red"),
                              (H, "severe", "tab:purple"), (R, "recovered", "tab:green"), (D, "dead", "black")]:
    _compartment(_code, _label, _color)


@model.metric(label="isolated", color="tab:gray", panel="interventions")
def isolated(state: MetricsContext) -> torch.Tensor:
    """People isolating after a positive test."""
    return state["person"]["isolated"]


@model.metric(label="vaccinated", color="tab:cyan", panel="interventions")
def vaccinated(state: MetricsContext) -> torch.Tensor:
    """People vaccinated."""
    return state["person"]["vaccinated"]


MODEL = model
