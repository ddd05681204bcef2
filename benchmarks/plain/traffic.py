"""Nagel-Schreckenberg traffic, one lane on a ring road (agentsim, plain torch substeps).

Units: one step (about 1 s), one cell (about 7.5 m); speeds in cells per step.

Every car, from the state at the start of the step (parallel update):

1. accelerates: ``v = min(v + 1, vmax)`` (``vmax`` 5);
2. brakes to the gap: ``v = min(v, gap)``, ``gap`` the empty cells to the car ahead;
3. dawdles: ``v = v - 1`` with probability ``p_slow`` (0.3) if ``v > 0``;
4. moves ``v`` cells.

The road is a ring of cells (``asim.Line(length, cells=True)``); a car finds its gap with
``asim.nearest``: the car ahead within ``vmax`` cells (the substep's declared reach), if any.
Cars start on distinct random cells with ``v = 0``.

Metric: ``speed``, the mean speed (cells per step).

Run: ``agentsim run benchmarks/plain/traffic.py:MODEL --agents 200000 --steps 100`` or
``run(steps, seed, agents=..., length=...)`` below.
"""

from __future__ import annotations

import torch

import agentsim as asim

PARAMS = {
    "length": asim.Param(1_000_000, "road length (cells); must exceed the number of cars", ge=2),
    "vmax": asim.Param(5, "speed limit (cells per step)", ge=1),
    "p_slow": asim.Param(0.3, "probability of a random slowdown per step", ge=0.0, le=1.0),
}
MODEL = asim.Model("traffic", params=PARAMS, default_agents=200_000)


@MODEL.init
def init(ic: asim.InitContext) -> asim.Line:
    length = ic.params["length"]
    if ic.n_agents > length:
        raise asim.ConfigError(f"{ic.n_agents} cars do not fit on {length} cells")
    road = asim.Line(length, cells=True)
    uid = ic.uids("car", ic.n_agents)
    cells = ic.rng.choice(torch.arange(length), ic.n_agents, "place")  # distinct cells, drawn by cell
    ic.add("car", uid=uid, x=cells, v=torch.zeros_like(uid))
    return road


@MODEL.substep(reads=["car.x"], writes=["car.v", "car.x"], neighbors={"car": ["x"]}, reach="vmax")
def drive(ctx: asim.Context) -> None:
    car, road, p = ctx["car"], ctx.space, ctx.params
    # the car ahead within vmax cells; none: as if it were at vmax + 1
    ahead = asim.nearest(road, ctx.neighbors("car"), direction="ahead", within=p["vmax"], fill=p["vmax"] + 1)
    gap = ahead.distance[:, 0] - 1  # empty cells before it
    v = torch.minimum(torch.clamp(car["v"] + 1, max=p["vmax"]), gap)
    v = v - ((v > 0) & (ctx.rng.uniform(car["uid"]) < p["p_slow"])).to(v.dtype)  # dawdle
    car["v"] = v
    car["x"] = road.move(car["x"], v)


@MODEL.metric(reduce="mean")
def speed(state: asim.MetricsContext) -> torch.Tensor:
    return state["car"]["v"]


def run(steps: int, seed: int, **sizes) -> dict:
    """Run with the Python API; ``sizes``: ``agents`` (cars) and any parameter (``length``...)."""
    agents = sizes.pop("agents", MODEL.default_agents)
    m = asim.Simulation(MODEL, agents, seed, params=sizes).run(steps).metrics
    return {"speed": m["speed"]}
