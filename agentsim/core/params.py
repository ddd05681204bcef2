"""Model parameters: declared with a default, a one-line doc and bounds; validated when a model
is configured; read-only inside a run.

:class:`Param` declares one parameter. Its type is the type of its default (``1.0`` is a
float, ``3`` an int, ``True`` a bool, ``"x"`` a str), or ``type=`` for a required one.
Bounds (``ge``, ``gt``, ``le``, ``lt``) and ``choices`` write their own error messages.
A run sees the resolved values as :class:`Params`, a read-only mapping whose missing
keys raise an error that names the valid ones and the closest match.

Examples:
    >>> table = ParamTable({"beta": Param(0.03, "per-contact daily transmission probability", ge=0, le=1)})
    >>> table.resolve({"beta": "0.05"})["beta"]
    0.05
    >>> table.resolve({"beta": 2.0})
    Traceback (most recent call last):
    ...
    agentsim.errors.ConfigError: parameter 'beta': expected a value in [0, 1] (got 2.0)
    >>> params = table.resolve({}, model="sir")
    >>> params["betta"]
    Traceback (most recent call last):
    ...
    agentsim.errors.UnknownParameterError: unknown parameter 'betta' of model 'sir' (valid: beta). Perhaps ...

The forms of release 0.1, ``Param(0.03, float, "doc")``, ``Param(..., check=..., expect=...)``
and ``ParamSpec({...})``, were removed in 0.3; they raise a :class:`~agentsim.errors.ConfigError`
that says what to write instead (see CHANGELOG.md).
"""

from __future__ import annotations

import builtins
import math
from collections.abc import Iterator, Mapping
from typing import Any, NoReturn

from agentsim.errors import ConfigError, UnknownParameterError, did_you_mean

__all__ = ["REQUIRED", "Param", "ParamTable", "Params"]


class _Required:
    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED: Any = _Required()  # the default of a parameter without one
_TYPES = (bool, int, float, str)


_SEE = "see CHANGELOG.md"


class Param:
    """One model parameter.

    Args:
        default: The default value (its type is the parameter's type); omit it (or pass
            :data:`REQUIRED`, with ``type=``) for a parameter without one.
        doc: One line: meaning and unit.
        type: ``bool``, ``int``, ``float`` or ``str``; default: the type of ``default``.
        ge, gt, le, lt: Bounds of a number (``>=``, ``>``, ``<=``, ``<``).
        choices: The allowed values.

    Examples:
        >>> Param(0.1, "daily recovery probability", gt=0, le=1).describe()
        'float in (0, 1], default 0.1: daily recovery probability'
    """

    def __init__(self, default: Any = REQUIRED, doc: Any = "", *removed: Any, type: type | None = None,
                 ge: float | None = None, gt: float | None = None, le: float | None = None,
                 lt: float | None = None, choices: Any = None, **removed_keywords: Any) -> None:
        if isinstance(doc, builtins.type) or removed:  # Param(default, float, "doc"): the form of 0.1
            raise ConfigError("Param(default, type, doc) was removed in 0.3: write Param(default, doc) (the type "
                              f"is the default's) or Param(doc=..., type=...) for a required one; {_SEE} "
                              f"(got Param({', '.join(repr(a) for a in (default, doc, *removed))}))")
        if "check" in removed_keywords or "expect" in removed_keywords:
            raise ConfigError("Param(check=..., expect=...) was removed in 0.3: bound the value with ge=, gt=, le=, "
                              f"lt= or choices= (they write their own error messages); {_SEE}")
        if removed_keywords:
            raise ConfigError(f"Param: unexpected keyword {next(iter(removed_keywords))!r} (valid: default, doc, "
                              "type, ge, gt, le, lt, choices)")
        if not isinstance(doc, str):
            raise ConfigError(f"Param: doc must be a str (got {doc!r})")
        if type is None:
            if default is REQUIRED:
                raise ConfigError("Param: a parameter without a default needs type= (bool, int, float or str)")
            type = builtins.type(default)
        if type not in _TYPES:
            raise ConfigError(f"Param: type must be one of bool, int, float, str (got {type!r})")
        bounds = {"ge": ge, "gt": gt, "le": le, "lt": lt}
        for name, bound in bounds.items():
            if bound is not None and (type not in (int, float) or isinstance(bound, bool)
                                      or not isinstance(bound, (int, float))):
                raise ConfigError(f"Param: {name}= needs a number parameter and a number bound "
                                  f"(got {name}={bound!r} for a {type.__name__})")
        self.default = default
        self.doc = doc
        self.type = type
        self.ge, self.gt, self.le, self.lt = ge, gt, le, lt
        self.choices = None if choices is None else tuple(choices)
        if default is not REQUIRED:
            self.validate("default", convert("default", default, type))

    @property
    def required(self) -> bool:
        """Whether the parameter has no default."""
        return self.default is REQUIRED

    def bounds_text(self) -> str:
        """The bounds as a phrase: ``"in [0, 1]"``, ``"> 0"``, ``""`` without bounds."""
        low: tuple[str, float] | None = None  # the tighter of ge / gt
        if self.ge is not None and (self.gt is None or self.ge > self.gt):
            low = ("[", self.ge)
        elif self.gt is not None:
            low = ("(", self.gt)
        high: tuple[str, float] | None = None  # the tighter of le / lt
        if self.le is not None and (self.lt is None or self.le < self.lt):
            high = ("]", self.le)
        elif self.lt is not None:
            high = (")", self.lt)
        if low and high:
            return f"in {low[0]}{_num(low[1])}, {_num(high[1])}{high[0]}"
        if low:
            return f"{'>=' if low[0] == '[' else '>'} {_num(low[1])}"
        if high:
            return f"{'<=' if high[0] == ']' else '<'} {_num(high[1])}"
        return ""

    def validate(self, name: str, value: Any) -> Any:
        """Check a converted value against the bounds and choices."""
        if self.choices is not None and value not in self.choices:
            raise ConfigError(f"parameter '{name}': expected one of {list(self.choices)} (got {value!r})")
        if self.type in (int, float):
            ok = ((self.ge is None or value >= self.ge) and (self.gt is None or value > self.gt)
                  and (self.le is None or value <= self.le) and (self.lt is None or value < self.lt))
            if not ok:  # NaN fails every bound
                raise ConfigError(f"parameter '{name}': expected a value {self.bounds_text()} (got {value!r})")
        return value

    def describe(self) -> str:
        """One line: type, bounds, default and doc."""
        bounds = self.bounds_text()
        choices = f" of {list(self.choices)}" if self.choices is not None else ""
        default = "required" if self.required else f"default {self.default!r}"
        return f"{self.type.__name__}{' ' + bounds if bounds else ''}{choices}, {default}: {self.doc}"

    def __repr__(self) -> str:
        return f"Param({self.describe()})"


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() and abs(x) < 1e15 else repr(x)


