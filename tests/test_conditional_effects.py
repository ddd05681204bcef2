"""ctx.flag, ctx.kill and ctx.spawn called on some processes only (inside an ``if`` on local data): the
run stays the one-process run where nothing is flagged, and a flag recorded on one process only stops
every process with its message (it used to crash the collective that gathers the step's report).
``GUARDED`` and ``FLAGGED`` are importable by worker processes as ``test_conditional_effects:NAME``."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import agentsim as asim
from agentsim import SimulationError


def counters(flag_uid: int) -> asim.Model:
    """Counters; uid 3 dies at step 0, uid 5 has a child at step 1, uid ``flag_uid`` is flagged."""
    model = asim.Model("counters")

    @model.init
    def init(ic: asim.InitContext) -> None:
        uid = ic.uids("a", ic.n_agents)
        ic.add("a", uid=uid, x=torch.zeros(ic.n_agents, dtype=torch.int64))

    @model.substep(writes=["a.x"], deaths=["a"], births=["a"])
    def step(ctx: asim.Context) -> None:
        a = ctx["a"]
        flagged = a["uid"] == flag_uid
        if flagged.any():  # on the process that holds the agent only
            ctx.flag(f"uid {flag_uid} reached", flagged.any())
        dies = (a["uid"] == 3) & (a["x"] == 0)
        if dies.any():
            ctx.kill("a", dies)
        parents = a["uid"][(a["uid"] == 5) & (a["x"] == 1)]
        if len(parents):
            ctx.spawn("a", parents, {"x": torch.zeros(len(parents), dtype=torch.int64)})
        a["x"] = a["x"] + 1

    @model.metric
    def total(state: asim.MetricsContext) -> torch.Tensor:
        return state["a"]["x"]

    return model


GUARDED = counters(flag_uid=-1)  # never flagged
FLAGGED = counters(flag_uid=17)


@pytest.mark.timeout(240)
def test_effects_called_on_some_processes_only_give_the_one_process_run():
    one = asim.run(GUARDED, agents=40, steps=4, seed=1)
    for w in (2, 3):
        got = asim.run(GUARDED, agents=40, steps=4, seed=1, nprocs=w, timeout=60)
        assert all(np.array_equal(one.metrics[k], got.metrics[k]) for k in one.metrics), w
    assert one.metrics["n_a"].tolist() == [40, 39, 40, 40, 40]


@pytest.mark.timeout(240)
def test_a_flag_recorded_on_one_process_stops_every_process_with_its_message():
    with pytest.raises(SimulationError, match=r"step 1: step: uid 17 reached"):
        asim.run(FLAGGED, agents=40, steps=4, seed=1)
    with pytest.raises(SimulationError) as caught:
        asim.run(FLAGGED, agents=40, steps=4, seed=1, nprocs=2, timeout=60)
    message = str(caught.value)  # both ranks stop at step 1: the flag's own, and the other rank naming it
    assert "SimulationError: step 1: step: uid 17 reached" in message, message
    assert "raised error conditions of its own" in message, message
