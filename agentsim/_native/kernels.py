"""CPU kernels for hot loops that torch runs as several passes (or as slow ones): a push along a
graph's edges, the exact fixed-point sum of a metric, the lean network build, a move in a periodic
box, a squared norm per row, integer sums over a torus's neighborhoods, a radius search's sort and
filter, several scatter sums at once.

The C sources are ``src/{graph,grid,continuous,ops,metrics}.c`` (prototypes in
``src/agentsim_kernels.h``), built at install or on first use and bound by the table of
:mod:`agentsim._native.bindings` (see :mod:`agentsim._native.build`); where there is no library the callers use their
torch ops, which give the same results (integer arithmetic, or the same correctly rounded float
operations in the same order, so neither the path nor the split over threads shows in the bits).
Each function returns None (or False) where it does not apply, and its caller uses torch.

- :func:`push_count`: for every node, how many of its neighbors are in a given node list (the
  SIR step's "infectious contacts"). Torch needs five passes and four temporaries of the pushed
  edges' size (``repeat_interleave``, ``arange``, a gather, ``bincount``): 55-86 ms for 2.5M edges
  from 250k random nodes of a 1M-node graph of mean degree 10 here; this loop, 15-21 ms (its cost is
  cache misses: the rows of a 40 MB ``indices`` and the increments).
- :func:`fixed_sum`: ``sum(round_half_even(x * 2**frac_bits))`` in wrapping int64, the metric
  reduction of :mod:`agentsim.core.metrics`, in one pass instead of four (a float64 copy, the scaling,
  the rounding, the conversion to int64) and no temporaries.
  :func:`fixed_sum_checked`: the same sum, and in the same call the checks of its values (NaN,
  magnitude, a bound on the sum) as Python numbers: a metric's whole reduction in one call.
- :func:`csr_from_pair_chunks`: the CSR of an undirected graph from regenerable pair chunks
  (count, place, sort rows; on torch's threads, in 2 MiB pages): no ``[2, m]`` edge list held.
- :func:`add_wrap`: ``pos = wrap(pos + delta)`` in a periodic box, in place (``Box.move``).
- :func:`squared_norm`: ``sum_j x[:, j]**2`` in float64 per row (``ops.squared_norm``);
  :func:`squared_norm_fixed_sum`: the fixed-point sum of those norms without the column
  (``metrics.sum_of_squares``).
- :func:`periodic_grid_sum`: integer neighborhood sums on a torus (``Grid.neighbor_sum``).
- :func:`is_iota`: whether an index column is ``0 .. n - 1`` (a gather that can be skipped).
- :func:`add_columns`: several ``index_add_`` of 1-D columns sharing one index, in one pass.
- :func:`exp`: :func:`agentsim.core.portable.exp`'s operations in one pass instead of about
  twenty (7 ms for 0.5M float64 values in torch ops here, a tenth of that in the loop).
- :func:`gather_sum`: a sum over several group columns of a per-group value, per row
  (:func:`agentsim.core.ops.gather_sum`), in one pass instead of three per column.
- :func:`flatnonzero`: the positions of a bool mask's True entries, on torch's threads (a count per
  piece, then each piece writes its part; NumPy's ``flatnonzero`` runs on one).
- :func:`equal_any`: where a tensor holds one of a few values, in one pass on torch's threads.
- :func:`number_ids`: group ids numbered densely through a bitmap of the ids (a bit per possible
  id and a count per 64 of them) instead of a sort or a table of counts.
- :func:`cell_sort`: a radius search's sources sorted by (cell, uid), and its cell table.
- :func:`radius_expand`: a radius search's candidates filtered by distance, with their
  displacements (one pass instead of about twenty over the candidates).
"""

from __future__ import annotations

import ctypes
import itertools
import math
from collections.abc import Callable, Iterator, Sequence
from typing import NamedTuple

import torch
from torch import Tensor

from agentsim._native import build as native
from agentsim._native.bindings import Function, Library, RadiusSearch
from agentsim._native.rng import as_int64

__all__ = [
    "CheckedSum",
    "add_columns",
    "add_wrap",
    "cell_sort",
    "co_members",
    "csr_from_pair_chunks",
    "equal_any",
    "exp",
    "fixed_sum",
    "fixed_sum_checked",
    "flatnonzero",
    "gather_sum",
    "group_members",
    "is_iota",
    "keep_only",
    "number_ids",
    "periodic_grid_sum",
    "push_changes",
    "push_count",
    "radius_expand",
    "scaled_total",
    "squared_norm",
    "squared_norm_fixed_sum",
]

_PARALLEL_MIN = 1 << 16  # pairs or rows per thread below which one thread does the work
_SELECT_MIN = 1 << 20  # rows per thread of the selections (flatnonzero, equal_any): below it NumPy's one pass

