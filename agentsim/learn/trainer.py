"""Training a model's policy with PPO, on one process or many, with the same result on any number of
ranks: with ``sync="exact"`` (the default) the parameters, returns and logged figures have the same
bits on any number of ranks; with ``sync="ddp"`` they agree to rounding (1e-6 relative), and with
gradient compression they differ by the compression.

One update:

1. **Collect**: one episode of ``horizon`` steps of an ordinary :class:`~agentsim.Simulation`
   (any partitioner; births, deaths and migration included) whose policy substep acts with the
   current network (:class:`~agentsim.core.policy.NetworkActor`, recording, no autograd), with the
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
import sys
import time
import uuid
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from agentsim.core import ops
from agentsim.core.comm import Comm, LocalComm
from agentsim.core.model import Model
from agentsim.core.policy import TILE, NetworkActor, PolicyNet, Step, one_thread
from agentsim.core.random import CounterRNG, mix64_int, stream_id
from agentsim.engine import stops
from agentsim.engine.progress import progress_bar
from agentsim.engine.simulation import check_agents, check_seed
from agentsim.errors import ConfigError, RunStopped, SimulationError
from agentsim.io.checkpoint import CheckpointError
from agentsim.learn import checkpoint
from agentsim.learn.episode import exact_sums, mean_return, policy_spec, reward_of, run_episode
from agentsim.learn.hooks import GradientSync, chunk_bounds
from agentsim.learn.ppo import PPOConfig, ppo_loss
from agentsim.learn.rollout import Rollout, gae

_FIGURE_BITS = 20  # fixed-point bits of the logged loss sums (|sum| < 2**42)

__all__ = ["TrainResult", "Trainer", "bf16_supported", "format_update", "summarize_training"]

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
        checkpoints: The checkpoints written by this call (rank 0).
        world_size: The number of ranks that trained.
    """

    history: list[dict[str, float]]
    net: PolicyNet
    path: str | None = None
    checkpoints: list[str] = field(default_factory=list)
    world_size: int = 1


