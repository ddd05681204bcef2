"""Calibration: relaxed draws against the hard ones, differentiable runs against finite
differences, the gradient estimators against common-random-number finite differences on the
boarding-school SIR, fits that recover known parameters, the CLI, and the same fit on 2 ranks."""

from __future__ import annotations

import json

import pytest
import torch

import agentsim as asim
from agentsim.calibrate import Objective, Series, calibrate, fit, read_series
from agentsim.calibrate.estimators import crn_difference, pathwise, score_function, spsa
from agentsim.cli.main import main
from agentsim.core.comm import LocalComm
from agentsim.grad.relax import bernoulli, categorical
from agentsim.runner.launch import run_ranks

FLU = asim.get_model("flu")
DATA = read_series("data/boarding_school_flu.csv", "in_bed")


def test_the_boarding_school_data_are_the_published_series():
    assert DATA.times == tuple(float(d) for d in range(1, 15))
    assert DATA.values[:6] == (3, 8, 26, 76, 225, 298) and max(DATA.values) == 298 and sum(DATA.values) == 1559


def test_relaxed_draws_see_the_same_noise_as_hard_ones():
    g = torch.Generator().manual_seed(0)
    p = torch.rand(10_000, generator=g, dtype=torch.float64).requires_grad_()
    u = torch.rand(10_000, generator=g, dtype=torch.float64)
    hard, logp = bernoulli(p, u)
    assert torch.equal(hard, (u < p).double())
    assert torch.allclose(logp, torch.distributions.Bernoulli(probs=p).log_prob(hard), atol=1e-9)
    for mode in ("straight_through", "gumbel_hard", "score"):
        x, _ = bernoulli(p, u, mode)
        assert torch.equal(x.detach(), hard), mode
    st, _ = bernoulli(p, u, "straight_through")
    (grad,) = torch.autograd.grad(st.sum(), p)
    assert torch.equal(grad, torch.ones_like(p))  # d x / d p = 1: the straight-through estimator
    soft, _ = bernoulli(p, u, "gumbel", tau=0.05)
    assert torch.equal(soft.detach() > 0.5, hard > 0.5)  # crosses 1/2 where the hard draw switches
    logits = torch.tensor([[0.0, 1.0, -1.0]]).expand(60_000, 3).double()
    onehot, _ = categorical(logits, torch.rand(60_000, 3, generator=g, dtype=torch.float64))
    freq = onehot.mean(0)
    probs = torch.softmax(logits[0], 0)
    assert ((freq - probs).abs() < 4 * (probs * (1 - probs) / 60_000).sqrt()).all(), (freq, probs)
    with pytest.raises(asim.ConfigError, match="relax: expected one of hard, straight_through"):
        bernoulli(p, u, "soft")


def test_runs_without_grad_record_no_history_and_differentiable_runs_match_finite_differences():
    plain = asim.Simulation(FLU, agents=763, seed=1, params={"steps_per_day": 4})
    plain.run(12)
    assert all(t.grad_fn is None and not t.requires_grad for t in plain.state["person"].fields().values())
    assert plain.grad_params == {}

    def infectious(beta: float, grad: bool) -> tuple[torch.Tensor, asim.Simulation]:
        sim = asim.Simulation(FLU, agents=763, seed=1, grad=["beta"] if grad else False,
                              params={"steps_per_day": 4, "relax": "gumbel", "beta": beta})
        sim.run(12)
        return sim.state["person"]["i"].sum(), sim

    total, sim = infectious(1.7, True)
    assert total.grad_fn is not None
    (grad,) = torch.autograd.grad(total, [sim.grad_params["beta"]])
    h = 1e-5  # the relaxed run is a smooth function of beta for a fixed seed: autograd = its derivative
    fd = (float(infectious(1.7 + h, False)[0]) - float(infectious(1.7 - h, False)[0])) / (2 * h)
    assert float(grad) == pytest.approx(fd, rel=1e-5)
    with pytest.raises(asim.ConfigError, match=r"grad: 'steps_per_day' is not a float parameter of model 'flu' "
                                                r"\(float parameters: beta, gamma, tau\)"):
        asim.Simulation(FLU, agents=10, grad=["steps_per_day"])


# dE[Q]/d(beta, gamma) at the published values, 4 steps a day, 4 schools a run, 32 runs.
ESTIMATOR = Objective(FLU, DATA, ("beta", "gamma"), "I", agents=763 * 4, replicates="school",
                      params={"schools": 4, "steps_per_day": 4})
