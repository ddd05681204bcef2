"""State, substep registry, parameters and the engine's declaration checks."""

import pytest
import torch

from agentsim import (ConfigError, FieldAccessError, FieldSpec, Model, Param, ParamSpec, Population,
                      Registry, Simulation, SimulationError, State)
from agentsim.grouping import rank_in_group


def make_model(substeps=("grow", "breed", "cull"), **extra_steps):
    """A small model with births and deaths: cells grow, split and die."""
    reg = Registry()

    @reg.substep(reads=["cell.size"], writes=["cell.size"])
    def grow(ctx):
        c = ctx["cell"]
        c["size"] = c["size"] + ctx.rng.uniform(c["uid"], "grow", dtype=torch.float32)

    @reg.substep(reads=["cell.size"], writes=["cell.size"], births=["cell"])
    def breed(ctx):
        c = ctx["cell"]
        big = c["size"] > ctx.params["split_at"]
        size = torch.where(big, c["size"] / 2, c["size"])
        c["size"] = size
        ctx.spawn("cell", c["uid"][big], {"size": size[big]})

    @reg.substep(reads=["cell.size"], deaths=["cell"])
    def cull(ctx):
        c = ctx["cell"]
        ctx.kill("cell", ctx.rng.uniform(c["uid"], "cull") < ctx.params["death"])

    for name, fn in extra_steps.items():
        fn(reg)

    def init(ic):
        uid = torch.arange(ic.n_agents)
        size = ic.rng.uniform(uid, 0, "size", dtype=torch.float32)
        return State({"cell": Population("cell", {"size": FieldSpec(torch.float32)},
                                         {"uid": uid, "size": size})}), None

    params = ParamSpec({"split_at": Param(1.5, float, "size at which a cell splits"),
                        "death": Param(0.1, float, "daily death probability",
                                       check=lambda v: 0 <= v <= 1, expect="in [0, 1]")})
    metrics = lambda mc: {"total_size_x1e6": (mc.state["cell"]["size"].double() * 1e6).round().long().sum()}
    return Model("cells", reg, list(substeps), params, init, metrics)


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
    ipop = Population("q", {"k": FieldSpec(torch.int32)}, {"uid": torch.arange(2), "k": torch.zeros(2, dtype=torch.int32)})
    with pytest.raises(FieldAccessError, match="expected dtype torch.int32"):
        ipop["k"] = torch.tensor([0.5, 1.5])


def test_undeclared_write_is_an_error():
    def bad(reg):
        @reg.substep(reads=["cell.size"])
        def sneaky(ctx):
            ctx["cell"]["size"] = ctx["cell"]["size"] * 2

    sim = Simulation(make_model(["sneaky"], bad=bad), agents=10)
    with pytest.raises(FieldAccessError, match="writes 'cell.size' but does not declare it"):
        sim.step()


def test_undeclared_read_is_an_error():
    def bad(reg):
        @reg.substep(writes=["cell.size"])
        def peek(ctx):
            ctx["cell"]["size"] = torch.zeros(ctx["cell"].n) + ctx["cell"]["size"]

    reg_model = make_model(["peek"], bad=bad)
    # writes imply reads: peek may read what it writes. An undeclared population is an error:
    def worse(reg):
        @reg.substep(reads=["cell.size"])
        def other(ctx):
            ctx["cell"]["uid"]
            ctx["dog"]

    Simulation(reg_model, agents=5).step()
    with pytest.raises(ConfigError, match="unknown population 'dog'"):
        Simulation(make_model(["other"], worse=worse), agents=5).step()


def test_in_place_modification_of_read_only_field_is_detected():
    def bad(reg):
        @reg.substep(reads=["cell.size"])
        def mutate(ctx):
            ctx["cell"]["size"].mul_(2)

    with pytest.raises(FieldAccessError, match="modified 'cell.size' in place"):
        Simulation(make_model(["mutate"], bad=bad), agents=5).step()


def test_undeclared_births_and_deaths():
    def bad(reg):
        @reg.substep(reads=["cell.size"])
        def kill_all(ctx):
            ctx.kill("cell", torch.ones(ctx["cell"].n, dtype=torch.bool))

    with pytest.raises(FieldAccessError, match="declares deaths=\\[\\]"):
        Simulation(make_model(["kill_all"], bad=bad), agents=5).step()


def test_declared_field_must_exist_at_run_start():
    def bad(reg):
        @reg.substep(reads=["cell.mass"])
        def weigh(ctx):
            pass

    with pytest.raises(ConfigError, match="declares 'cell.mass'.*fields"):
        Simulation(make_model(["weigh"], bad=bad), agents=5)


def test_error_flags_raise_once_per_step():
    def bad(reg):
        @reg.substep(reads=["cell.size"], writes=["cell.size"])
        def poison(ctx):
            c = ctx["cell"]
            c["size"] = c["size"] / 0.0 * 0.0  # NaN
            ctx.flag("size exploded", c["size"].isnan())

    with pytest.raises(SimulationError, match="step 1: poison: size exploded; poison: NaN in cell.size"):
        Simulation(make_model(["poison"], bad=bad), agents=5).step()


def test_registry_is_per_model_and_checks_names():
    a, b = Registry(), Registry()
    for reg in (a, b):
        @reg.substep(reads=["x.y"])
        def move(ctx):
            pass
    assert "move" in a and "move" in b
    with pytest.raises(ConfigError, match="already registered"):
        @a.substep()
        def move(ctx):  # noqa: F811
            pass
    with pytest.raises(ConfigError, match="unknown substep 'mvoe'.*Perhaps you meant 'move'"):
        a["mvoe"]
    with pytest.raises(ConfigError, match="expected a field reference"):
        a.substep(reads=["nodot"])(lambda ctx: None)


def test_params_validation_messages():
    m = make_model()
    with pytest.raises(ConfigError, match="unknown parameter 'deth'.*valid: split_at, death.*Perhaps you meant 'death'"):
        m.configure(params={"deth": 0.2})
    with pytest.raises(ConfigError, match="parameter 'death': expected a float"):
        m.configure(params={"death": "often"})
    with pytest.raises(ConfigError, match=r"parameter 'death': expected in \[0, 1\]"):
        m.configure(params={"death": 2.0})
    assert m.configure(params={"death": "0.5"}).params["death"] == 0.5
    spec = ParamSpec({"n": Param(type=int, doc="required count")})
    with pytest.raises(ConfigError, match="missing required parameter 'n'"):
        spec.resolve({})
    with pytest.raises(ConfigError, match="expected an int"):
        spec.resolve({"n": "1.5"})


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
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="CUDA is not available"):
            Simulation(m, agents=5, device="cuda")


def test_rank_in_group_against_loop():
    g = torch.randint(0, 7, (500,), generator=torch.Generator().manual_seed(1))
    k = torch.randperm(500, generator=torch.Generator().manual_seed(2))
    r = rank_in_group(g, k)
    for i in range(500):
        same = (g == g[i])
        assert r[i] == int((k[same] < k[i]).sum())
