"""Scatter, segment and exact reductions over agent rows.

Every reduction takes rows ``src [n, ...]`` and sends row ``k`` to output row ``index[k]``
(scatter) or reduces contiguous CSR segments ``src[indptr[s]:indptr[s + 1]]`` (segment).
Pair tensors follow the ``_i`` / ``_j`` convention: for messages from senders ``j`` to
receivers ``i`` write ``scatter_sum(msg_ij, i, n_local)``.

Backends:
    ``"native"`` (default) uses torch only: ``index_add_`` for sums and
    ``scatter_reduce_`` for max / min. ``"torch_scatter"`` routes ``scatter_*`` to
    ``torch_scatter.scatter`` (``pip install agentsim[scatter]``). Pick one with
    :func:`set_backend` or the environment variable ``AGENTSIM_SCATTER_BACKEND``, read
    once at import. Both backends give the same results (empty segments of max / min
    are filled the same way); :func:`segment_sum` and the exact reductions are always
    native.

Determinism and bitwise identity:
    A float sum depends on the order of its terms. ``index_add_`` on CPU adds pairs
    one after another in pair order, so :func:`scatter_sum` is repeatable, but a
    different order of the same pairs (another partition of agents over ranks, a
    shuffled neighbor list) can change the last bits. On CUDA ``index_add_`` uses
    atomics and is not even repeatable. ``amax`` / ``amin`` and integer sums are
    order-free. Where bits must not depend on order, use :func:`scatter_sum_exact` or
    :func:`exact_sum`: they round every term to int64 fixed point
    (``round(x * 2**frac_bits)``) and add integers, which is associative, so the
    result is the same for every order, on every device and for every split of the
    terms over ranks (fixed-point partial sums can be all-reduced exactly).

Examples:
    >>> import torch
    >>> src = torch.tensor([1.0, 2.0, 3.0, 4.0])
    >>> i = torch.tensor([0, 2, 0, 2])
    >>> scatter_sum(src, i, 3).tolist()
    [4.0, 0.0, 6.0]
    >>> scatter_max(src, i, 3).tolist()
    [3.0, -inf, 4.0]
    >>> segment_sum(src, torch.tensor([0, 1, 1, 4])).tolist()
    [1.0, 0.0, 9.0]
    >>> perm = torch.randperm(4)
    >>> bool(torch.equal(scatter_sum_exact(src, i, 3), scatter_sum_exact(src[perm], i[perm], 3)))
    True
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor

from agentsim._native import kernels as cpu_kernels
from agentsim.errors import ConfigError, did_you_mean

__all__ = [
    "BACKENDS",
    "equal",
    "exact_sum",
    "flatnonzero",
    "from_fixed",
    "gather_sum",
    "get_backend",
    "scatter_add_columns_",
    "scatter_max",
    "scatter_mean",
    "scatter_min",
    "scatter_sum",
    "scatter_sum_columns",
    "scatter_sum_exact",
    "segment_sum",
    "set_backend",
    "squared_norm",
    "take_rows",
    "tensor_version",
    "to_fixed",
    "to_float64_",
]

BACKENDS = ("native", "torch_scatter")
ENV_VAR = "AGENTSIM_SCATTER_BACKEND"
_INDEX_DTYPES = (torch.int32, torch.int64)

_backend = "native"
_torch_scatter = None  # the imported module when the backend is "torch_scatter"


# --------------------------------------------------------------------------- backend
def set_backend(name: str) -> None:
    """Choose the implementation of the ``scatter_*`` reductions.

    Args:
        name: ``"native"`` (torch only) or ``"torch_scatter"``.

    Raises:
        ConfigError: ``name`` is not a backend, or ``torch_scatter`` cannot be imported.
    """
    global _backend, _torch_scatter
    if name not in BACKENDS:
        raise ConfigError(
            f"unknown scatter backend {name!r} (valid: {', '.join(BACKENDS)})." + did_you_mean(str(name), BACKENDS)
        )
    if name == "torch_scatter":
        try:
            import torch_scatter
        except ImportError as e:
            raise ConfigError(
                f"scatter backend 'torch_scatter' needs the torch-scatter package, which cannot be imported ({e}); "
                "install it with `pip install agentsim[scatter]` or use the 'native' backend"
            ) from None
        _torch_scatter = torch_scatter
    else:
        _torch_scatter = None
    _backend = name


def get_backend() -> str:
    """The name of the current backend (``"native"`` or ``"torch_scatter"``)."""
    return _backend


def _init_backend_from_env() -> None:
    name = os.environ.get(ENV_VAR, "").strip() or "native"
    try:
        set_backend(name)
    except ConfigError as e:
        raise ConfigError(f"environment variable {ENV_VAR}={name!r}: {e}") from None


# --------------------------------------------------------------------------- checks
def _check_pairs(src: Tensor, index: Tensor, dim_size: int) -> None:
    """Metadata checks only (no device sync): shapes, dtypes, sizes."""
    if not isinstance(src, Tensor) or src.dim() < 1:
        raise ConfigError(f"src: expected a tensor [n, ...] (got {_describe(src)})")
    if not isinstance(index, Tensor) or index.dim() != 1 or index.dtype not in _INDEX_DTYPES:
        raise ConfigError(f"index: expected an int32 or int64 tensor [n] (got {_describe(index)})")
    if index.shape[0] != src.shape[0]:
        raise ConfigError(f"index: expected {src.shape[0]} entries, one per row of src (got {index.shape[0]})")
    if isinstance(dim_size, bool) or not isinstance(dim_size, int) or dim_size < 0:
        raise ConfigError(f"dim_size: expected an int >= 0 (got {dim_size!r})")


def _describe(x: object) -> str:
    if isinstance(x, Tensor):
        return f"{x.dtype} tensor of shape {list(x.shape)}"
    return type(x).__name__


def _as_summable(src: Tensor) -> Tensor:
    # index_add_ has no bool kernel; a sum of flags is a count.
    return src.long() if src.dtype == torch.bool else src


def _broadcast_index(index: Tensor, src: Tensor) -> Tensor:
    """``index [n]`` as int64 expanded to ``src``'s shape (what ``scatter_reduce_`` wants)."""
    return index.long().view(-1, *([1] * (src.dim() - 1))).expand_as(src)


