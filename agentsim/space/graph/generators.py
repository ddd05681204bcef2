"""Graph generators: all vectorized (no Python loop over nodes, households or workplaces).

Every random number comes from :class:`agentsim.core.random.CounterRNG` at ``step = 0`` with ids
``arange(...)`` of the edges or nodes being drawn, so a graph is a pure function of its
arguments and seed.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np
import torch
from torch import Tensor

from agentsim._native import kernels as cpu_kernels
from agentsim.core.random import CounterRNG
from agentsim.errors import ConfigError
from agentsim.space.graph.network import CHUNK, Graph, build_csr, check_float, check_int, numpy_int64

__all__ = ["LAYERED_NAMES", "erdos_renyi", "layered_contacts", "watts_strogatz"]

LAYERED_NAMES: tuple[str, ...] = ("household", "workplace", "community")


def _uniform_chunked(rng: CounterRNG, n: int, stream: str, draws: int) -> Tensor:
    """``rng.uniform(arange(n), 0, stream, draws=draws)`` computed in chunks: ``[n, draws]`` float64."""
    out = torch.empty((n, draws), dtype=torch.float64)
    for start in range(0, n, CHUNK):
        stop = min(start + CHUNK, n)
        out[start:stop] = rng.uniform(torch.arange(start, stop), 0, stream, draws=draws)
    return out


def _scaled_int(u: Tensor, high: int | Tensor) -> Tensor:
    """``floor(u * high)`` as int64, kept below ``high`` (as CounterRNG.integers does)."""
    if isinstance(high, Tensor):
        return torch.minimum(torch.floor(u * high.to(torch.float64)).to(torch.int64), (high - 1).clamp(min=0))
    return torch.floor(u * high).to(torch.int64).clamp_(max=max(high - 1, 0))


def _pair_chunks(rng: CounterRNG, m: int, n: int, stream: str) -> Iterator[tuple[int, Tensor, Tensor]]:
    """``m`` pairs of independent uniform node ids in ``[0, n)``, ``CHUNK`` at a time: ``(start,
    src, dst)`` with int64 ``src``, ``dst`` of pairs ``start, start + 1, ...``. Pair ``e`` uses
    draws 0 and 1 of id ``e``.
    """
    for start in range(0, m, CHUNK):
        ends = rng.integers(torch.arange(start, min(start + CHUNK, m)), 0, stream, n, draws=2)  # floor(u * n)
        yield start, ends[:, 0], ends[:, 1]


def _random_pairs(rng: CounterRNG, m: int, n: int, stream: str, out: Tensor | None = None) -> Tensor:
    """The pairs of :func:`_pair_chunks` as ``[2, m]`` int64 ``(src, dst)``, written into ``out`` if given."""
    pairs = torch.empty((2, m), dtype=torch.int64) if out is None else out
    for start, src, dst in _pair_chunks(rng, m, n, stream):
        pairs[0, start:start + src.numel()] = src
        pairs[1, start:start + dst.numel()] = dst
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
    n_nodes = check_int("n_nodes", n_nodes, 1)
    mean_degree = check_float("mean_degree", mean_degree)
    if not 0.0 <= mean_degree < n_nodes:
        raise ConfigError(f"Expected 0 <= mean_degree < n_nodes = {n_nodes} (got {mean_degree})")
    rng = CounterRNG(check_int("seed", seed))
    m = round(n_nodes * mean_degree / 2)

    # The same graph either way; the kernel never holds the pairs (see cpu_kernels.csr_from_pair_chunks).
    lean = cpu_kernels.csr_from_pair_chunks(
        lambda: ((src, dst) for _, src, dst in _pair_chunks(rng, m, n_nodes, "erdos_renyi")), n_nodes)
    if lean is not None:
        return Graph(lean[0], lean[1], n_nodes, None, ())
    return build_csr(_random_pairs(rng, m, n_nodes, "erdos_renyi"), n_nodes, None, ())


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
    n_nodes = check_int("n_nodes", n_nodes, 1)
    k = check_int("k", k, 0)
    if k % 2 or k >= n_nodes:
        raise ConfigError(f"Expected k even and < n_nodes = {n_nodes} (got {k})")
    p = check_float("p", p)
    if not 0.0 <= p <= 1.0:
        raise ConfigError(f"Expected 0 <= p <= 1 (got {p})")
    rng = CounterRNG(check_int("seed", seed))
    half = k // 2
    m = n_nodes * half
    if m == 0:
        return build_csr(torch.zeros((2, 0), dtype=torch.int64), n_nodes, None, ())
    eid = torch.arange(m)
    src = torch.div(eid, half, rounding_mode="floor")
    dst = torch.remainder(src + eid % half + 1, n_nodes)
    if p > 0.0:
        rewire = _uniform_chunked(rng, m, "watts_strogatz/rewire", 1)[:, 0] < p
        # uniform on the n - 1 other nodes: draw in [0, n - 1) and skip src.
        target = _scaled_int(_uniform_chunked(rng, m, "watts_strogatz/target", 1)[:, 0], n_nodes - 1)
        target += (target >= src).to(torch.int64)
        dst = torch.where(rewire, target, dst)
    return build_csr(torch.stack([src, dst]), n_nodes, None, ())


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
    members = torch.from_numpy(np.sort(numpy_int64((wp << node_bits) | node))) & ((1 << node_bits) - 1)
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
    for lo in range(0, n_draws, CHUNK):
        hi = min(lo + CHUNK, n_draws)
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
    n_nodes = check_int("n_nodes", n_nodes, 1)
    rng = CounterRNG(check_int("seed", seed))
    household_size = check_float("household_size", household_size)
    workplace_size = check_float("workplace_size", workplace_size)
    workplace_degree = check_float("workplace_degree", workplace_degree)
    community_degree = check_float("community_degree", community_degree)
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
    return build_csr(pairs, n_nodes, layer, LAYERED_NAMES)

