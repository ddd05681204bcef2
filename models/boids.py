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
search computed anyway (``with_delta=True``), one dim at a time (``index_add_`` adds the
pairs of a boid in pair order, as :func:`agentsim.ops.scatter_sum` does).
"""

from __future__ import annotations

import math

import torch

from agentsim.model import InitContext, MetricsContext, Model
from agentsim.params import Param, ParamSpec
from agentsim.space.continuous import Box, radius_pair_chunks
from agentsim.state import FieldSpec, Population, State
from agentsim.substep import Registry

registry = Registry()

_pos = lambda v: v > 0  # noqa: E731
_nonneg = lambda v: v >= 0  # noqa: E731

PARAMS = ParamSpec({
    "density": Param(0.01, float, "boids per unit area (sets the box side)", check=_pos, expect="> 0"),
    "vision": Param(10.0, float, "neighbor radius (length units)", check=_pos, expect="> 0"),
    "separation": Param(1.0, float, "distance below which boids repel (length units)",
                        check=_nonneg, expect=">= 0"),
    "cohere": Param(0.03, float, "weight of the pull toward neighbors", check=_nonneg, expect=">= 0"),
    "separate": Param(0.015, float, "weight of the push away from close neighbors",
                      check=_nonneg, expect=">= 0"),
    "match": Param(0.05, float, "weight of heading alignment", check=_nonneg, expect=">= 0"),
    "speed": Param(1.0, float, "distance moved per step (length units)", check=_nonneg, expect=">= 0"),
})


def flock_headings(heading: torch.Tensor, i: torch.Tensor, j: torch.Tensor, delta: torch.Tensor,
                   dist2: torch.Tensor, params: dict, start: int = 0, stop: int | None = None) -> torch.Tensor:
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
    # One dim at a time, on 1D tensors: index_add_ adds the pairs in pair order, as a
    # reduction over [m, 2] rows would, without its strided temporaries.
    new = []
    for k in range(heading.shape[0]):
        sum_delta = delta.new_zeros(n).index_add_(0, t, delta[k])
        sum_close = delta.new_zeros(n).index_add_(0, t, delta[k] * close)
        sum_heading = delta.new_zeros(n).index_add_(0, t, heading[k].index_select(0, j))
        steer = (params["cohere"] * sum_delta - params["separate"] * sum_close
                 + params["match"] * sum_heading) / denom
        new.append(old[k] + steer)
    norm = torch.sqrt(new[0] * new[0] + new[1] * new[1])
    return torch.where(count > 0, torch.stack(new) / norm, old)


@registry.substep(reads=["boid.pos", "boid.heading"], writes=["boid.heading"],
                  neighbors={"boid": ["pos", "heading"]}, reach="vision", agentwise=True)
def flock(ctx):
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
        new[:, c.start:c.stop] = flock_headings(heading, c.i, c.j, c.delta, c.dist2, ctx.params,
                                                c.start, c.stop)
    boids["heading"] = torch.stack(list(new), dim=1)  # [n_local, 2]; faster than new.t().contiguous()


@registry.substep(reads=["boid.pos", "boid.heading"], writes=["boid.pos"])
def move(ctx):
    """Advance ``speed`` along the heading and wrap into the box."""
    boids = ctx["boid"]
    boids["pos"] = ctx.space.wrap(boids["pos"] + ctx.params["speed"] * boids["heading"])


def init(ic: InitContext) -> tuple[State, Box]:
    n = ic.n_agents
    side = math.sqrt(n / ic.params["density"])
    box = Box((side, side), periodic=True)
    uid = torch.arange(n, device=ic.device)
    pos = box.wrap(ic.rng.uniform(uid, 0, "init_pos", draws=2, dtype=torch.float32) * side)
    angle = ic.rng.uniform(uid, 0, "init_heading", dtype=torch.float64) * (2 * math.pi)
    heading = torch.stack([torch.cos(angle), torch.sin(angle)], -1).to(torch.float32)
    boids = Population("boid", {"pos": FieldSpec(torch.float32, (2,)),
                                "heading": FieldSpec(torch.float32, (2,))},
                       {"uid": uid, "pos": pos, "heading": heading})
    return State({"boid": boids}), box


def metrics(mc: MetricsContext) -> dict[str, torch.Tensor]:
    h = mc.state["boid"]["heading"]  # float32 columns: the exact sum converts each value exactly
    return {"sum_heading_x": h[:, 0], "sum_heading_y": h[:, 1]}


def derive(m: dict[str, float]) -> dict[str, float]:
    """Polarization: length of the mean heading (0 = disordered, 1 = all aligned)."""
    n = max(m["n_boid"], 1)
    return {"polarization": math.hypot(m["sum_heading_x"], m["sum_heading_y"]) / n}


MODEL = Model("boids", registry, ["flock", "move"], PARAMS, init, metrics, derive,
              description="Boids flocking in a periodic 2D box (Mesa boid_flockers rules)",
              default_agents=10_000)