class _Kernels:
    """The library's functions by what the wrappers below call, variants by dtype."""

    def __init__(self, lib: Library) -> None:
        self.path = lib.path
        self.push_count = lib["agentsim_push_count"]
        self.add_wrap = _by_dtype(lib, "agentsim_add_wrap")
        self.sq_norm = _by_dtype(lib, "agentsim_sq_norm")
        self.grid_sum = lib["agentsim_grid_sum64"]
        self.is_iota = lib["agentsim_is_iota"]
        self.csr_count = lib["agentsim_csr_count"]
        self.csr_place = lib["agentsim_csr_place"]
        self.csr_sort_rows = lib["agentsim_csr_sort_rows"]
        self.csr_compact = lib["agentsim_csr_compact"]
        self.group_members = lib["agentsim_group_members"]
        self.co_member_degrees = lib["agentsim_co_member_degrees"]
        self.co_member_place = lib["agentsim_co_member_place"]
        self.push_changes = lib["agentsim_push_changes"]
        self.keep_only = lib["agentsim_keep_only"]
        self.scaled_total = lib["agentsim_scaled_total"]
        self.fixed_sum_checked = _by_dtype(lib, "agentsim_fixed_sum_checked")
        self.sq_norm_fixed_sum = _by_dtype(lib, "agentsim_sq_norm_fixed_sum")
        self.expand = _by_dtypes(lib, "agentsim_expand")
        self.add_columns = _by_dtypes(lib, "agentsim_add_columns")
        self.exp = _by_dtype(lib, "agentsim_exp")
        self.gather_sum = {idt: lib[f"agentsim_gather_sum_i{ib}"] for idt, ib in _INDEX_BITS}
        self.ids_mark = {idt: lib[f"agentsim_ids_i{ib}_mark"] for idt, ib in _INDEX_BITS}
        self.ids_number = {idt: lib[f"agentsim_ids_i{ib}_number"] for idt, ib in _INDEX_BITS}
        self.bitmap_ranks = lib["agentsim_bitmap_ranks"]
        self.bitmap_list = lib["agentsim_bitmap_list"]
        self.cell_sort = {idt: lib[f"agentsim_cell_sort_i{ib}"] for idt, ib in _INDEX_BITS}
        self.move_bytes = lib["agentsim_move_bytes"]
        self.count_true = lib["agentsim_count_true"]
        self.true_positions = lib["agentsim_true_positions"]
        self.equal_any = {dtype: lib[f"agentsim_equal_any_{name}"] for dtype, name in _EQUAL_DTYPES}


_FLOAT_BITS = ((torch.float32, 32), (torch.float64, 64))
_EQUAL_DTYPES = ((torch.int8, "i8"), (torch.int16, "i16"), (torch.int32, "i32"), (torch.int64, "i64"),
                 (torch.uint8, "u8"), (torch.float32, "f32"), (torch.float64, "f64"))
_INDEX_BITS = ((torch.int32, 32), (torch.int64, 64))


def _by_dtype(lib: Library, prefix: str) -> dict[torch.dtype, Function]:
    """The float32 and float64 variants ``<prefix>32`` and ``<prefix>64`` of a kernel, by dtype."""
    return {dtype: lib[f"{prefix}{bits}"] for dtype, bits in _FLOAT_BITS}


def _by_dtypes(lib: Library, prefix: str) -> dict[tuple[torch.dtype, torch.dtype], Function]:
    """The variants ``<prefix><32|64>_i<32|64>`` of a kernel, by (float dtype, index dtype)."""
    return {(fdt, idt): lib[f"{prefix}{fb}_i{ib}"] for fdt, fb in _FLOAT_BITS for idt, ib in _INDEX_BITS}


_bound: tuple[Library, _Kernels] | None = None


def _kernels() -> _Kernels | None:
    """The kernels of :func:`agentsim._native.build.library`, or None where there is none."""
    global _bound
    lib = native.library()
    if lib is None:
        return None
    if _bound is None or _bound[0] is not lib:
        _bound = (lib, _Kernels(lib))
    return _bound[1]


def push_count(indptr: Tensor, indices: Tensor, n_nodes: int, nodes: Tensor) -> Tensor | None:
    """``out[v]`` = how many neighbors of ``v`` are in ``nodes`` (``[n_nodes]`` int32), or None where
    the kernel does not apply (not CPU, other dtypes, no kernel): then use torch ops.

    Args:
        indptr: ``[n_nodes + 1]`` int64 CSR row pointers.
        indices: ``[n_edges]`` int32 neighbor ids.
        n_nodes: Number of nodes.
        nodes: ``[m]`` int64 node ids (repeats count again).

    Raises:
        IndexError: A node id outside ``[0, n_nodes)`` (naming it).
    """
    if (indptr.device.type != "cpu" or nodes.device.type != "cpu" or indptr.dtype != torch.int64
            or indices.dtype != torch.int32 or nodes.dtype != torch.int64):
        return None
    k = _kernels()
    if k is None:
        return None
    indptr, indices, nodes = indptr.contiguous(), indices.contiguous(), nodes.contiguous()
    out = torch.zeros(n_nodes, dtype=torch.int32)
    bad = k.push_count(indptr.data_ptr(), indices.data_ptr(), n_nodes, nodes.data_ptr(), nodes.numel(),
                       out.data_ptr())
    if bad:
        raise IndexError(f"node id {int(nodes[bad - 1])} out of range for a graph of {n_nodes} nodes")
    return out


def group_members(of: Tensor, groups: int, counts: Tensor | None = None) -> tuple[Tensor, Tensor] | None:
    """The memberships group by group, by a counting sort: ``(start [G + 1] int64, order [m] int32)``,
    group ``g``'s members' rows ``order[start[g]:start[g + 1]]`` in membership order (what a stable
    sort by group number gives); or None where the kernel does not apply (no kernel, not CPU, not
    int32).

    Args:
        of: ``[n]`` or ``[n, k]`` int32 group number of each membership (``groups``: none).
        groups: ``G``, the number of groups.
        counts: ``[G]`` integers, each group's memberships in ``of`` where known (else counted here).
    """
    if of.device.type != "cpu" or of.dtype != torch.int32:
        return None
    k = _kernels()
    if k is None:
        return None
    per = of.shape[1] if of.dim() == 2 else 1
    flat = of.contiguous().view(-1)
    start = torch.zeros(groups + 1, dtype=torch.int64)  # each group's first place in order
    if counts is None:
        counts = torch.bincount(flat, minlength=groups + 1)[:groups]
    torch.cumsum(counts, 0, dtype=torch.int64, out=start[1:])
    cursor = start[:-1].clone()
    order = torch.empty(int(start[-1]), dtype=torch.int32)  # the members' rows, group by group
    k.group_members(flat.data_ptr(), flat.numel(), groups, cursor.data_ptr(), per, order.data_ptr())
    return start, order


