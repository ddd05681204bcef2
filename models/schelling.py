"""Schelling segregation on a 2D grid, a torus unless ``torus=False`` (a bounded grid, where cells at
the border have fewer neighbors).

Residents of two groups occupy distinct cells of a grid with ``density`` of the
cells filled. Each step, synchronously:

1. ``relocate``: residents found unhappy by the last assessment move to cells that were empty at the start of
   the step, with no two residents taking the same cell. Movers and empty cells are
   each ordered by a random key (counter-based, keyed by uid and by cell index), and
   the k-th mover takes the k-th empty cell; when there are fewer empty cells than
   movers, the movers with the largest keys stay;
2. ``assess``: a resident is happy when at least ``homophily`` of its Moore
   neighbors (radius ``radius``) belong to its own group (also done at step 0).

Metrics: ``happy`` (count) and ``segregation``, the mean over residents with at
least one neighbor of the fraction of neighbors in their own group. With equal
groups it starts near 0.5 and rises to about 0.7-0.8 with the defaults, the range
reported since Schelling (1971) for a tolerance of 3 of 8 neighbors.
"""

from __future__ import annotations

import math

import torch

from agentsim import ConfigError, Context, Grid, InitContext, MetricsContext, Model, Param, neighbor_reduce
from agentsim.core import ops

model = Model(
    "schelling",
    params={
        "density": Param(0.8, "fraction of cells occupied (sets the grid side)", gt=0, lt=1),
        "minority_fraction": Param(0.5, "fraction of residents in group 1", ge=0, le=1),
        "homophily": Param(3, "similar neighbors needed to be happy", ge=0),
        "radius": Param(1, "Moore neighborhood radius (cells)", ge=1),
        "torus": Param(True, "the grid wraps around (False: bounded, as the ABM framework comparison declares it)"),
    },
    description="Schelling segregation on a grid (a torus by default)",
    default_agents=10_000,
)


def assessment(grid: Grid, cell: torch.Tensor, group: torch.Tensor, homophily: int, radius: int,
               n_local: int) -> dict[str, torch.Tensor]:
    """Similar and occupied Moore-neighbor counts and happiness of the first ``n_local`` residents.

    Args:
        cell, group: ``[n]`` of every resident that can be a neighbor (local rows first).

    Returns:
        ``similar``, ``occupied`` (int16 ``[n_local]``) and ``happy`` (bool ``[n_local]``).
    """
    # Per-source flags: neighbor_reduce counts them over cell layers (exact integers).
    near = neighbor_reduce(grid, {"cell": cell}, {"occupied": True, "group1": group == 1}, "count", radius=radius,
                           n_targets=n_local)
    total, ones_near = near["occupied"], near["group1"]
    similar = torch.where(group[:n_local] == 1, ones_near, total - ones_near)
    return {"similar": similar.to(torch.int16), "occupied": total.to(torch.int16), "happy": similar >= homophily}


def smallest_keys(keys: torch.Tensor, m: int) -> torch.Tensor:
    """Positions of the ``m`` smallest of distinct ``keys`` ``[k]``, smallest first.

    The keys are counter-based bits of distinct ids (uids, cell indices): the hash is a bijection
    of 64-bit words, so they never tie and a partial selection (``topk``, much faster for a few
    movers among many) gives the order of a full stable sort.
    """
    if 8 * m < keys.numel():
        return torch.topk(keys, m, largest=False, sorted=True).indices
    return torch.argsort(keys, stable=True)[:m]


@model.substep(reads=["resident.happy"], writes=["resident.cell"], neighbors={"resident": ["cell", "happy"]},
               reach="global")
def relocate(ctx: Context) -> None:
    """Unhappy residents move to distinct cells that were empty at the start of the step."""
    res = ctx["resident"]
    grid: Grid = ctx.space
    nb = ctx.neighbors("resident")
    cell_all = nb["cell"]
    empty = ops.flatnonzero(grid.occupancy(cell_all) == 0)  # ascending, as torch.nonzero (5x faster)
    movers = ops.flatnonzero(~nb["happy"])
    m = min(movers.numel(), empty.numel())
    if m == 0:
        return
    movers = movers.index_select(0, smallest_keys(ctx.rng.bits(nb["uid"].index_select(0, movers), "mover"), m))
    target = empty.index_select(0, smallest_keys(ctx.rng.bits(empty, "vacancy"), m))
    local = movers < nb.n_local
    res["cell"].index_copy_(0, movers[local], target[local])  # in place (a declared write)


@model.substep(reads=["resident.cell", "resident.group"],
               writes=["resident.happy", "resident.similar", "resident.occupied"],
               neighbors={"resident": ["cell", "group"]}, reach="moore:radius")
def assess(ctx: Context) -> None:
    """Happy if at least ``homophily`` Moore neighbors share the resident's group."""
    res = ctx["resident"]
    nb = ctx.neighbors("resident")
    out = assessment(ctx.space, nb["cell"], nb["group"], ctx.params["homophily"], ctx.params["radius"], nb.n_local)
    for key, value in out.items():
        res[key] = value


@model.init
def init(ic: InitContext) -> Grid:
    """Residents on distinct random cells of a grid sized for ``density``; groups at random; assessed."""
    n = ic.n_agents
    side = max(2, math.ceil(math.sqrt(n / ic.params["density"])))
    if n >= side * side:
        raise ConfigError(f"schelling: {n} residents do not fit with density {ic.params['density']}")
    grid = Grid((side, side), periodic=ic.params["torus"])
    cells = torch.arange(grid.n_cells, device=ic.device)
    chosen = ic.rng.choice(cells, n, "placement")  # n distinct cells
    uid = ic.uids("resident", n)
    group = (ic.rng.uniform(uid, "group") < ic.params["minority_fraction"]).to(torch.int8)
    first = assessment(grid, chosen, group, ic.params["homophily"], ic.params["radius"], n)
    ic.add("resident", uid=uid, cell=chosen, group=group, **first)
    return grid


@model.metric(label="happy residents (share)", color="tab:cyan", panel="segregation", share_of="n_resident",
              unit="share", limits=(0, 1.02))
def happy(state: MetricsContext) -> torch.Tensor:
    """Residents happy at the last assessment."""
    return state["resident"]["happy"]


@model.metric()
def sum_similar_fraction(state: MetricsContext) -> torch.Tensor:
    """Per resident with neighbors, the fraction of them in its own group (0 for the others)."""
    res = state["resident"]
    occ = res["occupied"].to(torch.float64)
    return torch.where(occ > 0, res["similar"].to(torch.float64) / occ.clamp(min=1), 0.0)


@model.metric()
def with_neighbors(state: MetricsContext) -> torch.Tensor:
    """Residents with at least one neighbor."""
    return state["resident"]["occupied"] > 0


@model.derived(label="segregation (mean similar-neighbor share)", color="tab:brown", panel="segregation",
               unit="share", limits=(0, 1.02))
def segregation(m: dict[str, float]) -> float:
    """Mean fraction of same-group neighbors over residents with neighbors."""
    return m["sum_similar_fraction"] / max(m["with_neighbors"], 1)


MODEL = model