AT = {"beta": 1.7, "gamma": 0.45}
SEEDS = list(range(32))


def on_day_6(series: torch.Tensor) -> torch.Tensor:
    return series[5].mean()


def mean_se(samples: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return samples.mean(0), samples.std(0) / samples.shape[0] ** 0.5


@pytest.fixture(scope="module")
def reference() -> tuple[torch.Tensor, torch.Tensor]:
    return mean_se(crn_difference(ESTIMATOR, on_day_6, AT, SEEDS))


@pytest.mark.timeout(300)
@pytest.mark.parametrize("estimator", [pytest.param(spsa, marks=pytest.mark.long), score_function])
def test_unbiased_estimators_agree_with_crn_finite_differences(reference, estimator):
    ref, ref_se = reference
    got, se = mean_se(estimator(ESTIMATOR, on_day_6, AT, SEEDS))
    assert ((got - ref).abs() <= 3 * (se**2 + ref_se**2).sqrt()).all(), (got, se, ref, ref_se)
    assert ref[0] > 0 > ref[1]  # more transmission, more boys in bed on day 6; faster recovery, fewer


@pytest.mark.long
@pytest.mark.timeout(300)
def test_relaxed_pathwise_estimators_are_biased_as_documented(reference):
    ref, ref_se = reference
    hard_gumbel, _ = mean_se(pathwise(ESTIMATOR, on_day_6, AT, SEEDS, "gumbel_hard"))
    assert hard_gumbel[0] > 3 * ref[0]  # explodes (measured 11x at 64 runs of 8 schools)
    soft, soft_se = mean_se(pathwise(ESTIMATOR, on_day_6, AT, SEEDS, "gumbel"))
    assert soft[0] < ref[0] - 3 * (soft_se[0] ** 2 + ref_se[0] ** 2).sqrt()  # far too low (measured negative)
    loss = ESTIMATOR.loss_of
    st, _ = mean_se(pathwise(ESTIMATOR, loss, AT, SEEDS[:16], "straight_through"))
    crn, _ = mean_se(crn_difference(ESTIMATOR, loss, AT, SEEDS[:16]))
    assert st[0] > 0 > crn[0]  # on the loss the straight-through gradient points the wrong way


def synthetic(beta: float, gamma: float) -> Series:
    """The mean school of 64 schools (seed 99) at known parameters, 2 steps a day."""
    obj = Objective(FLU, DATA, ("beta", "gamma"), "I", agents=763 * 64, replicates="school",
                    params={"schools": 64, "steps_per_day": 2})
    series = obj.simulate({"beta": beta, "gamma": gamma}, seed=99)[0]
    return Series(DATA.times, tuple(series[:, series.max(0).values > 20].mean(1).tolist()), "synthetic")


@pytest.mark.timeout(300)
def test_a_fit_recovers_known_parameters_within_5_percent():
    truth = {"beta": 1.5, "gamma": 0.4}
    data = synthetic(**truth)
    objective = Objective(FLU, data, ("beta", "gamma"), "I", agents=763 * 16, replicates="school", takeoff=20,
                          params={"schools": 16, "steps_per_day": 2}, seeds=(0, 1))
    result = fit(objective, "nelder-mead", start={"beta": 2.0, "gamma": 0.6}, iterations=120)
    for name, value in truth.items():
        assert abs(result.params[name] / value - 1) < 0.05, result.params
    assert result.stderr["beta"] > 0 and result.kept <= result.replicates == 32


CLI = ["calibrate", "flu", "--data", "data/boarding_school_flu.csv", "--column", "in_bed", "--metric", "I",
       "--fit", "beta,gamma", "--set", "schools=4", "--set", "steps_per_day=2", "--agents", "3052",
       "--replicates", "school", "--takeoff", "20", "--iterations", "12", "--quiet"]


@pytest.mark.long
@pytest.mark.timeout(300)
def test_the_cli_writes_the_fit_and_two_ranks_give_the_same_numbers(tmp_path, capsys):
    out1, out2 = tmp_path / "fit1.json", tmp_path / "fit2.json"
    assert main([*CLI, "--out", str(out1), "--plot", str(tmp_path / "fit.png")]) == 0
    assert "beta = " in capsys.readouterr().out and (tmp_path / "fit.png").stat().st_size > 0
    assert main([*CLI, "--out", str(out2), "--nprocs", "2"]) == 0
    one, two = json.loads(out1.read_text()), json.loads(out2.read_text())
    assert set(one) >= {"params", "loss", "stderr"}
    assert one["derived"]["R0"] == one["params"]["beta"] / one["params"]["gamma"]
    assert (one["params"], one["loss"], one["stderr"]) == (two["params"], two["loss"], two["stderr"])


@pytest.mark.parametrize(("args", "message"), [
    (["--column", "in_bedd"], "has no column 'in_bedd' .*columns: day, date, in_bed"),
    (["--metric", "X"], "model 'flu' has no metric 'X' .*metrics: S, I, R"),
    (["--fit", "beta,schools"], "'schools' is not a float parameter of model 'flu'"),
    (["--loss", "l1"], "loss: expected one of sse, poisson, negbin"),
    (["--method", "bfgs"], "method: expected one of nelder-mead, spsa, adam"),
    (["--bounds", "beta=2"], "expected NAME=LOW:HIGH"),
])
def test_bad_calibrations_get_clear_messages(args, message, capsys):
    base = ["calibrate", "flu", "--data", "data/boarding_school_flu.csv", "--column", "in_bed", "--metric", "I",
            "--fit", "beta,gamma", "--iterations", "1", "--quiet"]
    for k in range(0, len(args), 2):
        at = base.index(args[k]) if args[k] in base else len(base)
        base[at:at + 2] = args[k:k + 2]
    assert main(base) == 2
    assert pytest.importorskip("re").search(message, capsys.readouterr().err)


def test_calibrate_checks_its_settings_before_starting():
    with pytest.raises(asim.ConfigError, match="takeoff|aggregate: expected one of mean, each"):
        calibrate(FLU, DATA, ["beta"], "I", aggregate="median")


def gradients_of_the_loss(comm, relax: str) -> tuple[torch.Tensor, float] | None:
    """d loss / d(beta, gamma) through 14 days of a relaxed run (2 steps a day, 2 schools)."""
    objective = Objective(FLU, DATA, ("beta", "gamma"), "I", agents=763 * 2, replicates="school",
                          params={"schools": 2, "steps_per_day": 2}, comm=comm)
    series, sim = objective.simulate(AT, 3, grad=True, relax=relax)
    loss = objective.loss_of(series)
    grads = sim.parameter_gradients(loss)
    return torch.stack([grads["beta"], grads["gamma"]]), float(loss.detach())


@pytest.mark.timeout(300)
@pytest.mark.parametrize("relax", ["straight_through", pytest.param("gumbel", marks=pytest.mark.long)])
def test_gradients_through_the_data_partitioner_equal_one_process(relax):
    one, loss = gradients_of_the_loss(LocalComm(), relax)
    assert (one.abs() > 0).all()
    for world_size in (2, 4):
        for grad, got_loss in run_ranks(gradients_of_the_loss, world_size, (relax,), timeout=240.0):
            assert got_loss == pytest.approx(loss, rel=1e-12)
            assert ((grad - one).abs() <= 1e-6 * one.abs()).all(), (world_size, grad, one)



def test_a_metric_that_returns_an_exact_sum_is_calibrated_only_without_replicates_or_gradients():
    # The random walk's MSD metric is an ExactSum (metrics.sum_of_squares): this rank's sum, no per-agent values.
    walk = asim.get_model("randomwalk")
    data = Series((1.0, 2.0), (2.0, 4.0), "msd", "inline")
    run = asim.run(walk, agents=100, steps=2, seed=0)
    for metric in ("sum_sq_disp", "msd"):  # the sum itself, and the derived mean over walkers
        series = Objective(walk, data, ("step_size",), metric, agents=100).simulate({"step_size": 1.0}, 0)[0]
        assert series[:, 0].tolist() == run.metrics[metric][1:].tolist(), metric
    objective = Objective(walk, data, ("step_size",), "sum_sq_disp", agents=100)
    with pytest.raises(asim.ConfigError, match=r"calibration needs one value per agent .*to carry gradients; got "
                                               r"an ExactSum"):
        objective.simulate({"step_size": 1.0}, 0, grad=True)
    objective = Objective(walk, data, ("step_size",), "msd", agents=100, replicates="uid")
    with pytest.raises(asim.ConfigError, match=r"derived metric 'msd' reads 'sum_sq_disp', which calibration cannot "
                                               r"get: calibration needs one value per agent .*split by replicates"):
        objective.simulate({"step_size": 1.0}, 0)


# --------------------------------------------------------------------------- what is compared
# A tiny model whose metrics are known by hand: every cell grows by rate * 2u a step (u uniform,
# keyed by uid), so x's mean after t steps is about rate * t; cells are dealt to `groups` groups
# (the replicates). Module level, so that worker processes import it as test_calibrate:GROW.
GROW = asim.Model("grow", params={"rate": asim.Param(0.5, "mean growth per step", gt=0.0),
                                  "groups": asim.Param(4, "number of groups (replicates)", ge=1)})


@GROW.substep(writes=["cell.x"])
def grow(ctx: asim.Context) -> None:
    cell = ctx["cell"]
    cell["x"] = cell["x"] + ctx.params["rate"] * 2 * ctx.rng.uniform(cell["uid"], "grow", dtype=torch.float64)


@GROW.init
def _init_cells(ic: asim.InitContext) -> None:
    uid = ic.uids("cell", ic.n_agents)
    ic.add("cell", uid=uid, x=torch.zeros(ic.n_agents, dtype=torch.float64),
           group=(uid % ic.params["groups"]).to(torch.int32))
    ic.add("lamp", uid=ic.uids("lamp", 3), on=torch.ones(3, dtype=torch.bool))  # no group field


@GROW.metric(reduce="mean")
def x(state) -> torch.Tensor:
    return state["cell"]["x"]


@GROW.metric()
def total(state) -> torch.Tensor:
    return state["cell"]["x"]


@GROW.metric()
def big(state) -> torch.Tensor:
    return state["cell"]["x"] > 1.0


@GROW.metric()
def lamps(state) -> torch.Tensor:
    return state["lamp"]["on"]


@GROW.derived
def per_cell(m):  # the mean again, from the sum: torch operations on the sum keep its gradient
    return m["total"] / max(m["n_cell"], 1)


@GROW.derived
def share_big(m):
    return float(m["big"]) / m["n_cell"]


@GROW.derived
def per_lamp(m):
    return m["total"] / m["n_lamp"]


TRUE_RATE = 0.7
GROW_RUN = asim.run(GROW, agents=200, steps=6, seed=3, params={"rate": TRUE_RATE})
GROW_DATA = Series(tuple(float(t) for t in range(1, 7)), tuple(GROW_RUN.metrics["x"][1:].tolist()), "x", "GROW")


@pytest.mark.parametrize("metric", ["x", "total", "big", "per_cell", "share_big", "per_lamp"])
def test_the_value_compared_is_the_one_the_trajectory_reports_step_by_step(metric):
    objective = Objective(GROW, GROW_DATA, ("rate",), metric, agents=200)
    series = objective.simulate({"rate": TRUE_RATE}, 3)[0]
    assert series.shape == (6, 1)
    assert series[:, 0].tolist() == [float(v) for v in GROW_RUN.metrics[metric][1:]]


def test_a_mean_metric_fit_recovers_the_rate_that_made_the_data():
    # Before, the data (a mean, about 0.7 t) were compared with the sum over 200 cells: the fit ran to its bound.
    result = fit(Objective(GROW, GROW_DATA, ("rate",), "x", agents=200, seeds=(3,)), start={"rate": 0.3})
    assert result.params["rate"] == pytest.approx(TRUE_RATE, rel=1e-3), result.params
    assert result.loss < 1e-6


def test_a_derived_metric_fit_recovers_the_rate_that_made_the_data():
    result = fit(Objective(GROW, GROW_DATA, ("rate",), "per_cell", agents=200, seeds=(3,)), "spsa",
                 start={"rate": 0.3}, iterations=40)
    assert result.params["rate"] == pytest.approx(TRUE_RATE, rel=0.02), result.params


def test_replicates_give_each_replicates_own_mean_and_derived_value():
    sim = asim.Simulation(GROW, agents=200, seed=3, params={"rate": TRUE_RATE})
    sim.run(6)
    cells = sim.state["cell"]
    by_hand = torch.stack([cells["x"][cells["group"] == g].mean() for g in range(4)])
    sizes = torch.bincount(cells["group"].long(), minlength=4)
    for metric in ("x", "per_cell"):
        objective = Objective(GROW, GROW_DATA, ("rate",), metric, agents=200, replicates="group")
        series = objective.simulate({"rate": TRUE_RATE}, 3)[0]
        assert series.shape == (6, 4)
        assert torch.allclose(series[-1], by_hand, rtol=1e-6, atol=0), (metric, series[-1], by_hand)  # fixed point
    share = Objective(GROW, GROW_DATA, ("rate",), "share_big", agents=200, replicates="group")
    got = share.simulate({"rate": TRUE_RATE}, 3)[0][-1]
    assert got.tolist() == [int((cells["x"][cells["group"] == g] > 1.0).sum()) / int(sizes[g]) for g in range(4)]


def replicate_series(comm, metric: str, grad: bool) -> torch.Tensor:
    objective = Objective(GROW, GROW_DATA, ("rate",), metric, agents=200, replicates="group", comm=comm)
    return objective.simulate({"rate": TRUE_RATE}, 3, grad=grad)[0].detach()


@pytest.mark.timeout(240)
def test_per_replicate_values_are_the_same_on_two_ranks():
    for metric in ("x", "per_cell"):
        one = replicate_series(LocalComm(), metric, False)
        two = run_ranks(replicate_series, 2, (metric, False), timeout=120.0)
        assert all(torch.equal(got, one) for got in two), metric
        grad_one = replicate_series(LocalComm(), metric, True)
        assert torch.allclose(grad_one, one, rtol=1e-6, atol=0)  # float sums against fixed point


def test_a_derived_metric_carries_gradients_when_it_is_computed_with_torch_operations():
    objective = Objective(GROW, GROW_DATA, ("rate",), "per_cell", agents=200, replicates="group")
    series, sim = objective.simulate({"rate": TRUE_RATE}, 3, grad=True)
    grads = sim.parameter_gradients(series.sum())
    # linear in the rate
    assert float(grads["rate"]) == pytest.approx(float(series.detach().sum()) / TRUE_RATE, rel=1e-9)
    result = fit(Objective(GROW, GROW_DATA, ("rate",), "per_cell", agents=200, seeds=(3,)), "adam",
                 start={"rate": 0.5}, iterations=30, lr=0.1)
    assert abs(result.params["rate"] / TRUE_RATE - 1) < 0.05, result.params


@pytest.mark.parametrize(("metric", "replicates", "grad", "message"), [
    ("share_big", None, True, r"derived metric 'share_big' cannot carry gradients: it returned float \(float\(\)"),
    ("per_lamp", "group", False, r"derived metric 'per_lamp' reads 'n_lamp', which calibration cannot get: "
                                 r"population 'lamp' has no integer field 'group'"),
    ("lamps", "group", False, r"metric 'lamps': replicates: no population holds an integer field 'group' with one "
                              r"row per value of metric 'lamps'"),
])
def test_metrics_that_cannot_be_observed_so_say_why(metric, replicates, grad, message):
    objective = Objective(GROW, GROW_DATA, ("rate",), metric, agents=200, replicates=replicates)
    with pytest.raises(asim.ConfigError, match=message):
        objective.simulate({"rate": TRUE_RATE}, 3, grad=grad)


def test_a_vector_metric_and_an_unknown_metric_are_refused_with_the_choices():
    model = GROW.configure()
    model.add_metric(asim.Metric(lambda state: torch.stack([state["cell"]["x"]] * 2, 1), name="both"))
    objective = Objective(model, GROW_DATA, ("rate",), "both", agents=20)
    with pytest.raises(asim.ConfigError, match=r"metric 'both': a vector metric \(\[n, K\] values, K = 2\); "
                                               "calibration compares one number per time"):
        objective.simulate({"rate": TRUE_RATE}, 0)
    with pytest.raises(asim.ConfigError, match=r"model 'grow' has no metric 'per_cel' \(metrics: x, total, big, lamps; "
                                               r"derived: per_cell, share_big, per_lamp\)\. Perhaps you meant "
                                               r"'per_cell'\?"):
        Objective(GROW, GROW_DATA, ("rate",), "per_cel")


def test_the_cli_fits_a_derived_metric_of_a_user_model(tmp_path, capsys):
    data = tmp_path / "x.csv"  # the CLI runs seeds 0..K-1: the data of seed 0
    made = asim.run(GROW, agents=200, steps=6, seed=0, params={"rate": TRUE_RATE}).metrics["per_cell"][1:]
    data.write_text("# GROW's per_cell at rate 0.7, seed 0\nday,x\n" + "".join(f"{t},{v!r}\n" for t, v in
                                                                          enumerate(made.tolist(), start=1)))
    out = tmp_path / "fit.json"
    assert main(["calibrate", "test_calibrate:GROW", "--data", str(data), "--column", "x", "--metric", "per_cell",
                 "--fit", "rate", "--agents", "200", "--start", "rate=0.3", "--quiet", "--out", str(out)]) == 0
    capsys.readouterr()
    got = json.loads(out.read_text())
    assert got["params"]["rate"] == pytest.approx(TRUE_RATE, rel=1e-3) and got["settings"]["metric"] == "per_cell"
