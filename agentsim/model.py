"""Model: an ordered list of registered substeps, declared parameters, an initializer and metrics.

A model module (see ``models/sir.py``) builds a :class:`Model` from its own
:class:`~agentsim.substep.Registry`. Users compose models by substep name, from
Python (``model.configure(substeps=[...])``) or from a config file, and override
parameters; both are validated when the model is configured.

Examples:
    >>> from agentsim.models.randomwalk import MODEL
    >>> m = MODEL.configure(params={"step_size": 0.5})
    >>> m.params["step_size"]
    0.5
    >>> print(m.plan())  # doctest: +ELLIPSIS
    model randomwalk...
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from .errors import ConfigError, did_you_mean
from .params import ParamSpec
from .random import CounterRNG
from .state import State
from .substep import ENV, Registry, Substep, split_ref


@dataclass
class InitContext:
    """What a model's ``init`` function receives."""

    params: dict[str, Any]
    n_agents: int
    rng: CounterRNG
    device: torch.device


@dataclass
class MetricsContext:
    """What a model's ``metrics`` function receives: read-only state, params and space.

    Environment layers may be replicated or overlap (halo cells) across ranks; use
    :meth:`owned_env` for metrics so every cell is counted once over all ranks.
    """

    state: State
    params: dict[str, Any]
    space: Any
    step: int
    owned_env_fn: Callable[[str], Tensor] | None = None

    def owned_env(self, name: str) -> Tensor:
        """The cells of env layer ``name`` this rank owns, flattened (all of them on one process)."""
        if self.owned_env_fn is not None:
            return self.owned_env_fn(name)
        return self.state.env[name].reshape(-1)


InitFn = Callable[[InitContext], "tuple[State, Any]"]
MetricsFn = Callable[[MetricsContext], Mapping[str, Tensor]]
DeriveFn = Callable[[dict[str, float]], Mapping[str, float]]


class Model:
    """A model definition, or a configured instance of one (see :meth:`configure`).

    Args:
        name: Model name (``"sir"``).
        registry: The substeps this model can use.
        substeps: Default execution order, by name.
        params: Declared parameters.
        init: ``init(InitContext) -> (State, space)``: the initial state (step 0) and the
            space object (Box, Grid, Graph or None).
        metrics: ``metrics(MetricsContext) -> {name: scalar tensor}`` of *sums over
            agents* (counts, or float sums computed with ``ops.exact_sum``); reduced
            over ranks by the engine.
        derive: Optional ``derive(metrics) -> {name: value}`` of quantities computed
            from the global sums (ratios, means).
        description: One line for ``agentsim models``.
        default_agents: Agent count when none is given.
    """

    def __init__(
        self,
        name: str,
        registry: Registry,
        substeps: Iterable[str],
        params: ParamSpec,
        init: InitFn,
        metrics: MetricsFn | None = None,
        derive: DeriveFn | None = None,
        description: str = "",
        default_agents: int = 10_000,
    ) -> None:
        self.name = name
        self.registry = registry
        self.param_spec = params
        self.init = init
        self.metrics_fn = metrics
        self.derive_fn = derive
        self.description = description
        self.default_agents = default_agents
        self.substeps: list[Substep] = self._resolve_substeps(substeps)
        self.params: dict[str, Any] = params.resolve({})
        self.timings: dict[str, float] | None = None

    def _resolve_substeps(self, names: Iterable[str]) -> list[Substep]:
        if isinstance(names, str):
            raise ConfigError(f"substeps: expected a list of names (got the string {names!r})")
        out = [self.registry[n] for n in names]
        if not out:
            raise ConfigError(f"model '{self.name}' needs at least one substep (valid: {self.registry.names()})")
        return out

    def configure(self, params: Mapping[str, Any] | None = None,
                  substeps: Iterable[str] | None = None) -> Model:
        """A copy with parameters overridden and, optionally, a new substep order.

        Raises:
            ConfigError: unknown / missing / mistyped parameter, unknown substep.
        """
        new = Model.__new__(Model)
        new.__dict__.update(self.__dict__)
        merged = {**self.params, **dict(params or {})}
        for k in dict(params or {}):
            if k not in self.param_spec.params:
                raise ConfigError(f"unknown parameter '{k}' for model '{self.name}' "
                                  f"(valid: {', '.join(self.param_spec.params)})."
                                  + did_you_mean(k, self.param_spec.params))
        new.params = self.param_spec.resolve(merged)
        new.substeps = self._resolve_substeps(substeps) if substeps is not None else list(self.substeps)
        new.timings = None
        return new

    def validate_state(self, state: State) -> None:
        """Check that every declared field reference exists in ``state`` (run start)."""
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

    def plan(self) -> str:
        """The execution order as a table: reads, writes, neighbors, births/deaths and,
        after a run, mean milliseconds per step and share of the step time."""
        head = ["#", "substep", "reads", "writes", "neighbors", "births/deaths"]
        if self.timings:
            head += ["ms/step", "share"]
        rows = []
        total = sum(self.timings.values()) if self.timings else 0.0
        for i, s in enumerate(self.substeps, 1):
            nb = "; ".join(f"{p}:{','.join(f)}" for p, f in s.neighbors.items())
            nb = f"{nb} (reach {s.reach})" if nb else nb
            bd = ", ".join([f"+{p}" for p in s.births] + [f"-{p}" for p in s.deaths])
            row = [str(i), s.name, ", ".join(s.reads) or "-", ", ".join(s.writes) or "-", nb or "-", bd or "-"]
            if self.timings:
                ms = self.timings.get(s.name, 0.0) * 1e3
                row += [f"{ms:.3f}", f"{(self.timings.get(s.name, 0.0) / total if total else 0):.1%}"]
            rows.append(row)
        widths = [max(len(r[c]) for r in [head, *rows]) for c in range(len(head))]
        fmt = lambda r: "  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip()  # noqa: E731
        lines = [f"model {self.name}: {self.description}", fmt(head), fmt(["-" * w for w in widths])]
        lines += [fmt(r) for r in rows]
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"Model('{self.name}', substeps={[s.name for s in self.substeps]})"