def _counts(index: Tensor, dim_size: int, like: Tensor) -> Tensor:
    """Rows per target, shaped ``[dim_size, 1, ...]`` to broadcast against ``like``."""
    count = torch.bincount(index.long(), minlength=dim_size)[:dim_size]
    return count.view(-1, *([1] * (like.dim() - 1)))


# --------------------------------------------------------------------------- scatter
def scatter_sum(src: Tensor, index: Tensor, dim_size: int) -> Tensor:
    """Sum rows of ``src`` into ``dim_size`` targets: ``out[t] = sum(src[k] for k with index[k] == t)``.

    Native backend: ``zeros.index_add_(0, index, src)``. On CPU this adds the pairs one
    after another **in pair order**: repeatable, equal to a sequential Python loop, but
    a permutation of the pairs can change the last bits of a float result (use
    :func:`scatter_sum_exact` for order-free bits). Integer sums are exact.

    Args:
        src: Values ``[n, ...]``; bool is summed as int64.
        index: Target of each row, int32 or int64 ``[n]``, each in ``[0, dim_size)``.
        dim_size: Number of targets.

    Returns:
        ``[dim_size, ...]`` with ``src``'s dtype; targets with no rows are 0.

    Examples:
        >>> scatter_sum(torch.tensor([[1, 2], [3, 4], [5, 6]]), torch.tensor([1, 1, 0]), 3).tolist()
        [[5, 6], [4, 6], [0, 0]]
    """
    _check_pairs(src, index, dim_size)
    src = _as_summable(src)
    if _torch_scatter is not None:
        summed: Tensor = _torch_scatter.scatter(src, index.long(), dim=0, dim_size=dim_size, reduce="sum")
        return summed
    out = src.new_zeros((dim_size, *src.shape[1:]))
    return out.index_add_(0, index, src)


def scatter_sum_columns(srcs: Sequence[Tensor], index: Tensor, dim_size: int) -> list[Tensor]:
    """:func:`scatter_sum` of several 1-D value columns that share one ``index``, in one pass.

    Column ``c`` of the result is ``zeros(dim_size).index_add_(0, index, srcs[c])``: its pairs
    added in pair order, the bits of the native backend's :func:`scatter_sum` on the CPU (and
    whatever the backend). On the CPU, float32 / float64 columns go through one compiled loop
    (:func:`agentsim._native.kernels.add_columns`, up to 8 columns a call), whose columns' additions
    overlap; elsewhere (CUDA, autograd, other dtypes) one ``index_add_`` per column.

    Args:
        srcs: ``k`` value columns ``[n]`` of one dtype.
        index: ``[n]`` int32 or int64 target of each pair, in ``[0, dim_size)``.
        dim_size: Number of targets.

    Returns:
        ``k`` tensors ``[dim_size]``: the sums per target (0 where none).

    Raises:
        ConfigError: Columns of other shapes or dtypes.
        IndexError: An index outside ``[0, dim_size)``.

    Examples:
        >>> a, b = scatter_sum_columns([torch.tensor([1.0, 2.0, 3.0]), torch.tensor([4.0, 5.0, 6.0])],
        ...                            torch.tensor([1, 0, 1]), 2)
        >>> a.tolist(), b.tolist()
        ([2.0, 4.0], [5.0, 10.0])
    """
    srcs = list(srcs)
    if not srcs:
        raise ConfigError("scatter_sum_columns: expected one or more value columns (got none)")
    _check_value_columns("scatter_sum_columns", "columns", srcs, index, dim_size)
    outs = [srcs[0].new_zeros(dim_size) for _ in srcs]
    _add_columns(outs, index, srcs)
    return outs


