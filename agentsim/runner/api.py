"""Run a model in one call: :func:`run` (one process, or ``nprocs`` local processes)."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any

from agentsim.core.catalog import get_model
from agentsim.core.model import Model
from agentsim.engine.simulation import RunResult, Simulation
from agentsim.errors import ConfigError

__all__ = ["run"]


def run(model: Model | str, agents: int | None = None, steps: int = 100, seed: int = 0, *,
        params: Mapping[str, Any] | None = None, out: str | os.PathLike[str] | None = None,
        record: Iterable[str] | None = None, every: int | None = None, device: str = "cpu",
        nprocs: int = 1, partition: str | None = None, progress: bool = False, check: bool = False,
        **partition_options: Any) -> RunResult:
    """Run ``model`` for ``steps`` steps and return its :class:`~agentsim.engine.simulation.RunResult`.

    Args:
        model: A :class:`~agentsim.core.model.Model` or a model name (``"sir"``, ``"package.module:ATTR"``).
        agents: Agents at step 0 (default: the model's).
        steps, seed: Length of the run and its seed.
        params: Parameter overrides (checked: a misspelt name is an error).
        out: An HDF5 trajectory file to write (see :mod:`agentsim.io.hdf5`).
        record, every: What to record and how often (see :meth:`Simulation.run <agentsim.Simulation.run>`).
        device: ``"cpu"`` or ``"cuda"``.
        nprocs: Local processes (> 1: :func:`agentsim.launch`; the result is bitwise the same).
        partition: With ``nprocs > 1``: ``"data"`` (default) or ``"spatial"``.
        progress: Show a progress bar (one process, on a terminal).
        check: The check mode (:mod:`agentsim.engine.contract`): every substep call checked against the contract
            that makes results the same on any number of processes; several times slower.
        partition_options: ``layout``, ``balance_every``, ``balance_threshold``, ``bins``, ``overlap``
            (``"spatial"``).

    Examples:
        >>> result = run("randomwalk", agents=100, steps=3, seed=1, params={"step_size": 0.5})
        >>> result.metrics["step"].tolist(), result.world_size
        ([0, 1, 2, 3], 1)
    """
    resolved = get_model(model) if isinstance(model, str) else model
    if params:
        resolved = resolved.configure(params=params)
    if isinstance(nprocs, bool) or not isinstance(nprocs, int) or nprocs < 1:
        raise ConfigError(f"nprocs: expected an int >= 1 (got {nprocs!r})")
    if nprocs > 1:
        from agentsim.runner.launch import launch

        return launch(resolved, nprocs, agents=agents, steps=steps, seed=seed, out=out, record=record,
                      every=every, partition=partition or "data", device=device, check=check, **partition_options)
    if partition is not None or partition_options:
        raise ConfigError("partition and its options need nprocs > 1 (one process keeps every agent)")
    sim = Simulation(resolved, agents=agents, seed=seed, device=device, check=check)
    return sim.run(steps, out=out, record=record, every=every, progress=progress)
