"""Gradient estimators of an expectation over a stochastic run, ``d E[Q(run(theta))] / d theta``.

Each returns one sample per seed, so that its mean and standard error can be compared:

- :func:`crn_difference`: central finite differences with common random numbers (the same seed
  at ``theta +- h``: the counter-based RNG gives every agent the same draws). The reference.
- :func:`spsa`: simultaneous perturbation (all parameters at once, ±1 directions keyed by the
  seed), also with common random numbers: two runs per sample whatever the number of parameters.
- :func:`score_function`: ``(Q - b) d log P / d theta`` with a leave-one-out baseline ``b`` (the
  mean ``Q`` of the other seeds); unbiased. The run must accumulate the log-probability of its
  draws in a field (``relax="score"``; the ``flu`` model's ``person.logp``).
- :func:`pathwise`: autograd through the run with relaxed draws (``relax`` = straight_through,
  gumbel or gumbel_hard); biased, by how much is measured in ``tests/test_estimators.py``.

``Q`` is a function of the observed series ``[T, R]`` (see
:meth:`~agentsim.calibrate.objective.Objective.simulate`) to a scalar tensor; the loss of a fit
is one (``objective.loss_of``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import torch
from torch import Tensor

from agentsim.calibrate.objective import Objective
from agentsim.core.random import CounterRNG
from agentsim.errors import ConfigError

__all__ = ["crn_difference", "pathwise", "score_function", "spsa"]

Quantity = Callable[[Tensor], Tensor]


def _names(objective: Objective, at: Mapping[str, float]) -> list[str]:
    names = list(objective.fit)
    missing = [n for n in names if n not in at]
    if missing:
        raise ConfigError(f"estimator: no value for {', '.join(missing)} (fitted: {', '.join(names)})")
    return names


def crn_difference(objective: Objective, quantity: Quantity, at: Mapping[str, float], seeds: Sequence[int],
                   h: float = 0.02) -> Tensor:
    """``[K, p]``: per seed, ``(Q(theta + h e_j) - Q(theta - h e_j)) / 2h`` for every fitted parameter."""
    names = _names(objective, at)
    out = torch.zeros(len(seeds), len(names), dtype=torch.float64)
    for k, seed in enumerate(seeds):
        for j, name in enumerate(names):
            up = float(quantity(objective.simulate({**at, name: at[name] + h}, seed)[0]))
            down = float(quantity(objective.simulate({**at, name: at[name] - h}, seed)[0]))
            out[k, j] = (up - down) / (2 * h)
    return out


def spsa(objective: Objective, quantity: Quantity, at: Mapping[str, float], seeds: Sequence[int],
         c: float = 0.02) -> Tensor:
    """``[K, p]``: per seed, ``(Q(theta + c d) - Q(theta - c d)) / 2c * d`` with ``d`` ±1 per
    parameter (keyed by the seed); unbiased up to O(c^2) when the directions are independent.
    """
    names = _names(objective, at)
    rng = CounterRNG(0)
    out = torch.zeros(len(seeds), len(names), dtype=torch.float64)
    for k, seed in enumerate(seeds):
        d = torch.where(rng.uniform(torch.arange(len(names)), seed, "spsa") < 0.5, -1.0, 1.0).to(torch.float64)
        up = float(quantity(objective.simulate({n: at[n] + c * float(d[j]) for j, n in enumerate(names)}, seed)[0]))
        down = float(quantity(objective.simulate({n: at[n] - c * float(d[j]) for j, n in enumerate(names)}, seed)[0]))
        out[k] = (up - down) / (2 * c) * d
    return out


def score_function(objective: Objective, quantity: Quantity, at: Mapping[str, float], seeds: Sequence[int],
                   log_prob: str = "person.logp") -> Tensor:
    """``[K, p]``: ``(Q_k - mean of the other Q) d log P_k / d theta`` (needs two seeds or more).

    Args:
        log_prob: The ``population.field`` where the run sums the log-probability of its draws.
    """
    names = _names(objective, at)
    if len(seeds) < 2:
        raise ConfigError("score_function: the leave-one-out baseline needs at least two seeds")
    pop, _, field = log_prob.partition(".")
    values, scores = [], []
    for seed in seeds:
        series, sim = objective.simulate({n: at[n] for n in names}, seed, grad=True, relax="score")
        grads = sim.parameter_gradients(sim.view()[pop][field].sum())  # log P: summed over ranks
        scores.append(torch.stack([grads[n] for n in names]))
        values.append(float(quantity(series.detach())))
    q = torch.tensor(values, dtype=torch.float64)
    baseline = (q.sum() - q) / (len(seeds) - 1)
    return (q - baseline).unsqueeze(1) * torch.stack(scores)


def pathwise(objective: Objective, quantity: Quantity, at: Mapping[str, float], seeds: Sequence[int],
             relax: str = "straight_through") -> Tensor:
    """``[K, p]``: autograd of ``Q`` through a run whose draws are relaxed by ``relax``."""
    names = _names(objective, at)
    out = torch.zeros(len(seeds), len(names), dtype=torch.float64)
    for k, seed in enumerate(seeds):
        series, sim = objective.simulate({n: at[n] for n in names}, seed, grad=True, relax=relax)
        grads = sim.parameter_gradients(quantity(series))
        out[k] = torch.stack([grads[n] for n in names])
    return out
