"""Wolf-sheep predation on a torus grid with grass regrowth (Mesa's ``wolf_sheep`` defaults).

Each step, in this order (each substep vectorized and synchronous):

1. ``sheep_move``: every sheep moves to a random Moore neighbor cell;
2. ``sheep_eat``: sheep lose 1 energy; on each cell with grown grass the sheep with
   the smallest random key eats it (+``sheep_gain``) and the grass starts regrowing;
   sheep with energy < 0 die;
3. ``sheep_breed``: each sheep with probability ``sheep_reproduce`` halves its energy
   and gets a lamb with that energy on its cell;
4. ``wolf_move``: every wolf moves to a random Moore neighbor cell;
5. ``wolf_eat``: wolves lose 1 energy; on each cell, wolves and sheep are each ranked
   by a random key and the k-th wolf eats the k-th sheep (+``wolf_gain``); eaten
   sheep die; wolves with energy < 0 die;
6. ``wolf_breed``: as for sheep, with ``wolf_reproduce``;
7. ``grass_regrow``: a patch that is not grown counts down and grows back after
   ``regrowth_time`` steps.

Mesa steps agents one at a time in random order; this model resolves the same
competitions (one sheep per grass patch, one sheep per wolf) with random keys per
uid, so the result is independent of agent order. Defaults are Mesa's: 100 sheep,
50 wolves on 20 x 20 cells (density 0.375 animals per cell, a third of them wolves),
sheep_reproduce 0.04, wolf_reproduce 0.05, sheep_gain 4, wolf_gain 20,
regrowth_time 30; initial energies uniform in ``[0, 2 * gain)`` (integers), grass
grown with probability 1/2, otherwise with a countdown uniform in ``[0, regrowth_time)``.
"""

from __future__ import annotations

import math

import torch

from agentsim import Context, Grid, InitContext, MetricsContext, Model, Param, neighbor_reduce, rank_in_group

model = Model(
    "wolfsheep",
    params={
        "density": Param(0.375, "animals per grid cell at step 0 (sets the grid side)", gt=0),
        "wolf_fraction": Param(1 / 3, "fraction of the initial animals that are wolves", ge=0, le=1),
        "sheep_reproduce": Param(0.04, "daily sheep reproduction probability", ge=0, le=1),
        "wolf_reproduce": Param(0.05, "daily wolf reproduction probability", ge=0, le=1),
        "sheep_gain": Param(4.0, "energy a sheep gains from eating grass", ge=0),
        "wolf_gain": Param(20.0, "energy a wolf gains from eating a sheep", ge=0),
        "regrowth_time": Param(30, "steps for eaten grass to grow back", ge=1),
    },
    description="Wolf-sheep predation with grass regrowth on a torus grid",
    default_agents=150,
)


def _random_step(ctx: Context, pop: str) -> None:
    """Every animal of ``pop`` moves to a random Moore neighbor cell (the substep's stream)."""
    animals = ctx[pop]
    grid: Grid = ctx.space
    choices = grid.neighbor_cells(animals["cell"], "moore", 1)
    pick = ctx.rng.integers(animals["uid"], high=choices.shape[1])
    animals["cell"] = choices.gather(1, pick.unsqueeze(1)).squeeze(1)


def _breed(ctx: Context, pop: str, prob: float) -> None:
    """Parents (probability ``prob``) halve their energy and give it to a child on their cell."""
    animals = ctx[pop]
    parents = ctx.rng.bernoulli(animals["uid"], p=prob)
    energy = torch.where(parents, animals["energy"] / 2, animals["energy"])
    animals["energy"] = energy
    ctx.spawn(pop, animals["uid"][parents], {"cell": animals["cell"][parents], "energy": energy[parents]})


@model.substep(writes=["sheep.cell"])
def sheep_move(ctx: Context) -> None:
    """Move to a random Moore neighbor cell."""
    _random_step(ctx, "sheep")


@model.substep(reads=["sheep.cell"], writes=["sheep.energy", "env.grass", "env.countdown"], deaths=["sheep"],
               neighbors={"sheep": ["cell"]}, reach="cell")
def sheep_eat(ctx: Context) -> None:
    """Lose 1 energy; one sheep per grown patch eats it; starving sheep die."""
    sheep, env = ctx["sheep"], ctx.env
    nb = ctx.neighbors("sheep")
    grass = env["grass"].reshape(-1)
    cell_all = nb["cell"]
    first = rank_in_group(cell_all, ctx.rng.bits(nb["uid"], "graze")) == 0
    eats_all = first & grass[cell_all]
    eats = eats_all[: nb.n_local]
    energy = sheep["energy"] - 1 + ctx.params["sheep_gain"] * eats
    sheep["energy"] = energy
    eaten = torch.zeros_like(grass)
    eaten[cell_all[eats_all]] = True
    env["grass"] = (grass & ~eaten).reshape(env["grass"].shape)
    countdown = env["countdown"].reshape(-1)
    env["countdown"] = torch.where(eaten, ctx.params["regrowth_time"], countdown).reshape(env["countdown"].shape)
    ctx.kill("sheep", energy < 0)


