"""Population studies: a parameter grid times seeds gives one record per run.

Examples:
    >>> records = sweep("sir", {"beta": [0.02, 0.04]}, seeds=[1, 2], agents=2000, steps=30)
    >>> len(records), sorted(records[0])[:3]
    (4, ['I', 'R', 'S'])
    >>> records[0]["beta"], records[0]["seed"]
    (0.02, 1)

Each record holds the parameters, the seed and the metrics at the last step (or,
with ``keep="series"``, every metric's full series as a list); a vector metric's value is a
list of its K entries. Runs are independent
and sequential here; a sweep over a cluster (e.g. Ray) maps :func:`run_one` over the
same list of configurations.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from agentsim.core.catalog import get_model
from agentsim.core.model import Model
from agentsim.engine.simulation import Simulation
from agentsim.errors import ConfigError


def grid(params: Mapping[str, Sequence[Any]]) -> list[dict[str, Any]]:
    """Cartesian product of parameter values: ``{"a": [1, 2], "b": [3]} -> [{a:1,b:3}, {a:2,b:3}]``."""
    for name, values in params.items():
        if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
            raise ConfigError(f"sweep: values of '{name}' must be a list (got {values!r})")
    names = list(params)
    return [dict(zip(names, combo, strict=True)) for combo in itertools.product(*(list(params[n]) for n in names))]


def run_one(model: Model | str, params: Mapping[str, Any], seed: int, agents: int, steps: int,
            keep: str = "final", device: str = "cpu") -> dict[str, Any]:
    """One run of ``model`` with ``params`` and ``seed``; returns a flat record."""
    base = get_model(model) if isinstance(model, str) else model
    sim = Simulation(base.configure(params=params), agents=agents, seed=seed, device=device)
    metrics = sim.run(steps).metrics
    record: dict[str, Any] = {**params, "seed": seed, "agents": agents, "steps": steps}
    for key, series in metrics.items():
        if key == "step":
            continue
        record[key] = series.tolist() if keep == "series" else series[-1].tolist()  # a vector metric: a list
    return record


def sweep(model: Model | str, params: Mapping[str, Sequence[Any]], seeds: Iterable[int] = (0,),
          agents: int = 10_000, steps: int = 100, keep: str = "final", device: str = "cpu") -> list[dict[str, Any]]:
    """Run every combination of ``params`` for every seed; one record per run.

    Args:
        model: A :class:`~agentsim.core.model.Model` or a model name.
        params: Parameter name to the list of values to try (validated before any run).
        seeds: Seeds per combination.
        agents, steps: Size and length of every run.
        keep: ``"final"`` (metrics at the last step) or ``"series"`` (whole series as lists).
    """
    if keep not in ("final", "series"):
        raise ConfigError(f"sweep: keep must be 'final' or 'series' (got {keep!r})")
    base = get_model(model) if isinstance(model, str) else model
    combos = grid(params)
    for combo in combos:  # fail before running anything
        base.configure(params=combo)
    return [run_one(base, combo, seed, agents, steps, keep, device) for combo in combos for seed in seeds]
