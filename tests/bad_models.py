"""Models with the mistakes a new user makes (each silently wrong on several processes without the
checks): the check-mode tests and `agentsim check` tests run them.
"""

from __future__ import annotations

import torch

import agentsim as asim

SIDE = 8


def _grid_agents(ic: asim.InitContext, periodic: bool = True) -> asim.Grid:
    grid = asim.Grid((SIDE, SIDE), periodic=periodic)
    uid = ic.uids("agent", ic.n_agents)
    cell = (uid * 5 + 3) % grid.n_cells
    ic.add("agent", uid=uid, cell=cell, wealth=torch.zeros(ic.n_agents, dtype=torch.int64))
    ic.add_env(food=(torch.arange(grid.n_cells) % 3).reshape(grid.shape))
    return grid


def _walk(ctx: asim.Context) -> None:
    a = ctx["agent"]
    choices = ctx.space.neighbor_cells(a["cell"], "moore", 1)
    pick = ctx.rng.integers(a["uid"], high=choices.shape[1])
    a["cell"] = choices.gather(1, pick[:, None])[:, 0]


# 1. Declares reach moore:1 but counts agents up to 3 cells away.
short_reach = asim.Model("short_reach")
short_reach.substep(writes=["agent.cell"], name="walk")(_walk)


@short_reach.substep(reads=["agent.cell"], writes=["agent.wealth"], neighbors={"agent": ["cell"]}, reach="moore:1")
def crowding(ctx: asim.Context) -> None:
    a, nb = ctx["agent"], ctx.neighbors("agent")
    grid: asim.Grid = ctx.space
    near = grid.neighbor_sum(grid.occupancy(nb["cell"]).reshape(grid.shape), "moore", 3).reshape(-1)
    a["wealth"] = a["wealth"] + near[a["cell"]]


short_reach.init(_grid_agents)

# The same with the reach it needs.
right_reach = asim.Model("right_reach")
right_reach.substep(writes=["agent.cell"], name="walk")(_walk)
right_reach.substep(reads=["agent.cell"], writes=["agent.wealth"], neighbors={"agent": ["cell"]},
                    reach="moore:3", name="crowding")(crowding.fn)
right_reach.init(_grid_agents)

# 2. A sum over ctx[pop] rows instead of ctx.neighbors: each process sees only its agents.
local_sum = asim.Model("local_sum")


@local_sum.substep(reads=["agent.cell"], writes=["agent.wealth"])
def tax(ctx: asim.Context) -> None:
    a = ctx["agent"]
    a["wealth"] = a["wealth"] + a["cell"].sum() // 10


local_sum.init(_grid_agents)

# 3. Draws that are not keyed by uid.
unkeyed = asim.Model("unkeyed")


@unkeyed.substep(writes=["agent.wealth"])
def luck(ctx: asim.Context) -> None:
    a = ctx["agent"]
    a["wealth"] = a["wealth"] + (torch.arange(a.n) % 2)  # by row: the first, third, ... agent gains


unkeyed.init(_grid_agents)

# 4. Counts written into a layer with the default "set" (should be combine "add").
counts = asim.Model("counts")
counts.substep(writes=["agent.cell"], name="walk")(_walk)


@counts.substep(reads=["agent.cell"], writes=["env.food"])
def trample(ctx: asim.Context) -> None:
    food = ctx.env["food"]
    ctx.env["food"] = food + ctx.space.occupancy(ctx["agent"]["cell"]).reshape(food.shape)


counts.init(_grid_agents)

# The same declared as it must be.
counts_added = asim.Model("counts_added")
counts_added.substep(writes=["agent.cell"], name="walk")(_walk)
counts_added.substep(reads=["agent.cell"], writes=["env.food"], combine={"env.food": "add"},
                     name="trample")(trample.fn)
counts_added.init(_grid_agents)

# 5. Reads env at -1 (a bounded grid's neighbor_cells beyond the border).
edge_read = asim.Model("edge_read")


@edge_read.substep(reads=["agent.cell", "env.food"], writes=["agent.wealth"])
def look_up(ctx: asim.Context) -> None:
    a = ctx["agent"]
    above = ctx.space.neighbor_cells(a["cell"], "von_neumann", 1)[:, 0]
    a["wealth"] = a["wealth"] + ctx.env["food"].reshape(-1)[above]


edge_read.init(lambda ic: _grid_agents(ic, periodic=False))

# 6. Keeps state in a Python variable between steps: every process counts alike, but a resumed run
# starts counting again.
_calls = {"n": 0}
forgetful = asim.Model("forgetful")
forgetful.substep(writes=["agent.cell"], name="walk")(_walk)


@forgetful.substep(writes=["agent.wealth"])
def pay(ctx: asim.Context) -> None:
    _calls["n"] += 1
    ctx["agent"]["wealth"] = ctx["agent"]["wealth"] + _calls["n"]


forgetful.init(_grid_agents)


# 7. Every agent in the first row of the grid: strips (blocks of rows) leave them all on one process.
huddled = asim.Model("huddled")
huddled.substep(writes=["agent.cell"], name="walk")(_walk)


@huddled.init
def _huddled_agents(ic: asim.InitContext) -> asim.Grid:
    grid = asim.Grid((SIDE, SIDE))
    uid = ic.uids("agent", ic.n_agents)
    ic.add("agent", uid=uid, cell=uid % SIDE, wealth=torch.zeros(ic.n_agents, dtype=torch.int64))
    return grid


@huddled.substep(reads=["agent.cell"], writes=["agent.cell"], name="stay")
def _stay(ctx: asim.Context) -> None:
    a = ctx["agent"]
    a["cell"] = a["cell"] % SIDE  # back to the first row


# 8. Traffic on a (L, 1) grid that declares reach moore:1 but looks vmax = 5 cells ahead: the cars start
#    at rest, so the reads beyond one cell change nothing until they have sped up (about step 10).
ROAD = 600
slow_start = asim.Model("slow_start")


@slow_start.init
def _cars_at_rest(ic: asim.InitContext) -> asim.Grid:
    road = asim.Grid((ROAD, 1))
    uid = ic.uids("car", ic.n_agents)
    cell = torch.argsort(ic.rng.bits(torch.arange(ROAD), "place"), stable=True)[: ic.n_agents]
    ic.add("car", uid=uid, cell=cell, v=torch.zeros(ic.n_agents, dtype=torch.int64))
    return road


@slow_start.substep(reads=["car.cell", "car.v"], writes=["car.v", "car.cell"], neighbors={"car": ["cell"]},
                    reach="moore:1")
def _drive_blind(ctx: asim.Context) -> None:
    car, road = ctx["car"], ctx.space
    occupied = road.occupancy(ctx.neighbors("car")["cell"]) > 0
    blocked = occupied[road.cell_index(car["cell"][:, None] + torch.arange(1, 6), 0)]  # 5 cells ahead
    gap = torch.where(blocked.any(1), blocked.to(torch.int8).argmax(1), 5)
    v = torch.minimum(torch.clamp(car["v"] + 1, max=5), gap)
    v = torch.where((v > 0) & (ctx.rng.uniform(car["uid"]) < 0.3), v - 1, v)
    car["v"] = v
    car["cell"] = road.cell_index(car["cell"] + v, 0)
