"""agentsim plot draws what the model declares about its metrics (label, color, panel, share_of,
limits, unit), stored in the trajectory file; a file without declarations gets the generic
panels; a bad declaration is an error where it is written; plot.py knows no model by name."""

from __future__ import annotations

import re
from pathlib import Path

import h5py
import matplotlib
import numpy as np
import pytest
import torch

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.colors import to_rgba

import agentsim as asim
from agentsim import plot
from agentsim.cli.main import main
from agentsim.errors import ConfigError, OutputError
from agentsim.io.hdf5 import TrajectoryWriter, read_trajectory

ROOT = Path(__file__).parent.parent
PNG = b"\x89PNG\r\n\x1a\n"


def shop_model() -> asim.Model:
    """Customers who are browsing, queueing or served; a per-customer basket vector."""
    model = asim.Model("shop", params={"p": asim.Param(0.3, "daily move probability", ge=0, le=1)})

    @model.substep(writes=["customer.stage"])
    def advance(ctx):
        c = ctx["customer"]
        moves = ctx.rng.bernoulli(c["uid"], p=ctx.params["p"])
        c["stage"] = torch.where(moves, (c["stage"] + 1).clamp(max=2), c["stage"])

    @model.init
    def init(ic):
        uid = ic.uids("customer", ic.n_agents)
        ic.add("customer", uid=uid, stage=torch.zeros(ic.n_agents, dtype=torch.int64))
        return None

    stages = ["browsing", "queueing", "served"]

    @model.metric(label="browsing", color="tab:blue", panel="stages", share_of=stages, unit="share of customers")
    def browsing(state):
        return state["customer"]["stage"] == 0

    @model.metric(label="queueing", color="#ff7f0e", panel="stages", share_of=stages, unit="share of customers")
    def queueing(state):
        return state["customer"]["stage"] == 1

    @model.metric(label="served", color="C2", panel="stages", share_of=stages, unit="share of customers")
    def served(state):
        return state["customer"]["stage"] == 2

    @model.metric(label="stage mix", unit="stage")
    def basket(state):
        return torch.nn.functional.one_hot(state["customer"]["stage"], 3)

    @model.derived(label="mean stage", color="tab:purple", limits=(0, 2))
    def mean_stage(m):
        return (m["queueing"] + 2 * m["served"]) / max(m["n_customer"], 1)

    model.display("n_customer", label="customers", color="black", unit="count")
    return model


def titled(fig):
    return {ax.get_title(): ax for ax in fig.axes if ax.get_title()}


def test_a_user_model_plots_the_panels_it_declares_from_the_file_alone(tmp_path, capsys):
    model = shop_model()
    assert model.metric_display()["queueing"] == {"label": "queueing", "color": "#ff7f0e", "panel": "stages",
                                                  "share_of": ["browsing", "queueing", "served"],
                                                  "unit": "share of customers"}
    path = tmp_path / "shop.h5"
    asim.Simulation(model, agents=200, seed=3).run(12, out=path)
    with h5py.File(path) as f:  # stored with each metric; undeclared metrics carry none
        assert '"label": "mean stage"' in f["metrics/mean_stage"].attrs["display"].decode()
        assert "display" not in f["metrics/step"].attrs
    figs = plot._trajectory_figures(str(path), plt, None)
    assert len(figs) == 1
    axes = titled(figs[0])
    assert list(axes) == ["customers", "stages", "stage mix", "mean stage"]
    stages = axes["stages"]
    assert [line.get_label() for line in stages.get_lines()] == ["browsing", "queueing", "served"]
    assert [to_rgba(line.get_color()) for line in stages.get_lines()] == [to_rgba(c) for c in
                                                                          ("tab:blue", "#ff7f0e", "C2")]
    assert [t.get_text() for t in stages.get_legend().get_texts()] == ["browsing", "queueing", "served"]
    assert stages.get_ylabel() == "share of customers" and stages.get_ylim() == (0.0, 1.0)
    shares = np.sum([line.get_ydata() for line in stages.get_lines()], axis=0)
    assert np.allclose(shares, 1.0)  # each drawn as a share of the three
    assert stages.get_lines()[0].get_ydata()[0] == 1.0  # everyone browses at step 0
    assert axes["mean stage"].get_ylim() == (0.0, 2.0) and axes["mean stage"].get_ylabel() == "mean stage"
    assert axes["customers"].get_ylabel() == "count"
    assert axes["customers"].get_lines()[0].get_ydata().tolist() == [200] * 13
    assert axes["stage mix"].collections and axes["stage mix"].get_ylabel() == "stage"  # a heat map
    for fig in figs:
        plt.close(fig)
    del model  # the file alone: the CLI never sees the model
    assert main(["plot", str(path)]) == 0
    assert (tmp_path / "shop.png").read_bytes()[:8] == PNG
    assert capsys.readouterr().out == f"wrote {tmp_path / 'shop.png'}\n"