def co_members(start: Tensor, order: Tensor, n: int, most: int) -> tuple[Tensor, Tensor] | None:
    """Each agent's group-mates as a CSR over the ``n`` agents: ``(indptr [n + 1] int64, indices [e]
    int32)``, row ``i`` the rows of the other memberships of each of ``i``'s groups (``i`` itself
    where it holds another membership of the same group); or None where the kernel does not apply
    (no kernel, not CPU, ``order`` not int32) or the lists would have more than ``most`` entries.

    Args:
        start, order: The memberships group by group (:func:`group_members`).
        n: The number of agents.
        most: The largest number of entries to make.
    """
    k = _kernels()
    if k is None or start.device.type != "cpu" or order.device.type != "cpu" or order.dtype != torch.int32:
        return None
    groups = start.shape[0] - 1
    start, order = start.contiguous(), order.contiguous()
    degree = torch.zeros(n, dtype=torch.int64)
    k.co_member_degrees(start.data_ptr(), groups, order.data_ptr(), degree.data_ptr())
    indptr = torch.zeros(n + 1, dtype=torch.int64)
    torch.cumsum(degree, 0, out=indptr[1:])
    del degree
    if int(indptr[-1]) > most:
        return None
    indices = _huge_empty(int(indptr[-1]), torch.int32)
    cursor = indptr.clone()  # each row's next place
    k.co_member_place(start.data_ptr(), groups, order.data_ptr(), cursor.data_ptr(), indices.data_ptr())
    return indptr, indices


def push_changes(indptr: Tensor, indices: Tensor, old_nodes: Tensor, old_values: Tensor, nodes: Tensor,
                 values: Tensor, self_count: Tensor, scratch: Tensor, out: Tensor) -> bool | None:
    """A push along a CSR kept up to date: ``out`` holds the push of ``(old_nodes, old_values)`` and
    gets that of ``(nodes, values)``, the push of a node's value being ``out[v] += value`` for every
    neighbor ``v`` and ``out[node] += value * self_count[node]``. Only the nodes whose value changed
    push (their change), so the work follows the changes; exact (int64, wrapping as torch's adds).
    False where the kernel does not apply (not CPU, other dtypes, no kernel): then use torch ops;
    None (nothing done) where it needs a ``scratch`` of ``[n]`` and was given ``[0]``.

    Args:
        indptr: ``[n + 1]`` int64 CSR row pointers.
        indices: ``[e]`` int32 neighbor ids.
        old_nodes, old_values: ``[m_old]`` int64: what ``out`` holds the push of (repeats add again).
        nodes, values: ``[m]`` int64: the values now.
        self_count: ``[n]`` int64 how many times a node's value reaches itself.
        scratch: ``[n]`` int64 zeros (zeros again on return), or ``[0]``: then the kernel
            returns None where it would need it (rows that are not strictly increasing).
        out: ``[n]`` int64, updated in place.

    The lists are trusted (every entry of ``indices`` below ``n``: as :func:`co_members` makes them);
    the shapes are checked, and the node ids before anything is changed.

    Raises:
        IndexError: A node id outside ``[0, n)`` (naming it; nothing changed).
        ValueError: Values not one per node, or ``indptr``, ``self_count`` or ``scratch`` not of ``out``'s ``n``.
    """
    n = out.shape[0]
    if (values.shape != nodes.shape or old_values.shape != old_nodes.shape or nodes.dim() != 1
            or old_nodes.dim() != 1 or indptr.shape != (n + 1,) or self_count.shape != (n,)
            or scratch.shape not in ((n,), (0,))):
        raise ValueError(f"push_changes: expected values one per node and indptr [{n + 1}], self_count [{n}] "
                         f"and scratch [{n}] or [0] (got nodes {list(nodes.shape)}, values {list(values.shape)}, "
                         f"old nodes {list(old_nodes.shape)}, old values {list(old_values.shape)}, indptr "
                         f"{list(indptr.shape)}, self_count {list(self_count.shape)}, scratch {list(scratch.shape)})")
    tensors = (indptr, indices, old_nodes, old_values, nodes, values, self_count, scratch, out)
    if (any(t.device.type != "cpu" or (t.dtype != torch.int64 and t is not indices) for t in tensors)
            or indices.dtype != torch.int32 or not (out.is_contiguous() and scratch.is_contiguous())):
        return False
    k = _kernels()
    if k is None:
        return False
    indptr, indices, self_count = indptr.contiguous(), indices.contiguous(), self_count.contiguous()
    old_nodes, old_values = old_nodes.contiguous(), old_values.contiguous()
    nodes, values = nodes.contiguous(), values.contiguous()
    bad = k.push_changes(indptr.data_ptr(), indices.data_ptr(), n, old_nodes.data_ptr(), old_values.data_ptr(),
                         old_nodes.numel(), nodes.data_ptr(), values.data_ptr(), nodes.numel(),
                         self_count.data_ptr(), scratch.data_ptr() if scratch.numel() else None, out.data_ptr())
    if bad == -2:
        return None
    if bad < 0:
        raise MemoryError(f"push_changes: no memory for the list of up to {old_nodes.numel() + nodes.numel()} changes")
    if bad:
        node = old_nodes[bad - 1] if bad <= old_nodes.numel() else nodes[bad - 1 - old_nodes.numel()]
        raise IndexError(f"node id {int(node)} out of range for a graph of {n} nodes")
    return True


def keep_only(out: Tensor, only: Tensor, src: Tensor | None = None) -> Tensor:
    """``src`` (default: ``out`` itself) with 0 where ``only`` is False, written to ``out`` (``[n]``
    int64 and ``[n]`` bool): the same as ``out.copy_(src).masked_fill_(~only, 0)``, in one pass where
    the kernel applies.
    """
    src = out if src is None else src
    k = _kernels()
    if (k is None or out.device.type != "cpu" or only.device.type != "cpu" or src.device.type != "cpu"
            or out.dtype != torch.int64 or src.dtype != torch.int64 or only.dtype != torch.bool
            or out.shape != only.shape or src.shape != out.shape or out.dim() != 1 or not out.is_contiguous()):
        if src is not out:
            out.copy_(src)
        return out.masked_fill_(~only, 0)
    mask, src = only.contiguous(), src.contiguous()
    k.keep_only(out.data_ptr(), src.data_ptr(), mask.data_ptr(), out.shape[0])
    return out


