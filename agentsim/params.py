"""Model parameters: declared with a default, a type and a check; validated when a model is built.

Examples:
    >>> spec = ParamSpec({"beta": Param(0.03, float, "per-contact daily transmission probability",
    ...                                 check=lambda v: 0 <= v <= 1, expect="in [0, 1]")})
    >>> spec.resolve({"beta": "0.05"})["beta"]
    0.05
    >>> spec.resolve({"betta": 0.05})
    Traceback (most recent call last):
    ...
    agentsim.errors.ConfigError: unknown parameter 'betta' (valid: beta). Perhaps you meant 'beta'?
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from .errors import ConfigError, did_you_mean

_REQUIRED = object()


@dataclass(frozen=True)
class Param:
    """One model parameter.

    Args:
        default: The default value; omit (or pass :data:`REQUIRED`) for a required parameter.
        type: ``int``, ``float``, ``bool`` or ``str``.
        doc: One line: meaning and unit.
        check: Optional predicate on the converted value.
        expect: What ``check`` requires, for the error message (``"in [0, 1]"``).
        choices: Optional list of allowed values.
    """

    default: Any = _REQUIRED
    type: type = float
    doc: str = ""
    check: Callable[[Any], bool] | None = None
    expect: str = ""
    choices: tuple[Any, ...] | None = None

    @property
    def required(self) -> bool:
        return self.default is _REQUIRED


REQUIRED = _REQUIRED


def _convert(name: str, value: Any, typ: type) -> Any:
    """Convert ``value`` (possibly a CLI string) to ``typ`` or raise a ConfigError."""
    tname = typ.__name__
    if typ is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in {"true", "1", "yes", "on", "false", "0", "no", "off"}:
            return value.lower() in {"true", "1", "yes", "on"}
        raise ConfigError(f"parameter '{name}': expected a bool (got {value!r})")
    if typ is int:
        if isinstance(value, bool):
            raise ConfigError(f"parameter '{name}': expected an int (got {value!r})")
        if isinstance(value, int):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, str):
            try:
                return int(value)
            except ValueError:
                pass
        raise ConfigError(f"parameter '{name}': expected an int (got {value!r})")
    if typ is float:
        if isinstance(value, bool):
            raise ConfigError(f"parameter '{name}': expected a float (got {value!r})")
        if isinstance(value, (int, float)):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                pass
        raise ConfigError(f"parameter '{name}': expected a float (got {value!r})")
    if typ is str:
        if isinstance(value, str):
            return value
        raise ConfigError(f"parameter '{name}': expected a str (got {value!r})")
    raise ConfigError(f"parameter '{name}': unsupported type {tname}")


class ParamSpec:
    """The declared parameters of a model."""

    def __init__(self, params: Mapping[str, Param]) -> None:
        self.params = dict(params)

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(self.params)

    def __getitem__(self, name: str) -> Param:
        return self.params[name]

    def defaults(self) -> dict[str, Any]:
        return {k: p.default for k, p in self.params.items() if not p.required}

    def resolve(self, values: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Defaults overridden by ``values``, converted and checked.

        Raises:
            ConfigError: unknown parameter (with the valid names and the closest match),
                missing required parameter, wrong type, or a failed check.
        """
        values = dict(values or {})
        valid = ", ".join(self.params) or "none"
        for name in values:
            if name not in self.params:
                raise ConfigError(
                    f"unknown parameter '{name}' (valid: {valid})." + did_you_mean(name, self.params)
                )
        out: dict[str, Any] = {}
        for name, p in self.params.items():
            if name in values:
                v = _convert(name, values[name], p.type)
            elif p.required:
                raise ConfigError(f"missing required parameter '{name}' ({p.doc}); valid: {valid}")
            else:
                v = p.default
            if p.choices is not None and v not in p.choices:
                raise ConfigError(f"parameter '{name}': expected one of {list(p.choices)} (got {v!r})")
            if p.check is not None and not p.check(v):
                raise ConfigError(f"parameter '{name}': expected {p.expect or 'a valid value'} (got {v!r})")
            out[name] = v
        return out

    def table(self) -> str:
        """A text table of name, type, default and doc."""
        rows = [(n, p.type.__name__, "required" if p.required else repr(p.default), p.doc)
                for n, p in self.params.items()]
        w = [max([len(r[i]) for r in rows] + [4]) for i in range(3)]
        return "\n".join(f"  {a:<{w[0]}}  {b:<{w[1]}}  {c:<{w[2]}}  {d}" for a, b, c, d in rows)
