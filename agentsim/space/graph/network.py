"""The :class:`Graph` (a symmetric CSR adjacency) and its construction from edge lists.

Construction (:meth:`Graph.from_edges`, :func:`build_csr`) packs each directed pair into
one int64 key with bit fields ``(u, v, layer)`` and sorts the keys with NumPy (whose
integer sort is several times faster than ``torch.sort`` on CPU); duplicates are then
adjacent and the first copy holds the smallest layer id. Graphs too large for that key
(``n_nodes > 2**30``) fall back to ``numpy.lexsort``. Construction runs on the CPU; the
result is moved to the device of the input.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch
from torch import Tensor

from agentsim._native import kernels as cpu_kernels
from agentsim.core.ops import expand_ranges
from agentsim.errors import ConfigError, did_you_mean
from agentsim.space.base import SortKey

__all__ = ["CHUNK", "MAX_LAYER", "Graph", "build_csr", "check_float", "check_int", "csr_by_key", "csr_by_lexsort",
           "index_tensor", "numpy_int64"]

# Random draws materialized at once by the generators: the RNG temporaries of
# a chunk (tens of MB) stay near the cache, and large fresh allocations (whose
# page faults dominate elementwise ops) are avoided.
CHUNK = 1 << 20
# Largest layer id an int8 layer tensor holds.
MAX_LAYER = 127


# --------------------------------------------------------------------- checks
def check_int(name: str, value: object, minimum: int | None = None) -> int:
    """``value`` as an int (>= ``minimum``), or a ConfigError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ConfigError(f"Expected {name} to be an int (got {type(value).__name__} {value!r})")
    value = int(value)
    if minimum is not None and value < minimum:
        raise ConfigError(f"Expected {name} >= {minimum} (got {value})")
    return value