def scaled_total(sums: list[Tensor], scales: list[float], only: Tensor | None) -> Tensor | None:
    """``[n]`` float64 ``sum_c float64(sums[c]) * scales[c]``, added in order from 0.0 (the bits of
    those torch ops), 0.0 where ``only`` is False, in one pass; None where the kernel does not apply
    (not 1 to :data:`MAX_COLUMNS` contiguous ``[n]`` int64 CPU ``sums``, ``only`` not None or
    ``[n]`` bool on the CPU, or no kernel).
    """
    if not 1 <= len(sums) <= MAX_COLUMNS or len(scales) != len(sums):
        return None
    n = sums[0].shape[0]
    if (any(x.dtype != torch.int64 or x.shape != (n,) or x.device.type != "cpu" or not x.is_contiguous()
            for x in sums)
            or (only is not None and (only.dtype != torch.bool or only.shape != (n,) or only.device.type != "cpu"))):
        return None
    k = _kernels()
    if k is None:
        return None
    out = torch.empty(n, dtype=torch.float64)
    mask = None if only is None else only.contiguous()
    k.scaled_total(out.data_ptr(), (ctypes.c_void_p * len(sums))(*[x.data_ptr() for x in sums]),
                   (ctypes.c_double * len(scales))(*scales), len(sums), None if mask is None else mask.data_ptr(), n)
    return out


def add_wrap(pos: Tensor, delta: Tensor, lengths: tuple[float, ...]) -> bool:
    """``pos = wrap(pos + delta)`` in a periodic box of side ``lengths`` in place, in one pass on
    torch's threads, with the bits of :meth:`~agentsim.space.continuous.Box.wrap`'s torch ops.
    False (nothing done) where the kernel does not apply: not contiguous CPU float32/float64
    tensors of the same dtype and shape ``[n, len(lengths)]``, grad, or no kernel.
    """
    ndim = len(lengths)
    if (pos.device.type != "cpu" or pos.dtype not in (torch.float32, torch.float64) or delta.dtype != pos.dtype
            or delta.device != pos.device or pos.shape != delta.shape or pos.dim() != 2 or pos.shape[1] != ndim
            or not (pos.is_contiguous() and delta.is_contiguous()) or pos.requires_grad or delta.requires_grad):
        return False
    k = _kernels()
    if k is None:
        return False
    fn, size = k.add_wrap[pos.dtype], pos.element_size() * ndim
    side = (ctypes.c_double * ndim)(*lengths)
    native.parallel_for(pos.shape[0], _PARALLEL_MIN,
                        lambda a, b: fn(pos.data_ptr() + size * a, delta.data_ptr() + size * a, b - a, ndim, side))
    return True


def _float_rows(x: Tensor) -> bool:
    """Whether ``x`` is what the row kernels take: a contiguous 2-D CPU float32/float64 tensor with
    at least one column, without grad.
    """
    return (x.device.type == "cpu" and x.dtype in (torch.float32, torch.float64) and x.dim() == 2
            and x.shape[1] >= 1 and x.is_contiguous() and not x.requires_grad)


def squared_norm(x: Tensor) -> Tensor | None:
    """``[n]`` float64 ``sum_j x[:, j]**2`` (see :func:`agentsim.core.ops.squared_norm`) in one pass on
    torch's threads, or None where the kernel does not apply (not a contiguous 2-D CPU
    float32/float64 tensor with at least one column, grad, no kernel).
    """
    if not _float_rows(x):
        return None
    k = _kernels()
    if k is None:
        return None
    n, width = x.shape
    out = torch.empty(n, dtype=torch.float64)
    fn, row = k.sq_norm[x.dtype], x.element_size() * width
    native.parallel_for(n, _PARALLEL_MIN, lambda a, b: fn(x.data_ptr() + row * a, b - a, width, out.data_ptr() + 8 * a))
    return out


MAX_COLUMNS = 8  # columns of one add_columns call


def add_columns(outs: list[Tensor], index: Tensor, srcs: list[Tensor]) -> bool:
    """``outs[c].index_add_(0, index, srcs[c])`` for every column ``c`` in one pass, in place: each
    column's pairs added in pair order, the bits of torch's ``index_add_`` on the CPU. The
    columns' additions overlap (for one column alone torch's loop is as fast: its additions to a
    target are a chain that waits on itself). False (nothing done) where the kernel does not apply:
    not 1 to :data:`MAX_COLUMNS` contiguous 1-D CPU float32/float64 columns of one dtype, ``outs``
    of one length and ``srcs`` of ``index``'s, an int32/int64 ``index``, grad, or no kernel.

    Raises:
        IndexError: An index outside ``[0, len(outs[0]))`` (naming it; nothing is added).
    """
    if not 1 <= len(outs) <= MAX_COLUMNS or len(srcs) != len(outs) or index.dim() != 1:
        return False
    fdt, n, m = outs[0].dtype, outs[0].shape[0], index.shape[0]
    if (fdt not in (torch.float32, torch.float64) or index.dtype not in (torch.int32, torch.int64)
            or index.device.type != "cpu" or not index.is_contiguous()
            or any(t.dtype != fdt or t.dim() != 1 or t.device.type != "cpu" or not t.is_contiguous() or t.requires_grad
                   for t in (*outs, *srcs))
            or any(t.shape[0] != n for t in outs) or any(t.shape[0] != m for t in srcs)):
        return False
    k = _kernels()
    if k is None:
        return False
    out_ptrs = (ctypes.c_void_p * len(outs))(*[t.data_ptr() for t in outs])
    src_ptrs = (ctypes.c_void_p * len(srcs))(*[t.data_ptr() for t in srcs])
    bad = k.add_columns[(fdt, index.dtype)](len(outs), out_ptrs, n, index.data_ptr(), src_ptrs, m)
    if bad:
        raise IndexError(f"scatter_sum_columns: index {int(index[bad - 1])} is out of range for {n} targets")
    return True



