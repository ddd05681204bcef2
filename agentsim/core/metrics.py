"""Metrics: per-agent values summed exactly over agents and ranks, so a metric has the same bits
on any number of ranks.

A :class:`Metric` is a function of the state (a :class:`~agentsim.core.context.MetricsContext`)
that returns per-agent values: ``[n]`` (or a 0-d integer for a sum) for a scalar metric, ``[n, K]`` (a row of K
values per agent) for a vector metric. The engine sums them over agents and ranks (a vector
metric column by column): integers and bools in int64, floats in int64 fixed point with
:data:`METRIC_FRAC_BITS` fractional bits (integer addition is associative, so the order of
agents and ranks does not matter). A metric may instead return this rank's exact sum itself,
an :class:`ExactSum` (:func:`sum_of_squares` makes one without a per-agent column; always a
scalar); calibration fits such a metric only without replicates and gradients.
``reduce="mean"`` divides that sum (each column's) by the number of values (rows of a vector
metric) over all ranks; return only the agents that count (``values[mask]``) for a mean over a
subset.

A vector metric's K is the same on every rank and every step: a rank without agents returns
``[0, K]``; a K that changes between steps is a :class:`~agentsim.errors.ConfigError` when the
run records the row (:class:`~agentsim.io.recording.Recorder`). Its value in a metrics row is a
numpy array ``[K]`` (int64, or float64 for float values and means), so a run's series is
``[steps + 1, K]``.

A histogram metric, ``Metric(fn, hist=edges)``: ``fn`` returns per-agent values ``[n]`` and
the metric is the int64 count of values in each bin, a vector of ``K = len(edges) - 1``, as
``numpy.histogram(values, bins=edges)``: bin ``k`` is ``[edges[k], edges[k + 1])``, the last
bin is closed, values outside ``[edges[0], edges[-1]]`` and NaN are not counted; the values
are compared in float64. ``-inf`` and ``inf`` edges make open-ended bins. The counts are
integer sums, so the same on any number of ranks; the row holds a :class:`Histogram` (the
counts with their ``edges``), and a trajectory file stores the edges as the dataset's
``edges`` attribute.

A metric per group, ``Metric(fn, groups=G)`` (``G`` an int, the name of an int parameter, or
``"space"``: one group per cell of the model's space, a :class:`~agentsim.Grid`'s cells in row-major
order or a line's cells, the agent's cell its group): ``fn``
returns ``(group, values)``, the group of each agent ``[n]`` (integers; ``-1`` or any negative id:
in no group) and its values ``[n]``, or the groups alone (each agent counts one); the metric is
the exact sum of the values in each group, a vector of ``G`` (per place, city or region). A group
id of ``G`` or more stops the run at that step, on every rank.

Histogram edges may depend on the parameters: ``hist=fn``, a function of the run's parameters that
returns the edges (``hist=lambda p: [0, 18, 65, p["max_age"]]``).

A float metric is summed in multiples of ``2**-24`` (about 6e-8) per value; ``resolution=r`` sums
in multiples of the power of two at or below ``r`` instead (per-agent values far smaller than 1,
such as a speed over a road's length), with correspondingly smaller largest values
(``2**38 * r / 2**-24``).

A derived metric is a function of the other metrics' global values (a ratio, a norm): vector
metrics arrive as numpy arrays; it returns a number or a vector (a 1-D array-like, stored as a
numpy array). A derived function of two arguments, ``fn(metrics, params)``, also gets the run's
parameters (a flow: the sum of speeds over the road's length); of three, ``fn(metrics, params,
space)``, the run's space too (a density: agents per cell of the grid, ``space.n_cells``).

Every run also reports ``n_<population>``, the number of agents of each population.

A metric may declare how a figure draws it (:class:`Display`: ``label``, ``color``, ``panel``,
``share_of``, ``limits``, ``unit``); a trajectory file stores that with the metric, and
``agentsim plot`` draws the declared panels (:mod:`agentsim.plot`).

Examples:
    >>> import torch
    >>> from agentsim.core.context import MetricsContext
    >>> from agentsim.core.state import FieldSpec, Population, State
    >>> walkers = Population("walker", {"disp": FieldSpec(torch.float32)},
    ...                      {"uid": torch.arange(3), "disp": torch.tensor([1.0, -2.0, 3.0])})
    >>> msd = Metric(lambda state: state["walker"]["disp"].double() ** 2, name="msd", reduce="mean")
    >>> sums = local_sums([msd], MetricsContext(State({"walker": walkers}), {}, None, 0))
    >>> metric_row(0, sums, [msd])
    {'step': 0, 'n_walker': 3, 'msd': 4.666666666666667}
    >>> parts = Metric(lambda state: torch.stack([state["walker"]["disp"] > 0,
    ...                                           state["walker"]["disp"] < 0], 1), name="sign")
    >>> disp = Metric(lambda state: state["walker"]["disp"], name="disp", hist=[-float("inf"), 0, 2, 4])
    >>> mc = MetricsContext(State({"walker": walkers}), {}, None, 0)
    >>> row = metric_row(0, local_sums([parts, disp], mc), [parts, disp])
    >>> row["sign"].tolist(), row["disp"].tolist(), row["disp"].edges
    ([2, 1], [1, 1, 1], (-inf, 0.0, 2.0, 4.0))
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import torch
from torch import Tensor

from agentsim._native import kernels as cpu_kernels
from agentsim.core import ops
from agentsim.core.context import MetricsContext
from agentsim.errors import ConfigError, SimulationError, did_you_mean

__all__ = ["METRIC_FRAC_BITS", "METRIC_SUM_LIMIT", "METRIC_VALUE_LIMIT", "REDUCTIONS", "Derived", "ExactSum",
           "Histogram", "Metric", "MetricSums", "check_edges", "local_sums", "metric_row", "sum_of_squares"]

METRIC_FRAC_BITS = 24
REDUCTIONS = ("sum", "mean")
_COUNT = "#count"  # the entry that counts a mean metric's values (metric names cannot hold '#')
_INVALID = "#invalid"  # the entry that counts the ranks whose float values a fixed-point sum cannot hold
_BOUND = "#bound"  # the entry that bounds a float metric's |sum| (rows times largest magnitude), summed over ranks
_OUTSIDE = "#outside"  # the entry that counts a metric per group's group ids past its last group, summed over ranks
SPACE_GROUPS = "space"  # Metric(groups=SPACE_GROUPS): one group per cell of the model's space
#: The largest magnitude of a float metric value the fixed-point sum holds exactly (larger values,
#: NaN and inf stop the run with an error naming the metric, on every rank at the same step).
METRIC_VALUE_LIMIT = 2.0 ** (62 - METRIC_FRAC_BITS)
#: The largest magnitude of a float metric's sum (a vector metric's column sums): a metric whose
#: values could add up to more (the sum of ``floor(|v|) + 1`` over every value on every rank)
#: stops the run with an error naming the metric instead of wrapping around.
METRIC_SUM_LIMIT = 2.0 ** (63 - METRIC_FRAC_BITS)

MetricFn = Callable[[MetricsContext], Any]
# One metric's entries in the sums: their names, whether each is a float, their int64 sums ``[k]`` (CPU).
Block = tuple[list[str], list[bool], "Tensor | list[int]"]  # entry names, float or not, int64 values


def check_metric_name(name: object, what: str = "metric") -> str:
    """A metric name: a non-empty str without ``#`` (reserved) and not ``step``."""
    if not isinstance(name, str) or not name or "#" in name or name == "step":
        raise ConfigError(f"{what} name: expected a non-empty str without '#', other than 'step' (got {name!r})")
    return name


