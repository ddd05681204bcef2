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

Neighbor sums use pairs in the canonical order of
:func:`agentsim.space.continuous.radius_pairs` (per boid, sources ordered by cell
then uid), so results do not depend on row order or on how boids are split over ranks.
They are computed chunk by chunk (:func:`~agentsim.space.continuous.radius_pair_chunks`),
which keeps the working set in cache and gives the same sums, from the displacements the
search computed anyway (``with_delta=True``), one dim at a time (the sums add the pairs of a boid
in pair order, as :func:`agentsim.core.ops.scatter_sum` does: :func:`agentsim.core.ops.scatter_sum_columns`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch

from agentsim import Box, Context, InitContext, MetricsContext, Model, Param, radius_pair_chunks
from agentsim.core import ops

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


def flock_headings(heading: torch.Tensor, i: torch.Tensor, j: torch.Tensor, delta: torch.Tensor,
                   dist2: torch.Tensor, params: Mapping[str, float], start: int = 0,
                   stop: int | None = None) -> torch.Tensor:
    """New unit headings ``[2, stop - start]`` of the targets ``start .. stop - 1``, in columns.

    Args:
        heading: ``[2, n]`` unit headings of local then halo boids, one contiguous row
            per dim (``heading[k, r]`` is component ``k`` of row ``r``).
        i, j: ``[m]`` int64 or int32 target and source rows of every pair of the targets,
            in canonical order (each ``i`` in ``[start, stop)``).
        delta: ``[2, m]`` displacement from target to source (minimum image, length units).
        dist2: ``[m]`` squared length of ``delta`` (components added in dim order).
        start, stop: The target rows (default: all rows of ``heading``).

    Returns:
        ``[2, stop - start]``: the steered, renormalized headings; a boid with no pairs
        keeps its own.
    """
    stop = heading.shape[1] if stop is None else stop
    n = stop - start
    t = i - start if start else i
    count = torch.bincount(t, minlength=n)
    denom = count.clamp(min=1).to(heading.dtype)
    close = dist2 < params["separation"] ** 2
    old = heading[:, start:stop]
    # Per dim, three sums over 1D columns: each adds the pairs in pair order (index_add_'s bits),
    # as a reduction over [m, 2] rows would, without its strided temporaries; all six in one pass.
    dims = range(heading.shape[0])
    columns = [col for k in dims for col in (delta[k], delta[k] * close, heading[k].index_select(0, j))]
    sums = ops.scatter_sum_columns(columns, t, n)
    new = []
    for k in dims:
        sum_delta, sum_close, sum_heading = sums[3 * k:3 * k + 3]
        steer = (params["cohere"] * sum_delta - params["separate"] * sum_close
                 + params["match"] * sum_heading) / denom
        new.append(old[k] + steer)
    norm = torch.sqrt(new[0] * new[0] + new[1] * new[1])
    return torch.where(count > 0, torch.stack(new) / norm, old)


@model.substep(reads=["boid.pos"], writes=["boid.heading"], neighbors={"boid": ["pos", "heading"]},
               reach="vision", agentwise=True)
def flock(ctx: Context) -> None:
    """Cohere, separate and match with the neighbors within ``vision``."""
    boids = ctx["boid"]
    nb = ctx.neighbors("boid")
    heading = torch.stack([nb["heading"][:, k] for k in range(2)])  # [2, n]: 1D gathers are the fastest
    new = heading[:, : nb.n_local].clone()
    # Chunk by chunk (each holds every pair of its boids): the pair list never materializes
    # whole, and each chunk's gathers and sums stay in cache. Same sums, same bits. int32
    # rows: read six times per chunk, half the bytes (less traffic for the other core).
    for c in radius_pair_chunks(nb["pos"], ctx.space, ctx.params["vision"], uid=nb["uid"],
                                n_query=nb.n_local, with_delta=True, index_dtype=torch.int32):
        assert c.delta is not None and c.dist2 is not None  # with_delta=True
        new[:, c.start:c.stop] = flock_headings(heading, c.i, c.j, c.delta, c.dist2, ctx.params,
                                                c.start, c.stop)
    boids["heading"] = torch.stack(list(new), dim=1)  # [n_local, 2]; faster than new.t().contiguous()


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
    heading = torch.stack([torch.cos(angle), torch.sin(angle)], -1).to(torch.float32)
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