def exp(x: Tensor, consts: Tensor, top: int) -> Tensor | None:
    """:func:`agentsim.core.portable.exp` of ``x`` in one pass on torch's threads, the same bits;
    ``consts`` (``x``'s dtype): ``[lo, hi, log2(e), ln2_hi, ln2_lo, 1 / 0!, ..., 1 / top!]``. None
    where the kernel does not apply (not a contiguous CPU float32/float64 tensor, grad, no kernel).
    """
    if (x.device.type != "cpu" or x.dtype not in (torch.float32, torch.float64) or not x.is_contiguous()
            or x.requires_grad or consts.dtype != x.dtype or top != (13 if x.dtype == torch.float64 else 8)
            or consts.shape != (top + 6,)):
        return None
    k = _kernels()
    if k is None:
        return None
    out = torch.empty_like(x)
    fn, size, table = k.exp[x.dtype], x.element_size(), consts.contiguous()
    native.parallel_for(x.numel(), _PARALLEL_MIN, lambda a, b: fn(
        x.data_ptr() + size * a, b - a, table.data_ptr(), top, out.data_ptr() + size * a))
    return out


def gather_sum(tables: list[Tensor], numbers: list[Tensor | None], rows: Tensor | None,
               scales: list[float | None] | None = None) -> Tensor | None:
    """``[m]`` float64 ``sum_c tables[c][numbers[c][rows]]``, the columns added in order from 0 (see
    :func:`agentsim.core.ops.gather_sum`), in one pass on torch's threads; an int64 table with a
    scale (``scales[c]`` a float) gives ``float64(tables[c][g]) * scales[c]``. None where the kernel
    does not apply (not 1 to :data:`MAX_COLUMNS` contiguous 1-D CPU tables, float64, or int64 with a
    scale, ``numbers`` of one int32/int64 dtype and one length (None: the row itself, for a table
    of ``n`` entries), an int64 ``rows`` or None, grad, or no kernel).

    Raises:
        IndexError: A group number outside its table (naming the row; ``out`` is discarded).
    """
    if not 1 <= len(tables) <= MAX_COLUMNS or len(numbers) != len(tables):
        return None
    scaled: list[float | None] = [None] * len(tables) if scales is None else list(scales)
    given = [g for g in numbers if g is not None]
    idt, n = (given[0].dtype, given[0].shape[0]) if given else (torch.int64, tables[0].shape[0])
    if (idt not in (torch.int32, torch.int64) or len(scaled) != len(tables)
            or any(g is None and t.shape[0] != n for t, g in zip(tables, numbers, strict=True))
            or any(t.dtype != (torch.float64 if scale is None else torch.int64) or t.dim() != 1
                   or t.device.type != "cpu" or not t.is_contiguous() or t.requires_grad
                   for t, scale in zip(tables, scaled, strict=True))
            or any(g.dtype != idt or g.dim() != 1 or g.shape[0] != n or g.device.type != "cpu"
                   or not g.is_contiguous() for g in given)
            or (rows is not None and (rows.dtype != torch.int64 or rows.dim() != 1 or rows.device.type != "cpu"
                                      or not rows.is_contiguous()))):
        return None
    if any(scale is not None and scale != scale for scale in scaled):  # (NaN marks a float64 table)
        return None
    k = _kernels()
    if k is None:
        return None
    m = n if rows is None else rows.shape[0]
    out = torch.empty(m, dtype=torch.float64)
    table_ptrs = (ctypes.c_void_p * len(tables))(*[t.data_ptr() for t in tables])
    scale_values = (ctypes.c_double * len(tables))(*[math.nan if scale is None else scale for scale in scaled])
    sizes = (ctypes.c_int64 * len(tables))(*[t.shape[0] for t in tables])
    number_ptrs = (ctypes.c_void_p * len(numbers))(*[None if g is None else g.data_ptr() for g in numbers])
    fn, bad = k.gather_sum[idt], [0]

    def piece(a: int, b: int) -> None:
        at = None if rows is None else rows.data_ptr() + 8 * a
        found = fn(len(tables), table_ptrs, scale_values, sizes, number_ptrs, n, at, a, b - a,
                   out.data_ptr() + 8 * a)
        if found:
            bad[0] = a + found

    native.parallel_for(m, _PARALLEL_MIN, piece)
    if bad[0]:
        r = bad[0] - 1 if rows is None else int(rows[bad[0] - 1])
        if not 0 <= r < n:
            raise IndexError(f"gather_sum: row {r} is outside the {n} rows of the number columns")
        raise IndexError(f"gather_sum: row {r} has a group number outside its table (sizes "
                         f"{[t.shape[0] for t in tables]}, numbers {[r if g is None else int(g[r]) for g in numbers]})")
    return out


def number_ids(field: Tensor, lo: int, top: int) -> tuple[Tensor, Tensor] | None:
    """``(ids, of)``: the distinct ids ``>= 0`` of ``field`` (``[G]`` int64, ascending) and each
    entry's position among them (``[n]`` int32; ``G`` for a negative id), through a bitmap of
    ``[lo, top]`` (``(top - lo) / 8`` bytes and as many for the counts per word), in two passes
    over ``field``. None where the kernel does not apply (not a contiguous 1-D CPU int32/int64
    ``field``, ``0 <= lo <= top`` not holding, or no kernel).

    Raises:
        IndexError: An id ``>= 0`` outside ``[lo, top]``.
    """
    if (field.device.type != "cpu" or field.dim() != 1 or field.dtype not in (torch.int32, torch.int64)
            or not field.is_contiguous() or not 0 <= lo <= top):
        return None
    k = _kernels()
    if k is None:
        return None
    words = (top - lo) // 64 + 1
    bits = torch.zeros(words, dtype=torch.int64)
    bad = k.ids_mark[field.dtype](field.data_ptr(), field.shape[0], lo, top, bits.data_ptr())
    if bad:
        raise IndexError(f"number_ids: id {int(field[bad - 1])} is outside [{lo}, {top}]")
    ranks = torch.empty(words, dtype=torch.int64)
    groups = int(k.bitmap_ranks(bits.data_ptr(), words, ranks.data_ptr()))
    ids = torch.empty(groups, dtype=torch.int64)
    k.bitmap_list(bits.data_ptr(), words, ids.data_ptr())
    if lo:
        ids += lo
    of = torch.empty(field.shape[0], dtype=torch.int32)
    fn, size = k.ids_number[field.dtype], field.element_size()
    native.parallel_for(field.shape[0], _PARALLEL_MIN, lambda a, b: fn(
        field.data_ptr() + size * a, b - a, lo, bits.data_ptr(), ranks.data_ptr(), groups, of.data_ptr() + 4 * a))
    return ids, of

