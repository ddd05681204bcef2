"""Small models written as a user would from the README (not from models/), with env layers that
agents read and write: the multi-rank env tests run them (spawned ranks import this module).
"""

from __future__ import annotations

import torch

import agentsim as asim

SIDE = 5


def _grid_init(ic: asim.InitContext, food_dtype: torch.dtype = torch.int64) -> asim.Grid:
    """``n`` agents on distinct cells of a SIDE x SIDE torus, one unit of food per cell."""
    grid = asim.Grid((SIDE, SIDE), periodic=True)
    uid = ic.uids("agent", ic.n_agents)
    cell = (uid * 3) % grid.n_cells
    ic.add("agent", uid=uid, cell=cell, eaten=torch.zeros(ic.n_agents, dtype=torch.int64))
    ic.add_env(food=torch.ones(grid.shape, dtype=food_dtype))
    return grid


# The probe: every agent zeroes the food of its own cell (combine "set", the default).
probe = asim.Model("env_probe")


@probe.substep(reads=["agent.cell"], writes=["agent.eaten", "env.food"])
def eat(ctx: asim.Context) -> None:
    a, food = ctx["agent"], ctx.env["food"].reshape(-1)
    a["eaten"] = a["eaten"] + food[a["cell"]]
    food = food.clone()
    food[a["cell"]] = 0
    ctx.env["food"] = food.reshape(SIDE, SIDE)


probe.init(_grid_init)


@probe.metric()
def food_left(state: asim.MetricsContext) -> torch.Tensor:
    return state.owned_env("food")


# Walkers that move, eat the food of their cell, and leave droppings that add up (combine "add"),
# and a "max" layer of the last step a cell was visited; food regrows on its own (env only).
walkers = asim.Model("env_walkers")


@walkers.substep(writes=["agent.cell"])
def wander(ctx: asim.Context) -> None:
    a = ctx["agent"]
    choices = ctx.space.neighbor_cells(a["cell"], "moore", 1)
    pick = ctx.rng.integers(a["uid"], high=choices.shape[1])
    a["cell"] = choices.gather(1, pick[:, None])[:, 0]


@walkers.substep(reads=["agent.cell"], writes=["agent.eaten", "env.food", "env.dung", "env.visited"],
                 combine={"env.dung": "add", "env.visited": "max"})
def graze(ctx: asim.Context) -> None:
    a, env = ctx["agent"], ctx.env
    cell = a["cell"]
    food = env["food"].reshape(-1).clone()
    a["eaten"] = a["eaten"] + food[cell]
    food[cell] = 0  # several walkers of one cell all zero it: the same value on every process
    env["food"] = food.reshape(SIDE, SIDE)
    env["dung"] = env["dung"] + ctx.space.occupancy(cell).reshape(SIDE, SIDE)
    visited = env["visited"].reshape(-1).clone()
    visited[cell] = ctx.step
    env["visited"] = visited.reshape(SIDE, SIDE)


@walkers.substep(writes=["env.food"])
def regrow(ctx: asim.Context) -> None:
    food = ctx.env["food"]
    ctx.env["food"] = torch.where(ctx.rng.bernoulli(torch.arange(food.numel()), p=0.3).reshape(food.shape),
                                  torch.ones_like(food), food)


@walkers.init
def walkers_init(ic: asim.InitContext) -> asim.Grid:
    grid = _grid_init(ic)
    ic.add_env(dung=torch.zeros(grid.shape, dtype=torch.int64), visited=torch.zeros(grid.shape, dtype=torch.int64))
    return grid


@walkers.metric()
def food(state: asim.MetricsContext) -> torch.Tensor:
    return state.owned_env("food")


@walkers.metric()
def dung(state: asim.MetricsContext) -> torch.Tensor:
    return state.owned_env("dung")


# A user mistake: agents count themselves into a layer with the default "set" (each process
# writes its own count of a shared cell): refused on several processes, declare "add".
counted = asim.Model("env_counted")


@counted.substep(reads=["agent.cell"], writes=["env.crowd"])
def count(ctx: asim.Context) -> None:
    ctx.env["crowd"] = ctx.space.occupancy(ctx["agent"]["cell"]).reshape(SIDE, SIDE)


@counted.init
def counted_init(ic: asim.InitContext) -> asim.Grid:
    grid = asim.Grid((SIDE, SIDE), periodic=True)
    uid = ic.uids("agent", ic.n_agents)
    ic.add("agent", uid=uid, cell=torch.zeros(ic.n_agents, dtype=torch.int64))  # everybody on cell 0
    ic.add_env(crowd=torch.zeros(grid.shape, dtype=torch.int64))
    return grid


# Another: a "min" layer that a substep raises.
raising = asim.Model("env_raising")


@raising.substep(reads=["agent.cell"], writes=["env.low"], combine={"env.low": "min"})
def lift(ctx: asim.Context) -> None:
    low = ctx.env["low"].reshape(-1).clone()
    low[ctx["agent"]["cell"]] += 1
    ctx.env["low"] = low.reshape(SIDE, SIDE)


@raising.init
def raising_init(ic: asim.InitContext) -> asim.Grid:
    grid = _grid_init(ic)
    ic.add_env(low=torch.zeros(grid.shape, dtype=torch.int64))
    return grid
