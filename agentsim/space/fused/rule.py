"""A pair rule (``rule(pair) -> messages``) translated into the statements of a GPU kernel.

The rule is traced with :mod:`torch.fx` (its torch operations recorded, Python constants
folded in) and run once on a few example pairs to learn each value's dtype and shape; each
operation then becomes one Triton statement per column, in the order the rule computes it,
with the dtype torch computes it in. Every operation the translation accepts is correctly
rounded on every device (additions, multiplications, ``floor``, comparisons, ``where``, and
the IEEE divisions and square roots the kernel spells out: ``div_rn``, ``sqrt_rn``), and the
kernel is compiled without fused multiply-adds, so a translated rule gives the bits the torch
ops give on the CPU.

A rule that does anything else (``torch.sin`` or ``torch.sqrt``, whose CPU and CUDA bits
differ: use :mod:`agentsim.core.portable`; a reduction over a pair's columns; Python control
flow on values; a float64 field) is not translated: :func:`translate` raises
:class:`Untranslatable` with the reason, and the caller keeps the torch path.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor, fx

from agentsim.core.portable import _exact_sqrt

__all__ = ["FieldSpec", "Translation", "Untranslatable", "translate"]

_M = 7  # example pairs: a pair-level value is [_M] or [_M, w]; a trailing width of _M is refused
_TL_DTYPES = {torch.float32: "tl.float32", torch.int64: "tl.int64", torch.int32: "tl.int32", torch.bool: "tl.int1",
              torch.int16: "tl.int16", torch.int8: "tl.int8", torch.uint8: "tl.uint8"}


class Untranslatable(Exception):
    """The rule uses something the kernel translation does not (the message says what)."""


@dataclass(frozen=True)
class FieldSpec:
    """A field the rule reads: ``side`` (``"source"`` or ``"target"``), its name, dtype and trailing shape."""

    side: str
    name: str
    dtype: torch.dtype
    width: int  # columns: 1 for an [n] field, w for [n, w]
    vector: bool  # [n, w] (True) or [n]


@dataclass
class _Value:
    """A pair-level value in the kernel: one Triton expression per column."""

    cols: list[str]
    vector: bool  # [m, w] (True) or [m]
    dtype: torch.dtype


@dataclass
class Translation:
    """A rule as kernel statements.

    Attributes:
        statements: Triton statements computing the messages from ``u0..u{d-1}`` (the
            displacement), ``d2`` (its squared length) and the fields (see :attr:`fields`).
        messages: Per message name: ``True`` (every pair) or ``(columns, dtype, trailing shape)``,
            the kernel variables holding the message's columns.
        fields: The fields the rule reads, in the order the kernel takes them.
        single: Whether the rule returned one tensor (not a dict).
        kernels: The kernels compiled for it, by (dims, reductions) (filled by the caller).
    """

    statements: list[str]
    messages: dict[str, Any]
    fields: list[FieldSpec] = field(default_factory=list)
    single: bool = False
    kernels: dict[Any, Any] = field(default_factory=dict)


class _Side:
    def __init__(self, side: str) -> None:
        self.side = side


def _tl(dtype: torch.dtype) -> str:
    try:
        return _TL_DTYPES[dtype]
    except KeyError:
        raise Untranslatable(f"values of dtype {dtype} are not translated") from None


def _const(value: Any, dtype: torch.dtype) -> str:
    """A Python constant as a Triton literal of ``dtype`` (floats: the float32 value, exactly)."""
    if dtype == torch.float32:
        return repr(float(np.float32(value)))
    if dtype == torch.bool:
        return "1" if value else "0"
    if isinstance(value, float):
        raise Untranslatable("a float constant in integer arithmetic")
    return str(int(value))


_BINARY: dict[Any, str] = {operator.add: "+", operator.sub: "-", operator.mul: "*", torch.add: "+", torch.sub: "-",
                           torch.mul: "*"}
_COMPARE: dict[Any, str] = {operator.lt: "<", operator.le: "<=", operator.gt: ">", operator.ge: ">=",
                            operator.eq: "==", operator.ne: "!=", torch.lt: "<", torch.le: "<=", torch.gt: ">",
                            torch.ge: ">=", torch.eq: "==", torch.ne: "!="}
_LOGICAL: dict[Any, str] = {operator.and_: "&", operator.or_: "|", operator.xor: "^", torch.logical_and: "&",
                            torch.logical_or: "|"}
_DIVIDE = (operator.truediv, torch.div, torch.true_divide)


class _Translator:
    def __init__(self, fields: Callable[[str, str], FieldSpec], ndim: int) -> None:
        self.field_spec = fields
        self.ndim = ndim
        self.lines: list[str] = []
        self.fields: dict[tuple[str, str], FieldSpec] = {}
        self.examples: dict[fx.Node, Any] = {}
        self.values: dict[fx.Node, Any] = {}
        self.count = 0
        self.uses_dist = False

    # ------------------------------------------------------------------ helpers
    def fresh(self) -> str:
        self.count += 1
        return f"v{self.count}"

    def emit(self, exprs: list[str], vector: bool, dtype: torch.dtype) -> _Value:
        name = self.fresh()
        cols = []
        for k, expr in enumerate(exprs):
            col = f"{name}_{k}"
            self.lines.append(f"{col} = {expr}")
            cols.append(col)
        return _Value(cols, vector, dtype)

    def operand(self, value: Any, dtype: torch.dtype, k: int) -> str:
        """Column ``k`` of an operand, in ``dtype`` (a column of width 1 broadcasts)."""
        if isinstance(value, _Value):
            col = value.cols[0 if len(value.cols) == 1 else k]
            if value.dtype == dtype:
                return col
            if value.dtype == torch.bool:
                return f"({col} != 0).to({_tl(dtype)})"
            return f"{col}.to({_tl(dtype)})"
        if isinstance(value, (bool, int, float)):
            return _const(value, dtype)
        raise Untranslatable(f"an operand of type {type(value).__name__}")

    def width(self, *values: Any) -> int:
        """Columns of an elementwise result: the widest operand's (a width of 1 broadcasts)."""
        return max((len(v.cols) for v in values if isinstance(v, _Value)), default=1)

    def check_example(self, node: fx.Node, example: Any) -> None:
        if isinstance(example, Tensor):
            if example.dim() == 0 or example.shape[0] != _M or example.dim() > 2 or \
                    (example.dim() == 2 and example.shape[1] == _M):
                raise Untranslatable(f"{node.format_node()}: a value of shape {list(example.shape)} is not a "
                                     "per-pair [m] or [m, w] value")

    # ------------------------------------------------------------------ nodes
    def run(self, graph: fx.Graph, pair_example: Any) -> Any:
        for node in graph.nodes:
            if node.op == "placeholder":
                self.values[node], self.examples[node] = "pair", pair_example
            elif node.op == "output":
                return node.args[0]
            elif node.op == "get_attr":
                raise Untranslatable(f"{node.format_node()}: module attributes are not translated")
            else:
                self.node(node)
        raise Untranslatable("the traced rule has no output")

    def node(self, node: fx.Node) -> None:
        args = fx.node.map_arg(node.args, lambda a: self.values[a])
        kwargs = fx.node.map_arg(node.kwargs, lambda a: self.values[a])
        ex_args = fx.node.map_arg(node.args, lambda a: self.examples[a])
        ex_kwargs = fx.node.map_arg(node.kwargs, lambda a: self.examples[a])
        target = node.target
        if node.op == "call_method":
            example = getattr(ex_args[0], str(target))(*ex_args[1:], **ex_kwargs)
        else:
            assert callable(target)
            example = target(*ex_args, **ex_kwargs)
        self.examples[node] = example
        self.check_example(node, example)
        self.values[node] = self.translate(node, target, args, kwargs, example)

    def translate(self, node: fx.Node, target: Any, args: Any, kwargs: Any, example: Any) -> Any:
        what = node.format_node() or node.name
        if target is getattr and args[0] == "pair":
            return self.pair_attribute(str(args[1]))
        if target is operator.getitem and isinstance(args[0], _Side):
            return self.read_field(args[0].side, args[1])
        if not isinstance(example, Tensor):
            raise Untranslatable(f"{what}: gives a {type(example).__name__}, not a per-pair tensor")
        dtype = example.dtype
        vector = example.dim() == 2
        if target is operator.getitem:
            return self.index(what, args)
        if node.op == "call_method":
            return self.method(what, str(target), args, kwargs, example)
        if kwargs and not (target in _DIVIDE and kwargs == {"rounding_mode": None}):
            raise Untranslatable(f"{what}: keyword arguments are not translated")
        width = self.width(*args)
        if target in _BINARY:
            a, b = args
            return self.emit([f"{self.operand(a, dtype, k)} {_BINARY[target]} {self.operand(b, dtype, k)}"
                              for k in range(width)], vector, dtype)
        if target in _DIVIDE:
            if not dtype.is_floating_point:
                raise Untranslatable(f"{what}: integer division is not translated")
            a, b = args
            return self.emit([f"tl.math.div_rn({self.operand(a, dtype, k)}, {self.operand(b, dtype, k)})"
                              for k in range(width)], vector, dtype)
        if target in _COMPARE:
            a, b = args
            ca = self.examples_of(node.args[0])
            cb = self.examples_of(node.args[1])
            compute = torch.result_type(ca, cb)
            return self.emit([f"{self.operand(a, compute, k)} {_COMPARE[target]} {self.operand(b, compute, k)}"
                              for k in range(width)], vector, dtype)
        if target in _LOGICAL:
            a, b = args
            if dtype != torch.bool:
                raise Untranslatable(f"{what}: bitwise operations on integers are not translated")
            return self.emit([f"{self.operand(a, dtype, k)} {_LOGICAL[target]} {self.operand(b, dtype, k)}"
                              for k in range(width)], vector, dtype)
        if target in (operator.neg, torch.neg):
            return self.emit([f"-{self.operand(args[0], dtype, k)}" for k in range(width)], vector, dtype)
        if target in (operator.invert, torch.logical_not) and dtype == torch.bool:
            return self.emit([f"{self.operand(args[0], dtype, k)} == 0" for k in range(width)], vector, dtype)
        if target is torch.where:
            cond, a, b = args
            return self.emit([f"tl.where({self.operand(cond, torch.bool, k)}, {self.operand(a, dtype, k)}, "
                              f"{self.operand(b, dtype, k)})" for k in range(width)], vector, dtype)
        if target is torch.abs:
            return self.emit([f"tl.abs({self.operand(args[0], dtype, k)})" for k in range(width)], vector, dtype)
        if target is torch.floor and dtype == torch.float32:
            return self.emit([f"tl.math.floor({self.operand(args[0], dtype, k)})" for k in range(width)],
                             vector, dtype)
        if target is _exact_sqrt and dtype == torch.float32:
            return self.emit([f"tl.math.sqrt_rn({self.operand(args[0], dtype, k)})" for k in range(width)],
                             vector, dtype)
        name = getattr(target, "__name__", str(target))
        hint = " (agentsim.core.portable has sqrt, sin and cos with the same bits on every device)" \
            if name in ("sqrt", "sin", "cos", "exp", "log", "pow", "rsqrt") else ""
        raise Untranslatable(f"{what}: {name} is not translated{hint}")

    def examples_of(self, arg: Any) -> Any:
        return self.examples[arg] if isinstance(arg, fx.Node) else arg

    def index(self, what: str, args: Any) -> _Value:
        value, key = args
        if not isinstance(value, _Value) or not value.vector:
            raise Untranslatable(f"{what}: only a column of an [m, w] value is translated (value[:, k])")
        if isinstance(key, tuple) and len(key) == 2 and key[0] == slice(None) and isinstance(key[1], int):
            k = key[1] if key[1] >= 0 else len(value.cols) + key[1]
            return _Value([value.cols[k]], False, value.dtype)
        raise Untranslatable(f"{what}: the index {key!r} is not translated (value[:, k] is)")

    def method(self, what: str, name: str, args: Any, kwargs: Any, example: Tensor) -> _Value:
        value = args[0]
        if not isinstance(value, _Value):
            raise Untranslatable(f"{what}: a method of a non-pair value")
        if name == "unsqueeze" and not value.vector and tuple(args[1:]) in ((1,), (-1,)) and not kwargs:
            return _Value(value.cols, True, value.dtype)
        if name in ("float", "bool", "int", "long", "to"):
            if name == "to" and (len(args) != 2 or kwargs or not isinstance(args[1], torch.dtype)):
                raise Untranslatable(f"{what}: only .to(dtype) is translated")
            dtype = example.dtype
            return self.emit([self.operand(value, dtype, k) if value.dtype != torch.bool or dtype == torch.bool
                              else f"({c} != 0).to({_tl(dtype)})" for k, c in enumerate(value.cols)],
                             value.vector, dtype)
        raise Untranslatable(f"{what}: the method {name} is not translated")

    def pair_attribute(self, name: str) -> Any:
        if name == "delta":
            return _Value([f"u{k}" for k in range(self.ndim)], True, torch.float32)
        if name == "dist2":
            return _Value(["d2"], False, torch.float32)
        if name == "dist":
            self.uses_dist = True
            return _Value(["dist"], False, torch.float32)
        if name in ("source", "target"):
            return _Side(name)
        raise Untranslatable(f"pair.{name} is not translated")

    def read_field(self, side: str, name: Any) -> _Value:
        if not isinstance(name, str):
            raise Untranslatable(f"pair.{side}[{name!r}]: a field name is a str")
        spec = self.field_spec(side, name)
        self.fields[(side, name)] = spec
        _tl(spec.dtype)
        prefix = "sf" if side == "source" else "tf"
        return _Value([f"{prefix}_{name}_{k}" for k in range(spec.width)], spec.vector, spec.dtype)