@model.substep(reads=["sheep.cell"], writes=["sheep.energy"], births=["sheep"])
def sheep_breed(ctx: Context) -> None:
    """With probability sheep_reproduce, halve energy and add a lamb on the same cell."""
    _breed(ctx, "sheep", ctx.params["sheep_reproduce"])


@model.substep(writes=["wolf.cell"])
def wolf_move(ctx: Context) -> None:
    """Move to a random Moore neighbor cell."""
    _random_step(ctx, "wolf")


@model.substep(reads=["wolf.cell", "sheep.cell"], writes=["wolf.energy"], deaths=["sheep", "wolf"],
               neighbors={"wolf": ["cell"], "sheep": ["cell"]}, reach="cell")
def wolf_eat(ctx: Context) -> None:
    """Lose 1 energy; the k-th wolf of a cell eats its k-th sheep; starving wolves die."""
    wolves = ctx["wolf"]
    grid: Grid = ctx.space
    nw, ns = ctx.neighbors("wolf"), ctx.neighbors("sheep")
    w_cell, s_cell = nw["cell"], ns["cell"]
    w_rank = rank_in_group(w_cell, ctx.rng.bits(nw["uid"], "hunt"))[: nw.n_local]
    s_rank = rank_in_group(s_cell, ctx.rng.bits(ns["uid"], "prey"))[: ns.n_local]
    sheep_here = neighbor_reduce(grid, nw, True, "count", sources=ns, kind="cell")  # [local wolves]
    wolves_here = neighbor_reduce(grid, ns, True, "count", sources=nw, kind="cell")  # [local sheep]
    wolf_eats = w_rank < sheep_here
    eaten = s_rank < wolves_here
    energy = wolves["energy"] - 1 + ctx.params["wolf_gain"] * wolf_eats
    wolves["energy"] = energy
    ctx.kill("sheep", eaten)
    ctx.kill("wolf", energy < 0)


@model.substep(reads=["wolf.cell"], writes=["wolf.energy"], births=["wolf"])
def wolf_breed(ctx: Context) -> None:
    """With probability wolf_reproduce, halve energy and add a cub on the same cell."""
    _breed(ctx, "wolf", ctx.params["wolf_reproduce"])


@model.substep(writes=["env.grass", "env.countdown"])
def grass_regrow(ctx: Context) -> None:
    """Eaten patches count down and grow back (countdown reset to regrowth_time)."""
    env = ctx.env
    grass, countdown = env["grass"], env["countdown"]
    ready = ~grass & (countdown <= 0)
    env["countdown"] = torch.where(ready, ctx.params["regrowth_time"],
                                   torch.where(grass, countdown, countdown - 1))
    env["grass"] = grass | ready


@model.init
def init(ic: InitContext) -> Grid:
    """Sheep and wolves on random cells with random energies; half the grass grown."""
    p = ic.params
    n = ic.n_agents
    side = max(3, round(math.sqrt(n / p["density"])))
    grid = Grid((side, side), periodic=True)
    n_wolf = round(n * p["wolf_fraction"])
    # uids are unique within a population (each has its own random streams), from 0 for both.
    for name, count, gain in (("sheep", n - n_wolf, p["sheep_gain"]), ("wolf", n_wolf, p["wolf_gain"])):
        uid = ic.uids(name, count)
        cell = ic.rng.integers(uid, f"{name}_cell", grid.n_cells)
        energy = ic.rng.integers(uid, f"{name}_energy", max(1, int(2 * gain))).to(torch.float32)
        ic.add(name, uid=uid, cell=cell, energy=energy)
    cells = torch.arange(grid.n_cells, device=ic.device)
    grown = ic.rng.bernoulli(cells, "grass", 0.5)
    countdown = torch.where(grown, p["regrowth_time"], ic.rng.integers(cells, "countdown", p["regrowth_time"]))
    ic.add_env(grass=grown.reshape(grid.shape), countdown=countdown.to(torch.int32).reshape(grid.shape))
    return grid


model.display("n_sheep", label="sheep", color="tab:olive", panel="populations", unit="count")
model.display("n_wolf", label="wolves", color="tab:gray", panel="populations", unit="count")


@model.metric(label="grown grass cells", color="tab:green", unit="cells")
def grass(state: MetricsContext) -> torch.Tensor:
    """Grown grass patches (each cell counted once, on its owner)."""
    return state.owned_env("grass")


MODEL = model
