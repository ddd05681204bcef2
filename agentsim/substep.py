"""Substeps: vectorized functions over agent tensors that declare what they touch.

A substep is a function ``fn(ctx) -> None`` that reads fields through
``ctx[population][field]`` and writes them with ``ctx[population][field] = new``.
It declares, when registered:

- ``reads`` / ``writes``: field references ``"population.field"`` or ``"env.name"``;
- ``neighbors``: the fields it reads from *other* agents (``{"boid": ["pos", "vel"]}``);
  on several ranks these, and only these, travel in halo exchanges;
- ``reach``: how far those other agents can be: a length or the name of a length
  parameter (continuous space, e.g. ``"vision"``), ``"cell"`` (same grid cell),
  ``"moore:radius"`` (grid cells within a Moore radius given by a parameter or an int),
  ``"graph"`` (contacts in the model's graph) or ``"global"`` (any agent; the
  default). A spatial partitioner sizes halos from it; one process ignores it;
- ``births`` / ``deaths``: populations it may add agents to or remove agents from;
- ``agentwise``: a promise that each agent's written values depend only on its own
  fields and on its neighbors' declared fields within ``reach`` (random draws keyed by
  uid, no sums over all agents, no dependence on row order), so the engine may run the
  substep on any subset of the agents as targets and get the same values, or run it
  while some agents miss neighbors and keep only the values of the others. Its
  ``ctx.flag`` conditions are per agent (``[n, ...]``), so that the engine keeps the same
  agents' flags. It needs ``writes`` of one population only, no env writes, births or
  deaths, must not raise on data (flag instead), and writes tensors it does not keep
  (the engine may update them in place). The spatial
  partitioner uses it to overlap the halo exchange with the substep's own work
  (:mod:`agentsim.distributed.overlap`).

The engine enforces the declaration: reading or writing an undeclared field, or
modifying a read-only tensor in place, raises :class:`~agentsim.errors.FieldAccessError`.

A :class:`Registry` belongs to one model (there is no process-wide registry), so
two models may both define ``move`` without clashing.

Examples:
    >>> registry = Registry()
    >>> @registry.substep(reads=["walker.pos"], writes=["walker.pos"])
    ... def move(ctx):
    ...     walkers = ctx["walker"]
    ...     walkers["pos"] = walkers["pos"] + 1.0
    >>> registry["move"].writes
    ('walker.pos',)
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from .errors import ConfigError, did_you_mean

if TYPE_CHECKING:
    from .engine import Context

ENV = "env"


class SubstepFn(Protocol):
    def __call__(self, ctx: Context) -> None: ...


def split_ref(ref: str) -> tuple[str, str]:
    """``"sheep.energy" -> ("sheep", "energy")``; raises ConfigError on a malformed reference."""
    if not isinstance(ref, str) or ref.count(".") != 1 or ref.startswith(".") or ref.endswith("."):
        raise ConfigError(f"expected a field reference 'population.field' or 'env.name' (got {ref!r})")
    pop, name = ref.split(".")
    return pop, name


def check_reach(reach: str | float) -> None:
    """Validate a ``reach`` declaration (see the module docstring)."""
    if isinstance(reach, bool) or not isinstance(reach, (str, int, float)):
        raise ConfigError(f"reach: expected a length, a parameter name, 'cell', 'moore:R', 'graph' "
                          f"or 'global' (got {reach!r})")
    if isinstance(reach, (int, float)) and reach < 0:
        raise ConfigError(f"reach: expected a length >= 0 (got {reach})")


def resolve_reach(substep: Substep, params: Mapping[str, object]) -> tuple[str, float]:
    """``substep.reach`` as ``(kind, value)`` with parameters looked up in ``params``.

    Kinds: ``"global"``, ``"cell"``, ``"graph"`` (value 0), ``"moore"`` (value: radius in
    cells) and ``"length"`` (value: length units).

    Raises:
        ConfigError: the reach names a parameter that ``params`` does not have.

    Examples:
        >>> step = Substep("look", lambda ctx: None, reach="vision")
        >>> resolve_reach(step, {"vision": 10.0})
        ('length', 10.0)
        >>> resolve_reach(Substep("nb", lambda ctx: None, reach="moore:2"), {})
        ('moore', 2.0)
    """
    reach = substep.reach
    if reach in ("global", "cell", "graph"):
        return str(reach), 0.0
    if isinstance(reach, str) and reach.startswith("moore:"):
        radius = reach.split(":", 1)[1]
        if radius in params:
            return "moore", float(params[radius])  # type: ignore[arg-type]
        try:
            return "moore", float(int(radius))
        except ValueError:
            raise ConfigError(f"substep '{substep.name}': reach {reach!r} names no parameter and no int "
                              f"(parameters: {', '.join(params)})." + did_you_mean(radius, params)) from None
    if isinstance(reach, str):
        if reach not in params:
            raise ConfigError(f"substep '{substep.name}': reach {reach!r} is not a parameter "
                              f"(valid: {', '.join(params)})." + did_you_mean(reach, params))
        return "length", float(params[reach])  # type: ignore[arg-type]
    return "length", float(reach)


@dataclass(frozen=True)
class Substep:
    """A registered substep and its declared data flow."""

    name: str
    fn: SubstepFn
    reads: tuple[str, ...] = ()
    writes: tuple[str, ...] = ()
    neighbors: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    births: tuple[str, ...] = ()
    deaths: tuple[str, ...] = ()
    doc: str = ""
    reach: str | float = "global"
    agentwise: bool = False

    def touches(self, population: str) -> bool:
        refs = (*self.reads, *self.writes)
        return (any(split_ref(r)[0] == population for r in refs) or population in self.neighbors
                or population in self.births or population in self.deaths)

    def readable(self, population: str) -> set[str]:
        """Fields of ``population`` this substep may read (``uid`` always)."""
        own = {split_ref(r)[1] for r in (*self.reads, *self.writes) if split_ref(r)[0] == population}
        return own | set(self.neighbors.get(population, ())) | {"uid"}

    def writable(self, population: str) -> set[str]:
        return {split_ref(r)[1] for r in self.writes if split_ref(r)[0] == population}

    def written_populations(self) -> set[str]:
        """The populations (or ``ENV``) whose fields this substep writes."""
        return {split_ref(r)[0] for r in self.writes}

    def __call__(self, ctx: Context) -> None:
        self.fn(ctx)


class Registry:
    """The substeps a model can use, by name. One registry per model module."""

    def __init__(self) -> None:
        self._substeps: dict[str, Substep] = {}

    def substep(
        self,
        name: str | None = None,
        *,
        reads: Iterable[str] = (),
        writes: Iterable[str] = (),
        neighbors: Mapping[str, Iterable[str]] | None = None,
        births: Iterable[str] = (),
        deaths: Iterable[str] = (),
        reach: str | float = "global",
        agentwise: bool = False,
    ) -> Callable[[SubstepFn], Substep]:
        """Decorator that registers ``fn`` as a substep (see the module docstring)."""

        def register(fn: SubstepFn) -> Substep:
            key = name or getattr(fn, "__name__", None)
            if not key:
                raise ConfigError("a substep needs a name")
            if key in self._substeps:
                raise ConfigError(f"substep '{key}' is already registered in this registry")
            reads_t, writes_t = tuple(reads), tuple(writes)
            for ref in (*reads_t, *writes_t):
                split_ref(ref)
            nb = {pop: tuple(fields) for pop, fields in (neighbors or {}).items()}
            check_reach(reach)
            births_t, deaths_t = tuple(births), tuple(deaths)
            if not isinstance(agentwise, bool):
                raise ConfigError(f"substep '{key}': agentwise: expected True or False (got {agentwise!r})")
            step = Substep(key, fn, reads_t, writes_t, nb, births_t, deaths_t,
                           (fn.__doc__ or "").strip().split("\n")[0], reach, agentwise)
            if agentwise:
                written = step.written_populations()
                if ENV in written or len(written) > 1 or births_t or deaths_t:
                    raise ConfigError(
                        f"substep '{key}': agentwise=True needs writes of one population only and no env "
                        f"writes, births or deaths (got writes={list(writes_t)}, births={list(births_t)}, "
                        f"deaths={list(deaths_t)})")
            self._substeps[key] = step
            return step

        return register

    def __getitem__(self, name: str) -> Substep:
        try:
            return self._substeps[name]
        except KeyError:
            raise ConfigError(
                f"unknown substep '{name}' (valid: {', '.join(self._substeps) or 'none'})."
                + did_you_mean(name, self._substeps)
            ) from None

    def __contains__(self, name: object) -> bool:
        return name in self._substeps

    def __iter__(self) -> Iterator[str]:
        return iter(self._substeps)

    def names(self) -> list[str]:
        return list(self._substeps)
