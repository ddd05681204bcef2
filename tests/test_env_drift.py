"""Every process holds every env layer whole, and the engine compares the copies at the end of every
step of a run on several processes: a substep that changes a layer differently on different processes
(a draw from torch.rand in a substep that touches only env) stops the run naming the layer, instead of
letting the copies drift apart in silence; keyed draws (ctx.rng by cell index) run as on one process.
``DRIFTING`` and ``KEYED`` are importable by worker processes as ``test_env_drift:NAME``."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import agentsim as asim
from agentsim import SimulationError
from agentsim.distributed.partition import env_checksum


def noisy(keyed: bool) -> asim.Model:
    """Agents on a 10 x 10 grid read a noise layer that a substep touching only env redraws."""
    model = asim.Model("noisy")

    @model.init
    def init(ic: asim.InitContext) -> asim.Grid:
        uid = ic.uids("a", ic.n_agents)
        ic.add("a", uid=uid, cell=uid % 100, seen=torch.zeros(ic.n_agents, dtype=torch.float64))
        ic.add_env(noise=torch.zeros(10, 10, dtype=torch.float64))
        return asim.Grid((10, 10))

    @model.substep(writes=["env.noise"])
    def shake(ctx: asim.Context) -> None:
        cells = torch.arange(100)
        draw = ctx.rng.uniform(cells) if keyed else torch.rand(100, dtype=torch.float64)
        ctx.env["noise"] = draw.reshape(10, 10)

    @model.substep(reads=["a.cell", "env.noise"], writes=["a.seen"])
    def look(ctx: asim.Context) -> None:
        a = ctx["a"]
        a["seen"] = ctx.env["noise"].reshape(-1)[a["cell"]]

    @model.metric
    def seen(state: asim.MetricsContext) -> torch.Tensor:
        return state["a"]["seen"]

    return model


DRIFTING, KEYED = noisy(keyed=False), noisy(keyed=True)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("partition", ["data", "spatial"])
def test_env_copies_that_drift_apart_stop_the_run_naming_the_layer(partition):
    with pytest.raises(SimulationError, match=r"step 1: env noise: the processes' copies differ after this step"):
        asim.run(DRIFTING, agents=50, steps=3, seed=1, nprocs=2, partition=partition, timeout=60)
    one = asim.run(KEYED, agents=50, steps=3, seed=1)
    two = asim.run(KEYED, agents=50, steps=3, seed=1, nprocs=2, partition=partition, timeout=60)
    assert np.array_equal(one.metrics["seen"], two.metrics["seen"])


def test_the_checksum_sees_a_changed_value_and_most_moves():
    x = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    same = env_checksum(x.clone())
    assert env_checksum(x) == same
    changed = x.clone()
    changed[1, 2] = torch.nextafter(changed[1, 2], torch.tensor(100.0))  # one bit
    assert env_checksum(changed) != same
    swapped = x.clone().reshape(-1)
    swapped[[0, 1]] = swapped[[1, 0]]
    assert env_checksum(swapped.reshape(3, 4)) != same
    for layer in (torch.ones(5, dtype=torch.bool), torch.tensor(3, dtype=torch.int64), torch.ones(4, dtype=torch.int8)):
        assert env_checksum(layer).dtype == torch.int64


def test_a_metric_that_reads_state_env_is_told_to_read_owned_env():
    model = noisy(keyed=True)

    @model.metric
    def noise_total(state: asim.MetricsContext) -> torch.Tensor:
        return state.env["noise"]

    with pytest.raises(AttributeError, match=r"a metric reads env layers with state.owned_env\(name\)"):
        asim.run(model, agents=20, steps=1, seed=1)
