"""Training from Python on one process or ``world_size`` local processes, and the learning curve.

:func:`train` is what ``agentsim train`` runs; under torchrun, build a
:class:`~agentsim.learn.trainer.Trainer` with the rank's ``comm`` instead (the CLI does).

Examples:
    >>> from agentsim.learn import PPOConfig, train
    >>> result = train("spillover", agents=300, updates=2, seed=1, config=PPOConfig(horizon=5, hidden=(8,)))
    >>> len(result.history), result.world_size
    (2, 1)
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from agentsim.core.comm import Comm
from agentsim.core.model import Model
from agentsim.distributed.partitioners import check_run_partition
from agentsim.errors import ConfigError, OutputError
from agentsim.learn.ppo import PPOConfig
from agentsim.learn.trainer import Trainer, TrainResult

__all__ = ["plot_training", "train"]


def train(model: Model | str, agents: int | None = None, updates: int = 50, seed: int = 0, *, world_size: int = 1,
          config: PPOConfig | None = None, policy: str | None = None, params: Mapping[str, Any] | None = None,
          partition: str | None = None, device: str = "cpu", out: str | os.PathLike[str] | None = None,
          checkpoint_dir: str | os.PathLike[str] | None = None, checkpoint_every: int = 1, keep: int = 3,
          resume: bool = False, progress: bool = False, timeout: float | None = None,
          **partition_options: Any) -> TrainResult:
    """Train ``model``'s policy with PPO for ``updates`` updates on ``world_size`` processes.

    The same ``seed`` gives the same parameters, bit for bit, on any ``world_size`` with the default
    ``sync="exact"`` (to rounding with ``sync="ddp"``; see :mod:`agentsim.learn.trainer`).

    Args:
        model: A :class:`~agentsim.core.model.Model` or a model name (``"spillover"``, ``"pkg.mod:ATTR"``).
        agents, updates, seed: Agents per episode, planned updates, training seed.
        world_size: Local processes (gloo on CPU, NCCL on CUDA), one torch thread each.
        config: PPO hyperparameters (:class:`~agentsim.learn.ppo.PPOConfig`).
        policy: Which policy (default: the model's only one).
        params: Model parameter overrides.
        partition, partition_options: The episodes' partitioner (``"data"`` or ``"spatial"``, with
            its options) on several processes.
        out: The training log (HDF5, one ``/metrics`` row per update), written by rank 0.
        checkpoint_dir, checkpoint_every, keep, resume: Atomic checkpoints (rank 0) and resuming
            from the newest.
        progress: A progress bar on a terminal.
        timeout: Seconds a collective waits for the other ranks.

    Returns:
        Rank 0's :class:`~agentsim.learn.trainer.TrainResult`.

    Raises:
        ConfigError: A bad argument (checked before any process starts).
        AgentsimError: A rank failed (the message names it).
    """
    from agentsim.core.catalog import get_model
    from agentsim.distributed.process_group import DEFAULT_TIMEOUT
    from agentsim.engine.spec import model_ref, resolve_model
    from agentsim.io.locks import hold
    from agentsim.runner.launch import run_ranks

    if isinstance(model, str):
        model = get_model(model)
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ConfigError(f"world_size: expected an int >= 1 (got {world_size!r})")
    partition_name, options, _ = check_run_partition(partition, 1, **partition_options)
    if out is not None:
        parent = os.path.dirname(os.path.abspath(out))
        if not os.path.isdir(parent):
            raise OutputError(f"cannot create training log '{os.fspath(out)}': directory '{parent}' does not exist")
    kwargs: dict[str, Any] = {"policy": policy, "agents": agents, "seed": seed, "updates": updates,
                              "config": config, "partition": partition_name, "device": device, "params": params,
                              **options}
    run: dict[str, Any] = {"out": None if out is None else os.fspath(out),
                           "checkpoint_dir": None if checkpoint_dir is None else os.fspath(checkpoint_dir),
                           "checkpoint_every": checkpoint_every, "keep": keep, "resume": resume,
                           "progress": progress}
    if world_size == 1:
        return Trainer(model, **kwargs).train(**run)
    # This process holds the locks of the log and the checkpoints for the job (its workers die with it).
    with hold(run["out"], run["checkpoint_dir"], what="training log") as locks:
        checker = Trainer(model, **kwargs)  # check everything here, before processes start
        if resume and checkpoint_dir is not None:
            checker.resume(checkpoint_dir)
        ref = model_ref(model)
        resolve_model(ref)

        def started(pids: list[int]) -> None:
            for lock in locks:
                lock.set_workers(pids)

        results = run_ranks(_train_rank, world_size, (ref, kwargs, {**run, "lock": False}),
                            timeout=DEFAULT_TIMEOUT if timeout is None else timeout,
                            device=None if device == "cpu" else device, started=started)
    result: TrainResult = results[0]
    result.world_size = world_size
    return result


def _train_rank(comm: Comm, ref: Any, kwargs: dict[str, Any], run: dict[str, Any]) -> TrainResult | None:
    from agentsim.engine.spec import resolve_model

    result = Trainer(resolve_model(ref), comm=comm, **kwargs).train(**run)
    return result if comm.rank == 0 else None


def plot_training(history: Sequence[Mapping[str, float]] | str | os.PathLike[str], out: str | os.PathLike[str],
                  *, baselines: Mapping[str, float] | None = None, title: str | None = None) -> str:
    """Plot a learning curve (mean return per update; policy and value loss, entropy, KL) to ``out``.

    Args:
        history: :attr:`TrainResult.history <agentsim.learn.trainer.TrainResult.history>` or a training
            log written by ``out=``.
        out: The image file (PNG, SVG, PDF: by suffix).
        baselines: Horizontal reference lines on the return panel (e.g. ``{"random": -33.8}``).
        title: The figure's title.

    Returns:
        ``out`` as a string.
    """
    from agentsim.io.figures import pyplot

    plt = pyplot()

    rows = _rows(history)
    if not rows:
        raise ConfigError("plot_training: the history has no updates")
    x = [r["update"] for r in rows]
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    ax = axes[0]
    ax.plot(x, [r["mean_return"] for r in rows], marker=".", label="PPO (mean return per agent)")
    for k, (name, value) in enumerate(sorted((baselines or {}).items())):
        ax.axhline(value, ls="--", lw=1, color=f"C{k + 1}", label=name)
    ax.set_xlabel("update")
    ax.set_ylabel("mean return per agent")
    ax.legend(fontsize=8)
    ax = axes[1]
    for key in ("policy_loss", "value_loss", "entropy", "approx_kl", "clip_fraction"):
        ax.plot(x, [r[key] for r in rows], label=key)
    ax.set_yscale("symlog", linthresh=1e-3)
    ax.set_xlabel("update")
    ax.legend(fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return os.fspath(out)


def _rows(history: Sequence[Mapping[str, float]] | str | os.PathLike[str]) -> list[dict[str, float]]:
    if not isinstance(history, (str, os.PathLike)):
        return [dict(r) for r in history]
    from agentsim.io.hdf5 import read_trajectory

    traj = read_trajectory(history)
    m = traj.metrics
    return [{"update": float(s), **{k: float(v[i]) for k, v in m.items() if k != "step"}}
            for i, s in enumerate(m["step"])]