def cell_sort(cell: Tensor, uid: Tensor | None, n_cells: int) -> tuple[Tensor, Tensor] | None:
    """Entries sorted by ``(cell, uid)``, ties in entry order (without ``uid``: by cell, stably),
    and the count of entries before each cell, in one counting sort: the radius search's source
    order and cell table. None where the kernel does not apply (not contiguous CPU int32/int64
    cells and an int64 ``uid`` of their length, or no kernel).

    Args:
        cell: ``[E]`` cell of each entry, in ``[0, n_cells)``.
        uid: ``[E]`` int64 ids, or None.
        n_cells: Number of cells.

    Returns:
        ``(perm, table)``: ``[E]`` int64, the entry at each sorted place; ``[n_cells + 1]`` (the
        dtype of ``cell``), ``table[c]`` = the entries in cells ``< c``.

    Raises:
        IndexError: A cell outside ``[0, n_cells)``.
    """
    if (cell.device.type != "cpu" or cell.dim() != 1 or cell.dtype not in (torch.int32, torch.int64)
            or not cell.is_contiguous() or (uid is not None and (
                uid.device.type != "cpu" or uid.dtype != torch.int64 or uid.shape != cell.shape
                or not uid.is_contiguous()))):
        return None
    k = _kernels()
    if k is None:
        return None
    perm = torch.empty(cell.shape[0], dtype=torch.int64)
    table = torch.empty(n_cells + 1, dtype=cell.dtype)
    bad = k.cell_sort[cell.dtype](cell.data_ptr(), cell.shape[0], None if uid is None else uid.data_ptr(), n_cells,
                                  table.data_ptr(), perm.data_ptr())
    if bad == -1:
        raise MemoryError("cell_sort: no memory to sort a cell's entries")
    if bad:
        raise IndexError(f"cell_sort: cell {int(cell[bad - 1])} is out of range for {n_cells} cells")
    return perm, table


_SEARCH_MIN = 4096  # targets per thread below which one thread filters a search's candidates


def radius_expand(cols: list[Tensor], scols: list[Tensor], order: Tensor, lengths: tuple[float, ...], periodic: bool,
                  r2: float, include_self: bool, t0: int, start: Tensor, cnt: Tensor, per_target: Tensor,
                  ) -> tuple[Tensor, Tensor, Tensor, Tensor] | None:
    """The pairs within the radius among a block of targets' candidates, in candidate order, in one
    pass on torch's threads (the filter of :func:`agentsim.space.continuous.radius_pair_chunks`),
    with the bits of its torch ops; None where the kernel does not apply (not contiguous CPU
    float32/float64 columns of one dtype, rows not int32/int64 of one dtype, grad, no kernel).

    Args:
        cols: ``d`` position columns ``[n]`` in row order; ``scols``: ``d`` columns ``[E]`` of the
            sorted source entries; ``order``: ``[E]`` the row of each sorted entry.
        lengths: The box's side per dim (length units); ``periodic``: minimum image.
        r2: Squared radius (compared in the dtype of the columns, as torch compares).
        include_self: Keep the pairs ``(row, row)``.
        t0: Row of the first target; ``start``, ``cnt``: ``[K, T]`` each target's ``K`` segments of
            sorted entries in canonical order (first entry, length); ``per_target``: ``[T]`` their sums.

    Returns:
        ``(i, j, delta, dist2)``: ``[m]`` target and source rows (the dtype of ``order``), ``[d, m]``
        displacements (source minus target; each row contiguous, the tensor a view of a wider
        buffer) and ``[m]`` squared lengths.
    """
    d, fdt, it = len(cols), cols[0].dtype, order.dtype
    if (not 1 <= d <= 3 or len(scols) != d or len(lengths) != d or fdt not in (torch.float32, torch.float64)
            or it not in (torch.int32, torch.int64) or start.dtype != it or cnt.dtype != it
            or any(c.dtype != fdt or c.device.type != "cpu" or c.requires_grad or not c.is_contiguous()
                   for c in (*cols, *scols)) or order.device.type != "cpu" or not order.is_contiguous()):
        return None
    k = _kernels()
    if k is None:
        return None
    fn = k.expand[(fdt, it)]
    start, cnt = start.contiguous(), cnt.contiguous()
    n_seg, n_targets = start.shape
    total = int(per_target.sum())
    out_i, out_j = torch.empty(total, dtype=it), torch.empty(total, dtype=it)
    delta, dist2 = torch.empty((d, total), dtype=fdt), torch.empty(total, dtype=fdt)
    search = RadiusSearch(
        d=d, cols=(ctypes.c_void_p * 3)(*[c.data_ptr() for c in cols]),
        scols=(ctypes.c_void_p * 3)(*[c.data_ptr() for c in scols]), order=order.data_ptr(),
        lengths=(ctypes.c_double * 3)(*[float(x) for x in lengths], *[1.0] * (3 - d)), periodic=int(periodic),
        r2=float(r2), include_self=int(include_self), start=start.data_ptr(), cnt=cnt.data_ptr(), n_seg=n_seg,
        n_targets=n_targets, t0=t0, out_i=out_i.data_ptr(), out_j=out_j.data_ptr(), delta=delta.data_ptr(),
        cap=total, dist2=dist2.data_ptr())
    pieces = native.thread_ranges(n_targets, _SEARCH_MIN)
    ends = torch.cumsum(per_target, 0)
    first = [0, *ends.index_select(0, torch.tensor([a - 1 for a, _ in pieces[1:]], dtype=torch.int64)).tolist()]
    at = {a: f for (a, _), f in zip(pieces, first, strict=True)}  # candidates before each piece
    kept: dict[int, int] = {}

    def body(a: int, b: int) -> None:
        kept[a] = fn(ctypes.addressof(search), a, b, at[a])

    native.parallel_for(n_targets, _SEARCH_MIN, body)
    m = 0
    for a, _ in pieces:  # each piece wrote its pairs from its first candidate's slot: move them together
        if at[a] != m and kept[a]:
            for buf in (out_i, out_j, dist2, *delta):
                size = buf.element_size()
                k.move_bytes(buf.data_ptr(), m * size, at[a] * size, kept[a] * size)
        m += kept[a]
    return out_i[:m], out_j[:m], delta[:, :m], dist2[:m]


