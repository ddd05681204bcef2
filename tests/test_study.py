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
