"""State, models and substeps, parameters, contexts, metrics and the engine's declaration checks."""

from __future__ import annotations

import math

import pytest
import torch

import agentsim as asim
from agentsim import (
    ConfigError,
    FieldAccessError,
    FieldSpec,
    Model,
    Param,
    Population,
    Simulation,
    SimulationError,
    UnknownParameterError,
)
from agentsim.core.grouping import rank_in_group


def make_model(substeps=("grow", "breed", "cull"), **extra_steps):
    """A small model with births and deaths: cells grow, split and die; ``extra_steps`` add substeps."""
    model = Model("cells", params={"split_at": Param(1.5, "size at which a cell splits"),
                                   "death": Param(0.1, "daily death probability", ge=0, le=1)})

    @model.substep(writes=["cell.size"])
    def grow(ctx: asim.Context) -> None:
        c = ctx["cell"]
        c["size"] = c["size"] + ctx.rng.uniform(c["uid"], dtype=torch.float32)

    @model.substep(writes=["cell.size"], births=["cell"])
    def breed(ctx: asim.Context) -> None:
        c = ctx["cell"]
        big = c["size"] > ctx.params["split_at"]
        size = torch.where(big, c["size"] / 2, c["size"])
        c["size"] = size
        ctx.spawn("cell", c["uid"][big], {"size": size[big], "age": torch.zeros(int(big.sum()), dtype=torch.int32)})

    @model.substep(reads=["cell.size"], deaths=["cell"])
    def cull(ctx: asim.Context) -> None:
        c = ctx["cell"]
        ctx.kill("cell", ctx.rng.uniform(c["uid"]) < ctx.params["death"])

    for add in extra_steps.values():
        add(model)

    @model.init
    def init(ic: asim.InitContext) -> None:
        uid = ic.uids("cell", ic.n_agents)
        ic.add("cell", uid=uid, size=ic.rng.uniform(uid, "size", dtype=torch.float32),
               age=torch.zeros(ic.n_agents, dtype=torch.int32))

    @model.metric()
    def total_size_x1e6(state) -> torch.Tensor:
        return (state["cell"]["size"].double() * 1e6).round().long()

    return model.configure(substeps=list(substeps))


def final_table(sim):
    pop = sim.state["cell"]
    order = torch.argsort(pop["uid"])
    return pop["uid"][order], pop["size"][order]


def test_births_and_deaths_conserve_and_number_uids():
    sim = Simulation(make_model(), agents=200, seed=3)
    res = sim.run(20)
    n = res.metrics["n_cell"]
    assert n[0] == 200 and (n > 0).all()
    uid = sim.state["cell"]["uid"]
    assert uid.unique().numel() == uid.numel()
    assert sim.state["cell"].next_uid > 200


def test_results_do_not_depend_on_row_order():
    a = Simulation(make_model(), agents=300, seed=5)
    b = Simulation(make_model(), agents=300, seed=5, shuffle_rows=True)
    ra, rb = a.run(15), b.run(15)
    for k in ra.metrics:
        assert (ra.metrics[k] == rb.metrics[k]).all(), k
    ua, sa = final_table(a)
    ub, sb = final_table(b)
    assert torch.equal(ua, ub) and torch.equal(sa, sb)


def test_spawn_uids_follow_sorted_parents():
    pop = Population("p", {"x": FieldSpec(torch.float32)}, {"uid": torch.arange(5), "x": torch.zeros(5)})
    new = pop.spawn(torch.tensor([4, 1, 3]), {"x": torch.ones(3)})
    assert new.tolist() == [7, 5, 6]
    assert pop.next_uid == 8 and pop.n == 8


def test_extend_appends_arrivals_after_the_kept_rows():
    def pop():
        return Population("p", {"x": FieldSpec(torch.float32)}, {"uid": torch.arange(5), "x": torch.arange(5.0)})

    arrivals = {"uid": torch.tensor([10, 11]), "x": torch.tensor([7.0, 8.0])}
    a = pop()
    a.extend(arrivals)
    assert a["uid"].tolist() == [0, 1, 2, 3, 4, 10, 11] and a["x"].tolist() == [0, 1, 2, 3, 4, 7, 8]
    b = pop()
    b.extend(arrivals, keep=torch.tensor([4, 1]))  # the same as keep() then extend()
    c = pop()
    c.keep(torch.tensor([4, 1]))
    c.extend(arrivals)
    assert b["uid"].tolist() == c["uid"].tolist() == [4, 1, 10, 11] and b["x"].tolist() == c["x"].tolist()
    with pytest.raises(FieldAccessError, match=r"extend 'p': expected fields \['uid', 'x'\]"):
        b.extend({"uid": torch.tensor([12])})


