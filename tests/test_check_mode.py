"""The check mode (agentsim.engine.contract): each mistake of bad_models.py, silently wrong on several
processes, stops a one-process run in check mode at the substep, with the field, the agents and
a hint; correct models pass it with the bits of a run without it.
"""

from __future__ import annotations

import pytest
import torch

import agentsim as asim
from agentsim import ConfigError, ContractError, FieldAccessError, Simulation, SimulationError, get_model
from agentsim.runner.launch import run_ranks


def run_checked(ref: str, agents: int = 20, steps: int = 4, **kw):
    return Simulation(get_model(ref), agents=agents, seed=3, check=True, **kw).run(steps)


@pytest.mark.parametrize("ref", ["env_models:probe", "env_models:walkers", "bad_models:right_reach",
                                 "bad_models:counts_added", "wolfsheep", "schelling", "boids", "sir"])
def test_correct_models_pass_the_check_mode_with_the_same_bits(ref):
    model = get_model(ref)
    agents = 200 if ":" not in ref else 20
    checked = Simulation(model, agents=agents, seed=3, check=True).run(4)
    plain = Simulation(model, agents=agents, seed=3).run(4)
    for key, values in plain.metrics.items():
        assert checked.metrics[key].tobytes() == values.tobytes(), key


def test_a_reach_too_small_is_found_with_its_reach():
    with pytest.raises(ContractError, match=r"step 1: substep 'crowding': agent.wealth \(agents with uid .*\) changes "
                                            r"when the agents are split over two processes, each seeing the other's "
                                            r"agents within the declared reach 'moore:1' \(moore 1\) only.*reads "
                                            r"agents beyond its declared reach"):
        run_checked("bad_models:short_reach")


def test_a_sum_over_this_process_rows_is_found():
    with pytest.raises(ContractError, match=r"substep 'tax': agent.wealth .* changes when the agents are split over "
                                            r"two processes: agents read other agents only through ctx.neighbors"):
        run_checked("bad_models:local_sum")


def test_results_that_depend_on_row_order_are_found():
    with pytest.raises(ContractError, match=r"substep 'luck': agent.wealth .* changes when its agents come in "
                                            r"another row order"):
        run_checked("bad_models:unkeyed")


def test_an_env_write_whose_combine_does_not_fit_is_found_with_what_to_declare():
    with pytest.raises(ContractError, match=r"substep 'trample': env.food \(cell \d+: .*\) changes when the agents "
                                            r"are split over two processes: declare how writes to env.food combine: "
                                            r"combine=\{'env.food': 'add'\}"):
        run_checked("bad_models:counts")


def test_an_env_read_at_minus_one_is_found():
    with pytest.raises(ContractError, match=r"substep 'look_up': an env layer is indexed at -1"):
        run_checked("bad_models:edge_read")


def test_without_the_check_mode_the_same_models_run():
    Simulation(get_model("bad_models:short_reach"), agents=20, seed=3).run(2)  # silently: hence the check mode


def _short_reach_spatial(comm):
    Simulation(get_model("bad_models:short_reach"), agents=40, seed=3, comm=comm, partition="spatial",
               check=True).run(3)


@pytest.mark.timeout(60)
def test_on_several_ranks_the_spatial_reach_check_stops_every_rank():
    with pytest.raises(ContractError, match=r"substep 'crowding': \[rank \d\] agent.wealth .* changes when this rank "
                                            r"sees every other rank's agents .*reach 'moore:1'"):
        run_ranks(_short_reach_spatial, 2, timeout=30.0)


