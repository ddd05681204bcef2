"""The overlapped end-of-step exchange (agentsim.distributed.overlap).

The bitwise tests of ``test_distributed_spatial.py`` run boids with it on 2, 3 and 4
ranks. Here: its rare paths, forced (a pair that overflows its capacity and sends the
rest in a second round; borders that move), agents that jump deep into another region
(so many interior agents are computed again), its error flags, and when it applies.
"""

from __future__ import annotations

import pytest
import torch
from equivalence import assert_same_bits, sorted_fields

import agentsim as asim
from agentsim import ConfigError, FieldAccessError, Simulation, Substep, get_model
from agentsim.core.comm import LocalComm
from agentsim.core.state import FieldSpec, Population, State
from agentsim.distributed import SpatialPartition
from agentsim.distributed import overlap as overlap_mod
from agentsim.distributed.comm import TorchComm
from agentsim.runner.launch import run_ranks
from agentsim.space.continuous import Box, radius_pairs

AGENTS, STEPS, SEED = 800, 8, 5


def boids_reference() -> dict:
    sim = Simulation(get_model("boids"), agents=AGENTS, seed=SEED)
    result = sim.run(STEPS)
    return {"metrics": result.metrics, "agents": sorted_fields(sim.state["boid"].fields())}


def run_boids(comm, force: str) -> dict | None:
    """Boids on this rank with one rare path forced: ``"overflow"`` (every pair's capacity is
    64 bytes) or ``"balance"`` (borders move every other step: the exchange waits, the halo
    is dropped)."""
    posts = {"n": 0}
    if force == "overflow":
        overlap_mod._capacity = lambda payload: 64
    post = TorchComm.post_all_to_all

    def counted(self, *args):
        posts["n"] += 1
        return post(self, *args)

    TorchComm.post_all_to_all = counted
    balance = {"balance_every": 2, "balance_threshold": 1.0} if force == "balance" else {}
    sim = Simulation(get_model("boids"), agents=AGENTS, seed=SEED, comm=comm, partition="spatial", layout="rcb",
                     **balance)
    assert sim.partition.overlap is not None
    result = sim.run(STEPS)
    agents = comm.gather_rows(sim.state["boid"].fields())
    if comm.rank != 0:
        return None
    return {"metrics": result.metrics, "agents": sorted_fields(agents), "posts": posts["n"], "perf": result.perf}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("force", ["overflow", "balance"])
def test_forced_rare_paths_keep_the_one_process_bits(force):
    ref = boids_reference()
    got = run_ranks(run_boids, 2, (force,), timeout=60.0)[0]
    assert_same_bits(ref["metrics"], got["metrics"], f"{force} metrics")
    assert_same_bits(ref["agents"], got["agents"], f"{force} agents")
    if force == "overflow":  # one post per step plus a second round for each overflow
        assert got["posts"] > STEPS + 2, got["posts"]
    else:
        assert sum(p["rebalanced"] for p in got["perf"]) >= 1
    assert sum(p["migrated"] for p in got["perf"]) > 0


def run_boids_sorted_often(comm):
    """Boids with rows sorted by cell every 3 steps; counts the steps whose exchange overlapped."""
    sim = Simulation(get_model("boids"), agents=AGENTS, seed=SEED, comm=comm, partition="spatial", sort_every=3)
    splits = []
    ov = sim.partition.overlap
    run_split = ov.run_split

    def counted(*args):
        splits.append(sim.state.step)
        return run_split(*args)

    ov.run_split = counted
    result = sim.run(STEPS)
    agents = comm.gather_rows(sim.state["boid"].fields())
    return None if comm.rank else (result.metrics, sorted_fields(agents), splits)


