"""Substeps: vectorized functions over agent tensors that declare what they touch.

A substep is a function ``fn(ctx) -> None`` that reads fields through
``ctx[population][field]`` and writes them with ``ctx[population][field] = new``.
It declares, when registered:

- ``reads`` / ``writes``: field references ``"population.field"`` or ``"env.name"``;
- ``neighbors``: the fields it reads from *other* agents (``{"boid": ["pos", "vel"]}``);
  on several ranks these, and only these, travel in halo exchanges;
- ``reach``: how far those other agents can be: a length or the name of a length
  parameter (continuous space, e.g. ``"vision"``, or ``"2*vision"``), ``"cell"`` (same grid
  cell), ``"moore:radius"`` (grid cells within a Moore radius given by an int, a parameter
  or an int times a parameter: ``"moore:2*vision_max"``),
  ``"graph"`` (contacts in the model's graph) or ``"global"`` (any agent; the
  default). A spatial partitioner sizes halos from it; one process ignores it;
- ``births`` / ``deaths``: populations it may add agents to or remove agents from;
- ``combine``: for env layers it writes, how the writes of several processes combine
  (``{"env.pheromone": "add"}``; ``"set"``, the default, ``"add"``, ``"min"``, ``"max"``: see
  :mod:`agentsim.core.env`). Every process holds every env layer whole and up to date, so a
  substep may read env anywhere;
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

Declare a substep with the :meth:`Model.substep <agentsim.core.model.Model.substep>` decorator,
or build one with :class:`Substep` (``Substep(move, writes=["walker.pos"])``) and pass it to
``Model(..., substeps=[...])``. Writing a field implies reading it. (The ``Registry`` and the
positional ``Substep(name, fn, reads, writes, ...)`` of release 0.1 were removed in 0.3: see
CHANGELOG.md.)

Examples:
    >>> def move(ctx):
    ...     walkers = ctx["walker"]
    ...     walkers["pos"] = walkers["pos"] + 1.0
    >>> step = Substep(move, writes=["walker.pos"])
    >>> step.name, step.writes, sorted(step.readable("walker"))
    ('move', ('walker.pos',), ['pos', 'uid'])
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from agentsim.errors import ConfigError, did_you_mean

if TYPE_CHECKING:
    from agentsim.core.context import Context

ENV = "env"


class SubstepFn(Protocol):
    """A substep's function: ``fn(ctx) -> None``."""

    def __call__(self, ctx: Context) -> None:
        """Update the agents of ``ctx`` (see :class:`~agentsim.core.context.Context`)."""


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


def resolve_reach(substep: Substep, params: Mapping[str, Any]) -> tuple[str, float]:
    """``substep.reach`` as ``(kind, value)`` with parameters looked up in ``params``.

    Kinds: ``"global"``, ``"cell"``, ``"graph"`` (value 0), ``"moore"`` (value: radius in
    cells) and ``"length"`` (value: length units).

    Raises:
        ConfigError: the reach names a parameter that ``params`` does not have.

    Examples:
        >>> def look(ctx): ...
        >>> resolve_reach(Substep(look, reach="vision"), {"vision": 10.0})
        ('length', 10.0)
        >>> resolve_reach(Substep(look, reach="moore:2"), {})
        ('moore', 2.0)
        >>> resolve_reach(Substep(look, reach="moore:2*vision"), {"vision": 6})
        ('moore', 12.0)
    """
    reach = substep.reach
    if reach in ("global", "cell", "graph"):
        return str(reach), 0.0
    if isinstance(reach, str) and reach.startswith("moore:"):
        radius = reach.split(":", 1)[1]
        try:
            return "moore", float(int(radius))
        except ValueError:
            pass
        factor, name = _scaled(radius)
        if name not in params:
            raise ConfigError(f"substep '{substep.name}': reach {reach!r} names no parameter and no int "
                              f"(parameters: {', '.join(params)})." + did_you_mean(name, params))
        return "moore", factor * float(params[name])
    if isinstance(reach, str):
        factor, name = _scaled(reach)
        if name not in params:
            raise ConfigError(f"substep '{substep.name}': reach {reach!r} is not a parameter "
                              f"(valid: {', '.join(params)})." + did_you_mean(name, params))
        return "length", factor * float(params[name])
    return "length", float(reach)


def _scaled(text: str) -> tuple[float, str]:
    """``"2*vision"`` -> ``(2.0, "vision")``; ``"vision"`` -> ``(1.0, "vision")``."""
    factor, star, name = text.partition("*")
    if not star:
        return 1.0, text
    try:
        return float(int(factor.strip())), name.strip()
    except ValueError:
        return 1.0, text


