"""Metrics per group (``groups=``), histogram edges and group counts from parameters, derived metrics
that read the parameters, and the resolution of a float metric; a model with them on 1-3 processes."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import agentsim as asim
from agentsim.core.context import MetricsContext
from agentsim.core.metrics import Metric, local_sums, metric_row
from agentsim.core.state import FieldSpec, Population, State
from agentsim.errors import ConfigError, SimulationError
from agentsim.runner.invariance import check_model


def _context(params: dict, **fields: torch.Tensor) -> MetricsContext:
    n = next(iter(fields.values())).shape[0]
    specs = {k: FieldSpec(v.dtype) for k, v in fields.items()}
    pop = Population("p", specs, {"uid": torch.arange(n), **fields})
    return MetricsContext(State({"p": pop}), params, None, 0)


def _row(metrics: list[Metric], mc: MetricsContext) -> dict:
    return metric_row(0, local_sums(metrics, mc), metrics, params=mc.params)


@pytest.mark.parametrize("dtype", [torch.bool, torch.int32, torch.float64])
def test_sums_per_group_match_numpy(dtype):
    gen = torch.Generator().manual_seed(1)
    group = torch.randint(-2, 7, (500,), generator=gen)  # negative: in no group
    values = torch.randn(500, generator=gen) * 10
    values = values > 0 if dtype == torch.bool else values.to(dtype)
    mc = _context({"G": 7}, g=group, v=values)
    metric = Metric(lambda s: (s["p"]["g"], s["p"]["v"]), name="per", groups="G")
    got = _row([metric], mc)["per"]
    keep = group.numpy() >= 0
    want = np.bincount(group.numpy()[keep], weights=values.numpy()[keep].astype(np.float64), minlength=7)
    assert got.shape == (7,)
    if dtype == torch.float64:
        assert np.allclose(got, want, rtol=0, atol=500 * 2.0 ** -24)
    else:
        assert got.dtype == np.int64 and got.tolist() == want.astype(np.int64).tolist()
    counts = _row([Metric(lambda s: s["p"]["g"], name="n", groups=7)], mc)["n"]
    assert counts.tolist() == np.bincount(group.numpy()[keep], minlength=7).tolist()


def test_a_group_past_the_last_stops_the_run_and_bad_declarations_are_refused():
    mc = _context({"G": 3}, g=torch.tensor([0, 1, 3]), v=torch.ones(3))
    with pytest.raises(SimulationError, match=r"metric 'per': 1 agent\(s\) in a group past its last one"):
        _row([Metric(lambda s: (s["p"]["g"], s["p"]["v"]), name="per", groups="G")], mc)
    with pytest.raises(ConfigError, match=r"groups='cities' names no parameter \(parameters: G\)"):
        _row([Metric(lambda s: s["p"]["g"], name="per", groups="cities")], mc)
    with pytest.raises(ConfigError, match="returns \\(group \\[n\\] integers, values \\[n\\]\\)"):
        _row([Metric(lambda s: (s["p"]["v"], s["p"]["v"]), name="per", groups=3)], mc)
    with pytest.raises(ConfigError, match="a mean per group is a derived metric"):
        Metric(lambda s: s["p"]["g"], name="per", groups=3, reduce="mean")
    with pytest.raises(ConfigError, match="groups: expected the number of groups"):
        Metric(lambda s: s["p"]["g"], name="per", groups=0)


def test_histogram_edges_from_the_parameters():
    metric = Metric(lambda s: s["p"]["x"], name="h", hist=lambda p: [0.0, 1.0, p["top"]])
    row = _row([metric], _context({"top": 5.0}, x=torch.tensor([0.5, 2.0, 3.0, 7.0])))
    assert row["h"].tolist() == [1, 2] and row["h"].edges == (0.0, 1.0, 5.0)
    row = _row([metric], _context({"top": 8.0}, x=torch.tensor([0.5, 2.0, 3.0, 7.0])))  # another run's edges
    assert row["h"].tolist() == [1, 3] and row["h"].edges == (0.0, 1.0, 8.0)
    with pytest.raises(ConfigError, match="strictly increasing"):
        _row([metric], _context({"top": 0.5}, x=torch.tensor([0.5])))


def test_a_finer_resolution_keeps_small_values():
    values = torch.full((1000,), 3e-9, dtype=torch.float64)  # a speed over a road of 10^9 cells
    mc = _context({}, v=values)
    coarse = _row([Metric(lambda s: s["p"]["v"], name="m")], mc)["m"]
    fine = _row([Metric(lambda s: s["p"]["v"], name="m", resolution=1e-15)], mc)["m"]
    assert coarse == 0.0  # each value rounds to 0 in multiples of 2**-24
    assert fine == pytest.approx(3e-6, rel=1e-6)
    with pytest.raises(ConfigError, match="resolution"):
        Metric(lambda s: s["p"]["v"], name="m", resolution=2.0)


def test_derived_metrics_read_the_parameters():
    model = asim.Model("flow", params={"length": asim.Param(1000, "cells")})

    @model.init
    def init(ic):
        ic.add("car", uid=ic.uids("car", ic.n_agents), v=torch.full((ic.n_agents,), 2, dtype=torch.int64))

    @model.substep(reads=["car.v"], writes=["car.v"])
    def drive(ctx):
        ctx["car"]["v"] = ctx["car"]["v"] + 1

    model.metric(name="speed_sum")(lambda state: state["car"]["v"])

    @model.derived
    def flow(m, params):
        return m["speed_sum"] / params["length"]

    got = asim.Simulation(model, 50, 0, params={"length": 500}).run(2).metrics
    assert got["flow"].tolist() == [0.2, 0.3, 0.4]
    with pytest.raises(ConfigError, match=r"fn\(metrics, params, space\) \(got 4 arguments\)"):
        model.derived(lambda m, p, q, r: 0)


def test_one_group_per_cell_of_the_space_and_a_derived_metric_of_the_space():
    import place_models

    run = asim.Simulation(place_models.BUGS, 300, 2, params={"rows": 4, "cols": 6}).run(3)
    assert run.metrics["bugs_per_cell"].shape == (4, 24)
    assert run.metrics["bugs_per_cell_mean"].tolist() == [300 / 24] * 4
    cells = run.state["bug"]["cell"]
    assert run.metrics["bugs_per_cell"][-1].tolist() == torch.bincount(cells, minlength=24).tolist()
    boxed = asim.Model("boxed")

    @boxed.init
    def init(ic):
        ic.add("p", uid=ic.uids("p", ic.n_agents), pos=torch.zeros(ic.n_agents, 2))
        return asim.Box((4.0, 4.0))

    boxed.substep(reads=["p.pos"])(lambda ctx: None)
    boxed.metric(name="per_cell", groups="space")(lambda state: state["p"]["uid"])
    with pytest.raises(ConfigError, match="groups='space' makes one group per cell of the space, and a Box has no "
                                          "cells"):
        asim.Simulation(boxed, 10, 0).run(1)


@pytest.mark.long
@pytest.mark.timeout(300)
def test_a_metric_per_cell_is_identical_on_one_to_three_processes():
    report = check_model("place_models:BUGS", agents=400, steps=6)
    assert report.identical, report.summary()


@pytest.mark.timeout(300)
def test_a_model_with_metrics_per_city_is_identical_on_one_to_three_processes():
    report = check_model("place_models:MODEL", agents=600, steps=8)
    assert report.identical, report.summary()
    run = asim.Simulation(_model(), 600, 1, params={"cities": 5}).run(3)
    m = run.metrics
    assert m["infectious_per_city"].shape == (4, 5) and m["people_per_city"][-1].sum() == 600
    assert m["cities_with_infections"][-1] == int((m["infectious_per_city"][-1] > 0).sum())
    assert m["ages"].shape == (4, 3)


def _model():
    import place_models

    return place_models.MODEL


def test_the_final_line_summarises_a_long_vector(capsys):
    from pathlib import Path

    from agentsim.cli.main import main

    model = Path(__file__).resolve().parent / "place_models.py"
    assert main(["run", f"{model}:MODEL", "--agents", "2000", "--steps", "2", "--set", "cities=300"]) == 0
    final = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("final:"))
    assert "people_per_city=[300 entries: sum 2000, min " in final and "nonzero]" in final
    assert main(["run", f"{model}:MODEL", "--agents", "200", "--steps", "1", "--set", "cities=3"]) == 0
    final = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("final:"))
    assert "ages=[" in final and "entries" not in final