def test_a_file_without_declarations_plots_every_metric_in_its_own_panel(tmp_path):
    path = tmp_path / "old.h5"
    with TrajectoryWriter(path, model="old", params={}, seed=0, steps=4) as w:
        for step in range(5):
            w.write_metrics(step, {"n_cell": 10, "S": 10 - step, "I": step, "R": 0})
    assert read_trajectory(path).display == {}
    figs = plot._trajectory_figures(str(path), plt, None)
    assert [ax.get_title() for ax in figs[0].axes if ax.get_title()] == ["I", "R", "S", "n_cell"]
    plt.close(figs[0])
    assert plot.plot_file(path) == str(tmp_path / "old.png")


def test_metrics_chosen_by_name_override_the_declared_figure(tmp_path):
    path = tmp_path / "shop.h5"
    asim.Simulation(shop_model(), agents=50, seed=1).run(3, out=path)
    figs = plot._trajectory_figures(str(path), plt, ["served", "n_customer"])
    assert [ax.get_title() for ax in figs[0].axes if ax.get_title()] == ["served", "n_customer"]
    plt.close(figs[0])


@pytest.mark.parametrize(("declare", "message"), [
    (lambda m: m.metric(label="")(lambda s: s), r"metric '<lambda>': label: expected a non-empty str \(got ''\)"),
    (lambda m: m.metric(name="x", label=3)(lambda s: s), r"metric 'x': label: expected a non-empty str \(got 3\)"),
    (lambda m: m.metric(name="x", color="tab:redd")(lambda s: s),
     r"metric 'x': color: expected a matplotlib color name or string \('red', 'tab:red', 'C0', '#1f77b4'\) "
     r"\(got str 'tab:redd'\)"),
    (lambda m: m.metric(name="x", color=(1, 0, 0))(lambda s: s),
     r"metric 'x': color: expected a matplotlib color .* \(got tuple \(1, 0, 0\)\)"),
    (lambda m: m.metric(name="x", colour="red")(lambda s: s),
     r"metric 'x': unexpected keyword 'colour' \(valid: name, reduce, hist, groups, resolution, label, color, panel, "
     r"share_of, limits, unit\)\. Perhaps you meant 'color'\?"),
    (lambda m: m.metric(name="x", panel=" ")(lambda s: s), r"metric 'x': panel: expected a non-empty str"),
    (lambda m: m.metric(name="x", share_of=[])(lambda s: s),
     r"metric 'x': share_of: expected a metric name or a non-empty list of them \(got \[\]\)"),
    (lambda m: m.metric(name="x", limits=(1, 0))(lambda s: s),
     r"metric 'x': limits: expected \(low, high\), two finite numbers with low < high \(got \(1, 0\)\)"),
    (lambda m: m.derived(color="nocolor")(lambda mm: 1), r"metric '<lambda>': color: expected a matplotlib color"),
    (lambda m: asim.Metric(lambda s: s, name="y", unit=""), r"metric 'y': unit: expected a non-empty str"),
    (lambda m: m.display("n_walker", label=""), r"metric 'n_walker': label: expected a non-empty str"),
    (lambda m: m.display("speed", label="speed"),
     r"model 'w': display: expected a derived metric \(none\) or a population count n_<population> \(got 'speed'\)"),
])
def test_a_bad_declaration_is_an_error_where_it_is_written(declare, message):
    model = asim.Model("w")
    with pytest.raises(ConfigError, match=message):
        declare(model)
    assert model.metric_names() == [] and model.metric_display() == {}