COMBINES = ("set", "add", "min", "max")  # how env writes of several processes combine (agentsim.core.env)


def _combines(name: str, combine: Mapping[str, str] | None, writes: tuple[str, ...]) -> dict[str, str]:
    """``{"env.layer": mode}`` checked against ``writes``: env layer name to mode."""
    if combine is None:
        return {}
    if not isinstance(combine, Mapping):
        raise ConfigError(f"substep '{name}': combine: expected {{'env.layer': 'set'|'add'|'min'|'max'}} "
                          f"(got {combine!r})")
    env_writes = [r for r in writes if split_ref(r)[0] == ENV]
    out = {}
    for ref, mode in combine.items():
        if ref not in env_writes:
            raise ConfigError(f"substep '{name}': combine names {ref!r}, which is not an env layer it writes "
                              f"(env writes: {env_writes or 'none'}; declare it in writes= as 'env.<layer>')."
                              + did_you_mean(str(ref), env_writes))
        if mode not in COMBINES:
            raise ConfigError(f"substep '{name}': combine for {ref}: expected one of {', '.join(COMBINES)} "
                              f"(got {mode!r})." + did_you_mean(str(mode), COMBINES))
        out[split_ref(ref)[1]] = mode
    return out


def _refs(what: str, name: str, refs: Iterable[str]) -> tuple[str, ...]:
    if isinstance(refs, str):
        raise ConfigError(f"substep '{name}': {what}: expected a list of 'population.field' (got the string {refs!r})")
    out = tuple(refs)
    for ref in out:
        split_ref(ref)
    return out


def _names(what: str, name: str, pops: Iterable[str]) -> tuple[str, ...]:
    if isinstance(pops, str):
        raise ConfigError(f"substep '{name}': {what}: expected a list of population names (got the string {pops!r})")
    return tuple(pops)


