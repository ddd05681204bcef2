"""Metrics: per-agent values summed exactly over agents and ranks, so a metric has the same bits
on any number of ranks.

A :class:`Metric` is a function of the state (a :class:`~agentsim.context.MetricsContext`)
that returns per-agent values of any shape. The engine sums them over agents and ranks:
integers and bools in int64, floats in int64 fixed point with :data:`METRIC_FRAC_BITS`
fractional bits (integer addition is associative, so the order of agents and ranks does
not matter). A metric may instead return this rank's exact sum itself, an :class:`ExactSum`
(:func:`sum_of_squares` makes one without a per-agent column); calibration, which needs
per-agent values, cannot use such a metric. ``reduce="mean"`` divides that sum by the number
of values (over all ranks); return only the agents that count (``values[mask]``) for a mean
over a subset. A derived
metric is a function of the other metrics' global values (a ratio, a norm).

Every run also reports ``n_<population>``, the number of agents of each population.

Examples:
    >>> import torch
    >>> from agentsim.context import MetricsContext
    >>> from agentsim.state import FieldSpec, Population, State
    >>> walkers = Population("walker", {"disp": FieldSpec(torch.float32)},
    ...                      {"uid": torch.arange(3), "disp": torch.tensor([1.0, -2.0, 3.0])})
    >>> msd = Metric(lambda state: state["walker"]["disp"].double() ** 2, name="msd", reduce="mean")
    >>> sums = local_sums([msd], MetricsContext(State({"walker": walkers}), {}, None, 0))
    >>> metric_row(0, sums, [msd])
    {'step': 0, 'n_walker': 3, 'msd': 4.666666666666667}
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import torch
from torch import Tensor

from . import cpu_kernels, ops
from .context import MetricsContext
from .errors import ConfigError

__all__ = ["METRIC_FRAC_BITS", "REDUCTIONS", "Derived", "ExactSum", "Metric", "MetricSums", "local_sums", "metric_row",
           "sum_of_squares"]

METRIC_FRAC_BITS = 24
REDUCTIONS = ("sum", "mean")
_COUNT = "#count"  # the entry that counts a mean metric's values (metric names cannot hold '#')

MetricFn = Callable[[MetricsContext], Any]


def check_metric_name(name: object, what: str = "metric") -> str:
    """A metric name: a non-empty str without ``#`` (reserved) and not ``step``."""
    if not isinstance(name, str) or not name or "#" in name or name == "step":
        raise ConfigError(f"{what} name: expected a non-empty str without '#', other than 'step' (got {name!r})")
    return name


class ExactSum(NamedTuple):
    """A metric's value given as this rank's exact sum rather than per-agent values.

    Attributes:
        total: 0-d int64 tensor, ``sum(round(v * 2**METRIC_FRAC_BITS))`` over this rank's float
            values ``v`` (round half to even, wrapping int64): what the engine computes from
            per-agent float values, so the bits are the same on any number of ranks.
        n_values: How many values (the divisor of ``reduce="mean"``).
    """

    total: Tensor
    n_values: int


def sum_of_squares(x: Tensor) -> ExactSum:
    """The metric value of :func:`agentsim.ops.squared_norm` ``(x)`` (each row's squared norm in
    float64, e.g. a squared displacement), as an :class:`ExactSum`: on the CPU one pass over ``x``
    (:func:`agentsim.cpu_kernels.squared_norm_fixed_sum`) instead of writing the ``[n]`` float64
    column and reading it again; the same bits as returning ``ops.squared_norm(x)``.

    Args:
        x: ``[n, k]`` float per-agent vectors (``k >= 1``).

    Returns:
        ``ExactSum(total, n)``.

    Examples:
        >>> s = sum_of_squares(torch.tensor([[3.0, 4.0], [1.0, 0.5]]))
        >>> int(s.total) * 2.0 ** -METRIC_FRAC_BITS, s.n_values
        (26.25, 2)
    """
    fused = cpu_kernels.squared_norm_fixed_sum(x, METRIC_FRAC_BITS) if isinstance(x, Tensor) else None
    if fused is None:
        fused = _exact_sum(ops.squared_norm(x))  # checks x
    return ExactSum(fused, int(x.shape[0]))


