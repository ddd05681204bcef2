"""The learning layer: agent policies trained with PPO on the distributed state.

- :mod:`agentsim.core.policy` (core): declaring a policy (``@model.policy``), networks and actors;
- :mod:`agentsim.learn.episode`: episodes, exact returns, :func:`evaluate`;
- :mod:`agentsim.learn.rollout`: the sharded rollout buffer keyed by uid, and GAE;
- :mod:`agentsim.learn.ppo`: configuration and loss;
- :mod:`agentsim.learn.hooks`: DDP on its own process group, compression hooks;
- :mod:`agentsim.learn.trainer`: the training loop (:class:`Trainer`), logs, resume;
- :mod:`agentsim.learn.checkpoint`: atomic checkpoints;
- :mod:`agentsim.learn.api`: :func:`train` on W local processes, :func:`plot_training`.
"""

from __future__ import annotations

from agentsim.learn.api import plot_training, train
from agentsim.learn.episode import evaluate
from agentsim.learn.hooks import COMPRESSIONS, GradientSync
from agentsim.learn.ppo import PPOConfig
from agentsim.learn.trainer import Trainer, TrainResult, bf16_supported

__all__ = ["COMPRESSIONS", "GradientSync", "PPOConfig", "TrainResult", "Trainer", "bf16_supported", "evaluate",
           "plot_training", "train"]
