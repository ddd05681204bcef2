"""Well-mixed SIR in continuous-rate form: influenza in a boarding school (763 boys, one index
case; ``data/boarding_school_flu.csv``).

Rates are per day and a day is ``steps_per_day`` steps of length ``dt = 1 / steps_per_day``. In
each step, synchronously, a susceptible boy is infected with probability
``1 - exp(-beta * I / N * dt)`` (``I`` the infectious boys of his school, ``N`` its size) and an
infectious one recovers with probability ``1 - exp(-gamma * dt)``: as ``dt -> 0`` the mean of the
run is the mass-action ODE ``S' = -beta S I / N``, ``I' = beta S I / N - gamma I`` and
``R0 = beta / gamma``. Holding ``I`` fixed within a step delays transmission a little, so
least-squares fits of beta and gamma come out higher at coarse steps (mean-field fits to the
boarding-school data: 1.83 / 0.488 per day at 4 steps a day, 1.73 / 0.460 at 10, 1.70 / 0.450
at 24, 1.669 / 0.443 for the ODE); the default, 24 steps a day, is an hour.

``schools`` independent copies of the school run side by side in one simulation (agents
``agents / schools`` per school, disjoint uids, so independent draws): an ensemble of
replicates in one vectorized run. ``i`` and ``s`` are float fields (1/0 in a hard run) so that
gradients can pass the draws (``relax``, see :mod:`agentsim.grad.relax`); ``logp`` accumulates the
log-probability of each boy's draws, for the score-function estimator.

Metrics per step: ``S``, ``I``, ``R`` summed over every school (divide by ``schools`` for the
mean school). Fits in the literature (Keeling & Rohani): beta 1.66-1.73 per day, gamma
0.44-0.55 per day, R0 3.1-3.8.
"""

from __future__ import annotations

import torch

from agentsim import ConfigError, Context, InitContext, MetricsContext, Model, Param
from agentsim.grad.relax import MODES, bernoulli

model = Model(
    "flu",
    params={
        "beta": Param(1.7, "transmission rate per day (mass action within a school)", gt=0),
        "gamma": Param(0.45, "recovery rate per day (mean infectious period 1/gamma days)", gt=0),
        "steps_per_day": Param(24, "steps per day (dt = 1/steps_per_day days)", ge=1),
        "schools": Param(1, "independent copies of the school in one run (agents split evenly)", ge=1),
        "initial_infected": Param(1, "infectious boys per school at day 0 (the lowest uids)", ge=0),
        "relax": Param("hard", "what gradients see of the draws: " + ", ".join(MODES), choices=MODES),
        "tau": Param(0.5, "temperature of the Gumbel-softmax relaxation", gt=0),
    },
    description="well-mixed SIR in continuous-rate form (the 1978 boarding-school influenza)",
    default_agents=763,
)


@model.substep(reads=["person.s", "person.i", "person.school", "person.logp"],
               writes=["person.s", "person.i", "person.logp"],
               neighbors={"person": ["i", "school"]}, reach="global")
def transmit(ctx: Context) -> None:
    """Infections at rate beta I / N and recoveries at rate gamma over one step of 1/steps_per_day days."""
    p, boys, everyone = ctx.params, ctx["person"], ctx.neighbors("person")
    dt = 1.0 / p["steps_per_day"]
    schools = p["schools"]
    infectious = torch.zeros(schools, dtype=torch.float64, device=boys["i"].device)
    infectious = infectious.index_add(0, everyone["school"], everyone["i"])
    size = torch.bincount(everyone["school"], minlength=schools).to(torch.float64)
    school = boys["school"]
    p_infect = -torch.expm1(-p["beta"] * dt * (infectious / size))[school]
    p_recover = -torch.expm1(-p["gamma"] * dt * torch.ones(1, dtype=torch.float64, device=school.device))
    uid, mode, score = boys["uid"], p["relax"], p["relax"] == "score"
    infected, logp_i = bernoulli(p_infect, ctx.rng.uniform(uid, "infect"), mode, p["tau"], log_prob=score)
    recovered, logp_r = bernoulli(p_recover.expand_as(p_infect), ctx.rng.uniform(uid, "recover"), mode, p["tau"],
                                  log_prob=score)
    s, i = boys["s"], boys["i"]
    new = s * infected
    boys["s"] = s - new
    boys["i"] = i + new - i * recovered
    if logp_i is not None and logp_r is not None:  # relax = score: the log-probability of the draws that
        boys["logp"] = boys["logp"] + s.detach() * logp_i + i.detach() * logp_r  # mattered


@model.init
def init(ic: InitContext) -> None:
    """``schools`` schools of ``agents / schools`` boys; the first ``initial_infected`` of each infectious."""
    schools, n = ic.params["schools"], ic.n_agents
    if n % schools:
        raise ConfigError(f"flu: agents ({n}) must split evenly into schools ({schools})")
    size = n // schools
    if ic.params["initial_infected"] > size:
        raise ConfigError(f"flu: initial_infected ({ic.params['initial_infected']}) exceeds the school size ({size})")
    uid = ic.uids("person", n)
    rank_in_school = torch.arange(n, device=ic.device) % size
    i = (rank_in_school < ic.params["initial_infected"]).to(torch.float64)
    ic.add("person", uid=uid, school=torch.arange(n, device=ic.device) // size, s=1.0 - i, i=i,
           logp=torch.zeros(n, dtype=torch.float64, device=ic.device))


@model.metric(name="S", label="susceptible", color="tab:blue", panel="compartments",
              share_of=["S", "I", "R"], unit="fraction of the population")
def susceptible(state: MetricsContext) -> torch.Tensor:
    """Susceptible boys (summed over schools)."""
    return state["person"]["s"]


@model.metric(name="I", label="infectious", color="tab:red", panel="compartments",
              share_of=["S", "I", "R"], unit="fraction of the population")
def infectious(state: MetricsContext) -> torch.Tensor:
    """Infectious boys, confined to bed in the data (summed over schools)."""
    return state["person"]["i"]


@model.metric(name="R", label="recovered", color="tab:green", panel="compartments",
              share_of=["S", "I", "R"], unit="fraction of the population")
def recovered(state: MetricsContext) -> torch.Tensor:
    """Recovered boys (summed over schools)."""
    p = state["person"]
    return 1.0 - p["s"] - p["i"]


MODEL = model