def scatter_add_columns_(outs: Sequence[Tensor], index: Tensor, srcs: Sequence[Tensor]) -> None:
    """In place: ``outs[c].index_add_(0, index, srcs[c])`` for every column ``c``, in one pass
    where the compiled loop applies (see :func:`scatter_sum_columns`, whose bits these are when
    ``outs`` start at zero). ``outs`` may be views (e.g. the slice of a longer column a chunk of
    targets owns), each 1-D and contiguous.

    Args:
        outs: ``k`` columns ``[dim_size]`` to add into, of the dtype of ``srcs``.
        index: ``[n]`` int32 or int64 target of each pair, in ``[0, dim_size)``.
        srcs: ``k`` value columns ``[n]``.

    Raises:
        ConfigError: Columns of other shapes or dtypes, or ``outs`` and ``srcs`` of different numbers.
        IndexError: An index outside ``[0, dim_size)``.
    """
    outs, srcs = list(outs), list(srcs)
    if not outs or len(outs) != len(srcs):
        raise ConfigError(f"scatter_add_columns_: expected as many output columns as value columns, one or more "
                          f"(got {len(outs)} and {len(srcs)})")
    dim_size = outs[0].shape[0] if outs[0].dim() == 1 else -1
    if any(o.dim() != 1 or o.shape[0] != dim_size or o.dtype != srcs[0].dtype or not o.is_contiguous() for o in outs):
        got = ", ".join(_describe(o) for o in outs)
        raise ConfigError(f"scatter_add_columns_: expected contiguous 1-D output columns of one length and the "
                          f"values' dtype {srcs[0].dtype} (got {got})")
    _check_value_columns("scatter_add_columns_", "value columns", srcs, index, dim_size)
    _add_columns(outs, index, srcs)


def _check_value_columns(fn: str, what: str, srcs: list[Tensor], index: Tensor, dim_size: int) -> None:
    """``srcs``: 1-D columns of one dtype, each of ``index``'s length (and ``index``, ``dim_size`` checked)."""
    _check_pairs(srcs[0], index, dim_size)
    if any(not isinstance(s, Tensor) or s.dim() != 1 or s.shape != index.shape or s.dtype != srcs[0].dtype
           for s in srcs):
        got = ", ".join(_describe(s) for s in srcs)
        raise ConfigError(f"{fn}: expected 1-D {what} of one dtype, each of index's length {index.shape[0]} "
                          f"(got {got})")


def _add_columns(outs: list[Tensor], index: Tensor, srcs: list[Tensor]) -> None:
    step = cpu_kernels.MAX_COLUMNS
    for c in range(0, len(srcs), step):
        if not cpu_kernels.add_columns(outs[c:c + step], index, srcs[c:c + step]):
            for out, src in zip(outs[c:c + step], srcs[c:c + step], strict=True):
                out.index_add_(0, index, src)


def scatter_mean(src: Tensor, index: Tensor, dim_size: int) -> Tensor:
    """Mean of the rows sent to each target; targets with no rows are 0.

    ``out[t] = scatter_sum(src)[t] / max(count[t], 1)``, with floor division for integer
    ``src`` (as ``torch_scatter`` does). The sum is in pair order, see :func:`scatter_sum`.

    Args:
        src: Values ``[n, ...]``.
        index: Target of each row, int32 or int64 ``[n]``.
        dim_size: Number of targets.

    Returns:
        ``[dim_size, ...]`` with ``src``'s dtype (int64 for bool).
    """
    _check_pairs(src, index, dim_size)
    src = _as_summable(src)
    if _torch_scatter is not None:
        mean: Tensor = _torch_scatter.scatter(src, index.long(), dim=0, dim_size=dim_size, reduce="mean")
        return mean
    total = src.new_zeros((dim_size, *src.shape[1:])).index_add_(0, index, src)
    count = _counts(index, dim_size, total).clamp_(min=1)
    if total.is_floating_point() or total.is_complex():
        return total / count.to(total.dtype)
    return torch.div(total, count.to(total.dtype), rounding_mode="floor")