def test_a_sampled_check_checks_every_kth_step_only():
    """``check=K``: the same bits as a plain run; a broken contract found at the first checked step at
    or after the first step that breaks it; the steps between run unchecked.
    """
    model = get_model("wolfsheep")
    plain = Simulation(model, agents=200, seed=3).run(6)
    sampled = Simulation(model, agents=200, seed=3, check=3).run(6)
    for key, values in plain.metrics.items():
        assert sampled.metrics[key].tobytes() == values.tobytes(), key
    slow_start = get_model("bad_models:slow_start")  # reads 5 cells ahead, declares 1: broken on some steps
    with pytest.raises(ContractError, match=r"^step 10: substep '_drive_blind'"):
        Simulation(slow_start, agents=100, seed=3, check=True).run(30)
    with pytest.raises(ContractError, match=r"^step 27: substep '_drive_blind'"):  # steps 3, 6, ..., 27
        Simulation(slow_start, agents=100, seed=3, check=3).run(30)
    Simulation(slow_start, agents=100, seed=3, check=3).run(26)  # the checked steps 3 ... 24 keep the contract
    for bad in (-1, 2.5, "5"):
        with pytest.raises(ConfigError, match=r"check: expected True, False, or a number of steps K >= 1"):
            Simulation(model, agents=20, seed=3, check=bad)


def _short_reach_sampled(comm):
    Simulation(get_model("bad_models:short_reach"), agents=40, seed=3, comm=comm, partition="spatial",
               check=2).run(3)


@pytest.mark.long
@pytest.mark.timeout(60)
def test_a_sampled_check_on_several_ranks_stops_every_rank_at_a_checked_step():
    with pytest.raises(ContractError, match=r"ContractError: step 2: substep 'crowding': \[rank \d\]"):
        run_ranks(_short_reach_sampled, 2, timeout=30.0)


def test_check_mode_refuses_a_differentiable_run():
    with pytest.raises(ConfigError, match=r"check=True runs every substep several times"):
        Simulation(get_model("flu"), agents=50, check=True, grad=["beta"])


# ---------------------------------------------------------------------- checked in every run
def _one_pop_model(field_dtype=torch.float32, cells=None, uids=None, metric=None):
    model = asim.Model("m")

    @model.substep(writes=["a.x"])
    def grow(ctx):
        a = ctx["a"]
        a["x"] = a["x"].double() * 2  # float64 into a float32 field

    @model.init
    def init(ic):
        uid = ic.uids("a", 3) if uids is None else uids
        ic.add("a", uid=uid, x=torch.ones(3, dtype=field_dtype),
               cell=torch.tensor([0, 1, 2]) if cells is None else cells)
        return asim.Grid((2, 2))

    if metric:
        model.metric(name=metric)(lambda state: state["a"]["x"])
    return model


def test_a_float64_written_into_a_float32_field_is_refused():
    with pytest.raises(FieldAccessError, match=r"a.x: expected dtype torch.float32 \(got torch.float64\); writing it "
                                               r"would round or wrap the values without a word"):
        Simulation(_one_pop_model(), agents=3).run(1)
    Simulation(_one_pop_model(torch.float64), agents=3).run(1)  # a float64 field takes it


def test_init_cells_outside_the_grid_are_refused():
    with pytest.raises(ConfigError, match=r"init: population 'a' has agents on cell 4, outside the 2 x 2 grid "
                                          r"\(valid cells: 0 to 3\)"):
        Simulation(_one_pop_model(torch.float64, cells=torch.tensor([0, 4, 1])), agents=3)


def test_a_substep_that_moves_agents_off_the_grid_is_flagged():
    model = asim.Model("off")

    @model.substep(writes=["a.cell"])
    def fall(ctx):
        ctx["a"]["cell"] = ctx["a"]["cell"] - 1

    @model.init
    def init(ic):
        ic.add("a", uid=ic.uids("a", 2), cell=torch.tensor([0, 3]))
        return asim.Grid((2, 2), periodic=False)

    with pytest.raises(SimulationError, match=r"step 1: fall: a.cell holds a cell outside the 2 x 2 grid"):
        Simulation(model, agents=2).run(1)


def test_duplicate_uids_from_init_are_refused():
    with pytest.raises(ConfigError, match=r"add\('a'\): uid 1 appears more than once"):
        Simulation(_one_pop_model(torch.float64, uids=torch.tensor([0, 1, 1])), agents=3)


def test_a_metric_named_like_a_population_count_is_refused():
    with pytest.raises(ConfigError, match=r"metric 'n_a' has the name of the built-in count of population 'a'"):
        Simulation(_one_pop_model(torch.float64, metric="n_a"), agents=3)