def check_float(name: str, value: object) -> float:
    """``value`` as a finite float, or a ConfigError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ConfigError(f"Expected {name} to be a number (got {type(value).__name__} {value!r})")
    value = float(value)
    if not math.isfinite(value):
        raise ConfigError(f"Expected {name} to be finite (got {value})")
    return value


def index_tensor(name: str, x: object) -> Tensor:
    """``x`` as a 1D integer tensor of node ids, or a ConfigError naming ``name``."""
    t = x if isinstance(x, Tensor) else torch.as_tensor(np.asarray(x))
    if t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool:
        raise ConfigError(f"Expected {name} to be an integer tensor (got dtype {t.dtype})")
    if t.dim() != 1:
        raise ConfigError(f"Expected {name} of shape [n_edges] (got {list(t.shape)})")
    return t


# ---------------------------------------------------------------------- Graph
@dataclass(eq=False, repr=False)
class Graph:
    """An undirected simple graph as a symmetric CSR adjacency.

    Attributes:
        indptr: ``[n_nodes + 1]`` int64 row offsets; row ``u`` is
            ``indices[indptr[u]:indptr[u + 1]]``.
        indices: ``[n_directed_edges]`` neighbor ids, ascending within a row;
            int32 when ``n_nodes < 2**31``, else int64.
        n_nodes: Number of nodes.
        layer: Optional ``[n_directed_edges]`` int8 layer id of each entry.
        layer_names: Names of the layer ids (``layer_names[i]`` names id ``i``).

    The constructor checks shapes and dtypes only; build graphs with
    :meth:`from_edges` or a generator to get the CSR invariants (symmetric,
    sorted rows, no self-loops, no duplicates).
    """

    indptr: Tensor
    indices: Tensor
    n_nodes: int
    layer: Tensor | None = None
    layer_names: tuple[str, ...] = ()

    # The Space protocol (agentsim.space.base): the agents are the nodes (an agent's uid is
    # its node id; nodes never move); regions are blocks of node ids; neighbors are the
    # nodes across edges.
    position_field: ClassVar[str] = "uid"
    periodic: ClassVar[bool] = False
    discrete: ClassVar[bool] = True
    reaches: ClassVar[tuple[str, ...]] = ("graph",)
    layer_shape: ClassVar[tuple[int, ...] | None] = None

    def __post_init__(self) -> None:
        self.n_nodes = check_int("n_nodes", self.n_nodes, 1)
        if self.indptr.dtype != torch.int64 or tuple(self.indptr.shape) != (self.n_nodes + 1,):
            raise ConfigError(
                f"Expected indptr of shape [{self.n_nodes + 1}] and dtype int64 "
                f"(got {list(self.indptr.shape)} {self.indptr.dtype})"
            )
        if self.indices.dtype not in (torch.int32, torch.int64) or self.indices.dim() != 1:
            raise ConfigError(
                f"Expected indices of shape [n_directed_edges] and dtype int32 or int64 "
                f"(got {list(self.indices.shape)} {self.indices.dtype})"
            )
        if int(self.indptr[-1]) != self.indices.numel() or int(self.indptr[0]) != 0:
            raise ConfigError(
                f"Expected indptr to run from 0 to len(indices) = {self.indices.numel()} "
                f"(got {int(self.indptr[0])} to {int(self.indptr[-1])})"
            )
        if self.layer is not None and (self.layer.dtype != torch.int8 or self.layer.shape != self.indices.shape):
            raise ConfigError(
                f"Expected layer of shape {list(self.indices.shape)} and dtype int8 "
                f"(got {list(self.layer.shape)} {self.layer.dtype})"
            )
        names = tuple(self.layer_names)
        if not all(isinstance(s, str) for s in names):
            raise ConfigError(f"Expected layer_names to be strings (got {names!r})")
        self.layer_names = names

    def __repr__(self) -> str:
        layers = f", layer_names={self.layer_names}" if self.layer_names else ""
        return f"Graph(n_nodes={self.n_nodes}, n_edges={self.n_edges}{layers})"

    @property
    def n_edges(self) -> int:
        """Number of undirected edges (half the CSR entries)."""
        return self.indices.numel() // 2

    @property
    def region_extent(self) -> tuple[float, float]:
        """``(n_nodes, 1)``: a node's region coordinates are ``(id, 0)``."""
        return float(self.n_nodes), 1.0

    def region_coords(self, position: Tensor, axis: int | None = None) -> Tensor:
        """``(id, 0)`` of node ids ``[n]`` as float64, ``[n, 2]`` (or ``[n]`` for one ``axis``)."""
        ids = position.to(torch.float64)
        if axis is not None:
            return ids if axis == 0 else torch.zeros_like(ids)
        return torch.stack([ids, torch.zeros_like(ids)], -1)

    def sort_key(self, reaches: Sequence[tuple[str, float]]) -> SortKey | None:
        """None: rows of node agents are best kept in node order, as they are built."""
        return None

    @property
    def device(self) -> torch.device:
        """Where the CSR tensors live."""
        return self.indptr.device

    def degree(self) -> Tensor:
        """Number of neighbors of each node: int64 ``[n_nodes]``."""
        return self.indptr[1:] - self.indptr[:-1]

    def edges(self) -> tuple[Tensor, Tensor]:
        """Directed pairs in CSR order, both directions of every edge.

        Returns:
            ``(src, dst)``, two int64 tensors ``[n_directed_edges]``; ``src`` is
            non-decreasing and ``dst`` ascending within each ``src``.
        """
        src = torch.repeat_interleave(torch.arange(self.n_nodes, device=self.device), self.degree())
        return src, self.indices.to(torch.int64)

    def count_neighbors_in(self, nodes: Tensor, at: Tensor | None = None) -> Tensor:
        """For every node (or every node of ``at``), how many of its neighbors are in ``nodes``.

        Pushes from the given nodes along their edges, so the cost is proportional to
        their total degree, not to the size of the graph (an SIR step touches only the
        edges of infectious people). Integer counts, so the result is exact and
        independent of the order of ``nodes``.

        Args:
            nodes: ``[m]`` node ids (any integer dtype); a repeated id counts again.
            at: Optional ``[k]`` node ids whose counts are wanted (an agent type's ``uid``
                column): ``counts[at]``, without a copy where ``at`` is ``0 .. n_nodes - 1``.

        Returns:
            ``[n_nodes]`` (or ``[k]``) int32 counts.

        Examples:
            >>> g = Graph.from_edges(torch.tensor([0, 1, 2]), torch.tensor([1, 2, 3]), 4)
            >>> g.count_neighbors_in(torch.tensor([1, 3])).tolist()
            [1, 0, 2, 0]
            >>> g.count_neighbors_in(torch.tensor([1, 3]), at=torch.tensor([2, 0])).tolist()
            [2, 1]
        """
        counts = self._push_counts(nodes.to(torch.int64))
        if at is None or (at.numel() == self.n_nodes and cpu_kernels.is_iota(at)):
            return counts
        return counts.index_select(0, at)

    def _push_counts(self, nodes: Tensor) -> Tensor:
        pushed = cpu_kernels.push_count(self.indptr, self.indices, self.n_nodes, nodes)  # one pass, same counts
        if pushed is not None:
            return pushed
        start = self.indptr.index_select(0, nodes)
        count = self.indptr.index_select(0, nodes + 1) - start
        total = int(count.sum()) if count.numel() else 0
        if total == 0:
            return torch.zeros(self.n_nodes, dtype=torch.int32, device=self.indptr.device)
        pos, _ = expand_ranges(start, count)
        return torch.bincount(self.indices.index_select(0, pos), minlength=self.n_nodes).to(torch.int32)

    def neighbor_sum(self, values: Tensor) -> Tensor:
        """Sum of a node quantity over each node's neighbors.

        ``out[u] = sum over v in N(u) of values[v]``, added in CSR order (ascending
        ``v``), so the result is deterministic on CPU and CUDA.

        Args:
            values: ``[n_nodes, ...]`` per-node values, any numeric or bool dtype.

        Returns:
            ``[n_nodes, ...]``. Floating values keep their dtype (and gradients:
            the float path is ``torch.segment_reduce``); integer and bool values
            are summed exactly in int64 (by a prefix sum, whose int64 wraparound
            cancels exactly).
        """
        if values.dim() < 1 or values.shape[0] != self.n_nodes:
            raise ConfigError(
                f"Expected values of shape [{self.n_nodes}, ...] (got {list(values.shape)})"
            )
        if values.dtype.is_complex:
            raise ConfigError(f"Expected real or integer values (got dtype {values.dtype})")
        gathered = values[self.indices]
        if values.dtype.is_floating_point:
            return torch.segment_reduce(gathered, "sum", offsets=self.indptr, axis=0)
        gathered = gathered.to(torch.int64)
        csum = torch.zeros((gathered.shape[0] + 1, *gathered.shape[1:]), dtype=torch.int64, device=values.device)
        torch.cumsum(gathered, 0, out=csum[1:])
        return csum[self.indptr[1:]] - csum[self.indptr[:-1]]

    def select_layers(self, names: str | Sequence[str]) -> Graph:
        """The subgraph of the edges in the named layers (same nodes).

        Args:
            names: One layer name or several.

        Returns:
            A :class:`Graph` with the same ``n_nodes``, ``layer_names`` and layer
            ids, holding only the chosen layers' entries (still in CSR order).
        """
        if self.layer is None:
            raise ConfigError("Expected a layered graph (this graph has no layer ids)")
        wanted = [names] if isinstance(names, str) else list(names)
        ids = []
        for name in wanted:
            if name not in self.layer_names:
                raise ConfigError(
                    f"Expected a layer in {self.layer_names} (got {name!r}).{did_you_mean(name, self.layer_names)}"
                )
            ids.append(self.layer_names.index(name))
        keep = self.layer == ids[0]
        for i in ids[1:]:
            keep |= self.layer == i
        csum = torch.zeros(keep.numel() + 1, dtype=torch.int64, device=self.device)
        torch.cumsum(keep, 0, out=csum[1:])
        return Graph(csum[self.indptr], self.indices[keep], self.n_nodes, self.layer[keep], self.layer_names)

    def to(self, device: torch.device | str) -> Graph:
        """A copy of this graph on ``device``."""
        layer = None if self.layer is None else self.layer.to(device)
        return Graph(self.indptr.to(device), self.indices.to(device), self.n_nodes, layer, self.layer_names)

    @staticmethod
    def from_edges(
        src: Tensor,
        dst: Tensor,
        n_nodes: int,
        layer: Tensor | None = None,
        layer_names: Sequence[str] = (),
    ) -> Graph:
        """Build a graph from an edge list (either or both directions).

        Edges are symmetrized, self-loops dropped, duplicates merged (a duplicate
        keeps the smallest layer id) and rows sorted.

        Args:
            src: ``[m]`` integer ids in ``[0, n_nodes)``.
            dst: ``[m]`` integer ids in ``[0, n_nodes)``.
            n_nodes: Number of nodes, >= 1.
            layer: Optional ``[m]`` integer layer id of each edge, in
                ``[0, 127]`` and below ``len(layer_names)`` when names are given.
            layer_names: Names of the layer ids.

        Returns:
            The :class:`Graph`, on the device of ``src``.
        """
        n_nodes = check_int("n_nodes", n_nodes, 1)
        src = index_tensor("src", src)
        dst = index_tensor("dst", dst)
        if src.shape != dst.shape:
            raise ConfigError(f"Expected src and dst of the same shape (got {list(src.shape)} and {list(dst.shape)})")
        names = tuple(layer_names)
        if src.numel():
            lo = int(torch.minimum(src.min(), dst.min()))
            hi = int(torch.maximum(src.max(), dst.max()))
            if lo < 0 or hi >= n_nodes:
                bad = lo if lo < 0 else hi
                raise ConfigError(f"Expected node ids in [0, n_nodes = {n_nodes}) (got {bad})")
        if layer is not None:
            layer = index_tensor("layer", layer)
            if layer.shape != src.shape:
                raise ConfigError(f"Expected layer of shape {list(src.shape)} (got {list(layer.shape)})")
            top = MAX_LAYER if not names else len(names) - 1
            if layer.numel() and (int(layer.min()) < 0 or int(layer.max()) > top):
                bad = int(layer.min()) if int(layer.min()) < 0 else int(layer.max())
                raise ConfigError(f"Expected layer ids in [0, {top}] (got {bad})")
        elif names:
            raise ConfigError(f"Expected a layer tensor with layer_names {names} (got layer=None)")
        pairs = torch.stack([src.detach().to("cpu", torch.int64), dst.detach().to("cpu", torch.int64)])
        return build_csr(pairs, n_nodes, layer, names, device=src.device)


