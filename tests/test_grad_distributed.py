"""Differentiable runs across ranks: gradients through the halos, migrations, births and deaths
of both partitioners equal the one-process gradients, which equal finite differences.

The model here is a float64 swarm in a periodic box: each agent steers toward the mean
displacement of its neighbors within ``vision`` (a halo), drifts (so agents cross region
borders and migrate), and a fixed pattern of agents is born and dies every step.
"""

from __future__ import annotations

import pytest
import torch

import agentsim as asim
from agentsim import Box, Context, InitContext, Model, Param, radius_pairs
from agentsim.core.comm import LocalComm
from agentsim.grad.autograd import sum_over_ranks
from agentsim.runner.launch import run_ranks

swarm = Model("swarm", params={
    "pull": Param(0.2, "weight of the neighbors' mean displacement", ge=0),
    "drift": Param(0.7, "drift per step along x and y (length units)"),
    "vision": Param(2.0, "neighbor radius (length units)", gt=0),
    "side": Param(12.0, "box side (length units)", gt=0),
}, description="a differentiable swarm with births and deaths", default_agents=200)


@swarm.substep(reads=["a.pos"], writes=["a.vel"], neighbors={"a": ["pos", "vel"]}, reach="vision")
def steer(ctx: Context) -> None:
    """Damp the velocity; add the neighbors' mean displacement and a tenth of their mean velocity."""
    a, nb = ctx["a"], ctx.neighbors("a")
    i, j = radius_pairs(nb["pos"], ctx.space, ctx.params["vision"], uid=nb["uid"], n_query=nb.n_local)
    d = ctx.space.displacement(nb["pos"][i], nb["pos"][j])
    count = torch.bincount(i, minlength=a.n).clamp(min=1).to(d.dtype)[:, None]
    mean_d = torch.zeros(a.n, 2, dtype=d.dtype).index_add(0, i, d) / count
    mean_v = torch.zeros(a.n, 2, dtype=d.dtype).index_add(0, i, nb["vel"][j]) / count
    a["vel"] = 0.5 * a["vel"] + ctx.params["pull"] * mean_d + 0.1 * mean_v


@swarm.substep(reads=["a.vel"], writes=["a.pos"])
def move(ctx: Context) -> None:
    """Move by the velocity plus the drift; wrap."""
    a = ctx["a"]
    a["pos"] = ctx.space.wrap(a["pos"] + a["vel"] + ctx.params["drift"])


@swarm.substep(reads=["a.pos", "a.vel"], births=["a"], deaths=["a"])
def turnover(ctx: Context) -> None:
    """Some agents (by uid and step) split off a child nearby; others die."""
    a = ctx["a"]
    uid, step = a["uid"], ctx.step
    born = (uid * 7 + step) % 23 == 0
    ctx.spawn("a", uid[born], {"pos": ctx.space.wrap(a["pos"][born] + 0.25), "vel": 0.5 * a["vel"][born]})
    ctx.kill("a", (uid * 5 + step) % 29 == 0)


@swarm.init
def init(ic: InitContext) -> Box:
    """Uniform positions, Gaussian velocities."""
    side = float(ic.params["side"])
    box = Box((side, side), periodic=True)
    uid = ic.uids("a", ic.n_agents)
    pos = ic.rng.uniform(uid, "pos", draws=2, dtype=torch.float64) * side
    vel = ic.rng.normal(uid, "vel", draws=2, dtype=torch.float64) * 0.3
    ic.add("a", uid=uid, pos=box.wrap(pos), vel=vel)
    return box


BASE = {"pull": 0.2, "drift": 0.7}


def swarm_loss(comm, values, grad: bool, partition=None, steps: int = 14, **options):
    """A smooth loss of the positions and velocities after every step, summed over steps."""
    sim = asim.Simulation(swarm, agents=200, seed=3, params=values, comm=comm, partition=partition,
                          grad=list(BASE) if grad else False, **options)
    loss = torch.zeros((), dtype=torch.float64)
    for _ in range(steps):
        sim.step()
        a = sim.state["a"]
        local = (torch.sin(a["pos"][:, 0] / 2) + torch.cos(a["pos"][:, 1] / 3) + a["vel"][:, 0] ** 2).sum()
        loss = loss + sum_over_ranks(local.reshape(1), comm)[0]
    return loss, sim


def swarm_gradients(comm, partition, options):
    """(d loss / d(pull, drift), agents migrated, halo rows received) of one run."""
    loss, sim = swarm_loss(comm, BASE, True, partition, **options)
    grads = sim.parameter_gradients(loss)
    moved = sum(p["migrated"] for p in sim.perf_steps)
    halo = sum(p["halo/rows"] for p in sim.perf_steps)
    return torch.stack([grads["pull"], grads["drift"]]), moved, halo


def test_the_swarm_gradients_equal_finite_differences():
    loss, sim = swarm_loss(LocalComm(), BASE, True)
    grads = sim.parameter_gradients(loss)
    births = sim.state["a"].next_uid - 200
    assert births > 0 and sim.state["a"].n != 200  # agents were born and died
    for name in BASE:
        eps = 1e-6
        hi = float(swarm_loss(LocalComm(), {**BASE, name: BASE[name] + eps}, False)[0])
        lo = float(swarm_loss(LocalComm(), {**BASE, name: BASE[name] - eps}, False)[0])
        fd = (hi - lo) / (2 * eps)
        assert float(grads[name]) == pytest.approx(fd, rel=1e-6), name