def test_population_validation():
    with pytest.raises(ConfigError, match="missing"):
        Population("p", {"x": FieldSpec(torch.float32)}, {"uid": torch.arange(3)})
    pop = Population("p", {"x": FieldSpec(torch.float32)}, {"uid": torch.arange(3), "x": torch.zeros(3)})
    with pytest.raises(FieldAccessError, match=r"expected shape \[3\]"):
        pop["x"] = torch.zeros(4)
    with pytest.raises(FieldAccessError, match="Perhaps you meant 'x'"):
        pop["xx"]
    with pytest.raises(FieldAccessError, match="uid is assigned by the engine"):
        pop["uid"] = torch.arange(3)
    ipop = Population("q", {"k": FieldSpec(torch.int32)},
                      {"uid": torch.arange(2), "k": torch.zeros(2, dtype=torch.int32)})
    with pytest.raises(FieldAccessError, match="expected dtype torch.int32"):
        ipop["k"] = torch.tensor([0.5, 1.5])


def one_step(declare, body, agents: int = 5) -> Simulation:
    """A cells model whose only substep is ``body`` declared with ``declare``; one step run."""
    def add(model):
        model.substep(**declare)(body)

    sim = Simulation(make_model([body.__name__], extra=add), agents=agents)
    sim.step()
    return sim


def test_undeclared_write_is_an_error():
    def sneaky(ctx):
        ctx["cell"]["size"] = ctx["cell"]["size"] * 2

    with pytest.raises(FieldAccessError, match="writes 'cell.size' but does not declare it"):
        one_step({"reads": ["cell.size"]}, sneaky)


def test_undeclared_read_is_an_error():
    def peek(ctx):  # declares cell.size, reads cell.age
        ctx["cell"]["size"] = ctx["cell"]["size"] + ctx["cell"]["age"]

    with pytest.raises(FieldAccessError, match=r"substep 'peek' reads 'cell.age' but does not declare it \(declared "
                                               r"reads: \['size', 'uid'\]\); add 'cell.age' to reads="):
        one_step({"writes": ["cell.size"]}, peek)

    def grow_older(ctx):  # writes imply reads; uid is always readable
        c = ctx["cell"]
        c["age"] = c["age"] + (c["uid"] >= 0).to(torch.int32)

    assert one_step({"writes": ["cell.age"]}, grow_older).state["cell"]["age"].tolist() == [1] * 5

    def walk_dog(ctx):
        ctx["dog"]

    with pytest.raises(ConfigError, match="unknown population 'dog'"):
        one_step({"reads": ["cell.size"]}, walk_dog)


def test_in_place_modification_of_read_only_field_is_detected():
    def mutate(ctx):
        ctx["cell"]["size"].mul_(2)

    with pytest.raises(FieldAccessError, match="modified 'cell.size' in place"):
        one_step({"reads": ["cell.size"]}, mutate)


def test_undeclared_births_and_deaths():
    def kill_all(ctx):
        ctx.kill("cell", torch.ones(ctx["cell"].n, dtype=torch.bool))

    with pytest.raises(FieldAccessError, match="declares deaths=\\[\\]"):
        one_step({"reads": ["cell.size"]}, kill_all)


def test_declared_field_must_exist_at_run_start():
    def weigh(ctx):
        pass

    with pytest.raises(ConfigError, match="declares 'cell.mass'.*fields"):
        one_step({"reads": ["cell.mass"]}, weigh)


def test_error_flags_raise_once_per_step():
    def poison(ctx):
        c = ctx["cell"]
        c["size"] = c["size"] / 0.0 * 0.0  # NaN
        ctx.flag("size exploded", c["size"].isnan())

    with pytest.raises(SimulationError, match="step 1: poison: size exploded; poison: NaN in cell.size"):
        one_step({"writes": ["cell.size"]}, poison)