# ------------------------------------------------------------ CSR construction
def numpy_int64(t: Tensor) -> np.ndarray:
    """A CPU int64 NumPy view (or copy) of ``t``."""
    return t.detach().to("cpu", torch.int64).numpy()


def build_csr(
    pairs: Tensor,
    n_nodes: int,
    layer: Tensor | None,
    names: tuple[str, ...],
    device: torch.device | None = None,
) -> Graph:
    """CSR from validated edges (no checks), on the CPU.

    Args:
        pairs: ``[2, m]`` contiguous int64 CPU tensor of ``(src, dst)``. It is
            overwritten (it becomes the sort buffer), so callers pass a buffer
            they own; that saves allocating (and page-faulting in) a second one.
        n_nodes: Number of nodes.
        layer: Optional ``[m]`` layer ids in ``[0, 127]``.
        names: Layer names.
        device: Where to put the result (default CPU).
    """
    pairs_np = pairs.numpy()
    u, v = pairs_np[0], pairs_np[1]
    lay = None if layer is None else layer.detach().to("cpu", torch.int8).numpy()
    n_layers = 1 if lay is None or lay.size == 0 else int(lay.max()) + 1
    layer_bits = (n_layers - 1).bit_length()
    node_bits = max(1, (n_nodes - 1).bit_length())
    if 2 * node_bits + layer_bits <= 62:
        indptr, indices, out_layer = csr_by_key(pairs_np, lay, node_bits, layer_bits, n_nodes)
    else:
        keep = u != v
        if not keep.all():
            u, v = u[keep], v[keep]
            lay = None if lay is None else lay[keep]
        del keep
        indptr, indices, out_layer = csr_by_lexsort(u, v, lay, n_nodes)
    idx_dtype = np.int32 if n_nodes < 2**31 else np.int64
    device = torch.device("cpu") if device is None else device
    layers = None if out_layer is None else torch.from_numpy(out_layer.astype(np.int8, copy=False)).to(device)
    return Graph(
        torch.from_numpy(indptr).to(device),
        torch.from_numpy(indices.astype(idx_dtype, copy=False)).to(device),
        n_nodes,
        layers,
        names,
    )


