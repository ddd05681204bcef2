"""Models on a :class:`agentsim.Line`, written from the docs: the multi-process and check tests run them.

- ``ring_cells``: Nagel-Schreckenberg cars on a ring of cells that also read the speed of the two
  cars ahead (``k=2``) and slow down behind a slower one;
- ``ring_drift``: particles on a continuous ring that drift toward the mean position of their
  nearest neighbours either way, with a uid-keyed jitter; every few steps one in twenty splits in two.
"""

from __future__ import annotations

import torch

import agentsim as asim

ring_cells = asim.Model("ring_cells", params={
    "length": asim.Param(400, "cells of the ring", ge=2),
    "vmax": asim.Param(4, "speed limit (cells per step)", ge=1),
})


@ring_cells.init
def _cells_init(ic: asim.InitContext) -> asim.Line:
    road = asim.Line(ic.params["length"], cells=True)
    uid = ic.uids("car", ic.n_agents)
    cells = ic.rng.choice(torch.arange(road.length), ic.n_agents, "place")
    ic.add("car", uid=uid, x=cells, v=ic.rng.integers(uid, "speed", high=ic.params["vmax"] + 1))
    return road


@ring_cells.substep(reads=["car.x", "car.v"], writes=["car.v", "car.x"], neighbors={"car": ["x", "v"]},
                    reach="2*vmax")
def _drive(ctx: asim.Context) -> None:
    car, road, vmax = ctx["car"], ctx.space, ctx.params["vmax"]
    cars = ctx.neighbors("car")
    ahead = asim.nearest(road, cars, k=2, direction="ahead", within=2 * vmax)
    gap = torch.where(ahead.found[:, 0], ahead.distance[:, 0] - 1, vmax)
    slower = ahead.take(cars["v"], fill=vmax)[:, 1] < car["v"]  # the second car ahead is slower: ease off
    v = torch.minimum(torch.clamp(car["v"] + 1 - 2 * slower.to(torch.int64), min=0, max=vmax), gap)
    car["v"] = v
    car["x"] = road.move(car["x"], v)


ring_drift = asim.Model("ring_drift", params={
    "length": asim.Param(60.0, "length of the ring", gt=0),
    "sight": asim.Param(2.5, "how far a particle sees either way", gt=0),
})


@ring_drift.init
def _drift_init(ic: asim.InitContext) -> asim.Line:
    ring = asim.Line(ic.params["length"])
    uid = ic.uids("p", ic.n_agents)
    ic.add("p", uid=uid, x=ic.rng.uniform(uid, "place") * ring.length)
    return ring


@ring_drift.substep(reads=["p.x"], writes=["p.x"], neighbors={"p": ["x"]}, reach="sight")
def _drift(ctx: asim.Context) -> None:
    p, ring = ctx["p"], ctx.space
    near = asim.nearest(ring, ctx.neighbors("p"), k=3, direction="either", within=ctx.params["sight"])
    # signed offsets to the neighbours: behind ones negative (the shorter way round)
    there = near.take(ctx.neighbors("p")["x"], fill=0.0)
    ahead = ring.ahead(p["x"][:, None], there)
    offset = torch.where(ahead <= ring.length / 2, ahead, ahead - ring.length)
    pull = torch.where(near.found, offset, 0.0).sum(1) / near.found.sum(1).clamp(min=1)
    jitter = (ctx.rng.uniform(p["uid"], "jitter") - 0.5) * 0.4
    p["x"] = ring.move(p["x"], 0.5 * pull + jitter)


@ring_drift.substep(reads=["p.x"], births=["p"])
def _split(ctx: asim.Context) -> None:
    p = ctx["p"]
    if ctx.step % 4 == 3:
        splits = ctx.rng.uniform(p["uid"], "split") < 0.05
        x = p["x"][splits]
        ctx.spawn("p", p["uid"][splits], {"x": ctx.space.move(x, torch.full_like(x, 0.25))})


@ring_drift.metric(reduce="sum")
def particles(state: asim.MetricsContext) -> torch.Tensor:
    return torch.ones_like(state["p"]["x"], dtype=torch.int64)


# Particles in a periodic box, each drawn toward its two nearest neighbours within its sight.
nearest_pairs = asim.Model("nearest_pairs", params={
    "side": asim.Param(20.0, "side of the box", gt=0),
    "sight": asim.Param(2.0, "how far a particle sees", gt=0),
})


@nearest_pairs.init
def _pairs_init(ic: asim.InitContext) -> asim.Box:
    box = asim.Box((ic.params["side"], ic.params["side"]))
    uid = ic.uids("p", ic.n_agents)
    ic.add("p", uid=uid, pos=ic.rng.uniform(uid, "place", draws=2) * ic.params["side"])
    return box


@nearest_pairs.substep(reads=["p.pos"], writes=["p.pos"], neighbors={"p": ["pos"]}, reach="sight")
def _pair_up(ctx: asim.Context) -> None:
    p, box = ctx["p"], ctx.space
    near = asim.nearest(box, ctx.neighbors("p"), k=2, within=ctx.params["sight"])
    toward = box.displacement(p["pos"].unsqueeze(1), near.take(ctx.neighbors("p")["pos"]))  # [n, 2, 2]
    pull = torch.where(near.found.unsqueeze(2), toward, 0.0).sum(1) * 0.1
    jitter = (ctx.rng.uniform(p["uid"], "jitter", draws=2) - 0.5) * 0.2
    p["pos"] = box.wrap(p["pos"] + pull + jitter)