def test_declarations_that_name_missing_metrics_fail_when_the_run_starts():
    model = shop_model()
    model.metric(name="lost", share_of=["browsing", "nobody"])(lambda s: s["customer"]["stage"] > 5)
    with pytest.raises(ConfigError, match=r"metric 'lost' is drawn as a share_of 'nobody', which is no metric "
                                          r"\(valid: browsing, .*n_customer\)"):
        asim.Simulation(model, agents=10, seed=1)
    counted = shop_model()
    counted.display("n_custmer", label="typo")
    with pytest.raises(ConfigError, match=r"display of 'n_custmer', but the populations are \['customer'\].*"
                                          r"Perhaps you meant 'n_customer'"):
        asim.Simulation(counted, agents=10, seed=1)
    twice = shop_model()
    with pytest.raises(ConfigError, match=r"metric 'served' is declared with @model.metric: pass label=, color="):
        twice.display("served", label="done")
    with pytest.raises(ConfigError, match=r"metric 'n_customer' has its display already"):
        twice.display("n_customer", label="again")


def test_a_bad_display_attribute_in_a_file_is_a_clear_error(tmp_path):
    with pytest.raises(ConfigError, match=r"metric 'x': display: unknown key 'colour' \(valid: label, color, "):
        TrajectoryWriter(tmp_path / "never.h5", model="m", params={}, seed=0, steps=1, display={"x": {"colour": "r"}})
    path = tmp_path / "edited.h5"
    with TrajectoryWriter(path, model="m", params={}, seed=0, steps=1, display={"x": {"label": "x"}}) as w:
        w.write_metrics(0, {"x": 1})
        w.write_metrics(1, {"x": 2})
    with h5py.File(path, "r+") as f:
        f["metrics/x"].attrs["display"] = '{"label": "x", "color": "nocolor"}'
    with pytest.raises(OutputError, match=r"cannot plot .*edited\.h5': the display attribute of /metrics/x: "
                                          r"metric 'x': color: expected a matplotlib color"):
        plot.plot_file(path)


def test_the_reference_models_declare_the_figures_they_had():
    from agentsim.core.catalog import get_model

    sir = get_model("sir").metric_display()
    assert [sir[k]["label"] for k in ("S", "I", "R")] == ["susceptible", "infectious", "recovered"]
    assert {sir[k]["panel"] for k in sir} == {"compartments"} and sir["I"]["share_of"] == ["S", "I", "R"]
    assert get_model("boids").metric_display()["polarization"]["limits"] == [0.0, 1.02]
    schelling = get_model("schelling").metric_display()
    assert schelling["happy"]["share_of"] == ["n_resident"] and schelling["segregation"]["panel"] == "segregation"
    wolfsheep = get_model("wolfsheep").metric_display()
    assert [wolfsheep[k]["label"] for k in ("n_sheep", "n_wolf", "grass")] == ["sheep", "wolves", "grown grass cells"]


def test_plot_py_names_no_model_and_no_model_metric():
    source = (ROOT / "agentsim" / "plot.py").read_text()
    code = re.sub(r'""".*?"""', "", source, flags=re.S)  # docstrings may give examples
    for word in ("sir", "boid", "boids", "schelling", "wolfsheep", "sheep", "wolf", "resident", "grass",
                 "polarization", "segregation", "happy", "density", "n_person"):
        assert not re.search(rf"(?<![\w]){re.escape(word)}(?![\w])", code, flags=re.I), word
    for name in ('"S"', '"I"', '"R"'):  # the compartments' metric names (case matters: "r" is a file mode)
        assert name not in code, name


def test_the_file_records_the_grid_and_the_figure_draws_its_shape(tmp_path):
    """A 4 x 6 grid whose last row is always empty: the file records the space, and the cells panel
    is 4 x 6 (guessing from the cells would give a 5 x 5 square)."""
    model = asim.Model("strip", params={})

    @model.init
    def init(ic: asim.InitContext) -> asim.Grid:
        n = ic.n_agents
        ic.add("resident", uid=ic.uids("resident", n), cell=torch.arange(n, dtype=torch.int64),
               group=(torch.arange(n) % 2).to(torch.int8))
        return asim.Grid((4, 6))

    @model.substep(reads=["resident.cell"], writes=["resident.cell"])
    def stay(ctx: asim.Context) -> None:
        ctx["resident"]["cell"] = ctx["resident"]["cell"]

    out = tmp_path / "strip.h5"
    asim.Simulation(model, agents=17, seed=1).run(2, out=out, record=["resident.cell", "resident.group"])
    traj = read_trajectory(out)
    assert traj.attrs["space"] == {"kind": "grid", "shape": [4, 6], "periodic": True}
    assert plot._grid_shape(traj, "resident", [0, 2]) == (4, 6)
    image = plot._cells_image(traj.agents("resident", ["cell", "group"], step=2), (4, 6))
    assert image.shape == (4, 6) and np.isnan(image[3, 5]) and image[0, 1] == 1
