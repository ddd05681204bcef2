"""What a calibration minimizes: a model run at given parameter values, observed at the data's
times, compared with the data by a loss.

A run is observed through one of the model's metrics (its per-agent values summed over agents,
exactly on any number of ranks). ``replicates="school"`` names an integer field of the metric's
population that splits the agents into independent replicates of the system inside one run
(the ``flu`` model's schools): the metric is then summed per replicate, so one vectorized run
gives an ensemble. Seeds add more runs. ``takeoff`` leaves out replicates whose series never
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

import torch
from torch import Tensor

from .. import ops
from ..comm import Comm, LocalComm
from ..context import MetricsContext
from ..distributed.autograd import sum_over_ranks
from ..engine import Simulation
from ..errors import ConfigError
from ..metrics import ExactSum, Metric
from ..model import Model
from .data import Series

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
        metrics = {m.name: m for m in self.model._metrics if isinstance(m, Metric)}  # noqa: SLF001
        if self.metric not in metrics:
            raise ConfigError(f"metric: model '{self.model.name}' has no metric {self.metric!r} "
                              f"(metrics: {', '.join(metrics) or 'none'})")
        self._metric = metrics[self.metric]
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

    def _observe(self, sim: Simulation, grad: bool) -> Tensor:
        view = sim.view()
        values = self._metric.fn(view)
        if not isinstance(values, Tensor) or values.dim() != 1:
            got = "an ExactSum (a sum, not per-agent values)" if isinstance(values, ExactSum) else \
                getattr(values, "shape", type(values).__name__)
            raise ConfigError(f"metric '{self.metric}': calibration needs one value per agent ([n]); got {got}")
        values = values.to(torch.float64)
        if self.replicates is None:
            key = torch.zeros(values.shape[0], dtype=torch.int64, device=values.device)
        else:
            key = self._replicate_key(view, values)
        count = self._replicate_count(key)
        if grad:  # a float sum that autograd follows (over ranks: the identity backward)
            local = torch.zeros(count, dtype=torch.float64, device=values.device).index_add(0, key, values)
            return sum_over_ranks(local, self.comm)
        # Exact: per-agent fixed point summed in int64, the same bits in any order and on any ranks.
        fixed = torch.zeros(count, dtype=torch.int64, device=values.device).index_add(
            0, key, ops.to_fixed(values, _FRAC_BITS))
        total = self.comm.sum_int64(fixed.cpu()) if self.comm.world_size > 1 else fixed.cpu()
        return total.to(torch.float64) * 2.0**-_FRAC_BITS

    def _replicate_key(self, view: MetricsContext, values: Tensor) -> Tensor:
        name = str(self.replicates)
        for pop in view.state.populations.values():
            spec = pop.specs.get(name)
            if spec is not None and not spec.dtype.is_floating_point and pop.n == values.shape[0]:
                return pop[name].to(torch.int64)
        raise ConfigError(f"replicates: no population holds an integer field {self.replicates!r} with one row per "
                          f"value of metric '{self.metric}'")

    def _replicate_count(self, key: Tensor) -> int:
        if not hasattr(self, "_count"):
            local = int(key.max()) + 1 if key.numel() else 0
            if self.comm.world_size > 1:
                got = self.comm.all_gather_rows({"m": torch.tensor([[local]])}, rows_per_rank=1)["m"]
                local = int(got.max())
            self._count = max(local, 1)
        return self._count

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
