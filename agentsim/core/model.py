"""Model: parameters, an ``init`` that builds the populations and returns the space, substeps run
in definition order every step, and metrics.

Examples:
    >>> import torch
    >>> import agentsim as asim
    >>> walk = asim.Model("walk", params={"sigma": asim.Param(1.0, "step std (length units)", ge=0.0)})
    >>> @walk.substep(writes=["walker.pos"])
    ... def move(ctx: asim.Context) -> None:
    ...     w = ctx["walker"]
    ...     w["pos"] = ctx.space.wrap(w["pos"] + ctx.params["sigma"] * ctx.rng.normal(w["uid"], draws=2))
    >>> @walk.init
    ... def init(ic: asim.InitContext) -> asim.Box:
    ...     uid = ic.uids("walker", ic.n_agents)
    ...     ic.add("walker", uid=uid, pos=ic.rng.uniform(uid, "pos", draws=2) * 100)
    ...     return asim.Box((100.0, 100.0))
    >>> @walk.metric(reduce="mean")
    ... def x(state) -> torch.Tensor:
    ...     return state["walker"]["pos"][:, 0]
    >>> print(walk.configure(params={"sigma": 0.5}).plan())
    model walk
    #  substep  reads  writes      neighbors  births/deaths
    -  -------  -----  ----------  ---------  -------------
    1  move     -      walker.pos  -          -
    >>> walk.configure(params={"sigam": 0.5})
    Traceback (most recent call last):
    ...
    agentsim.errors.UnknownParameterError: unknown parameter 'sigam' for model 'walk' (valid: sigma). Perhaps ...

The same model without decorators::

    walk = asim.Model("walk", params={...}, init=init, substeps=[asim.Substep(move, writes=["walker.pos"])],
                      metrics=[asim.Metric(x, reduce="mean")])

Users compose a model by substep name, from Python (``model.configure(substeps=[...])``)
or from a config file, and override parameters; both are validated when the model is
configured. A run never changes a model: timings live on the run's result.

The positional form of release 0.1, ``Model(name, registry, substep_names, ParamSpec, init,
metrics, derive)``, was removed in 0.3: it raises a :class:`~agentsim.errors.ConfigError` that
says what to write instead (CHANGELOG.md shows the port).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch
from torch import Tensor

from agentsim.core.context import InitContext, MetricsContext
from agentsim.core.env import check_combine_dtype
from agentsim.core.metrics import Derived, Display, Metric, MetricSums, check_metric_name, local_sums, metric_row
from agentsim.core.params import Param, Params, ParamTable
from agentsim.core.policy import PolicySpec
from agentsim.core.state import State
from agentsim.core.substep import ENV, Substep, split_ref, substep_decorator
from agentsim.errors import ConfigError, did_you_mean

__all__ = ["InitFn", "Model"]

InitFn = Callable[[InitContext], Any]
_REMOVED_MODEL = ("Model(name, registry, substeps, params, init, ...) was removed in 0.3: write "
                  "Model(name, params={...}) and declare substeps, init and metrics with @model.substep(...), "
                  "@model.init and @model.metric(...); see CHANGELOG.md")
_KEYWORDS = "params, substeps, init, metrics, derived, description, default_agents"


def _check_display_keys(what: str, display: dict[str, Any], others: tuple[str, ...] = ()) -> None:
    """Only the keys of :class:`~agentsim.core.metrics.Display` (``others``: the caller's other keywords)."""
    for key in display:
        if key not in Display.KEYS:
            valid = (*others, *Display.KEYS)
            raise ConfigError(f"{what}: unexpected keyword {key!r} (valid: {', '.join(valid)})."
                              + did_you_mean(key, valid))


def _positional_arguments(name: str, fn: Callable[..., Any]) -> int:
    """How many positional arguments a derived metric's function takes: 1 (the metrics), 2 (and the
    parameters) or 3 (and the space).
    """
    try:
        parameters = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):  # a builtin without a signature: called with the metrics
        return 1
    if any(p.kind is p.VAR_POSITIONAL for p in parameters):
        return 1
    positional = [p for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
                  and p.default is p.empty]
    if len(positional) not in (1, 2, 3):
        raise ConfigError(f"derived metric '{name}': expected a function of the metrics, fn(metrics), of the "
                          f"metrics and the parameters, fn(metrics, params), or of those and the space, "
                          f"fn(metrics, params, space) (got {len(positional)} arguments)")
    return len(positional)


