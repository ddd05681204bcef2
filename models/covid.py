"""A Covasim-class COVID-19 model on a synthetic population: SEIR with age-dependent
susceptibility and severity, asymptomatic and symptomatic branches, transmission within
households, schools, workplaces and community venues, and interventions that switch on by day.

People come from :func:`agentsim.population.synthesize` (ages, households, schools, workplaces,
community venues on a grid of localities). Contacts are memberships in places: each day, with
``c_l(p)`` the infectiousness of the infectious members of place ``p`` of layer ``l``
(symptomatic ones count 1, asymptomatic ones ``asymptomatic_factor``, severe ones
``severe_factor``, isolated ones ``isolation_factor`` of that outside their household; each times
their transmissibility, below) and ``m_l(p)`` its members, a susceptible person of age ``a`` is
exposed with probability ``1 - exp(-sus(a) * v * sum_l f_l(p))``, where

- ``f_household = beta_household * c`` (per infectious housemate),
- ``f_l = beta_l * c / max(m - 1, 1)`` for school, work and community (frequency dependent:
  ``beta_l`` is the daily rate of a person whose every place-mate is infectious),
- ``v = 1 - vaccine_efficacy`` for the vaccinated, 1 otherwise.

Each contact's daily chance of infection (``q``, in Covasim's terms) is used here as a rate: the
rates of a person's infectious contacts are added, and the person is infected with probability
``1 - exp(-sum q)``. Covasim uses the chance itself: one contact infects with probability ``q``,
several with ``1 - prod(1 - q)``. The two agree for small ``q`` and part for very infectious
housemates: 0.48 here against 0.65 in Covasim for one contact at ``q = 0.65``.

With ``contact_groups = k > 0``, a person meets only fixed contacts in their school, workplace
and community venue, as in a contact network (Covasim's random layers): on the first day each
member of a place of ``m`` members joins ``k`` of its ``max(1, round(k (m - 1) / g))`` groups
(``g = contacts_per_group``), each drawn keyed by uid, so that a person has about ``g`` others in
each group and ``k g`` contacts in the layer. The places' terms are then
``f_l = beta_l * c / (k g)`` per contact group (``c`` the group's infectiousness): each contact is
infected at the rate ``beta_l / (k g)``, and ``beta_l`` is the daily rate of a person whose
expected ``k g`` contacts are all infectious. Contacts, unlike place-mates, are used up as they
recover: final sizes are smaller than with mixing in the whole place.

The course of an infection: each state lasts a number of days drawn when it begins, from
Covasim's lognormal durations rounded to whole days (mean and standard deviation in days are
parameters; the defaults are Covasim's):

- exposed (E) becomes infectious after ``latent_days``: symptomatic (I) with probability
  ``symp(a)``, else asymptomatic (A);
- A recovers (R) after ``infectious_days``;
- I is severe with probability ``severe(a) / symp(a)``, decided as I begins: a severe case goes
  to hospital (H) after ``presymptomatic_days + onset_to_severe_days``, a mild one recovers
  after ``presymptomatic_days + infectious_days``;
- H dies (D) with probability ``death(a) / severe(a)``, decided as H begins, after
  ``dying_days`` (Covasim's days to intensive care, then to death); else recovers, after
  ``critical_days`` if the case is critical (probability ``critical(a) / severe(a)``, the dying
  included; Covasim's days to intensive care, then to recovery), else after ``severe_days``.
  A case in hospital infects its places
  until H ends, as in Covasim (``severe_factor``; 0 for hospitals that isolate their patients).

Infectiousness is higher early in an infection (Covasim's viral load): over the first
``ceil(min(early_share * D, early_max_days))`` of its ``D`` infectious days (A, or I) a case counts
``early_ratio / (1 + early_share * (early_ratio - 1))``, later ``1 / (1 + ...)``: about 1 on
average (exactly where the early days are ``early_share`` of the infectious days). A severe case's
early days are those of its days in I (Covasim counts them over its whole infectious period, H
included, with the same cap: a severe case there has 4 early days, here about 3). Some people
infect far more than others (superspreading): each person's infectiousness is also multiplied
for life by their ``transmissibility``, drawn once, keyed by uid, from Covasim's ``beta_dist``: a
negative binomial number of hundredths of mean 100 and dispersion ``transmissibility_dispersion``
(0.45: 8.8% of people infect nobody, and the most infectious fifth carry two thirds of all
infectiousness; 0: everyone 1).

Age tables (per decade of age, the last 90+) are Covasim's default prognoses (Kerr et al. 2021,
PLoS Comput Biol; after Verity et al. 2020 and Ferguson et al. 2020), as absolute probabilities
per infection; the betas are Covasim's per-contact beta 0.016 times its layer weights (household
3, school 0.6, work 0.6, community 0.3) and contacts per day (school 20, work 16, community 20).

Interventions (days counted from 0, the first step; the metrics' row ``d + 1`` is the state after
day ``d``; -1: never): schools closed from ``school_close_day`` to
``school_open_day``; work transmission times ``work_from_home`` from ``work_from_home_day``;
from ``test_day`` a symptomatic or severe person (I or H) is tested each day with probability
``test_rate`` and isolates until no longer infectious (as Covasim's diagnosed); from
``vaccine_day`` each susceptible person aged ``vaccine_min_age`` or more is vaccinated each day
with probability ``vaccine_rate``.

People read their place-mates only through sums per place (``ctx.group_table``: the infectiousness
of each place's infectious members, whatever process each member is on, counted in integer units of
``2**-24`` so that the sums are exact) and the places' sizes (``ctx.group_index``); each person's
places are read at once (``ops.gather_sum``); every draw is keyed by uid. Each process builds the
people of its own localities (``ic.share()``; whole localities by recursive bisection of the map by
population), so that no process holds the whole population and only places that span processes
(commuters' workplaces) exchange their counts: the same days on any number of processes
(``locality_partition="metis"``: a graph partition that cuts fewer commuters, the ``metis`` extra).
``exp`` is :func:`agentsim.core.portable.exp`: the same bits on a GPU. The population's parameters
(``community_size``, ``school_size``, ``school_ages``, ``adult_age``, ``employment_rate``,
``workplace_exponent``, ``people_per_locality``, ``locality_spread``) are those of
:class:`agentsim.population.PopulationTables` (``school_ages``: its ``school_bands`` written
``"5-10,11-13,14-17"``) and :func:`agentsim.population.synthesize`; ``age_pyramid`` and
``household_sizes`` name CSV files of one's own country's ages and household sizes (the columns of
:meth:`AgePyramid.from_csv <agentsim.population.AgePyramid.from_csv>` and
:meth:`HouseholdSizes.from_csv <agentsim.population.HouseholdSizes.from_csv>`; a relative path is
from the working directory, read by every process when the population is built; the engine checks
that every process read the same tables).
"""

