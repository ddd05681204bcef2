"""Static undirected contact networks in CSR form, and generators for them.

A :class:`Graph` stores an undirected simple graph as a symmetric adjacency in
compressed sparse row (CSR) form: the neighbors of node ``u`` are
``indices[indptr[u]:indptr[u + 1]]``, sorted ascending. Every undirected edge
``{u, v}`` appears twice, as ``v`` in the row of ``u`` and ``u`` in the row of
``v``; there are no self-loops and no duplicate edges. An optional ``layer``
tensor, aligned with ``indices``, gives each directed entry a small integer
layer id (household, workplace, ...), the same in both directions.

Generators (all vectorized; no Python loop over nodes, households or
workplaces) draw every random number from :class:`agentsim.random.CounterRNG`
at ``step = 0`` with ids ``arange(...)`` of the edges or nodes being drawn, so a
graph is a pure function of its arguments and seed:

* :func:`erdos_renyi`: ``m = round(n * mean_degree / 2)`` uniform endpoint pairs;
* :func:`watts_strogatz`: a ring lattice whose edges are rewired with
  probability ``p``;
* :func:`layered_contacts`: households (cliques), workplaces (random graphs
  inside random groups) and a community layer (Erdős–Rényi);
* :func:`from_edge_list_csv`: read a two-column edge list.

Construction (:meth:`Graph.from_edges`) packs each directed pair into one int64
key with bit fields ``(u, v, layer)`` and sorts the keys with NumPy (whose
integer sort is several times faster than ``torch.sort`` on CPU); duplicates are
then adjacent and the first copy holds the smallest layer id. Graphs too large
for that key (``n_nodes > 2**30``) fall back to ``numpy.lexsort``. Construction runs on the CPU; the
result is moved to the device of the input.

Examples:
    >>> import torch
    >>> g = Graph.from_edges(torch.tensor([0, 1, 1, 2]), torch.tensor([1, 0, 2, 2]), n_nodes=4)
    >>> g.indptr.tolist(), g.indices.tolist()
    ([0, 1, 3, 4, 4], [1, 0, 2, 1])
    >>> g.n_edges, g.degree().tolist()
    (2, [1, 2, 1, 0])
    >>> g.neighbor_sum(torch.tensor([1.0, 10.0, 100.0, 1000.0])).tolist()
    [10.0, 101.0, 10.0, 0.0]
    >>> ring = watts_strogatz(6, k=2, p=0.0, seed=0)
    >>> ring.indices.tolist()
    [1, 5, 0, 2, 1, 3, 2, 4, 3, 5, 0, 4]
    >>> er = erdos_renyi(1000, mean_degree=4.0, seed=1)
    >>> 3.9 < er.degree().double().mean().item() <= 4.0
    True
"""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from agentsim.errors import ConfigError, OutputError, did_you_mean
from agentsim.random import CounterRNG

__all__ = [
    "Graph",
    "erdos_renyi",
    "from_edge_list_csv",
    "layered_contacts",
    "watts_strogatz",
]

LAYERED_NAMES: tuple[str, ...] = ("household", "workplace", "community")

# Random draws materialized at once by the generators: the RNG temporaries of
# a chunk (tens of MB) stay near the cache, and large fresh allocations (whose
# page faults dominate elementwise ops) are avoided.
_CHUNK = 1 << 20
# Largest layer id an int8 layer tensor holds.
_MAX_LAYER = 127
_INT64_MAX = (1 << 63) - 1