class _ExamplePair:
    """Example pair values (``_M`` pairs) for the one run that tells dtypes and shapes."""

    def __init__(self, ndim: int, fields: Callable[[str, str], FieldSpec]) -> None:
        self.delta = torch.rand(_M, ndim)
        self.dist2 = torch.rand(_M)
        self.dist = torch.rand(_M)
        self.source = _ExampleSide("source", fields)
        self.target = _ExampleSide("target", fields)


class _ExampleSide:
    def __init__(self, side: str, fields: Callable[[str, str], FieldSpec]) -> None:
        self.side, self.fields = side, fields

    def __getitem__(self, name: str) -> Tensor:
        spec = self.fields(self.side, name)
        return torch.zeros((_M, spec.width) if spec.vector else (_M,), dtype=spec.dtype)


def translate(rule: Callable[[Any], Any], ndim: int, fields: Callable[[str, str], FieldSpec]) -> Translation:
    """Translate ``rule`` into kernel statements.

    Args:
        rule: ``rule(pair) -> Tensor | dict[str, Tensor | True]``, as :func:`agentsim.neighbor_reduce` takes.
        ndim: The box's number of dims (``pair.delta`` is ``[m, ndim]``).
        fields: ``fields(side, name) -> FieldSpec`` of a field the rule reads (raises
            :class:`Untranslatable` for a field it cannot pass to a kernel).

    Raises:
        Untranslatable: What the translation does not cover, named.
    """
    try:
        graph = fx.Tracer().trace(rule)
    except Exception as exc:  # tracing runs the user's rule on proxies: any failure means "not traceable"
        raise Untranslatable(f"the rule cannot be traced ({type(exc).__name__}: {exc})") from None
    translator = _Translator(fields, ndim)
    out = translator.run(graph, _ExamplePair(ndim, fields))
    single = not isinstance(out, dict)
    raw = {"": out} if single else dict(out)
    messages: dict[str, Any] = {}
    for name, value in raw.items():
        if value is True and not single:
            messages[name] = True
            continue
        if not isinstance(value, fx.Node) or not isinstance(translator.values.get(value), _Value):
            raise Untranslatable(f"message {name!r}: not a per-pair tensor or True")
        got: _Value = translator.values[value]
        example = translator.examples[value]
        messages[name] = (got.cols, got.dtype, tuple(example.shape[1:]))
    statements = translator.lines
    if translator.uses_dist:
        statements = ["dist = tl.math.sqrt_rn(d2)", *statements]
    return Translation(statements, messages, list(translator.fields.values()), single)