class Trainer:
    """PPO for one policy of a model (see the module docstring).

    Args:
        model: A model with a policy and a reward for that policy's population.
        policy: The policy's name (default: the model's only one).
        agents, seed: The episodes' agents and the training seed.
        updates: The planned number of updates (the learning rate anneals to 0 over them).
        config: PPO hyperparameters.
        comm: This rank's communication (default: one process).
        partition, partition_options: The episodes' partitioner (as for :class:`~agentsim.Simulation`).
        device: ``"cpu"`` or ``"cuda"``.
        params: Parameter overrides of the model.
    """

    def __init__(self, model: Model, policy: str | None = None, agents: int | None = None, seed: int = 0, *,
                 updates: int = 50, config: PPOConfig | None = None, comm: Comm | None = None,
                 partition: str | None = None, device: str = "cpu", params: Mapping[str, Any] | None = None,
                 **partition_options: Any) -> None:
        self.model = model.configure(params=params) if params else model
        self.spec = policy_spec(self.model, policy)
        reward_of(self.model, self.spec)  # a model without a reward fails here
        self.agents = check_agents(self.model.default_agents if agents is None else agents)
        self.seed = check_seed(seed)
        if isinstance(updates, bool) or not isinstance(updates, int) or updates < 1:
            raise ConfigError(f"updates: expected an int >= 1 (got {updates!r})")
        self.updates = updates
        self.config = config or PPOConfig()
        self.run_id = uuid.uuid4().hex  # in its checkpoints: pruning (--keep) touches only this training's
        self.comm: Comm = comm if comm is not None else LocalComm()
        self.partition, self.partition_options = partition, partition_options
        self.device = torch.device(device)
        if self.config.precision == "bf16":
            ok, found = bf16_supported(self.device)
            if not ok:
                raise ConfigError(f"precision bf16: this machine has no native bf16 ({found}); use --precision fp32")
        # the same initial network on every rank and thread count (QR of the orthogonal init), global RNG untouched
        with torch.random.fork_rng(devices=[]), one_thread():
            torch.manual_seed(mix64_int(self.seed ^ stream_id("policy-init")) & (2**63 - 1))
            self.net = PolicyNet(self.spec.observations, self.spec.actions, self.spec.action_dim,
                                 self.config.hidden).to(device=self.device, dtype=self.config.dtype)
        self.sync = GradientSync(self.net, self.comm, self.config.compress, self.config.gradient_sync)
        self.optimizer = torch.optim.Adam(self.net.parameters(), lr=self.config.lr, eps=1e-5)
        self.update_index = 0  # updates done
        self.history: list[dict[str, float]] = []

    # ---------------------------------------------------------------- one update
    def episode_seed(self, update: int) -> int:
        """The seed of the episode of update ``update`` (1-based): a function of the training seed."""
        return mix64_int(mix64_int(self.seed ^ stream_id("episode")) ^ update) & (2**62 - 1)

    def collect(self, update: int) -> tuple[Rollout, float, int]:
        """Run the episode of ``update``; return its rollout (gathered by training owner), the mean
        return per agent and the number of agents rewarded, over all ranks.
        """
        actor = NetworkActor(self.net, record=True)
        self.net.eval()
        rewards = run_episode(self.model, self.spec, actor, self.agents, self.episode_seed(update),
                              self.config.horizon, comm=self.comm, device=self.device, partition=self.partition,
                              **self.partition_options)
        rollout = Rollout.gather(actor.steps, rewards, self.comm, self._empty_step())
        per_agent, n_agents = mean_return(rewards, self.comm)
        return rollout, per_agent, n_agents

    def update(self) -> dict[str, float]:
        """One PPO update (collect, gather, optimize); returns its row of figures."""
        t0 = time.perf_counter()
        rollout, mean_ret, _ = self.collect(self.update_index + 1)
        return self.learn(rollout, mean_ret, time.perf_counter() - t0)

    def learn(self, rollout: Rollout, mean_ret: float, t_collect: float = 0.0) -> dict[str, float]:
        """The optimization of an update from its collected ``rollout`` (GAE, advantage statistics,
        epochs of minibatches); returns the update's row of figures.
        """
        config, update = self.config, self.update_index + 1
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
        batch_all["uid"] = rollout.uid
        if not self.spec.discrete:
            batch_all["action"] = batch_all["action"].to(config.dtype)
        self.net.train()
        self.sync.take_seconds()
        t1 = time.perf_counter()
        with one_thread():  # the same bits whatever the thread count (see agentsim.core.policy)
            sums = self._optimize(batch_all, rollout.uid, update)
        t_update = time.perf_counter() - t1
        seconds_reduce = self.sync.take_seconds()
        self.update_index = update
        if update % config.replica_check_every == 0 or update == self.updates:
            self.check_replicas()
        total = self.comm.sum_int64(sums).double() * 2.0**-_FIGURE_BITS
        n_opt = max(n_samples * config.epochs, 1)
        wall = t_collect + t_update
        row = {"update": float(update), "mean_return": mean_ret,
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

    def _optimize(self, batch_all: Mapping[str, Tensor], uid: Tensor, update: int) -> Tensor:
        """The epochs of one update; returns the fixed-point sums of the loss figures (``[5]`` int64)."""
        config = self.config
        sums = torch.zeros(5, dtype=torch.int64)
        rng = CounterRNG(self.seed)
        for epoch in range(config.epochs):
            minibatch = rng.integers(uid, update, f"minibatch/{epoch}", config.minibatches)
            counts = self._exact_sums([], counts=[int((minibatch == m).sum()) for m in range(config.minibatches)])
            for m in range(config.minibatches):
                rows = torch.nonzero(minibatch == m).squeeze(1)
                figures = self.gradient({k: v.index_select(0, rows) for k, v in batch_all.items()}, int(counts[m]))
                torch.nn.utils.clip_grad_norm_(self.net.parameters(), config.max_grad_norm)
                self.optimizer.step()
                sums += ops.to_fixed(figures, _FIGURE_BITS).sum(0).cpu()
        return sums

    def gradient(self, batch: Mapping[str, Tensor], n_global: int) -> Tensor:
        """Set every rank's ``.grad`` to the gradient of the mean PPO loss over the ``n_global``
        samples of a minibatch, of which ``batch`` holds this rank's, sorted by uid (a collective on
        several ranks).

        Returns:
            ``[c, 5]`` float64 sums of (policy loss, value loss, entropy, KL, clipped) per chunk
            (exact sync; one row with DDP).
        """
        self.optimizer.zero_grad(set_to_none=False)
        if not self.sync.exact:
            with self._precision():
                loss, figures = ppo_loss(self.sync.module, self.net, dict(batch), self.config)
            (loss * (self.comm.world_size / max(n_global, 1))).backward()  # DDP averages over ranks
            return torch.stack([v.detach().to(torch.float64) for v in figures.values()])[None]
        params = list(self.net.parameters())
        grads, rows = [], []
        for start, stop in chunk_bounds(batch["uid"], TILE):
            chunk = {k: v[start:stop] for k, v in batch.items() if k != "uid"}
            with self._precision():
                loss, figures = ppo_loss(self.net, self.net, chunk, self.config)
            parts = torch.autograd.grad(loss / max(n_global, 1), params)
            grads.append(torch.cat([g.reshape(-1) for g in parts]))
            rows.append(torch.stack([v.detach().to(torch.float64) for v in figures.values()]))
        width = sum(p.numel() for p in params)
        stacked = torch.stack(grads) if grads else torch.zeros(0, width, dtype=params[0].dtype, device=params[0].device)
        total = self.sync.reduce_exact(stacked, n_global)
        offset = 0
        for p in params:
            p.grad = total[offset:offset + p.numel()].view_as(p).to(p.dtype)
            offset += p.numel()
        return torch.stack(rows) if rows else torch.zeros(0, 5, dtype=torch.float64, device=params[0].device)

    # ---------------------------------------------------------------- across ranks
    def _exact_sums(self, values: list[Tensor], counts: list[int] | None = None) -> list[float]:
        return exact_sums(self.comm, values, counts or [])

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
              resume: bool = False, progress: bool = False, lock: bool = True) -> TrainResult:
        """Run updates until ``updates`` (default: the planned number) are done.

        Args:
            out: A training log (HDF5, written by rank 0; see the module docstring).
            checkpoint_dir: Where rank 0 writes checkpoints, every ``checkpoint_every`` updates,
                keeping the newest ``keep``.
            resume: Continue from the newest checkpoint in ``checkpoint_dir``.
            progress: Rank 0 shows a progress bar on a terminal, else prints one line per update
                to stderr (:func:`format_update`).
            lock: Rank 0 holds the locks of ``out`` and ``checkpoint_dir`` (:mod:`agentsim.io.locks`):
                another run writing either makes this one fail at once, naming it. False: the caller
                holds them (the workers of :func:`agentsim.learn.train`, whose launcher does).
        """
        from agentsim.io.locks import lock_on_rank0

        locks = lock_on_rank0(self.comm, out, checkpoint_dir, what="training log") if lock else []
        try:
            return self._train(updates, out, checkpoint_dir, checkpoint_every, keep, resume, progress)
        finally:
            for taken in reversed(locks):
                taken.release()

    def _train(self, updates: int | None, out: str | os.PathLike[str] | None,
               checkpoint_dir: str | os.PathLike[str] | None, checkpoint_every: int, keep: int, resume: bool,
               progress: bool) -> TrainResult:
        target = self.updates if updates is None else updates
        if resume:
            if checkpoint_dir is None:
                raise ConfigError("resume needs a checkpoint directory (--checkpoint-dir)")
            self.resume(checkpoint_dir)
        log = _TrainingLog(out, self) if out is not None and self.comm.rank == 0 else None
        saved: list[str] = []
        bar = progress_bar(target - self.update_index, progress and self.comm.rank == 0, "update")
        try:
            if log is not None:
                for row in self.history:
                    log.write(row)
            while self.update_index < target:
                row = self.update()
                if log is not None:
                    log.write(row)
                stop = self._stop_requested() if self.update_index < target else 0
                if checkpoint_dir is not None and self.comm.rank == 0 and (
                        self.update_index % checkpoint_every == 0 or self.update_index == target or stop):
                    saved.append(checkpoint.save(checkpoint_dir, self.state_dict(), self.update_index, keep=keep,
                                                 run_id=self.run_id))
                if bar is not None:
                    bar.set_postfix(mean_return=f"{row['mean_return']:.3g}", kl=f"{row['approx_kl']:.2g}")
                    bar.update(1)
                elif progress and self.comm.rank == 0:
                    print(format_update(row, target), file=sys.stderr, flush=True)
                if stop:
                    final = saved[-1] if saved and checkpoint_dir is not None and self.comm.rank == 0 else None
                    where = f"; final checkpoint {final}" if final is not None else ""
                    said = f"stopped by {stops.signal_name(stop)} after update {self.update_index}{where}"
                    raise RunStopped(said, stop, self.update_index, final)
        except BaseException:
            if log is not None:
                log.close(completed=False)
            raise
        if bar is not None:
            bar.close()
        if log is not None:
            log.close(completed=True)
        return TrainResult(list(self.history), self.net, None if out is None else os.fspath(out), saved,
                           self.comm.world_size)

    def _stop_requested(self) -> int:
        """The signal that asked any rank to stop (:mod:`agentsim.engine.stops`), or 0: every rank
        learns it after the same update (one small exchange per update on several ranks).
        """
        stop = stops.requested()
        if self.comm.world_size > 1:
            got = self.comm.all_gather_rows({"stop": torch.tensor([[stop]], dtype=torch.int64)}, rows_per_rank=1)
            stop = int(got["stop"].max())
        return stop

    # ---------------------------------------------------------------- checkpoints
    def identity(self) -> dict[str, Any]:
        """What a checkpoint must match to be resumed by this trainer."""
        return {"model": self.model.name, "params": dict(self.model.params), "policy": self.spec.name,
                "agents": self.agents, "seed": self.seed, "updates": self.updates, "config": self.config.to_dict()}

    def state_dict(self) -> dict[str, Any]:
        """Everything a resumed run needs (network, optimizer, updates done, history), as tensors
        and plain data (dicts, lists, numbers, strings): a checkpoint loads it without unpickling
        any other object.
        """
        return {"identity": _jsonable(self.identity()), "update": self.update_index,
                "net": dict(self.net.state_dict()), "optimizer": _plain(self.optimizer.state_dict()),
                "history": [_plain(row) for row in self.history], "run_id": self.run_id}

    def resume(self, checkpoint_dir: str | os.PathLike[str]) -> int:
        """Load the newest checkpoint in ``checkpoint_dir``; return its update count."""
        found = checkpoint.load_latest(checkpoint_dir)
        if found is None:
            raise ConfigError(f"resume: no checkpoint in '{os.fspath(checkpoint_dir)}'")
        self.load_state_dict(found)
        return self.update_index

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from a checkpoint of the same training (a different one is a ConfigError)."""
        mine = self.identity()
        theirs = state.get("identity", {})
        diff = sorted(k for k in mine if _jsonable(theirs.get(k)) != _jsonable(mine[k]))
        if diff:
            hint = (" (the learning rate anneals over the planned updates: resume with the same number)"
                    if "updates" in diff else "")
            raise ConfigError("checkpoint is from another training (differs in " + ", ".join(
                f"{k}: {theirs.get(k)!r} there, {mine[k]!r} here" for k in diff) + ")" + hint)
        try:
            self.net.load_state_dict(state["net"])
            self.optimizer.load_state_dict(state["optimizer"])
            self.update_index = int(state["update"])
            self.history = list(state["history"])
            run_id = state.get("run_id")
            self.run_id = run_id if isinstance(run_id, str) else self.run_id  # the training goes on
        except (KeyError, RuntimeError, TypeError, ValueError, IndexError) as e:
            detail = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise CheckpointError(f"checkpoint does not fit this training's network and optimizer ({detail[:200]})"
                                  ) from None

    # ---------------------------------------------------------------- helpers
    def _precision(self) -> contextlib.AbstractContextManager[Any]:
        if self.config.precision == "bf16":
            return torch.autocast(self.device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def _empty_step(self) -> Step:
        d = self.spec.observations
        on = self.device
        action = (torch.zeros(0, dtype=torch.int64, device=on) if self.spec.discrete
                  else torch.zeros(0, self.spec.action_dim, device=on))
        empty = torch.zeros(0, device=on)
        return Step(0, torch.zeros(0, dtype=torch.int64, device=on), torch.zeros(0, d, device=on), action, empty, empty)


def format_update(row: Mapping[str, float], total: int | None = None) -> str:
    """One update's figures on one line."""
    of = f"/{total}" if total else ""
    return (f"update {int(row['update'])}{of}: return {row['mean_return']:.4g} | policy {row['policy_loss']:.3g} "
            f"value {row['value_loss']:.3g} entropy {row['entropy']:.3g} kl {row['approx_kl']:.2g} "
            f"clip {row['clip_fraction']:.2f} | {row['agent_steps_per_s']:.3g} agent-steps/s, "
            f"all-reduce {row['allreduce_seconds']:.3f} s")


