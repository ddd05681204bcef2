"""The learning layer's kernels against brute-force references: sampling against
torch.distributions, GAE against a per-agent loop, the PPO loss against CleanRL's formulas written
out, the exact gradient sum against a plain float64 sum; and a continuous-action (Gaussian)
model that trains, the same bits on 1 and 2 ranks."""

from __future__ import annotations

import math

import pytest
import torch

import agentsim as asim
from agentsim.core.comm import LocalComm
from agentsim.core.policy import PolicyNet, sample
from agentsim.core.random import CounterRNG
from agentsim.learn import PPOConfig, Trainer
from agentsim.learn.hooks import GradientSync, chunk_bounds
from agentsim.learn.ppo import ppo_loss
from agentsim.learn.rollout import Rollout, gae
from agentsim.runner.launch import run_ranks


def test_discrete_sampling_follows_the_softmax_and_reports_its_log_probability():
    logits = torch.tensor([[0.0, 1.0, -1.0, 2.0]]).expand(200_000, 4)
    uid = torch.arange(200_000)
    action, logp = sample(logits, None, uid, CounterRNG(3).at(1, "act"))
    probs = torch.softmax(logits[0].double(), -1)
    freq = torch.bincount(action, minlength=4).double() / 200_000
    se = (probs * (1 - probs) / 200_000).sqrt()
    assert ((freq - probs).abs() <= 4 * se).all(), (freq, probs)
    ref = torch.distributions.Categorical(logits=logits.double()).log_prob(action)
    assert torch.allclose(logp.double(), ref, atol=1e-6)


def test_gaussian_sampling_and_log_density_match_torch_distributions():
    n = 100_000
    mean = torch.tensor([[0.5, -1.0]]).expand(n, 2)
    log_std = torch.tensor([0.0, -1.0])
    action, logp = sample(mean, log_std, torch.arange(n), CounterRNG(4).at(2, "act"))
    dist = torch.distributions.Normal(mean, log_std.exp())
    assert torch.allclose(logp, dist.log_prob(action).sum(-1), atol=1e-5)
    z = (action - mean) / log_std.exp()
    assert z.mean(0).abs().max() < 0.02 and (z.std(0) - 1).abs().max() < 0.02


def test_gae_equals_a_loop_per_agent_with_trajectories_of_different_lengths():
    g = torch.Generator().manual_seed(0)
    lengths = {3: 5, 7: 2, 8: 5, 20: 1}  # uid -> samples (an agent that died early has fewer)
    uid = torch.cat([torch.full((k,), u) for u, k in lengths.items()])
    step = torch.cat([torch.arange(1, k + 1) for k in lengths.values()])
    m = uid.numel()
    value, reward = torch.randn(m, generator=g), torch.randn(m, generator=g)
    done = torch.zeros(m, dtype=torch.bool)
    done[torch.cumsum(torch.tensor(list(lengths.values())), 0) - 1] = True
    ro = Rollout(uid, step, torch.zeros(m, 1), torch.zeros(m, dtype=torch.int64), torch.zeros(m), value, reward, done)
    adv, ret = gae(ro, 0.9, 0.8)
    start = 0
    for k in lengths.values():
        a_next = 0.0
        for t in reversed(range(start, start + k)):
            v_next = float(value[t + 1]) if t + 1 < start + k else 0.0
            delta = float(reward[t]) + 0.9 * v_next - float(value[t])
            a_next = delta + 0.9 * 0.8 * a_next
            assert float(adv[t]) == pytest.approx(a_next, abs=1e-5)
            assert float(ret[t]) == pytest.approx(a_next + float(value[t]), abs=1e-5)
        start += k


