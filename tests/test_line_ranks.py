"""Models on a Line (tests/line_models.py) on 1-4 processes with both partitioners: the same bits,
each partition splitting the agents; layouts that cannot split a space are refused."""

from __future__ import annotations

import pytest
import torch

import agentsim as asim
from agentsim.errors import ConfigError
from agentsim.runner.invariance import check_model


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", ["ring_cells", "ring_drift"])
def test_a_line_model_is_identical_on_one_to_four_processes(name):
    report = check_model(f"line_models:{name}", agents=240, steps=12, world_sizes=(1, 2, 4))
    assert report.identical, report.summary()
    assert report.partitions == ("data", "spatial")
    spatial = report.splits["W = 4, spatial"]
    assert len(spatial) == 4 and max(spatial) <= 1.2 * sum(spatial) / 4, spatial


def test_the_reach_limits_the_query():
    model = asim.Model("too_far", params={"vmax": asim.Param(3, "cells")})

    @model.init
    def init(ic):
        uid = ic.uids("car", ic.n_agents)
        ic.add("car", uid=uid, x=uid * 3)
        return asim.Line(100, cells=True)

    @model.substep(reads=["car.x"], writes=["car.x"], neighbors={"car": ["x"]}, reach="vmax")
    def drive(ctx):
        near = asim.nearest(ctx.space, ctx.neighbors("car"), within=2 * ctx.params["vmax"])
        ctx["car"]["x"] = ctx.space.move(ctx["car"]["x"], near.found[:, 0].long())

    with pytest.raises(asim.FieldAccessError, match=r"declares reach 'vmax' = 3.* queries within 6"):
        asim.Simulation(model, 10, 0).run(1)


def test_positions_off_the_line_are_refused_at_init_and_flagged_in_a_step():
    model = asim.Model("off_the_line")

    @model.init
    def init(ic):
        uid = ic.uids("p", ic.n_agents)
        ic.add("p", uid=uid, x=uid.to(float) * 2.0)
        return asim.Line(ic.n_agents * 2.0)

    @model.substep(reads=["p.x"], writes=["p.x"])
    def step(ctx):
        ctx["p"]["x"] = ctx["p"]["x"] + 1.0  # not wrapped

    with pytest.raises(asim.SimulationError, match=r"holds a position outside a ring of length 10.*space.move"):
        asim.Simulation(model, 5, 0).run(2)

    cells = asim.Model("cells_on_a_continuous_line")
    cells.substep(reads=["p.x"], writes=["p.x"], name="step")(step.fn)

    @cells.init
    def init_wrong_dtype(ic):
        ic.add("p", uid=ic.uids("p", ic.n_agents), x=torch.arange(ic.n_agents))
        return asim.Line(10.0)

    with pytest.raises(ConfigError, match=r"places agents by 'x', float positions of shape \[n\]"):
        asim.Simulation(cells, 5, 0)


@pytest.mark.parametrize("space, layout, world, match", [
    (asim.Line(100, cells=True), "blocks", 4, "a Line has one axis: use layout 'strips' or 'rcb'"),
    (asim.Grid((1, 50)), "strips", 2, r"cuts axis 0 \(rows\) into 2 parts, but the Grid has 1 rows.*Grid\(\(50, 1\)\)"),
    (asim.Grid((50, 1)), "blocks", 4, r"cuts axis 1 \(columns\) into 2 parts, but the Grid has 1 columns"),
    (asim.Grid((3, 50)), "strips", 4, "into 4 parts, but the Grid has 3 rows"),
])
def test_layouts_that_would_leave_a_process_without_a_region_are_refused(space, layout, world, match):
    from agentsim.distributed.spatial import check_layout_splits

    with pytest.raises(ConfigError, match=match):
        check_layout_splits(space, layout, world)


def test_layouts_that_split_are_accepted():
    from agentsim.distributed.spatial import check_layout_splits

    for space, layout, world in [(asim.Line(100, cells=True), "strips", 4), (asim.Line(5.0), "strips", 4),
                                 (asim.Grid((50, 1)), "strips", 4), (asim.Grid((8, 8)), "blocks", 4),
                                 (asim.Box((1.0, 1.0)), "blocks", 4), (asim.Line(100, cells=True), "blocks", 1)]:
        check_layout_splits(space, layout, world)