def test_ctx_params_are_read_only_and_a_typo_names_the_valid_ones():
    def typo(ctx):
        ctx.params["spilt_at"]

    with pytest.raises(UnknownParameterError, match=r"unknown parameter 'spilt_at' of model 'cells' "
                                                    r"\(valid: split_at, death\). Perhaps you meant 'split_at'\?"):
        one_step({"reads": ["cell.size"]}, typo)

    def assign(ctx):
        ctx.params["death"] = 1.0

    with pytest.raises(TypeError, match="parameters are read-only during a run"):
        one_step({"reads": ["cell.size"]}, assign)

    def defaults(ctx):  # a Mapping: get() and `in` work as on a dict
        assert ctx.params.get("nothing", 7) == 7 and "death" in ctx.params

    one_step({"reads": ["cell.size"]}, defaults)


def test_model_declarations_are_checked():
    model = make_model()
    with pytest.raises(ConfigError, match="substep 'grow' is already defined"):
        model.add_substep(model.substeps[0])
    with pytest.raises(ConfigError, match="expected a field reference"):
        model.substep(reads=["nodot"])(lambda ctx: None)
    with pytest.raises(ConfigError, match=r"reads: expected a list of 'population.field' \(got the string"):
        asim.Substep(lambda ctx: None, name="x", reads="cell.size")
    with pytest.raises(ConfigError, match="metric 'total_size_x1e6' is already defined"):
        model.metric(name="total_size_x1e6")(lambda state: state["cell"]["size"])
    with pytest.raises(ConfigError, match="metric name: expected a non-empty str without '#'"):
        asim.Metric(lambda state: state, name="a#b")
    with pytest.raises(ConfigError, match="metric reduce: expected one of sum, mean"):
        asim.Metric(lambda state: state, name="m", reduce="max")
    with pytest.raises(ConfigError, match="unknown substep 'mvoe'.*Perhaps you meant 'move'"):
        Model("m", substeps=[asim.Substep(lambda ctx: None, name="move")]).configure(substeps=["mvoe"])
    empty = Model("empty")
    with pytest.raises(ConfigError, match="model 'empty' has no init"):
        Simulation(empty, agents=3)

    @empty.init
    def init(ic):
        return asim.State({}), None  # what a 0.1 init returned: no longer accepted

    with pytest.raises(ConfigError, match="model 'empty' has no substep"):
        Simulation(empty, agents=3)
    empty.add_substep(asim.Substep(lambda ctx: None, name="noop"))
    with pytest.raises(ConfigError, match="init returns the space \\(got a tuple"):
        Simulation(empty, agents=3)


def test_param_bounds_and_choices_write_their_own_messages():
    model = make_model()
    with pytest.raises(UnknownParameterError, match="unknown parameter 'deth'.*valid: split_at, death.*Perhaps "
                                                    "you meant 'death'"):
        model.configure(params={"deth": 0.2})
    with pytest.raises(ConfigError, match="parameter 'death': expected a float"):
        model.configure(params={"death": "often"})
    with pytest.raises(ConfigError, match=r"parameter 'death': expected a value in \[0, 1\] \(got 2.0\)"):
        model.configure(params={"death": 2.0})
    assert model.configure(params={"death": "0.5"}).params["death"] == 0.5
    table = asim.core.params.ParamTable({
        "rate": Param(0.5, "a rate", gt=0, lt=1), "k": Param(3, "a count", ge=1),
        "mode": Param("a", "a mode", choices=["a", "b"]), "on": Param(True, "a switch"),
        "n": Param(type=int, doc="required count"),
    })
    for values, message in [({"rate": 1.0, "n": 1}, r"'rate': expected a value in \(0, 1\) \(got 1.0\)"),
                            ({"rate": float("nan"), "n": 1}, r"'rate': expected a float \(got nan\)"),
                            ({"k": 0, "n": 1}, r"'k': expected a value >= 1 \(got 0\)"),
                            ({"k": 1.5, "n": 1}, r"'k': expected an int \(got 1.5\)"),
                            ({"mode": "c", "n": 1}, r"'mode': expected one of \['a', 'b'\] \(got 'c'\)"),
                            ({"on": "maybe", "n": 1}, r"'on': expected a bool"),
                            ({}, r"missing required parameter 'n' \(required count\)"),
                            ({"n": "1.5"}, r"'n': expected an int")]:
        with pytest.raises(ConfigError, match=message):
            table.resolve(values)
    got = table.resolve({"n": "4", "on": "no", "k": 2.0})
    assert dict(got) == {"rate": 0.5, "k": 2, "mode": "a", "on": False, "n": 4}
    assert type(got["k"]) is int and type(got["rate"]) is float
    with pytest.raises(ConfigError, match="ge= needs a number parameter"):
        Param("x", "a name", ge=0)
    with pytest.raises(ConfigError, match="a parameter without a default needs type="):
        Param(doc="nothing")
    with pytest.raises(ConfigError, match=r"'default': expected a value >= 0 \(got -1.0\)"):
        Param(-1.0, "a bad default", ge=0)
    text = table.table()
    assert "in (0, 1)" in text and ">= 1" in text and "one of ['a', 'b']" in text and "required" in text