@dataclass(frozen=True, init=False, eq=False)
class Substep:
    """A substep: a function ``fn(ctx) -> None`` and its declared data flow.

    Args:
        fn: The function; ``ctx`` is an :class:`~agentsim.core.context.Context`.
        name: Default: ``fn.__name__``.
        reads, writes: Field references ``"population.field"`` or ``"env.name"`` (writes imply reads).
        neighbors: Population to the fields read from other agents through ``ctx.neighbors``.
        births, deaths: Populations it may add agents to (``ctx.spawn``) or remove from (``ctx.kill``).
        reach: How far the neighbors it reads can be (see the module docstring).
        agentwise: The promise described in the module docstring.
        combine: ``{"env.layer": mode}``: how the env writes of several processes combine
            (``"set"`` by default; see :mod:`agentsim.core.env`).

    Raises:
        ConfigError: A bad declaration; or ``Substep(name, fn, reads, writes, ...)``, the positional
            form of release 0.1 (removed in 0.3: the message says what to write instead).
    """

    name: str
    fn: SubstepFn
    reads: tuple[str, ...]
    writes: tuple[str, ...]
    neighbors: Mapping[str, tuple[str, ...]]
    births: tuple[str, ...]
    deaths: tuple[str, ...]
    doc: str
    reach: str | float
    agentwise: bool
    combine: Mapping[str, str]

    def __init__(self, fn: SubstepFn | str, *args: Any, name: str | None = None, reads: Iterable[str] = (),
                 writes: Iterable[str] = (), neighbors: Mapping[str, Iterable[str]] | None = None,
                 births: Iterable[str] = (), deaths: Iterable[str] = (), reach: str | float = "global",
                 agentwise: bool = False, doc: str | None = None,
                 combine: Mapping[str, str] | None = None) -> None:
        if isinstance(fn, str):  # Substep(name, fn, reads, writes, ...) of release 0.1
            raise ConfigError(f"Substep({fn!r}, fn, reads, writes, ...) was removed in 0.3: write Substep(fn, "
                              f"name={fn!r}, reads=[...], writes=[...]) or declare it with @model.substep(...); "
                              "see CHANGELOG.md")
        if args:
            raise ConfigError("Substep(fn, ...): declarations are keyword arguments (reads=, writes=, neighbors=, ...)")
        if not callable(fn):
            raise ConfigError(f"substep: expected a function fn(ctx) (got {fn!r})")
        key = name or getattr(fn, "__name__", None)
        if not isinstance(key, str) or not key:
            raise ConfigError(f"a substep needs a name: pass name= (got {key!r})")
        if neighbors is not None and not isinstance(neighbors, Mapping):
            raise ConfigError(f"substep '{key}': neighbors: expected {{population: [fields]}} (got {neighbors!r})")
        nb = {pop: _names(f"neighbors[{pop!r}]", key, fields) for pop, fields in (neighbors or {}).items()}
        check_reach(reach)
        if not isinstance(agentwise, bool):
            raise ConfigError(f"substep '{key}': agentwise: expected True or False (got {agentwise!r})")
        text = (fn.__doc__ or "").strip().split("\n")[0] if doc is None else doc
        write_refs = _refs("writes", key, writes)
        values = {"name": key, "fn": fn, "reads": _refs("reads", key, reads), "writes": write_refs,
                  "neighbors": nb, "births": _names("births", key, births), "deaths": _names("deaths", key, deaths),
                  "doc": text, "reach": reach, "agentwise": agentwise,
                  "combine": _combines(key, combine, write_refs)}
        for field_name, value in values.items():
            object.__setattr__(self, field_name, value)
        # readable/writable/touches per population, computed once: the engine asks at every call
        object.__setattr__(self, "_field_sets", {})
        if agentwise:
            written = self.written_populations()
            if ENV in written or len(written) > 1 or self.births or self.deaths:
                raise ConfigError(
                    f"substep '{key}': agentwise=True needs writes of one population only and no env "
                    f"writes, births or deaths (got writes={list(self.writes)}, births={list(self.births)}, "
                    f"deaths={list(self.deaths)})")

    def __repr__(self) -> str:
        return f"Substep({self.name!r}, reads={list(self.reads)}, writes={list(self.writes)})"

    def touches(self, population: str) -> bool:
        """Whether the substep declares anything of ``population``."""
        return self._fields_of(population)[0]

    def readable(self, population: str) -> frozenset[str]:
        """Fields of ``population`` this substep may read (``uid`` always)."""
        return self._fields_of(population)[1]

    def writable(self, population: str) -> frozenset[str]:
        """Fields of ``population`` (or ``ENV``) this substep may write."""
        return self._fields_of(population)[2]

    def _fields_of(self, population: str) -> tuple[bool, frozenset[str], frozenset[str]]:
        """``(touches, readable, writable)`` of ``population``, from the declarations (kept)."""
        cache: dict[str, tuple[bool, frozenset[str], frozenset[str]]] = self._field_sets  # type: ignore[attr-defined]
        if population not in cache:
            refs = (*self.reads, *self.writes)
            touches = (any(split_ref(r)[0] == population for r in refs) or population in self.neighbors
                       or population in self.births or population in self.deaths)
            own = {split_ref(r)[1] for r in refs if split_ref(r)[0] == population}
            readable = frozenset(own | set(self.neighbors.get(population, ())) | {"uid"})
            writable = frozenset(split_ref(r)[1] for r in self.writes if split_ref(r)[0] == population)
            cache[population] = (touches, readable, writable)
        return cache[population]

    def env_combine(self, layer: str) -> str:
        """How this substep's writes to env ``layer`` combine over processes (``"set"`` unless declared)."""
        return self.combine.get(layer, "set")

    def touches_agents(self) -> bool:
        """Whether it declares anything of some population (else it reads and writes env only, and
        every process computes the same thing from its whole copy of the env).
        """
        refs = (*self.reads, *self.writes)
        return (any(split_ref(r)[0] != ENV for r in refs) or bool(self.neighbors) or bool(self.births)
                or bool(self.deaths))

    def written_populations(self) -> set[str]:
        """The populations (or ``ENV``) whose fields this substep writes."""
        return {split_ref(r)[0] for r in self.writes}

    def __call__(self, ctx: Context) -> None:
        """Run the substep's function."""
        self.fn(ctx)


def substep_decorator(add: Callable[[Substep], object], name: str | Callable[..., None] | None = None,
                      **declarations: Any) -> Any:
    """``@owner.substep`` and ``@owner.substep(name=None, reads=..., ...)``: build the
    :class:`Substep` and hand it to ``add``; the decorated name is bound to the Substep.
    """

    def register(fn: SubstepFn) -> Substep:
        step = Substep(fn, name=name if isinstance(name, str) else None, **declarations)
        add(step)
        return step

    if callable(name):  # bare @owner.substep
        fn, name = name, None
        return register(fn)
    return register