def csr_by_key(
    pairs: np.ndarray, lay: np.ndarray | None, node_bits: int, layer_bits: int, n: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Sort one packed int64 key per directed pair: ``row | col | layer`` bit fields.

    ``pairs`` (``[2, m]`` contiguous int64 ``(src, dst)``) is overwritten in
    place by the ``2m`` keys of both directions, then sorted.

    Bit fields instead of ``(row * n + col) * n_layers + layer`` because NumPy's
    int64 division is slow (tens of ns per element); shifts and masks are not.
    Self-loops get the key -1, sort first and are sliced off. Apart from the
    in-place sort, the work runs in chunks with cache-sized temporaries: on
    large graphs the page faults of fresh full-size arrays cost more than the
    arithmetic.
    """
    row_shift = node_bits + layer_bits
    node_mask = (1 << node_bits) - 1
    layer_mask = (1 << layer_bits) - 1
    m = pairs.shape[1]
    for lo in range(0, m, CHUNK):
        hi = min(lo + CHUNK, m)
        uc, vc = pairs[0, lo:hi], pairs[1, lo:hi]
        fwd = uc << row_shift
        fwd |= vc << layer_bits
        bwd = vc << row_shift
        bwd |= uc << layer_bits
        if lay is not None and layer_bits:
            fwd |= lay[lo:hi]
            bwd |= lay[lo:hi]
        loops = uc == vc
        if loops.any():
            fwd[loops] = -1
            bwd[loops] = -1
        uc[:] = fwd
        vc[:] = bwd
    key = pairs.reshape(-1)  # a view: pairs is contiguous
    key.sort()  # in place; NumPy's SIMD sort
    key = key[np.searchsorted(key, 0) :]
    # One pass over the sorted keys: drop duplicates (adjacent keys equal above
    # the layer bits; the first holds the smallest layer id), split the fields,
    # count entries per row. Outputs are sized for no duplicates and sliced:
    # their untouched tails are never faulted in.
    cols = np.empty(key.size, dtype=np.int32 if n < 2**31 else np.int64)
    out_layer = None if lay is None else np.empty(key.size, dtype=np.int8)
    counts = np.zeros(n, dtype=np.int64)
    written = 0
    prev = -1  # below every key, and -1 >> k == -1 differs from every pair
    for lo in range(0, key.size, CHUNK):
        chunk = key[lo : lo + CHUNK]
        pair = chunk >> layer_bits
        keep = np.empty(chunk.size, dtype=bool)
        keep[0] = pair[0] != prev >> layer_bits
        np.not_equal(pair[1:], pair[:-1], out=keep[1:])
        prev = int(chunk[-1])
        if not keep.all():
            pair = pair[keep]
            chunk = chunk[keep]
        k = pair.size
        if out_layer is not None:
            out_layer[written : written + k] = chunk & layer_mask
        rows = pair >> node_bits
        pair &= node_mask
        cols[written : written + k] = pair
        first = int(rows[0])
        counts[first : int(rows[-1]) + 1] += np.bincount(rows - first)
        written += k
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(counts, out=indptr[1:])
    return indptr, cols[:written], None if out_layer is None else out_layer[:written]


def _indptr_from_rows(rows: np.ndarray, n_nodes: int) -> np.ndarray:
    indptr = np.zeros(n_nodes + 1, dtype=np.int64)
    np.cumsum(np.bincount(rows, minlength=n_nodes), out=indptr[1:])
    return indptr


def csr_by_lexsort(
    u: np.ndarray, v: np.ndarray, lay: np.ndarray | None, n: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Fallback when the packed key needs more than 62 bits (``n > 2**30``): lexicographic argsort."""
    rows = np.concatenate([u, v])
    cols = np.concatenate([v, u])
    lays = None if lay is None else np.concatenate([lay, lay])
    order = np.lexsort((cols, rows) if lays is None else (lays, cols, rows))
    rows, cols = rows[order], cols[order]
    keep = np.ones(rows.size, dtype=bool)
    keep[1:] = (rows[1:] != rows[:-1]) | (cols[1:] != cols[:-1])
    out_layer = None if lays is None else lays[order][keep]
    return _indptr_from_rows(rows[keep], n), cols[keep], out_layer