def test_init_context_reserves_uids_and_infers_field_specs():
    ic = asim.InitContext(asim.Params({}), 4, asim.CounterRNG(1).at(0, "init"), torch.device("cpu"))
    a, b = ic.uids("ant", 3), ic.uids("ant", 2)
    assert a.tolist() == [0, 1, 2] and b.tolist() == [3, 4] and ic.uids("bee", 1).tolist() == [0]
    ic.add("ant", uid=a, pos=torch.zeros(3, 2), alive=torch.ones(3, dtype=torch.bool))
    ic.add_env(food=torch.zeros(4, 4))
    state = ic.state()
    ants = state["ant"]
    assert ants.specs["pos"] == FieldSpec(torch.float32, (2,)) and ants.specs["alive"] == FieldSpec(torch.bool)
    assert ants.next_uid == 5  # births continue after every reserved uid
    assert list(state.env) == ["food"]
    with pytest.raises(ConfigError, match="population 'ant' was already added"):
        ic.add("ant", uid=b)
    with pytest.raises(ConfigError, match=r"uid must be a \[n\] int64 tensor \(got torch.float32 \[2\]\)"):
        ic.add("cow", uid=torch.zeros(2))
    with pytest.raises(ConfigError, match="use add_env"):
        ic.add("env", uid=b)
    with pytest.raises(ConfigError, match="environment layer 'food' was already added"):
        ic.add_env(food=torch.zeros(1))
    with pytest.raises(ConfigError, match=r"uids\('ant', n\): expected an int n >= 0"):
        ic.uids("ant", -1)
    assert torch.equal(ic.rng.uniform(a), asim.CounterRNG(1).uniform(a, 0, "init"))  # default stream "init"


def reachable(obj: object, depth: int = 3) -> list[object]:
    """Objects reachable from ``obj`` through attributes, containers and closures (a few levels)."""
    out, frontier = [], [obj]
    for _ in range(depth):
        nxt = []
        for o in frontier:
            parts = list(vars(o).values()) if hasattr(o, "__dict__") and not isinstance(o, type) else []
            if isinstance(o, dict):
                parts += list(o.values())
            if isinstance(o, (list, tuple)):
                parts += list(o)
            parts += [c.cell_contents for c in (getattr(o, "__closure__", None) or ())]
            nxt += parts
        out += nxt
        frontier = nxt
    return out


@pytest.mark.parametrize("sync_every", [1, 2])
def test_context_is_built_from_explicit_parts_with_no_engine_inside(sync_every):
    seen = {}

    def look(ctx):
        ctx.neighbors("cell")["size"]  # the neighbors function is part of the context too
        seen["ctx"] = ctx

    def add(model):
        model.substep(reads=["cell.size"], neighbors={"cell": ["size"]})(look)

    sim = Simulation(make_model(["look"], extra=add), agents=5, sync_every=sync_every)
    for _ in range(2):  # with sync_every=2, the second step reads the snapshot
        sim.step()
        ctx = seen["ctx"]
        assert not any(isinstance(o, Simulation) for o in reachable(ctx)), "the context reaches the engine"
    assert ctx.step == 2 and ctx.rng.stream == "look" and isinstance(ctx.params, asim.Params)
    assert ctx.space is sim.space is None and isinstance(ctx.effects, asim.core.context.Effects)