@pytest.mark.parametrize("continuous", [False, True])
def test_ppo_loss_equals_cleanrl_formulas(continuous):
    torch.manual_seed(1)
    net = PolicyNet(3, actions=0 if continuous else 3, action_dim=2 if continuous else 0, hidden=(8,)).double()
    if continuous:
        net.log_std.data = torch.tensor([0.2, -0.3], dtype=torch.float64)
    n = 50
    obs = torch.randn(n, 3, dtype=torch.float64)
    action = torch.randn(n, 2, dtype=torch.float64) if continuous else torch.randint(0, 3, (n,))
    batch = {"obs": obs, "action": action, "logp": -torch.rand(n, dtype=torch.float64) * 2,
             "value": torch.randn(n, dtype=torch.float64), "adv": torch.randn(n, dtype=torch.float64),
             "ret": torch.randn(n, dtype=torch.float64)}
    config = PPOConfig(dtype=torch.float64)
    loss, figures = ppo_loss(net, net, batch, config)
    head, value = net(obs)
    if continuous:
        dist = torch.distributions.Normal(head, net.log_std.exp())
        new_logp, entropy = dist.log_prob(action).sum(-1), dist.entropy().sum(-1)
    else:
        dist = torch.distributions.Categorical(logits=head)
        new_logp, entropy = dist.log_prob(action), dist.entropy()
    ratio = (new_logp - batch["logp"]).exp()
    pg = torch.max(-batch["adv"] * ratio, -batch["adv"] * ratio.clamp(0.8, 1.2)).mean()
    v_unclipped = (value - batch["ret"]) ** 2
    v_clipped = (batch["value"] + (value - batch["value"]).clamp(-0.2, 0.2) - batch["ret"]) ** 2
    v_loss = 0.5 * torch.max(v_unclipped, v_clipped).mean()
    ref = pg - 0.01 * entropy.mean() + 0.5 * v_loss
    assert float(loss.detach()) / n == pytest.approx(float(ref.detach()), rel=1e-12)
    assert float(figures["entropy"]) / n == pytest.approx(float(entropy.mean().detach()), rel=1e-12)


def test_exact_gradient_sum_equals_the_float64_sum_and_ignores_grouping():
    g = torch.Generator().manual_seed(2)
    grads = torch.randn(37, 11, generator=g, dtype=torch.float64) * torch.logspace(-6, 3, 11, dtype=torch.float64)
    sync = GradientSync(torch.nn.Linear(1, 1), LocalComm(), sync="exact")
    total = sync.reduce_exact(grads, 100)
    assert torch.allclose(total, grads.sum(0), rtol=1e-10, atol=0)
    parts = sync.reduce_exact(grads[:20], 100) + sync.reduce_exact(grads[20:], 100)
    assert torch.allclose(parts, total, rtol=1e-10)
    assert torch.equal(sync.reduce_exact(grads[torch.randperm(37, generator=g)], 100), total)  # any order
    with pytest.raises(asim.SimulationError, match="not finite"):
        sync.reduce_exact(torch.tensor([[float("nan")]]), 1)


def test_chunks_follow_tiles_of_uids_and_the_cap():
    uid = torch.tensor([0, 0, 1, 255, 256, 256, 257, 600, 601, 602, 603])
    assert chunk_bounds(uid, 256, cap=3) == [(0, 3), (3, 4), (4, 7), (7, 10), (10, 11)]
    assert chunk_bounds(uid[:0], 256) == []


def add_walking(model: asim.Model) -> None:
    """The seekers' policy (a 2-D velocity seen from the offset to (5, 5)) and their move."""

    @model.policy("walker", action="velocity", observations=2, action_dim=2, reads=["walker.pos"])
    def look(ctx: asim.Context) -> torch.Tensor:
        return (ctx["walker"]["pos"] - 5.0) / 5.0

    @model.substep(reads=["walker.velocity"], writes=["walker.pos"])
    def move(ctx: asim.Context) -> None:
        w = ctx["walker"]
        w["pos"] = (w["pos"] + w["velocity"].clamp(-1.0, 1.0)).clamp(0.0, 10.0)


def seekers() -> asim.Model:
    """Walkers that choose a 2-D velocity (Gaussian policy) and are rewarded for nearness to (5, 5)."""
    model = asim.Model("seekers")
    add_walking(model)

    @model.reward("walker")
    def near(state: asim.MetricsContext) -> torch.Tensor:
        return -(state["walker"]["pos"] - 5.0).norm(dim=-1) / 5.0

    model.init(init_walkers)
    return model


def init_walkers(ic: asim.InitContext) -> asim.Box:
    uid = ic.uids("walker", ic.n_agents)
    ic.add("walker", uid=uid, pos=ic.rng.uniform(uid, "pos", draws=2, dtype=torch.float32) * 10.0,
           velocity=torch.zeros(ic.n_agents, 2))
    return asim.Box((10.0, 10.0))


SEEKERS = seekers()
CONTINUOUS = PPOConfig(horizon=10, hidden=(32,), minibatches=4, epochs=4, lr=3e-3)


def train_seekers(comm, updates: int) -> tuple[torch.Tensor, list[float]] | None:
    trainer = Trainer(SEEKERS, agents=500, seed=3, updates=updates, config=CONTINUOUS, comm=comm)
    history = trainer.train().history
    params = torch.cat([p.detach().reshape(-1) for p in trainer.net.parameters()])
    return (params, [r["mean_return"] for r in history]) if comm.rank == 0 else None