def summarize_training(result: TrainResult) -> str:
    """What a training run did: first and last mean return, throughput, time in the all-reduce."""
    rows = result.history
    if not rows:
        return "no updates"
    collect = sum(r["collect_seconds"] for r in rows)
    optimize = sum(r["update_seconds"] for r in rows)
    reduce = sum(r["allreduce_seconds"] for r in rows)
    samples = sum(r["samples"] for r in rows)
    wall = collect + optimize
    lines = [f"{len(rows)} updates on {result.world_size} process(es): mean return {rows[0]['mean_return']:.4g} "
             f"(update {int(rows[0]['update'])}) -> {rows[-1]['mean_return']:.4g} (update {int(rows[-1]['update'])})",
             f"{samples:.0f} agent-steps in {wall:.2f} s ({samples / wall if wall > 0 else float('inf'):.3g} "
             f"agent-steps/s): collect {collect:.2f} s, optimize {optimize:.2f} s of which gradient all-reduce "
             f"{reduce:.3f} s ({reduce / optimize if optimize > 0 else 0.0:.1%})",
             "compression: none" if rows[-1]["compression"] == 1.0
             else f"compression: {rows[-1]['compression']:.1%} of the gradient bytes travel"]
    return "\n".join(lines)


def _jsonable(value: Any) -> Any:
    import json

    return json.loads(json.dumps(value, sort_keys=True, default=str))


def _plain(value: Any) -> Any:
    """``value`` with mappings as dicts and sequences as lists or tuples (tensors and scalars kept)."""
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        items = [_plain(v) for v in value]
        return items if isinstance(value, list) else tuple(items)
    return value


class _TrainingLog:
    """Rank 0's training log: an HDF5 trajectory file whose ``/metrics`` rows are updates."""

    _PERF = ("collect_seconds", "update_seconds", "allreduce_seconds", "agent_steps_per_s", "scaling_efficiency")

    def __init__(self, out: str | os.PathLike[str], trainer: Trainer) -> None:
        from agentsim.io.hdf5 import TrajectoryWriter

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