def test_a_simulation_that_stopped_with_an_error_refuses_to_go_on():
    def poison(ctx):
        c = ctx["cell"]
        c["size"] = c["size"] + (float("nan") if ctx.step == 2 else 0.0)

    def add(model):
        model.substep(writes=["cell.size"])(poison)

    sim = Simulation(make_model(["poison"], extra=add), agents=5)
    with pytest.raises(SimulationError, match="step 2: poison: NaN in cell.size"):
        sim.run(4)
    assert sim.state.step == 2 and sim.failed == "SimulationError in step 2: step 2: poison: NaN in cell.size"
    with pytest.raises(SimulationError, match=r"stopped with an error \(SimulationError in step 2: .*\); its state "
                                              r"may be partly updated: build a new Simulation"):
        sim.step()
    with pytest.raises(SimulationError, match="stopped with an error"):
        sim.run(1)


def test_misspelt_keywords_and_the_identity_partitioner_on_several_ranks_are_errors():
    with pytest.raises(ConfigError, match="unexpected option 'sort_evry'.*Perhaps you meant 'sort_every'"):
        Simulation(make_model(), agents=5, sort_evry=5)

    class TwoRanks(asim.core.comm.LocalComm):
        world_size = 2

    with pytest.raises(ConfigError, match="the identity partitioner keeps every agent on its rank; with 2 ranks"):
        Simulation(make_model(), agents=5, comm=TwoRanks(), partition=asim.distributed.partition.IdentityPartition())


def test_env_layers_through_ctx_env_and_ctx_of_env():
    model = Model("grazing")

    @model.substep(reads=["env.food"], writes=["cow.fed", "env.food"])
    def graze(ctx):
        food = ctx["env"]["food"]  # the 0.1 spelling of ctx.env["food"]
        ctx["cow"]["fed"] = ctx["cow"]["fed"] + food[ctx["cow"]["uid"] % 4]
        ctx.env["food"] = food * 0.5

    @model.init
    def init(ic):
        ic.add("cow", uid=ic.uids("cow", 3), fed=torch.zeros(3))
        ic.add_env(food=torch.ones(4))

    sim = Simulation(model, agents=3)
    sim.run(2)
    assert sim.state["cow"]["fed"].tolist() == [1.5] * 3 and sim.state.env["food"].tolist() == [0.25] * 4


def test_mean_and_derived_metrics():
    model = make_model()
    definition = model.configure()  # decorating a configured copy leaves the other copies alone

    @model.metric(reduce="mean")
    def mean_size(state):
        return state["cell"]["size"]

    @model.metric(reduce="mean")
    def mean_big_size(state):  # a mean over a subset: return only the agents that count
        size = state["cell"]["size"]
        return size[size > 100.0]

    @model.derived
    def total_over_n(m):
        return m["total_size_x1e6"] / m["n_cell"]

    sim = Simulation(model, agents=300, seed=2)
    m = sim.run(4).metrics
    size = sim.state["cell"]["size"].double()
    exact = asim.ops.exact_sum(size, frac_bits=24)  # the engine's fixed-point sum
    assert m["mean_size"][-1] == float(exact) / size.numel()
    assert math.isnan(m["mean_big_size"][-1])  # no value: NaN, not a division error
    assert m["total_over_n"][-1] == pytest.approx(m["mean_size"][-1] * 1e6, rel=1e-6)
    assert definition.metric_names() == ["total_size_x1e6"]