def periodic_grid_sum(layer: Tensor, offsets: list[tuple[int, int]]) -> Tensor | None:
    """``out[..., i, j] = sum_k layer[..., (i + dr_k) mod h, (j + dc_k) mod w]`` of an int64 layer
    ``[..., h, w]`` in one pass per row on torch's threads (exact, so the same result as any order
    of the torch ops), or None where the kernel does not apply (not a contiguous CPU int64 layer,
    an offset that wraps more than once, no kernel).
    """
    h, w = layer.shape[-2:]
    if (layer.device.type != "cpu" or layer.dtype != torch.int64 or not layer.is_contiguous() or h == 0 or w == 0
            or any(abs(dr) >= h or abs(dc) >= w for dr, dc in offsets)):
        return None
    k = _kernels()
    if k is None:
        return None
    out = torch.empty_like(layer)
    grids = layer.numel() // (h * w)
    dr = (ctypes.c_int64 * max(len(offsets), 1))(*(o[0] for o in offsets))
    dc = (ctypes.c_int64 * max(len(offsets), 1))(*(o[1] for o in offsets))
    native.parallel_for(grids * h, 64,  # the rows of all the grids
                        lambda a, b: k.grid_sum(layer.data_ptr(), a, b, h, w, dr, dc, len(offsets), out.data_ptr()))
    return out


def is_iota(x: Tensor) -> bool | None:
    """Whether ``x`` is ``0, 1, ..., len(x) - 1`` (one pass that stops at the first difference), or
    None where the kernel does not apply (not a contiguous CPU int64 tensor, no kernel).
    """
    if x.device.type != "cpu" or x.dtype != torch.int64 or x.dim() != 1 or not x.is_contiguous():
        return None
    k = _kernels()
    return None if k is None else bool(k.is_iota(x.data_ptr(), x.numel()))


def csr_from_pair_chunks(pair_chunks: Callable[[], Iterator[tuple[Tensor, Tensor]]],
                         n_nodes: int) -> tuple[Tensor, Tensor] | None:
    """The CSR ``(indptr [n + 1] int64, indices int32)`` of the undirected graph with the given
    pairs (both directions, rows sorted, self-loops and repeated pairs dropped: what
    :func:`~agentsim.space.graph.network.build_csr` makes of them), or None where the kernel does
    not apply (no kernel, ``n_nodes >= 2**31``).

    ``pair_chunks()`` yields the pairs as chunks of ``(u, v)`` int64 ``[k]`` tensors; it is called
    twice (count, then place), so the whole edge list is never held: the peak is ``indices`` (4 B
    per directed edge) and ``indptr`` (8 B per node), against 16 B per pair plus ``indices`` for
    the sort of packed keys.
    """
    k = _kernels()
    if k is None or n_nodes >= 2**31:
        return None
    rows = _huge_empty(n_nodes + 1, torch.int64).zero_()
    counts = rows[1:]
    for u, v in _strided_int64(pair_chunks()):
        _on_threads(k.csr_count, u, v, counts.data_ptr())
    torch.cumsum(rows, 0, out=rows)  # rows[r]: the start of row r
    indices = _huge_empty(int(rows[-1]), torch.int32)
    for u, v in _strided_int64(pair_chunks()):
        _on_threads(k.csr_place, u, v, rows.data_ptr(), indices.data_ptr())
    lengths = torch.empty(n_nodes, dtype=torch.int32)
    native.parallel_for(n_nodes, _PARALLEL_MIN,
                        lambda a, b: k.csr_sort_rows(rows.data_ptr(), a, b, indices.data_ptr(), lengths.data_ptr()))
    k.csr_compact(rows.data_ptr(), n_nodes, indices.data_ptr(), lengths.data_ptr())
    return rows, indices[:int(rows[-1])]


def _on_threads(fn: Callable[..., None], u: Tensor, v: Tensor, *tail: int) -> None:
    """``fn(u + a, v + a, stride, b - a, *tail)`` for pieces ``[a, b)`` of the pairs, one a thread."""
    s = u.stride(0)
    native.parallel_for(u.numel(), _PARALLEL_MIN,
                        lambda a, b: fn(u.data_ptr() + 8 * s * a, v.data_ptr() + 8 * s * a, s, b - a, *tail))


def _strided_int64(chunks: Iterator[tuple[Tensor, Tensor]]) -> Iterator[tuple[Tensor, Tensor]]:
    """The chunks as int64 ``[k]`` views with one stride for both (copied only where they differ)."""
    for u, v in chunks:
        u, v = u.to(torch.int64), v.to(torch.int64)
        if u.stride(0) != v.stride(0) or u.stride(0) < 1:
            u, v = u.contiguous(), v.contiguous()
        yield u, v


def _huge_empty(n: int, dtype: torch.dtype) -> Tensor:
    """``torch.empty(n, dtype=dtype)`` in 2 MiB pages where the system allows (before first touch)."""
    out = torch.empty(n, dtype=dtype)
    native.huge_pages(out.data_ptr(), out.numel() * out.element_size())
    return out


