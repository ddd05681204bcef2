"""Proximal policy optimization: the configuration and the loss (the details of CleanRL's ``ppo.py``
that matter: clipped surrogate, clipped value loss, entropy bonus, advantage normalization,
global gradient-norm clipping, linear learning-rate annealing, Adam eps 1e-5).

The loss of a minibatch is returned as a *sum* over the rank's samples; the trainer divides by the
number of samples of the minibatch over all ranks (see :mod:`agentsim.learn.hooks`), so the
gradient is that of the global mean whatever the split.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import Tensor

from agentsim.core.policy import PolicyNet, gaussian_logp
from agentsim.errors import ConfigError
from agentsim.learn.hooks import COMPRESSIONS

__all__ = ["PPOConfig", "ppo_loss"]

PRECISIONS = ("fp32", "bf16")
SYNCS = ("auto", "exact", "ddp")


@dataclass(frozen=True)
class PPOConfig:
    """PPO hyperparameters (CleanRL's defaults where they apply).

    Attributes:
        horizon: Steps per episode (one episode per update, every agent an actor).
        epochs: Passes over the episode's samples per update.
        minibatches: Minibatches per epoch (each a set of whole trajectories, chosen by uid).
        lr: Adam learning rate (linearly annealed to 0 over the updates when ``anneal_lr``). Higher
            than CleanRL's 2.5e-4 for Atari: an update here averages over every agent's steps.
        gamma, lam: Discount and GAE lambda.
        clip: Ratio clip of the surrogate and of the value loss.
        vf_coef, ent_coef: Value-loss and entropy weights.
        max_grad_norm: Global gradient-norm clip.
        hidden: Hidden layer widths of the policy network.
        norm_adv: Normalize advantages (with statistics over all ranks).
        clip_vloss: Clip the value loss.
        replica_check_every: Check every this many updates that every rank holds the same parameters.
        precision: ``"fp32"``, or ``"bf16"`` (autocast of the training forward pass).
        compress: Gradient compression (see :mod:`agentsim.learn.hooks`).
        sync: How gradients are summed over ranks: ``"exact"`` (per chunk of uids in int64 fixed
            point: the same bits on any number of ranks), ``"ddp"`` (DistributedDataParallel's
            float all-reduce: the same to rounding, 1e-6 relative; needed for compression), or
            ``"auto"`` (the default: ``"exact"`` without compression, ``"ddp"`` with).
        dtype: The network's dtype (``torch.float32``; float64 for exactness tests).
    """

    horizon: int = 40
    epochs: int = 4
    minibatches: int = 4
    lr: float = 1e-3
    anneal_lr: bool = True
    gamma: float = 0.99
    lam: float = 0.95
    clip: float = 0.2
    vf_coef: float = 0.5
    ent_coef: float = 0.01
    max_grad_norm: float = 0.5
    hidden: tuple[int, ...] = (64, 64)
    norm_adv: bool = True
    clip_vloss: bool = True
    replica_check_every: int = 10
    precision: str = "fp32"
    compress: str = "none"
    sync: str = "auto"
    dtype: torch.dtype = field(default=torch.float32)

    def __post_init__(self) -> None:
        for name in ("horizon", "epochs", "minibatches", "replica_check_every"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name}: expected an int >= 1 (got {value!r})")
        for name in ("lr", "clip", "max_grad_norm"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not value > 0:
                raise ConfigError(f"{name}: expected a number > 0 (got {value!r})")
        for name in ("gamma", "lam"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not 0 <= value <= 1:
                raise ConfigError(f"{name}: expected a number in [0, 1] (got {value!r})")
        if (not isinstance(self.hidden, tuple) or not self.hidden
                or any(isinstance(w, bool) or not isinstance(w, int) or w < 1 for w in self.hidden)):
            raise ConfigError(f"hidden: expected a tuple of layer widths >= 1, like (64, 64) (got {self.hidden!r})")
        if self.precision not in PRECISIONS:
            raise ConfigError(f"precision: expected one of {', '.join(PRECISIONS)} (got {self.precision!r})")
        if self.compress not in COMPRESSIONS:
            raise ConfigError(f"compress: expected one of {', '.join(COMPRESSIONS)} (got {self.compress!r})")
        if self.sync not in SYNCS:
            raise ConfigError(f"sync: expected one of {', '.join(SYNCS)} (got {self.sync!r})")
        if self.sync == "exact" and self.compress != "none":
            raise ConfigError(f"compress={self.compress!r} needs sync='ddp' (compression hooks are DDP's; "
                              "exact sums travel as int64)")
        if self.dtype not in (torch.float32, torch.float64):
            raise ConfigError(f"dtype: expected torch.float32 or torch.float64 (got {self.dtype})")

    @property
    def gradient_sync(self) -> str:
        """``"exact"`` or ``"ddp"``: :attr:`sync` with ``"auto"`` resolved."""
        if self.sync == "auto":
            return "exact" if self.compress == "none" else "ddp"
        return self.sync

    def to_dict(self) -> dict[str, Any]:
        """The configuration as JSON-friendly values."""
        out = asdict(self)
        out["dtype"] = str(self.dtype).removeprefix("torch.")
        out["hidden"] = list(self.hidden)
        return out


def ppo_loss(net: Any, policy: PolicyNet, batch: dict[str, Tensor],
             config: PPOConfig) -> tuple[Tensor, dict[str, Tensor]]:
    """The summed PPO loss of a minibatch and its summed figures.

    Args:
        net: What to call for the forward pass (the network, or its DDP wrapper).
        policy: The network itself (its ``log_std`` for continuous actions).
        batch: ``obs [m, d]``, ``action``, ``logp [m]``, ``value [m]``, ``adv [m]`` (normalized),
            ``ret [m]``.

    Returns:
        ``(loss summed over the m samples, {"pg", "v", "entropy", "kl", "clipped"} sums)``.
    """
    head, value = net(batch["obs"])
    head, value = head.to(policy_dtype(policy)), value.to(policy_dtype(policy))
    if policy.log_std is None:
        logp_all = torch.log_softmax(head, -1)
        new_logp = logp_all.gather(-1, batch["action"].unsqueeze(-1)).squeeze(-1)
        entropy = -(logp_all.exp() * logp_all).sum(-1)
    else:
        new_logp = gaussian_logp(batch["action"], head, policy.log_std)
        entropy = (policy.log_std + 0.5 * math.log(2 * math.pi * math.e)).sum().expand(value.shape[0])
    log_ratio = new_logp - batch["logp"]
    ratio = log_ratio.exp()
    adv = batch["adv"]
    pg = torch.maximum(-adv * ratio, -adv * ratio.clamp(1 - config.clip, 1 + config.clip))
    v_err = (value - batch["ret"]) ** 2
    if config.clip_vloss:
        v_clipped = batch["value"] + (value - batch["value"]).clamp(-config.clip, config.clip)
        v_err = torch.maximum(v_err, (v_clipped - batch["ret"]) ** 2)
    v_loss = 0.5 * v_err
    loss = (pg + config.vf_coef * v_loss - config.ent_coef * entropy).sum()
    with torch.no_grad():
        figures = {"pg": pg.sum(), "v": v_loss.sum(), "entropy": entropy.sum(),
                   "kl": ((ratio - 1) - log_ratio).sum(), "clipped": ((ratio - 1).abs() > config.clip).sum()}
    return loss, figures


def policy_dtype(policy: PolicyNet) -> torch.dtype:
    """The dtype of the network's parameters (the loss is computed in it, also under autocast)."""
    return next(policy.parameters()).dtype