def test_the_decorator_free_form_is_the_same_model():
    def move(ctx):
        w = ctx["w"]
        w["x"] = w["x"] + ctx.rng.normal(w["uid"])

    def init(ic):
        uid = ic.uids("w", ic.n_agents)
        ic.add("w", uid=uid, x=torch.zeros(ic.n_agents, dtype=torch.float64))

    def spread(state):
        return state["w"]["x"] ** 2

    def rms(m):
        return math.sqrt(m["spread"])

    plain = Model("w", params={"s": Param(1.0, "unused")}, init=init, substeps=[asim.Substep(move, writes=["w.x"])],
                  metrics=[asim.Metric(spread, reduce="mean")], derived={"rms": rms})
    decorated = Model("w", params={"s": Param(1.0, "unused")})
    decorated.substep(writes=["w.x"])(move)
    decorated.init(init)
    decorated.metric(reduce="mean")(spread)
    decorated.derived(rms)
    a = asim.run(plain, agents=50, steps=3, seed=4).metrics
    b = asim.run(decorated, agents=50, steps=3, seed=4).metrics
    assert a["spread"].tolist() == b["spread"].tolist() and a["rms"][-1] == math.sqrt(a["spread"][-1])


def test_figures_and_timings_of_consecutive_runs():
    sim = Simulation(make_model(), agents=50, seed=1)
    first, second = sim.run(3), sim.run(2)
    assert len(first.perf) == 3 and len(second.perf) == 2 and len(sim.perf_steps) == 5
    assert len(sim.step_seconds) == 5 and all(len(v) == 5 for v in sim.substep_seconds.values())
    assert set(second.timings) == {"grow", "breed", "cull"} and all(v > 0 for v in second.timings.values())
    for p in [*first.perf, *second.perf]:
        assert p["comm/seconds_max"] <= p["rank_step_seconds/max"] and p["agents/imbalance"] == 1.0
    assert second.metrics["step"].tolist() == [3, 4, 5]


def test_compose_substeps_by_name_and_plan():
    m = make_model().configure(substeps=["grow", "cull"])
    assert [s.name for s in m.substeps] == ["grow", "cull"]
    with pytest.raises(ConfigError, match="unknown substep 'explode'"):
        make_model().configure(substeps=["explode"])
    text = m.plan()
    assert "grow" in text and "cell.size" in text and "-cell" in text and "ms/step" not in text
    result = Simulation(m, agents=50).run(3)
    # A run never changes the model: its timings live on the result.
    assert "ms/step" not in m.plan() and m.plan() == text
    assert "ms/step" in result.plan() and set(result.timings) == {"grow", "cull"}


def test_bad_run_arguments():
    m = make_model()
    for bad in (0, -5, 2.5, True):
        with pytest.raises(ConfigError, match="agents: expected a positive int"):
            Simulation(m, agents=bad)
    with pytest.raises(ConfigError, match="steps: expected an int >= 0"):
        Simulation(m, agents=5).run(-1)
    with pytest.raises(ConfigError, match="unknown device"):
        Simulation(m, agents=5, device="tpu")
    with pytest.raises(ConfigError, match="model: expected an agentsim.Model"):
        Simulation("sir", agents=5)
    with pytest.raises(ConfigError, match="nprocs: expected an int >= 1"):
        asim.run(m, agents=5, steps=1, nprocs=0)
    with pytest.raises(ConfigError, match="partition and its options need nprocs > 1"):
        asim.run(m, agents=5, steps=1, partition="spatial")
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="CUDA is not available"):
            Simulation(m, agents=5, device="cuda")


def test_a_reach_must_fit_the_space():
    model = asim.get_model("boids")

    def bad(ctx):
        pass

    grid_model = Model("g", substeps=[asim.Substep(bad, reads=["a.cell"], neighbors={"a": ["cell"]}, reach=2.0)])

    @grid_model.init
    def init(ic):
        ic.add("a", uid=ic.uids("a", 3), cell=torch.arange(3))
        return asim.Grid((3, 3))

    with pytest.raises(ConfigError, match=r"substep 'bad': reach 2.0 is a 'length' reach, which a Grid space does "
                                          r"not have \(valid: global, cell, moore\)"):
        Simulation(grid_model, agents=3)
    assert Simulation(model, agents=10).space.reaches == ("length",)


def test_rank_in_group_against_loop():
    g = torch.randint(0, 7, (500,), generator=torch.Generator().manual_seed(1))
    k = torch.randperm(500, generator=torch.Generator().manual_seed(2))
    r = rank_in_group(g, k)
    for i in range(500):
        same = (g == g[i])
        assert r[i] == int((k[same] < k[i]).sum())
