"""Env layers as distributed state (agentsim.core.env): models that read and write grid layers give the
one-process bits on 1-4 ranks with either partitioner, or stop with an error that says what to
declare. The models are in env_models.py, written as a user would from the README.
"""

from __future__ import annotations

import pytest
import torch
from equivalence import Case, check_same_as_reference, reference_runs, run_on_subgroups

from agentsim import ConfigError, Simulation, SimulationError, Substep, get_model
from agentsim.core.env import changed_cells, merge_layer
from agentsim.runner.launch import run_ranks

CASES = [
    Case("probe", "env_models:probe", 8),
    Case("walkers", "env_models:walkers", 12),
    Case("walkers-blocks", "env_models:walkers", 12, options={"layout": "blocks"}),
    Case("walkers-rcb", "env_models:walkers", 12, options={"layout": "rcb", "balance_every": 2,
                                                           "balance_threshold": 1.01}),
]


@pytest.fixture(scope="module")
def env_runs(tmp_path_factory):
    """One-process references and both partitioners on 2, 3, 4 ranks (two 4-rank jobs)."""
    ref = reference_runs(CASES, str(tmp_path_factory.mktemp("ref")))
    got = {}
    for partition in ("data", "spatial"):
        cases = CASES if partition == "spatial" else [c._replace(options={}) for c in CASES[:2]]
        out = str(tmp_path_factory.mktemp(partition))
        got[partition] = run_ranks(run_on_subgroups, 4, (cases, partition, out), timeout=90.0)[0]
    return ref, got


@pytest.mark.timeout(240)
def test_env_writes_give_the_one_process_bits_on_2_3_4_ranks(env_runs):
    ref, got = env_runs
    for partition, by_w in got.items():
        for w, results in by_w.items():
            for key, result in results.items():
                check_same_as_reference(ref[key], result, f"{partition} W={w} {key}")


@pytest.mark.timeout(240)
def test_the_probe_leaves_17_units_of_food_on_any_number_of_ranks(env_runs):
    ref, got = env_runs
    assert ref["probe"]["metrics"]["food_left"][-1] == 17  # 25 cells, 8 eaten
    for by_w in got.values():
        for results in by_w.values():
            assert results["probe"]["metrics"]["food_left"][-1] == 17


def _run_counted(comm):
    sim = Simulation(get_model("env_models:counted"), agents=5, seed=1, comm=comm, partition="data")
    sim.run(2)


@pytest.mark.timeout(60)
def test_processes_that_set_one_cell_to_different_values_stop_with_what_to_declare():
    # 2 and 3 agents of cell 0 on the two ranks: each sets its own count.
    with pytest.raises(SimulationError, match=r"step 1: count: env.crowd: cell 0 \(row 0, column 0\) was set to "
                                              r"different values on different processes.*combine=\{'env.crowd': "):
        run_ranks(_run_counted, 2, timeout=30.0)


def _run_raising(comm):
    Simulation(get_model("env_models:raising"), agents=6, seed=1, comm=comm, partition="data").run(1)


@pytest.mark.timeout(60)
def test_a_min_layer_that_is_raised_stops_the_run():
    with pytest.raises(SimulationError, match=r"lift: env.low combines by 'min' but cell 0 \(row 0, column 0\) "
                                              r"was raised \(from 0\)"):
        run_ranks(_run_raising, 2, timeout=30.0)


def test_merge_layer_is_the_same_in_any_row_order():
    old = torch.tensor([1.0, 2.0, 3.0, -0.0])
    cells = torch.tensor([3, 0, 2, 0])
    values = torch.tensor([0.0, 7.0, 9.0, 7.0])
    a = merge_layer(old, cells, values, "set")
    b = merge_layer(old, cells.flip(0), values.flip(0), "set")
    assert a[1] is None and torch.equal(a[0], b[0]) and a[0].tolist() == [7.0, 2.0, 9.0, 0.0]
    assert str(a[0][3].item()) == "0.0"  # +0 replaced -0: a change of bits
    ints = torch.tensor([5, 5, 5])
    for mode, want in (("add", [5, 12, 1]), ("min", [5, 5, 1]), ("max", [5, 9, 5])):
        c, v = torch.tensor([1, 2, 1]), torch.tensor([8, 1, 9])
        assert merge_layer(ints, c, v, mode)[0].tolist() == want, mode
        assert torch.equal(merge_layer(ints, c, v, mode)[0], merge_layer(ints, c.flip(0), v.flip(0), mode)[0])


def test_changed_cells_compares_bits():
    old = torch.tensor([0.0, float("nan"), 1.0])
    new = torch.tensor([-0.0, float("nan"), 1.0])
    assert changed_cells(old, new).tolist() == [0]


def test_combine_declarations_are_checked():
    def f(ctx):
        pass

    with pytest.raises(ConfigError, match=r"combine names 'env.food', which is not an env layer it writes"):
        Substep(f, writes=["a.x"], combine={"env.food": "add"})
    with pytest.raises(ConfigError, match=r"combine for env.food: expected one of set, add, min, max \(got 'sum'\)"):
        Substep(f, writes=["env.food"], combine={"env.food": "sum"})
    assert Substep(f, writes=["env.food"]).env_combine("food") == "set"


def test_add_on_a_float_layer_is_refused_at_run_start():
    import agentsim as asim

    model = asim.Model("float_add")

    @model.substep(reads=["a.x"], writes=["env.heat"], combine={"env.heat": "add"})
    def warm(ctx):
        pass

    @model.init
    def init(ic):
        uid = ic.uids("a", 2)
        ic.add("a", uid=uid, x=torch.zeros(2))
        ic.add_env(heat=torch.zeros(3, 3, dtype=torch.bool))
        return asim.Grid((3, 3))

    with pytest.raises(ConfigError, match=r"combine 'add' for env.heat needs an integer or a float layer \(got "
                                          r"torch.bool\)"):
        Simulation(model, agents=2)
