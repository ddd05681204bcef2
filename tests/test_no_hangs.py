"""No hangs: a rank that stalls inside a substep, or dies while the others are in a collective,
makes every other rank raise a CollectiveError that names it, within the group's timeout plus
a grace period, and the launcher stops the job."""

from __future__ import annotations

import os
import signal
import time

import pytest
import torch

import agentsim as asim
from agentsim.runner.launch import run_ranks

TIMEOUT = 2.0  # the process group's timeout (seconds)


def _model(culprit: int, action: str) -> asim.Model:
    """Walkers that read their neighbors (a collective every step); at step 2 rank ``culprit``
    stalls for 20 s (``"stall"``) or kills itself (``"die"``) inside the substep."""
    model = asim.Model("fragile")

    @model.substep(writes=["a.x"], neighbors={"a": ["x"]})
    def drift(ctx: asim.Context) -> None:
        a = ctx["a"]
        if ctx.step == 2 and culprit_here:
            if action == "stall":
                time.sleep(20.0)
            else:
                os.kill(os.getpid(), signal.SIGKILL)
        a["x"] = a["x"] + ctx.neighbors("a")["x"].sum() * 0 + 1

    @model.init
    def init(ic: asim.InitContext) -> None:
        uid = ic.uids("a", ic.n_agents)
        ic.add("a", uid=uid, x=uid.to(torch.float64))

    culprit_here = False
    model.culprit = lambda rank: rank == culprit  # type: ignore[attr-defined]
    return model


def fragile_run(comm, culprit, action, notes):
    model = _model(culprit, action)
    sim = asim.Simulation(model, agents=30, comm=comm, partition="data")
    # The substep closes over `culprit_here` of _model's frame: set it through the closure cell.
    drift = model.substeps[0].fn
    cell = drift.__closure__[drift.__code__.co_freevars.index("culprit_here")]
    cell.cell_contents = comm.rank == culprit
    try:
        sim.run(5)
    except asim.CollectiveError as e:
        with open(os.path.join(notes, f"rank-{comm.rank}.txt"), "w") as f:
            f.write(str(e))
        raise


@pytest.mark.timeout(120)
def test_a_rank_stalled_in_a_substep_is_named_and_nothing_hangs(tmp_path):
    t0 = time.monotonic()
    with pytest.raises(asim.CollectiveError) as info:
        run_ranks(fragile_run, 3, (1, "stall", str(tmp_path)), timeout=TIMEOUT)
    seconds = time.monotonic() - t0
    message = str(info.value)
    assert "still running, terminated: rank 1" in message
    for rank in (0, 2):
        note = (tmp_path / f"rank-{rank}.txt").read_text()
        assert note.startswith(f"rank {rank}: ") and "failed after" in note
        assert "rank 1 never arrived (stuck outside collectives, in a substep?, or dead) [Timed out" in note
    assert not (tmp_path / "rank-1.txt").exists()  # it was still asleep when the job was stopped
    assert seconds < 30, seconds


@pytest.mark.timeout(120)
def test_a_rank_that_dies_while_the_others_wait_in_a_collective_is_named(tmp_path):
    t0 = time.monotonic()
    with pytest.raises(asim.AgentsimError) as info:
        run_ranks(fragile_run, 3, (2, "die", str(tmp_path)), timeout=TIMEOUT)
    seconds = time.monotonic() - t0
    message = str(info.value)
    assert message.startswith("rank 2 of 3 died (signal SIGKILL) without reporting an error")
    for rank in (0, 1):
        assert f"rank {rank} (CollectiveError: rank {rank}: " in message
    for rank in (0, 1):
        note = (tmp_path / f"rank-{rank}.txt").read_text()
        assert "rank 2 never arrived" in note
    assert seconds < 30, seconds


def test_a_pair_closed_by_another_timeout_is_reported_as_a_timeout():
    # With a collective in flight (a step's report), the one a rank then waits in may fail with
    # gloo's "pair closure" after the other timed out: the same cause, said the same way.
    from agentsim.distributed.comm import _backend_reason

    closed = RuntimeError("[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Application timeout caused pair "
                          "closure")
    assert _backend_reason(closed).startswith("Timed out: a collective in flight on the same connection")
    timed_out = RuntimeError("[../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting "
                             "2000ms for recv operation to complete")
    assert _backend_reason(timed_out) == "Timed out waiting 2000ms for recv operation to complete"