@pytest.mark.timeout(300)
@pytest.mark.parametrize("world_size, partition, options", [
    (4, "data", {}),
    (2, "spatial", {"layout": "strips"}),
    (4, "spatial", {"layout": "blocks", "balance_every": 3, "balance_threshold": 1.01}),
    (3, "spatial", {"layout": "rcb"}),
], ids=["data-4", "spatial-strips-2", "spatial-blocks-balance-4", "spatial-rcb-3"])
def test_gradients_through_halos_and_migration_equal_one_process(world_size, partition, options):
    one, _, _ = swarm_gradients(LocalComm(), None, {})
    assert (one.abs() > 1).all()
    for grads, moved, halo in run_ranks(swarm_gradients, world_size, (partition, options), timeout=240.0):
        assert halo > 0 and (moved > 0 or partition == "data")  # exchanges happened
        assert ((grads - one).abs() <= 1e-6 * one.abs()).all(), (grads, one)


def boids_gradients(comm, partition):
    """d loss / d(cohere, match, speed) through 6 steps of float32 boids (chunked pair search)."""
    sim = asim.Simulation(asim.get_model("boids"), agents=400, seed=0, grad=["cohere", "match", "speed"],
                          comm=comm, partition=partition, sort_every=2)
    loss = torch.zeros((), dtype=torch.float64)
    for _ in range(6):
        sim.step()
        local = torch.sin(sim.state["boid"]["pos"].double() / 5).sum()
        loss = loss + sum_over_ranks(local.reshape(1), comm)[0]
    return torch.stack(list(sim.parameter_gradients(loss).values()))


@pytest.mark.timeout(200)
def test_float32_boids_gradients_on_two_ranks_match_one_process():
    one = boids_gradients(LocalComm(), None)
    assert (one.abs() > 1).all()
    for grads in run_ranks(boids_gradients, 2, ("spatial",), timeout=150.0):
        # float32 state: the backward pass adds the same terms in another order (measured 6e-7)
        assert ((grads - one).abs() <= 1e-5 * one.abs()).all(), (grads, one)


def observe_swarm(sim) -> torch.Tensor:
    """Two smooth sums over the agents, summed over ranks."""
    a = sim.state["a"]
    local = torch.stack([torch.sin(a["pos"][:, 0] / 2).sum(),
                         (torch.cos(a["pos"][:, 1] / 3) + a["vel"][:, 0] ** 2).sum()])
    return sum_over_ranks(local, sim.comm)


def squared_error(y: torch.Tensor) -> torch.Tensor:
    return ((y - 3.0) ** 2).sum()


def whole_graph_gradients(comm) -> tuple[float, torch.Tensor]:
    sim = asim.Simulation(swarm, agents=200, seed=3, params=BASE, comm=comm, grad=list(BASE))
    ys = []
    for _ in range(14):
        sim.step()
        ys.append(observe_swarm(sim))
    loss = squared_error(torch.stack(ys))
    grads = sim.parameter_gradients(loss)
    return float(loss.detach()), torch.stack([grads["pull"], grads["drift"]])


def checkpointed_gradients(comm, partition, options, every):
    sim = asim.Simulation(swarm, agents=200, seed=3, params=BASE, comm=comm, partition=partition,
                          grad=list(BASE), **options)
    loss, grads = sim.rollout_gradients(14, observe_swarm, squared_error, checkpoint_every=every)
    history = any(t.requires_grad for t in sim.state["a"].fields().values())
    return float(loss), torch.stack([grads["pull"], grads["drift"]]), sim.state.step, len(sim.perf_steps), history


@pytest.mark.long
@pytest.mark.timeout(300)
def test_checkpointed_rollout_gradients_equal_the_whole_graph_on_any_ranks():
    loss, whole = whole_graph_gradients(LocalComm())
    assert (whole.abs() > 1).all()
    for every in (None, 1, 4):
        got_loss, grads, step, figures, history = checkpointed_gradients(LocalComm(), None, {}, every)
        assert got_loss == loss and step == 14 and figures == 14 and not history
        assert ((grads - whole).abs() <= 1e-12 * whole.abs()).all(), (every, grads, whole)
    for world_size, partition, options in [(2, "data", {}), (4, "spatial", {"layout": "blocks"})]:
        for got_loss, grads, step, figures, history in run_ranks(checkpointed_gradients, world_size,
                                                                 (partition, options, 3), timeout=240.0):
            assert got_loss == pytest.approx(loss, rel=1e-12) and step == 14 and figures == 14 and not history
            assert ((grads - whole).abs() <= 1e-6 * whole.abs()).all(), (partition, grads, whole)


def test_checkpointed_rollouts_refuse_what_they_cannot_replay():
    plain = asim.Simulation(swarm, agents=50, seed=0)
    with pytest.raises(asim.ConfigError, match="not differentiable"):
        plain.rollout_gradients(3, observe_swarm, squared_error)
    sim = asim.Simulation(swarm, agents=50, seed=0, grad=["pull"])
    with pytest.raises(asim.ConfigError, match="checkpoint_every: expected an int >= 1"):
        sim.rollout_gradients(3, observe_swarm, squared_error, checkpoint_every=0)
    with pytest.raises(asim.ConfigError, match="steps: expected an int >= 1"):
        sim.rollout_gradients(0, observe_swarm, squared_error)
    shuffled = asim.Simulation(swarm, agents=50, seed=0, grad=["pull"], shuffle_rows=True)
    with pytest.raises(asim.ConfigError, match="shuffle_rows"):
        shuffled.rollout_gradients(3, observe_swarm, squared_error)
