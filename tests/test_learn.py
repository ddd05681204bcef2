"""The learning layer: PPO on the distributed state gives the same training on any number of ranks.

- parameters after 3 updates at W = 2 and 4 equal W = 1 within 1e-6 relative (data partitioner,
  and the spatial one with agents that migrate mid-episode);
- an uneven 3:7 split of a minibatch gives the W = 1 loss and gradient to 1e-12 (float64);
- a migrating agent's trajectory (gathered by uid) equals the one-process trajectory, bit for bit;
- resuming from a checkpoint gives the parameters of an uninterrupted run;
- the bf16, fp16 and PowerSGD hooks run on gloo; bad configurations get clear messages.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from agentsim.models.spillover import MODEL as SPILLOVER

import agentsim as asim
from agentsim import ConfigError
from agentsim.core.comm import LocalComm
from agentsim.learn import PPOConfig, Trainer
from agentsim.learn import trainer as trainer_mod
from agentsim.learn.ppo import ppo_loss
from agentsim.runner.launch import run_ranks

SMALL = PPOConfig(horizon=8, hidden=(16,), minibatches=2, epochs=2)
UPDATES = 3


def wanderers() -> asim.Model:
    """Walkers in a periodic 20 x 4 box that choose each step to go left or right (1.5 units),
    rewarded for being near x = 5: they cross the strip borders at x = 0 and 10 all the time."""
    model = asim.Model("wanderers")

    @model.policy("walker", action="go", observations=3, actions=2, reads=["walker.pos"])
    def look(ctx: asim.Context) -> torch.Tensor:
        pos = ctx["walker"]["pos"]
        return torch.stack([pos[:, 0] / 20, pos[:, 1] / 4, torch.full_like(pos[:, 0], ctx.step / 10)], -1)

    @model.substep(reads=["walker.go"], writes=["walker.pos"])
    def walk(ctx: asim.Context) -> None:
        w = ctx["walker"]
        dx = (w["go"].to(torch.float32) * 2 - 1) * 1.5
        w["pos"] = ctx.space.wrap(w["pos"] + torch.stack([dx, torch.zeros_like(dx)], -1))

    @model.reward("walker")
    def near_five(state: asim.MetricsContext) -> torch.Tensor:
        x = state["walker"]["pos"][:, 0]
        return -torch.minimum((x - 5).abs(), 20 - (x - 5).abs()) / 10

    @model.init
    def init(ic: asim.InitContext) -> asim.Box:
        uid = ic.uids("walker", ic.n_agents)
        pos = ic.rng.uniform(uid, "pos", draws=2, dtype=torch.float32) * torch.tensor([20.0, 4.0])
        ic.add("walker", uid=uid, pos=pos, go=torch.zeros(ic.n_agents, dtype=torch.int64))
        return asim.Box((20.0, 4.0))

    return model


WANDERERS = wanderers()
RUNS = {"spillover-data": (SPILLOVER, 400, None, {}, "exact"),
        "wanderers-spatial": (WANDERERS, 300, "spatial", {"layout": "strips"}, "exact"),
        "spillover-data-ddp": (SPILLOVER, 400, None, {}, "ddp")}


def flat(net: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1).to(torch.float64) for p in net.parameters()])


def train(comm, key: str) -> tuple[torch.Tensor, list[dict[str, float]]]:
    model, agents, partition, options, sync = RUNS[key]
    trainer = Trainer(model, agents=agents, seed=5, updates=UPDATES, config=dataclasses.replace(SMALL, sync=sync),
                      comm=comm, partition=partition, **options)
    history = trainer.train().history
    return flat(trainer.net), [{k: v for k, v in row.items() if k in FIGURES} for row in history]


FIGURES = ("mean_return", "policy_loss", "value_loss", "entropy", "approx_kl", "clip_fraction", "samples")


def train_all(comm) -> dict | None:
    """Every run on this job's ranks (a job per world size: each trainer builds DDP's own process
    group over its ranks, which sub-groups of one job would number differently on each rank)."""
    got = {key: train(comm, key) for key in RUNS}
    return got if comm.rank == 0 else None


@pytest.mark.long
@pytest.mark.timeout(300)
def test_training_gives_the_same_parameters_on_1_2_and_4_ranks():
    """Exact gradient sums: the same bits (parameters and every logged figure); DDP: 1e-6 relative."""
    one = {key: train(LocalComm(), key) for key in RUNS}
    many = {w: run_ranks(train_all, w, timeout=120.0)[0] for w in (2, 4)}
    for w, got in many.items():
        for key, (params, rows) in got.items():
            ref_params, ref_rows = one[key]
            if RUNS[key][-1] == "exact":
                assert torch.equal(params, ref_params), (key, w)
                assert rows == ref_rows, (key, w)
            else:
                rel = float((params - ref_params).norm() / ref_params.norm())
                assert 0 < rel <= 1e-6, (key, w, rel)  # rounding of the float all-reduce, within the bound
                returns = [r["mean_return"] for r in rows]
                assert returns == pytest.approx([r["mean_return"] for r in ref_rows], rel=1e-6, abs=1e-9)
    assert not torch.equal(one["spillover-data"][0], flat(Trainer(SPILLOVER, agents=400, seed=5, config=SMALL).net))


def uneven_gradient(comm, sync: str) -> tuple[torch.Tensor, float]:
    config = PPOConfig(dtype=torch.float64, hidden=(8,), sync=sync)
    trainer = Trainer(SPILLOVER, agents=100, seed=2, config=config, comm=comm)
    batch = _batch(10)
    mine = slice(0, 3) if comm.rank == 0 else slice(3, 10)  # 3:7
    local = {k: v[mine] for k, v in batch.items()} if comm.world_size > 1 else batch
    trainer.gradient(local, 10)
    grad = torch.cat([p.grad.reshape(-1) for p in trainer.net.parameters()])
    loss, _ = ppo_loss(trainer.net, trainer.net, {k: v for k, v in local.items() if k != "uid"}, config)
    total = comm.all_gather_rows({"v": loss.detach().reshape(1, 1)}, rows_per_rank=1)["v"].sum() \
        if comm.world_size > 1 else loss.detach()
    return grad, float(total) / 10


def _batch(n: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    f64 = torch.float64
    return {"obs": torch.rand(n, 5, generator=g, dtype=f64), "action": torch.randint(0, 2, (n,), generator=g),
            "logp": -torch.rand(n, generator=g, dtype=f64), "value": torch.randn(n, generator=g, dtype=f64),
            "adv": torch.randn(n, generator=g, dtype=f64), "ret": torch.randn(n, generator=g, dtype=f64),
            "uid": torch.arange(n)}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("sync", ["exact", "ddp"])
def test_an_uneven_split_gives_the_one_process_loss_and_gradient(sync):
    ref_grad, ref_loss = uneven_gradient(LocalComm(), sync)
    for grad, loss in run_ranks(uneven_gradient, 2, (sync,), timeout=60.0):
        assert float((grad - ref_grad).abs().max() / ref_grad.abs().max()) <= 1e-12
        assert loss == pytest.approx(ref_loss, rel=1e-12)


def rollout_of(comm, partition: str | None) -> dict | None:
    trainer = Trainer(WANDERERS, agents=300, seed=7, updates=1, config=SMALL, comm=comm, partition=partition,
                      **({"layout": "strips"} if partition == "spatial" else {}))
    rollout, _, _ = trainer.collect(1)
    fields = {k: getattr(rollout, k) for k in ("uid", "step", "obs", "action", "logp", "value", "reward", "done")}
    got = comm.gather_rows(fields)
    if got is None:
        return None
    key = got["uid"] * 100 + got["step"]
    order = torch.argsort(key)
    return {k: v[order] for k, v in got.items()}


@pytest.mark.timeout(60)
def test_a_migrating_agent_keeps_its_whole_trajectory():
    ref = rollout_of(LocalComm(), None)
    got = run_ranks(rollout_of, 2, ("spatial",), timeout=60.0)[0]
    for k in ref:
        assert torch.equal(ref[k], got[k]), k
    x = ref["obs"][:, 0] * 20  # agents crossed the border at x = 10 during the episode
    sides = [(x[ref["uid"] == u] < 10) for u in ref["uid"].unique().tolist()]
    crossed = [s for s in sides if s.any() and not s.all()]
    assert len(crossed) > 20
    assert int(ref["done"].sum()) == 300 and ref["uid"].numel() == 300 * SMALL.horizon


def test_resume_gives_the_parameters_of_an_uninterrupted_run(tmp_path):
    whole = Trainer(SPILLOVER, agents=200, seed=9, updates=4, config=SMALL)
    whole.train()
    first = Trainer(SPILLOVER, agents=200, seed=9, updates=4, config=SMALL)
    first.train(updates=2, checkpoint_dir=tmp_path / "ckpt", out=tmp_path / "first.h5")  # then "interrupted"
    second = Trainer(SPILLOVER, agents=200, seed=9, updates=4, config=SMALL)
    result = second.train(checkpoint_dir=tmp_path / "ckpt", resume=True, out=tmp_path / "train.h5")
    assert second.update_index == 4 and torch.equal(flat(second.net), flat(whole.net))
    assert [r["mean_return"] for r in result.history] == [r["mean_return"] for r in whole.history]
    log = asim.io.hdf5.read_trajectory(tmp_path / "train.h5")
    assert log.metrics["step"].tolist() == [1, 2, 3, 4] and log.attrs["completed"]
    assert sorted(p.name for p in (tmp_path / "ckpt").glob("ppo-*.pt")) == ["ppo-000002.pt", "ppo-000003.pt",
                                                                           "ppo-000004.pt"]
    other = Trainer(SPILLOVER, agents=200, seed=10, updates=4, config=SMALL)
    with pytest.raises(ConfigError, match=r"checkpoint is from another training \(differs in seed: 9 there, 10 here\)"):
        other.train(checkpoint_dir=tmp_path / "ckpt", resume=True)


def compressed(comm) -> dict | None:
    out = {}
    for compress in ("none", "bf16", "fp16", "powersgd"):
        config = PPOConfig(horizon=6, hidden=(16,), compress=compress, replica_check_every=1)
        trainer = Trainer(SPILLOVER, agents=300, seed=4, updates=3, config=config, comm=comm)
        history = trainer.train().history  # checks every update that the ranks hold the same parameters
        out[compress] = (flat(trainer.net), history[-1]["compression"], history[-1]["allreduce_seconds"])
    return out if comm.rank == 0 else None


@pytest.mark.long
@pytest.mark.timeout(120)
def test_compression_hooks_run_on_gloo_and_keep_the_replicas_equal():
    got = run_ranks(compressed, 2, timeout=100.0)[0]
    plain = got["none"][0]
    for compress, (params, _, seconds) in got.items():
        assert torch.isfinite(params).all() and seconds > 0, compress
        rel = float((params - plain).norm() / plain.norm())
        assert (rel == 0) == (compress == "none") and rel < 0.05, (compress, rel)
    assert got["bf16"][1] == got["fp16"][1] == 0.5 and got["none"][1] == 1.0 and got["powersgd"][1] < 0.5


def test_bad_configurations_get_clear_messages(monkeypatch):
    with pytest.raises(ConfigError, match="model 'sir' declares no policy"):
        Trainer(asim.get_model("sir"), agents=10)
    with pytest.raises(ConfigError, match=r"model 'spillover' has no policy 'hide' \(policies: protect\)"):
        Trainer(SPILLOVER, policy="hide", agents=10)
    with pytest.raises(ConfigError, match="compress: expected one of none, fp16, bf16, powersgd"):
        Trainer(SPILLOVER, agents=10, config=PPOConfig(compress="zip"))
    with pytest.raises(ConfigError, match=r"precision: expected one of fp32, bf16 \(got 'fp8'\)"):
        PPOConfig(precision="fp8")
    with pytest.raises(ConfigError, match=r"gamma: expected a number in \[0, 1\]"):
        PPOConfig(gamma=1.5)
    monkeypatch.setattr(trainer_mod, "bf16_supported", lambda device: (False, "CPU flags without avx512_bf16"))
    with pytest.raises(ConfigError, match="precision bf16: this machine has no native bf16 .* use --precision fp32"):
        Trainer(SPILLOVER, agents=10, config=PPOConfig(precision="bf16"))
    monkeypatch.setattr(trainer_mod, "bf16_supported", lambda device: (True, "forced"))
    bf16 = Trainer(SPILLOVER, agents=60, updates=1, config=PPOConfig(precision="bf16", horizon=3, hidden=(8,)))
    assert math.isfinite(bf16.train().history[-1]["policy_loss"])  # autocast runs (emulated on this CPU)
    with pytest.raises(ConfigError, match="resume needs a checkpoint directory"):
        Trainer(SPILLOVER, agents=10).train(resume=True)

    no_reward = asim.Model("lonely")
    no_reward.policy("a", action="act", observations=1, actions=2)(lambda ctx: torch.zeros(ctx["a"].n, 1))
    with pytest.raises(ConfigError, match=r"has no reward for 'a': declare one with @model.reward\('a'\)"):
        Trainer(no_reward, agents=5)
    with pytest.raises(ConfigError, match="expected observations >= 1 and either actions=K >= 2"):
        no_reward.policy("a", action="act", observations=2, actions=1)


def test_observation_and_action_fields_are_checked():
    model = wanderers().configure()
    model.init(lambda ic: (ic.add("walker", uid=ic.uids("walker", 4), pos=torch.zeros(4, 2),
                                  go=torch.zeros(4, dtype=torch.int32)), asim.Box((20.0, 4.0)))[1])
    with pytest.raises(ConfigError, match=r"policy 'look': the action field 'walker.go' must be torch.int64 with "
                                          r"per-agent shape \[\] \(got torch.int32 \[\]\)"):
        asim.Simulation(model, agents=4)
    bad = asim.Model("bad")
    bad.policy("a", action="act", observations=3, actions=2)(lambda ctx: torch.zeros(ctx["a"].n, 2))

    @bad.init
    def init(ic):
        ic.add("a", uid=ic.uids("a", 5), act=torch.zeros(5, dtype=torch.int64))

    with pytest.raises(ConfigError, match=r"policy '<lambda>': observe must return \[5, 3\] \(got \[5, 2\]\)"):
        asim.Simulation(bad, agents=5).step()
    with pytest.raises(ConfigError, match=r"policies: the model has no policy 'b' \(policies: <lambda>\)"):
        asim.Simulation(bad, agents=5, policies={"b": "random"})
    sneaky = asim.Model("sneaky")  # an observation that reads a field it did not declare
    sneaky.policy("a", action="act", observations=1, actions=2, reads=[])(lambda ctx: ctx["a"]["x"].unsqueeze(1))
    sneaky.init(lambda ic: ic.add("a", uid=ic.uids("a", 5), x=torch.zeros(5), act=torch.zeros(5, dtype=torch.int64)))
    with pytest.raises(asim.FieldAccessError, match=r"reads 'a.x' but does not declare it .* add 'a.x' to reads="):
        asim.Simulation(sneaky, agents=5).step()


def test_rule_and_random_actors_and_same_actions_for_any_row_order():
    from agentsim.models.spillover import protect_if_exposed

    from agentsim.core.policy import NetworkActor, PolicyNet

    rule = asim.Simulation(SPILLOVER, agents=200, seed=1, policies={"protect": protect_if_exposed}).run(10)
    assert rule.metrics["protecting"].max() > 0
    net = PolicyNet(5, actions=2, hidden=(8,))
    a = asim.Simulation(SPILLOVER, agents=200, seed=1, policies={"protect": NetworkActor(net)})
    b = asim.Simulation(SPILLOVER, agents=200, seed=1, policies={"protect": NetworkActor(net)}, shuffle_rows=True)
    ra, rb = a.run(6), b.run(6)
    for k in ra.metrics:
        assert (ra.metrics[k] == rb.metrics[k]).all(), k


def test_training_bits_do_not_depend_on_the_thread_count():
    """torch's CPU kernels split some reductions by thread count (orthogonal init's QR, a 64 -> 1
    linear layer): the network runs on one thread, so 1 and 3 threads train the same bits."""
    config = PPOConfig(horizon=6, hidden=(64, 64), minibatches=2, epochs=1)
    threads = torch.get_num_threads()
    got = []
    try:
        for n in (1, 3):
            torch.set_num_threads(n)
            trainer = Trainer(SPILLOVER, agents=600, seed=3, updates=2, config=config)
            trainer.train()
            got.append(flat(trainer.net))
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(got[0], got[1])


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_training_on_cuda_learns_like_on_cpu():
    config = PPOConfig(horizon=8, hidden=(16,), minibatches=2, epochs=2)
    rows = {}
    for device in ("cpu", "cuda"):
        trainer = Trainer(SPILLOVER, agents=400, seed=5, updates=3, config=config, device=device)
        rows[device] = trainer.train().history
        assert next(trainer.net.parameters()).device.type == device
    # the same initial network: the first episode differs only where float bits flip a sampled action
    assert rows["cuda"][0]["mean_return"] == pytest.approx(rows["cpu"][0]["mean_return"], rel=0.05)
    for row in rows["cuda"]:
        assert all(math.isfinite(v) for v in row.values())