def _default_fill(dtype: torch.dtype, reduce: str) -> float | int:
    if dtype.is_floating_point:
        return float("-inf") if reduce == "amax" else float("inf")
    if dtype == torch.bool:
        return reduce != "amax"
    info = torch.iinfo(dtype)
    return info.min if reduce == "amax" else info.max


def _scatter_extreme(src: Tensor, index: Tensor, dim_size: int, fill: float | int | None, reduce: str) -> Tensor:
    _check_pairs(src, index, dim_size)
    if fill is None:
        fill = _default_fill(src.dtype, reduce)
    if _torch_scatter is not None:
        out = _torch_scatter.scatter(src, index.long(), dim=0, dim_size=dim_size, reduce=reduce[1:])
        # torch_scatter leaves empty targets at 0; give them the native fill.
        empty = _counts(index, dim_size, out) == 0
        return torch.where(empty, torch.full((), fill, dtype=out.dtype, device=out.device), out)
    out = torch.full((dim_size, *src.shape[1:]), fill, dtype=src.dtype, device=src.device)
    return out.scatter_reduce_(0, _broadcast_index(index, src), src, reduce, include_self=False)


def scatter_max(src: Tensor, index: Tensor, dim_size: int, fill: float | int | None = None) -> Tensor:
    """Largest row sent to each target (elementwise); order-free.

    Args:
        src: Values ``[n, ...]``.
        index: Target of each row, int32 or int64 ``[n]``.
        dim_size: Number of targets.
        fill: Value of targets with no rows (default ``-inf`` for floats, the dtype's
            minimum for integers).

    Returns:
        ``[dim_size, ...]`` with ``src``'s dtype (values only, no argmax).
    """
    return _scatter_extreme(src, index, dim_size, fill, "amax")


def scatter_min(src: Tensor, index: Tensor, dim_size: int, fill: float | int | None = None) -> Tensor:
    """Smallest row sent to each target (elementwise); order-free.

    Args:
        src: Values ``[n, ...]``.
        index: Target of each row, int32 or int64 ``[n]``.
        dim_size: Number of targets.
        fill: Value of targets with no rows (default ``+inf`` for floats, the dtype's
            maximum for integers).

    Returns:
        ``[dim_size, ...]`` with ``src``'s dtype (values only, no argmin).
    """
    return _scatter_extreme(src, index, dim_size, fill, "amin")


# --------------------------------------------------------------------------- segment
def segment_sum(src: Tensor, indptr: Tensor) -> Tensor:
    """Sum contiguous CSR segments: ``out[s] = src[indptr[s]:indptr[s + 1]].sum(0)``.

    Floats are added left to right within each segment, starting from 0 (on CPU: the
    same bits as a sequential loop, via ``repeat_interleave`` of segment ids and
    ``index_add_``; on CUDA ``index_add_`` is atomic, so use :func:`scatter_sum_exact`
    there when bits matter). Integers use differences of a cumulative sum, exact
    (wrapping) arithmetic. Always native, whatever the backend.

    Args:
        src: Values ``[n, ...]``; bool is summed as int64.
        indptr: Segment boundaries, int ``[n_seg + 1]``, non-decreasing, with
            ``indptr[0] == 0`` and ``indptr[-1] == n`` (not checked: that needs a sync).

    Returns:
        ``[n_seg, ...]`` with ``src``'s dtype; empty segments are 0.
    """
    if not isinstance(src, Tensor) or src.dim() < 1:
        raise ConfigError(f"src: expected a tensor [n, ...] (got {_describe(src)})")
    if not isinstance(indptr, Tensor) or indptr.dim() != 1 or indptr.dtype not in _INDEX_DTYPES or indptr.numel() < 1:
        raise ConfigError(f"indptr: expected an int32 or int64 tensor [n_seg + 1] (got {_describe(indptr)})")
    src = _as_summable(src)
    indptr = indptr.long()
    n_seg = indptr.numel() - 1
    if not (src.is_floating_point() or src.is_complex()):
        # Integer adds are associative: a cumsum difference is exact (wrap-around cancels).
        csum = torch.cat([src.new_zeros((1, *src.shape[1:]), dtype=torch.int64), src.cumsum(0, dtype=torch.int64)])
        return (csum[indptr[1:]] - csum[indptr[:-1]]).to(src.dtype)
    seg = torch.repeat_interleave(
        torch.arange(n_seg, device=src.device), indptr.diff(), output_size=src.shape[0]
    )
    return src.new_zeros((n_seg, *src.shape[1:])).index_add_(0, seg, src)


