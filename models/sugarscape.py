"""Sugarscape: Epstein & Axtell, *Growing Artificial Societies* (1996), chapter II, rules G_alpha, M and R.

The landscape is a torus of cells (the book's 50 x 50 is a torus), each with a sugar
``capacity`` (0..4) and the ``sugar`` on it (at capacity at step 0). Agents hold distinct
cells and have a ``sugar`` wealth, a ``metabolism``, a ``vision``, an ``age`` and a
``max_age``. Each step, synchronously:

- **M (movement)**: ``look``: each agent looks as far as its vision in the four lattice
  directions (N, S, E, W) and picks, among its own cell and the visible cells unoccupied at
  the start of the step, the one with the most sugar, the nearest among equals, then a
  random direction (keyed by uid) among equals; ``move``: agents that picked the same cell
  contest it, the one with the smallest random key (keyed by uid) moves and the others stay;
  ``harvest``: each agent collects all the sugar of its cell.
- **Metabolism**: ``metabolize``: each agent burns ``metabolism`` sugar and ages by 1.
- **R (replacement)**: ``replace``: agents with sugar < 0 (starved) or age > max_age die,
  and each is replaced by a newborn with fresh random attributes (age 0) on a random cell
  that no surviving agent holds: the k-th dying agent by uid gets the k-th empty cell in an
  order of random keys of the cells, so no two newborns share a cell.
- **G_alpha (growback)**: ``regrow``: the sugar of every cell grows by ``alpha`` up to its
  capacity.

The book moves agents one at a time in random order; here every agent decides from the
state at the start of the step and contests are settled by random keys, so the result does
not depend on agent order (or on the number of processes).

Defaults, from the book (ch. II): 400 agents on 50 x 50 cells (``density`` 0.16: the grid
side grows with ``--agents`` so the density stays the book's); vision uniform in 1..6,
metabolism uniform in 1..4, initial endowment uniform in 5..25, maximum age uniform in
60..100, alpha = 1. The landscape is *of the book's shape*, not its map file: two sugar
peaks at (0.3, 0.7) and (0.7, 0.3) of the side (cells (15, 35) and (35, 15) on 50 x 50) with
capacity ``max(0, 4 - floor(distance / band))`` in concentric bands of width side / 10
(5 cells), the larger over the two peaks.

Metrics: ``wealth`` (total sugar held by agents), ``mean_vision``, ``mean_metabolism``,
and ``gini``, the Gini coefficient of wealth, exact: wealth is an integer, so the Gini follows
from the number of agents at each wealth value, ``wealth_hist`` (a histogram metric, the same
on any number of processes: bin ``w`` counts the agents with wealth ``w`` for ``w`` below
``WEALTH_CAP`` = 1000, the last bin every wealth >= 1000). ``over_cap`` counts the agents above
the cap, whose wealth the histogram does not know: ``gini`` is NaN when there are any (with the
defaults no wealth exceeds 25 + 3 * 100 = 325: an endowment, then at most 4 harvested less a
metabolism of at least 1 a step, for at most 100 steps). The cap is a constant, not a
parameter, since a histogram's bin edges are part of the metric's declaration.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from agentsim import ConfigError, Context, Grid, InitContext, MetricsContext, Model, Param, rank_in_group
from agentsim.core import ops
from agentsim.core.random import StepRNG

MAX_CAPACITY = 4  # the book's landscape: capacities 0..4
DIRECTIONS = ((-1, 0), (1, 0), (0, 1), (0, -1))  # N, S, E, W as (drow, dcol)
WEALTH_CAP = 1000  # wealth_hist: unit bins 0..WEALTH_CAP - 1, then one bin for every wealth >= WEALTH_CAP

model = Model(
    "sugarscape",
    params={
        "density": Param(0.16, "agents per cell at step 0 (sets the grid side; 400 agents: 50 x 50, the book's)",
                         gt=0, le=1),
        "alpha": Param(1, "sugar regrowth per step (rule G_alpha)", ge=0),
        "vision_max": Param(6, "vision uniform in 1..vision_max (cells)", ge=1),
        "metabolism_max": Param(4, "metabolism uniform in 1..metabolism_max (sugar per step)", ge=1),
        "endowment_min": Param(5, "initial sugar uniform in endowment_min..endowment_max", ge=0),
        "endowment_max": Param(25, "initial sugar uniform in endowment_min..endowment_max", ge=0),
        "max_age_min": Param(60, "maximum age uniform in max_age_min..max_age_max (steps)", ge=0),
        "max_age_max": Param(100, "maximum age uniform in max_age_min..max_age_max (steps)", ge=0),
    },
    description="Sugarscape (Epstein & Axtell ch. II): rules G_alpha, M and R on a torus",
    default_agents=400,
)


def uniform_int(rng: StepRNG, ids: torch.Tensor, stream: str, low: int, high: int) -> torch.Tensor:
    """Integers uniform in ``low..high`` (both included), keyed by ``ids`` (int64)."""
    return low + rng.integers(ids, stream, high=high - low + 1)


def attributes(rng: StepRNG, ids: torch.Tensor, p: Mapping[str, Any], prefix: str) -> dict[str, torch.Tensor]:
    """Fresh random attributes of agents keyed by ``ids``: sugar, metabolism, vision, age (0), max_age;
    each drawn from its own stream (``prefix`` + the field's name).
    """
    return {
        "sugar": uniform_int(rng, ids, f"{prefix}endowment", p["endowment_min"], p["endowment_max"]),
        "metabolism": uniform_int(rng, ids, f"{prefix}metabolism", 1, p["metabolism_max"]),
        "vision": uniform_int(rng, ids, f"{prefix}vision", 1, p["vision_max"]),
        "age": torch.zeros_like(ids),
        "max_age": uniform_int(rng, ids, f"{prefix}max_age", p["max_age_min"], p["max_age_max"]),
    }


def landscape(side: int) -> torch.Tensor:
    """Sugar capacity ``[side, side]`` int64: two peaks, bands of width side / 10 (integer arithmetic)."""
    rows = torch.arange(side, dtype=torch.int64).unsqueeze(1)
    cols = torch.arange(side, dtype=torch.int64).unsqueeze(0)
    capacity = torch.zeros(side, side, dtype=torch.int64)
    for pr, pc in ((round(0.3 * side), round(0.7 * side)), (round(0.7 * side), round(0.3 * side))):
        d2 = (rows - pr) ** 2 + (cols - pc) ** 2
        # floor(d / band) >= k  <=>  d^2 >= k^2 band^2  <=>  100 d^2 >= k^2 side^2 (band = side / 10)
        bands = torch.stack([100 * d2 >= k * k * side * side for k in range(1, MAX_CAPACITY + 1)]).sum(0)
        capacity = torch.maximum(capacity, MAX_CAPACITY - bands)
    return capacity


def candidates(grid: Grid, cell: torch.Tensor, reach: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The cells an agent can see, ``[n, 1 + 4 * reach]``: its own cell, then for each distance
    1..reach the cells N, S, E and W. Returns the cells, their distance and their direction
    (``[1 + 4 * reach]`` each; the own cell has distance 0 and direction -1).
    """
    row, col = grid.coords(cell)
    dist = torch.tensor([0] + [d for d in range(1, reach + 1) for _ in DIRECTIONS], dtype=torch.int64,
                        device=cell.device)
    direction = torch.tensor([-1] + [k for _ in range(reach) for k in range(len(DIRECTIONS))], dtype=torch.int64,
                             device=cell.device)
    step = torch.tensor([(0, 0)] + [DIRECTIONS[k] for k in direction[1:].tolist()], dtype=torch.int64,
                        device=cell.device)
    cells = grid.cell_index(row.unsqueeze(1) + step[:, 0] * dist, col.unsqueeze(1) + step[:, 1] * dist)
    return cells, dist, direction


def choose_targets(grid: Grid, sugar: torch.Tensor, occupied: torch.Tensor, cell: torch.Tensor,
                   vision: torch.Tensor, tie_keys: torch.Tensor, vision_max: int) -> torch.Tensor:
    """Rule M's choice: the target cell ``[n]`` of agents at ``cell`` with ``vision`` ``[n]``.

    Args:
        sugar: ``[n_cells]`` sugar per cell; occupied: ``[n_cells]`` bool (at the start of the step).
        tie_keys: ``[n, 4]`` int64 random keys of the directions N, S, E, W (the smallest wins a tie).
    """
    cells, dist, direction = candidates(grid, cell, vision_max)
    valid = (dist <= vision.unsqueeze(1)) & ~occupied[cells]
    valid[:, 0] = True  # the agent's own cell (occupied by itself)
    value = torch.where(valid, sugar[cells], -1)
    best = valid & (value == value.max(1, keepdim=True).values)
    near = torch.where(best, dist, vision_max + 1)
    best &= near == near.min(1, keepdim=True).values
    # Among equally rich and near cells (different directions), the direction with the smallest key.
    priority = torch.argsort(torch.argsort(tie_keys, dim=1, stable=True), dim=1, stable=True)  # rank 0..3
    order = torch.where(direction >= 0, priority.gather(1, direction.clamp(min=0).expand(cell.shape[0], -1)), -1)
    pick = torch.where(best, order, len(DIRECTIONS)).argmin(1, keepdim=True)
    return cells.gather(1, pick).squeeze(1)


@model.substep(reads=["agent.cell", "agent.vision", "env.sugar"], writes=["agent.target"],
               neighbors={"agent": ["cell"]}, reach="moore:vision_max")
def look(ctx: Context) -> None:
    """Rule M: the richest unoccupied visible cell (N, S, E, W up to vision), the nearest, then by a random key."""
    agents = ctx["agent"]
    grid: Grid = ctx.space
    nb = ctx.neighbors("agent")
    occupied = grid.occupancy(nb["cell"]) > 0
    tie_keys = ctx.rng.bits(agents["uid"], "direction", draws=len(DIRECTIONS))
    agents["target"] = choose_targets(grid, ctx.env["sugar"].reshape(-1), occupied, agents["cell"],
                                      agents["vision"], tie_keys, ctx.params["vision_max"])


# Two agents that target the same cell are each within vision_max of it: within 2 * vision_max of each other.
@model.substep(reads=["agent.target"], writes=["agent.cell"], neighbors={"agent": ["target"]},
               reach="moore:2*vision_max")
def move(ctx: Context) -> None:
    """Rule M: of the agents that picked the same cell, the one with the smallest random key moves; the others stay."""
    agents = ctx["agent"]
    nb = ctx.neighbors("agent")
    wins = rank_in_group(nb["target"], ctx.rng.bits(nb["uid"], "contest"))[: nb.n_local] == 0
    agents["cell"] = torch.where(wins, agents["target"], agents["cell"])


@model.substep(reads=["agent.cell"], writes=["agent.sugar", "env.sugar"], combine={"env.sugar": "set"})
def harvest(ctx: Context) -> None:
    """Rule M: each agent collects all the sugar of its cell."""
    agents, env = ctx["agent"], ctx.env
    sugar = env["sugar"].reshape(-1).clone()
    cell = agents["cell"]
    agents["sugar"] = agents["sugar"] + sugar[cell]
    sugar[cell] = 0
    env["sugar"] = sugar.reshape(env["sugar"].shape)


@model.substep(writes=["agent.sugar", "agent.age"], reads=["agent.metabolism"])
def metabolize(ctx: Context) -> None:
    """Each agent burns its metabolism in sugar and ages by one step."""
    agents = ctx["agent"]
    agents["sugar"] = agents["sugar"] - agents["metabolism"]
    agents["age"] = agents["age"] + 1


@model.substep(reads=["agent.cell", "agent.sugar", "agent.age", "agent.max_age"], births=["agent"],
               deaths=["agent"], neighbors={"agent": ["cell", "sugar", "age", "max_age"]}, reach="global")
def replace(ctx: Context) -> None:
    """Rule R: agents with sugar < 0 or age > max_age die; each is replaced by a newborn on a random empty cell."""
    grid: Grid = ctx.space
    nb = ctx.neighbors("agent")
    dies = (nb["sugar"] < 0) | (nb["age"] > nb["max_age"])  # every agent's, on every process
    empty = ops.flatnonzero(grid.occupancy(nb["cell"][~dies]) == 0)  # ascending cells no survivor holds
    dying = torch.sort(nb["uid"][dies]).values  # the k-th dying agent by uid ...
    vacancy = empty[torch.argsort(ctx.rng.bits(empty, "vacancy"), stable=True)][: dying.numel()]  # ... k-th cell
    mine = dies[: nb.n_local]
    parent = nb["uid"][: nb.n_local][mine]
    child = attributes(ctx.rng, parent, ctx.params, "newborn_")
    cell = vacancy[torch.searchsorted(dying, parent)]
    ctx.kill("agent", mine)
    ctx.spawn("agent", parent, {"cell": cell, "target": cell, **child})


@model.substep(reads=["env.capacity"], writes=["env.sugar"])
def regrow(ctx: Context) -> None:
    """Rule G_alpha: every cell's sugar grows by alpha, up to its capacity."""
    env = ctx.env
    env["sugar"] = torch.minimum(env["sugar"] + ctx.params["alpha"], env["capacity"])


@model.init
def init(ic: InitContext) -> Grid:
    """The two-peak landscape at capacity; agents on distinct random cells with random attributes."""
    p = ic.params
    n = ic.n_agents
    for low, high in (("endowment_min", "endowment_max"), ("max_age_min", "max_age_max")):
        if p[low] > p[high]:
            raise ConfigError(f"sugarscape: {low} ({p[low]}) must not exceed {high} ({p[high]})")
    side = max(2, round(math.sqrt(n / p["density"])))
    if n > side * side:
        raise ConfigError(f"sugarscape: {n} agents do not fit on {side} x {side} cells (density {p['density']})")
    grid = Grid((side, side), periodic=True)
    cells = torch.arange(grid.n_cells, device=ic.device)
    cell = ic.rng.choice(cells, n, "placement")  # n distinct cells
    uid = ic.uids("agent", n)
    ic.add("agent", uid=uid, cell=cell, target=cell.clone(), **attributes(ic.rng, uid, p, ""))
    capacity = landscape(side).to(ic.device)
    ic.add_env(capacity=capacity, sugar=capacity.clone())
    return grid


@model.metric()
def wealth(state: MetricsContext) -> torch.Tensor:
    """Total sugar held by agents."""
    return state["agent"]["sugar"]


@model.metric(reduce="mean")
def mean_vision(state: MetricsContext) -> torch.Tensor:
    """Mean vision (cells)."""
    return state["agent"]["vision"]


@model.metric(reduce="mean")
def mean_metabolism(state: MetricsContext) -> torch.Tensor:
    """Mean metabolism (sugar per step)."""
    return state["agent"]["metabolism"]


@model.metric(hist=[*range(WEALTH_CAP + 1), math.inf])
def wealth_hist(state: MetricsContext) -> torch.Tensor:
    """Agents per wealth: bin w holds wealth w (w < WEALTH_CAP), the last bin every wealth >= WEALTH_CAP."""
    return state["agent"]["sugar"]


@model.metric()
def over_cap(state: MetricsContext) -> torch.Tensor:
    """Agents whose wealth exceeds WEALTH_CAP (then the Gini is NaN)."""
    return state["agent"]["sugar"] > WEALTH_CAP


def gini_of_counts(counts: Sequence[int] | Any) -> float:
    """The Gini coefficient of a population given ``counts[w]``, the number of agents with wealth ``w``.

    ``G = sum_{i,j} |x_i - x_j| / (2 n sum_i x_i)``, the pair sum taken over wealth values in exact
    integer arithmetic; NaN without agents or wealth.

    Examples:
        >>> gini_of_counts([0, 2])   # everyone holds 1
        0.0
        >>> gini_of_counts([1, 0, 0, 1])   # 0 and 3
        0.5
    """
    n = total = pairs = 0  # agents, wealth and pair sum over the values below w
    for w, c in enumerate(int(c) for c in counts):
        if c:
            pairs += c * (w * n - total)  # sum over smaller values v of c * count(v) * (w - v)
            n += c
            total += c * w
    if n == 0 or total == 0:
        return float("nan")
    return pairs / (n * total)  # the double sum counts each pair twice: 2 * pairs / (2 * n * total)


@model.derived
def gini(m: dict[str, Any]) -> float:
    """The Gini coefficient of wealth, exact from wealth_hist (NaN if some agent is above WEALTH_CAP)."""
    if m["over_cap"] > 0:
        return float("nan")
    return gini_of_counts(m["wealth_hist"])


MODEL = model
