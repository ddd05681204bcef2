"""Vector metrics ([n, K] per-agent rows, summed per column) and histogram metrics (hist=edges):
exact sums against brute-force numpy, counts against numpy.histogram, declarations refused with
clear messages, the [T, K] series in RunResult and in HDF5 (also a resumed, appended run), and the
same bits on 1, 2 and 3 ranks. The model ``VEC`` is importable by worker processes as
``test_vector_metrics:VEC``."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import agentsim as asim
from agentsim import ConfigError, Metric, Model, Param, Simulation
from agentsim.core.context import MetricsContext
from agentsim.core.metrics import METRIC_FRAC_BITS, Histogram, histogram_counts, local_sums, metric_row
from agentsim.core.state import FieldSpec, Population, State
from agentsim.io.hdf5 import read_trajectory

INF = float("inf")
EDGES = (-INF, -1.0, 0.0, 0.5, 1.0, INF)
X_EDGES = (0.0, 0.25, 0.5, 1.0)  # values outside are not counted

VEC = Model("vec", params={"scale": Param(1.0, "step size", gt=0)})


@VEC.substep(writes=["walker.pos"])
def move(ctx: asim.Context) -> None:
    """Gaussian steps."""
    w = ctx["walker"]
    w["pos"] = w["pos"] + ctx.params["scale"] * ctx.rng.normal(w["uid"], draws=2, dtype=torch.float64)


@VEC.init
def init(ic: asim.InitContext) -> None:
    """Walkers in the unit square, of kind uid % 3."""
    uid = ic.uids("walker", ic.n_agents)
    ic.add("walker", uid=uid, pos=ic.rng.uniform(uid, "pos", draws=2, dtype=torch.float64),
           kind=(uid % 3).to(torch.int64))


@VEC.metric()
def pos_sum(m: asim.MetricsContext) -> torch.Tensor:
    """Column sums of the positions: a vector of 2."""
    return m["walker"]["pos"]


@VEC.metric(reduce="mean")
def pos_mean(m: asim.MetricsContext) -> torch.Tensor:
    """The mean position."""
    return m["walker"]["pos"]


@VEC.metric()
def kinds(m: asim.MetricsContext) -> torch.Tensor:
    """Walkers per kind (one-hot rows, bool)."""
    return m["walker"]["kind"][:, None] == torch.arange(3)


@VEC.metric(hist=EDGES)
def x_hist(m: asim.MetricsContext) -> torch.Tensor:
    """x in open-ended bins."""
    return m["walker"]["pos"][:, 0]


@VEC.metric(hist=X_EDGES)
def y_hist(m: asim.MetricsContext) -> torch.Tensor:
    """y in [0, 1] (the walkers outside are not counted)."""
    return m["walker"]["pos"][:, 1]


@VEC.metric(name="x")
def x_total(m: asim.MetricsContext) -> torch.Tensor:
    """A scalar metric among them."""
    return m["walker"]["pos"][:, 0]


@VEC.derived
def x_share(m):
    """The histogram as shares of the walkers: a derived vector."""
    return m["x_hist"] / m["n_walker"]


@VEC.derived
def counted_y(m):
    """A number from a vector."""
    return int(m["y_hist"].sum())


def _context(**fields: torch.Tensor) -> MetricsContext:
    n = len(next(iter(fields.values())))
    specs = {k: FieldSpec(v.dtype, tuple(v.shape[1:])) for k, v in fields.items()}
    pop = Population("a", specs, {"uid": torch.arange(n), **fields})
    return MetricsContext(State({"a": pop}), {}, None, 0)


def _row(metrics: list[Metric], mc: MetricsContext) -> dict:
    return metric_row(0, local_sums(metrics, mc), metrics)


def _fixed(x: np.ndarray) -> np.ndarray:
    """Brute force: each value in int64 fixed point (round half to even), summed per column."""
    return np.round(x.astype(np.float64) * 2.0**METRIC_FRAC_BITS).astype(np.int64).sum(0)


# --------------------------------------------------------------------------- sums and counts
def test_a_vector_metric_is_the_exact_sum_of_each_column():
    g = torch.Generator().manual_seed(3)
    x = (torch.randn(5000, 4, generator=g, dtype=torch.float64) * 1000.0)
    x[::7, 2] = 0.5 * 2.0**-METRIC_FRAC_BITS  # halfway cases round to even
    counts = torch.randint(-50, 50, (5000, 3), generator=g, dtype=torch.int32)
    mc = _context(x=x, f=x.float(), c=counts, b=counts > 0)
    metrics = [Metric(lambda m: m["a"]["x"], name="x"), Metric(lambda m: m["a"]["f"], name="f"),
               Metric(lambda m: m["a"]["c"], name="c"), Metric(lambda m: m["a"]["b"], name="b"),
               *[Metric(lambda m, j=j: m["a"]["x"][:, j], name=f"x{j}") for j in range(4)]]
    row = _row(metrics, mc)
    assert row["x"].shape == (4,) and row["x"].dtype == np.float64
    assert row["x"].tolist() == (_fixed(x.numpy()) * 2.0**-METRIC_FRAC_BITS).tolist()
    assert row["f"].tolist() == (_fixed(x.float().numpy()) * 2.0**-METRIC_FRAC_BITS).tolist()
    assert row["c"].dtype == np.int64 and row["c"].tolist() == counts.numpy().astype(np.int64).sum(0).tolist()
    assert row["b"].tolist() == (counts > 0).sum(0).tolist()
    assert row["x"].tolist() == [row[f"x{j}"] for j in range(4)]  # the same bits as one scalar metric per column
    assert list(row) == ["step", "n_a", "x", "f", "c", "b", "x0", "x1", "x2", "x3"]
    sums = local_sums(metrics[:1], mc)
    assert sums.names == ["n_a", "x#0", "x#1", "x#2", "x#3", "x#invalid", "x#bound"]
    assert sums.values.dtype == torch.int64


def test_a_mean_vector_divides_each_column_by_the_rows():
    x = torch.tensor([[1.0, 10.0], [2.0, 20.0], [4.0, 40.0]], dtype=torch.float64)
    mean = Metric(lambda m: m["a"]["x"], name="m", reduce="mean")
    big = Metric(lambda m: m["a"]["x"][m["a"]["x"][:, 0] > 1.5], name="big", reduce="mean")
    none = Metric(lambda m: m["a"]["x"][:0], name="none", reduce="mean")
    row = _row([mean, big, none], _context(x=x))
    assert row["m"].tolist() == [7 / 3, 70 / 3] and row["big"].tolist() == [3.0, 30.0]
    assert row["none"].shape == (2,) and np.isnan(row["none"]).all()


@pytest.mark.parametrize("values, edges", [
    ([-3.0, -1.0, -0.5, 0.0, 0.25, 0.5, 1.0, 7.0], EDGES),
    ([-INF, INF, math.nan, 0.0, 1.0, -1.0], EDGES),
    ([-0.1, 0.0, 0.25, 0.999, 1.0, 1.0001, math.nan, INF, -INF], X_EDGES),
    ([], X_EDGES),
    ([5.0, 5.0, 6.0], (5.0, 6.0)),  # one bin, closed at both ends
])
def test_hist_counts_are_numpys_histogram(values, edges):
    v = torch.tensor(values, dtype=torch.float64)
    want = np.histogram(np.asarray(values, dtype=np.float64), bins=np.asarray(edges))[0]
    assert histogram_counts(v, torch.tensor(edges, dtype=torch.float64)).tolist() == want.tolist()
    metric = Metric(lambda m: m["a"]["v"], name="h", hist=edges)
    row = _row([metric], _context(v=v))
    assert isinstance(row["h"], Histogram) and row["h"].dtype == np.int64
    assert row["h"].tolist() == want.tolist() and row["h"].edges == tuple(float(e) for e in edges)


def test_hist_counts_integers_and_random_values_like_numpy():
    g = torch.Generator().manual_seed(1)
    edges = (-2.0, -0.5, 0.0, 0.1, 3.0)
    v = torch.randn(100_000, generator=g, dtype=torch.float64) * 2
    assert histogram_counts(v, torch.tensor(edges, dtype=torch.float64)).tolist() == \
        np.histogram(v.numpy(), bins=edges)[0].tolist()
    ages = torch.randint(0, 100, (1000,), generator=g)
    row = _row([Metric(lambda m: m["a"]["age"], name="ages", hist=[0, 18, 65, 100])], _context(age=ages))
    assert row["ages"].tolist() == np.histogram(ages.numpy(), bins=[0, 18, 65, 100])[0].tolist()


# --------------------------------------------------------------------------- refused
@pytest.mark.parametrize("kwargs, message", [
    ({"hist": [0, 2, 1]}, r"metric 'h' hist: expected strictly increasing bin edges \(got \[0, 2, 1\]: edge 2"),
    ({"hist": [1, 1]}, r"metric 'h' hist: expected strictly increasing bin edges"),
    ({"hist": [1]}, r"metric 'h' hist: expected at least 2 bin edges \(got 1: \[1\]\)"),
    ({"hist": [0, math.nan]}, r"metric 'h' hist: expected numbers as bin edges, not NaN"),
    ({"hist": "0,1"}, r"metric 'h' hist: expected a sequence of at least 2 increasing bin edges"),
    ({"hist": [0, "1"]}, r"metric 'h' hist: expected numbers as bin edges \(got \[0, '1'\]\)"),
    ({"hist": 3}, r"expected a sequence of at least 2 increasing bin edges, e.g. \[0, 10, 20\] \(got 3\)"),
    ({"hist": [0, 1], "reduce": "mean"}, r"metric 'h': hist counts values per bin, it has no reduce='mean'"),
])
def test_bad_histogram_declarations_are_refused(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        Metric(lambda m: m["a"]["v"], name="h", **kwargs)
    model = Model("m")
    with pytest.raises(ConfigError, match=message):
        model.metric(name="h", **kwargs)(lambda m: m["a"]["v"])
    assert model.metric_names() == []


def test_edges_may_be_arrays_and_tensors():
    assert Metric(lambda m: m, name="h", hist=np.array([0, 1.5])).hist == (0.0, 1.5)
    assert Metric(lambda m: m, name="h", hist=torch.tensor([-INF, 0.0])).hist == (-INF, 0.0)


def test_bad_metric_values_are_refused():
    mc = _context(x=torch.ones(4, 2), v=torch.ones(4))
    cases = [
        (Metric(lambda m: m["a"]["x"], name="h", hist=[0, 1]), r"metric 'h': a hist metric expects per-agent "
                                                               r"values \[n\] \(got shape \[4, 2\]\)"),
        (Metric(lambda m: m["a"]["x"][:, :0], name="e"), r"metric 'e': expected \[n, K\] values with K >= 1"),
        (Metric(lambda m: torch.ones(4, 2, 2), name="t"), r"metric 't': expected per-agent values \[n\] or rows "
                                                          r"\[n, K\] \(got shape \[4, 2, 2\]\); reshape"),
        (Metric(lambda m: 1.0, name="h2", hist=[0, 1]), r"a hist metric expects per-agent values \[n\] \(got float"),
    ]
    for metric, message in cases:
        with pytest.raises(ConfigError, match=message):
            local_sums([metric], mc)
    bad = Model("m")
    with pytest.raises(ConfigError, match=r"derived metric 'd': expected a number or a vector \[K\]"):
        metric_row(0, local_sums([], mc), [], [asim.core.metrics.Derived("d", lambda m: np.ones((2, 2)))])
    assert bad.metric_names() == []


def test_a_vector_whose_k_changes_between_steps_is_a_config_error(tmp_path):
    model = Model("grow_k")

    @model.substep(writes=["walker.pos"])
    def still(ctx: asim.Context) -> None:
        pass

    model.init(init)

    @model.metric()
    def widening(m: asim.MetricsContext) -> torch.Tensor:
        return m["walker"]["pos"].repeat(1, 1 + m.step)  # K = 2, then 4

    for out in (None, tmp_path / "k.h5"):
        with pytest.raises(ConfigError, match=r"metric 'widening': expected a vector of 2 entries at every step, "
                                              r"as at step 0 \(got a vector of 4 entries at step 1\); a vector "
                                              r"metric returns \[n, K\] with the same K on every rank"):
            Simulation(model, agents=5, seed=0).run(3, out=out)


# --------------------------------------------------------------------------- runs and files
def _check_row_values(metrics: dict, n: int) -> None:
    assert metrics["pos_sum"].shape == (len(metrics["step"]), 2)
    assert metrics["x_hist"].dtype == np.int64 and (metrics["x_hist"].sum(1) == n).all()  # open-ended: all counted
    assert (metrics["kinds"].sum(1) == n).all() and metrics["kinds"][0].tolist() == [n - 2 * (n // 3) - (n % 3 == 2),
                                                                                     n // 3 + (n % 3 == 2), n // 3]
    assert np.array_equal(metrics["pos_sum"][:, 0], metrics["x"])
    np.testing.assert_allclose(metrics["pos_mean"], metrics["pos_sum"] / n)
    np.testing.assert_allclose(metrics["x_share"], metrics["x_hist"] / n)
    assert metrics["counted_y"].tolist() == metrics["y_hist"].sum(1).tolist()


def test_a_run_keeps_t_by_k_series_and_the_file_holds_them_with_edges(tmp_path):
    out = tmp_path / "v.h5"
    result = Simulation(VEC, agents=50, seed=2).run(6, out=out)
    m = result.metrics
    _check_row_values(m, 50)
    assert m["x_hist"].shape == (7, 5) and m["y_hist"].shape == (7, 3) and m["kinds"].shape == (7, 3)
    assert m["y_hist"][0].sum() == 50 and m["y_hist"][-1].sum() < 50  # walkers left the unit square
    traj = read_trajectory(out)
    for name, series in m.items():
        assert np.array_equal(traj.metrics[name], series), name
        assert traj.metrics[name].dtype == series.dtype, name
    assert sorted(traj.edges) == ["x_hist", "x_share", "y_hist"]  # arrays computed from a Histogram keep its edges
    assert traj.edges["x_hist"].tolist() == traj.edges["x_share"].tolist() == list(EDGES)
    assert traj.edges["y_hist"].tolist() == list(X_EDGES)
    import h5py

    with h5py.File(out, "r") as f:
        ds = f["metrics/x_hist"]
        assert ds.shape == (7, 5) and ds.maxshape == (None, 5) and ds.dtype == np.int64


def test_a_resumed_run_appends_t_by_k_rows_as_one_uninterrupted_run(tmp_path):
    full = tmp_path / "full.h5"
    Simulation(VEC, agents=40, seed=5).run(8, out=full)
    part, ck = tmp_path / "part.h5", tmp_path / "ck"
    Simulation(VEC, agents=40, seed=5).run(6, out=part, checkpoint_every=4, checkpoint_dir=ck)  # killed after 6
    assert read_trajectory(part).metrics["x_hist"].shape == (7, 5)
    resumed = Simulation(VEC, agents=40, seed=5, resume=ck)
    assert resumed.state.step == 4
    resumed.run(4, out=part, append=True)  # rows 5 and 6 dropped and written again, then 7 and 8
    a, b = read_trajectory(full), read_trajectory(part)
    assert b.attrs["completed"] and b.attrs["steps_completed"] == 8
    assert sorted(a.metrics) == sorted(b.metrics)
    for name in a.metrics:
        assert a.metrics[name].tobytes() == b.metrics[name].tobytes(), name
    assert {k: v.tolist() for k, v in a.edges.items()} == {k: v.tolist() for k, v in b.edges.items()}


def _metrics_bits(result) -> dict[str, bytes]:
    return {k: np.asarray(v).tobytes() for k, v in result.metrics.items()}


@pytest.mark.timeout(240)
@pytest.mark.parametrize("agents", [60, 2])  # 2 agents on 3 ranks: a rank with no agents returns [0, K]
def test_vector_and_hist_metrics_have_the_same_bits_on_1_2_and_3_ranks(agents, tmp_path):
    one = Simulation(VEC, agents=agents, seed=7).run(4, out=tmp_path / "w1.h5")
    want = _metrics_bits(one)
    for w in (2, 3):
        got = asim.launch(VEC, world_size=w, agents=agents, steps=4, seed=7, out=tmp_path / f"w{w}.h5", timeout=60.0)
        assert _metrics_bits(got) == want, w
        traj = read_trajectory(tmp_path / f"w{w}.h5")
        assert traj.metrics["x_hist"].tobytes() == one.metrics["x_hist"].tobytes()
        assert traj.metrics["pos_sum"].tobytes() == one.metrics["pos_sum"].tobytes()
        assert traj.edges["x_hist"].tolist() == list(EDGES)