class Metric:
    """One metric: ``fn(state) -> per-agent values``, reduced by ``"sum"`` or ``"mean"``.

    Args:
        fn: The function (its argument is a :class:`~agentsim.context.MetricsContext`).
        name: Default: ``fn.__name__``.
        reduce: ``"sum"`` (exact sum over agents and ranks) or ``"mean"`` (that sum over the
            number of values; NaN when there are none).
    """

    def __init__(self, fn: MetricFn, name: str | None = None, reduce: str = "sum") -> None:
        if not callable(fn):
            raise ConfigError(f"metric: expected a function of the state (got {fn!r})")
        if reduce not in REDUCTIONS:
            raise ConfigError(f"metric reduce: expected one of {', '.join(REDUCTIONS)} (got {reduce!r})")
        self.fn = fn
        self.name = check_metric_name(name or getattr(fn, "__name__", None))
        self.reduce = reduce

    def __repr__(self) -> str:
        return f"Metric({self.name!r}, reduce={self.reduce!r})"

    def values(self, mc: MetricsContext) -> dict[str, Tensor | ExactSum]:
        """This rank's values to sum, or their :class:`ExactSum`: the metric (and, for a mean, its
        count).
        """
        value = self.fn(mc)
        if isinstance(value, ExactSum):
            count = torch.tensor(value.n_values)
        elif isinstance(value, Tensor):
            count = torch.tensor(value.numel(), device=value.device)
        else:
            raise ConfigError(f"metric '{self.name}': expected a tensor of per-agent values or an ExactSum "
                              f"(got {type(value).__name__})")
        if self.reduce == "sum":
            return {self.name: value}
        return {self.name: value, self.name + _COUNT: count}


class LegacyMetrics:
    """The ``metrics(mc) -> {name: per-agent values}`` function of the deprecated ``Model`` form: sums."""

    def __init__(self, fn: Callable[[MetricsContext], Mapping[str, Tensor]]) -> None:
        self.fn = fn
        self.reduce = "sum"
        self.name = ""

    def values(self, mc: MetricsContext) -> dict[str, Tensor | ExactSum]:
        """The function's values, each summed."""
        return dict(self.fn(mc))


class Derived(NamedTuple):
    """A metric computed from the global values of the others: ``fn(metrics) -> number`` (with a
    name), or, in the deprecated form, ``fn(metrics) -> {name: number}`` (name None).
    """

    name: str | None
    fn: Callable[[dict[str, Any]], Any]


class MetricSums(NamedTuple):
    """Exact metric sums: entry names, which entries are floats, ``[k]`` int64 on the CPU (floats in
    fixed point with :data:`METRIC_FRAC_BITS` fractional bits).
    """

    names: list[str]
    is_float: list[bool]
    values: Tensor


def local_sums(metrics: Sequence[Metric | LegacyMetrics], mc: MetricsContext) -> MetricSums:
    """This rank's exact sums of every metric (and ``n_<population>``); sum them over ranks
    elementwise (int64) for the global sums.
    """
    sums: dict[str, Tensor] = {f"n_{name}": torch.tensor(pop.n, dtype=torch.int64)
                               for name, pop in mc.state.populations.items()}
    is_float = dict.fromkeys(sums, False)
    for metric in metrics:  # each metric's values summed and freed before the next is computed
        for key, values in metric.values(mc).items():
            if isinstance(values, ExactSum):
                is_float[key], sums[key] = True, values.total.to(torch.int64).cpu().reshape(())
                continue
            is_float[key] = values.is_floating_point()
            sums[key] = _exact_sum(values) if is_float[key] else _integer_sum(values)
    return MetricSums(list(sums), [is_float[k] for k in sums], torch.stack(list(sums.values())))


_INT_CHUNK = 1 << 20  # elements converted to int64 at a time (torch's integer sum converts the whole input)


def _integer_sum(values: Tensor) -> Tensor:
    """The int64 sum of integer or bool values, on the CPU, without an int64 copy of them all."""
    if values.dtype == torch.bool:
        return torch.count_nonzero(values).cpu()
    if values.dtype == torch.int64 or values.numel() <= _INT_CHUNK:
        return values.sum(dtype=torch.int64).cpu()
    flat = values.reshape(-1)
    total = torch.zeros((), dtype=torch.int64, device=values.device)
    for i in range(0, flat.numel(), _INT_CHUNK):
        total += flat[i:i + _INT_CHUNK].sum(dtype=torch.int64)
    return total.cpu()


def _exact_sum(values: Tensor) -> Tensor:
    """The int64 fixed-point sum of float values (one pass on the CPU, the same bits as torch's)."""
    fused = cpu_kernels.fixed_sum(values, METRIC_FRAC_BITS)
    if fused is not None:
        return fused
    return ops.to_fixed(values.to(torch.float64), METRIC_FRAC_BITS).sum().cpu()


def metric_row(step: int, sums: MetricSums, metrics: Sequence[Metric | LegacyMetrics],
               derived: Sequence[Derived] = ()) -> dict[str, Any]:
    """The metrics of a step from global sums: ``step``, ``n_<population>``, every metric (means
    divided by their counts), then the derived ones in order.
    """
    values: dict[str, int | float] = {}
    for k, f, v in zip(sums.names, sums.is_float, sums.values.tolist(), strict=True):
        values[k] = v * 2.0 ** -METRIC_FRAC_BITS if f else v
    means = {m.name for m in metrics if m.reduce == "mean"}
    out: dict[str, Any] = {"step": step}
    for k, v in values.items():
        if k.endswith(_COUNT):
            continue
        if k in means:
            count = values[k + _COUNT]
            v = v / count if count else float("nan")
        out[k] = v
    for d in derived:
        if d.name is None:
            out.update(d.fn(dict(out)))
        else:
            out[d.name] = d.fn(dict(out))
    return out
