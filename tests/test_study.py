"""Population studies from Python."""

import pytest

from agentsim import ConfigError
from agentsim.study import grid, sweep


def test_grid_is_the_cartesian_product():
    assert grid({"a": [1, 2], "b": ["x"]}) == [{"a": 1, "b": "x"}, {"a": 2, "b": "x"}]


def test_sweep_records_and_monotone_final_size():
    recs = sweep("sir", {"beta": [0.0, 0.02, 0.05]}, seeds=[1, 2], agents=3000, steps=60)
    assert len(recs) == 6 and {r["seed"] for r in recs} == {1, 2}
    final = {b: [r["R"] + r["I"] for r in recs if r["beta"] == b] for b in (0.0, 0.02, 0.05)}
    assert max(final[0.0]) <= 3 < min(final[0.05])  # no transmission without beta
    series = sweep("randomwalk", {"step_size": [1.0]}, agents=100, steps=3, keep="series")
    assert len(series[0]["msd"]) == 4


def test_sweep_validates_before_running():
    with pytest.raises(ConfigError, match="unknown parameter 'betta'"):
        sweep("sir", {"betta": [0.1]}, agents=10, steps=1)
    with pytest.raises(ConfigError, match="must be a list"):
        sweep("sir", {"beta": 0.1}, agents=10, steps=1)


def test_sweep_keeps_a_vector_metric_as_a_list():
    from test_vector_metrics import VEC

    final = sweep(VEC, {"scale": [0.5]}, seeds=[1], agents=30, steps=2)[0]
    assert isinstance(final["x_hist"], list) and len(final["x_hist"]) == 5 and sum(final["x_hist"]) == 30
    series = sweep(VEC, {"scale": [0.5]}, seeds=[1], agents=30, steps=2, keep="series")[0]
    assert len(series["x_hist"]) == 3 and series["x_hist"][-1] == final["x_hist"]


def test_a_study_stores_vector_series_and_summarizes_scalar_metrics_only(tmp_path):
    import numpy as np

    from agentsim.study import Study, read_study

    path = tmp_path / "vec.h5"
    Study("test_vector_metrics:VEC", {"scale": [0.5, 1.0]}, seeds=[1, 2], agents=30, steps=3).run(path, workers=1)
    data = read_study(path)
    assert data.completed and len(data.runs) == 4
    run = data.runs["c0000-r0000"]["metrics"]
    assert run["x_hist"].shape == (4, 5) and run["x_hist"].dtype == np.int64 and run["pos_mean"].shape == (4, 2)
    assert (run["x_hist"].sum(1) == 30).all() and run["x"].shape == (4,)
    assert "final_x" in data.summary and "final_n_walker" in data.summary
    assert not [c for c in data.summary if "x_hist" in c or "pos_sum" in c]  # no summary of vector metrics
    band = data.bands["c0001"]
    assert band["x"].shape == (3, 4) and band["x_hist"].shape == (3, 4, 5)  # [Q, T] and [Q, T, K]
    series = np.stack([r["metrics"]["x_hist"] for r in data.runs.values() if r["combo"] == 1])
    assert np.array_equal(band["x_hist"], np.quantile(series.astype(np.float64), [0.1, 0.5, 0.9], axis=0))