def check_edges(edges: object, name: str = "metric") -> tuple[float, ...]:
    """Histogram bin edges: a sequence of at least 2 strictly increasing numbers (``-inf`` and
    ``inf`` allowed, NaN not), as floats.

    Args:
        edges: A list, tuple, 1-D numpy array or tensor.
        name: The metric's name, for the message.

    Raises:
        ConfigError: Not such a sequence; the message says what was got.

    Examples:
        >>> check_edges([0, 1, float("inf")])
        (0.0, 1.0, inf)
        >>> check_edges([0, 2, 1], "age")
        Traceback (most recent call last):
        ...
        agentsim.errors.ConfigError: metric 'age' hist: expected strictly increasing bin edges (got [0, 2, 1]: ...
    """
    what = f"metric '{name}' hist"
    if isinstance(edges, Tensor):
        edges = edges.detach().cpu().tolist()
    elif isinstance(edges, np.ndarray):
        edges = edges.tolist()
    if isinstance(edges, (str, bytes)) or not isinstance(edges, Sequence):
        raise ConfigError(f"{what}: expected a sequence of at least 2 increasing bin edges, e.g. [0, 10, 20] "
                          f"(got {edges!r})")
    values = list(edges)
    if any(isinstance(e, bool) or not isinstance(e, (int, float, np.integer, np.floating)) for e in values):
        raise ConfigError(f"{what}: expected numbers as bin edges (got {values!r})")
    floats = tuple(float(e) for e in values)
    if len(floats) < 2:
        raise ConfigError(f"{what}: expected at least 2 bin edges (got {len(floats)}: {values!r})")
    if any(math.isnan(e) for e in floats):
        raise ConfigError(f"{what}: expected numbers as bin edges, not NaN (got {values!r})")
    bad = [i for i in range(1, len(floats)) if not floats[i] > floats[i - 1]]
    if bad:
        i = bad[0]
        raise ConfigError(f"{what}: expected strictly increasing bin edges (got {values!r}: edge {i}, "
                          f"{values[i]!r}, is not above edge {i - 1}, {values[i - 1]!r})")
    return floats


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
    """The metric value of :func:`agentsim.core.ops.squared_norm` ``(x)`` (each row's squared norm in
    float64, e.g. a squared displacement), as an :class:`ExactSum`: on the CPU one pass over ``x``
    (:func:`agentsim._native.kernels.squared_norm_fixed_sum`) instead of writing the ``[n]`` float64
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


class Histogram(np.ndarray):
    """A histogram metric's value in a metrics row: the int64 counts ``[K]`` (a numpy array) with
    the bin ``edges`` (``K + 1`` floats) as an attribute; arrays computed from it keep the edges.
    """

    edges: tuple[float, ...] | None

    def __new__(cls, counts: Any, edges: Sequence[float]) -> Histogram:
        """The ``counts`` (int64 for a histogram metric) with their ``edges``."""
        obj = np.asarray(counts).view(cls)
        obj.edges = tuple(float(e) for e in edges)
        return obj

    def __array_finalize__(self, obj: Any) -> None:
        """Views and results of arithmetic keep the edges."""
        self.edges = getattr(obj, "edges", None)

    def __reduce__(self) -> Any:  # pickled as its counts and edges
        return Histogram, (np.asarray(self), self.edges or ())


@dataclass(frozen=True)
class Display:
    """How a figure draws a metric (all optional; see :mod:`agentsim.plot`).

    Attributes:
        label: The metric's name in a legend, or its panel's y label when alone in the panel
            (default: the metric's name).
        color: A matplotlib color: a name (``"red"``, ``"tab:red"``), ``"C0"`` ... ``"C9"`` or
            ``"#rrggbb"`` (default: the next color of the cycle).
        panel: The title of the panel that draws it; metrics with the same ``panel`` share it
            (default: a panel of its own, titled ``label``).
        share_of: Metric names whose sum divides the value: the metric is drawn as a share
            of them (``share_of=("S", "I", "R")``: a fraction of the population; the y axis
            then spans ``[0, 1]`` unless ``limits`` says otherwise).
        limits: ``(low, high)``: the y range of its panel.
        unit: The y label of its panel (default: ``label`` for a metric alone in its panel,
            ``"share of ..."`` for shares).

    Examples:
        >>> Display.declare("metric 'I'", label="infectious", color="tab:red", share_of=["S", "I", "R"]).as_dict()
        {'label': 'infectious', 'color': 'tab:red', 'share_of': ['S', 'I', 'R']}
        >>> Display.declare("metric 'I'", label="")
        Traceback (most recent call last):
        ...
        agentsim.errors.ConfigError: metric 'I': label: expected a non-empty str (got '')
    """

    label: str | None = None
    color: str | None = None
    panel: str | None = None
    share_of: tuple[str, ...] = ()
    limits: tuple[float, float] | None = None
    unit: str | None = None

    KEYS = ("label", "color", "panel", "share_of", "limits", "unit")

    @classmethod
    def declare(cls, what: str, *, label: Any = None, color: Any = None, panel: Any = None, share_of: Any = None,
                limits: Any = None, unit: Any = None) -> Display:
        """A checked :class:`Display`; ``what`` names the metric in messages (``"metric 'I'"``).

        Raises:
            ConfigError: An empty or non-str label, panel, unit or share_of name; a color that
                matplotlib does not know; limits that are not two finite numbers, low < high.
        """
        texts = {key: _text(what, key, value) for key, value in (("label", label), ("panel", panel), ("unit", unit))}
        return cls(label=texts["label"], color=_color(what, color), panel=texts["panel"],
                   share_of=_share_of(what, share_of), limits=_limits(what, limits), unit=texts["unit"])

    @classmethod
    def from_dict(cls, what: str, values: Mapping[str, Any]) -> Display:
        """The :class:`Display` of :meth:`as_dict` (as a file stores it), checked.

        Raises:
            ConfigError: An unknown key (the valid ones are listed) or a bad value (see :meth:`declare`).
        """
        if not isinstance(values, Mapping):
            raise ConfigError(f"{what}: display: expected a mapping of {', '.join(cls.KEYS)} (got {values!r})")
        for key in values:
            if key not in cls.KEYS:
                raise ConfigError(f"{what}: display: unknown key {key!r} (valid: {', '.join(cls.KEYS)})."
                                  + did_you_mean(str(key), cls.KEYS))
        return cls.declare(what, **dict(values))

    def is_empty(self) -> bool:
        """Whether nothing is declared."""
        return not self.as_dict()

    def as_dict(self) -> dict[str, Any]:
        """The declared entries only, JSON-ready (``share_of`` and ``limits`` as lists)."""
        out: dict[str, Any] = {}
        for key in self.KEYS:
            value = getattr(self, key)
            if value is None or value == ():
                continue
            out[key] = list(value) if isinstance(value, tuple) else value
        return out


def _text(what: str, key: str, value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"{what}: {key}: expected a non-empty str (got {value!r})")
    return value


def _color(what: str, color: Any) -> str | None:
    if color is None:
        return None
    from matplotlib.colors import is_color_like  # only when a color is declared (about 0.1 s)

    if not isinstance(color, str) or not is_color_like(color):
        raise ConfigError(f"{what}: color: expected a matplotlib color name or string ('red', 'tab:red', 'C0', "
                          f"'#1f77b4') (got {type(color).__name__} {color!r})")
    return color


def _share_of(what: str, names: Any) -> tuple[str, ...]:
    if names is None:
        return ()
    listed = [names] if isinstance(names, str) else names
    if not isinstance(listed, (list, tuple)) or not listed or \
            any(not isinstance(n, str) or not n for n in listed):
        raise ConfigError(f"{what}: share_of: expected a metric name or a non-empty list of them (got {names!r})")
    return tuple(listed)


def _limits(what: str, limits: Any) -> tuple[float, float] | None:
    if limits is None:
        return None
    ok = (isinstance(limits, (list, tuple)) and len(limits) == 2
          and all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in limits)
          and limits[0] < limits[1])
    if not ok:
        raise ConfigError(f"{what}: limits: expected (low, high), two finite numbers with low < high (got {limits!r})")
    return float(limits[0]), float(limits[1])


class Metric:
    """One metric: ``fn(state) -> per-agent values``, reduced by ``"sum"`` or ``"mean"``, or counted
    in histogram bins (see the module docstring).

    Args:
        fn: The function (its argument is a :class:`~agentsim.core.context.MetricsContext`). It
            returns ``[n]`` values (or 0-d, or an :class:`ExactSum`) for a scalar metric,
            ``[n, K]`` for a vector metric of K entries (``[0, K]`` on a rank without agents),
            ``[n]`` values for a histogram.
        name: Default: ``fn.__name__``.
        reduce: ``"sum"`` (exact sum over agents and ranks) or ``"mean"`` (that sum over the
            number of values, or of rows for ``[n, K]``; NaN when there are none).
        hist: Bin edges (at least 2 strictly increasing numbers, ``-inf`` / ``inf`` allowed): the
            metric is the int64 count of values per bin, ``K = len(hist) - 1`` entries, as
            ``numpy.histogram`` (last bin closed; values outside the edges and NaN not counted).
            Not with ``reduce="mean"``.
        label, color, panel, share_of, limits, unit: How a figure draws it (:class:`Display`).

    Raises:
        ConfigError: A bad name, reduction, edges or display entry, or ``hist`` with ``reduce="mean"``.
    """

    def __init__(self, fn: MetricFn, name: str | None = None, reduce: str = "sum",
                 hist: Iterable[float] | Callable[[Mapping[str, Any]], Iterable[float]] | None = None, *,
                 groups: int | str | None = None,
                 resolution: float | None = None, label: str | None = None, color: str | None = None,
                 panel: str | None = None, share_of: str | Sequence[str] | None = None,
                 limits: tuple[float, float] | None = None, unit: str | None = None) -> None:
        if not callable(fn):
            raise ConfigError(f"metric: expected a function of the state (got {fn!r})")
        if reduce not in REDUCTIONS:
            raise ConfigError(f"metric reduce: expected one of {', '.join(REDUCTIONS)} (got {reduce!r})")
        self.fn = fn
        self.name = check_metric_name(name or getattr(fn, "__name__", None))
        self.reduce = reduce
        #: The edges, or a function of the parameters that returns them (per run: :meth:`edges`).
        self.hist: tuple[float, ...] | Callable[[Mapping[str, Any]], Iterable[float]] | None = \
            hist if callable(hist) or hist is None else check_edges(hist, self.name)
        if self.hist is not None and reduce != "sum":
            raise ConfigError(f"metric '{self.name}': hist counts values per bin, it has no reduce={reduce!r} "
                              "(valid with hist: reduce='sum'); declare a mean as a separate metric")
        if groups is not None and (isinstance(groups, bool) or not isinstance(groups, (int, str))
                                   or (isinstance(groups, int) and groups < 1)):
            raise ConfigError(f"metric '{self.name}': groups: expected the number of groups, an int >= 1, the "
                              f"name of an int parameter, or {SPACE_GROUPS!r} (one per cell of the space) "
                              f"(got {groups!r})")
        if groups is not None and (reduce != "sum" or self.hist is not None):
            raise ConfigError(f"metric '{self.name}': groups sums values per group (reduce='sum', no hist); a "
                              "mean per group is a derived metric: the sums over the counts")
        self.groups = groups
        if resolution is not None and (isinstance(resolution, bool) or not isinstance(resolution, (int, float))
                                       or not 0 < resolution < math.inf):
            raise ConfigError(f"metric '{self.name}': resolution: expected a positive number (got {resolution!r})")
        #: Extra fractional bits of this metric's fixed-point sum (negative: fewer), from ``resolution``:
        #: values are summed in multiples of ``2**-(METRIC_FRAC_BITS + shift)``, the power of two at or
        #: below the resolution.
        self.shift = 0 if resolution is None else math.ceil(-math.log2(resolution)) - METRIC_FRAC_BITS
        if not -METRIC_FRAC_BITS < self.shift < 61 - METRIC_FRAC_BITS:
            raise ConfigError(f"metric '{self.name}': resolution {resolution!r} is outside what an int64 "
                              "fixed-point sum holds (valid: 1e-18 to 0.5)")
        self.display = Display.declare(f"metric '{self.name}'", label=label, color=color, panel=panel,
                                       share_of=share_of, limits=limits, unit=unit)
        self._entry_names: dict[int, list[str]] = {}
        self._edges: dict[tuple[torch.device, tuple[float, ...] | None], Tensor] = {}

    def __repr__(self) -> str:
        if callable(self.hist):
            hist = f", hist={getattr(self.hist, '__name__', 'fn')}(params)"
        else:
            edges = self.hist or ()
            shown = list(edges) if len(edges) <= 6 else f"[{edges[0]!r}, {edges[1]!r}, ..., {edges[-1]!r}]"
            bins = len(edges) - 1
            hist = "" if self.hist is None else f", hist={shown} ({bins} bin{'' if bins == 1 else 's'})"
        groups = "" if self.groups is None else f", groups={self.groups!r}"
        return f"Metric({self.name!r}, reduce={self.reduce!r}{hist}{groups})"

    def edges(self, params: Mapping[str, Any]) -> tuple[float, ...] | None:
        """The histogram's edges for a run with ``params`` (None without ``hist``)."""
        if not callable(self.hist):
            return self.hist
        return check_edges(self.hist(params), self.name)

    def n_groups(self, params: Mapping[str, Any], space: Any = None) -> int | None:
        """The number of groups for a run with ``params`` in ``space`` (None without ``groups``)."""
        if not isinstance(self.groups, str):
            return self.groups
        if self.groups == SPACE_GROUPS:
            shape = getattr(space, "layer_shape", None)
            if not shape:
                raise ConfigError(f"metric '{self.name}': groups={SPACE_GROUPS!r} makes one group per cell of the "
                                  f"space, and a {type(space).__name__} has no cells (a Grid or a Line(cells=True) "
                                  "has); give the number of groups, or the name of an int parameter")
            return int(math.prod(shape))
        got = _parameter(self.name, "groups", self.groups, params)
        if isinstance(got, bool) or not isinstance(got, (int, np.integer)) or got < 1:
            raise ConfigError(f"metric '{self.name}': groups: parameter {self.groups!r} = {got!r} is not a number "
                              "of groups (an int >= 1)")
        return int(got)

    def entries(self, k: int) -> list[str]:
        """The names of a vector metric's ``k`` entries in :class:`MetricSums`: ``name#0`` ... ``name#k-1``."""
        names = self._entry_names.get(k)
        if names is None:
            names = self._entry_names[k] = [f"{self.name}#{j}" for j in range(k)]
        return names

    def sums(self, mc: MetricsContext) -> list[Block]:
        """This rank's exact sums of the metric (and, for a mean, its count), as blocks of entries."""
        value = self.fn(mc)
        if self.hist is not None:
            return [self._histogram(value, mc.params)]
        if self.groups is not None:
            return self._per_group(value, mc.params, mc.space)
        if isinstance(value, Tensor) and value.is_floating_point():
            value = self._shifted(value)
        ranges: list[int] | None = None  # a float value's range entries, where the kernel made them
        if isinstance(value, ExactSum):
            count = int(value.n_values)
            block: Block = ([self.name], [True], value.total.to(torch.int64).cpu().reshape(1))
        elif isinstance(value, Tensor):
            if value.dim() == 0 and (value.is_floating_point() or self.reduce == "mean"):
                raise ConfigError(
                    f"metric '{self.name}': expected per-agent values [n] (got one value, a 0-d tensor); the engine "
                    "sums the values of every agent on every process exactly, a sum or mean taken here would "
                    "depend on how agents are split among processes: return the per-agent values, an ExactSum "
                    "(agentsim.core.metrics.sum_of_squares), or compute it from other metrics with @model.derived")
            if value.dim() == 2:
                k = int(value.shape[1])
                if k == 0:
                    raise ConfigError(f"metric '{self.name}': expected [n, K] values with K >= 1 (got shape "
                                      f"{list(value.shape)})")
                is_float = value.is_floating_point()
                block = (self.entries(k), [is_float] * k, _column_sums(value))
                count = int(value.shape[0])
            elif value.dim() <= 1:
                is_float = value.is_floating_point()
                checked = cpu_kernels.fixed_sum_checked(value, METRIC_FRAC_BITS, METRIC_VALUE_LIMIT) \
                    if is_float else None
                if checked is not None:  # the sum and its checks in one call, as Python ints
                    block = ([self.name], [True], [checked.total])
                    ranges = _range_ints(checked.invalid, checked.floors, value.numel())
                else:
                    total = _exact_sum(value) if is_float else _integer_sum(value)
                    block = ([self.name], [is_float], total.reshape(1))
                count = value.numel()
            else:
                raise ConfigError(f"metric '{self.name}': expected per-agent values [n] or rows [n, K] (got shape "
                                  f"{list(value.shape)}); reshape to [n, -1] for a vector or to [-1] for one sum")
        else:
            raise ConfigError(f"metric '{self.name}': expected a tensor of per-agent values or an ExactSum "
                              f"(got {type(value).__name__})")
        blocks = [block]
        if isinstance(value, Tensor) and value.is_floating_point():
            blocks.append(([self.name + _INVALID, self.name + _BOUND], [False, False],
                           ranges if ranges is not None else _range_entries(value)))
        if self.reduce == "mean":
            blocks.append(([self.name + _COUNT], [False], [count]))
        return blocks

    def _shifted(self, values: Tensor) -> Tensor:
        """Float ``values`` times ``2**shift`` (exact): summed in this metric's resolution."""
        if not self.shift:
            return values
        return torch.ldexp(values.to(torch.float64), torch.tensor(float(self.shift), dtype=torch.float64))

    def _histogram(self, value: Any, params: Mapping[str, Any]) -> Block:
        """The counts per bin of this rank's values, ``[K]`` int64."""
        hist = self.edges(params)
        assert hist is not None
        k = len(hist) - 1
        if not isinstance(value, Tensor) or value.dim() != 1:
            got = f"shape {list(value.shape)}" if isinstance(value, Tensor) else type(value).__name__
            raise ConfigError(f"metric '{self.name}': a hist metric expects per-agent values [n] (got {got})")
        key = (value.device, hist if callable(self.hist) else None)  # edges of a function: per value
        edges = self._edges.get(key)
        if edges is None:
            edges = self._edges[key] = torch.tensor(hist, dtype=torch.float64, device=value.device)
        return self.entries(k), [False] * k, histogram_counts(value, edges)

    def _per_group(self, value: Any, params: Mapping[str, Any], space: Any) -> list[Block]:
        """The sums per group of this rank's values, ``[G]`` int64 (floats in fixed point), and the
        count of group ids of ``G`` or more (checked on the global sums by :func:`metric_row`).
        """
        n_groups = self.n_groups(params, space)
        assert n_groups is not None
        group, values = value if isinstance(value, tuple) and len(value) == 2 else (value, None)
        if not isinstance(group, Tensor) or group.dim() != 1 or group.is_floating_point() \
                or (values is not None and (not isinstance(values, Tensor) or values.shape != group.shape)):
            got = ", ".join(f"{type(v).__name__} {list(v.shape)}" if isinstance(v, Tensor) else type(v).__name__
                            for v in (value if isinstance(value, tuple) else (value,)))
            raise ConfigError(f"metric '{self.name}': a metric per group returns (group [n] integers, values [n]) or "
                              f"the groups alone (got {got})")
        group = group.to(torch.int64)
        outside = int((group >= n_groups).sum())
        keep = (group >= 0) & (group < n_groups)
        at = group[keep]
        is_float = values is not None and values.is_floating_point()
        blocks: list[Block] = []
        if values is None:
            sums = torch.bincount(at, minlength=n_groups)
        elif is_float:
            v = self._shifted(values[keep].to(torch.float64))
            sums = torch.zeros(n_groups, dtype=torch.int64, device=v.device).index_add_(
                0, at, ops.to_fixed(v, METRIC_FRAC_BITS))
            blocks.append(([self.name + _INVALID, self.name + _BOUND], [False, False], _range_entries(v)))
        else:
            sums = torch.zeros(n_groups, dtype=torch.int64, device=at.device).index_add_(
                0, at, values[keep].to(torch.int64))
        return [(self.entries(n_groups), [is_float] * n_groups, sums.to(torch.int64).cpu()),
                ([self.name + _OUTSIDE], [False], [outside]), *blocks]


def _range_entries(values: Tensor) -> list[int]:
    """Two int64 entries: whether ``values`` hold NaN, inf or a magnitude of
    :data:`METRIC_VALUE_LIMIT` or more (1, else 0), and a bound on the magnitude of their (column) sums, the sum of
    ``floor(|v|) + 1`` over the values (exact, so the same for any split of the agents among ranks;
    capped at :data:`METRIC_SUM_LIMIT`). A fixed-point sum would turn either into garbage without a
    word; :func:`metric_row` raises on the global entries.
    """
    if values.numel() == 0:
        return _range_ints(False, 0.0, 0)
    v = values.detach()
    low, high = (float(x) for x in torch.aminmax(v))
    if not -METRIC_VALUE_LIMIT < low <= high < METRIC_VALUE_LIMIT:  # also False for NaN
        return _range_ints(True, 0.0, v.numel())
    # integers below 2**53 add exactly in float64 in any order; past that the sum is far over the cap
    return _range_ints(False, float(v.abs().floor_().sum(dtype=torch.float64)), v.numel())


def _range_ints(invalid: bool, floors: float, n: int) -> list[int]:
    """The two range entries of ``n`` float values: ``[1, 0]`` where some value is invalid, else
    ``[0, bound]``, the bound ``sum(floor(|v|)) + n`` (``floors`` + ``n``) capped at
    :data:`METRIC_SUM_LIMIT`.
    """
    return [1, 0] if invalid else [0, int(min(floors + n, METRIC_SUM_LIMIT))]


def histogram_counts(values: Tensor, edges: Tensor) -> Tensor:
    """Counts of ``values`` per bin, as ``numpy.histogram(values, bins=edges)``: bin ``k`` is
    ``[edges[k], edges[k + 1])``, the last one closed; values outside and NaN are not counted.

    Args:
        values: ``[n]`` numbers (compared in float64).
        edges: ``[K + 1]`` float64, strictly increasing, on ``values``' device.

    Returns:
        ``[K]`` int64 on the CPU.

    Examples:
        >>> nan, inf = float("nan"), float("inf")
        >>> histogram_counts(torch.tensor([-1.0, 0.0, 0.5, 1.0, 2.0, nan, inf]),
        ...                  torch.tensor([0.0, 1.0, 2.0], dtype=torch.float64)).tolist()
        [2, 2]
    """
    k = edges.numel() - 1
    x = values.to(torch.float64).contiguous()
    inside = (x >= edges[0]) & (x <= edges[-1])  # NaN fails both
    bins = (torch.bucketize(x, edges, right=True) - 1).clamp_(max=k - 1)  # x == edges[-1]: the last bin
    return torch.bincount(bins[inside], minlength=k).to(torch.int64).cpu()


class Derived(NamedTuple):
    """A metric computed from the global values of the others: ``fn(metrics) -> number or vector``,
    ``fn(metrics, params)`` with the run's parameters too, or ``fn(metrics, params, space)`` with
    the run's space too (``arguments``: 1, 2 or 3).
    """

    name: str
    fn: Callable[..., Any]
    arguments: int = 1

    def value(self, metrics: dict[str, Any], params: Mapping[str, Any], space: Any = None) -> Any:
        """The derived metric's value from the metrics before it."""
        return self.fn(*(metrics, params, space)[:self.arguments])


def _parameter(metric: str, what: str, name: str, params: Mapping[str, Any]) -> Any:
    """Parameter ``name`` that metric ``metric``'s ``what`` (``groups``) names."""
    if name not in params:
        raise ConfigError(f"metric '{metric}': {what}={name!r} names no parameter (parameters: "
                          f"{', '.join(params) or 'none'})." + did_you_mean(name, list(params)))
    return params[name]


class MetricSums(NamedTuple):
    """Exact metric sums: entry names, which entries are floats, ``[k]`` int64 on the CPU (floats in
    fixed point with :data:`METRIC_FRAC_BITS` fractional bits): a tensor, or the Python ints where
    every entry came as one (one process makes no tensor of them). A vector metric ``name`` of K
    entries occupies K consecutive entries ``name#0`` ... ``name#K-1``; a mean's count is the
    entry ``name#count``.
    """

    names: list[str]
    is_float: list[bool]
    values: Tensor | list[int]


def local_sums(metrics: Sequence[Metric], mc: MetricsContext) -> MetricSums:
    """This rank's exact sums of every metric (and ``n_<population>``); sum them over ranks
    elementwise (int64) for the global sums.
    """
    pops = mc.state.populations
    blocks: dict[str, Block] = {f"n_{name}": ([f"n_{name}"], [False], [pop.n]) for name, pop in pops.items()}
    for metric in metrics:  # each metric's values summed and freed before the next is computed
        for block in metric.sums(mc):
            blocks[block[0][0]] = block
    names = [n for block in blocks.values() for n in block[0]]
    is_float = [f for block in blocks.values() for f in block[1]]
    return MetricSums(names, is_float, _join([block[2] for block in blocks.values()]))


def _join(parts: list[Tensor | list[int]]) -> Tensor | list[int]:
    """``[k]`` int64 on the CPU: the blocks' values one after another: the Python ints as they are
    where every block gave ints, else one tensor (made from the ints next to each other, not one
    per block).
    """
    if all(isinstance(part, list) for part in parts):
        return [v for part in parts for v in part]
    out: list[Tensor] = []
    ints: list[int] = []
    for part in parts:
        if isinstance(part, list):
            ints += part
            continue
        if ints:
            out.append(torch.tensor(ints, dtype=torch.int64))
            ints = []
        out.append(part)
    if ints or not out:
        out.append(torch.tensor(ints, dtype=torch.int64))
    return out[0] if len(out) == 1 else torch.cat(out)


_INT_CHUNK = 1 << 20  # elements converted to int64 at a time (torch's integer sum converts the whole input)


def _integer_sum(values: Tensor) -> Tensor:
    """The int64 sum of integer or bool values, on the CPU, without an int64 copy of them all."""
    if values.dtype == torch.bool:
        if values.device.type == "cpu" and not values.requires_grad:  # NumPy's count: ~6x torch's here
            return torch.tensor(int(np.count_nonzero(values.numpy())), dtype=torch.int64)
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


def _column_sums(values: Tensor) -> Tensor:
    """``[K]`` int64 on the CPU: each column's exact sum of ``[n, K]`` values (floats in fixed point,
    the same bits as :func:`_exact_sum` of the column), in row chunks of bounded size.
    """
    n, k = values.shape
    total = torch.zeros(k, dtype=torch.int64, device=values.device)
    rows = max(1, _INT_CHUNK // k)
    for i in range(0, n, rows):
        part = values[i:i + rows]
        if part.is_floating_point():
            total += ops.to_fixed(part.to(torch.float64), METRIC_FRAC_BITS).sum(0)
        else:
            total += part.sum(0, dtype=torch.int64)
    return total.cpu()


def _vector(value: Any) -> Any:
    """A derived metric's value: a 1-D array-like as a numpy array, anything else as it is."""
    if isinstance(value, Tensor):
        return value.detach().cpu().numpy() if value.dim() >= 1 else value
    if isinstance(value, (list, tuple)):
        value = np.asarray(value)
    return value


class _Item(NamedTuple):
    """One metric of a row: its entries ``start:stop`` of the sums, and how to make its value."""

    name: str
    start: int
    stop: int
    is_float: bool
    count_at: int | None  # the entry of a mean's count
    vector: bool
    hist: tuple[float, ...] | None
    scale: float  # of a float entry: 2**-(fractional bits of the fixed-point sum)


@functools.lru_cache(maxsize=64)
def _range_slots(names: tuple[str, ...]) -> tuple[tuple[str, int, int], ...]:
    """Each float metric's name with the indexes of its ``#invalid`` and ``#bound`` entries (computed
    once per layout, as :func:`_layout`: no per-entry work at every step).
    """
    index = {name: i for i, name in enumerate(names)}
    return tuple((name[:-len(_INVALID)], i, index[name[:-len(_INVALID)] + _BOUND])
                 for i, name in enumerate(names) if name.endswith(_INVALID))


@functools.lru_cache(maxsize=64)
def _outside_slots(names: tuple[str, ...]) -> tuple[tuple[str, int], ...]:
    """Each metric per group's name with the index of its ``#outside`` entry."""
    return tuple((name[:-len(_OUTSIDE)], i) for i, name in enumerate(names) if name.endswith(_OUTSIDE))


def _check_ranges(step: int, names: Sequence[str], raw: np.ndarray) -> None:
    """Raise where a float metric's global entries say its values or sum leave the fixed-point range
    (every rank holds the same global sums, so every rank raises at the same step).
    """
    for metric, outside in _outside_slots(tuple(names)):
        if raw[outside]:
            raise SimulationError(f"step {step}: metric '{metric}': {int(raw[outside])} agent(s) in a group past its "
                                  "last one (group ids are 0 to groups - 1; a negative id is no group)")
    for metric, invalid, bound in _range_slots(tuple(names)):
        if raw[invalid]:
            raise SimulationError(
                f"step {step}: metric '{metric}': NaN, inf or a value of magnitude "
                f"{METRIC_VALUE_LIMIT:.3g} or more among the per-agent values (on {int(raw[invalid])} process(es)), "
                "which an exact fixed-point sum cannot hold")
        if raw[bound] >= METRIC_SUM_LIMIT:
            raise SimulationError(
                f"step {step}: metric '{metric}': its sum may exceed {METRIC_SUM_LIMIT:.3g} in "
                f"magnitude (the sum of |values|), beyond what an exact fixed-point sum holds; "
                "measure it in a larger unit (thousands, millions) or return fewer values")


@functools.lru_cache(maxsize=64)
def _layout(names: tuple[str, ...], is_float: tuple[bool, ...],
            declared: tuple[tuple[str, str, tuple[float, ...] | None, int], ...]) -> tuple[_Item, ...]:
    """The metrics of a row from the entry names of the sums (computed once per layout: a
    histogram of a thousand bins costs no per-entry work at every step).
    """
    info = {name: (reduce, hist) for name, reduce, hist, _ in declared}
    scales = {name: 2.0 ** -(METRIC_FRAC_BITS + shift) for name, _, _, shift in declared}
    index = {name: i for i, name in enumerate(names)}
    items: list[_Item] = []
    i = 0
    while i < len(names):
        name = names[i]
        if name.endswith((_COUNT, _INVALID, _BOUND, _OUTSIDE)):
            i += 1
            continue
        base, _, entry = name.rpartition("#")
        if base in info and entry.isdigit():  # a vector metric's block of entries
            stop = i + 1
            while stop < len(names) and names[stop].startswith(base + "#") and names[stop][len(base) + 1:].isdigit():
                stop += 1
            reduce, hist = info[base]
            items.append(_Item(base, i, stop, is_float[i], index[base + _COUNT] if reduce == "mean" else None, True,
                               hist, scales[base]))
            i = stop
            continue
        mean = name in info and info[name][0] == "mean"
        items.append(_Item(name, i, i + 1, is_float[i], index[name + _COUNT] if mean else None, False, None,
                           scales.get(name, 2.0 ** -METRIC_FRAC_BITS)))
        i += 1
    return tuple(items)


def metric_row(step: int, sums: MetricSums, metrics: Sequence[Metric],
               derived: Sequence[Derived] = (), params: Mapping[str, Any] | None = None,
               space: Any = None) -> dict[str, Any]:
    """The metrics of a step from global sums: ``step``, ``n_<population>``, every metric (means
    divided by their counts; a vector metric as a numpy array ``[K]``, a histogram as a
    :class:`Histogram`), then the derived ones in order (``params``: the run's parameters, for
    histogram edges and derived metrics that read them; ``space``: the run's space, for derived
    metrics that read it).

    Raises:
        ConfigError: A derived metric returned an array of more than one dimension.
        SimulationError: A float metric's values or sum out of the fixed-point range, or a metric per
            group with a group id past its last group (on every rank: the sums are global).
    """
    params = {} if params is None else params
    declared = tuple((m.name, m.reduce, m.edges(params), m.shift) for m in metrics)
    raw = np.asarray(sums.values, dtype=np.int64) if isinstance(sums.values, list) else sums.values.cpu().numpy()
    names = tuple(sums.names)
    _check_ranges(step, names, raw)
    out: dict[str, Any] = {"step": step}
    for item in _layout(names, tuple(sums.is_float), declared):
        count = None if item.count_at is None else int(raw[item.count_at])
        if item.vector:
            block = raw[item.start:item.stop]
            # int64 to float64 rounds to nearest as Python's int-to-float does: the bits of a scalar metric
            array: np.ndarray = block.astype(np.float64) * item.scale if item.is_float else block.copy()
            if count is not None:
                array = array / count if count else np.full(len(array), np.nan)
            out[item.name] = Histogram(array, item.hist) if item.hist is not None else array
            continue
        value: int | float = int(raw[item.start])
        if item.is_float:
            value = value * item.scale
        if count is not None:
            value = value / count if count else float("nan")
        out[item.name] = value
    for d in derived:
        value = _vector(d.value(dict(out), params, space))
        if isinstance(value, np.ndarray) and value.ndim > 1:
            raise ConfigError(f"derived metric '{d.name}': expected a number or a vector [K] (got an array of "
                              f"shape {list(value.shape)})")
        out[d.name] = value
    return out