from __future__ import annotations

import csv
import functools
import math
from typing import NamedTuple, TypeVar

import torch

from agentsim import ConfigError, Context, Grid, InitContext, MetricsContext, Model, Param
from agentsim.core import ops, portable
from agentsim.population import (
    LAYERS,
    PARTITION_METHODS,
    AgePyramid,
    HouseholdSizes,
    PopulationTables,
    locality_grid,
    partition_localities,
    synthesize,
)

S, E, A, I, H, R, D = range(7)  # noqa: E741  the compartments
STATES = ("S", "E", "A", "I", "H", "R", "D")

# Per decade of age (0-9, ..., 80-89, 90+): Covasim's default prognoses, per infection.
SUSCEPTIBILITY = (0.34, 0.67, 1.00, 1.00, 1.00, 1.00, 1.24, 1.47, 1.47, 1.47)
SYMPTOMATIC = (0.50, 0.55, 0.60, 0.65, 0.70, 0.75, 0.80, 0.85, 0.90, 0.90)
SEVERE = (0.00050, 0.00165, 0.00720, 0.02080, 0.03430, 0.07650, 0.13280, 0.20655, 0.24570, 0.24570)
CRITICAL = (0.00003, 0.00008, 0.00036, 0.00104, 0.00216, 0.00933, 0.03639, 0.08923, 0.17420, 0.17420)
DEATH = (0.00002, 0.00002, 0.00010, 0.00032, 0.00098, 0.00265, 0.00766, 0.02439, 0.08292, 0.16190)