def expand_ranges(start: Tensor, count: Tensor) -> tuple[Tensor, Tensor]:
    """The positions of several runs, end to end: ``start[i] .. start[i] + count[i] - 1`` for each
    ``i`` in turn (a CSR's slices of some rows), and for each position the run it belongs to.

    Args:
        start: ``[k]`` int64 first position of each run.
        count: ``[k]`` int64 length of each run (>= 0).

    Returns:
        ``(positions, run)``: ``[sum(count)]`` int64 each.

    Examples:
        >>> pos, run = expand_ranges(torch.tensor([5, 0, 9]), torch.tensor([2, 0, 3]))
        >>> pos.tolist(), run.tolist()
        ([5, 6, 9, 10, 11], [0, 0, 2, 2, 2])
    """
    run = torch.repeat_interleave(torch.arange(count.shape[0], device=count.device), count)
    first = torch.cumsum(count, 0) - count  # where each run starts in the output
    return torch.arange(run.shape[0], device=count.device) + (start - first).index_select(0, run), run


# --------------------------------------------------------------------------- selection
def flatnonzero(mask: Tensor) -> Tensor:
    """Indices of the True entries of a 1D bool mask, ascending: ``mask.nonzero().squeeze(1)``.

    On CPU this is NumPy's ``flatnonzero`` on the same memory, 5-7x faster than torch's
    ``nonzero`` for masks of 10**5 to 10**6 entries on the development machine, and from 2M
    entries on a kernel on torch's threads (each counts its piece's entries, then writes their
    positions; about 2x NumPy's one thread on 2 threads, for 100M entries); elsewhere it is torch's.

    Args:
        mask: ``[n]`` bool.

    Returns:
        ``[m]`` int64 on ``mask``'s device.

    Examples:
        >>> flatnonzero(torch.tensor([False, True, True, False, True])).tolist()
        [1, 2, 4]
    """
    if mask.dim() != 1 or mask.dtype != torch.bool:
        raise ConfigError(f"flatnonzero: expected a 1D bool mask (got {mask.dtype} of shape {tuple(mask.shape)})")
    if mask.device.type == "cpu":
        positions = cpu_kernels.flatnonzero(mask)  # at 2M entries or more, on torch's threads
        return torch.from_numpy(np.flatnonzero(mask.numpy())) if positions is None else positions
    return mask.nonzero().squeeze(1)



def equal(x: Tensor, *values: int | float | bool) -> Tensor:
    """``x == values[0] | x == values[1] | ...``: where ``x`` holds one of ``values`` (a state, a
    category), as a bool tensor of ``x``'s shape.

    On CPU this is NumPy's comparison on the same memory: torch's CPU comparisons that return
    bool run element by element, 10-15x slower for 10**6 int8 entries on the development machine
    (0.56 ms against 0.036 ms); from 2M entries on (not bool) it is a kernel that compares with
    every value in one pass on torch's threads (4x NumPy for three values of 100M int8 entries, on
    2 threads); elsewhere it is torch's.

    Args:
        x: Any shape, integer, bool or float (not requiring grad).
        values: One or more values (of ``x``'s kind).

    Returns:
        bool, ``x``'s shape and device.

    Examples:
        >>> state = torch.tensor([0, 3, 2, 3], dtype=torch.int8)
        >>> equal(state, 3).tolist(), equal(state, 2, 3).tolist()
        ([False, True, False, True], [False, True, True, True])
    """
    if not values:
        raise ConfigError("equal: expected at least one value to compare with (got none)")
    if x.device.type == "cpu" and not x.requires_grad and all(_compares_alike(x.dtype, v) for v in values):
        hit = cpu_kernels.equal_any(x, values)  # at 2M entries or more: one pass on torch's threads
        if hit is not None:
            return hit
        a = x.numpy()
        out = a == values[0]
        for v in values[1:]:
            out |= a == v
        return torch.from_numpy(np.asarray(out))
    mask = x == values[0]
    for v in values[1:]:
        mask = mask | (x == v)
    return mask


def _compares_alike(dtype: torch.dtype, value: object) -> bool:
    """Whether NumPy compares a ``dtype`` array with ``value`` as torch does: an int within an
    integer dtype's range, a bool with bools, a number with float32/float64 (anything else, e.g.
    an int tensor with a float, which torch compares in float32, goes through torch).
    """
    if dtype == torch.bool:
        return isinstance(value, bool)
    if dtype in (torch.float32, torch.float64):
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if dtype.is_floating_point or dtype.is_complex or not isinstance(value, int) or isinstance(value, bool):
        return False
    info = torch.iinfo(dtype)
    return info.min <= value <= info.max