class Model:
    """A model definition, or a configured instance of one (see :meth:`configure`).

    Args:
        name: Model name (``"sir"``).
        params: Parameter name to :class:`~agentsim.core.params.Param`.
        substeps: :class:`~agentsim.core.substep.Substep` objects, in execution order (or declare them
            with the :meth:`substep` decorator: definition order is execution order).
        init: ``init(InitContext) -> space``: adds the populations (``ic.add``) and environment
            layers (``ic.add_env``) of step 0 and returns the space (Box, Grid, Graph or None);
            or use the :meth:`init` decorator.
        metrics: :class:`~agentsim.core.metrics.Metric` objects (or the :meth:`metric` decorator).
        derived: Name to ``fn(metrics) -> number`` of the other metrics' global values (or the
            :meth:`derived` decorator).
        description: One line for ``agentsim models`` (default: none).
        default_agents: Agent count when none is given.
    """

    def __init__(self, name: str, *removed: Any, params: Mapping[str, Param] | ParamTable | None = None,
                 substeps: Iterable[Substep] | None = None, init: InitFn | None = None,
                 metrics: Iterable[Metric] | None = None,
                 derived: Mapping[str, Callable[[dict[str, Any]], Any]] | None = None,
                 description: str = "", default_agents: int = 10_000, **removed_keywords: Any) -> None:
        if removed or {"registry", "derive"} & set(removed_keywords):
            raise ConfigError(_REMOVED_MODEL)
        if removed_keywords:
            key = next(iter(removed_keywords))
            raise ConfigError(f"Model: unexpected keyword {key!r} (valid: {_KEYWORDS})."
                              + did_you_mean(key, _KEYWORDS.split(", ")))
        if not isinstance(name, str) or not name:
            raise ConfigError(f"Model: expected a name (got {name!r})")
        self.name = name
        self.description = description
        self.default_agents = default_agents
        self.definition = object()  # shared by configured copies; renewed by every declaration
        self._available: dict[str, Substep] = {}
        self._order: list[str] | None = None  # None: every substep, in definition order
        self._metrics: list[Metric] = []
        self._derived: list[Derived] = []
        self._display: dict[str, Display] = {}  # of derived metrics and n_<population> (model.display)
        self._policies: dict[str, PolicySpec] = {}
        self._rewards: dict[str, Callable[[MetricsContext], Any]] = {}
        self._overrides: dict[str, Any] = {}
        self._resolved: Params | None = None
        self.param_table = params if isinstance(params, ParamTable) else ParamTable(params or {})
        self.init_fn: InitFn | None = None
        if metrics is not None and callable(metrics):
            raise ConfigError("Model(metrics=fn): a function fn(mc) -> {name: values} was removed in 0.3: declare "
                              "each metric with @model.metric (or pass metrics=[agentsim.Metric(fn, name=...)]); "
                              "see CHANGELOG.md")
        if derived is not None and not isinstance(derived, Mapping):
            raise ConfigError("Model(derived=...): expected {name: fn(metrics) -> number}; a function fn(metrics) -> "
                              "{name: number} (derive= of 0.1) was removed in 0.3: declare each derived metric "
                              "with @model.derived; see CHANGELOG.md")
        for step in substeps or ():
            self.add_substep(step)
        if init is not None:
            self.init(init)
        for metric in metrics or ():
            self.add_metric(metric)
        for key, fn in (derived or {}).items():
            self.add_derived(key, fn)

    # ------------------------------------------------------------------ declaring
    def add_substep(self, step: Substep) -> Substep:
        """Append a substep (execution order is the order of definition)."""
        if not isinstance(step, Substep):
            raise ConfigError(f"model '{self.name}': substeps must be agentsim.Substep objects (got {step!r})")
        if step.name in self._available:
            raise ConfigError(f"model '{self.name}': substep '{step.name}' is already defined")
        self._available[step.name] = step
        self.definition = object()  # a new definition: copies made before no longer share it
        return step

    def substep(self, name: str | Callable[..., None] | None = None, **declarations: Any) -> Any:
        """Decorator: declare the decorated function as the next substep (see
        :class:`~agentsim.core.substep.Substep` for ``reads``, ``writes``, ``neighbors``, ``reach``,
        ``births``, ``deaths``, ``agentwise``).
        """
        return substep_decorator(self.add_substep, name, **declarations)

    def init(self, fn: InitFn) -> InitFn:
        """Decorator: ``fn(InitContext) -> space`` builds step 0 (see the class docstring)."""
        if isinstance(fn, InitContext):
            raise ConfigError(f"model '{self.name}': Model.init declares the init function (a decorator); "
                              "to build step 0 from an InitContext, call model.build(ic)")
        if not callable(fn):
            raise ConfigError(f"model '{self.name}': init must be a function init(ic) -> space (got {fn!r})")
        self.init_fn = fn
        self.definition = object()
        return fn

    def add_metric(self, metric: Metric) -> Metric:
        """Append a metric (scalar, vector or histogram: :class:`~agentsim.core.metrics.Metric`)."""
        if not isinstance(metric, Metric):
            raise ConfigError(f"model '{self.name}': metrics must be agentsim.Metric objects (got {metric!r})")
        if metric.name in self.metric_names():
            raise ConfigError(f"model '{self.name}': metric '{metric.name}' is already defined")
        self._metrics.append(metric)
        self.definition = object()
        return metric

    def metric(self, name: str | Callable[..., Any] | None = None, *, reduce: str = "sum",
               hist: Iterable[float] | Callable[[Mapping[str, Any]], Iterable[float]] | None = None,
               groups: int | str | None = None,
               resolution: float | None = None, **display: Any) -> Any:
        """Decorator: ``fn(state) -> per-agent values`` is a metric.

        The values are summed exactly over agents and ranks (``reduce="sum"``) or averaged
        (``reduce="mean"``); ``[n, K]`` values make a vector metric of K entries (each column
        summed); with ``hist=edges`` (or a function of the parameters returning them) the metric
        counts the ``[n]`` values per bin; with ``groups=G`` (an int, an int parameter's name, or
        ``"space"``: one group per cell of a Grid or a line of cells) ``fn`` returns ``(group, values)``
        and the metric is the sum per group, ``[G]``;
        ``resolution=r`` sums float values in multiples of about ``r`` (default ``2**-24``) (see
        :mod:`agentsim.core.metrics`)::

            @model.metric(groups="cities")
            def infected(state):                       # [cities]: the infected people of each city
                people = state["person"]
                return people["city"], people["state"] == I

        ``label=``, ``color=``, ``panel=``, ``share_of=``, ``limits=``, ``unit=`` declare how a
        figure draws it (:class:`~agentsim.core.metrics.Display`)::

            @model.metric(name="I", label="infectious", color="tab:red", panel="compartments",
                          share_of=["S", "I", "R"], unit="fraction of the population")

        Raises:
            ConfigError: A bad name, reduction, edges or display entry (when the function is declared).
        """
        if callable(name):  # bare @model.metric
            self.add_metric(Metric(name))
            return name
        _check_display_keys(f"metric '{name}'" if name else "metric", display,
                            ("name", "reduce", "hist", "groups", "resolution"))

        def register(fn: Callable[..., Any]) -> Callable[..., Any]:
            self.add_metric(Metric(fn, name=name, reduce=reduce, hist=hist, groups=groups, resolution=resolution,
                                   **display))
            return fn

        return register

    def display(self, name: str, **display: Any) -> None:
        """Declare how a figure draws metric ``name`` (``label=``, ``color=``, ``panel=``,
        ``share_of=``, ``limits=``, ``unit=``: :class:`~agentsim.core.metrics.Display`): for a
        derived metric or a built-in count ``n_<population>``; a metric declared with
        :meth:`metric` takes them as keywords there.

        Raises:
            ConfigError: ``name`` is not a derived metric or ``n_<population>`` (declared metrics
                take the keywords in :meth:`metric`), it has its display already, or a bad entry.
        """
        what = f"metric '{name}'"
        _check_display_keys(what, display)
        declared = {m.name: m for m in self._metrics}
        if name in declared:
            raise ConfigError(f"model '{self.name}': {what} is declared with @model.metric: pass label=, color=, ... "
                              "there")
        derived = [d.name for d in self._derived]
        if name not in derived and not (isinstance(name, str) and name.startswith("n_") and len(name) > 2):
            raise ConfigError(f"model '{self.name}': display: expected a derived metric "
                              f"({', '.join(derived) or 'none'}) or a population count n_<population> (got {name!r})."
                              + did_you_mean(str(name), derived))
        if name in self._display:
            raise ConfigError(f"model '{self.name}': {what} has its display already")
        self._display[name] = Display.declare(what, **display)
        self.definition = object()

    def metric_display(self) -> dict[str, dict[str, Any]]:
        """Metric name to its declared display entries (:meth:`Display.as_dict
        <agentsim.core.metrics.Display.as_dict>`), for the metrics that declare any: what a
        trajectory file stores with each metric.
        """
        out = {m.name: m.display.as_dict() for m in self._metrics if not m.display.is_empty()}
        out.update({name: d.as_dict() for name, d in self._display.items()})
        return out

    def add_derived(self, name: str, fn: Callable[..., Any]) -> None:
        """Append a derived metric ``fn(metrics) -> number`` of the global metric values, or
        ``fn(metrics, params)`` that also reads the run's parameters.
        """
        check_metric_name(name, "derived metric")
        if not callable(fn):
            raise ConfigError(f"derived metric '{name}': expected a function of the metrics (got {fn!r})")
        if name in self.metric_names():
            raise ConfigError(f"model '{self.name}': metric '{name}' is already defined")
        self._derived.append(Derived(name, fn, _positional_arguments(name, fn)))
        self.definition = object()

    def derived(self, fn: Callable[..., Any] | None = None, **display: Any) -> Any:
        """Decorator: ``fn(metrics) -> number`` is a metric computed from the others' global values,
        named after the function (``metrics`` holds the metrics declared before it); a function of
        two arguments, ``fn(metrics, params)``, also gets the run's parameters. As
        ``@model.derived(label=..., color=..., ...)`` it also declares how a figure draws it
        (:class:`~agentsim.core.metrics.Display`).

        Raises:
            ConfigError: A bad name or display entry (when the function is declared).
        """
        if fn is not None:
            if display:
                raise ConfigError(f"model '{self.name}': derived: pass the display entries as "
                                  "@model.derived(label=..., ...), with the function decorated")
            self.add_derived(getattr(fn, "__name__", ""), fn)
            return fn
        _check_display_keys("derived metric", display)

        def register(function: Callable[..., Any]) -> Callable[..., Any]:
            name = getattr(function, "__name__", "")
            Display.declare(f"metric '{name}'", **display)  # a bad entry raises before anything is added
            self.add_derived(name, function)
            if display:
                self.display(name, **display)
            return function

        return register

    def policy(self, population: str, *, action: str, observations: int, actions: int = 0, action_dim: int = 0,
               name: str | None = None, reads: Iterable[str] = (), neighbors: Mapping[str, Iterable[str]] | None = None,
               reach: str | float = "global") -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Decorator: the decorated ``observe(ctx) -> [n, observations]`` float32 is the observation
        function of a policy whose agents, the ``population``, write their action to ``action``
        (int64 ``[n]``, one of ``actions`` choices; or float32 ``[n, action_dim]``). It runs as the
        next substep, named after the function (see :mod:`agentsim.core.policy`); ``reads``,
        ``neighbors`` and ``reach`` declare what the observation reads, as for a substep.
        """
        what_policy = f"policy '{name}'" if name else f"policy of '{population}'"
        for what, value in (("observations", observations), ("actions", actions), ("action_dim", action_dim)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ConfigError(f"{what_policy}: {what}: expected an int >= 0 (got {value!r})")
        if observations < 1 or (actions > 0) == (action_dim > 0) or actions == 1:
            raise ConfigError(f"{what_policy}: expected observations >= 1 and either actions=K >= 2 (discrete) "
                              f"or action_dim=D >= 1 (continuous) (got observations={observations}, "
                              f"actions={actions}, action_dim={action_dim})")

        def register(observe: Callable[..., Any]) -> Callable[..., Any]:
            key = str(name or getattr(observe, "__name__", ""))
            spec = PolicySpec(key, population, action, observations, actions, action_dim, observe)

            def act(ctx: Any) -> None:
                obs = observe(ctx)
                agents = ctx[population]
                if not isinstance(obs, Tensor) or tuple(obs.shape) != (agents.n, observations):
                    got = list(obs.shape) if isinstance(obs, Tensor) else type(obs).__name__
                    raise ConfigError(f"policy '{key}': observe must return [{agents.n}, {observations}] (got {got})")
                agents[action] = ctx.actor(key).act(agents["uid"], obs.to(torch.float32), ctx.rng)

            self.add_substep(Substep(act, name=key, reads=reads, writes=[f"{population}.{action}"],
                                     neighbors=neighbors, reach=reach, doc=(observe.__doc__ or "").strip()))
            self._policies[key] = spec
            return observe

        return register

    def reward(self, population: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Decorator: ``fn(state) -> reward`` or ``fn(state) -> (reward, done)``: each agent of
        ``population``'s reward ``[n]`` float for the step just taken (``state`` as a metric's, after
        the step) and, optionally, ``done`` ``[n]`` bool: the agent's episode ended with this step.

        ``done`` only cuts the agent's trajectory for the advantage estimate (nothing is bootstrapped
        across it); the agent keeps acting in the same run. Putting the agent back to a start state
        is the model's own business: a substep that resets the fields of agents flagged done (for
        instance through a ``reset`` field written by the same substep that ends the episode).
        Death and the horizon end trajectories without a ``done``.
        """
        def register(fn: Callable[..., Any]) -> Callable[..., Any]:
            if population in self._rewards:
                raise ConfigError(f"model '{self.name}': population '{population}' already has a reward")
            self._rewards[population] = fn
            self.definition = object()
            return fn

        return register

    @property
    def policies(self) -> dict[str, PolicySpec]:
        """The declared policies, by name."""
        return dict(self._policies)

    @property
    def rewards(self) -> dict[str, Callable[[MetricsContext], Any]]:
        """Population to its reward function."""
        return dict(self._rewards)

    def functions(self) -> list[Callable[..., Any]]:
        """The model's own functions: init, substeps, metrics, derived metrics, rewards and policy
        observations (where a model is defined: :func:`~agentsim.runner.launch.model_ref`).
        """
        return [fn for fn in [self.init_fn, *(s.fn for s in self.substeps),
                              *(getattr(m, "fn", None) for m in self._metrics), *(d.fn for d in self._derived),
                              *self._rewards.values(), *(p.observe for p in self._policies.values())]
                if fn is not None]

    def metric_names(self) -> list[str]:
        """The names of the declared metrics and derived metrics (not ``n_<population>``)."""
        return [m.name for m in self._metrics if m.name] + [d.name for d in self._derived if d.name]

    # ------------------------------------------------------------------ configured view
    @property
    def substeps(self) -> list[Substep]:
        """The substeps that run, in order."""
        if self._order is None:
            return list(self._available.values())
        return [self._available[k] for k in self._order]

    @property
    def params(self) -> Params:
        """The resolved parameters (read-only)."""
        if self._resolved is None:
            self._resolved = self.param_table.resolve(self._overrides, model=self.name)
        return self._resolved

    def _check_order(self, names: Iterable[str]) -> list[str]:
        if isinstance(names, str):
            raise ConfigError(f"substeps: expected a list of names (got the string {names!r})")
        order = list(names)
        for key in order:
            if key not in self._available:
                raise ConfigError(f"unknown substep '{key}' (valid: {', '.join(self._available) or 'none'})."
                                  + did_you_mean(key, self._available))
        if not order:
            raise ConfigError(f"model '{self.name}' needs at least one substep (valid: {list(self._available)})")
        return order

    def configure(self, params: Mapping[str, Any] | None = None, substeps: Iterable[str] | None = None) -> Model:
        """A copy with parameters overridden and, optionally, a new substep order (by name).

        Raises:
            ConfigError: unknown / missing / mistyped parameter, unknown substep.
        """
        new = Model.__new__(Model)
        new.__dict__.update(self.__dict__)
        # The new copy's state is set here, by its own class (hence the noqa). Own containers:
        # declaring more on one copy leaves the others alone.
        new._available = dict(self._available)  # noqa: SLF001
        new._metrics, new._derived = list(self._metrics), list(self._derived)  # noqa: SLF001
        new._display = dict(self._display)  # noqa: SLF001
        new._policies, new._rewards = dict(self._policies), dict(self._rewards)  # noqa: SLF001
        new._overrides = {**self._overrides, **dict(params or {})}  # noqa: SLF001
        new._resolved = None  # noqa: SLF001
        new.params  # noqa: B018  validate now
        if substeps is not None:
            new._order = new._check_order(substeps)  # noqa: SLF001
        return new

    def same_definition(self, other: object) -> bool:
        """Whether ``other`` is this model or a configured copy of it with nothing declared since
        (only parameters and the substep order differ): what workers rebuild from a name.
        """
        return isinstance(other, Model) and other.definition is self.definition

    # ------------------------------------------------------------------ what the engine calls
    def check_ready(self) -> None:
        """Raise a ConfigError if the model cannot run (no init, no substep)."""
        if self.init_fn is None:
            raise ConfigError(f"model '{self.name}' has no init: declare one with @model.init or init=")
        if not self.substeps:
            raise ConfigError(f"model '{self.name}' has no substep: declare one with @model.substep(...)")

    def build(self, ic: InitContext) -> tuple[State, Any]:
        """Run ``init``: the state at step 0 and the space."""
        self.check_ready()
        assert self.init_fn is not None
        space = self.init_fn(ic)
        if isinstance(space, tuple):
            raise ConfigError(f"model '{self.name}': init returns the space (got a tuple; populations are added "
                              "with ic.add(...))")
        return ic.state(), space

    def metric_sums(self, mc: MetricsContext) -> MetricSums:
        """This rank's exact metric sums (see :mod:`agentsim.core.metrics`)."""
        return local_sums(self._metrics, mc)

    def metric_row(self, step: int, sums: MetricSums, params: Mapping[str, Any] | None = None,
                   space: Any = None) -> dict[str, Any]:
        """The metrics of ``step`` from the global sums (``params``, ``space``: the run's)."""
        return metric_row(step, sums, self._metrics, self._derived, self.params if params is None else params,
                          space)

    def validate_state(self, state: State) -> None:
        """Check that every declared field reference exists in ``state`` (run start)."""
        for name in self.metric_names():
            if name.startswith("n_") and name[2:] in state.populations:
                raise ConfigError(f"model '{self.name}': metric '{name}' has the name of the built-in count of "
                                  f"population '{name[2:]}' (every run reports n_<population>); rename it")
        counts = [f"n_{pop}" for pop in state.populations]
        for name, entries in self.metric_display().items():
            if name.startswith("n_") and name not in self.metric_names() and name not in counts:
                raise ConfigError(f"model '{self.name}': display of '{name}', but the populations are "
                                  f"{list(state.populations)} (counts: {', '.join(counts)})."
                                  + did_you_mean(name, counts))
            for other in entries.get("share_of", ()):
                if other not in self.metric_names() and other not in counts:
                    valid = [*self.metric_names(), *counts]
                    raise ConfigError(f"model '{self.name}': metric '{name}' is drawn as a share_of '{other}', which "
                                      f"is no metric (valid: {', '.join(valid)})." + did_you_mean(other, valid))
        for s in self.substeps:
            refs = [*s.reads, *s.writes] + [f"{p}.{f}" for p, fs in s.neighbors.items() for f in fs]
            for ref in refs:
                pop, field = split_ref(ref)
                if pop == ENV:
                    if field not in state.env:
                        raise ConfigError(f"substep '{s.name}' declares 'env.{field}', but the environment "
                                          f"has {sorted(state.env)}." + did_you_mean(field, state.env))
                    continue
                p = state[pop]
                if field not in p.specs:
                    raise ConfigError(f"substep '{s.name}' declares '{ref}', but '{pop}' has fields "
                                      f"{sorted(p.specs)}." + did_you_mean(field, p.specs))
            for pop in (*s.births, *s.deaths):
                state[pop]
            for layer in s.writable(ENV):
                check_combine_dtype(s.name, layer, s.env_combine(layer), state.env[layer].dtype)
        for spec in self._policies.values():
            declared = state[spec.population].specs.get(spec.action)
            want = (torch.int64, ()) if spec.discrete else (torch.float32, (spec.action_dim,))
            if declared is None or (declared.dtype, declared.shape) != want:
                got = "no such field" if declared is None else f"{declared.dtype} {list(declared.shape)}"
                raise ConfigError(f"policy '{spec.name}': the action field '{spec.population}.{spec.action}' must be "
                                  f"{want[0]} with per-agent shape {list(want[1])} (got {got})")
        for pop in self._rewards:
            state[pop]

    def plan(self, timings: Mapping[str, float] | None = None) -> str:
        """The execution order as a table: reads, writes, neighbors, births/deaths and, given the
        ``timings`` of a run (substep to mean seconds per step), milliseconds per step and share.
        """
        head = ["#", "substep", "reads", "writes", "neighbors", "births/deaths"]
        if timings:
            head += ["ms/step", "share"]
        rows = []
        total = sum(timings.values()) if timings else 0.0
        for i, s in enumerate(self.substeps, 1):
            nb = "; ".join(f"{p}:{','.join(f)}" for p, f in s.neighbors.items())
            nb = f"{nb} (reach {s.reach})" if nb else nb
            bd = ", ".join([f"+{p}" for p in s.births] + [f"-{p}" for p in s.deaths])
            row = [str(i), s.name, ", ".join(s.reads) or "-", ", ".join(s.writes) or "-", nb or "-", bd or "-"]
            if timings:
                seconds = timings.get(s.name, 0.0)
                row += [f"{seconds * 1e3:.3f}", f"{(seconds / total if total else 0):.1%}"]
            rows.append(row)
        widths = [max(len(r[c]) for r in [head, *rows]) for c in range(len(head))]

        def fmt(r: list[str]) -> str:
            return "  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip()

        title = f"model {self.name}: {self.description}" if self.description else f"model {self.name}"
        return "\n".join([title, fmt(head), fmt(["-" * w for w in widths]), *[fmt(r) for r in rows]])

    def __repr__(self) -> str:
        return f"Model('{self.name}', substeps={[s.name for s in self.substeps]})"
