"""sync_every > 1: stale neighbor reads by the snapshot rule of agentsim.distributed.snapshot.

A tiny model with values worked out by hand checks the rule itself (refresh steps,
stored values for own and other rows, deaths visible until the next refresh, births
stored at their values at birth), on one process, with shuffled rows, and with the
data partitioner on 2 and 3 ranks. The reference models are checked on 1-4 ranks in
tests/test_distributed.py.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import agentsim as asim
from agentsim import ConfigError, Population, Simulation, State
from agentsim.distributed import TorchComm
from agentsim.distributed.snapshot import NeighborSnapshots
from agentsim.runner.launch import run_ranks

MODEL = asim.Model("snapshot_probe")


@MODEL.substep(writes=["a.x"])
def grow(ctx: asim.Context) -> None:
    a = ctx["a"]
    a["x"] = a["x"] + 1


@MODEL.substep(reads=["a.x"], writes=["a.seen", "a.own"], neighbors={"a": ["x"]})
def look(ctx: asim.Context) -> None:
    """seen: the sum of x over every visible agent; own: x as read in the agent's own row."""
    a, nb = ctx["a"], ctx.neighbors("a")
    x = nb["x"]
    a["seen"] = x.sum().expand(nb.n_local).clone()
    a["own"] = x[: nb.n_local].clone()


@MODEL.substep(reads=["a.x"], births=["a"], deaths=["a"])
def life(ctx: asim.Context) -> None:
    """At step 2: uid 0 dies and uid 1 has a child with x = 100 (called on every step and rank)."""
    a = ctx["a"]
    uid = a["uid"]
    ctx.kill("a", (uid == 0) & (ctx.step == 2))
    parents = uid[(uid == 1) & (ctx.step == 2)]
    ctx.spawn("a", parents, {"x": torch.full((parents.shape[0],), 100.0, dtype=torch.float64),
                             "seen": torch.zeros(parents.shape[0], dtype=torch.float64),
                             "own": torch.zeros(parents.shape[0], dtype=torch.float64)})


@MODEL.init
def init(ic: asim.InitContext) -> None:
    uid = ic.uids("a", ic.n_agents)
    zeros = torch.zeros(ic.n_agents, dtype=torch.float64)
    ic.add("a", uid=uid, x=uid.to(torch.float64) * 10.0, seen=zeros, own=zeros)


# Six agents, x = 0, 10, ..., 50; sync_every = 3. By hand, per uid after each step:
EXPECTED = {
    # step 1 refreshes: x + 1 everywhere; look sees the current sum 1 + 11 + ... + 51 = 156.
    1: {"x": {0: 1, 1: 11, 2: 21, 3: 31, 4: 41, 5: 51}, "seen": 156,
        "own": {0: 1, 1: 11, 2: 21, 3: 31, 4: 41, 5: 51}},
    # step 2 is stale: the stored sum and own values of step 1; then uid 0 dies, uid 6 is born (x = 100).
    2: {"x": {1: 12, 2: 22, 3: 32, 4: 42, 5: 52, 6: 100}, "seen": 156,
        "own": {1: 11, 2: 21, 3: 31, 4: 41, 5: 51, 6: 0}},
    # step 3 is stale: the dead uid 0 is still seen (x = 1), the newborn with its birth value 100.
    3: {"x": {1: 13, 2: 23, 3: 33, 4: 43, 5: 53, 6: 101}, "seen": 256,
        "own": {1: 11, 2: 21, 3: 31, 4: 41, 5: 51, 6: 100}},
    # step 4 refreshes: current values, uid 0 gone: 14 + 24 + 34 + 44 + 54 + 102 = 272.
    4: {"x": {1: 14, 2: 24, 3: 34, 4: 44, 5: 54, 6: 102}, "seen": 272,
        "own": {1: 14, 2: 24, 3: 34, 4: 44, 5: 54, 6: 102}},
}


def by_uid(state: State) -> dict[str, dict[int, float]]:
    a = state["a"]
    return {k: dict(zip(a["uid"].tolist(), a[k].tolist())) for k in ("x", "seen", "own")}


def check_step(rows: dict[str, dict[int, float]], step: int) -> None:
    want = EXPECTED[step]
    assert rows["x"] == want["x"], step
    assert rows["own"] == want["own"], step
    born_after_look = {6} if step == 2 else set()  # spawned by life, after look: seen is its birth value 0
    assert {u: v for u, v in rows["seen"].items() if u not in born_after_look} == \
        {u: want["seen"] for u in want["x"] if u not in born_after_look}, step
    assert all(rows["seen"][u] == 0 for u in born_after_look), step


def trajectory(sim) -> list[dict[str, dict[int, float]]]:
    """Per step, every agent's fields by uid (gathered to rank 0 on several ranks)."""
    out = []
    for _ in range(4):
        sim.step()
        rows = sim.comm.gather_rows(sim.state["a"].fields())
        if rows is not None:
            out.append(by_uid(State({"a": Population("a", sim.state["a"].specs, rows)})))
    return out


@pytest.mark.parametrize("shuffle", [False, True])
def test_one_process_follows_the_snapshot_rule(shuffle):
    sim = Simulation(MODEL, agents=6, sync_every=3, shuffle_rows=shuffle)
    for step, rows in enumerate(trajectory(sim), 1):
        check_step(rows, step)


def test_sync_every_1_reads_current_values():
    sim = Simulation(MODEL, agents=6)
    got = trajectory(sim)
    assert got[1]["seen"][1] == 12 + 22 + 32 + 42 + 52 + 2  # step 2 sees step-2 values
    assert got[2]["seen"][1] == 13 + 23 + 33 + 43 + 53 + 101  # step 3: uid 0 gone, the newborn current


def probe_on_subgroups(comm) -> dict | None:
    groups = {w: dist.new_group(list(range(w))) for w in (2, 3)}
    out = {}
    for w, group in groups.items():
        if comm.rank < w:
            sim = Simulation(MODEL, agents=6, comm=TorchComm(group=group), partition="data", sync_every=3)
            out[w] = (trajectory(sim), [p["halo/rows"] for p in sim.perf_steps])
        dist.barrier()
    return out if comm.rank == 0 else None


@pytest.mark.timeout(90)
def test_data_partition_on_2_and_3_ranks_follows_the_same_rule():
    got = run_ranks(probe_on_subgroups, 3, timeout=60.0)[0]
    for w, (steps, halo_rows) in got.items():
        for step, rows in enumerate(steps, 1):
            check_step(rows, step)
        # Halos travel on refresh steps only (steps 1 and 4); step 2's newborn travels with its birth.
        assert halo_rows[0] > 0 and halo_rows[3] > 0 and halo_rows[1] == halo_rows[2] == 0, (w, halo_rows)


def test_sync_every_is_checked():
    with pytest.raises(ConfigError, match=r"sync_every: expected an int >= 1 \(got 0\)"):
        Simulation(MODEL, agents=6, sync_every=0)
    with pytest.raises(ConfigError, match="sync_every: expected an int >= 1"):
        NeighborSnapshots(True)  # type: ignore[arg-type]