_ROW_DTYPES = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def take_rows(src: Tensor, index: Tensor, out: Tensor | None = None) -> Tensor:
    """``src.index_select(0, index)``: rows ``index`` of ``src`` ``[n, ...]``, same bits.

    A contiguous ``src`` whose rows are 1, 2, 4 or 8 bytes (e.g. ``[n, 2]`` float32) is
    gathered as one integer per row: on CPU about 4x faster than ``index_select`` on
    ``[n, 2]`` rows, on the development machine.

    Args:
        src: ``[n, ...]``.
        index: ``[m]`` int64 rows, on ``src``'s device.
        out: Optional contiguous ``[m, ...]`` result buffer of ``src``'s dtype.

    Returns:
        ``[m, ...]`` (``out`` when given).

    Examples:
        >>> take_rows(torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]), torch.tensor([2, 0])).tolist()
        [[5.0, 6.0], [1.0, 2.0]]
    """
    per_row = math.prod(src.shape[1:])
    row_dtype = _ROW_DTYPES.get(per_row * src.element_size()) if src.dim() > 1 else None
    if src.requires_grad and torch.is_grad_enabled():  # autograd follows index_select, not the integer view
        if out is not None:
            raise ValueError("take_rows: out= cannot hold rows that carry gradients")
        return src.index_select(0, index)
    if row_dtype is None or not src.is_contiguous():
        return src.index_select(0, index) if out is None else torch.index_select(src, 0, index, out=out)
    rows = src.reshape(src.shape[0], per_row).view(row_dtype).reshape(-1)  # one integer per row, no copy
    if out is None:
        return rows.index_select(0, index).view(src.dtype).reshape(index.shape[0], *src.shape[1:])
    torch.index_select(rows, 0, index, out=out.reshape(out.shape[0], per_row).view(row_dtype).reshape(-1))
    return out


# --------------------------------------------------------------------------- exact
def _check_frac_bits(frac_bits: int) -> None:
    if isinstance(frac_bits, bool) or not isinstance(frac_bits, int) or not 0 <= frac_bits <= 62:
        raise ConfigError(f"frac_bits: expected an int in [0, 62] (got {frac_bits!r})")


def to_fixed(x: Tensor, frac_bits: int = 32) -> Tensor:
    """Float to int64 fixed point: ``round(x * 2**frac_bits)`` (round half to even).

    No range check (this runs inside vectorized code): values must satisfy
    ``|x| < 2**(62 - frac_bits)`` (``2**30`` for the default 32 fractional bits, with a
    resolution of ``2**-32``, about 2.3e-10); outside that, and for NaN / inf, the
    result is meaningless. Integer tensors are converted to int64 and shifted.

    Args:
        x: Any shape, float or integer.
        frac_bits: Fractional bits, in ``[0, 62]``.

    Returns:
        int64 tensor of ``x``'s shape.
    """
    _check_frac_bits(frac_bits)
    if not x.is_floating_point():
        return x.long() << frac_bits
    # float64 holds every float16/32/64 value exactly and the scaling by 2**k is exact.
    return (x.double() * float(2**frac_bits)).round_().long()


def from_fixed(x: Tensor, frac_bits: int = 32, dtype: torch.dtype = torch.float64) -> Tensor:
    """int64 fixed point back to float: ``x / 2**frac_bits`` converted to ``dtype``.

    Args:
        x: int64 tensor, any shape.
        frac_bits: Fractional bits used by :func:`to_fixed`.
        dtype: Floating dtype of the result.

    Returns:
        ``dtype`` tensor of ``x``'s shape.
    """
    _check_frac_bits(frac_bits)
    return (x.double() / float(2**frac_bits)).to(dtype)


def to_float64_(x: Tensor) -> Tensor:
    """``x.to(torch.float64)`` written over ``x``'s own memory: a large int64 table (a sum of
    :meth:`~agentsim.core.context.Context.group_table`) becomes float64 without being held twice.
    Each element is read before its 8 bytes are written over (an elementwise copy), so the bits
    are those of ``x.to(torch.float64)``. ``x`` is spent: its memory now holds the floats.

    Args:
        x: int64, contiguous, any shape.

    Returns:
        float64 view of ``x``'s memory, of its shape.

    Raises:
        ValueError: ``x`` not int64, or not contiguous.

    Examples:
        >>> to_float64_(torch.tensor([3, -2**60])).tolist()
        [3.0, -1.152921504606847e+18]
    """
    if x.dtype != torch.int64 or not x.is_contiguous():
        raise ValueError(f"to_float64_: expected a contiguous int64 tensor (got {_describe(x)}, "
                         f"{'contiguous' if x.is_contiguous() else 'not contiguous'})")
    out = x.view(torch.float64)
    out.copy_(x)
    return out


