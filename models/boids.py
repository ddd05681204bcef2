"""Boids flocking in a periodic 2D box, with the rules of Mesa's ``boid_flockers``.

Every boid looks at the other boids within ``vision`` (minimum-image distance,
inclusive) and, synchronously (all boids read the state at the start of the step):

- ``delta_ij = pos_j - pos_i`` (minimum image), summed over neighbors ``j``;
- cohere: ``cohere * sum_j delta_ij``;
- separate: ``-separate * sum_{j: |delta_ij| < separation} delta_ij``;
- match: ``match * sum_j heading_j``;
- ``heading_i += (cohere + separate + match) / n_neighbors``, then normalized to unit length;
- ``pos_i += speed * heading_i``, wrapped into the box.

A boid with no neighbors keeps its heading. Defaults: cohere 0.03, separate 0.015,
separation 1.0, match 0.05, speed 1, vision 10 (Mesa's defaults) and a density of
0.01 boids per unit area (Mesa's 100 boids in a 100 x 100 box); the box side grows
as ``sqrt(n / density)`` so density stays fixed at any ``--agents``.

Neighbor sums come from :func:`agentsim.neighbor_reduce`: the pairs within ``vision``, each
boid's added in the canonical pair order of :func:`agentsim.space.continuous.radius_pairs`
(per boid, sources ordered by cell then uid), so results do not depend on row order or on how
boids are split over ranks.
"""

from __future__ import annotations

import math

import torch

from agentsim import Box, Context, InitContext, MetricsContext, Model, PairView, Param, neighbor_reduce
from agentsim.core import portable

model = Model(
    "boids",
    params={
        "density": Param(0.01, "boids per unit area (sets the box side)", gt=0),
        "vision": Param(10.0, "neighbor radius (length units)", gt=0),
        "separation": Param(1.0, "distance below which boids repel (length units)", ge=0),
        "cohere": Param(0.03, "weight of the pull toward neighbors", ge=0),
        "separate": Param(0.015, "weight of the push away from close neighbors", ge=0),
        "match": Param(0.05, "weight of heading alignment", ge=0),
        "speed": Param(1.0, "distance moved per step (length units)", ge=0),
    },
    description="Boids flocking in a periodic 2D box (Mesa boid_flockers rules)",
    default_agents=10_000,
)


@model.substep(reads=["boid.pos"], writes=["boid.heading"], neighbors={"boid": ["pos", "heading"]},
               reach="vision", agentwise=True)
def flock(ctx: Context) -> None:
    """Cohere, separate and match with the neighbors within ``vision`` (Mesa's rules)."""
    p, nb = ctx.params, ctx.neighbors("boid")

    def rules(pair: PairView) -> dict[str, torch.Tensor | bool]:
        close = (pair.dist2 < p["separation"] ** 2).unsqueeze(1)
        return {"cohere": pair.delta, "separate": pair.delta * close, "match": pair.source["heading"], "n": True}

    s = neighbor_reduce(ctx.space, nb, rules, {"n": "count"}, radius=p["vision"])
    n = s["n"].unsqueeze(1)
    steer = p["cohere"] * s["cohere"] - p["separate"] * s["separate"] + p["match"] * s["match"]
    heading = nb["heading"][: nb.n_local]
    new = heading + steer / n.clamp(min=1)
    x, y = new[:, :1], new[:, 1:]
    ctx["boid"]["heading"] = torch.where(n > 0, new / portable.sqrt(x * x + y * y), heading)  # alone: keeps it


@model.substep(reads=["boid.heading"], writes=["boid.pos"])
def move(ctx: Context) -> None:
    """Advance ``speed`` along the heading and wrap into the box."""
    boids = ctx["boid"]
    boids["pos"] = ctx.space.wrap(boids["pos"] + ctx.params["speed"] * boids["heading"])


@model.init
def init(ic: InitContext) -> Box:
    """Boids uniform in a periodic box of side sqrt(n / density), headings uniform on the circle."""
    n = ic.n_agents
    side = math.sqrt(n / ic.params["density"])
    box = Box((side, side), periodic=True)
    uid = ic.uids("boid", n)
    pos = box.wrap(ic.rng.uniform(uid, "init_pos", draws=2, dtype=torch.float32) * side)
    angle = ic.rng.uniform(uid, "init_heading", dtype=torch.float64) * (2 * math.pi)
    heading = torch.stack([portable.cos(angle), portable.sin(angle)], -1).to(torch.float32)
    ic.add("boid", uid=uid, pos=pos, heading=heading)
    return box


# float32 columns: the exact sum converts each value exactly.
@model.metric()
def sum_heading_x(state: MetricsContext) -> torch.Tensor:
    """X component of every heading."""
    return state["boid"]["heading"][:, 0]


@model.metric()
def sum_heading_y(state: MetricsContext) -> torch.Tensor:
    """Y component of every heading."""
    return state["boid"]["heading"][:, 1]


@model.derived(label="polarization", unit="|mean heading| (1: all aligned)", color="tab:purple", limits=(0, 1.02))
def polarization(m: dict[str, float]) -> float:
    """Length of the mean heading (0 = disordered, 1 = all aligned)."""
    return math.hypot(m["sum_heading_x"], m["sum_heading_y"]) / max(m["n_boid"], 1)


MODEL = model
