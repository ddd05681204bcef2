"""Training a model's policy with PPO, on one process or many, with the same result on any number of
ranks (to rounding: parameters after several updates agree within 1e-6 relative).

One update:

1. **Collect**: one episode of ``horizon`` steps of an ordinary :class:`~agentsim.engine.Simulation`
   (any partitioner; births, deaths and migration included) whose policy substep acts with the
   current network (:class:`~agentsim.policy.NetworkActor`, recording, no autograd), with the
   episode seed ``f(seed, update)``. After each step every rank records its agents' rewards.
2. **Gather**: samples and rewards move to each agent's training owner and are joined by
   (uid, step) (:mod:`agentsim.learn.rollout`); GAE per uid; advantages normalized with their mean
   and standard deviation over all ranks (exact int64 fixed-point sums).
3. **Optimize**: ``epochs`` passes; in each, every uid's trajectory goes to minibatch
   ``integers(uid, step=update, stream="minibatch/<epoch>", high=minibatches)`` of the counter-based
   generator (one assignment for all ranks, like one global permutation); each rank's loss is the
   sum over its samples of the minibatch times ``W / N`` (``N`` the minibatch's samples over all
   ranks), so DDP's average is the gradient of the global mean; gradient-norm clipping; Adam.

Every rank then holds the same parameters (checked every ``replica_check_every`` updates).
Rank 0 writes the training log (one ``/metrics`` row per update: mean return, losses, entropy,
KL, clip fraction; timings in ``/perf``) and atomic checkpoints (:mod:`agentsim.learn.checkpoint`);
``resume`` continues from the newest and gives the parameters of an uninterrupted run.

Examples:
    >>> from agentsim.models.spillover import MODEL
    >>> trainer = Trainer(MODEL, agents=300, seed=1, updates=2, config=PPOConfig(horizon=5, hidden=(8,)))
    >>> rows = trainer.train().history
    >>> [row["update"] for row in rows], rows[-1]["samples"]  # 150 people x 5 steps
    ([1.0, 2.0], 750.0)
"""

from __future__ import annotations

import contextlib
import os
import time
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from .. import ops
from ..comm import Comm, LocalComm
from ..engine import Simulation, check_agents, check_seed
from ..errors import ConfigError, SimulationError
from ..model import Model
from ..policy import NetworkActor, PolicyNet, PolicySpec, Step
from ..random import CounterRNG, mix64_int, stream_id
from . import checkpoint
from .hooks import GradientSync
from .ppo import PPOConfig, ppo_loss
from .rollout import Rollout, gae

__all__ = ["TrainResult", "Trainer", "bf16_supported"]

_FRAC = 24  # fixed-point bits of the exact sums (advantage statistics, returns)


def bf16_supported(device: torch.device) -> tuple[bool, str]:
    """Whether ``device`` computes bf16 natively, and what was found."""
    if device.type == "cuda":
        ok = torch.cuda.is_bf16_supported()
        return ok, f"CUDA {torch.cuda.get_device_name(device)}: bf16 {'supported' if ok else 'not supported'}"
    flags: set[str] = set()
    with contextlib.suppress(OSError):
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    break
    found = sorted(flags & {"avx512_bf16", "amx_bf16"})
    return bool(found), f"CPU flags {', '.join(found) or 'without avx512_bf16 or amx_bf16'}"


@dataclass
class TrainResult:
    """What :meth:`Trainer.train` returns.

    Attributes:
        history: One row per update since the first (mean return, losses, ..., timings).
        net: The trained network (the same on every rank).
        path: The training log written (rank 0), or None.
    """

    history: list[dict[str, float]]
    net: PolicyNet
    path: str | None = None
    checkpoints: list[str] = field(default_factory=list)