def exact_sum(x: Tensor, dim: int | None = None, frac_bits: int = 32) -> Tensor:
    """Order-independent sum: floats are added in int64 fixed point, integers in int64.

    The result has the same bits for every order of the terms and every split of them
    (over threads, ranks or devices). The price is the fixed-point rounding of each
    term to a multiple of ``2**-frac_bits``. Intermediate int64 overflow wraps and
    cancels; only the final sum must satisfy ``|sum| < 2**(63 - frac_bits)``. Not
    differentiable (rounding).

    Args:
        x: Any shape; float, integer or bool.
        dim: Dimension to reduce, or None for all.
        frac_bits: Fractional bits, in ``[0, 62]``.

    Returns:
        ``x``'s float dtype for float input, int64 otherwise; a 0-d tensor when
        ``dim`` is None.

    Examples:
        >>> x = torch.tensor([0.1, 0.2, 0.3], dtype=torch.float64)
        >>> bool(exact_sum(x) == exact_sum(x.flip(0)))
        True
    """
    if not x.is_floating_point():
        return x.sum(dtype=torch.int64) if dim is None else x.sum(dim, dtype=torch.int64)
    fixed = to_fixed(x, frac_bits)
    total = fixed.sum() if dim is None else fixed.sum(dim)
    return from_fixed(total, frac_bits, x.dtype)


def squared_norm(x: Tensor) -> Tensor:
    """Squared Euclidean norm of each row in float64: ``x[:, 0]**2 + x[:, 1]**2 + ...``.

    Each column is converted to float64, squared and added left to right, each operation
    rounded on its own: the same bits on every device and path (one pass on the CPU, the
    torch ops elsewhere). Typical use: a mean squared displacement metric.

    Args:
        x: ``[n, k]`` float, ``k >= 1`` (e.g. displacements, length units).

    Returns:
        ``[n]`` float64 (length units squared).

    Examples:
        >>> squared_norm(torch.tensor([[3.0, 4.0], [1.0, 0.5]])).tolist()
        [25.0, 1.25]
    """
    if x.dim() != 2 or x.shape[1] < 1 or not x.is_floating_point():
        raise ValueError(f"squared_norm: expected a float [n, k] tensor with k >= 1 (got {_describe(x)})")
    fused = cpu_kernels.squared_norm(x)
    if fused is not None:
        return fused
    d = x.to(torch.float64)
    d = d * d if d is x or d.requires_grad else d.mul_(d)
    out = d[:, 0].clone()
    for j in range(1, d.shape[1]):
        out = out + d[:, j]
    return out



