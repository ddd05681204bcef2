"""The one table of the kernels' C functions (name -> source file, result type, arguments) and the
binding of a loaded library by it.

Every function declared in ``src/agentsim_kernels.h`` has an entry in :data:`FUNCTIONS`; from it
:class:`Library` sets each function's :mod:`ctypes` result and argument types and wraps it in a
:class:`Function` that refuses a call with the wrong number of arguments (ctypes itself passes
extra arguments on silently). ``tests/test_native_build.py`` parses the header and checks it
against this table (names, argument names and types, result types, the file defining each), so
the two cannot drift apart.

Types: every pointer is ``c_void_p`` (a tensor's ``data_ptr()``, a ctypes array, or a
:class:`RadiusSearch`), ``int64_t`` is ``c_int64``, ``uint64_t`` ``c_uint64``, ``double``
``c_double``; a result of None is ``void``.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["FUNCTIONS", "Function", "Library", "RadiusSearch", "Signature"]

PTR, I64, U64, F64 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_uint64, ctypes.c_double
CType = type  # one of PTR, I64, U64, F64


@dataclass(frozen=True)
class Signature:
    """A C function: the file defining it, its result type (None: void) and its named arguments."""

    source: str
    result: CType | None
    args: tuple[tuple[str, CType], ...]

    def describe(self, name: str) -> str:
        """``name(arg, ...)``, the argument names in order."""
        return f"{name}({', '.join(a for a, _ in self.args)})"


def _sig(source: str, result: CType | None, *args: tuple[str, CType]) -> Signature:
    return Signature(source, result, tuple(args))


# the arguments shared by the draws of rng.c: ids [n], n, golden, salt, salts [d], d, out [n, d]
_DRAW_ARGS = (("ids", PTR), ("n", I64), ("golden", U64), ("salt", U64), ("salts", PTR), ("d", I64), ("out", PTR))
_NORMAL_ARGS = (*_DRAW_ARGS, ("paired", I64), ("first", I64), ("scale", PTR), ("shift", PTR))
_FLOATS, _INDICES = ("32", "64"), ("32", "64")

FUNCTIONS: dict[str, Signature] = {
    # library.c
    "agentsim_build_info": _sig("library.c", ctypes.c_char_p),
    # rng.c: counter-based draws
    "agentsim_bits": _sig("rng.c", None, *_DRAW_ARGS),
    "agentsim_uniform64": _sig("rng.c", None, *_DRAW_ARGS),
    "agentsim_uniform32": _sig("rng.c", None, *_DRAW_ARGS),
    "agentsim_integers": _sig("rng.c", None, *_DRAW_ARGS, ("high", I64)),
    "agentsim_normal64": _sig("rng.c", None, *_NORMAL_ARGS),
    "agentsim_normal32": _sig("rng.c", None, *_NORMAL_ARGS),
    # graph.c
    "agentsim_push_count": _sig("graph.c", I64, ("indptr", PTR), ("indices", PTR), ("n_nodes", I64), ("nodes", PTR),
                                ("m", I64), ("counts", PTR)),
    "agentsim_csr_count": _sig("graph.c", None, ("u", PTR), ("v", PTR), ("stride", I64), ("m", I64), ("counts", PTR)),
    "agentsim_csr_place": _sig("graph.c", None, ("u", PTR), ("v", PTR), ("stride", I64), ("m", I64), ("rows", PTR),
                               ("indices", PTR)),
    "agentsim_csr_sort_rows": _sig("graph.c", None, ("rows", PTR), ("r0", I64), ("r1", I64), ("indices", PTR),
                                   ("lengths", PTR)),
    "agentsim_csr_compact": _sig("graph.c", None, ("rows", PTR), ("n", I64), ("indices", PTR), ("lengths", PTR)),
    "agentsim_group_members": _sig("graph.c", None, ("of", PTR), ("m", I64), ("groups", I64), ("cursor", PTR),
                                   ("k", I64), ("order", PTR)),
    "agentsim_co_member_degrees": _sig("graph.c", None, ("start", PTR), ("groups", I64), ("order", PTR),
                                       ("degree", PTR)),
    "agentsim_co_member_place": _sig("graph.c", None, ("start", PTR), ("groups", I64), ("order", PTR), ("rows", PTR),
                                     ("indices", PTR)),
    "agentsim_push_changes": _sig("graph.c", I64, ("indptr", PTR), ("indices", PTR), ("n_nodes", I64),
                                  ("old_nodes", PTR), ("old_values", PTR), ("m_old", I64), ("new_nodes", PTR),
                                  ("new_values", PTR), ("m_new", I64), ("self_count", PTR), ("scratch", PTR),
                                  ("out", PTR)),
    "agentsim_keep_only": _sig("graph.c", None, ("out", PTR), ("src", PTR), ("only", PTR), ("n", I64)),
    "agentsim_scaled_total": _sig("graph.c", None, ("out", PTR), ("srcs", PTR), ("scales", PTR), ("k", I64),
                                  ("only", PTR), ("n", I64)),
    # grid.c
    "agentsim_grid_sum64": _sig("grid.c", None, ("x", PTR), ("r0", I64), ("r1", I64), ("h", I64), ("w", I64),
                                ("dr", PTR), ("dc", PTR), ("k", I64), ("out", PTR)),
    # continuous.c
    **{f"agentsim_add_wrap{f}": _sig("continuous.c", None, ("pos", PTR), ("delta", PTR), ("n", I64), ("d", I64),
                                     ("lengths", PTR)) for f in _FLOATS},
    **{f"agentsim_expand{f}_i{i}": _sig("continuous.c", I64, ("search", PTR), ("a", I64), ("b", I64), ("at", I64))
       for f in _FLOATS for i in _INDICES},
    **{f"agentsim_cell_sort_i{i}": _sig("continuous.c", I64, ("cell", PTR), ("n", I64), ("uid", PTR),
                                        ("n_cells", I64), ("table", PTR), ("perm", PTR)) for i in _INDICES},
    "agentsim_move_bytes": _sig("continuous.c", None, ("base", PTR), ("dst", I64), ("src", I64), ("n", I64)),
    # ops.c
    **{f"agentsim_sq_norm{f}": _sig("ops.c", None, ("x", PTR), ("n", I64), ("k", I64), ("out", PTR)) for f in _FLOATS},
    "agentsim_is_iota": _sig("ops.c", I64, ("x", PTR), ("n", I64)),
    **{f"agentsim_add_columns{f}_i{i}": _sig("ops.c", I64, ("k", I64), ("outs", PTR), ("n_out", I64), ("index", PTR),
                                             ("srcs", PTR), ("m", I64)) for f in _FLOATS for i in _INDICES},
    **{f"agentsim_exp{f}": _sig("ops.c", None, ("x", PTR), ("n", I64), ("consts", PTR), ("top", I64), ("out", PTR))
       for f in _FLOATS},
    **{f"agentsim_gather_sum_i{i}": _sig("ops.c", I64, ("k", I64), ("tables", PTR), ("scales", PTR), ("sizes", PTR),
                                         ("numbers", PTR),
                                         ("n", I64), ("rows", PTR), ("first", I64), ("m", I64), ("out", PTR))
       for i in _INDICES},
    **{f"agentsim_ids_i{i}_mark": _sig("ops.c", I64, ("field", PTR), ("n", I64), ("lo", I64), ("top", I64),
                                       ("bits", PTR)) for i in _INDICES},
    **{f"agentsim_ids_i{i}_number": _sig("ops.c", None, ("field", PTR), ("n", I64), ("lo", I64), ("bits", PTR),
                                         ("ranks", PTR), ("none", I64), ("of", PTR)) for i in _INDICES},
    "agentsim_bitmap_ranks": _sig("ops.c", I64, ("bits", PTR), ("words", I64), ("ranks", PTR)),
    "agentsim_bitmap_list": _sig("ops.c", None, ("bits", PTR), ("words", I64), ("out", PTR)),
    "agentsim_count_true": _sig("ops.c", I64, ("mask", PTR), ("n", I64)),
    "agentsim_true_positions": _sig("ops.c", None, ("mask", PTR), ("n", I64), ("first", I64), ("count", I64),
                                    ("out", PTR)),
    **{f"agentsim_equal_any_{t}": _sig("ops.c", None, ("x", PTR), ("n", I64), ("values", PTR), ("k", I64), ("out", PTR))
       for t in ("i8", "i16", "i32", "i64", "u8", "f32", "f64")},
    # metrics.c
    **{f"agentsim_fixed_sum_checked{f}": _sig("metrics.c", I64, ("x", PTR), ("n", I64), ("scale", F64),
                                              ("limit", F64), ("range", PTR)) for f in _FLOATS},
    **{f"agentsim_sq_norm_fixed_sum{f}": _sig("metrics.c", I64, ("x", PTR), ("n", I64), ("k", I64), ("scale", F64))
       for f in _FLOATS},
}


class RadiusSearch(ctypes.Structure):
    """``agentsim_radius_search`` of the header: a radius search's block of targets and candidates,
    what ``agentsim_expand*`` filters (the fields are documented there).
    """

    _fields_ = [("d", I64), ("cols", PTR * 3), ("scols", PTR * 3), ("order", PTR), ("lengths", F64 * 3),
                ("periodic", I64), ("r2", F64), ("include_self", I64), ("start", PTR), ("cnt", PTR),
                ("n_seg", I64), ("n_targets", I64), ("t0", I64), ("out_i", PTR), ("out_j", PTR), ("delta", PTR),
                ("cap", I64), ("dist2", PTR)]


class Function:
    """A bound C function: called with exactly the table's arguments (ctypes converts them)."""

    def __init__(self, name: str, signature: Signature, fn: Any) -> None:
        self.name, self.signature, self._fn = name, signature, fn

    def __call__(self, *args: Any) -> Any:
        if len(args) != len(self.signature.args):
            raise TypeError(f"{self.signature.describe(self.name)} takes {len(self.signature.args)} arguments, "
                            f"got {len(args)}")
        return self._fn(*args)

    def __repr__(self) -> str:
        return f"<native {self.signature.describe(self.name)} from {self.signature.source}>"


class Library:
    """A loaded kernel library with every function of :data:`FUNCTIONS` bound: ``library[name]``.

    Args:
        library: The loaded shared library.
        path: Its file.
        origin: ``"install"`` (built by ``pip install``) or ``"cache"`` (built on first use).

    Raises:
        AttributeError: The library lacks a function of the table (an old or foreign library).
    """

    def __init__(self, library: ctypes.CDLL, path: Path, origin: str) -> None:
        self.path, self.origin = path, origin
        self._functions: dict[str, Function] = {}
        for name, signature in FUNCTIONS.items():
            fn = getattr(library, name)
            fn.restype = signature.result
            fn.argtypes = [t for _, t in signature.args]
            self._functions[name] = Function(name, signature, fn)

    def __getitem__(self, name: str) -> Function:
        try:
            return self._functions[name]
        except KeyError:
            raise KeyError(f"no native function {name!r}; the table has {sorted(self._functions)}") from None

    def build_info(self) -> str:
        """What the library was built from (``agentsim_build_info()``)."""
        raw = self["agentsim_build_info"]()
        return raw.decode() if isinstance(raw, bytes) else str(raw)
