"""Exact float deposits (``combine='add'`` on float env layers, ``ctx.deposit``): sums against a
brute force, the same bits on 1-4 processes with both partitioners, and what is refused."""

from __future__ import annotations

import pytest
import torch

import agentsim as asim
from agentsim import ConfigError, ContractError, FieldAccessError, Simulation, SimulationError, get_model
from agentsim.core.env import DEPOSIT_FRAC_BITS
from agentsim.runner.invariance import check_model
from agentsim.runner.launch import run_ranks


def test_deposits_are_exact_sums_of_rounded_amounts() -> None:
    """One step of grazing against the rule written out with float64 sums of the rounded amounts."""
    only = get_model("deposit_models:grazers").configure(substeps=["graze"])
    got = Simulation(only, agents=400, seed=2)
    grass0 = got.state.env["grass"].clone()
    cells = got.state["bug"]["cell"].clone()
    got.run(1)
    crowd = torch.bincount(cells, minlength=grass0.numel()).double()
    share = grass0.reshape(-1)[cells].double() * 0.3 / crowd[cells]
    unit = 2.0 ** -DEPOSIT_FRAC_BITS
    rounded = torch.round(share / unit)  # the int64 units each bug deposits (negated for grass)
    eaten = torch.zeros(grass0.numel(), dtype=torch.float64).index_add_(0, cells, rounded)
    want = (grass0.reshape(-1).double() - eaten * unit).float().reshape(grass0.shape)
    assert torch.equal(got.state.env["grass"], want)
    dung = torch.zeros(grass0.numel(), dtype=torch.float64).index_add_(
        0, cells, torch.round(0.1 * share / unit)) * unit
    assert torch.equal(got.state.env["dung"].reshape(-1), dung)


def _layers_model(body, layer: str = "heat", combine: bool = True) -> asim.Model:
    """Agents on cell 0 of a 4 x 4 grid with a float layer ``heat`` and an int layer ``count``; one
    substep ``body`` that writes ``layer`` (with combine 'add' where ``combine``).
    """
    model = asim.Model("layers")

    @model.init
    def init(ic):
        ic.add("a", uid=ic.uids("a", ic.n_agents), cell=torch.zeros(ic.n_agents, dtype=torch.int64))
        ic.add_env(heat=torch.zeros(4, 4), count=torch.zeros(4, 4, dtype=torch.int64))
        return asim.Grid((4, 4))

    model.substep(reads=["a.cell"], writes=[f"env.{layer}"],
                  combine={f"env.{layer}": "add"} if combine else None)(body)
    return model


def test_a_float_layer_that_adds_is_written_only_by_deposits() -> None:
    def direct(ctx):
        ctx.env["heat"][0, 0] += 1.0

    def deposit(ctx):
        ctx.deposit("heat", ctx["a"]["cell"], torch.ones(ctx["a"].n))

    def count(ctx):
        ctx.deposit("count", ctx["a"]["cell"], torch.ones(ctx["a"].n))

    def float_cells(ctx):
        ctx.deposit("heat", ctx["a"]["cell"].double(), torch.ones(ctx["a"].n))

    def nan(ctx):
        ctx.deposit("heat", ctx["a"]["cell"], torch.full((ctx["a"].n,), float("nan")))

    for model, error, match in [
            (_layers_model(direct), FieldAccessError, r"writes env.heat directly: .* only through ctx.deposit"),
            (_layers_model(deposit, combine=False), FieldAccessError,
             r"declare the layer in writes= with combine=\{'env.heat': 'add'\}"),
            (_layers_model(count, layer="count"), ConfigError, "deposits are for float layers"),
            (_layers_model(float_cells), ConfigError, r"expected cells \[m\] integers and amounts \[m\] floats"),
            (_layers_model(nan), SimulationError, "an amount that is NaN, inf")]:
        with pytest.raises(error, match=match):
            Simulation(model, agents=3).run(1)
    three = Simulation(_layers_model(deposit), agents=3)
    three.run(1)
    assert three.state.env["heat"][0, 0] == 3.0 and three.state.env["heat"].sum() == 3.0


def test_the_check_mode_finds_deposits_made_for_the_halo() -> None:
    with pytest.raises(ContractError, match=r"deposits into env.dung \(cell \d+: .*\) changes when the agents are "
                                            r"split over two processes: deposit for this process's agents only"):
        Simulation(get_model("deposit_models:halo_dung"), agents=200, seed=1, check=True).run(2)


def _grazing(comm, partition: str) -> dict:
    result = Simulation(get_model("deposit_models:grazers"), agents=500, seed=4, comm=comm,
                        partition=partition).run(10)
    return {k: v.tobytes() for k, v in result.metrics.items() if k in ("grass", "dung", "n_bug")}


@pytest.mark.timeout(120)
def test_grazing_is_identical_on_one_and_two_processes() -> None:
    """The deposits' sums over two processes (and the env-only rain made once): the one-process bits."""
    one = Simulation(get_model("deposit_models:grazers"), agents=500, seed=4).run(10)
    want = {k: one.metrics[k].tobytes() for k in ("grass", "dung", "n_bug")}
    for partition in ("data", "spatial"):
        assert run_ranks(_grazing, 2, (partition,), timeout=60.0)[0] == want, partition


@pytest.mark.long
@pytest.mark.timeout(600)
def test_grazing_is_identical_on_one_to_four_processes() -> None:
    report = check_model("deposit_models:grazers", agents=800, steps=20, world_sizes=(1, 2, 3, 4))
    assert report.identical, report.summary()