def gather_sum(tables: Sequence[Tensor], numbers: Sequence[Tensor | None], rows: Tensor | None = None,
               scales: Sequence[float | None] | None = None) -> Tensor:
    """Per row, the sum over several group columns of a per-group value:
    ``tables[0][numbers[0][r]] + tables[1][numbers[1][r]] + ...`` for each ``r`` in ``rows``.

    The columns are added in order, starting from 0.0, each addition rounded in float64: the bits
    of ``out = zeros; out += tables[c].index_select(0, numbers[c][rows])`` column by column, in
    one pass on the CPU (the torch ops elsewhere). Typical use: the force of infection on each
    susceptible person, the per-place forces of their household, school, workplace and venue
    added up (group numbers from :class:`agentsim.core.groups.GroupIndex`: ``of``).

    A column may be an int64 table with a scale: its term is then ``float64(table[g]) * scale``
    (the bits of ``table.to(torch.float64) * scale``), so that exact integer sums
    (:meth:`~agentsim.core.context.Context.group_sums`) are read without a float copy of each.

    Args:
        tables: ``k >= 1`` ``[G_c]`` per-group values (e.g. rate per day): float64, or int64
            where ``scales`` gives the column a scale.
        numbers: ``k`` int32 or int64 ``[n]`` group number of each row in ``tables[c]``, in
            ``[0, G_c)``; one dtype and one length. None for a table of one entry per row
            (``[n]``, read at the row itself: a per-agent value such as a ``group_sums``).
        rows: ``[m]`` int64 rows of ``numbers`` to sum for, or None for all ``n``.
        scales: ``k`` entries, None for a float64 table and a float for an int64 one; or None
            (every table float64).

    Returns:
        ``[m]`` float64 (``[n]`` without ``rows``).

    Raises:
        ValueError: Columns that do not match (naming what was expected and got).
        IndexError: A group number outside its table.

    Examples:
        >>> home, work = torch.tensor([0.5, 0.0]), torch.tensor([0.25, 1.0, 0.0])
        >>> gather_sum([home.double(), work.double()], [torch.tensor([0, 1, 1]), torch.tensor([2, 0, 1])]).tolist()
        [0.5, 0.25, 1.0]
    """
    tables, numbers = list(tables), list(numbers)
    if not tables or len(numbers) != len(tables):
        raise ValueError(f"gather_sum: expected one number column per table, at least one (got {len(tables)} "
                         f"tables, {len(numbers)} number columns)")
    scaled: list[float | None] = [None] * len(tables) if scales is None else list(scales)
    if len(scaled) != len(tables) or any(t.dim() != 1 or t.dtype != (torch.float64 if scale is None else torch.int64)
                                         for t, scale in zip(tables, scaled, strict=False)):
        raise ValueError(f"gather_sum: expected 1-D tables, float64, or int64 where scales gives a scale (got "
                         f"{[_describe(t) for t in tables]}, scales {scales})")
    given = [g for g in numbers if g is not None]
    n = (given[0].shape[0] if given[0].dim() == 1 else -1) if given else tables[0].shape[0]
    if any(g.dim() != 1 or g.shape[0] != n or g.dtype != given[0].dtype or g.dtype not in _INDEX_DTYPES
           for g in given):
        raise ValueError(f"gather_sum: expected number columns [n] of one int32 or int64 dtype (got "
                         f"{[None if g is None else _describe(g) for g in numbers]})")
    if any(g is None and t.shape[0] != n for t, g in zip(tables, numbers, strict=True)):
        raise ValueError(f"gather_sum: expected a table of {n} entries (one per row) where the number column is "
                         f"None (got {[_describe(t) for t, g in zip(tables, numbers, strict=True) if g is None]})")
    if rows is not None and (rows.dim() != 1 or rows.dtype != torch.int64):
        raise ValueError(f"gather_sum: expected rows [m] int64 or None (got {_describe(rows)})")
    if len(tables) <= cpu_kernels.MAX_COLUMNS:
        fused = cpu_kernels.gather_sum(tables, numbers, rows, scaled)
        if fused is not None:
            return fused
    out = torch.zeros(n if rows is None else rows.shape[0], dtype=torch.float64, device=tables[0].device)
    for table, number, scale in zip(tables, numbers, scaled, strict=True):
        at = rows if number is None else number if rows is None else number.index_select(0, rows)
        term = table if at is None else table.index_select(0, at)
        out += term if scale is None else term.to(torch.float64) * scale
    return out

def scatter_sum_exact(src: Tensor, index: Tensor, dim_size: int, frac_bits: int = 32) -> Tensor:
    """:func:`scatter_sum` in int64 fixed point: bits independent of the pair order.

    Each float term is rounded to a multiple of ``2**-frac_bits`` (see
    :func:`to_fixed` for the range) and the integers are added, which is
    associative, so any permutation of the pairs gives the same bits, on CPU and on
    CUDA (where integer atomics are order-free too). About 4x the cost of the plain
    float sum. Not differentiable.

    Args:
        src: Values ``[n, ...]``; float, or integer / bool (summed exactly in int64).
        index: Target of each row, int32 or int64 ``[n]``.
        dim_size: Number of targets.
        frac_bits: Fractional bits, in ``[0, 62]``.

    Returns:
        ``[dim_size, ...]`` with ``src``'s float dtype, or int64 for integer input.
    """
    _check_pairs(src, index, dim_size)
    _check_frac_bits(frac_bits)
    if not src.is_floating_point():
        return torch.zeros((dim_size, *src.shape[1:]), dtype=torch.int64, device=src.device).index_add_(
            0, index, src.long()
        )
    fixed = to_fixed(src, frac_bits)
    total = torch.zeros((dim_size, *src.shape[1:]), dtype=torch.int64, device=src.device).index_add_(0, index, fixed)
    return from_fixed(total, frac_bits, src.dtype)


_init_backend_from_env()


def tensor_version(t: Tensor) -> int:
    """The version counter of ``t``: it grows with every in-place modification (how the engine
    finds a substep that modified a field it only reads). torch has no public name for it.
    """
    return int(t._version)  # noqa: SLF001  torch's own counter; no public accessor exists
