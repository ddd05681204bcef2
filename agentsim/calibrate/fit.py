"""Fitting parameters to data: Nelder-Mead (scipy) or SPSA on the common-random-number loss, or
Adam on pathwise gradients through relaxed draws; an uncertainty from the loss's curvature; a
plot of the data against the fitted model's band.

Every method works in the logarithm of the fitted parameters (they are rates: positive), within
``bounds``. On several ranks every rank runs the same optimizer on the same (exact) losses, so
the fit has the same numbers on any number of ranks.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch

from agentsim.calibrate.objective import Objective
from agentsim.core.random import CounterRNG
from agentsim.errors import ConfigError
from agentsim.grad.autograd import reach_exchanges, sum_gradients

__all__ = ["METHODS", "FitResult", "fit", "plot_fit"]

METHODS = ("nelder-mead", "spsa", "adam")


@dataclass
class FitResult:
    """A calibration's outcome.

    Attributes:
        params: Fitted values by name.
        loss: The loss at the fit.
        stderr: Standard errors from the curvature (NaN where the curvature is not positive).
        method, evaluations, seconds: How it got there (runs of the ensemble, wall time).
        start: The starting values.
        history: ``[(evaluation, loss, {name: value})]`` of every improvement.
        derived: ``R0 = beta / gamma`` when both are fitted.
        kept: Replicates that took off at the fit, out of ``replicates``.
    """

    params: dict[str, float]
    loss: float
    stderr: dict[str, float]
    method: str
    evaluations: int
    seconds: float
    start: dict[str, float]
    history: list[tuple[int, float, dict[str, float]]] = field(default_factory=list)
    derived: dict[str, float] = field(default_factory=dict)
    kept: int = 0
    replicates: int = 0
    settings: dict[str, Any] = field(default_factory=dict)

    def to_json(self, path: str | os.PathLike[str]) -> None:
        """Write ``{"params": ..., "loss": ..., "stderr": ..., ...}`` to ``path``."""
        with open(path, "w") as f:
            json.dump(asdict(self), f, indent=1)

    def summary(self) -> str:
        """Lines: each parameter with its standard error, derived values, the loss, the cost."""
        lines = [f"{k} = {v:.4g} +- {self.stderr.get(k, float('nan')):.2g}" for k, v in self.params.items()]
        lines += [f"{k} = {v:.4g}" for k, v in self.derived.items()]
        lines.append(f"loss = {self.loss:.6g} ({self.settings.get('loss', '')}); {self.method}, "
                     f"{self.evaluations} evaluations, {self.seconds:.1f} s; {self.kept} of {self.replicates} "
                     "replicates took off")
        return "\n".join(lines)


def fit(objective: Objective, method: str = "nelder-mead", *, start: Mapping[str, float] | None = None,
        bounds: Mapping[str, tuple[float, float]] | None = None, iterations: int | None = None,
        seed: int = 0, progress: bool = False, lr: float = 0.05,
        log: Callable[[str], None] | None = None) -> FitResult:
    """Fit ``objective.fit`` to the data.

    Args:
        method: ``nelder-mead`` (scipy; the default), ``spsa`` or ``adam`` (pathwise gradients
            through straight-through draws; biased, see the README).
        start: Starting values (default: the model's values).
        bounds: ``name -> (low, high)``, both > 0 (default ``(1e-6, 1e6)``).
        iterations: Nelder-Mead: at most this many evaluations (default 200); SPSA and Adam:
            iterations (default 60 and 40).
        seed: Draws SPSA's directions.
        progress: One line per improvement on stderr.
    """
    if method not in METHODS:
        raise ConfigError(f"method: expected one of {', '.join(METHODS)} (got {method!r})")
    names = list(objective.fit)
    x0 = {**objective.start_values(), **dict(start or {})}
    for name, value in x0.items():
        if not (isinstance(value, (int, float)) and value > 0 and math.isfinite(value)):
            raise ConfigError(f"start: {name} must be a finite number > 0 (got {value!r})")
    box = {name: (1e-6, 1e6) for name in names}
    for name, (low, high) in dict(bounds or {}).items():
        if name not in box or not 0 < low < high:
            raise ConfigError(f"bounds: expected 0 < low < high for a fitted parameter (got {name}: {low}, {high})")
        box[name] = (float(low), float(high))
    lo = np.log([box[n][0] for n in names])
    hi = np.log([box[n][1] for n in names])
    z0 = np.clip(np.log([x0[n] for n in names]), lo, hi)
    say = log or (lambda line: print(line, file=sys.stderr, flush=True))
    history: list[tuple[int, float, dict[str, float]]] = []
    count = [0]
    t0 = time.perf_counter()

    def values_of(z: np.ndarray) -> dict[str, float]:
        return {n: float(math.exp(v)) for n, v in zip(names, np.clip(z, lo, hi), strict=True)}

    def loss_at(z: np.ndarray) -> float:
        count[0] += 1
        values = values_of(z)
        loss = objective(values)
        if not history or loss < history[-1][1]:
            history.append((count[0], loss, values))
            if progress:
                shown = ", ".join(f"{k}={v:.4g}" for k, v in values.items())
                say(f"[{count[0]}] loss {loss:.6g} at {shown} ({time.perf_counter() - t0:.1f} s)")
        return loss

    if method == "nelder-mead":
        try:
            from scipy.optimize import minimize
        except ImportError:  # pragma: no cover - scipy is in the calibrate extra
            raise ConfigError('method nelder-mead needs scipy: pip install "agentsim[calibrate]" '
                              "(or use --method spsa)") from None
        simplex = np.array([z0] + [z0 + 0.15 * np.eye(len(names))[k] for k in range(len(names))])
        minimize(loss_at, z0, method="Nelder-Mead", bounds=list(zip(lo, hi, strict=True)),
                 options={"initial_simplex": simplex, "maxfev": iterations or 200, "xatol": 2e-3, "fatol": 1e-6})
    elif method == "spsa":
        _spsa(loss_at, z0, lo, hi, iterations or 60, CounterRNG(seed))
    else:
        _adam(objective, names, z0, lo, hi, iterations or 40, lr, loss_at)
    best_loss, best = history[-1][1], history[-1][2]
    series = objective.ensemble(best)
    kept = objective.kept(series)
    stderr = _curvature_stderr(objective, best)
    derived = {"R0": best["beta"] / best["gamma"]} if {"beta", "gamma"} <= set(best) else {}
    return FitResult(best, best_loss, stderr, method, count[0], time.perf_counter() - t0, {n: x0[n] for n in names},
                     history, derived, int(kept.sum()), int(kept.numel()),
                     {"loss": objective.loss, "metric": objective.metric, "seeds": list(objective.seeds),
                      "agents": objective.agents, "takeoff": objective.takeoff, "replicates": objective.replicates,
                      "world_size": objective.comm.world_size, "params": dict(objective.params)})


def _spsa(loss_at: Callable[[np.ndarray], float], z0: np.ndarray, lo: np.ndarray, hi: np.ndarray, iterations: int,
          rng: CounterRNG) -> None:
    """Spall's SPSA (gains a/(k+1+A)^0.602, c/(k+1)^0.101) on the log-parameters; the
    directions are ±1 draws keyed by the iteration.
    """
    z = z0.copy()
    a, c, big_a = 0.02, 0.1, iterations / 10
    for k in range(iterations):
        delta = torch.where(rng.uniform(torch.arange(len(z)), k, "spsa") < 0.5, -1.0, 1.0).numpy()
        ck = c / (k + 1) ** 0.101
        up, down = loss_at(np.clip(z + ck * delta, lo, hi)), loss_at(np.clip(z - ck * delta, lo, hi))
        g = (up - down) / (2 * ck) * delta
        scale = max(abs(up), abs(down), 1e-12)
        z = np.clip(z - a / (k + 1 + big_a) ** 0.602 * g / scale * 10.0, lo, hi)
    loss_at(z)


def _adam(objective: Objective, names: Sequence[str], z0: np.ndarray, lo: np.ndarray, hi: np.ndarray,
          iterations: int, lr: float, loss_at: Callable[[np.ndarray], float]) -> None:
    """Adam on the log-parameters with pathwise gradients (straight-through draws; a model without
    a ``relax`` parameter runs as it is).
    """
    relax = "straight_through" if "relax" in objective.model.param_table.params else None
    z = torch.tensor(z0, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.Adam([z], lr=lr)
    for _ in range(iterations):
        values = {n: float(v) for n, v in zip(names, z.detach().exp(), strict=True)}
        grads = torch.zeros(len(names), dtype=torch.float64)
        runs = [objective.simulate(values, s, grad=True, relax=relax) for s in objective.seeds]
        loss = objective.loss_of(torch.cat([series for series, _ in runs], dim=1))
        for _, sim in runs:  # every rank's exchanges join the backward pass (see distributed.autograd)
            loss = reach_exchanges(loss, sim.partition.grad_links)
        leaves = [sim.grad_params[n] for _, sim in runs for n in names]
        got = torch.autograd.grad(loss, leaves, allow_unused=True)
        summed = sum_gradients([g if g is not None else torch.zeros((), dtype=torch.float64) for g in got],
                               objective.comm)
        for k, g in enumerate(summed):
            grads[k % len(names)] += g * values[names[k % len(names)]]  # d/dlog x = x d/dx
        opt.zero_grad()
        z.grad = grads
        opt.step()
        with torch.no_grad():
            z.clamp_(torch.from_numpy(lo), torch.from_numpy(hi))
        loss_at(z.detach().numpy().copy())


def _curvature_stderr(objective: Objective, best: Mapping[str, float], rel: float = 0.03) -> dict[str, float]:
    """Standard errors from the Hessian of the loss by central differences with common random
    numbers (steps of ``rel`` times each value): the inverse Hessian of the negative
    log-likelihood; for ``sse`` the Gaussian one with variance SSE / (T - p).
    """
    names = list(best)
    p = len(names)
    x = np.array([best[n] for n in names])
    h = rel * x

    def f(dx: np.ndarray) -> float:
        return objective({n: float(v) for n, v in zip(names, x + dx, strict=True)})

    f0 = f(np.zeros(p))
    hess = np.zeros((p, p))
    for i in range(p):
        e_i = np.eye(p)[i] * h[i]
        hess[i, i] = (f(e_i) - 2 * f0 + f(-e_i)) / h[i] ** 2
        for j in range(i):
            e_j = np.eye(p)[j] * h[j]
            hess[i, j] = hess[j, i] = (f(e_i + e_j) - f(e_i - e_j) - f(-e_i + e_j) + f(-e_i - e_j)) / (4 * h[i] * h[j])
    if objective.loss == "sse":
        dof = max(len(objective.data.values) - p, 1)
        hess = hess / (2 * f0 / dof) if f0 > 0 else hess * math.inf
    try:
        cov = np.linalg.inv(hess)
        var = np.diag(cov)
    except np.linalg.LinAlgError:
        var = np.full(p, np.nan)
    return {n: float(math.sqrt(v)) if v > 0 else float("nan") for n, v in zip(names, var, strict=True)}


def plot_fit(objective: Objective, result: FitResult, path: str | os.PathLike[str],
             published: Mapping[str, str] | None = None) -> None:
    """The data against the fitted model: the mean of the replicates kept, their 10-90 % band."""
    from agentsim.io.figures import pyplot

    plt = pyplot()

    series = objective.ensemble(result.params)
    kept = series[:, objective.kept(series)].numpy()
    times = np.array(objective.data.times)
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    if kept.shape[1]:
        low, high = np.quantile(kept, [0.1, 0.9], axis=1)
        ax.fill_between(times, low, high, alpha=0.25, label="model, 10-90 % of replicates")
        ax.plot(times, kept.mean(axis=1), label="model mean")
    ax.plot(times, objective.data.values, "o", color="black", label=f"data ({objective.data.name})")
    shown = ", ".join(f"{k} {v:.3g}" for k, v in {**result.params, **result.derived}.items())
    ax.set_title(f"{objective.model.name}: {shown}", fontsize=9)
    ax.set_xlabel("time")
    ax.set_ylabel(objective.metric)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
