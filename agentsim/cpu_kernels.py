"""CPU kernels for two hot loops that torch runs as several passes: a push along a graph's edges
and the exact fixed-point sum of a metric.

Built on first use by :mod:`agentsim.native`; where no compiler is found the callers use their
torch ops, which give the same results (both are integer arithmetic, or correctly rounded float
operations followed by integer sums, so the order of work never shows in the bits).

- :func:`push_count`: for every node, how many of its neighbors are in a given node list (the
  SIR step's "infectious contacts"). Torch needs five passes and four temporaries of the pushed
  edges' size (``repeat_interleave``, ``arange``, a gather, ``bincount``): 55-86 ms for 2.5M edges
  from 250k random nodes of a 1M-node graph of mean degree 10 here; this loop, 15-21 ms (its cost is
  cache misses: the rows of a 40 MB ``indices`` and the increments).
- :func:`fixed_sum`: ``sum(round_half_even(x * 2**frac_bits))`` in wrapping int64, the metric
  reduction of :mod:`agentsim.metrics`, in one pass instead of four (a float64 copy, the scaling,
  the rounding, the conversion to int64) and no temporaries.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import torch
from torch import Tensor

from . import native

__all__ = ["fixed_sum", "push_count"]

_SOURCE = r"""
#include <stdint.h>
#include <math.h>

#define BUF 4096

/* counts[v] += 1 for every neighbor v of every node in nodes; 0, or 1 + the position of the first
   node outside [0, n_nodes) (nothing is counted then). counts must be zeroed by the caller.
   The loads of the CSR runs (random rows of a large array) are prefetched a few nodes ahead and
   their ids gathered into a small buffer before the increments: the two kinds of cache misses
   no longer wait on each other (3-4x faster than the plain double loop here). */
int64_t agentsim_push_count(const int64_t *indptr, const int32_t *indices, int64_t n_nodes,
                            const int64_t *nodes, int64_t m, int64_t *counts) {
    for (int64_t i = 0; i < m; i++)
        if (nodes[i] < 0 || nodes[i] >= n_nodes) return i + 1;
    int32_t buf[BUF];
    int64_t k = 0;
    for (int64_t i = 0; i < m; i++) {
        if (i + 16 < m) __builtin_prefetch(&indptr[nodes[i + 16]]);
        if (i + 8 < m) {
            const int32_t *p = &indices[indptr[nodes[i + 8]]];
            __builtin_prefetch(p);
            __builtin_prefetch(p + 16);
        }
        int64_t a = indptr[nodes[i]], b = indptr[nodes[i] + 1];
        if (k + (b - a) > BUF) {
            for (int64_t j = 0; j < k; j++) counts[buf[j]]++;
            k = 0;
        }
        if (b - a > BUF) {
            for (int64_t e = a; e < b; e++) counts[indices[e]]++;
            continue;
        }
        for (int64_t e = a; e < b; e++) buf[k++] = indices[e];
    }
    for (int64_t j = 0; j < k; j++) counts[buf[j]]++;
    return 0;
}

/* sum of (int64) nearbyint(x[i] * scale), wrapping (as torch's int64 sum): scale is a power of two,
   so x * scale is exact and the rounding (to nearest, ties to even) is the only one. */
int64_t agentsim_fixed_sum64(const double *x, int64_t n, double scale) {
    uint64_t s = 0;
    for (int64_t i = 0; i < n; i++) s += (uint64_t)(int64_t)nearbyint(x[i] * scale);
    return (int64_t)s;
}

int64_t agentsim_fixed_sum32(const float *x, int64_t n, double scale) {
    uint64_t s = 0;
    for (int64_t i = 0; i < n; i++) s += (uint64_t)(int64_t)nearbyint((double)x[i] * scale);
    return (int64_t)s;
}
"""


class _Kernels:
    def __init__(self, library: ctypes.CDLL, path: Path) -> None:
        self.path = path
        self.push_count = library.agentsim_push_count
        self.push_count.restype = ctypes.c_int64
        self.push_count.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p,
                                    ctypes.c_int64, ctypes.c_void_p]
        self.fixed_sum = {}
        for dtype, symbol in ((torch.float64, "agentsim_fixed_sum64"), (torch.float32, "agentsim_fixed_sum32")):
            fn = getattr(library, symbol)
            fn.restype = ctypes.c_int64
            fn.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_double]
            self.fixed_sum[dtype] = fn


def _kernels() -> _Kernels | None:
    return native.load("cpu_kernels", _SOURCE, _Kernels, what="CPU kernel library")


def push_count(indptr: Tensor, indices: Tensor, n_nodes: int, nodes: Tensor) -> Tensor | None:
    """``out[v]`` = how many neighbors of ``v`` are in ``nodes`` (``[n_nodes]`` int64), or None where
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
    out = torch.zeros(n_nodes, dtype=torch.int64)
    bad = k.push_count(indptr.data_ptr(), indices.data_ptr(), n_nodes, nodes.data_ptr(), nodes.numel(),
                       out.data_ptr())
    if bad:
        raise IndexError(f"node id {int(nodes[bad - 1])} out of range for a graph of {n_nodes} nodes")
    return out


def fixed_sum(x: Tensor, frac_bits: int) -> Tensor | None:
    """``sum(round(x * 2**frac_bits))`` as a 0-d int64 tensor (what ``ops.to_fixed(x).sum()``
    gives, bit for bit), or None where the kernel does not apply (not a CPU float32/float64
    tensor, needs grad, no kernel).
    """
    if x.device.type != "cpu" or x.dtype not in (torch.float32, torch.float64) or x.requires_grad:
        return None
    k = _kernels()
    if k is None:
        return None
    x = x.contiguous()
    return torch.tensor(k.fixed_sum[x.dtype](x.data_ptr(), x.numel(), float(2**frac_bits)), dtype=torch.int64)
