"""What a metric may return, checked by the engine: per-agent values that an exact fixed-point sum
holds. NaN, inf or values too large for it stop the run with an error naming the metric, on every
process at the same step (never a silent 0 or a wrapped sum); one value for the whole population
(a 0-d float, or a 0-d mean), whose sum would depend on how agents are split among processes, is
refused. ``FLAGGED`` is importable by worker processes as ``test_metric_values:FLAGGED``."""

from __future__ import annotations

import pytest
import torch

import agentsim as asim
from agentsim import ConfigError, SimulationError
from agentsim.core.metrics import METRIC_VALUE_LIMIT


def ages(body: str, reduce: str = "sum") -> asim.Model:
    """Walkers with an age in years; the metric ``bad`` returns ``body`` of the state."""
    model = asim.Model("ages")

    @model.init
    def init(ic: asim.InitContext) -> None:
        uid = ic.uids("walker", ic.n_agents)
        ic.add("walker", uid=uid, age=80.0 * ic.rng.uniform(uid, "age"))

    @model.substep(writes=["walker.age"])
    def older(ctx: asim.Context) -> None:
        ctx["walker"]["age"] = ctx["walker"]["age"] + 1.0

    namespace = {"torch": torch, "LIMIT": METRIC_VALUE_LIMIT}
    exec(f"def bad(state):\n    age = state['walker']['age']\n    return {body}", namespace)
    model.metric(name="bad", reduce=reduce)(namespace["bad"])
    return model


@pytest.mark.parametrize(("body", "step"), [
    ("age * float('nan')", 0),
    ("torch.where(age > 82.0, float('inf'), 0.0)", 3),     # the oldest cross 82 on step 3
    ("torch.where(age > 82.0, -float('inf'), 0.0)", 3),
    ("age * 0 + LIMIT", 0),
    ("age * 0 - LIMIT", 0),
    ("age.float() * 1e12", 0),
])
def test_values_an_exact_sum_cannot_hold_stop_the_run_naming_the_metric(body, step):
    with pytest.raises(SimulationError, match=rf"step {step}: metric 'bad': NaN, inf or a value of magnitude "):
        asim.run(ages(body), agents=100, steps=3, seed=1)


def test_the_largest_values_below_the_limit_are_summed_exactly():
    top = float(torch.nextafter(torch.tensor(METRIC_VALUE_LIMIT, dtype=torch.float64), torch.tensor(0.0)))
    result = asim.run(ages(f"(age * 0 + {top!r})[:1]"), agents=100, steps=1, seed=1)
    assert result.metrics["bad"].tolist() == [top, top]


@pytest.mark.parametrize(("body", "reduce"),
                         [("age.sum()", "sum"), ("age.mean()", "mean"), ("(age > 40).sum()", "mean")])
def test_one_value_for_the_whole_population_is_refused_where_its_sum_would_depend_on_the_split(body, reduce):
    with pytest.raises(ConfigError, match=r"metric 'bad': expected per-agent values \[n\] \(got one value, a 0-d "
                                          r"tensor\).*return the per-agent values"):
        asim.run(ages(body, reduce), agents=100, steps=1, seed=1)


def test_an_integer_count_may_be_returned_as_one_sum():
    # integer sums are exact in any order: the same as counting per agent
    counted = asim.run(ages("(age > 40).sum()"), agents=100, steps=3, seed=1).metrics["bad"]
    per_agent = asim.run(ages("age > 40"), agents=100, steps=3, seed=1).metrics["bad"]
    assert counted.tolist() == per_agent.tolist()


FLAGGED = ages("torch.where(state['walker']['uid'] == 97, age * float('nan'), age)")  # one agent, on one rank


@pytest.mark.timeout(180)
def test_a_nan_on_one_process_stops_every_process_at_the_same_step():
    with pytest.raises(SimulationError, match=r"step 0: metric 'bad': NaN.*on 1 process"):
        asim.launch(FLAGGED, world_size=2, agents=100, steps=3, seed=1, timeout=60.0)


def test_a_sum_beyond_the_fixed_point_range_stops_the_run_instead_of_wrapping():
    # 1000 agents worth 1e9 each: a sum of 1e12, past 2**39 (it wrapped to -9.95e7 before)
    with pytest.raises(SimulationError, match=r"step 0: metric 'bad': its sum may exceed 5.5e\+11 in magnitude"):
        asim.run(ages("age * 0 + 1e9", "mean"), agents=1000, steps=1, seed=1)
    assert asim.run(ages("age * 0 + 1e8", "mean"), agents=1000, steps=1, seed=1).metrics["bad"].tolist() == [1e8, 1e8]


WIDE = ages("torch.where(state['walker']['uid'] < 50, age * 0 + (2.0**38 - 1), age * 0 - (2.0**38 - 1))")


@pytest.mark.timeout(180)
def test_the_sum_range_check_does_not_depend_on_the_number_of_processes():
    with pytest.raises(SimulationError, match=r"its sum may exceed"):
        asim.run(WIDE, agents=100, steps=1, seed=1)
    with pytest.raises(SimulationError, match=r"its sum may exceed"):
        asim.launch(WIDE, world_size=2, agents=100, steps=1, seed=1, timeout=60.0)
