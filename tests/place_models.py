"""A metapopulation written from the docs, with metrics per city: the metric tests run it on 1-3 processes.

People live in ``cities`` cities (a parameter); each day an infectious person infects others of the
city where they are, and travellers visit another city. Metrics: the infectious people per city
(``[cities]``), the mean days infected per city as a sum and a count, the cities with infections
(derived), and an age histogram whose last edge is a parameter.
"""

from __future__ import annotations

import torch

import agentsim as asim

S, I, R = 0, 1, 2  # noqa: E741 (compartment codes)

MODEL = asim.Model("cities", params={
    "cities": asim.Param(12, "number of cities", ge=1),
    "beta": asim.Param(0.3, "infections per infectious person per day, within a city", ge=0.0),
    "travel": asim.Param(0.05, "share of people who visit another city each day", ge=0.0, le=1.0),
    "oldest": asim.Param(100.0, "the largest age (years)", gt=65.0),
})


@MODEL.init
def init(ic: asim.InitContext) -> None:
    uid = ic.uids("person", ic.n_agents)
    home = ic.rng.integers(uid, "home", high=ic.params["cities"])
    status = torch.where(ic.rng.uniform(uid, "seed") < 0.02, I, S).to(torch.int8)
    ic.add("person", uid=uid, home=home, city=home.clone(), status=status,
           days=torch.zeros(ic.n_agents, dtype=torch.int64), age=ic.rng.uniform(uid, "age") * ic.params["oldest"])


@MODEL.substep(reads=["person.home", "person.status"], writes=["person.city", "person.status", "person.days"])
def day(ctx: asim.Context) -> None:
    p, cities = ctx["person"], ctx.params["cities"]
    away = ctx.rng.uniform(p["uid"], "travel") < ctx.params["travel"]
    p["city"] = torch.where(away, ctx.rng.integers(p["uid"], "where", high=cities), p["home"])
    sick = p["status"] == I
    infectious = ctx.group_table("person.city", torch.nonzero(sick).flatten(),
                                 torch.ones(int(sick.sum()), dtype=torch.int64))
    size = ctx.group_table("person.city", torch.arange(p.n), torch.ones(p.n, dtype=torch.int64))
    at = ctx.group_index("person.city").of
    risk = 1 - torch.exp(-ctx.params["beta"] * infectious[at].double() / size[at].clamp(min=1).double())
    caught = (p["status"] == S) & (ctx.rng.uniform(p["uid"], "catch") < risk)
    recovered = sick & (ctx.rng.uniform(p["uid"], "recover") < 0.1)
    p["status"] = torch.where(caught, I, torch.where(recovered, R, p["status"].long())).to(torch.int8)
    p["days"] = p["days"] + sick.long()


@MODEL.metric(groups="cities")
def infectious_per_city(state: asim.MetricsContext):
    p = state["person"]
    return p["home"], p["status"] == I


@MODEL.metric(groups="cities")
def days_per_city(state: asim.MetricsContext):
    p = state["person"]
    return p["home"], p["days"].double() * 0.5  # half-days, as floats


@MODEL.metric(groups="cities")
def people_per_city(state: asim.MetricsContext):
    return state["person"]["home"]


@MODEL.derived
def cities_with_infections(m) -> int:
    return int((m["infectious_per_city"] > 0).sum())


@MODEL.derived
def infectious_per_city_mean(m, params) -> float:
    return float(m["infectious_per_city"].sum()) / params["cities"]


@MODEL.metric(hist=lambda params: [0.0, 18.0, 65.0, params["oldest"]])
def ages(state: asim.MetricsContext):
    return state["person"]["age"]


@MODEL.metric(reduce="sum", resolution=1e-12)
def tiny(state: asim.MetricsContext):
    return state["person"]["days"].double() * 1e-9


# Bugs wandering on a grid, counted per cell: a metric with one group per cell of the space.
BUGS = asim.Model("bugs", params={"rows": asim.Param(7, "grid rows", ge=1),
                                  "cols": asim.Param(5, "grid columns", ge=1)})


@BUGS.init
def place_bugs(ic: asim.InitContext) -> asim.Grid:
    grid = asim.Grid((ic.params["rows"], ic.params["cols"]), periodic=True)
    uid = ic.uids("bug", ic.n_agents)
    ic.add("bug", uid=uid, cell=ic.rng.integers(uid, "cell", high=grid.n_cells))
    return grid


@BUGS.substep(reads=["bug.cell"], writes=["bug.cell"])
def wander(ctx: asim.Context) -> None:
    bugs = ctx["bug"]
    row, col = ctx.space.coords(bugs["cell"])
    step = ctx.rng.integers(bugs["uid"], "step", high=3) - 1  # -1, 0 or 1 column
    bugs["cell"] = ctx.space.cell_index(row, col + step)  # wraps on the torus


@BUGS.metric(groups="space")
def bugs_per_cell(state: asim.MetricsContext) -> torch.Tensor:
    return state["bug"]["cell"]


@BUGS.derived
def bugs_per_cell_mean(m, params, space) -> float:  # a function of three arguments also gets the space
    return float(m["n_bug"] / space.n_cells)
