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

from agentsim.model import InitContext, MetricsContext, Model
from agentsim.params import Param, ParamSpec
from agentsim.space.continuous import Box
from agentsim.state import FieldSpec, Population, State
from agentsim.substep import Registry

registry = Registry()

PARAMS = ParamSpec({
    "density": Param(1.0, float, "walkers per unit area", check=lambda v: v > 0, expect="> 0"),
    "step_size": Param(1.0, float, "std. dev. of each step per axis (length units)",
                       check=lambda v: v >= 0, expect=">= 0"),
    "drift_x": Param(0.0, float, "drift per step along x (length units)"),
    "drift_y": Param(0.0, float, "drift per step along y (length units)"),
    "init_extent": Param(1.0, float, "walkers start in [0, init_extent * side)^2 (1 = the whole box)",
                         check=lambda v: 0 < v <= 1, expect="in (0, 1]"),
})


@registry.substep(reads=["walker.pos", "walker.disp"], writes=["walker.pos", "walker.disp"])
def move(ctx):
    """Gaussian step plus drift, wrapped into the periodic box."""
    w = ctx["walker"]
    p = ctx.params
    noise = ctx.rng.normal(w["uid"], "move", draws=2, dtype=torch.float32)
    delta = p["step_size"] * noise + torch.tensor([p["drift_x"], p["drift_y"]], dtype=torch.float32,
                                                  device=noise.device)
    w["disp"] = w["disp"] + delta
    w["pos"] = ctx.space.wrap(w["pos"] + delta)


def init(ic: InitContext) -> tuple[State, Box]:
    n = ic.n_agents
    side = math.sqrt(n / ic.params["density"])
    box = Box((side, side), periodic=True)
    uid = torch.arange(n, device=ic.device)
    # side * 1.0 == side exactly: the default start is bit-identical to the whole-box start.
    extent = side * ic.params["init_extent"]
    pos = box.wrap(ic.rng.uniform(uid, 0, "init_pos", draws=2, dtype=torch.float32) * extent)
    walkers = Population(
        "walker",
        {"pos": FieldSpec(torch.float32, (2,)), "disp": FieldSpec(torch.float32, (2,))},
        {"uid": uid, "pos": pos, "disp": torch.zeros(n, 2, device=ic.device)},
    )
    return State({"walker": walkers}), box


def metrics(mc: MetricsContext) -> dict[str, torch.Tensor]:
    disp = mc.state["walker"]["disp"]
    x, y = disp[:, 0].to(torch.float64), disp[:, 1].to(torch.float64)
    return {"sum_sq_disp": x * x + y * y}


def derive(m: dict[str, float]) -> dict[str, float]:
    return {"msd": m["sum_sq_disp"] / max(m["n_walker"], 1)}


MODEL = Model("randomwalk", registry, ["move"], PARAMS, init, metrics, derive,
              description="Gaussian random walk with optional drift in a periodic box",
              default_agents=10_000)