@pytest.mark.timeout(120)
def test_sorting_rows_by_cell_does_not_stop_the_overlap():
    """The rows are sorted at the end of a step, before the exchange is posted, so every step
    after the first overlaps its exchange; same bits as one process."""
    ref = boids_reference()
    metrics, agents, splits = run_ranks(run_boids_sorted_often, 2, timeout=60.0)[0]
    assert splits == list(range(1, STEPS)), splits
    assert_same_bits(ref["metrics"], metrics, "metrics")
    assert_same_bits(ref["agents"], agents, "agents")


# --------------------------------------------------------------------------- deep arrivals
def jumping_model(pairs: bool = False, shared: bool = False) -> asim.Model:
    """Agents in a periodic box: ``mix`` (agentwise) adds a tenth of each neighbor's ``x``
    within 1.0 (float sums in pair order: any change of neighbors or order changes bits);
    ``jump`` moves every agent up to 4 units along x (random), so arrivals land deep inside
    a region and the agents near them must be computed again.

    With ``pairs``: agents in pairs, 0.5 apart along x, one pair per row (rows 2 apart),
    that jump together: each agent's only neighbor is its partner, and ``mix`` flags an
    agent with no neighbor (never, on one process; on a rank, a pair that straddles a
    border has none before the halo arrives). With ``shared``, ``mix`` also writes ``y``: the
    same tensor object as ``x``."""
    model = asim.Model("jumping")

    @model.substep(reads=["a.x", "a.pos"], writes=["a.x", "a.y"], neighbors={"a": ["x", "pos"]}, reach=1.0,
                   agentwise=True)
    def mix(ctx: asim.Context) -> None:
        a, nb = ctx["a"], ctx.neighbors("a")
        i, j = radius_pairs(nb["pos"], ctx.space, 1.0, uid=nb["uid"], n_query=nb.n_local)
        a["x"] = a["x"] + torch.zeros_like(a["x"]).index_add_(0, i, nb["x"][j] * 0.1)
        a["y"] = a["x"] if shared else a["x"] * 2
        if pairs:
            ctx.flag("an agent with no neighbor", torch.bincount(i, minlength=nb.n_local) == 0)

    @model.substep(writes=["a.pos"])
    def jump(ctx: asim.Context) -> None:
        a = ctx["a"]
        dx = ctx.rng.uniform(a["uid"] // 2 if pairs else a["uid"], "jump", dtype=torch.float32) * 8 - 4
        a["pos"] = ctx.space.wrap(a["pos"] + torch.stack([dx, torch.zeros_like(dx)], -1))

    @model.init
    def init(ic: asim.InitContext) -> Box:
        uid = ic.uids("a", ic.n_agents)
        if pairs:
            pos = torch.stack([(uid // 2) * 0.37 % 9 + uid % 2 * 0.5, (uid // 2) * 2.0], -1)
            side = (10.0, 2.0 * ((ic.n_agents + 1) // 2))
        else:
            pos = torch.stack([uid * 10.0 / ic.n_agents, (uid * 7 % 13) * 4.0 / 13], -1)
            side = (10.0, 4.0)
        ic.add("a", uid=uid, x=uid.to(torch.float64) + 0.1, y=torch.zeros(ic.n_agents, dtype=torch.float64),
               pos=pos.to(torch.float32))
        return Box(side, periodic=True)

    return model


def run_jumping(comm, steps: int, shared: bool = False):
    sim = Simulation(jumping_model(shared=shared), agents=400, seed=2, comm=comm, partition="spatial")
    ov = sim.partition.overlap
    assert ov is not None
    depths = []
    complete = ov.complete

    def record_depth(*args, **kwargs):
        heads = complete(*args, **kwargs)
        if ov.arrived_dist.numel():
            depths.append(float(ov.arrived_dist.max()))
        return heads

    ov.complete = record_depth
    result = sim.run(steps)
    agents = comm.gather_rows(sim.state["a"].fields())
    return None if comm.rank else (result.metrics, sorted_fields(agents), max(depths))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("world_size, shared", [(2, False), (3, False), (2, True)])
def test_agents_that_jump_deep_into_a_region_keep_the_one_process_bits(world_size, shared):
    """Also (``shared``) when the substep writes one tensor object to two fields."""
    steps = 6
    ref = Simulation(jumping_model(shared=shared), agents=400, seed=2)
    metrics = ref.run(steps).metrics
    got_metrics, got_agents, depth = run_ranks(run_jumping, world_size, (steps, shared), timeout=60.0)[0]
    assert depth > 1.5  # arrivals lay deeper than the halo width (1.0)
    assert_same_bits(metrics, got_metrics, "metrics")
    assert_same_bits(sorted_fields(ref.state["a"].fields()), got_agents, "agents")


# --------------------------------------------------------------------------- flags
def nan_in_agentwise_substep(comm):
    """uid 0 gets a NaN at step 3 in an overlapped substep: every rank raises, naming step 3."""
    from agentsim import SimulationError

    model = asim.Model("flagged")

    @model.substep(reads=["a.x", "a.pos"], writes=["a.x"], neighbors={"a": ["x", "pos"]}, reach=1.0,
                   agentwise=True)
    def grow(ctx: asim.Context) -> None:
        a = ctx["a"]
        nb = ctx.neighbors("a")
        x = a["x"] + nb["x"][: nb.n_local] * 0
        a["x"] = torch.where((a["uid"] == 0) & (ctx.step == 3), float("nan"), x)

    @model.substep(writes=["a.pos"])
    def drift(ctx: asim.Context) -> None:
        a = ctx["a"]
        a["pos"] = ctx.space.wrap(a["pos"] + torch.tensor([0.7, 0.0]))

    @model.init
    def init(ic: asim.InitContext) -> Box:
        uid = ic.uids("a", ic.n_agents)
        pos = torch.stack([uid * 10.0 / ic.n_agents, uid % 3 * 1.0], -1)
        ic.add("a", uid=uid, x=uid.to(torch.float64), pos=pos.to(torch.float32))
        return Box((10.0, 3.0), periodic=True)

    sim = Simulation(model, agents=40, comm=comm, partition="spatial")
    assert sim.partition.overlap is not None
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


def run_pairs(comm, steps: int):
    """The pairs model on this rank; also how many agents had no neighbor on this rank
    in a run before the halo arrived (flags the engine must not raise)."""
    sim = Simulation(jumping_model(pairs=True), agents=40, seed=1, comm=comm, partition="spatial", layout="strips")
    lonely = []
    ov = sim.partition.overlap
    run_part = ov._run_part

    def counted(state, call, targets, others):
        out, flags = run_part(state, call, targets, others)
        if others is None:
            lonely.append(int(sum(f.condition.sum() for f in flags)))
        return out, flags

    ov._run_part = counted
    result = sim.run(steps)
    agents = comm.gather_rows(sim.state["a"].fields())
    return result.metrics, None if comm.rank else sorted_fields(agents), sum(lonely)


@pytest.mark.timeout(120)
def test_per_agent_flags_of_an_overlapped_substep_count_only_for_agents_computed_right():
    steps = 8
    ref = Simulation(jumping_model(pairs=True), agents=40, seed=1)
    metrics = ref.run(steps).metrics  # raises if any agent was ever alone
    (m0, agents, lonely0), (_, _, lonely1) = run_ranks(run_pairs, 2, (steps,), timeout=60.0)
    assert lonely0 + lonely1 > 0  # some pair straddled a border: alone before the halo
    assert_same_bits(metrics, m0, "metrics")
    assert_same_bits(sorted_fields(ref.state["a"].fields()), agents, "agents")


def test_an_agentwise_flag_must_hold_one_condition_per_agent():
    model = asim.Model("m")

    @model.substep(writes=["a.x"], agentwise=True)
    def check(ctx: asim.Context) -> None:
        ctx.flag("negative", (ctx["a"]["x"] < 0).any())

    @model.init
    def init(ic: asim.InitContext) -> Box:
        ic.add("a", uid=ic.uids("a", 4), x=torch.ones(4, dtype=torch.float64))
        return Box((1.0, 1.0))

    sim = Simulation(model, agents=4)
    with pytest.raises(FieldAccessError, match=r"agentwise: ctx.flag expects a condition per agent of 'a' "
                                               r"\(shape \[4, \.\.\.\]; got \[\]\)"):
        sim.step()


# --------------------------------------------------------------------------- when it applies
def test_overlap_applies_to_agentwise_first_substeps_only():
    def overlapped(model: str, world_size_2: bool = True, **options) -> bool:
        sim = Simulation(get_model(model), agents=50, seed=0)
        part = SpatialPartition(**options)
        comm = LocalComm()
        if world_size_2:
            comm.world_size = 2  # placing agents and the plan only read the world size
        part.place(sim.state, sim.space, sim.model.substeps, sim.params, comm)
        return part.overlap is not None

    assert overlapped("boids")
    assert not overlapped("boids", overlap=False)
    assert not overlapped("boids", world_size_2=False)
    assert not overlapped("randomwalk")  # no substep reads neighbors
    assert get_model("boids").substeps[0].agentwise


def test_agentwise_and_overlap_declarations_are_checked():
    def step(ctx):
        pass

    with pytest.raises(ConfigError, match="agentwise=True needs writes of one population only"):
        Substep(step, reads=["a.x"], writes=["a.x", "env.g"], agentwise=True)
    with pytest.raises(ConfigError, match="agentwise=True needs .* no env writes, births or deaths"):
        Substep(step, reads=["a.x"], writes=["a.x"], births=["a"], agentwise=True)
    with pytest.raises(ConfigError, match="agentwise: expected True or False"):
        Substep(step, reads=["a.x"], agentwise=1)
    with pytest.raises(ConfigError, match="overlap: expected True or False"):
        SpatialPartition(overlap="yes")


def test_population_extend_keeps_rows_and_keep_takes_int64_rows():
    pop = Population("a", {"x": FieldSpec(torch.float32)}, {"uid": torch.arange(5), "x": torch.arange(5.0)})
    pop.keep(torch.tensor([4, 0, 2]))
    assert pop["uid"].tolist() == [4, 0, 2]
    pop.extend({"uid": torch.tensor([9]), "x": torch.tensor([9.0])}, keep=torch.tensor([0, 1]))
    assert pop["uid"].tolist() == [4, 0, 9] and pop["x"].tolist() == [4.0, 0.0, 9.0]


def bare_exchange(name: str, reuse: bool = False) -> overlap_mod.OverlapExchange:
    """An exchange of population ``name`` with only what :meth:`OverlapExchange.merge` reads
    (the caller sets ``arrived`` and ``leave``)."""
    ov = overlap_mod.OverlapExchange.__new__(overlap_mod.OverlapExchange)
    ov.name, ov._near, ov.reuse, ov._allocated = name, None, reuse, {}
    return ov


@pytest.mark.parametrize("n_leave, n_arrive", [(0, 0), (0, 3), (3, 0), (2, 5), (5, 2), (4, 4), (9, 1)])
def test_merge_takes_out_the_leavers_and_puts_in_the_arrivals(n_leave, n_arrive):
    """Against a reference built with masks: the same agents with the same values, whatever
    the row order; leavers anywhere (also among the last rows), new values of a written field."""
    g = torch.Generator().manual_seed(n_leave * 10 + n_arrive)
    n = 12
    pop = Population("a", {"x": FieldSpec(torch.float32, (2,)), "k": FieldSpec(torch.int8)},
                     {"uid": torch.arange(n), "x": torch.rand(n, 2, generator=g),
                      "k": torch.arange(n, dtype=torch.int8)})
    state = State({"a": pop})
    leave = torch.randperm(n, generator=g)[:n_leave]
    arrived = {"uid": 100 + torch.arange(n_arrive), "x": torch.rand(n_arrive, 2, generator=g),
               "k": torch.full((n_arrive,), 7, dtype=torch.int8)}
    new_x = torch.rand(n, 2, generator=g)
    new_x_arrived = torch.rand(n_arrive, 2, generator=g)
    stay = torch.ones(n, dtype=torch.bool)
    stay[leave] = False
    want = {"uid": torch.cat([pop["uid"][stay], arrived["uid"]]), "x": torch.cat([new_x[stay], new_x_arrived]),
            "k": torch.cat([pop["k"][stay], arrived["k"]])}
    ov = bare_exchange("a")
    ov.arrived, ov.leave = arrived, leave
    ov.merge(state, written={"x": new_x}, arrived_written={"x": new_x_arrived})
    assert ov.arrived is None and ov.leave.numel() == 0
    assert_same_bits(sorted_fields(want), sorted_fields(state["a"].fields()), "merged")
    with pytest.raises(FieldAccessError, match=r"replace 'a': expected fields \['k', 'uid', 'x'\]"):
        state["a"].replace({"uid": torch.arange(2)})


def test_merge_reuses_only_the_tensors_it_allocated_itself():
    """With ``reuse``, a merge writes into the tensors the previous merge allocated (not into
    the caller's, nor after forget_allocated); the agents and values are those of a merge that
    allocates every time."""
    g = torch.Generator().manual_seed(3)
    n = 10
    held = {"uid": torch.arange(n), "x": torch.rand(n, generator=g)}
    held_copy = {k: v.clone() for k, v in held.items()}
    pop = Population("a", {"x": FieldSpec(torch.float32)}, dict(held))
    ref = pop.clone()
    ov, ref_ov = bare_exchange("a", reuse=True), bare_exchange("a")
    next_uid = 100
    for round_, (n_leave, n_arrive) in enumerate([(3, 2), (2, 2), (3, 1), (1, 3), (2, 2)]):
        if round_ == 4:
            ov.forget_allocated()
        ptr = {k: pop[k].data_ptr() for k in pop.keys()}
        leave = torch.randperm(pop.n, generator=g)[:n_leave]
        arrived = {"uid": next_uid + torch.arange(n_arrive), "x": torch.rand(n_arrive, generator=g)}
        next_uid += n_arrive
        for o, st in ((ov, pop), (ref_ov, ref)):
            o.arrived, o.leave = {k: v.clone() for k, v in arrived.items()}, leave.clone()
            o.merge(State({"a": st}))
        assert_same_bits(sorted_fields(ref.fields()), sorted_fields(pop.fields()), f"round {round_}")
        in_place = {k: pop[k].data_ptr() == ptr[k] for k in pop.keys()}
        # Round 0 merges the caller's tensors; round 3 grows; round 4 follows forget_allocated.
        expect = round_ in (1, 2)
        assert in_place == {"uid": expect, "x": expect}, (round_, in_place)
    assert_same_bits(held_copy, held, "the caller's tensors")


def run_boids_twice_holding_the_state(comm):
    """Two runs; between them the caller holds the state's tensors: the second run must not
    write into them (the merges of the first reused their own tensors in place)."""
    sim = Simulation(get_model("boids"), agents=AGENTS, seed=SEED, comm=comm, partition="spatial")
    sim.run(STEPS // 2)
    assert sim.partition.overlap is not None and not sim.partition.overlap.reuse
    held = sim.state["boid"].fields()
    copies = {k: v.clone() for k, v in held.items()}
    sim.run(STEPS - STEPS // 2)
    assert_same_bits(copies, held, f"rank {comm.rank}: tensors held between runs")
    agents = comm.gather_rows(sim.state["boid"].fields())
    return None if comm.rank != 0 else sorted_fields(agents)


@pytest.mark.timeout(120)
def test_tensors_held_between_runs_are_not_written():
    got = run_ranks(run_boids_twice_holding_the_state, 2, (), timeout=60.0)[0]
    assert_same_bits(boids_reference()["agents"], got, "agents after two runs")
