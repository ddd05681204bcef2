"""The overlapped end-of-step exchange (agentsim.distributed.overlap).

The bitwise tests of ``test_distributed_spatial.py`` run boids with it on 2, 3 and 4
ranks. Here: its rare paths, forced (a pair that overflows its capacity and sends the
rest in a second round; arrivals deeper than the guessed depth, so border agents are
recomputed), its error flags, and when it applies.
"""

from __future__ import annotations

import pytest
import torch
from test_distributed import assert_same_bits, sorted_fields

from agentsim import ConfigError, Simulation, get_model
from agentsim.comm import LocalComm
from agentsim.distributed import DistributedSimulation, SpatialPartition, run_ranks
from agentsim.distributed import overlap as overlap_mod
from agentsim.distributed.comm import TorchComm
from agentsim.model import Model
from agentsim.params import ParamSpec
from agentsim.space.continuous import Box
from agentsim.state import FieldSpec, Population, State
from agentsim.substep import Registry

AGENTS, STEPS, SEED = 800, 8, 5


def boids_reference() -> dict:
    sim = Simulation(get_model("boids"), agents=AGENTS, seed=SEED)
    result = sim.run(STEPS)
    return {"metrics": result.metrics, "agents": sorted_fields(sim.state["boid"].fields())}


def run_boids(comm, force: str) -> dict | None:
    """Boids on this rank with one rare path forced: ``"overflow"`` (every pair's capacity is
    64 bytes), ``"depth"`` (the guessed depth is reset to 0 before every exchange) or
    ``"balance"`` (borders move every other step: the exchange waits, the halo is dropped)."""
    posts = {"n": 0, "recomputed": 0}
    if force == "overflow":
        overlap_mod._capacity = lambda payload: 64
    post = TorchComm.post_all_to_all

    def counted(self, *args):
        posts["n"] += 1
        return post(self, *args)

    TorchComm.post_all_to_all = counted
    balance = {"balance_every": 2, "balance_threshold": 1.0} if force == "balance" else {}
    sim = DistributedSimulation(get_model("boids"), agents=AGENTS, seed=SEED, comm=comm,
                                partition="spatial", layout="rcb", **balance)
    ov = sim.overlap
    assert ov is not None
    if force == "depth":
        real_post = ov.post

        def post_with_no_depth(*args, **kwargs):
            ov.depth = 0.0
            return real_post(*args, **kwargs)

        ov.post = post_with_no_depth  # type: ignore[method-assign]
        real_complete = ov.complete

        def complete(*args, **kwargs):
            heads = real_complete(*args, **kwargs)
            posts["recomputed"] += ov.depth > ov.guess
            return heads

        ov.complete = complete  # type: ignore[method-assign]
    result = sim.run(STEPS)
    agents = comm.gather_rows(sim.state["boid"].fields())
    if comm.rank != 0:
        return None
    return {"metrics": result.metrics, "agents": sorted_fields(agents), "posts": posts["n"],
            "recomputed": posts["recomputed"], "perf": sim.perf_steps}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("force", ["overflow", "depth", "balance"])
def test_forced_rare_paths_keep_the_one_process_bits(force):
    ref = boids_reference()
    got = run_ranks(run_boids, 2, (force,), timeout=60.0)[0]
    assert_same_bits(ref["metrics"], got["metrics"], f"{force} metrics")
    assert_same_bits(ref["agents"], got["agents"], f"{force} agents")
    if force == "overflow":  # one post per step plus a second round for each overflow
        assert got["posts"] > STEPS + 2, got["posts"]
    elif force == "depth":
        assert got["recomputed"] >= STEPS // 2, got["recomputed"]  # steps with arrivals on rank 0
    else:
        assert sum(p["rebalanced"] for p in got["perf"]) >= 1
    assert sum(p["migrated"] for p in got["perf"]) > 0