def fixed_sum(x: Tensor, frac_bits: int) -> Tensor | None:
    """``sum(round(x * 2**frac_bits))`` as a 0-d int64 tensor (what ``ops.to_fixed(x).sum()``
    gives, bit for bit), or None where the kernel does not apply (not a CPU float32/float64
    tensor, needs grad, no kernel).
    """
    checked = fixed_sum_checked(x, frac_bits, math.inf)
    return None if checked is None else torch.tensor(checked.total, dtype=torch.int64)


class CheckedSum(NamedTuple):
    """What :func:`fixed_sum_checked` gives: ``total`` (the wrapping int64 fixed-point sum),
    ``invalid`` (some value NaN or of magnitude ``>= limit``) and ``floors`` (the sum of
    ``floor(|x|)`` in float64: exact below 2**53, in any order).
    """

    total: int
    invalid: bool
    floors: float


def fixed_sum_checked(x: Tensor, frac_bits: int, limit: float) -> CheckedSum | None:
    """:func:`fixed_sum` of ``x`` and, in the same call, whether some value is NaN or of magnitude
    ``limit`` or more, and the sum of ``floor(|x|)``: a metric's sum and its checks as Python numbers
    (no tensor made). None where the kernel does not apply (as :func:`fixed_sum`).
    """
    if x.device.type != "cpu" or x.dtype not in (torch.float32, torch.float64) or x.requires_grad:
        return None
    k = _kernels()
    if k is None:
        return None
    x = x.contiguous()
    fn, ptr, item, scale = k.fixed_sum_checked[x.dtype], x.data_ptr(), x.element_size(), float(2**frac_bits)
    parts: list[tuple[int, float, float]] = []  # per thread's range: (wrapping sum, invalid, floors)

    def piece(a: int, b: int) -> None:
        out = (ctypes.c_double * 2)()
        total = fn(ptr + item * a, b - a, scale, limit, ctypes.addressof(out))
        parts.append((total, out[0], out[1]))

    native.parallel_for(x.numel(), _PARALLEL_MIN, piece)
    return CheckedSum(as_int64(sum(p[0] for p in parts)), any(p[1] for p in parts), math.fsum(p[2] for p in parts))


def squared_norm_fixed_sum(x: Tensor, frac_bits: int) -> Tensor | None:
    """:func:`fixed_sum` of :func:`squared_norm` ``(x)`` (``sum_i round(|x_i|**2 * 2**frac_bits)``,
    the row norms in float64) without the ``[n]`` column, in one pass on torch's threads: the same
    bits. None where the kernel does not apply (not a contiguous 2-D CPU float32/float64 tensor
    with at least one column, grad, no kernel).
    """
    if not _float_rows(x):
        return None
    k = _kernels()
    if k is None:
        return None
    fn, (n, width), scale = k.sq_norm_fixed_sum[x.dtype], x.shape, float(2**frac_bits)
    row = x.element_size() * width
    parts: list[int] = []
    native.parallel_for(n, _PARALLEL_MIN, lambda a, b: parts.append(fn(x.data_ptr() + row * a, b - a, width, scale)))
    return _wrapped_total(parts)


def _wrapped_total(parts: list[int]) -> Tensor:
    """The wrapping int64 sum of the threads' wrapping partial sums (integer addition: any split of
    the terms gives the same bits), as a 0-d int64 tensor.
    """
    return torch.tensor(as_int64(sum(parts)), dtype=torch.int64)


def flatnonzero(mask: Tensor) -> Tensor | None:
    """``[m]`` int64: the positions of the True entries of a 1-D CPU bool ``mask``, ascending (see
    :func:`agentsim.core.ops.flatnonzero`), on torch's threads: each thread counts its piece's
    entries, then writes their positions at its piece's offset. None where the kernel does not
    apply (not a contiguous 1-D CPU bool tensor, fewer than two threads' worth of rows, no kernel).
    """
    if mask.dtype != torch.bool or mask.dim() != 1 or mask.device.type != "cpu" or not mask.is_contiguous():
        return None
    n = mask.shape[0]
    pieces = native.thread_ranges(n, _SELECT_MIN)
    k = _kernels() if len(pieces) > 1 else None
    if k is None:
        return None
    counts = [0] * len(pieces)
    where = {a: p for p, (a, _) in enumerate(pieces)}
    ptr = mask.data_ptr()

    def count(a: int, b: int) -> None:
        counts[where[a]] = k.count_true(ptr + a, b - a)

    native.parallel_for(n, _SELECT_MIN, count)
    offsets = [0, *itertools.accumulate(counts)]
    out = torch.empty(offsets[-1], dtype=torch.int64)

    def place(a: int, b: int) -> None:
        p = where[a]
        k.true_positions(ptr + a, b - a, a, counts[p], out.data_ptr() + 8 * offsets[p])

    native.parallel_for(n, _SELECT_MIN, place)
    return out


def equal_any(x: Tensor, values: Sequence[int | float]) -> Tensor | None:
    """Bool of ``x``'s shape: where ``x`` equals one of ``values`` (``k >= 1`` numbers of ``x``'s kind:
    see :func:`agentsim.core.ops.equal`, which checks that), in one pass on torch's threads. None
    where the kernel does not apply: not a contiguous CPU tensor of an integer (not bool) or float
    dtype without grad, fewer than two threads' worth of entries, a value that float32 would round
    (the caller's NumPy comparison decides), no kernel.
    """
    if (not values or x.device.type != "cpu" or not x.is_contiguous() or x.requires_grad
            or len(native.thread_ranges(x.numel(), _SELECT_MIN)) < 2):
        return None
    k = _kernels()
    fn = None if k is None else k.equal_any.get(x.dtype)
    if fn is None:
        return None
    table = torch.tensor(list(values), dtype=x.dtype)  # (made only where the kernel runs)
    if x.dtype == torch.float32 and table.tolist() != list(values):
        return None
    size = x.element_size()
    out = torch.empty(x.shape, dtype=torch.bool)
    native.parallel_for(x.numel(), _SELECT_MIN, lambda a, b: fn(
        x.data_ptr() + size * a, b - a, table.data_ptr(), table.shape[0], out.data_ptr() + a))
    return out
