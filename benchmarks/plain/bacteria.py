"""Bacteria chasing a diffusing attractant on a grid torus (agentsim, plain torch substeps).

Units: one step, one cell; attractant and energy in arbitrary units (float64).

Each step, in this order:

1. ``diffuse`` (env only): ``A += rate * (N + S + E + W - 4 A) + source`` on a torus (5-point
   stencil, ``rate`` 0.1, ``source`` 0.01 per cell per step).
2. ``move``: every bacterium moves to one of its 4 von Neumann neighbours or stays (5 choices,
   equally likely).
3. ``eat``: the ``k`` bacteria of a cell share its attractant fairly: together they take
   ``min(k * ration, A)`` (``ration`` 0.05), each gets ``1/k`` of it. Each gains that as energy
   and pays ``cost`` (0.02); energy > 2 divides (parent and child get half each), energy <= 0
   dies. The per-cell head count comes from ``neighbor_reduce(kind="cell")`` (reach ``"cell"``),
   so every process computes the same cell total and the env write combines under ``"set"``.

Metrics: ``n_bacterium`` (the engine's head count; ``count`` in ``run``) and ``attractant``
(total over the grid).

Run: ``agentsim run benchmarks/plain/bacteria.py:MODEL --agents 200000 --steps 100`` or
``run(steps, seed, agents=..., height=..., width=...)`` below.
"""

from __future__ import annotations

import torch

import agentsim as asim

PARAMS = {
    "height": asim.Param(500, "grid rows (cells)", ge=3),
    "width": asim.Param(500, "grid columns (cells)", ge=3),
    "rate": asim.Param(0.1, "diffusion rate per neighbour per step", ge=0.0, le=0.25),
    "source": asim.Param(0.01, "attractant added per cell per step", ge=0.0),
    "initial": asim.Param(1.0, "attractant per cell at step 0", ge=0.0),
    "ration": asim.Param(0.05, "most attractant one bacterium eats per step", ge=0.0),
    "cost": asim.Param(0.02, "energy paid per step", ge=0.0),
    "divide_at": asim.Param(2.0, "energy above which a bacterium divides", gt=0.0),
}
MODEL = asim.Model("bacteria", params=PARAMS, default_agents=200_000)


@MODEL.init
def init(ic: asim.InitContext) -> asim.Grid:
    p = ic.params
    grid = asim.Grid((p["height"], p["width"]))  # a torus
    uid = ic.uids("bacterium", ic.n_agents)
    cell = ic.rng.integers(uid, "cell", high=grid.n_cells)  # int64 [n]
    energy = 0.5 + ic.rng.uniform(uid, "energy")  # float64 [n] in [0.5, 1.5)
    ic.add("bacterium", uid=uid, cell=cell, energy=energy)
    ic.add_env(attractant=torch.full(grid.shape, float(p["initial"]), dtype=torch.float64))
    return grid


@MODEL.substep(writes=["env.attractant"])
def diffuse(ctx: asim.Context) -> None:
    a, p = ctx.env["attractant"], ctx.params
    around = ctx.space.neighbor_sum(a, kind="von_neumann")  # N + S + E + W, wrapped
    ctx.env["attractant"] = a + p["rate"] * (around - 4.0 * a) + p["source"]


@MODEL.substep(writes=["bacterium.cell"])
def move(ctx: asim.Context) -> None:
    b, grid = ctx["bacterium"], ctx.space
    d = ctx.rng.integers(b["uid"], high=5)  # 0 stay, 1..4 the von Neumann neighbours
    dr = torch.tensor([0, -1, 1, 0, 0])[d]
    dc = torch.tensor([0, 0, 0, -1, 1])[d]
    row, col = grid.coords(b["cell"])
    b["cell"] = grid.cell_index(row + dr, col + dc)


@MODEL.substep(reads=["bacterium.cell"], writes=["bacterium.energy", "env.attractant"],
               neighbors={"bacterium": ["cell"]}, reach="cell",
               births=["bacterium"], deaths=["bacterium"])
def eat(ctx: asim.Context) -> None:
    b, p, nb = ctx["bacterium"], ctx.params, ctx.neighbors("bacterium")
    k = 1 + asim.neighbor_reduce(ctx.space, nb, True, "count", kind="cell")  # int32 [n]: bacteria here
    a = ctx.env["attractant"].reshape(-1).clone()
    here = a[b["cell"]]
    want = p["ration"] * k.double()
    taken = torch.minimum(want, here)  # the cell's total, the same for every bacterium of it
    energy = b["energy"] + taken / k - p["cost"]
    a[b["cell"]] = torch.where(want < here, here - want, torch.zeros_like(here))
    ctx.env["attractant"] = a.reshape(ctx.env["attractant"].shape)
    dies = energy <= 0
    divides = energy > p["divide_at"]
    energy = torch.where(divides, energy / 2, energy)
    b["energy"] = energy
    ctx.spawn("bacterium", b["uid"][divides], {"cell": b["cell"][divides], "energy": energy[divides]})
    ctx.kill("bacterium", dies)


@MODEL.metric()
def attractant(state: asim.MetricsContext) -> torch.Tensor:
    return state.owned_env("attractant")


def run(steps: int, seed: int, **sizes) -> dict:
    """Run with the Python API; ``sizes``: ``agents`` and any parameter (``height``, ``width``...)."""
    agents = sizes.pop("agents", MODEL.default_agents)
    m = asim.Simulation(MODEL, agents, seed, params=sizes).run(steps).metrics
    return {"count": m["n_bacterium"], "attractant": m["attractant"]}
