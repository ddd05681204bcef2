"""Random walk: agents take Gaussian steps in a periodic box. The simplest model and the
scaling baseline.

Each step every walker moves by ``step_size * N(0, I) + drift`` (units: box lengths
per step) and wraps around the box. The unwrapped displacement since step 0 is kept
in ``disp``, so the mean squared displacement has the known value
``MSD(t) = ndim * step_size**2 * t + |drift|**2 * t**2``.

The box side grows with the number of agents so that the density stays at ``density``.
``init_extent < 1`` starts every walker in the corner square of side ``init_extent * side``
(crowded start; used to demonstrate load balancing).
"""

from __future__ import annotations

import math

import torch

from agentsim import Box, Context, InitContext, MetricsContext, Model, Param
from agentsim.core.metrics import ExactSum, sum_of_squares

model = Model(
    "randomwalk",
    params={
        "density": Param(1.0, "walkers per unit area", gt=0),
        "step_size": Param(1.0, "std. dev. of each step per axis (length units)", ge=0),
        "drift_x": Param(0.0, "drift per step along x (length units)"),
        "drift_y": Param(0.0, "drift per step along y (length units)"),
        "init_extent": Param(1.0, "walkers start in [0, init_extent * side)^2 (1 = the whole box)", gt=0, le=1),
    },
    description="Gaussian random walk with optional drift in a periodic box",
    default_agents=10_000,
)


@model.substep(writes=["walker.pos", "walker.disp"])
def move(ctx: Context) -> None:
    """Gaussian step plus drift, wrapped into the periodic box."""
    w = ctx["walker"]
    p = ctx.params
    # z * step_size + drift in the pass that draws z (stream "move"; x and y from the two outputs of
    # one Box-Muller transform: paired=True); then the moves in place (at 10M walkers every new
    # [n, 2] tensor and every extra pass costs tens of milliseconds)
    delta = ctx.rng.normal(w["uid"], draws=2, dtype=torch.float32, mean=(p["drift_x"], p["drift_y"]),
                           std=p["step_size"], paired=True)
    w["disp"].add_(delta)
    ctx.space.move(w["pos"], delta)


@model.init
def init(ic: InitContext) -> Box:
    """Walkers uniform in a periodic box of side sqrt(n / density) (or its corner, init_extent < 1)."""
    n = ic.n_agents
    side = math.sqrt(n / ic.params["density"])
    box = Box((side, side), periodic=True)
    uid = ic.uids("walker", n)
    # side * 1.0 == side exactly: the default start is bit-identical to the whole-box start.
    extent = side * ic.params["init_extent"]
    pos = box.wrap(ic.rng.uniform(uid, "init_pos", draws=2, dtype=torch.float32) * extent)
    ic.add("walker", uid=uid, pos=pos, disp=torch.zeros(n, 2, device=ic.device))
    return box


@model.metric()
def sum_sq_disp(state: MetricsContext) -> ExactSum:
    """Squared displacement of every walker since step 0, summed exactly: the sum of
    ``ops.squared_norm(disp)`` (x * x + y * y in float64) in one pass, without that column.
    """
    return sum_of_squares(state["walker"]["disp"])


@model.derived
def msd(m: dict[str, float]) -> float:
    """Mean squared displacement."""
    return m["sum_sq_disp"] / max(m["n_walker"], 1)


MODEL = model
