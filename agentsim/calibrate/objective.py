"""What a calibration minimizes: a model run at given parameter values, observed at the data's
times, compared with the data by a loss.

A run is observed through one of the model's metrics, as the trajectory reports it
(``RunResult.metrics[metric]``): the exact sum over agents and ranks of a ``reduce="sum"``
metric, the mean of a ``reduce="mean"`` one, or a derived metric (``@model.derived``) computed
from those values. ``replicates="school"`` names an integer field of the metric's population
that splits the agents into independent replicates of the system inside one run (the ``flu``
model's schools): the metric is then computed per replicate (the sum or the mean of the
replicate's agents; a derived metric from the per-replicate values of the metrics and
``n_<population>`` it reads), so one vectorized run gives an ensemble. Seeds add more runs.
``takeoff`` leaves out replicates whose series never
exceeds it (an outbreak that died out: the data are of one that took off); the model's mean is
the mean over the replicates kept.

Every seed, uid, step and stream gives the same draw at any parameter values, so the loss at
two parameter values compares the same randomness (common random numbers): the loss is a
deterministic function of the parameters for a fixed set of seeds.

Losses of the mean series ``m`` against the data ``y`` (``T`` times):
``sse`` = sum (y - m)^2; ``poisson`` = sum m - y log m (negative log-likelihood up to a
constant); ``negbin`` = the negative-binomial negative log-likelihood with dispersion ``k``
(variance m + m^2 / k), up to a constant.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor

from agentsim.calibrate.data import Series
from agentsim.core import ops
from agentsim.core.comm import Comm, LocalComm
from agentsim.core.context import MetricsContext
from agentsim.core.metrics import Derived, ExactSum, Metric
from agentsim.core.model import Model
from agentsim.engine.simulation import Simulation
from agentsim.errors import ConfigError, did_you_mean
from agentsim.grad.autograd import sum_over_ranks

__all__ = ["LOSSES", "Objective", "loss_value"]

LOSSES = ("sse", "poisson", "negbin")
AGGREGATES = ("mean", "each")
_FRAC_BITS = 24


def loss_value(kind: str, mean: Tensor, data: Tensor, dispersion: float = 10.0) -> Tensor:
    """The loss ``kind`` (see the module docstring) of the model's mean series ``mean`` ``[T]``
    against ``data`` ``[T]`` (float64, differentiable in ``mean``).
    """
    if kind == "sse":
        return ((data - mean) ** 2).sum()
    m = mean.clamp_min(1e-9)
    if kind == "poisson":
        return (m - data * torch.log(m)).sum()
    if kind == "negbin":
        k = dispersion
        return (-(torch.lgamma(data + k) - torch.lgamma(torch.tensor(k, dtype=m.dtype)))
                - k * torch.log(k / (k + m)) - data * torch.log(m / (k + m))).sum()
    raise ConfigError(f"loss: expected one of {', '.join(LOSSES)} (got {kind!r})")


@dataclass
class Objective:
    """A model against a data series.

    Attributes:
        model: The model (any parameters not fitted are taken from ``params`` or its defaults).
        data: The observations.
        fit: Names of the float parameters fitted.
        metric: The model's metric compared with the data.
        agents: Agents per run (default: the model's).
        seeds: One run per seed.
        params: Fixed parameter overrides.
        loss: ``sse``, ``poisson`` or ``negbin``.
        steps_per_time: Steps per unit of the data's time (default: the model's
            ``steps_per_day`` parameter if it has one, else 1).
        replicates: An integer field of the metric's population that keys replicates (or None).
        takeoff: Replicates whose series never exceeds this are left out of the mean (None: keep all).
        dispersion: The negative binomial's ``k``.
        aggregate: ``"mean"``: the loss of the kept replicates' mean series; ``"each"``: the mean
            of every kept replicate's own loss (the expected loss of one realization).
        comm, partition: Where each run runs (every rank gets the same numbers).
    """

    model: Model
    data: Series
    fit: tuple[str, ...]
    metric: str
    agents: int | None = None
    seeds: tuple[int, ...] = (0,)
    params: Mapping[str, Any] = field(default_factory=dict)
    loss: str = "sse"
    steps_per_time: int | None = None
    replicates: str | None = None
    takeoff: float | None = None
    dispersion: float = 10.0
    aggregate: str = "mean"
    comm: Comm = field(default_factory=LocalComm)
    partition: str | None = None

    def __post_init__(self) -> None:
        if self.loss not in LOSSES:
            raise ConfigError(f"loss: expected one of {', '.join(LOSSES)} (got {self.loss!r})")
        if not self.fit:
            raise ConfigError("fit: name at least one parameter to fit")
        if self.aggregate not in AGGREGATES:
            raise ConfigError(f"aggregate: expected one of {', '.join(AGGREGATES)} (got {self.aggregate!r})")
        table = self.model.param_table.params
        floats = [n for n, p in table.items() if p.type is float]
        for name in self.fit:
            if name not in floats:
                raise ConfigError(f"fit: {name!r} is not a float parameter of model '{self.model.name}' "
                                  f"(float parameters: {', '.join(floats) or 'none'})")
        self._metrics = [m for m in self.model._metrics if isinstance(m, Metric)]  # noqa: SLF001
        derived = [d for d in self.model._derived if d.name]  # noqa: SLF001
        names = [m.name for m in self._metrics]
        derived_names = [str(d.name) for d in derived]
        if self.metric in names:
            self._metric: Metric | None = self._metrics[names.index(self.metric)]
            self._derived: list[Derived] = []
            if getattr(self._metric, "hist", None) is not None:
                raise ConfigError(f"metric: {self.metric!r} of model '{self.model.name}' is a histogram (counts per "
                                  "bin); calibration compares one number per time: a scalar metric or a derived "
                                  f"metric (scalar metrics: {', '.join(self._scalar_names()) or 'none'})")
        elif self.metric in derived_names:
            self._metric, self._derived = None, derived[:derived_names.index(self.metric) + 1]
        else:
            known = f"metrics: {', '.join(names) or 'none'}" + (f"; derived: {', '.join(derived_names)}"
                                                                  if derived_names else "")
            raise ConfigError(f"metric: model '{self.model.name}' has no metric {self.metric!r} ({known})."
                              + did_you_mean(self.metric, names + derived_names))
        if not self.seeds:
            raise ConfigError("seeds: expected at least one seed")
        base = self.model.configure(params=dict(self.params)).params if self.params else self.model.params
        spt = self.steps_per_time
        if spt is None:
            spt = int(base["steps_per_day"]) if "steps_per_day" in base else 1
        self.steps = [round(t * spt) for t in self.data.times]
        if any(abs(s - t * spt) > 1e-9 or s < 1 for s, t in zip(self.steps, self.data.times, strict=True)):
            raise ConfigError(f"data: every time times steps_per_time ({spt}) must be a whole step >= 1 "
                              f"(times {list(self.data.times)})")
        self.observed = torch.tensor(self.data.values, dtype=torch.float64)

    # ------------------------------------------------------------------ runs
    def start_values(self) -> dict[str, float]:
        """The fitted parameters' values in ``params`` or the model's defaults."""
        base = self.model.configure(params=dict(self.params)).params if self.params else self.model.params
        return {name: float(base[name]) for name in self.fit}

    def simulate(self, values: Mapping[str, Any], seed: int, *, grad: bool = False,
                 relax: str | None = None) -> tuple[Tensor, Simulation]:
        """One run at ``values``: the metric ``[T, R]`` (float64) at the data's times, per replicate
        (R = 1 without ``replicates``), and the simulation. With ``grad`` the fitted parameters are
        differentiable (``sim.grad_params``; values given as floats) and the series carries gradients.
        """
        params = {**self.params, **{k: float(v) for k, v in values.items()}}
        if relax is not None:
            params["relax"] = relax
        sim = Simulation(self.model, self.agents, seed, params=params, comm=self.comm, partition=self.partition,
                         grad=list(self.fit) if grad else False)
        rows = []
        for target in self.steps:
            while sim.state.step < target:
                sim.step()
            rows.append(self._observe(sim, grad))
        return torch.stack(rows), sim

    def _scalar_names(self) -> list[str]:
        return [m.name for m in self._metrics if getattr(m, "hist", None) is None]

    def _observe(self, sim: Simulation, grad: bool) -> Tensor:
        """``[R]`` float64: the metric now, per replicate, as the trajectory reports it."""
        view = sim.view()
        metrics = self._metrics if self._metric is None else [self._metric]
        parts: dict[str, _Part] = {}
        why: dict[str, str] = {}  # the metrics a derived metric cannot read, and why
        for metric in metrics:
            try:
                parts[metric.name] = self._part(metric, view, grad)
            except _Unusable as e:
                if self._metric is not None:
                    raise ConfigError(f"metric '{metric.name}': {e}") from None
                why[metric.name] = str(e)
        sizes = self._population_keys(view, why) if self._metric is None else {}
        count = self._replicate_count([p.key for p in parts.values()] + list(sizes.values()))
        totals = self._totals(parts, sizes, count, grad)
        if self._metric is not None:
            target: Tensor = self._value(self._metric, totals, 0, grad)
            return target
        rows = []
        for r in range(count):  # the trajectory's row (metrics.metric_row), one per replicate
            row = _Row(self.model.name, why)
            row["step"] = sim.state.step
            for name in sizes:
                row[f"n_{name}"] = int(totals[f"n_{name}"][r])
            for metric in self._metrics:
                if metric.name in parts:
                    row[metric.name] = self._value(metric, totals, r, grad)
            for d in self._derived:
                name = str(d.name)
                try:
                    row[name] = d.value(row.copy_for(name), sim.params, sim.space)
                except _Unusable as e:
                    if name == self.metric:
                        raise ConfigError(f"metric: derived metric {name!r} reads {e}") from None
                    why[name] = f"it reads {e}"
            rows.append(self._derived_value(row[self.metric], grad))
        return torch.stack(rows)

    def _part(self, metric: Metric, view: MetricsContext, grad: bool) -> _Part:
        """This rank's values of ``metric``, keyed by replicate (raises :class:`_Unusable`)."""
        if getattr(metric, "hist", None) is not None:
            raise _Unusable("a histogram (counts per bin), not one number per replicate")
        if getattr(metric, "groups", None) is not None:
            raise _Unusable("a metric per group (a sum per group), not one number per replicate: fit a derived "
                            "metric of it")
        values = metric.fn(view)
        if isinstance(values, ExactSum):
            if self.replicates is not None or grad:
                how = "split by replicates" if self.replicates is not None else "carry gradients"
                raise _Unusable("calibration needs one value per agent ([n]) to " + how + "; got an ExactSum "
                                "(a sum, not per-agent values)")
            total = values.total.to(torch.int64).cpu().reshape(1)
            return _Part(torch.zeros(1, dtype=torch.int64), total, int(values.n_values), True, exact=True)
        if not isinstance(values, Tensor) or values.dim() > 2:
            got = f"shape {list(values.shape)}" if isinstance(values, Tensor) else type(values).__name__
            raise _Unusable(f"calibration needs one value per agent ([n], or [n, K] for a vector); got {got}")
        if values.dim() == 2 and self._metric is not None:
            raise _Unusable(f"a vector metric ([n, K] values, K = {values.shape[1]}); calibration compares one "
                            "number per time: declare a scalar metric or a derived metric of this one")
        values = values.reshape(1) if values.dim() == 0 else values
        if self.replicates is None:
            key = torch.zeros(values.shape[0], dtype=torch.int64, device=values.device)
        else:
            key = self._replicate_key(view, values.shape[0], metric.name)
        return _Part(key, values, None, values.is_floating_point())

    def _replicate_key(self, view: MetricsContext, n: int, metric: str) -> Tensor:
        name = str(self.replicates)
        for pop in view.state.populations.values():
            spec = pop.specs.get(name)
            if spec is not None and not spec.dtype.is_floating_point and pop.n == n:
                return pop[name].to(torch.int64)
        raise _Unusable(f"replicates: no population holds an integer field {self.replicates!r} with one row per "
                        f"value of metric '{metric}'")

    def _population_keys(self, view: MetricsContext, why: dict[str, str]) -> dict[str, Tensor]:
        """Population name to its replicate key ``[n]`` (for ``n_<population>`` per replicate)."""
        keys = {}
        for name, pop in view.state.populations.items():
            if self.replicates is None:
                keys[name] = torch.zeros(pop.n, dtype=torch.int64)
                continue
            spec = pop.specs.get(self.replicates)
            if spec is None or spec.dtype.is_floating_point:
                why[f"n_{name}"] = (f"population '{name}' has no integer field {self.replicates!r}, so its count "
                                    "cannot be split by replicates")
                continue
            keys[name] = pop[self.replicates].to(torch.int64)
        return keys

    def _replicate_count(self, keys: Sequence[Tensor]) -> int:
        if not hasattr(self, "_count"):
            local = max((int(k.max()) + 1 for k in keys if k.numel()), default=0)
            if self.comm.world_size > 1:
                got = self.comm.all_gather_rows({"m": torch.tensor([[local]])}, rows_per_rank=1)["m"]
                local = int(got.max())
            self._count = max(local, 1)
        for k in keys:
            if k.numel() and (int(k.min()) < 0 or int(k.max()) >= self._count):
                raise ConfigError(f"replicates: expected {self.replicates!r} in [0, {self._count - 1}] as at the "
                                  f"first observation (got values in [{int(k.min())}, {int(k.max())}])")
        return self._count

    def _totals(self, parts: Mapping[str, _Part], sizes: Mapping[str, Tensor], count: int,
                grad: bool) -> dict[str, Tensor]:
        """Every rank's sums per replicate: ``name`` ``[R]`` or ``[R, K]`` (float64: floats, decoded
        from fixed point or, with ``grad``, float sums that carry gradients; int64: integers) and
        ``name#count`` ``[R]`` int64 (the number of values), ``n_<population>`` ``[R]`` int64.
        """
        exact: dict[str, Tensor] = {}  # int64, summed exactly over ranks
        floats: dict[str, Tensor] = {}  # float64 with autograd (grad only)
        for name, part in parts.items():
            shape = (count, *part.values.shape[1:])
            key = part.key.to(part.values.device)
            if part.exact:
                exact[name] = part.values
            elif grad and part.is_float:
                floats[name] = torch.zeros(shape, dtype=torch.float64, device=key.device).index_add(
                    0, key, part.values.to(torch.float64))
            else:
                fixed = ops.to_fixed(part.values, _FRAC_BITS) if part.is_float else part.values.to(torch.int64)
                exact[name] = torch.zeros(shape, dtype=torch.int64, device=key.device).index_add(0, key, fixed)
            exact[name + _COUNT] = torch.tensor([part.n_values], dtype=torch.int64) if part.n_values is not None \
                else torch.bincount(part.key, minlength=count).to(torch.int64)
        for name, key in sizes.items():
            exact[f"n_{name}"] = torch.bincount(key.cpu(), minlength=count).to(torch.int64)
        out = dict(zip(exact, _sum_int64([t.cpu() for t in exact.values()], self.comm), strict=True))
        for name, part in parts.items():
            if part.is_float and name not in floats:
                out[name] = out[name].to(torch.float64) * 2.0**-_FRAC_BITS
        if floats:  # float sums that autograd follows (over ranks: the identity backward)
            flat = sum_over_ranks(torch.cat([t.reshape(-1) for t in floats.values()]), self.comm)
            for name, piece in zip(floats, flat.split([t.numel() for t in floats.values()]), strict=True):
                out[name] = piece.reshape(floats[name].shape)
        return out

    def _value(self, metric: Metric, totals: Mapping[str, Tensor], r: int, grad: bool) -> Any:
        """``metric`` as the trajectory reports it: every replicate's, ``[R]`` float64 (the target),
        or replicate ``r``'s for a derived metric's row (a number, or a numpy array for a vector,
        as the trajectory's row holds them; tensors that carry gradients with ``grad``).
        """
        total, n = totals[metric.name], totals[metric.name + _COUNT].to(totals[metric.name].device)
        if self._metric is not None:
            total = total.to(torch.float64)
            if metric.reduce == "mean":
                return torch.where(n > 0, total / n.clamp_min(1), math.nan)
            return total
        value: Any = total[r]
        n_r = int(n[r])
        if not (grad and value.requires_grad):
            value = value.tolist()
        if metric.reduce == "mean":
            if isinstance(value, list):
                value = [v / n_r if n_r else math.nan for v in value]
            else:
                value = value / n_r if n_r else value * math.nan
        return np.asarray(value) if isinstance(value, list) else value

    def _derived_value(self, value: Any, grad: bool) -> Tensor:
        """A derived metric's value as a 0-d float64 tensor (checked: one number; with ``grad``,
        carrying gradients).
        """
        shape = tuple(getattr(value, "shape", ()))
        if isinstance(value, (list, tuple)) or shape not in ((), (1,)):
            got = f"shape {list(shape)}" if shape else f"{len(value)} values"
            raise ConfigError(f"metric: derived metric {self.metric!r} gives a vector ({got}); calibration "
                              "compares one number per time")
        if grad and not (isinstance(value, Tensor) and value.requires_grad):
            got = "a tensor without autograd history" if isinstance(value, Tensor) else type(value).__name__
            raise ConfigError(f"metric: derived metric {self.metric!r} cannot carry gradients: it returned {got} "
                              "(float(), max(), math and numpy functions drop them; compute it with torch "
                              "operations on the float metrics it reads), or fit it with --method nelder-mead or "
                              "spsa")
        if isinstance(value, Tensor):
            return value.reshape(()).to(torch.float64)
        try:
            return torch.tensor(float(value), dtype=torch.float64)
        except (TypeError, ValueError):
            raise ConfigError(f"metric: derived metric {self.metric!r} gives {type(value).__name__}; expected a "
                              "number") from None

    # ------------------------------------------------------------------ the loss
    def ensemble(self, values: Mapping[str, Any], *, grad: bool = False, relax: str | None = None,
                 seeds: Sequence[int] | None = None) -> Tensor:
        """``[T, R_total]``: the series of every replicate of every seed."""
        runs = [self.simulate(values, s, grad=grad, relax=relax)[0] for s in (seeds or self.seeds)]
        return torch.cat(runs, dim=1)

    def kept(self, series: Tensor) -> Tensor:
        """``[R]`` bool: the replicates that took off (all without ``takeoff``)."""
        if self.takeoff is None:
            return torch.ones(series.shape[1], dtype=torch.bool)
        return (series.detach().cpu() > self.takeoff).any(dim=0)

    def loss_of(self, series: Tensor) -> Tensor:
        """The loss of an ensemble ``[T, R]`` against the data (inf if no replicate took off)."""
        keep = self.kept(series)
        if not bool(keep.any()):
            return torch.tensor(math.inf, dtype=torch.float64)
        kept = series[:, keep.to(series.device)]
        observed = self.observed.to(kept.device)
        if self.aggregate == "each":
            return torch.stack([loss_value(self.loss, kept[:, r], observed, self.dispersion)
                                for r in range(kept.shape[1])]).mean()
        loss: Tensor = loss_value(self.loss, kept.mean(dim=1), observed, self.dispersion)
        return loss

    def __call__(self, values: Mapping[str, Any]) -> float:
        """The loss at ``values`` over every seed (hard draws; the same on every rank)."""
        return float(self.loss_of(self.ensemble(values)))