class Trainer:
    """PPO for one policy of a model (see the module docstring).

    Args:
        model: A model with a policy and a reward for that policy's population.
        policy: The policy's name (default: the model's only one).
        agents, seed: The episodes' agents and the training seed.
        updates: The planned number of updates (the learning rate anneals to 0 over them).
        config: PPO hyperparameters.
        comm: This rank's communication (default: one process).
        partition, partition_options: The episodes' partitioner (as for :class:`~agentsim.engine.Simulation`).
        device: ``"cpu"`` or ``"cuda"``.
        params: Parameter overrides of the model.
    """

    def __init__(self, model: Model, policy: str | None = None, agents: int | None = None, seed: int = 0, *,
                 updates: int = 50, config: PPOConfig | None = None, comm: Comm | None = None,
                 partition: str | None = None, device: str = "cpu", params: Mapping[str, Any] | None = None,
                 **partition_options: Any) -> None:
        self.model = model.configure(params=params) if params else model
        self.spec = _policy(self.model, policy)
        rewards = self.model.rewards
        if self.spec.population not in rewards:
            raise ConfigError(f"model '{self.model.name}' has no reward for '{self.spec.population}': declare one "
                              f"with @model.reward({self.spec.population!r})")
        self.reward_fn = rewards[self.spec.population]
        self.agents = check_agents(self.model.default_agents if agents is None else agents)
        self.seed = check_seed(seed)
        if isinstance(updates, bool) or not isinstance(updates, int) or updates < 1:
            raise ConfigError(f"updates: expected an int >= 1 (got {updates!r})")
        self.updates = updates
        self.config = config or PPOConfig()
        self.comm: Comm = comm if comm is not None else LocalComm()
        self.partition, self.partition_options = partition, partition_options
        self.device = torch.device(device)
        if self.config.precision == "bf16":
            ok, found = bf16_supported(self.device)
            if not ok:
                raise ConfigError(f"precision bf16: this machine has no native bf16 ({found}); use --precision fp32")
        with torch.random.fork_rng(devices=[]):  # the same initial network on every rank, global RNG untouched
            torch.manual_seed(mix64_int(self.seed ^ stream_id("policy-init")) & (2**63 - 1))
            self.net = PolicyNet(self.spec.observations, self.spec.actions, self.spec.action_dim,
                                 self.config.hidden).to(device=self.device, dtype=self.config.dtype)
        self.sync = GradientSync(self.net, self.comm, self.config.compress)
        self.optimizer = torch.optim.Adam(self.net.parameters(), lr=self.config.lr, eps=1e-5)
        self.update_index = 0  # updates done
        self.history: list[dict[str, float]] = []

    # ---------------------------------------------------------------- one update
    def episode_seed(self, update: int) -> int:
        """The seed of the episode of update ``update`` (1-based): a function of the training seed."""
        return mix64_int(mix64_int(self.seed ^ stream_id("episode")) ^ update) & (2**62 - 1)

    def collect(self, update: int) -> tuple[Rollout, float, int]:
        """Run the episode of ``update``; return its rollout (gathered by training owner), the summed
        rewards and the number of agents that acted, over all ranks.
        """
        actor = NetworkActor(self.net, record=True)
        sim = Simulation(self.model, self.agents, self.episode_seed(update), self.device, comm=self.comm,
                         partition=self.partition, policies={self.spec.name: actor}, **self.partition_options)
        pop = self.spec.population
        rewards: list[tuple[int, Tensor, Tensor]] = []
        self.net.eval()
        for _ in range(self.config.horizon):
            sim.step()
            view = sim.view()
            reward = torch.as_tensor(self.reward_fn(view))
            if tuple(reward.shape) != (view[pop].n,):
                raise ConfigError(f"reward of '{pop}': expected [{view[pop].n}] values (got {list(reward.shape)})")
            rewards.append((sim.state.step, view[pop]["uid"], reward))
        rollout = Rollout.gather(actor.steps, rewards, self.comm, self._empty_step())
        total = self._exact_sums([rollout.reward.to(torch.float64)], counts=[torch.unique(rollout.uid).numel()])
        return rollout, float(total[0]), int(total[1])

    def update(self) -> dict[str, float]:
        """One PPO update (collect, gather, optimize); returns its row of figures."""
        config, update = self.config, self.update_index + 1
        t0 = time.perf_counter()
        rollout, total_reward, n_agents = self.collect(update)
        t_collect = time.perf_counter() - t0
        adv, ret = gae(rollout, config.gamma, config.lam)
        n_samples = int(self._exact_sums([], counts=[rollout.n])[0])
        if config.norm_adv:
            s, ss = self._exact_sums([adv.to(torch.float64), adv.to(torch.float64) ** 2])
            mean = s / n_samples
            std = max(ss / n_samples - mean * mean, 0.0) ** 0.5
            adv = (adv - mean) / (std + 1e-8)
        if config.anneal_lr:
            for group in self.optimizer.param_groups:
                group["lr"] = config.lr * (1.0 - (update - 1) / self.updates)
        batch_all = {"obs": rollout.obs, "action": rollout.action, "logp": rollout.logp, "value": rollout.value,
                     "adv": adv, "ret": ret}
        batch_all = {k: v if k == "action" else v.to(config.dtype) for k, v in batch_all.items()}
        if not self.spec.discrete:
            batch_all["action"] = batch_all["action"].to(config.dtype)
        sums = torch.zeros(5, dtype=torch.float64)
        rng = CounterRNG(self.seed)
        self.net.train()
        self.sync.take_seconds()
        t1 = time.perf_counter()
        for epoch in range(config.epochs):
            minibatch = rng.integers(rollout.uid, update, f"minibatch/{epoch}", config.minibatches)
            counts = self._exact_sums([], counts=[int((minibatch == m).sum()) for m in range(config.minibatches)])
            for m in range(config.minibatches):
                rows = torch.nonzero(minibatch == m).squeeze(1)
                figures = self.gradient({k: v.index_select(0, rows) for k, v in batch_all.items()}, int(counts[m]))
                torch.nn.utils.clip_grad_norm_(self.net.parameters(), config.max_grad_norm)
                self.optimizer.step()
                sums += torch.stack([v.detach().to(torch.float64) for v in figures.values()])
        t_update = time.perf_counter() - t1
        seconds_reduce = self.sync.take_seconds()
        self.update_index = update
        if update % config.replica_check_every == 0 or update == self.updates:
            self.check_replicas()
        total = self._sum_floats(sums)
        n_opt = max(n_samples * config.epochs, 1)
        wall = t_collect + t_update
        row = {"update": float(update), "mean_return": total_reward / max(n_agents, 1),
               "policy_loss": float(total[0]) / n_opt, "value_loss": float(total[1]) / n_opt,
               "entropy": float(total[2]) / n_opt, "approx_kl": float(total[3]) / n_opt,
               "clip_fraction": float(total[4]) / n_opt, "samples": float(n_samples),
               "lr": float(self.optimizer.param_groups[0]["lr"]), "collect_seconds": t_collect,
               "update_seconds": t_update, "allreduce_seconds": seconds_reduce,
               "agent_steps_per_s": n_samples / wall if wall > 0 else float("inf"),
               "scaling_efficiency": 1.0 - seconds_reduce / t_update if t_update > 0 else 1.0,
               "compression": self.sync.compression}
        self.history.append(row)
        return row

    def gradient(self, batch: Mapping[str, Tensor], n_global: int) -> dict[str, Tensor]:
        """Set every rank's ``.grad`` to the gradient of the mean PPO loss over the ``n_global``
        samples of a minibatch, of which ``batch`` holds this rank's (a collective on several
        ranks); return this rank's summed figures.
        """
        with self._precision():
            loss, figures = ppo_loss(self.sync.module, self.net, dict(batch), self.config)
        self.optimizer.zero_grad(set_to_none=False)
        (loss * (self.comm.world_size / max(n_global, 1))).backward()  # DDP averages over ranks
        return figures

    # ---------------------------------------------------------------- across ranks
    def _exact_sums(self, values: list[Tensor], counts: list[int] | None = None) -> list[float]:
        """Exact sums over every rank (fixed point for floats, so the same on any number of ranks)."""
        parts = [ops.to_fixed(v, _FRAC).sum() for v in values] + [torch.tensor(c) for c in (counts or [])]
        total = self.comm.sum_int64(torch.stack(parts).to(torch.int64)) if parts else torch.zeros(0)
        n = len(values)
        return [v * 2.0 ** -_FRAC if k < n else float(v) for k, v in enumerate(total.tolist())]

    def _sum_floats(self, values: Tensor) -> Tensor:
        """A float64 vector summed over ranks, in rank order (figures, not training math)."""
        if self.comm.world_size == 1:
            return values
        return self.comm.all_gather_rows({"v": values[None]}, rows_per_rank=1)["v"].sum(0)

    def check_replicas(self) -> None:
        """Raise unless every rank holds the same parameters (a checksum each, gathered)."""
        if self.comm.world_size == 1:
            return
        crc = 0
        for p in self.net.parameters():
            crc = zlib.crc32(p.detach().cpu().contiguous().numpy().tobytes(), crc)
        got = self.comm.all_gather_rows({"crc": torch.tensor([[crc]], dtype=torch.int64)}, rows_per_rank=1)["crc"]
        if len(set(got[:, 0].tolist())) != 1:
            raise SimulationError(f"update {self.update_index}: the ranks' policy parameters differ "
                                  f"(checksums {got[:, 0].tolist()})")

    # ---------------------------------------------------------------- the loop
    def train(self, updates: int | None = None, *, out: str | os.PathLike[str] | None = None,
              checkpoint_dir: str | os.PathLike[str] | None = None, checkpoint_every: int = 1, keep: int = 3,
              resume: bool = False, progress: bool = False) -> TrainResult:
        """Run updates until ``updates`` (default: the planned number) are done.

        Args:
            out: A training log (HDF5, written by rank 0; see the module docstring).
            checkpoint_dir: Where rank 0 writes checkpoints, every ``checkpoint_every`` updates,
                keeping the newest ``keep``.
            resume: Continue from the newest checkpoint in ``checkpoint_dir``.
            progress: A progress bar (rank 0, on a terminal).
        """
        target = self.updates if updates is None else updates
        if resume:
            if checkpoint_dir is None:
                raise ConfigError("resume needs a checkpoint directory (--checkpoint-dir)")
            found = checkpoint.load_latest(checkpoint_dir)
            if found is None:
                raise ConfigError(f"resume: no checkpoint in '{os.fspath(checkpoint_dir)}'")
            self.load_state_dict(found)
        log = _TrainingLog(out, self) if out is not None and self.comm.rank == 0 else None
        saved: list[str] = []
        bar = _progress(target - self.update_index, progress and self.comm.rank == 0)
        try:
            if log is not None:
                for row in self.history:
                    log.write(row)
            while self.update_index < target:
                row = self.update()
                if log is not None:
                    log.write(row)
                if checkpoint_dir is not None and self.comm.rank == 0 and (
                        self.update_index % checkpoint_every == 0 or self.update_index == target):
                    saved.append(checkpoint.save(checkpoint_dir, self.state_dict(), self.update_index, keep=keep))
                if bar is not None:
                    bar.set_postfix(mean_return=f"{row['mean_return']:.3g}", kl=f"{row['approx_kl']:.2g}")
                    bar.update(1)
        except BaseException:
            if log is not None:
                log.close(completed=False)
            raise
        if bar is not None:
            bar.close()
        if log is not None:
            log.close(completed=True)
        return TrainResult(list(self.history), self.net, None if out is None else os.fspath(out), saved)

    # ---------------------------------------------------------------- checkpoints
    def identity(self) -> dict[str, Any]:
        """What a checkpoint must match to be resumed by this trainer."""
        return {"model": self.model.name, "params": dict(self.model.params), "policy": self.spec.name,
                "agents": self.agents, "seed": self.seed, "updates": self.updates, "config": self.config.to_dict()}

    def state_dict(self) -> dict[str, Any]:
        """Everything a resumed run needs (network, optimizer, updates done, history)."""
        return {"identity": self.identity(), "update": self.update_index, "net": self.net.state_dict(),
                "optimizer": self.optimizer.state_dict(), "history": list(self.history)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from a checkpoint of the same training (a different one is a ConfigError)."""
        mine = self.identity()
        theirs = state.get("identity", {})
        diff = sorted(k for k in mine if _jsonable(theirs.get(k)) != _jsonable(mine[k]))
        if diff:
            raise ConfigError("checkpoint is from another training (differs in " + ", ".join(
                f"{k}: {theirs.get(k)!r} here {mine[k]!r}" for k in diff) + ")")
        self.net.load_state_dict(state["net"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.update_index = int(state["update"])
        self.history = list(state["history"])

    # ---------------------------------------------------------------- helpers
    def _precision(self) -> contextlib.AbstractContextManager[Any]:
        if self.config.precision == "bf16":
            return torch.autocast(self.device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def _empty_step(self) -> Step:
        d = self.spec.observations
        action = (torch.zeros(0, dtype=torch.int64) if self.spec.discrete
                  else torch.zeros(0, self.spec.action_dim))
        empty = torch.zeros(0)
        return Step(0, torch.zeros(0, dtype=torch.int64), torch.zeros(0, d), action, empty, empty)


def _policy(model: Model, name: str | None) -> PolicySpec:
    policies = model.policies
    if not policies:
        raise ConfigError(f"model '{model.name}' declares no policy (see @model.policy)")
    if name is None:
        if len(policies) > 1:
            raise ConfigError(f"model '{model.name}' has several policies ({', '.join(policies)}): name one")
        return next(iter(policies.values()))
    if name not in policies:
        raise ConfigError(f"model '{model.name}' has no policy {name!r} (policies: {', '.join(policies)})")
    return policies[name]


def _jsonable(value: Any) -> Any:
    import json

    return json.loads(json.dumps(value, sort_keys=True, default=str))


class _TrainingLog:
    """Rank 0's training log: an HDF5 trajectory file whose ``/metrics`` rows are updates."""

    _PERF = ("collect_seconds", "update_seconds", "allreduce_seconds", "agent_steps_per_s", "scaling_efficiency")

    def __init__(self, out: str | os.PathLike[str], trainer: Trainer) -> None:
        from ..io.hdf5 import TrajectoryWriter

        ident = trainer.identity()
        self.writer = TrajectoryWriter(out, model=f"{ident['model']}:{ident['policy']}",
                                       params={**ident["params"], "ppo": ident["config"], "agents": ident["agents"]},
                                       seed=trainer.seed, steps=trainer.updates, world_size=trainer.comm.world_size)

    def write(self, row: Mapping[str, float]) -> None:
        step = int(row["update"])
        self.writer.write_metrics(step, {k: v for k, v in row.items() if k != "update" and k not in self._PERF})
        self.writer.write_perf(step, {k: float(row[k]) for k in self._PERF})
        self.writer.flush()

    def close(self, completed: bool) -> None:
        self.writer.close(completed=completed)


def _progress(total: int, enabled: bool) -> Any:
    import sys

    if not enabled or total < 1 or not sys.stderr.isatty():
        return None
    from tqdm import tqdm

    return tqdm(total=total, unit="update", leave=False)

