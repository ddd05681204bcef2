"""Metapopulation SEIR: people in cities who travel for a day (agentsim, plain torch substeps).

Units: one step is one day.

Every person has a home city (uniform over ``cities``, fixed at the start). Each day:

1. ``travel``: a person stays in their home city, or with probability ``p_travel`` (0.05) spends
   the day in a uniformly random *other* city;
2. ``infect``: in each city, ``force = beta * I_present / N_present`` (``beta`` 0.3), counted
   over the people present that day, wherever their home is. A susceptible person becomes
   exposed with probability ``1 - exp(-force)`` of the city they are in; an exposed person
   becomes infectious with probability ``sigma`` (1/3); an infectious one recovers with
   probability ``gamma`` (1/5), all from the state at the start of the day.

The sums per city are ``ctx.group_table`` over the field ``person.loc`` (the city a person is in
today): integer head counts over every process, so the force is the same bits on any number of
processes. ``seeds`` (100) people, those with the smallest uid-keyed random key, are infectious
at day 0.

Metrics: ``S``, ``E``, ``I``, ``R`` (head counts).

Run: ``agentsim run benchmarks/plain/metapop.py:MODEL --agents 1000000 --steps 200`` or
``run(steps, seed, agents=..., cities=...)`` below.
"""

from __future__ import annotations

import torch

import agentsim as asim

S, E, I, R = 0, 1, 2, 3  # noqa: E741 (compartment codes)

PARAMS = {
    "cities": asim.Param(1000, "number of cities", ge=2),
    "p_travel": asim.Param(0.05, "daily probability of spending the day in another city", ge=0.0, le=1.0),
    "beta": asim.Param(0.3, "transmission rate per day", ge=0.0),
    "sigma": asim.Param(1 / 3, "daily probability E -> I", ge=0.0, le=1.0),
    "gamma": asim.Param(1 / 5, "daily probability I -> R", ge=0.0, le=1.0),
    "seeds": asim.Param(100, "people infectious at day 0", ge=0),
}
MODEL = asim.Model("metapop", params=PARAMS, default_agents=1_000_000)


@MODEL.init
def init(ic: asim.InitContext) -> None:
    n, p = ic.n_agents, ic.params
    uid = ic.uids("person", n)
    home = ic.rng.integers(uid, "home", high=p["cities"])  # int64 [n]
    status = torch.full((n,), S, dtype=torch.int8)
    status[ic.rng.uniform(uid, "seed").argsort()[: p["seeds"]]] = I
    ic.add("person", uid=uid, home=home, loc=home.clone(), status=status)
    return None  # no space: people meet through sums per city


@MODEL.substep(reads=["person.home"], writes=["person.loc"])
def travel(ctx: asim.Context) -> None:
    people, p = ctx["person"], ctx.params
    away = ctx.rng.uniform(people["uid"]) < p["p_travel"]
    other = (people["home"] + 1 + ctx.rng.integers(people["uid"], "city", high=p["cities"] - 1)) % p["cities"]
    people["loc"] = torch.where(away, other, people["home"])


@MODEL.substep(reads=["person.loc"], writes=["person.status"])
def infect(ctx: asim.Context) -> None:
    people, p = ctx["person"], ctx.params
    status = people["status"]
    rows = torch.arange(status.shape[0])
    present = torch.stack([torch.ones_like(rows), (status == I).long()], dim=1)  # [n, 2]: people, infectious
    table = ctx.group_table("person.loc", rows, present)  # [G + 1, 2] over every process
    here = table[ctx.group_index("person.loc").of]  # [n, 2]: the totals of each person's city
    force = p["beta"] * here[:, 1].double() / here[:, 0].double()
    u = ctx.rng.uniform(people["uid"])  # one draw a day: the states are exclusive
    new = torch.where((status == S) & (u < -torch.expm1(-force)), E, status)
    new = torch.where((status == E) & (u < p["sigma"]), I, new)
    new = torch.where((status == I) & (u < p["gamma"]), R, new)
    people["status"] = new


for _name, _code in (("S", S), ("E", E), ("I", I), ("R", R)):
    MODEL.metric(name=_name, panel="compartments")(lambda state, code=_code: state["person"]["status"] == code)


def run(steps: int, seed: int, **sizes) -> dict:
    """Run with the Python API; ``sizes``: ``agents`` and any parameter (``cities``...)."""
    agents = sizes.pop("agents", MODEL.default_agents)
    m = asim.Simulation(MODEL, agents, seed, params=sizes).run(steps).metrics
    return {k: m[k] for k in "SEIR"}