_COUNT = "#count"  # a metric's number of values in :meth:`Objective._totals` (metric names cannot hold '#')


class _Unusable(Exception):
    """A metric that calibration cannot observe here (the message says why)."""


@dataclass
class _Part:
    """This rank's values of one metric: replicate ``key`` ``[n]`` and ``values`` ``[n]`` or
    ``[n, K]``; or (``exact``) an :class:`~agentsim.core.metrics.ExactSum`'s ``[1]`` int64 fixed-point
    total with its ``n_values``.
    """

    key: Tensor
    values: Tensor
    n_values: int | None
    is_float: bool
    exact: bool = False


class _Row(dict[str, Any]):
    """One replicate's metrics as a derived metric reads them: one it cannot get raises
    :class:`_Unusable`, saying why.
    """

    def __init__(self, model: str, why: Mapping[str, str], reader: str = "") -> None:
        super().__init__()
        self.model, self.why, self.reader = model, why, reader

    def copy_for(self, reader: str) -> _Row:
        """A copy for the derived metric ``reader`` (the engine passes each a copy too)."""
        row = _Row(self.model, self.why, reader)
        row.update(self)
        return row

    def __missing__(self, key: str) -> Any:
        if key in self.why:
            raise _Unusable(f"{key!r}, which calibration cannot get: {self.why[key]}")
        raise _Unusable(f"{key!r}, which model '{self.model}' does not report before it (there: "
                        f"{', '.join(self) or 'nothing'})")


def _sum_int64(tensors: Sequence[Tensor], comm: Comm) -> list[Tensor]:
    """Each int64 tensor summed exactly over ranks (one collective for all)."""
    if comm.world_size == 1 or not tensors:
        return list(tensors)
    flat = comm.sum_int64(torch.cat([t.reshape(-1) for t in tensors]))
    return [piece.reshape(t.shape) for piece, t in zip(flat.split([t.numel() for t in tensors]), tensors, strict=True)]