@pytest.mark.timeout(120)
def test_a_gaussian_policy_learns_and_trains_the_same_bits_on_two_ranks():
    _, returns = train_seekers(LocalComm(), 12)
    assert returns[-1] > 0.5 * returns[0], returns  # the cost of distance at least halved (measured: -7.9 -> -2.8)
    assert all(math.isfinite(r) for r in returns)
    one = train_seekers(LocalComm(), 3)
    two = run_ranks(train_seekers, 2, (3,), timeout=100.0)[0]
    assert one is not None and two is not None
    assert torch.equal(one[0], two[0]) and one[1] == two[1]



def arrive(state: asim.MetricsContext) -> tuple[torch.Tensor, torch.Tensor]:
    """+1 on reaching the centre (and the episode ends), -0.1 a step until then."""
    arrived = (state["walker"]["pos"] - 5.0).norm(dim=-1) < 1.0
    return torch.where(arrived, 1.0, -0.1), arrived


def episodic_seekers(reward=arrive) -> asim.Model:
    """Seekers whose episode ends on reaching the centre: the reward flags them done and the model's
    own substep puts them back at a random place on the next step."""
    model = asim.Model("episodic_seekers")

    @model.substep(reads=["walker.pos"], writes=["walker.pos"])
    def respawn(ctx: asim.Context) -> None:
        w = ctx["walker"]
        arrived = (w["pos"] - 5.0).norm(dim=-1) < 1.0
        fresh = ctx.rng.uniform(w["uid"], draws=2, dtype=torch.float32) * 10.0
        w["pos"] = torch.where(arrived.unsqueeze(1), fresh, w["pos"])

    add_walking(model)
    model.reward("walker")(reward)
    model.init(init_walkers)
    return model


EPISODIC = episodic_seekers()


def collect_episodic(comm) -> tuple[dict[str, torch.Tensor], torch.Tensor] | None:
    """The first update's rollout and advantages (on rank 0, sorted by uid and step) and the
    parameters after two updates."""
    trainer = Trainer(EPISODIC, agents=400, seed=5, updates=2, config=CONTINUOUS, comm=comm)
    rollout, _, _ = trainer.collect(1)
    adv, _ = gae(rollout, CONTINUOUS.gamma, CONTINUOUS.lam)
    trainer.train()
    params = torch.cat([p.detach().reshape(-1) for p in trainer.net.parameters()])
    mine = {"uid": rollout.uid, "step": rollout.step, "done": rollout.done, "reward": rollout.reward,
            "value": rollout.value, "adv": adv}
    got = comm.gather_rows(mine) if comm.world_size > 1 else mine
    if comm.rank != 0:
        return None
    order = torch.argsort(got["uid"] * 1000 + got["step"])
    return {k: v[order] for k, v in got.items()}, params


@pytest.mark.long
@pytest.mark.timeout(120)
def test_a_done_flag_cuts_the_trajectory_and_trains_the_same_bits_on_two_ranks():
    got, params = collect_episodic(LocalComm())
    arrived = got["reward"] == 1.0
    assert int(arrived.sum()) > 20  # episodes do end mid-run (and the agents go on acting)
    last = torch.ones_like(arrived)
    last[:-1] = got["uid"][1:] != got["uid"][:-1]
    assert torch.equal(got["done"], arrived | last)
    assert int((arrived & ~last).sum()) > 0
    # nothing is bootstrapped across a done: the advantage there is the reward minus the value
    assert torch.allclose(got["adv"][arrived], got["reward"][arrived] - got["value"][arrived], atol=1e-6)
    two = run_ranks(collect_episodic, 2, (), timeout=100.0)[0]
    assert two is not None
    assert all(torch.equal(got[k], two[0][k]) for k in got) and torch.equal(params, two[1])


@pytest.mark.parametrize(("wrong", "message"), [
    (lambda s: (torch.zeros(s["walker"].n), torch.zeros(s["walker"].n)), "done must be a bool tensor"),
    (lambda s: (torch.zeros(s["walker"].n), torch.zeros(3, dtype=torch.bool)), r"expected \[50\] done flags"),
    (lambda s: (torch.zeros(s["walker"].n),), r"a \(reward, done\) pair \(got a tuple of 1\)"),
    (lambda s: torch.zeros(2, 2), r"expected \[50\] real values \(got \[2, 2\]"),
])
def test_a_reward_function_with_a_bad_result_gets_a_clear_message(wrong, message):
    with pytest.raises(asim.ConfigError, match=message):
        asim.learn.evaluate(episodic_seekers(wrong), "random", agents=50, horizon=2)
