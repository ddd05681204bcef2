"""``agentsim check`` (agentsim.runner.invariance): every reference model is identical on 1, 2 and 3
processes with each partitioner, shuffled and resumed; models that are not are reported at their
first difference with a hint.
"""

from __future__ import annotations

import pytest

from agentsim.cli.main import main
from agentsim.core.catalog import BUILTIN
from agentsim.runner.invariance import CHECK_STEPS, check_model

SMALL = {"agents": 120, "steps": 6}
# covid builds each process's people by locality: enough localities at 120 people that every process gets some
PARAMS = {"covid": {"people_per_locality": 15}}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", sorted(BUILTIN))
def test_every_reference_model_passes_agentsim_check(name):
    report = check_model(name, params=PARAMS.get(name), **SMALL)
    assert report.identical, report.summary()
    assert "W = 2, data" in report.runs and "W = 3, data" in report.runs
    assert any(r.startswith("resumed at step 3") for r in report.runs)
    if name not in ("flu", "spillover"):  # models with agents outside a space (or no space)
        assert "W = 3, spatial" in report.runs, report.runs
    assert not report.unsplit and all(min(counts) > 0 for counts in report.splits.values()), report.splits


def test_a_reach_too_small_is_caught_by_the_check_mode_first():
    report = check_model("bad_models:short_reach", **SMALL)
    assert not report.identical and report.contract is not None
    assert "substep 'crowding'" in report.contract and "beyond its declared reach" in report.contract


@pytest.mark.timeout(120)
def test_a_reach_too_small_is_caught_by_the_runs_with_the_spatial_partitioner():
    report = check_model("bad_models:short_reach", contract=False, **SMALL)
    d = report.divergence
    assert d is not None and d.run.endswith("spatial") and d.substep == "crowding" and d.field == "agent.wealth", d
    assert "reads agents beyond its declared reach" in d.hint
    assert "W = 2, data" in report.runs  # the data partitioner's runs were identical


@pytest.mark.timeout(120)
def test_state_kept_outside_the_agents_is_caught():
    report = check_model("bad_models:forgetful", **SMALL)  # the check mode's second call of 'pay' differs
    assert report.contract is not None and "substep 'pay'" in report.contract
    report = check_model("bad_models:forgetful", contract=False, **SMALL)  # so does a second run
    d = report.divergence
    assert d is not None and d.run == "one process, rows shuffled" and d.step == 1 and d.substep == "pay", d
    assert "agent.wealth" in str(d) and "keeps state outside agent fields" in d.hint


@pytest.mark.timeout(120)
def test_the_cli_prints_the_verdict_and_exits_0_or_1(capsys):
    assert main(["check", "randomwalk", "--agents", "60", "--steps", "3", "--world-sizes", "1,2"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("agentsim check: identical on W = 1, 2 (data, spatial) (rows shuffled; resumed at step 1 "
                          "on W = 2): randomwalk, 60 agents, 3 steps, 1 substep")
    assert main(["check", "bad_models:local_sum", "--agents", "30", "--steps", "2"]) == 1
    assert "contract broken" in capsys.readouterr().out


@pytest.mark.timeout(120)
def test_a_partition_that_split_nothing_is_not_called_tested(capsys):
    report = check_model("bad_models:huddled", **SMALL)
    assert not report.identical and report.contract is None and report.divergence is None
    assert "W = 2, spatial" in report.unsplit and "W = 3, spatial" in report.unsplit
    assert not any(r.endswith("data") for r in report.unsplit)
    assert report.splits["W = 2, data"] == [60, 60] and report.splits["W = 2, spatial"] == [120, 0]
    text = report.summary()
    assert text.startswith("not a test of the partition") and "'W = 2, spatial'" in text
    assert "agentsim check --partition data" in text
    assert main(["check", "bad_models:huddled", "--agents", "40", "--steps", "2", "--world-sizes", "1,2",
                 "--partition", "data", "--no-resume"]) == 0
    out = capsys.readouterr().out
    assert "identical on W = 1, 2 (data)" in out and "W = 2, data: 20 + 20" in out


@pytest.mark.timeout(300)
def test_the_default_check_is_long_enough_for_cars_to_speed_up():
    """A reach too short for cars that start at rest changes nothing for the first steps: 10 steps pass
    it, the default finds it once the cars have sped up."""
    assert check_model("bad_models:slow_start", agents=300, steps=10, world_sizes=(1,)).identical
    report = check_model("bad_models:slow_start", agents=300, world_sizes=(1,))
    assert report.steps == CHECK_STEPS and report.contract is not None, report.summary()
    assert "substep '_drive_blind'" in report.contract and "declared reach 'moore:1'" in report.contract