# --------------------------------------------------------------------- checks
def _check_int(name: str, value: object, minimum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ConfigError(f"Expected {name} to be an int (got {type(value).__name__} {value!r})")
    value = int(value)
    if minimum is not None and value < minimum:
        raise ConfigError(f"Expected {name} >= {minimum} (got {value})")
    return value


def _check_float(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ConfigError(f"Expected {name} to be a number (got {type(value).__name__} {value!r})")
    value = float(value)
    if not math.isfinite(value):
        raise ConfigError(f"Expected {name} to be finite (got {value})")
    return value


def _index_tensor(name: str, x: object) -> Tensor:
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

    def __post_init__(self) -> None:
        self.n_nodes = _check_int("n_nodes", self.n_nodes, 1)
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
    def device(self) -> torch.device:
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

    def count_neighbors_in(self, nodes: Tensor) -> Tensor:
        """For every node, how many of its neighbors are in ``nodes``.

        Pushes from the given nodes along their edges, so the cost is proportional to
        their total degree, not to the size of the graph (an SIR step touches only the
        edges of infectious people). Integer counts, so the result is exact and
        independent of the order of ``nodes``.

        Args:
            nodes: ``[m]`` distinct node ids (any integer dtype).

        Returns:
            ``[n_nodes]`` int64 counts.

        Examples:
            >>> g = Graph.from_edges(torch.tensor([0, 1, 2]), torch.tensor([1, 2, 3]), 4)
            >>> g.count_neighbors_in(torch.tensor([1, 3])).tolist()
            [1, 0, 2, 0]
        """
        nodes = nodes.to(torch.int64)
        start = self.indptr.index_select(0, nodes)
        count = self.indptr.index_select(0, nodes + 1) - start
        total = int(count.sum()) if count.numel() else 0
        if total == 0:
            return torch.zeros(self.n_nodes, dtype=torch.int64, device=self.indptr.device)
        first = torch.cumsum(count, 0) - count  # where each node's run starts in the output
        pos = torch.arange(total, device=start.device) + torch.repeat_interleave(start - first, count)
        return torch.bincount(self.indices.index_select(0, pos), minlength=self.n_nodes)

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
        n_nodes = _check_int("n_nodes", n_nodes, 1)
        src = _index_tensor("src", src)
        dst = _index_tensor("dst", dst)
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
            layer = _index_tensor("layer", layer)
            if layer.shape != src.shape:
                raise ConfigError(f"Expected layer of shape {list(src.shape)} (got {list(layer.shape)})")
            top = _MAX_LAYER if not names else len(names) - 1
            if layer.numel() and (int(layer.min()) < 0 or int(layer.max()) > top):
                bad = int(layer.min()) if int(layer.min()) < 0 else int(layer.max())
                raise ConfigError(f"Expected layer ids in [0, {top}] (got {bad})")
        elif names:
            raise ConfigError(f"Expected a layer tensor with layer_names {names} (got layer=None)")
        pairs = torch.stack([src.detach().to("cpu", torch.int64), dst.detach().to("cpu", torch.int64)])
        return _build(pairs, n_nodes, layer, names, device=src.device)


# ------------------------------------------------------------ CSR construction
def _numpy_int64(t: Tensor) -> np.ndarray:
    return t.detach().to("cpu", torch.int64).numpy()


def _build(
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
        indptr, indices, out_layer = _csr_by_key(pairs_np, lay, node_bits, layer_bits, n_nodes)
    else:
        keep = u != v
        if not keep.all():
            u, v = u[keep], v[keep]
            lay = None if lay is None else lay[keep]
        del keep
        indptr, indices, out_layer = _csr_by_lexsort(u, v, lay, n_nodes)
    idx_dtype = np.int32 if n_nodes < 2**31 else np.int64
    device = torch.device("cpu") if device is None else device
    return Graph(
        torch.from_numpy(indptr).to(device),
        torch.from_numpy(indices.astype(idx_dtype, copy=False)).to(device),
        n_nodes,
        None if layer is None else torch.from_numpy(out_layer.astype(np.int8, copy=False)).to(device),
        names,
    )


def _csr_by_key(
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
    for lo in range(0, m, _CHUNK):
        hi = min(lo + _CHUNK, m)
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
    for lo in range(0, key.size, _CHUNK):
        chunk = key[lo : lo + _CHUNK]
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


def _csr_by_lexsort(
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


# ----------------------------------------------------------------- generators
def _uniform_chunked(rng: CounterRNG, n: int, stream: str, draws: int) -> Tensor:
    """``rng.uniform(arange(n), 0, stream, draws=draws)`` computed in chunks: ``[n, draws]`` float64."""
    out = torch.empty((n, draws), dtype=torch.float64)
    for start in range(0, n, _CHUNK):
        stop = min(start + _CHUNK, n)
        out[start:stop] = rng.uniform(torch.arange(start, stop), 0, stream, draws=draws)
    return out


def _scaled_int(u: Tensor, high: int | Tensor) -> Tensor:
    """``floor(u * high)`` as int64, kept below ``high`` (as CounterRNG.integers does)."""
    if isinstance(high, Tensor):
        return torch.minimum(torch.floor(u * high.to(torch.float64)).to(torch.int64), (high - 1).clamp(min=0))
    return torch.floor(u * high).to(torch.int64).clamp_(max=max(high - 1, 0))


def _random_pairs(rng: CounterRNG, m: int, n: int, stream: str, out: Tensor | None = None) -> Tensor:
    """``m`` pairs of independent uniform node ids in ``[0, n)`` as ``[2, m]`` int64 ``(src, dst)``.

    Pair ``e`` uses draws 0 and 1 of id ``e``. Written into ``out`` if given.
    """
    pairs = torch.empty((2, m), dtype=torch.int64) if out is None else out
    src, dst = pairs[0], pairs[1]
    for start in range(0, m, _CHUNK):
        stop = min(start + _CHUNK, m)
        u = rng.uniform(torch.arange(start, stop), 0, stream, draws=2)
        src[start:stop] = _scaled_int(u[:, 0], n)
        dst[start:stop] = _scaled_int(u[:, 1], n)
    return pairs


def erdos_renyi(n_nodes: int, mean_degree: float, seed: int) -> Graph:
    """A uniform random graph with about ``n_nodes * mean_degree / 2`` edges.

    Draws ``m = round(n_nodes * mean_degree / 2)`` endpoint pairs, each endpoint
    uniform on the nodes (stream ``"erdos_renyi"``, id = pair index), then drops
    self-loops and duplicate pairs. That loses about ``m / n + (m / n)**2``
    edges in expectation (about 30 of 50 million at ``n = 10**7``, degree 10),
    so the mean degree falls short of ``mean_degree`` by about
    ``(1 + mean_degree / 2) / n_nodes``; degrees are close to Poisson.

    Args:
        n_nodes: Number of nodes, >= 1.
        mean_degree: Target mean degree, ``0 <= mean_degree < n_nodes``.
        seed: Seed of the counter-based generator.

    Returns:
        The :class:`Graph` (CPU).
    """
    n_nodes = _check_int("n_nodes", n_nodes, 1)
    mean_degree = _check_float("mean_degree", mean_degree)
    if not 0.0 <= mean_degree < n_nodes:
        raise ConfigError(f"Expected 0 <= mean_degree < n_nodes = {n_nodes} (got {mean_degree})")
    rng = CounterRNG(_check_int("seed", seed))
    m = round(n_nodes * mean_degree / 2)
    return _build(_random_pairs(rng, m, n_nodes, "erdos_renyi"), n_nodes, None, ())


def watts_strogatz(n_nodes: int, k: int, p: float, seed: int) -> Graph:
    """A Watts–Strogatz small-world graph.

    Starts from the ring lattice in which node ``i`` is joined to
    ``i + 1, ..., i + k/2`` (mod ``n_nodes``), i.e. to its ``k`` nearest
    neighbors. Each lattice edge ``(i, i + j)`` (id ``e = i * k/2 + j - 1``) is,
    with probability ``p`` (stream ``"watts_strogatz/rewire"``), replaced by
    ``(i, t)`` with ``t`` uniform among the nodes other than ``i`` (stream
    ``"watts_strogatz/target"``). A rewired edge that duplicates another is
    dropped, so the mean degree is ``k`` at ``p = 0`` and slightly below
    (by about ``p * k**2 / n_nodes``) otherwise.

    Args:
        n_nodes: Number of nodes, >= 1.
        k: Even number of lattice neighbors, ``0 <= k < n_nodes``.
        p: Rewiring probability, ``0 <= p <= 1``.
        seed: Seed of the counter-based generator.

    Returns:
        The :class:`Graph` (CPU).
    """
    n_nodes = _check_int("n_nodes", n_nodes, 1)
    k = _check_int("k", k, 0)
    if k % 2 or k >= n_nodes:
        raise ConfigError(f"Expected k even and < n_nodes = {n_nodes} (got {k})")
    p = _check_float("p", p)
    if not 0.0 <= p <= 1.0:
        raise ConfigError(f"Expected 0 <= p <= 1 (got {p})")
    rng = CounterRNG(_check_int("seed", seed))
    half = k // 2
    m = n_nodes * half
    if m == 0:
        return _build(torch.zeros((2, 0), dtype=torch.int64), n_nodes, None, ())
    eid = torch.arange(m)
    src = torch.div(eid, half, rounding_mode="floor")
    dst = torch.remainder(src + eid % half + 1, n_nodes)
    if p > 0.0:
        rewire = _uniform_chunked(rng, m, "watts_strogatz/rewire", 1)[:, 0] < p
        # uniform on the n - 1 other nodes: draw in [0, n - 1) and skip src.
        target = _scaled_int(_uniform_chunked(rng, m, "watts_strogatz/target", 1)[:, 0], n_nodes - 1)
        target += (target >= src).to(torch.int64)
        dst = torch.where(rewire, target, dst)
    return _build(torch.stack([src, dst]), n_nodes, None, ())


def _poisson_icdf(u: Tensor, lam: float) -> Tensor:
    """Poisson(``lam``) variates from uniforms ``u`` by inverse-CDF table lookup (int64)."""
    if lam <= 0.0:
        return torch.zeros_like(u, dtype=torch.int64)
    kmax = int(lam + 12.0 * math.sqrt(lam) + 30.0)
    k = torch.arange(kmax + 1, dtype=torch.float64)
    cdf = torch.cumsum(torch.exp(-lam + k * math.log(lam) - torch.lgamma(k + 1.0)), 0)
    return torch.searchsorted(cdf, u, right=True).clamp_(max=kmax)


def _block_pairs(sizes: Tensor, blocks: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """All pairs ``a < b`` of positions inside consecutive blocks.

    Args:
        sizes: ``[n_blocks]`` int64 block sizes over positions ``0 .. sizes.sum() - 1``.
        blocks: Optional ``[n_blocks]`` bool; only these blocks get their pairs.

    Returns:
        ``(a, b)`` int64 ``[n_pairs]``, sorted by ``(a, b)``.
    """
    total = int(sizes.sum())
    pos = torch.arange(total)
    end = torch.repeat_interleave(torch.cumsum(sizes, 0), sizes)
    n_up = end - 1 - pos  # partners above each position
    if blocks is not None:
        n_up = torch.where(torch.repeat_interleave(blocks, sizes), n_up, 0)
    a = torch.repeat_interleave(pos, n_up)
    first = torch.cumsum(n_up, 0) - n_up
    b = a + 1 + torch.arange(a.numel()) - torch.repeat_interleave(first, n_up)
    return a, b


def _household_sizes(rng: CounterRNG, n_nodes: int, mean_size: float) -> Tensor:
    """Sizes ``1 + Poisson(mean_size - 1)`` of households ``0, 1, ...`` until they cover ``n_nodes``.

    Household ``h`` uses id ``h`` of stream ``"layered/household"``; the last
    household is cut to fit.
    """
    parts: list[Tensor] = []
    drawn = covered = 0
    while covered < n_nodes:
        chunk = int((n_nodes - covered) / mean_size * 1.05) + 64
        u = rng.uniform(torch.arange(drawn, drawn + chunk), 0, "layered/household")
        part = 1 + _poisson_icdf(u, mean_size - 1.0)
        parts.append(part)
        drawn += chunk
        covered += int(part.sum())
    sizes = torch.cat(parts)
    ends = torch.cumsum(sizes, 0)
    n_households = int(torch.searchsorted(ends, n_nodes)) + 1  # first block reaching n_nodes
    sizes = sizes[:n_households].clone()
    sizes[-1] -= int(ends[n_households - 1]) - n_nodes
    return sizes


def _workplace_edges(rng: CounterRNG, n_nodes: int, workplace_size: float, degree: float) -> tuple[Tensor, Tensor]:
    """Random groups of mean size ``workplace_size``, random edges inside each group."""
    n_work = max(1, round(n_nodes / workplace_size))
    node = torch.arange(n_nodes)
    wp = _scaled_int(_uniform_chunked(rng, n_nodes, "layered/workplace", 1)[:, 0], n_work)
    # Members grouped by workplace, ascending node id within one: sort packed (wp, node) keys.
    node_bits = max(1, (n_nodes - 1).bit_length())
    members = torch.from_numpy(np.sort(_numpy_int64((wp << node_bits) | node))) & ((1 << node_bits) - 1)
    size = torch.bincount(wp, minlength=n_work)
    start = torch.cumsum(size, 0) - size
    # A workplace of size s has P = s(s-1)/2 pairs and wants T = s*degree/2
    # distinct edges. k uniform draws (with replacement) over P pairs give
    # P (1 - (1 - 1/P)^k) distinct ones in expectation; solve for k. Where
    # T >= P the workplace is a clique.
    s = size.to(torch.float64)
    n_pairs = s * (s - 1) / 2
    target = s * degree / 2
    clique = target >= n_pairs
    safe = torch.where(clique, torch.full_like(n_pairs, 2.0), n_pairs)
    draws = torch.log1p(-target / safe) / torch.log1p(-1.0 / safe)
    draws = torch.where(clique, 0.0, torch.round(draws)).to(torch.int64)
    # One uniform per draw (id = draw index) picks an ordered pair of distinct
    # members among s(s-1): a = q // (s-1), b = q % (s-1) skipping a (bias
    # below s^2 / 2**53). Chunked so the temporaries stay cache-sized.
    ends = torch.cumsum(draws, 0)
    n_draws = int(ends[-1])
    src = torch.empty(n_draws, dtype=torch.int64)
    dst = torch.empty(n_draws, dtype=torch.int64)
    for lo in range(0, n_draws, _CHUNK):
        hi = min(lo + _CHUNK, n_draws)
        ids = torch.arange(lo, hi)
        w = torch.searchsorted(ends, ids, right=True)
        others = size[w] - 1
        q = _scaled_int(rng.uniform(ids, 0, "layered/workplace_edge"), (others + 1) * others)
        a = torch.div(q, others, rounding_mode="floor")
        b = q - a * others
        b += (b >= a).to(torch.int64)
        base = start[w]
        src[lo:hi] = members[base + a]
        dst[lo:hi] = members[base + b]
    ca, cb = _block_pairs(size, clique)
    return torch.cat([src, members[ca]]), torch.cat([dst, members[cb]])


def layered_contacts(
    n_nodes: int,
    seed: int,
    household_size: float = 2.5,
    workplace_size: float = 20.0,
    workplace_degree: float = 8.0,
    community_degree: float = 4.0,
) -> Graph:
    """A three-layer contact network: households, workplaces, community.

    * ``"household"`` (layer 0): nodes are cut into consecutive blocks of sizes
      ``1 + Poisson(household_size - 1)`` (the last one cut to fit), each a
      clique. Mean degree ``E[s^2] / E[s] - 1`` (2.1 for the default).
    * ``"workplace"`` (layer 1): every node joins one of
      ``round(n_nodes / workplace_size)`` workplaces uniformly at random
      (sizes about Poisson(``workplace_size``)). Inside a workplace of size
      ``s``, uniform random member pairs are drawn, as many as make the expected
      number of distinct edges ``s * workplace_degree / 2``; a workplace with
      ``s - 1 <= workplace_degree`` is a clique. Mean degree about
      ``workplace_degree``.
    * ``"community"`` (layer 2): ``round(n_nodes * community_degree / 2)``
      uniform random pairs, as in :func:`erdos_renyi`.

    An edge present in several layers is kept once, with the smallest layer
    id, so layer means in the returned graph are slightly below the ones above
    for workplace and community.

    Args:
        n_nodes: Number of nodes, >= 1.
        seed: Seed of the counter-based generator.
        household_size: Mean household size, >= 1.
        workplace_size: Mean workplace size, >= 1.
        workplace_degree: Target mean degree inside workplaces, >= 0.
        community_degree: Target mean community degree, ``0 <= . < n_nodes``.

    Returns:
        A :class:`Graph` (CPU) with ``layer`` ids and
        ``layer_names = ("household", "workplace", "community")``.
    """
    n_nodes = _check_int("n_nodes", n_nodes, 1)
    rng = CounterRNG(_check_int("seed", seed))
    household_size = _check_float("household_size", household_size)
    workplace_size = _check_float("workplace_size", workplace_size)
    workplace_degree = _check_float("workplace_degree", workplace_degree)
    community_degree = _check_float("community_degree", community_degree)
    if household_size < 1.0:
        raise ConfigError(f"Expected household_size >= 1 (got {household_size})")
    if workplace_size < 1.0:
        raise ConfigError(f"Expected workplace_size >= 1 (got {workplace_size})")
    if workplace_degree < 0.0:
        raise ConfigError(f"Expected workplace_degree >= 0 (got {workplace_degree})")
    if not 0.0 <= community_degree < n_nodes:
        raise ConfigError(f"Expected 0 <= community_degree < n_nodes = {n_nodes} (got {community_degree})")

    h_src, h_dst = _block_pairs(_household_sizes(rng, n_nodes, household_size))
    w_src, w_dst = _workplace_edges(rng, n_nodes, workplace_size, workplace_degree)
    n_h, n_w, n_c = h_src.numel(), w_src.numel(), round(n_nodes * community_degree / 2)
    pairs = torch.empty((2, n_h + n_w + n_c), dtype=torch.int64)
    pairs[0, :n_h], pairs[1, :n_h] = h_src, h_dst
    del h_src, h_dst
    pairs[0, n_h : n_h + n_w], pairs[1, n_h : n_h + n_w] = w_src, w_dst
    del w_src, w_dst
    _random_pairs(rng, n_c, n_nodes, "layered/community", out=pairs[:, n_h + n_w :])
    layer = torch.repeat_interleave(torch.arange(3, dtype=torch.int8), torch.tensor([n_h, n_w, n_c]))
    return _build(pairs, n_nodes, layer, LAYERED_NAMES)


# ------------------------------------------------------------------------ CSV
def _data_lines(path: str, skip: int) -> Iterator[tuple[int, str]]:
    """``(line number, text)`` of the data lines after the first ``skip`` lines."""
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if lineno <= skip:
                continue
            text = line.split("#", 1)[0].strip()
            if text:
                yield lineno, text


def _split(text: str, delimiter: str | None) -> list[str]:
    return [s.strip() for s in text.split(delimiter)]


def _parse_row(text: str, delimiter: str | None) -> tuple[int, int] | None:
    fields = _split(text, delimiter)
    if len(fields) != 2:
        return None
    try:
        return int(fields[0]), int(fields[1])
    except ValueError:
        return None


def _bad_line(path: str, skip: int, delimiter: str | None) -> tuple[int, str] | None:
    for lineno, text in _data_lines(path, skip):
        if _parse_row(text, delimiter) is None:
            return lineno, text
    return None


def _line_of_row(path: str, skip: int, row: int) -> tuple[int, str]:
    for i, item in enumerate(_data_lines(path, skip)):
        if i == row:
            return item
    raise AssertionError("row beyond the data lines")  # pragma: no cover


def from_edge_list_csv(path: str | os.PathLike[str], n_nodes: int | None = None, directed: bool = False) -> Graph:
    """Read a graph from a two-column edge list.

    Format: one edge ``source,target`` per line (comma- or whitespace-separated,
    decided by the first data line), integer node ids; an optional header line
    (a first line whose fields are not integers, e.g. ``source,target``) is
    skipped, as are blank lines and ``#`` comments.

    Args:
        path: The file.
        n_nodes: Number of nodes; default ``max id + 1``.
        directed: If False (default) each line is an undirected edge, given in
            one or both directions. If True the lines are arcs of a directed
            graph that must be symmetric (every ``(u, v)`` has its ``(v, u)``),
            and an asymmetric file is an error; :class:`Graph` holds undirected
            graphs only, so this is a check, not a different result.

    Returns:
        The :class:`Graph` (CPU).

    Raises:
        OutputError: The file is missing or unreadable.
        ConfigError: A malformed line, a negative id, an id ``>= n_nodes``, or
            an asymmetric file with ``directed=True`` (the message names the line).
    """
    name = os.fspath(path)
    if n_nodes is not None:
        n_nodes = _check_int("n_nodes", n_nodes, 1)
    if not os.path.isfile(name):
        raise OutputError(f"Cannot read edge list {name!r}: no such file")
    try:
        first = next(_data_lines(name, 0), None)
        skip = 0
        delimiter: str | None = None
        if first is not None:
            delimiter = "," if "," in first[1] else None
            if _parse_row(first[1], delimiter) is None and not any(
                s.lstrip("+-").isdigit() for s in _split(first[1], delimiter)
            ):
                skip = first[0]  # a header: no field is an integer
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "input contained no data"
            try:
                arr = np.loadtxt(
                    name, delimiter=delimiter, comments="#", dtype=np.int64, ndmin=2, skiprows=skip,
                    encoding="utf-8",
                )
            except ValueError:
                arr = None
        if arr is None or (arr.size and arr.shape[1] != 2):
            bad = _bad_line(name, skip, delimiter)
            if bad is None:  # pragma: no cover - loadtxt and the scan disagree
                raise ConfigError(f"Malformed edge list {name!r}: expected two integer columns")
            raise ConfigError(
                f"Malformed edge list {name!r}, line {bad[0]}: expected two integer columns "
                f"'source{delimiter or ' '}target' (got {bad[1]!r})"
            )
    except (OSError, UnicodeDecodeError) as exc:
        raise OutputError(f"Cannot read edge list {name!r}: {exc}") from exc
    arr = arr.reshape(-1, 2)
    src, dst = arr[:, 0], arr[:, 1]
    if arr.size:
        neg = np.flatnonzero((src < 0) | (dst < 0))
        if neg.size:
            lineno, text = _line_of_row(name, skip, int(neg[0]))
            raise ConfigError(f"Edge list {name!r}, line {lineno}: expected node ids >= 0 (got {text!r})")
    if n_nodes is None:
        if arr.size == 0:
            raise ConfigError(f"Edge list {name!r} has no edges: pass n_nodes to build an empty graph")
        n_nodes = int(arr.max()) + 1
    elif arr.size:
        big = np.flatnonzero((src >= n_nodes) | (dst >= n_nodes))
        if big.size:
            lineno, text = _line_of_row(name, skip, int(big[0]))
            raise ConfigError(
                f"Edge list {name!r}, line {lineno}: expected node ids < n_nodes = {n_nodes} (got {text!r})"
            )
    if directed and arr.size:
        arcs = src[src != dst] * n_nodes + dst[src != dst]
        rev = dst * n_nodes + src
        missing = np.flatnonzero((src != dst) & ~np.isin(rev, arcs))
        if missing.size:
            lineno, text = _line_of_row(name, skip, int(missing[0]))
            raise ConfigError(
                f"Edge list {name!r}, line {lineno}: directed=True needs a symmetric edge list, "
                f"but the reverse of {text!r} is missing (pass directed=False to symmetrize)"
            )
    return _build(torch.from_numpy(np.ascontiguousarray(arr.T)), n_nodes, None, ())
