"""Circles: FLAME GPU 2's spatial benchmark model, points that repel and attract within a radius.

Agents are points in a bounded 3D box (2D with ``dims=2``). Every step, synchronously (all
points read the state at the start of the step), each point ``i`` sums over the other points
``j`` at a separation ``0 < s_ij < radius``:

- ``k_ij = sin(-2 * 3.141 * s_ij / radius) * repulse`` (``3.141``, as FLAME GPU 2 writes it);
- ``f_i = sum_j k_ij * (pos_j - pos_i) / s_ij / max(count_i, 1)``: repulsion below half the
  radius, attraction above it, averaged over the ``count_i`` points in range;
- ``pos_i += f_i``, clamped into the box; ``drift_i = |f_i|``.

These are the rules of FLAME GPU 2's ``circles_spatial3D`` example (its ``move`` function),
the model of its published benchmarks; defaults are the benchmark's: density 1 point per unit
volume (the box side grows as ``(n / density) ** (1 / dims)``), radius 2, repulse 0.05, positions
uniform in the box. One difference: FLAME GPU 2 leaves a point that steps out of the box where
it is (its messages are binned into the edge cells), here it is clamped onto the box's face. The
mean drift falls as the points settle into a lattice (:func:`mean_drift`).

Forces are summed by :func:`agentsim.neighbor_reduce` over pairs in the canonical order of
:func:`agentsim.space.continuous.radius_pairs` (per point, sources by cell then uid), so results
do not depend on row order or on how the points are split over ranks. Float32 positions, as FLAME GPU 2's.
``sin`` and ``sqrt`` are :mod:`agentsim.core.portable`'s, so a run on a GPU (where the force rule
runs as one fused kernel) gives the CPU's bits.
"""

from __future__ import annotations

import torch

from agentsim import Box, Context, InitContext, MetricsContext, Model, PairView, Param, neighbor_reduce
from agentsim.core import portable

PI = 3.141  # FLAME GPU 2's constant in the force (not math.pi): same forces as its benchmark

model = Model(
    "circles",
    params={
        "density": Param(1.0, "points per unit volume (per unit area with dims=2); sets the box side", gt=0),
        "radius": Param(2.0, "interaction radius (length units)", gt=0),
        "repulse": Param(0.05, "force scale (length units moved per step at most)", ge=0),
        "dims": Param(3, "2 or 3 dimensions", choices=(2, 3)),
    },
    description="Circles: FLAME GPU 2's spatial benchmark (points repel and attract within a radius, bounded 3D box)",
    default_agents=10_000,
)


@model.substep(reads=["point.pos"], writes=["point.pos", "point.drift"], neighbors={"point": ["pos"]},
               reach="radius", agentwise=True)
def move(ctx: Context) -> None:
    """Sum the pair forces within ``radius``, move by their mean, clamp into the box."""
    p = ctx.params

    def push(pair: PairView) -> dict[str, torch.Tensor]:
        sep = pair.dist
        # The search's radius is inclusive; FLAME's test is strict (and a point at 0 feels nothing).
        in_range = (sep < p["radius"]) & (sep > 0)
        k_over_sep = torch.where(in_range, portable.sin(sep / p["radius"] * (PI * -2)) * p["repulse"] / sep, 0.0)
        return {"force": pair.delta * k_over_sep.unsqueeze(1), "n": in_range}

    s = neighbor_reduce(ctx.space, ctx.neighbors("point"), push, {"n": "count"}, radius=p["radius"])
    force = s["force"] / s["n"].clamp(min=1).unsqueeze(1)  # [n, dims]: the mean force
    points = ctx["point"]
    points["pos"] = ctx.space.wrap(points["pos"] + force)
    length2 = force[:, 0] * force[:, 0]  # squares added in dim order: the same bits on every device
    for k in range(1, force.shape[1]):
        length2 = length2 + force[:, k] * force[:, k]
    points["drift"] = portable.sqrt(length2)


@model.init
def init(ic: InitContext) -> Box:
    """Points uniform in a bounded box of side ``(n / density) ** (1 / dims)``, no drift yet."""
    n, dims = ic.n_agents, int(ic.params["dims"])
    side = (n / ic.params["density"]) ** (1.0 / dims)
    box = Box((side,) * dims, periodic=False)
    uid = ic.uids("point", n)
    pos = box.wrap(ic.rng.uniform(uid, "init_pos", draws=dims, dtype=torch.float32) * side)
    ic.add("point", uid=uid, pos=pos, drift=torch.zeros(n, dtype=torch.float32, device=pos.device))
    return box


@model.metric()
def sum_drift(state: MetricsContext) -> torch.Tensor:
    """Length of every point's last move."""
    return state["point"]["drift"]


@model.derived
def mean_drift(m: dict[str, float]) -> float:
    """Mean length of the last move (falls toward 0 as the points settle)."""
    return m["sum_drift"] / max(m["n_point"], 1)


MODEL = model