def convert(name: str, value: Any, typ: type) -> Any:
    """Convert ``value`` (possibly a command-line string) to ``typ``, or raise a ConfigError."""
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
        number: float | None = None
        if isinstance(value, (int, float)):
            number = float(value)
        elif isinstance(value, str):
            try:
                number = float(value)
            except ValueError:
                pass
        if number is None or math.isnan(number):  # NaN is no value: it would poison the run silently
            raise ConfigError(f"parameter '{name}': expected a float (got {value!r})")
        return number
    if isinstance(value, str):
        return value
    raise ConfigError(f"parameter '{name}': expected a str (got {value!r})")


class Params(Mapping[str, Any]):
    """Resolved parameter values, read-only; a missing name raises
    :class:`~agentsim.errors.UnknownParameterError` with the valid names and the closest match.

    Args:
        values: Name to value.
        model: The model's name, for messages.
    """

    def __init__(self, values: Mapping[str, Any], model: str = "") -> None:
        self._values = dict(values)
        self._model = model

    def __getitem__(self, name: str) -> Any:
        try:
            return self._values[name]
        except KeyError:
            of = f" of model '{self._model}'" if self._model else ""
            raise UnknownParameterError(
                f"unknown parameter {name!r}{of} (valid: {', '.join(self._values) or 'none'})."
                + (did_you_mean(name, self._values) if isinstance(name, str) else "")) from None

    def __setitem__(self, name: str, value: Any) -> NoReturn:
        raise TypeError(f"parameters are read-only during a run (tried to set {name!r}); configure the model "
                        "with params={...} before the run")

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        return f"Params({self._values!r})"


class ParamTable:
    """The declared parameters of a model (name to :class:`Param`)."""

    def __init__(self, params: Mapping[str, Param]) -> None:
        for name, p in params.items():
            if not isinstance(p, Param):
                raise ConfigError(f"parameter {name!r}: expected an agentsim.Param (got {p!r})")
        self.params = dict(params)

    def __iter__(self) -> Iterator[str]:
        return iter(self.params)

    def __getitem__(self, name: str) -> Param:
        return self.params[name]

    def defaults(self) -> dict[str, Any]:
        """Name to default of the parameters that have one."""
        return {k: p.default for k, p in self.params.items() if not p.required}

    def resolve(self, values: Mapping[str, Any] | None = None, model: str = "") -> Params:
        """Defaults overridden by ``values``, converted and checked.

        Raises:
            ConfigError: unknown parameter (with the valid names and the closest match),
                missing required parameter, wrong type, or a value out of bounds.
        """
        values = dict(values or {})
        valid = ", ".join(self.params) or "none"
        of = f" for model '{model}'" if model else ""
        for name in values:
            if name not in self.params:
                raise UnknownParameterError(
                    f"unknown parameter '{name}'{of} (valid: {valid})." + did_you_mean(name, self.params))
        out: dict[str, Any] = {}
        for name, p in self.params.items():
            if name in values:
                v = convert(name, values[name], p.type)
            elif p.required:
                raise ConfigError(f"missing required parameter '{name}' ({p.doc}); valid: {valid}")
            else:
                v = p.default
            out[name] = p.validate(name, v)
        return Params(out, model)

    def table(self) -> str:
        """A text table of name, type, default, bounds and doc."""
        rows = [(n, p.type.__name__, "required" if p.required else repr(p.default),
                 " ".join(filter(None, [p.bounds_text(), f"one of {list(p.choices)}" if p.choices else ""])),
                 p.doc) for n, p in self.params.items()]
        w = [max([len(r[i]) for r in rows] + [4]) for i in range(4)]
        return "\n".join(f"  {a:<{w[0]}}  {b:<{w[1]}}  {c:<{w[2]}}  {d:<{w[3]}}  {e}".rstrip()
                         for a, b, c, d, e in rows)
