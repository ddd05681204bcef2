"""Models with float env layers that agents consume and deposit into (``combine='add'`` and
``ctx.deposit``), written from the docs: the deposit tests run them on 1-4 processes.

- ``grazers``: bugs wander on a 24 x 24 torus of float32 grass; each eats a share of its cell's
  grass (several bugs on a cell each eat their share of what was there) and leaves float64 dung;
  grass regrows in an env-only substep, and rain deposits on every third cell (env only too).
  Bugs that ate enough split in two, hungry ones die.
- ``halo_dung``: a broken variant that deposits for every row of ``ctx.neighbors`` (halo too).
"""

from __future__ import annotations

import torch

import agentsim as asim

grazers = asim.Model("grazers", params={
    "side": asim.Param(24, "cells per side", ge=4),
    "bite": asim.Param(0.3, "share of its cell's grass a bug eats", gt=0.0, le=1.0),
    "regrow": asim.Param(0.05, "share of the missing grass that grows back each step", ge=0.0, le=1.0),
})


@grazers.init
def _init(ic: asim.InitContext) -> asim.Grid:
    grid = asim.Grid((ic.params["side"], ic.params["side"]))
    uid = ic.uids("bug", ic.n_agents)
    ic.add("bug", uid=uid, cell=ic.rng.integers(uid, "cell", high=grid.n_cells),
           fat=torch.full((ic.n_agents,), 0.5, dtype=torch.float64))
    ic.add_env(grass=torch.ones(grid.shape, dtype=torch.float32),
               dung=torch.zeros(grid.shape, dtype=torch.float64))
    return grid


@grazers.substep(reads=["bug.cell"], writes=["bug.cell"])
def wander(ctx: asim.Context) -> None:
    bug = ctx["bug"]
    moves = ctx.space.neighbor_cells(bug["cell"], "von_neumann", 1)  # [n, 4]
    pick = ctx.rng.integers(bug["uid"], "move", high=4)
    bug["cell"] = moves.gather(1, pick.unsqueeze(1)).squeeze(1)


@grazers.substep(reads=["bug.cell", "bug.fat", "env.grass"], writes=["bug.fat", "env.grass", "env.dung"],
                 neighbors={"bug": ["cell"]}, reach="moore:0", combine={"env.grass": "add", "env.dung": "add"})
def graze(ctx: asim.Context) -> None:
    bug, grass = ctx["bug"], ctx.env["grass"].reshape(-1)
    crowd = ctx.space.occupancy(ctx.neighbors("bug")["cell"])  # bugs per cell, every process's
    share = grass[bug["cell"]].double() * ctx.params["bite"] / crowd[bug["cell"]]
    ctx.deposit("grass", bug["cell"], -share)
    ctx.deposit("env.dung", bug["cell"], 0.1 * share)
    bug["fat"] = bug["fat"] + share - 0.1


@grazers.substep(reads=["env.grass"], writes=["env.grass"])
def regrow(ctx: asim.Context) -> None:
    grass = ctx.env["grass"]
    ctx.env["grass"] = grass + ctx.params["regrow"] * (1 - grass)


@grazers.substep(reads=["env.grass"], writes=["env.grass"], combine={"env.grass": "add"})
def rain(ctx: asim.Context) -> None:  # env only: every process deposits alike, once
    cells = torch.arange(0, ctx.env["grass"].numel(), 3, device=ctx.device)
    ctx.deposit("grass", cells, torch.full(cells.shape, 0.01))


@grazers.substep(reads=["bug.cell", "bug.fat"], writes=["bug.fat"], births=["bug"], deaths=["bug"])
def split_or_starve(ctx: asim.Context) -> None:
    bug = ctx["bug"]
    full = bug["fat"] > 1.0
    ctx.spawn("bug", bug["uid"][full], {"cell": bug["cell"][full], "fat": bug["fat"][full] / 2})
    bug["fat"] = torch.where(full, bug["fat"] / 2, bug["fat"])
    ctx.kill("bug", bug["fat"] < 0)


@grazers.metric
def grass(state: asim.MetricsContext) -> torch.Tensor:
    return state.owned_env("grass").double()


@grazers.metric
def dung(state: asim.MetricsContext) -> torch.Tensor:
    return state.owned_env("dung")


halo_dung = asim.Model("halo_dung")


@halo_dung.init
def _halo_init(ic: asim.InitContext) -> asim.Grid:
    grid = asim.Grid((12, 12))
    uid = ic.uids("bug", ic.n_agents)
    ic.add("bug", uid=uid, cell=ic.rng.integers(uid, "cell", high=grid.n_cells))
    ic.add_env(dung=torch.zeros(grid.shape, dtype=torch.float64))
    return grid


@halo_dung.substep(reads=["bug.cell"], writes=["env.dung"], neighbors={"bug": ["cell"]}, reach="moore:1",
                   combine={"env.dung": "add"})
def soil(ctx: asim.Context) -> None:
    everyone = ctx.neighbors("bug")["cell"]  # the halo's bugs too: each is counted on two processes
    ctx.deposit("dung", everyone, torch.full(everyone.shape, 0.25, dtype=torch.float64))