model = Model(
    "covid",
    params={
        "beta_household": Param(0.048, "daily infection rate per infectious housemate", ge=0),
        "beta_school": Param(0.192, "daily rate when every school-mate is infectious", ge=0),
        "beta_work": Param(0.154, "daily rate when every co-worker is infectious", ge=0),
        "beta_community": Param(0.096, "daily rate when every venue-mate is infectious", ge=0),
        "asymptomatic_factor": Param(1.0, "infectiousness of an asymptomatic case (symptomatic: 1)", ge=0, le=10),
        "severe_factor": Param(1.0, "infectiousness of a severe case in hospital (symptomatic: 1; Covasim: 1, 0 for "
                               "hospitals that isolate)", ge=0, le=10),
        "early_ratio": Param(2.0, "infectiousness early in an infection over that later (Covasim's load_ratio)", gt=0,
                             le=100),
        "early_share": Param(0.3, "share of the infectious days that are early (Covasim's frac_time)", ge=0, le=1),
        "early_max_days": Param(4, "most early days (Covasim's high_cap)", ge=0, le=100),
        "transmissibility_dispersion": Param(0.45, "dispersion k of each person's infectiousness (a negative binomial "
                                             "of mean 1 in hundredths, Covasim's beta_dist); 0: everyone alike",
                                             ge=0),
        "latent_days": Param(4.5, "mean days from exposure to infectiousness", gt=0, le=1000),
        "latent_sd": Param(1.5, "standard deviation of the latent days", ge=0, le=1000),
        "presymptomatic_days": Param(1.1, "mean days infectious before symptoms (I)", gt=0, le=1000),
        "presymptomatic_sd": Param(0.9, "standard deviation of the presymptomatic days", ge=0, le=1000),
        "infectious_days": Param(8.0, "mean days infectious: A, and I after symptoms in a mild case", gt=0, le=1000),
        "infectious_sd": Param(2.0, "standard deviation of the infectious days", ge=0, le=1000),
        "onset_to_severe_days": Param(6.6, "mean days from symptoms to hospital (H) in a severe case", gt=0, le=1000),
        "onset_to_severe_sd": Param(4.9, "standard deviation of the days from symptoms to hospital", ge=0, le=1000),
        "severe_days": Param(18.1, "mean days in hospital (H) before recovery of a case that is not critical",
                             gt=0, le=1000),
        "severe_sd": Param(6.3, "standard deviation of the days in hospital before recovery of a case that is not "
                           "critical", ge=0, le=1000),
        "critical_days": Param(19.6, "mean days in hospital (H) before recovery of a critical case (Covasim's "
                               "sev2crit + crit2rec)", gt=0, le=1000),
        "critical_sd": Param(6.6, "standard deviation of the days in hospital before recovery of a critical case",
                             ge=0, le=1000),
        "dying_days": Param(12.2, "mean days in hospital (H) before death", gt=0, le=1000),
        "dying_sd": Param(5.2, "standard deviation of the days in hospital before death", ge=0, le=1000),
        "initial_prevalence": Param(0.001, "share of people exposed at day 0", ge=0, le=1),
        "age_pyramid": Param("", "CSV file of the population's ages (columns age_from,age_to,percent); empty: the "
                             "shipped US table"),
        "household_sizes": Param("", "CSV file of the households' sizes (columns size,percent); empty: the shipped US "
                                 "table"),
        "people_per_locality": Param(10_000, "mean people per locality of the synthetic population", ge=1),
        "locality_spread": Param(0.8, "spread of the localities' densities (log scale)", ge=0),
        "locality_partition": Param("rcb", "how processes share the localities: rcb (regions of the map) or metis "
                                    "(a graph partition; the metis extra)", choices=PARTITION_METHODS),
        "community_size": Param(200, "mean people per community venue", ge=1),
        "contact_groups": Param(0, "fixed groups of contacts of each person in their school, workplace and venue (0: "
                                "they mix with the whole place)", ge=0, le=64),
        "contacts_per_group": Param(2.0, "mean other members of a contact group (contact_groups > 0)", gt=0,
                                    le=1e6),
        "adult_age": Param(18, "youngest age of a household's head and of a worker; younger people are children, "
                           "and may go to school (years)", ge=1, le=127),
        "school_ages": Param("5-10,11-13,14-17", "school levels as inclusive age ranges that do not overlap, each "
                             "younger than adult_age (schools of each level in each locality; empty: no schools)"),
        "school_size": Param(500, "mean pupils per school", ge=1),
        "employment_rate": Param(0.7, "share of people of working age who work", ge=0, le=1),
        "workplace_exponent": Param(2.0, "exponent a of the workplace sizes' power law p(s) ~ s**-a", gt=0),
        "school_close_day": Param(-1, "first day schools are closed (-1: never)", ge=-1),
        "school_open_day": Param(-1, "first day schools are open again (-1: never)", ge=-1),
        "work_from_home_day": Param(-1, "first day of working from home (-1: never)", ge=-1),
        "work_from_home": Param(0.5, "work transmission kept while working from home", ge=0, le=1),
        "test_day": Param(-1, "first day symptomatic people are tested (-1: never)", ge=-1),
        "test_rate": Param(0.2, "daily probability a symptomatic or severe person is tested", ge=0, le=1),
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
    """``table[decade(age)]`` as float64, one per person (``age`` integer years, >= 0)."""
    return _by_year(table, age.device).index_select(0, torch.clamp(age, max=127).to(torch.int32))


@functools.lru_cache(maxsize=32)
def _by_year(table: tuple[float, ...], device: torch.device) -> torch.Tensor:
    """``[128]`` float64: ``table[decade(a)]`` for ``a = 0 .. 127`` (127: every older age)."""
    years = torch.arange(128, device=device)
    return torch.tensor(table, dtype=torch.float64, device=device).index_select(0, decade(years))


def active(day: int, start: int, stop: int = -1) -> bool:
    """Whether an intervention starting on ``start`` (-1: never) and ending on ``stop`` (-1: never) is on."""
    return start >= 0 and day >= start and (stop < 0 or day < stop)


GUIDE_STEPS = 2  # steps from the guide to a duration; the rare intervals holding more days are searched


class Durations(NamedTuple):
    """A law on the integers ``1 .. K`` (a duration in whole days, :func:`duration_table`; or one
    plus a count, :func:`transmissibility_table`) and a guide to sample it fast.

    Attributes:
        cdf: ``[K]`` float64 probabilities of a value of ``1 .. k`` (``cdf[K - 1] = 1``).
        guide: ``[M]`` int64, ``M`` a power of two: the entries of ``cdf`` at most ``b / M``.
        crowded: ``[M]`` bool: the intervals ``[b / M, (b + 1) / M)`` holding more than
            :data:`GUIDE_STEPS` entries of ``cdf`` (the far tail).
    """

    cdf: torch.Tensor
    guide: torch.Tensor
    crowded: torch.Tensor


@functools.lru_cache(maxsize=64)
def duration_table(mean: float, sd: float) -> Durations:
    """The cumulative probabilities of a duration of ``1 .. K`` days: a lognormal of this mean and
    standard deviation (days), rounded to whole days as Covasim's ``lognormal_int`` (0 and 1 both
    give 1 day), its tail beyond ``K = ceil(mean + 8 sd)`` folded into ``K``. ``sd = 0``: always
    ``round(mean)`` days. Computed on the CPU in Python floats: every device samples the same days.
    """
    if sd == 0:
        k = max(1, round(mean))
        cdf = [0.0] * (k - 1) + [1.0]
    else:
        sigma2 = math.log(1 + (sd / mean) ** 2)
        mu, sigma = math.log(mean) - sigma2 / 2, math.sqrt(sigma2)

        def below(x: float) -> float:  # P(X < x)
            return 0.0 if x <= 0 else 0.5 * (1 + math.erf((math.log(x) - mu) / (sigma * math.sqrt(2))))

        k = max(1, math.ceil(mean + 8 * sd))
        cdf = [below(d + 0.5) for d in range(1, k)] + [1.0]
    return _guided(cdf)


TRANSMISSIBILITY_UNIT = 100  # a person's transmissibility is counted in hundredths (Covasim's step 0.01)
TRANSMISSIBILITY_MAX = 2**15 - 2  # hundredths: an int16 per person, one more in draw_days (the tail folded in)
MIN_DISPERSION = 0.05  # at 0.05, about 3e-10 of the law lies beyond TRANSMISSIBILITY_MAX; below, far more
MAX_DISPERSION = 1e6  # the law is then Poisson(100) to 1e-4 of its variance


@functools.lru_cache(maxsize=16)
def transmissibility_table(dispersion: float) -> Durations:
    """The law of one plus a person's transmissibility in hundredths: a negative binomial count of
    mean :data:`TRANSMISSIBILITY_UNIT` and dispersion ``k`` (variance ``m + m**2 / k``; Covasim's
    ``beta_dist``, a gamma mixture of Poisson laws), its tail beyond :data:`TRANSMISSIBILITY_MAX`
    folded into it; ``dispersion = 0``: always the unit. Computed on the CPU in Python floats, by
    ``p(0) = exp(-k log(1 + m / k))``, ``p(j + 1) = p(j) (j + k) / (j + 1) m / (k + m)``.
    """
    m, k = float(TRANSMISSIBILITY_UNIT), float(dispersion)
    if k == 0:
        return _guided([0.0] * TRANSMISSIBILITY_UNIT + [1.0])
    if not MIN_DISPERSION <= k <= MAX_DISPERSION:
        raise ConfigError(f"covid: transmissibility_dispersion: expected 0 or a value in [{MIN_DISPERSION}, "
                          f"{MAX_DISPERSION:g}] (got {k!r}; smaller values put infectiousness beyond "
                          f"{TRANSMISSIBILITY_MAX / m} times the mean, larger ones are Poisson)")
    cdf, total, pj, ratio = [], 0.0, math.exp(-k * math.log1p(m / k)), m / (k + m)
    for j in range(TRANSMISSIBILITY_MAX + 1):
        total += pj
        cdf.append(total)
        if 1.0 - total < 1e-13:
            break
        pj *= (j + k) / (j + 1) * ratio
    if abs(1.0 - total) > 1e-9:  # (a guard: the bounds above keep the folded tail below it)
        raise ConfigError(f"covid: transmissibility_dispersion {k!r}: the law's probabilities sum to {total!r}")
    return _guided([*cdf[:-1], 1.0])


def _guided(cdf: list[float]) -> Durations:
    """The law of ``1 .. K`` with these cumulative probabilities (the last 1) and its guide."""
    table = torch.tensor(cdf, dtype=torch.float64)
    k = len(cdf)
    buckets = 1 << max(6, (8 * k - 1).bit_length())  # about 8 intervals per day
    edges = torch.arange(buckets + 1, dtype=torch.float64) / buckets  # exact: a power of two
    below_edge = torch.searchsorted(table, edges, right=True)
    return Durations(table, below_edge[:-1], below_edge[1:] - below_edge[:-1] > GUIDE_STEPS)


def draw_days(durations: Durations, u: torch.Tensor) -> torch.Tensor:
    """Values (``[m]`` int16, >= 1; days of a :func:`duration_table`) drawn with uniforms ``u``
    (``[m]`` float64 in ``[0, 1)``): ``1 + #{cdf <= u}``, the result of ``searchsorted``, found from
    ``u``'s interval in the guide in :data:`GUIDE_STEPS` steps (several times faster for tens of days).
    """
    cdf, guide = durations.cdf.to(u.device), durations.guide.to(u.device)
    bucket = (u * guide.shape[0]).to(torch.int64)  # u * 2**b is exact: u's interval
    at = guide.index_select(0, bucket)
    for _ in range(GUIDE_STEPS):
        at += cdf.index_select(0, at) <= u
    far = ops.flatnonzero(durations.crowded.to(u.device).index_select(0, bucket))
    at.index_copy_(0, far, torch.searchsorted(cdf, u.index_select(0, far), right=True))
    return (at + 1).to(torch.int16)


RECOVERS, SEVERE_NEXT, DIES = 0, 1, 2  # person.outcome: where the current state leads
_KIND_OF_STATE = torch.tensor([0, 0, 1, 0, 2, 0, 0], dtype=torch.int32)  # an infectious state's kind: I 0, A 1, H 2


@model.substep(reads=["person.state", "person.age", "person.isolated", "person.days_left", "person.outcome",
                      "person.early_days"],
               writes=["person.state", "person.isolated", "person.days_left", "person.outcome", "person.early_days"])
def progress(ctx: Context) -> None:
    """A day of each course of infection: each state lasts the days drawn when it began.

    E -> I (symptomatic, probability ``symp(a)``) or A; A -> R; I -> H if the case is severe
    (probability ``severe(a) / symp(a)``, decided as I begins: its duration depends on it), else
    R; H -> D (probability ``death(a) / severe(a)``, decided as H begins) or R, after
    ``critical_days`` for a critical case (probability ``critical(a) / severe(a)``, the same draw:
    the dying are critical too), else ``severe_days``. A person exposed yesterday (no days drawn
    yet) starts the latent period today.
    """
    p, people = ctx.params, ctx["person"]
    state, left, outcome, uid = people["state"], people["days_left"], people["outcome"], people["uid"]

    def days(name: str, u: torch.Tensor) -> torch.Tensor:  # the days of a duration (parameters name_days, name_sd)
        return draw_days(duration_table(p[f"{name}_days"], p[f"{name}_sd"]), u)

    # draws, keyed by uid (drawing for some people gives them the numbers of drawing for all): 0 the
    # latent days (when E begins), 1 the severe or fatal branch, 2 symptomatic or not, 3 the
    # presymptomatic days, 4 the days of the state that begins
    exposed = ops.flatnonzero(ops.equal(state, E) & ops.equal(left, 0))  # exposed yesterday: the latent days begin
    latent = ctx.rng.uniform(uid.index_select(0, exposed), draw=0, dtype=torch.float64)
    left.index_copy_(0, exposed, days("latent", latent))
    rows = ops.flatnonzero(ops.equal(left, 1))  # the states that end today (only E, A, I, H have days left)
    left.sub_(1).clamp_(min=0)  # in place (declared writes)
    early_days = people["early_days"]
    early_days.sub_(1).clamp_(min=0)
    was, a = state.index_select(0, rows), people["age"].index_select(0, rows)
    v = ctx.rng.uniform(uid.index_select(0, rows), draw=1, draws=4, dtype=torch.float64)
    branch, symptomatic, presymptomatic_u, days_u = v[:, 0], v[:, 1], v[:, 2], v[:, 3]
    symp, severe, death = per_age(SYMPTOMATIC, a), per_age(SEVERE, a), per_age(DEATH, a)
    critical = per_age(CRITICAL, a)
    fate = outcome.index_select(0, rows)
    becomes_severe = branch < severe / symp  # the branch of a case that becomes symptomatic now
    dies = branch < death / severe  # the branch of a severe case now in hospital
    after = torch.where(was == E, torch.where(symptomatic < symp, I, A),
                        torch.where(was == A, R,
                                    torch.where(was == I, torch.where(fate == SEVERE_NEXT, H, R),
                                                torch.where(fate == DIES, D, R))))
    new_fate = torch.where((after == I) & becomes_severe, SEVERE_NEXT, torch.where((after == H) & dies, DIES, RECOVERS))
    next_days = torch.zeros(rows.shape[0], dtype=torch.int16, device=state.device)  # R and D: none

    def add(who: torch.Tensor, name: str, u: torch.Tensor) -> None:  # the days of a duration, where who
        at = ops.flatnonzero(who)
        next_days.index_add_(0, at, days(name, u.index_select(0, at)))

    now_i, now_h, to_severe, to_death = after == I, after == H, new_fate == SEVERE_NEXT, new_fate == DIES
    add(now_i, "presymptomatic", presymptomatic_u)  # I: presymptomatic days, then the days to severe or recovery
    add(now_i & to_severe, "onset_to_severe", days_u)
    add((after == A) | (now_i & ~to_severe), "infectious", days_u)
    add(now_h & to_death, "dying", days_u)  # H: the days to death, else critical or severe days
    is_critical = branch < critical / severe
    add(now_h & ~to_death & is_critical, "critical", days_u)
    add(now_h & ~to_death & ~is_critical, "severe", days_u)
    left.index_copy_(0, rows, next_days.to(left.dtype))
    # early days of an infectious period of D days: ceil(min(early_share * D, early_max_days))
    span = torch.clamp(p["early_share"] * next_days.to(torch.float64) - 1e-9, max=float(p["early_max_days"]))
    starts = (after == A) | ((after == I) & (was == E))
    early_days.index_copy_(0, rows, torch.where(starts, torch.ceil(span), 0.0).to(early_days.dtype))
    state.index_copy_(0, rows, after.to(state.dtype))
    outcome.index_copy_(0, rows, new_fate.to(outcome.dtype))
    isolated = people["isolated"]
    isolated.index_copy_(0, rows, isolated.index_select(0, rows) & (after <= H))  # isolation ends with H


LOAD_BITS = 24  # infectiousness is counted per place in integer units of 2**-24: exact on any number of processes
BLOCK = 1 << 18  # people whose exposure is drawn together (each person's draw is keyed by uid: any block gives it)


CONTACT_LAYERS = ("school", "work", "community")  # the layers whose places may be split into contact groups


@model.substep(reads=["person.uid", *(f"person.{layer}" for layer in CONTACT_LAYERS)],
               writes=[f"person.{layer}_contacts" for layer in CONTACT_LAYERS])
def meet(ctx: Context) -> None:
    """On the first day, with ``contact_groups = k > 0``: each person's ``k`` contact groups in each
    of their school, workplace and venue (``person.<layer>_contacts``, ``[n, k]`` int64 ids,
    ``place * 2**32 + group``; -1 without a place), each drawn keyed by uid among the
    ``max(1, round(k (m - 1) / g))`` groups of a place of ``m`` members (its size over every process).
    """
    k = int(ctx.params["contact_groups"])
    if ctx.step != 1 or k == 0:
        return
    people, per_group = ctx["person"], float(ctx.params["contacts_per_group"])
    for layer in CONTACT_LAYERS:
        place = people[layer]
        index = ctx.group_index(f"person.{layer}")  # (place ids are int32: init checked)
        groups = torch.clamp(torch.round(k * (index.size.to(torch.float64) - 1) / per_group), min=1)
        ctx.flag(f"contact_groups: a {layer} place would have 2**32 contact groups or more (raise contacts_per_group)",
                 groups >= 2**32)  # (their numbers would reach the next place's ids)
        has = ops.flatnonzero(place >= 0)
        u = ctx.rng.uniform(people["uid"].index_select(0, has), layer, draws=k, dtype=torch.float64)  # [m, k]
        count = groups.index_select(0, index.of.index_select(0, has)).unsqueeze(1)  # [m, 1] float64
        which = torch.minimum(u.mul_(count), count - 1, out=u).to(torch.int64)  # floor(u * count), below count
        which.add_(place.index_select(0, has).to(torch.int64).unsqueeze(1) * 2**32)  # the place's ids
        contacts = people[f"{layer}_contacts"]
        contacts.fill_(-1)
        contacts.index_copy_(0, has, which)


@model.substep(reads=["person.state", "person.age", "person.isolated", "person.vaccinated", "person.early_days",
                      "person.transmissibility", *(f"person.{layer}" for layer in LAYERS),
                      *(f"person.{layer}_contacts" for layer in CONTACT_LAYERS)],
               writes=["person.state"])
def transmit(ctx: Context) -> None:
    """S -> E with probability ``1 - exp(-hazard)``, the hazard summed over the person's places."""
    p, day, people = ctx.params, ctx.step - 1, ctx["person"]  # day 0: the first step
    state = people["state"]
    # each infectious person's infectiousness by kind: early or later in the infection (their mean
    # over an infection 1: Covasim's viral load), asymptomatic_factor if asymptomatic, severe_factor
    # if severe, outside the household isolation_factor if isolated; times the person's
    # transmissibility (in hundredths)
    sick = ops.flatnonzero(ops.equal(state, I, A, H))  # int32 rows where they fit: a quarter of the people at a peak
    sick = sick.to(torch.int32) if state.shape[0] < 2**31 else sick
    mean_load = 1.0 + p["early_share"] * (p["early_ratio"] - 1.0)
    loads = torch.tensor([stage * symptoms for stage in (1.0 / mean_load, p["early_ratio"] / mean_load)
                          for symptoms in (1.0, p["asymptomatic_factor"], p["severe_factor"])],
                         dtype=torch.float64)  # by kind: 3 * early + (I 0, A 1, H 2)
    kind = _KIND_OF_STATE.to(state.device).index_select(0, state.index_select(0, sick).to(torch.int32))
    kind.add_(people["early_days"].index_select(0, sick) > 0, alpha=3)
    at_home = away = ops.to_fixed(loads, LOAD_BITS).to(state.device).index_select(0, kind)
    if active(day, p["test_day"]):  # (no one is isolated before testing begins)
        kind.add_(people["isolated"].index_select(0, sick), alpha=6)
        away = ops.to_fixed(torch.cat([loads, loads * p["isolation_factor"]]), LOAD_BITS).to(state.device)
        away = away.index_select(0, kind)
    del kind  # the tables of this day's infectious people are the largest temporaries at an epidemic's peak
    transmissibility, tables = people["transmissibility"], [at_home] if away is at_home else [at_home, away]
    for first in range(0, sick.shape[0], BLOCK):  # times each one's transmissibility (small int64 temporaries)
        weight = transmissibility.index_select(0, sick[first:first + BLOCK])
        for units in tables:
            units[first:first + BLOCK].mul_(weight)
    betas = {"household": p["beta_household"], "school": p["beta_school"], "work": p["beta_work"],
             "community": p["beta_community"]}
    if active(day, p["school_close_day"], p["school_open_day"]):
        betas["school"] = 0.0
    if active(day, p["work_from_home_day"]):
        betas["work"] *= p["work_from_home"]
    layers = [layer for layer in LAYERS if betas[layer] != 0.0]  # in layer order: each person's sum in that order
    k = int(p["contact_groups"])  # > 0: school, work and community through fixed contact groups
    fields = {layer: f"person.{layer}_contacts" if k and layer in CONTACT_LAYERS else f"person.{layer}"
              for layer in layers}
    contact_layers = [layer for layer in layers if fields[layer].endswith("_contacts")]
    # each place's infectiousness over every process: [G + 1] per layer (last: none)
    per_place = ctx.group_tables({fields[layer]: (sick, at_home if layer == "household" else away)
                                  for layer in layers if layer not in contact_layers})
    rates = {layer: betas[layer] * 2.0**-LOAD_BITS / TRANSMISSIBILITY_UNIT for layer in layers}  # per unit
    forces: list[torch.Tensor] = []  # per place layer: each place's units or force (and 0 for no place)
    numbers: list[torch.Tensor | None] = []  # each person's place (None: their own row)
    scales: list[float | None] = []  # the rate of a place's units, or None for a force
    for layer in layers:  # (the household first)
        if layer in contact_layers:
            continue
        field, rate = fields[layer], rates[layer]
        units, index = per_place.pop(field), ctx.group_index(field)  # (the index is known since the tables)
        if layer == "household":  # density dependent: each place's units at the rate
            forces.append(units)
            scales.append(rate)
        else:  # frequency dependent: per place-mate
            force = ops.to_float64_(units)
            force *= rate
            force[:-1].div_(torch.clamp(index.size - 1, min=1))
            forces.append(force)
            scales.append(None)
        numbers.append(index.of)
    if not layers:
        return
    susceptible = ops.equal(state, S)  # (as it is before this day's infections: a block's only change its own rows)
    if contact_layers:  # each susceptible person's force from their contacts: their contact groups' infectious
        # units, at each layer's rate per contact (of k * contacts_per_group), layer by layer: [n] (0 for the others)
        forces.append(ctx.weighted_group_sums({fields[layer]: (sick, away) for layer in contact_layers},
                                              {fields[layer]: rates[layer] / (k * p["contacts_per_group"])
                                               for layer in contact_layers}, only=susceptible))
        numbers.append(None)
        scales.append(None)
    for first in range(0, state.shape[0], BLOCK):  # a block of people at a time: small temporaries
        who = ops.flatnonzero(susceptible[first:first + BLOCK]) + first
        hazard = ops.gather_sum(forces, numbers, who, scales)
        exposed = ops.flatnonzero(~ops.equal(hazard, 0.0))  # a place-mate is infectious
        if 10 * exposed.shape[0] < 9 * who.shape[0]:  # only they draw, unless nearly all are (a hazard of 0
            who, hazard = who.index_select(0, exposed), hazard.index_select(0, exposed)  # infects no one)
        h = hazard * per_age(SUSCEPTIBILITY, people["age"].index_select(0, who))
        if active(day, p["vaccine_day"]):  # (no one is vaccinated before the campaign begins)
            h *= torch.where(people["vaccinated"].index_select(0, who), 1.0 - p["vaccine_efficacy"], 1.0)
        u = ctx.rng.uniform(people["uid"].index_select(0, who), dtype=torch.float64)
        state.index_fill_(0, who.index_select(0, ops.flatnonzero(u < 1.0 - portable.exp(-h))), E)  # in place


@model.substep(reads=["person.state", "person.age", "person.isolated", "person.vaccinated"],
               writes=["person.isolated", "person.vaccinated"])
def interventions(ctx: Context) -> None:
    """Testing and isolation of symptomatic and severe people; vaccination by age."""
    p, day, people = ctx.params, ctx.step - 1, ctx["person"]
    state, uid = people["state"], people["uid"]
    if active(day, p["test_day"]):
        ill = ops.flatnonzero(ops.equal(state, I, H) & ~people["isolated"])
        tested = ctx.rng.uniform(uid.index_select(0, ill), "test", dtype=torch.float64) < p["test_rate"]
        people["isolated"].index_fill_(0, ill.index_select(0, ops.flatnonzero(tested)), True)
    if active(day, p["vaccine_day"]):
        old_enough = people["age"] >= p["vaccine_min_age"]
        eligible = ops.flatnonzero(ops.equal(state, S) & ~people["vaccinated"] & old_enough)
        shot = ctx.rng.uniform(uid.index_select(0, eligible), "vaccine", dtype=torch.float64) < p["vaccine_rate"]
        people["vaccinated"].index_fill_(0, eligible.index_select(0, ops.flatnonzero(shot)), True)


Table = TypeVar("Table", AgePyramid, HouseholdSizes)


def _table(param: str, kind: type[Table], path: str) -> Table:
    """The table of the file ``path`` named by the parameter ``param`` (empty: the shipped US table)."""
    if not path:
        return kind.default()
    try:
        return kind.from_csv(path)
    except OSError as e:
        raise ConfigError(f"covid: {param}: cannot read {path!r} ({e.strerror or e}); expected a CSV file, or an "
                          f"empty value for the shipped US table") from None
    except (UnicodeDecodeError, csv.Error) as e:
        raise ConfigError(f"covid: {param}: {path!r} is not a CSV text file ({e})") from None
    except ConfigError as e:
        where = "" if str(path) in str(e) else f"{path!r}: "
        raise ConfigError(f"covid: {param}: {where}{e}") from None


def school_bands(text: str, adult_age: int) -> tuple[tuple[int, int], ...]:
    """The school levels of ``school_ages``: ``"5-10,11-13"`` gives ``((5, 10), (11, 13))``; each
    younger than ``adult_age``, none overlapping another.
    """
    bands: list[tuple[int, int]] = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        first, sep, last = (part.strip() for part in item.partition("-"))
        if not (sep and first.isdecimal() and last.isdecimal() and int(first) <= int(last)):
            raise ConfigError(f"covid: school_ages: expected inclusive age ranges such as '5-10,11-13,14-17' "
                              f"(got {item!r} in {text!r})")
        band = (int(first), int(last))
        if band[1] >= adult_age:
            raise ConfigError(f"covid: school_ages: {item!r} reaches adult_age {adult_age}; expected school ages "
                              f"younger than adult_age (raise adult_age, or end the range at {adult_age - 1})")
        clash = [b for b in bands if b[0] <= band[1] and band[0] <= b[1]]
        if clash:
            raise ConfigError(f"covid: school_ages: {item!r} overlaps {clash[0][0]}-{clash[0][1]} in {text!r}; "
                              f"expected levels that do not overlap")
        bands.append(band)
    return tuple(bands)


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
    ages = _table("age_pyramid", AgePyramid, p["age_pyramid"])
    households = _table("household_sizes", HouseholdSizes, p["household_sizes"])
    bands = school_bands(p["school_ages"], int(p["adult_age"]))
    try:
        tables = PopulationTables(ages=ages, households=households, community_size=int(p["community_size"]),
                                  school_size=int(p["school_size"]), adult_age=int(p["adult_age"]),
                                  school_bands=bands, employment_rate=float(p["employment_rate"]),
                                  workplace_exponent=float(p["workplace_exponent"]))
    except ConfigError as e:  # (e.g. an adult_age beyond the age pyramid's last age)
        raise ConfigError(f"covid: the population's parameters: {e}") from None
    ic.declare_input("the population tables (age_pyramid, household_sizes)", repr(tables))  # the same everywhere
    grid = locality_grid(n, ic.seed, people_per_locality, spread)
    mine = ops.flatnonzero(partition_localities(grid, world_size, p["locality_partition"]) == rank)
    pop = synthesize(n, seed=ic.seed, tables=tables, people_per_locality=people_per_locality, spread=spread,
                     localities=mine, compact=True)  # place ids built compact: no int64 copy of them
    uid = pop.uid
    exposed = ic.rng.uniform(uid, "seed_infections", dtype=torch.float64) < p["initial_prevalence"]
    law = transmissibility_table(float(p["transmissibility_dispersion"]))
    transmissibility = torch.empty(len(pop), dtype=torch.int16)  # hundredths, drawn a block at a time
    for first in range(0, len(pop), BLOCK):
        u = ic.rng.uniform(uid[first:first + BLOCK], "transmissibility", dtype=torch.float64)
        transmissibility[first:first + BLOCK] = draw_days(law, u) - 1
    places = {layer: pop.compact(layer) for layer in LAYERS}  # int32 ids where they fit (the columns themselves)
    wide = [layer for layer in CONTACT_LAYERS if places[layer].dtype != torch.int32]  # (the same on every process)
    if p["contact_groups"] and wide:
        raise ConfigError(f"covid: contact_groups: the {', '.join(wide)} ids of {n:,} people in "
                          f"{grid.n_localities:,} localities do not fit int32, which contact groups need; use "
                          f"contact_groups = 0, or fewer people per locality")
    cell = pop.locality.to(torch.int16 if grid.n_localities <= 2**15 else torch.int32)  # narrow where it fits
    ic.add("person", uid=uid.to(ic.device), age=pop.age.to(ic.device), cell=cell.to(ic.device),
           state=torch.where(exposed, E, S).to(torch.int8).to(ic.device),
           isolated=torch.zeros(len(pop), dtype=torch.bool, device=ic.device),
           vaccinated=torch.zeros(len(pop), dtype=torch.bool, device=ic.device),
           days_left=torch.zeros(len(pop), dtype=torch.int16, device=ic.device),  # 0: not drawn yet
           outcome=torch.zeros(len(pop), dtype=torch.int8, device=ic.device),
           early_days=torch.zeros(len(pop), dtype=torch.int8, device=ic.device),  # days left of high infectiousness
           transmissibility=transmissibility.to(ic.device),  # hundredths of the mean infectiousness, for life
           **{k: v.to(ic.device) for k, v in places.items()},  # place ids, -1 for none
           **{f"{layer}_contacts": torch.full((len(pop), int(p["contact_groups"])), -1, dtype=torch.int64,
                                              device=ic.device) for layer in CONTACT_LAYERS})  # drawn by meet
    return Grid(grid.shape, periodic=False)  # a person's cell: their locality


def _compartment(code: int, label: str, color: str) -> None:
    """Declare the metric counting the people in compartment ``code``."""
    @model.metric(name=STATES[code], label=label, color=color, panel="compartments", share_of=list(STATES),
                  unit="fraction of the population")
    def count(state: MetricsContext) -> torch.Tensor:
        return ops.equal(state["person"]["state"], code)
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