# --------------------------------------------------------------------------- flags
def nan_in_agentwise_substep(comm):
    """uid 0 gets a NaN at step 3 in an overlapped substep: every rank raises, naming step 3."""
    from agentsim import SimulationError

    registry = Registry()

    @registry.substep(reads=["a.x", "a.pos"], writes=["a.x"], neighbors={"a": ["x", "pos"]}, reach=1.0,
                      agentwise=True)
    def grow(ctx):
        a = ctx["a"]
        nb = ctx.neighbors("a")
        x = a["x"] + nb["x"][: nb.n_local] * 0
        a["x"] = torch.where((a["uid"] == 0) & (ctx.step == 3), float("nan"), x)

    @registry.substep(reads=["a.pos"], writes=["a.pos"])
    def drift(ctx):
        a = ctx["a"]
        a["pos"] = ctx.space.wrap(a["pos"] + torch.tensor([0.7, 0.0]))

    def init(ic):
        uid = torch.arange(ic.n_agents)
        pos = torch.stack([uid * 10.0 / ic.n_agents, uid % 3 * 1.0], -1)
        pop = Population("a", {"x": FieldSpec(torch.float64), "pos": FieldSpec(torch.float32, (2,))},
                         {"uid": uid, "x": uid * 1.0, "pos": pos})
        return State({"a": pop}), Box((10.0, 3.0), periodic=True)

    model = Model("flagged", registry, ["grow", "drift"], ParamSpec({}), init)
    sim = DistributedSimulation(model, agents=40, comm=comm, partition="spatial")
    assert sim.overlap is not None
    try:
        sim.run(6)
    except SimulationError as e:
        return sim.state.step, str(e)
    return sim.state.step, None


@pytest.mark.timeout(60)
def test_a_flag_in_an_overlapped_step_is_raised_on_every_rank_naming_its_step():
    (step0, err0), (step1, err1) = run_ranks(nan_in_agentwise_substep, 2, timeout=30.0)
    assert err0 == err1 == "step 3: grow: NaN in a.x"
    assert step0 == step1 == 3


# --------------------------------------------------------------------------- when it applies
def test_overlap_applies_to_agentwise_first_substeps_only():
    def overlapped(model: str, world_size_2: bool = True, **options) -> bool:
        sim = Simulation(get_model(model), agents=50, seed=0)
        part = SpatialPartition(**options)
        part.bind(sim.space, sim.params)
        comm = LocalComm()
        if world_size_2:
            comm.world_size = 2  # the plan only reads the world size
        part.scatter(sim.state, LocalComm())
        return overlap_mod.overlap_plan(sim.model, part, sim.params, comm, 1) is not None

    assert overlapped("boids")
    assert not overlapped("boids", overlap=False)
    assert not overlapped("boids", world_size_2=False)
    assert not overlapped("randomwalk")  # no substep reads neighbors
    assert get_model("boids").substeps[0].agentwise


def test_agentwise_and_overlap_declarations_are_checked():
    registry = Registry()
    with pytest.raises(ConfigError, match="agentwise=True needs writes of one population only"):
        registry.substep(reads=["a.x"], writes=["a.x", "env.g"], agentwise=True)(lambda ctx: None)
    with pytest.raises(ConfigError, match="agentwise=True needs .* no env writes, births or deaths"):
        registry.substep(reads=["a.x"], writes=["a.x"], births=["a"], agentwise=True)(lambda ctx: None)
    with pytest.raises(ConfigError, match="agentwise: expected True or False"):
        registry.substep(reads=["a.x"], agentwise=1)(lambda ctx: None)
    with pytest.raises(ConfigError, match="overlap: expected True or False"):
        SpatialPartition(overlap="yes")


def test_population_extend_keeps_a_leading_block_and_keep_takes_int64_rows():
    pop = Population("a", {"x": FieldSpec(torch.float32)}, {"uid": torch.arange(5), "x": torch.arange(5.0)})
    pop.keep(torch.tensor([4, 0, 2]))
    assert pop["uid"].tolist() == [4, 0, 2]
    pop.extend({"uid": torch.tensor([9]), "x": torch.tensor([9.0])}, keep=2)
    assert pop["uid"].tolist() == [4, 0, 9] and pop["x"].tolist() == [4.0, 0.0, 9.0]
