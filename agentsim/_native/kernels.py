"""CPU kernels for hot loops that torch runs as several passes (or as slow ones): a push along a
graph's edges, the exact fixed-point sum of a metric, the lean network build, a move in a periodic
box, a squared norm per row, integer sums over a torus's neighborhoods, a radius search's sort and
filter, several scatter sums at once.

Built on first use by :mod:`agentsim._native.build`; where no compiler is found the callers use their
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
- :func:`csr_from_pair_chunks`: the CSR of an undirected graph from regenerable pair chunks
  (count, place, sort rows; on torch's threads, in 2 MiB pages): no ``[2, m]`` edge list held.
- :func:`add_wrap`: ``pos = wrap(pos + delta)`` in a periodic box, in place (``Box.move``).
- :func:`squared_norm`: ``sum_j x[:, j]**2`` in float64 per row (``ops.squared_norm``);
  :func:`squared_norm_fixed_sum`: the fixed-point sum of those norms without the column
  (``metrics.sum_of_squares``).
- :func:`periodic_grid_sum`: integer neighborhood sums on a torus (``Grid.neighbor_sum``).
- :func:`is_iota`: whether an index column is ``0 .. n - 1`` (a gather that can be skipped).
- :func:`add_columns`: several ``index_add_`` of 1-D columns sharing one index, in one pass.
- :func:`cell_sort`: a radius search's sources sorted by (cell, uid), and its cell table.
- :func:`radius_expand`: a radius search's candidates filtered by distance, with their
  displacements (one pass instead of about twenty over the candidates).
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from agentsim._native import build as native
from agentsim._native.rng import as_int64

__all__ = ["add_columns", "add_wrap", "cell_sort", "csr_from_pair_chunks", "fixed_sum", "is_iota", "periodic_grid_sum",
           "push_count", "radius_expand", "squared_norm", "squared_norm_fixed_sum"]

_PARALLEL_MIN = 1 << 16  # pairs or rows per thread below which one thread does the work

_SOURCE = r"""
#include <stdint.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static inline uint64_t as_bits(double d) { uint64_t b; memcpy(&b, &d, 8); return b; }

#define BUF 4096

/* counts[v] += 1 for every neighbor v of every node in nodes; 0, or 1 + the position of the first
   node outside [0, n_nodes) (nothing is counted then). counts must be zeroed by the caller.
   The loads of the CSR runs (random rows of a large array) are prefetched a few nodes ahead and
   their ids gathered into a small buffer before the increments: the two kinds of cache misses
   no longer wait on each other (3-4x faster than the plain double loop here). */
int64_t agentsim_push_count(const int64_t *indptr, const int32_t *indices, int64_t n_nodes,
                            const int64_t *nodes, int64_t m, int32_t *counts) {
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

/* pos[i * d + j] = wrap(pos[i * d + j] + delta[i * d + j], len[j]) in place, where wrap is
   Box.wrap's torch ops: r = remainder(x, L) (fmod, then + L where it is negative: the same
   rounding as torch), then r = 0 where r rounds to L. fmod is exact, so for 0 <= x < L it is x
   and for L <= x < 2L it is x - L (exact by Sterbenz); the C library is called for the rest.
   The flat entries go WRAP_BLOCK at a time: a loop the compiler vectorizes for the three cases
   -L < x < 2L (selects, no branches); where a block holds another x (or a NaN), those entries
   again with fmod. */
#define WRAP_BLOCK 384 /* a multiple of 2 and 3 */
#define ADD_WRAP(NAME, T, FMOD) \
void NAME(T *pos, const T *delta, int64_t n, int64_t d, const double *lengths) { \
    T len[WRAP_BLOCK], out[WRAP_BLOCK]; /* len[k]: the side of entry k of a block (rows repeated) */ \
    for (int64_t k = 0; k < WRAP_BLOCK; k++) len[k] = (T)lengths[k % d]; \
    int64_t total = n * d; \
    for (int64_t k0 = 0; k0 < total; k0 += WRAP_BLOCK) { \
        int64_t m = total - k0 < WRAP_BLOCK ? total - k0 : WRAP_BLOCK; \
        const T *p = pos + k0, *q = delta + k0; \
        int other = 0; \
        for (int64_t k = 0; k < m; k++) { \
            T x = p[k] + q[k], L = len[k]; \
            T y = x >= L ? x - L : x; \
            y = x < 0 ? x + L : y; \
            other |= !(x > -L && x < 2 * L); \
            out[k] = y >= L ? 0 : y; \
        } \
        if (other) \
            for (int64_t k = 0; k < m; k++) { \
                T x = p[k] + q[k], L = len[k]; \
                if (x > -L && x < 2 * L) continue; /* done above */ \
                T r = FMOD(x, L); \
                if (r != 0 && r < 0) r += L; \
                out[k] = r >= L ? 0 : r; \
            } \
        memcpy(pos + k0, out, m * sizeof(T)); \
    } \
}
ADD_WRAP(agentsim_add_wrap32, float, fmodf)
ADD_WRAP(agentsim_add_wrap64, double, fmod)

/* out[i] = x[i, 0]^2 + x[i, 1]^2 + ... in double, each square and each sum rounded, left to right */
#define SQ_NORM(NAME, T) \
void NAME(const T *x, int64_t n, int64_t k, double *out) { \
    if (k == 2) { /* the common case, in a loop the compiler vectorizes */ \
        for (int64_t i = 0; i < n; i++) { \
            double a = (double)x[2 * i], b = (double)x[2 * i + 1]; \
            out[i] = a * a + b * b; \
        } \
        return; \
    } \
    for (int64_t i = 0; i < n; i++) { \
        double a = (double)x[i * k]; \
        double s = a * a; \
        for (int64_t j = 1; j < k; j++) { double b = (double)x[i * k + j]; s = s + b * b; } \
        out[i] = s; \
    } \
}
SQ_NORM(agentsim_sq_norm32, float)
SQ_NORM(agentsim_sq_norm64, double)

/* Periodic grid sums of int64 layers: out[b, i, j] = sum_k x[b, (i + dr[k]) mod h, (j + dc[k]) mod w]
   for the output rows r0 <= b * h + i < r1 of [*, h, w] (0 <= |dr| < h, 0 <= |dc| < w). Each
   offset is a pass over a row held in cache, split where the columns wrap so the loops vectorize. */
void agentsim_grid_sum64(const int64_t *x, int64_t r0, int64_t r1, int64_t h, int64_t w,
                         const int64_t *dr, const int64_t *dc, int64_t k, int64_t *out) {
    for (int64_t row = r0; row < r1; row++) {
        int64_t b = row / h, i = row % h;
        int64_t *o = out + row * w;
        for (int64_t j = 0; j < w; j++) o[j] = 0;
        for (int64_t q = 0; q < k; q++) {
            int64_t r = ((i + dr[q]) % h + h) % h, c = (dc[q] % w + w) % w;
            const int64_t *s = x + (b * h + r) * w;
            for (int64_t j = 0; j < w - c; j++) o[j] += s[j + c];
            for (int64_t j = w - c; j < w; j++) o[j] += s[j + c - w];
        }
    }
}

/* 1 if x[i] == i for every i < n, else 0 (stops at the first difference) */
int64_t agentsim_is_iota(const int64_t *x, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        if (x[i] != i) return 0;
    return 1;
}

/* FIXED_SUM(NAME, T): the wrapping sum of (int64) nearbyint(x[i] * scale), as torch's int64 sum of
   the rounded values: scale is a power of two, so x * scale is exact and the rounding (to nearest,
   ties to even) is the only one. Blocks of FIXED_BLOCK
   entries whose |x * scale| < 2**51 take a vectorized path: v + 1.5 * 2**52 rounds v to an integer
   (to nearest, ties to even: nearbyint's rounding in the default mode) whose bits minus those of
   1.5 * 2**52 are that integer, exactly; other blocks (large values, NaN) call nearbyint. */
#define FIXED_BLOCK 1024
/* The body of a fixed-point sum over i in [0, n) of the double VALUE (an expression of i), each
   times scale: per block, the rounding trick (vectorized); a block holding a large or NaN value
   again with nearbyint. */
#define FIXED_BLOCKS(VALUE) \
    uint64_t s = 0; \
    for (int64_t i0 = 0; i0 < n; i0 += FIXED_BLOCK) { \
        const int64_t i1 = n - i0 < FIXED_BLOCK ? n : i0 + FIXED_BLOCK; \
        uint64_t part = 0; \
        int large = 0; \
        for (int64_t i = i0; i < i1; i++) { \
            double v = (VALUE) * scale; \
            large |= !(v < 0x1p51 && v > -0x1p51); \
            part += as_bits(v + 0x1.8p52) - 0x4338000000000000ULL; \
        } \
        if (large) { \
            part = 0; \
            for (int64_t i = i0; i < i1; i++) part += (uint64_t)(int64_t)nearbyint((VALUE) * scale); \
        } \
        s += part; \
    } \
    return (int64_t)s;
#define FIXED_SUM(NAME, T) \
int64_t NAME(const T *x, int64_t n, double scale) { FIXED_BLOCKS((double)x[i]) }
FIXED_SUM(agentsim_fixed_sum64, double)
FIXED_SUM(agentsim_fixed_sum32, float)

/* SQ_NORM_FIXED_SUM(NAME, T): FIXED_SUM of the SQ_NORM column of x [n, k] without the column: the
   wrapping sum of (int64) nearbyint(s[i] * scale), s[i] = x[i, 0]^2 + x[i, 1]^2 + ... in double
   (each square and each sum rounded, left to right). */
#define SQ_NORM_FIXED_SUM(NAME, T) \
static inline double NAME##_row(const T *x, int64_t i, int64_t k) { \
    double a = (double)x[i * k]; \
    double s = a * a; \
    for (int64_t j = 1; j < k; j++) { double b = (double)x[i * k + j]; s = s + b * b; } \
    return s; \
} \
static inline double NAME##_row2(const T *x, int64_t i) { \
    double a = (double)x[2 * i], b = (double)x[2 * i + 1]; \
    return a * a + b * b; \
} \
static int64_t NAME##_2(const T *x, int64_t n, double scale) { FIXED_BLOCKS(NAME##_row2(x, i)) } \
int64_t NAME(const T *x, int64_t n, int64_t k, double scale) { \
    if (k == 2) return NAME##_2(x, n, scale); /* the common case, in a loop the compiler vectorizes */ \
    FIXED_BLOCKS(NAME##_row(x, i, k)) \
}
SQ_NORM_FIXED_SUM(agentsim_sq_norm_fixed_sum64, double)
SQ_NORM_FIXED_SUM(agentsim_sq_norm_fixed_sum32, float)


/* The CSR of an undirected graph from pairs given in chunks, without a sorted edge list: count,
   then place, then sort and deduplicate each row in place. Self-loops are skipped.
   1. agentsim_csr_count(u, v, m, counts): counts[u] += 1, counts[v] += 1 per pair.
   2. the caller turns counts into row starts (rows[r] = start of row r; rows has n + 1 entries);
   3. agentsim_csr_place(u, v, m, rows, indices): indices[rows[u]++] = v, indices[rows[v]++] = u
      (afterwards rows[r] is the end of row r, i.e. the start of row r + 1);
   4. agentsim_csr_sort_rows(rows, r0, r1, indices, lengths): rows r0 <= r < r1 sorted in place,
      their distinct entries moved to the front of the row, lengths[r] = how many;
   5. agentsim_csr_compact(rows, n, indices, lengths): the rows moved down over the gaps;
      rows[r] = the new starts, rows[n] the number of entries.
   Steps 1, 3 and 4 may run on several threads at once (disjoint pairs, disjoint rows): the
   increments are atomic, and the order in which a row is filled does not matter since it is
   sorted afterwards, so the graph is the same on any number of threads. */
/* Both loops are random accesses into arrays larger than the cache: the rows (and, placing, the
   slots they point to) of pairs a few ahead are prefetched. */
/* u[e * stride], v[e * stride]: the pair e (the columns of an [m, 2] tensor have stride 2) */
void agentsim_csr_count(const int64_t *u, const int64_t *v, int64_t stride, int64_t m, int64_t *counts) {
    for (int64_t e = 0; e < m; e++) {
        int64_t a = u[e * stride], b = v[e * stride];
        if (e + 16 < m) {
            __builtin_prefetch(&counts[u[(e + 16) * stride]], 1);
            __builtin_prefetch(&counts[v[(e + 16) * stride]], 1);
        }
        if (a != b) {
            __atomic_fetch_add(&counts[a], 1, __ATOMIC_RELAXED);
            __atomic_fetch_add(&counts[b], 1, __ATOMIC_RELAXED);
        }
    }
}

void agentsim_csr_place(const int64_t *u, const int64_t *v, int64_t stride, int64_t m, int64_t *rows,
                        int32_t *indices) {
    for (int64_t e = 0; e < m; e++) {
        int64_t a = u[e * stride], b = v[e * stride];
        if (e + 16 < m) {
            __builtin_prefetch(&rows[u[(e + 16) * stride]], 1);
            __builtin_prefetch(&rows[v[(e + 16) * stride]], 1);
        }
        if (e + 8 < m) {
            __builtin_prefetch(&indices[rows[u[(e + 8) * stride]]], 1);
            __builtin_prefetch(&indices[rows[v[(e + 8) * stride]]], 1);
        }
        if (a != b) {
            indices[__atomic_fetch_add(&rows[a], 1, __ATOMIC_RELAXED)] = (int32_t)b;
            indices[__atomic_fetch_add(&rows[b], 1, __ATOMIC_RELAXED)] = (int32_t)a;
        }
    }
}

static int cmp_int32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

void agentsim_csr_sort_rows(const int64_t *rows, int64_t r0, int64_t r1, int32_t *indices, int32_t *lengths) {
    int64_t start = r0 == 0 ? 0 : rows[r0 - 1];  /* after placing, rows[r] is the end of row r */
    for (int64_t r = r0; r < r1; r++) {
        int64_t end = rows[r], len = end - start;
        int32_t *a = indices + start;
        if (len <= 32) {
            for (int64_t i = 1; i < len; i++) {
                int32_t x = a[i];
                int64_t j = i - 1;
                while (j >= 0 && a[j] > x) { a[j + 1] = a[j]; j--; }
                a[j + 1] = x;
            }
        } else {
            qsort(a, (size_t)len, sizeof(int32_t), cmp_int32);
        }
        int64_t kept = 0;
        for (int64_t i = 0; i < len; i++)
            if (i == 0 || a[i] != a[kept - 1]) a[kept++] = a[i];
        lengths[r] = (int32_t)kept;
        start = end;
    }
}

void agentsim_csr_compact(int64_t *rows, int64_t n, int32_t *indices, const int32_t *lengths) {
    int64_t written = 0, start = 0;
    for (int64_t r = 0; r < n; r++) {
        int64_t end = rows[r];
        if (written != start) memmove(indices + written, indices + start, (size_t)lengths[r] * sizeof(int32_t));
        rows[r] = written;
        written += lengths[r];
        start = end;
    }
    rows[n] = written;
}

/* The candidates of a radius search, filtered (agentsim.space.continuous.search._expand): for the
   targets a <= t < b (rows t0 + t), their n_seg segments of sorted sources in canonical order
   (segment r of target t: sources start[r, t] .. start[r, t] + cnt[r, t] - 1; start and cnt are
   [n_seg, n_targets] row-major), the pairs within the radius written from slot `at` on: target
   row, source row (order[s]), the displacement per dim (into delta[k * cap + slot]) and its
   squared length. The arithmetic of the torch ops, in the pos dtype F, operation by operation:
   v = scol[s] - col[row]; periodic: q = v / L, rounded half to even, times L, v -= q (where
   |v| < L / 4, q is +-0, and v - q is v + 0: the division skipped); d2 = the squares added in
   dim order; kept where d2 <= (F) r2 (a NaN is never kept) and, without
   include_self, source != target. Returns how many were written. */
/* The loop over a piece's targets, with D (the number of dims) a constant where the caller
   names one: the loops over dims unroll (2D and 3D searches), the same operations in the same order. */
#define EXPAND_LOOP(F, I, ROUND, D)                                                                   \
    for (int64_t t = a; t < b; t++) {                                                                 \
        const int64_t row = t0 + t;                                                                   \
        F x[3] = {0, 0, 0};                                                                           \
        for (int64_t k = 0; k < (D); k++) x[k] = col[k][row];                                         \
        for (int64_t r = 0; r < n_seg; r++) {                                                         \
            const int64_t lo = (int64_t)start[r * n_targets + t], hi = lo + (int64_t)cnt[r * n_targets + t]; \
            for (int64_t s = lo; s < hi; s++) {                                                       \
                F v[3] = {0, 0, 0}, d2 = 0;                                                           \
                for (int64_t k = 0; k < (D); k++) {                                                   \
                    F u = scol[k][s] - x[k];                                                          \
                    if (periodic) {                                                                   \
                        if (u < near[k] && u > -near[k]) u = u + (F)0; /* -0 + 0 = +0, as -0 - -0 */   \
                        else { F q = u / len[k]; q = ROUND(q); q = q * len[k]; u = u - q; }           \
                    }                                                                                 \
                    v[k] = u;                                                                         \
                    d2 = k == 0 ? u * u : d2 + u * u;                                                 \
                }                                                                                     \
                const int64_t src = (int64_t)order[s];                                                \
                /* written always, kept by advancing w: no branch on the distance, which comes late  \
                   (a division's latency) and is hard to predict; w never passes this candidate's     \
                   own slot, inside this piece's candidates */                                        \
                out_i[w] = (I)row; out_j[w] = (I)src; dist2[w] = d2;                                  \
                for (int64_t k = 0; k < (D); k++) delta[k * cap + w] = v[k];                          \
                w += (d2 <= r2) & (include_self | (src != row));                                      \
            }                                                                                         \
        }                                                                                             \
    }

#define EXPAND(NAME, F, I, ROUND)                                                                     \
int64_t NAME(int64_t d, const F *c0, const F *c1, const F *c2, const F *s0, const F *s1, const F *s2,  \
             const I *order, double l0, double l1, double l2, int64_t periodic, double r2d,            \
             int64_t include_self, const I *start, const I *cnt, int64_t n_seg, int64_t n_targets,     \
             int64_t t0, int64_t a, int64_t b, int64_t at, I *out_i, I *out_j, F *delta, int64_t cap,  \
             F *dist2) {                                                                               \
    const F *col[3] = {c0, c1, c2}, *scol[3] = {s0, s1, s2};                                          \
    const F len[3] = {(F)l0, (F)l1, (F)l2}, r2 = (F)r2d;                                              \
    const F near[3] = {(F)(l0 / 4), (F)(l1 / 4), (F)(l2 / 4)};                                         \
    int64_t w = at;                                                                                   \
    if (d == 2) { EXPAND_LOOP(F, I, ROUND, 2) }                                                       \
    else if (d == 3) { EXPAND_LOOP(F, I, ROUND, 3) }                                                  \
    else { EXPAND_LOOP(F, I, ROUND, d) }                                                              \
    return w - at;                                                                                    \
}
EXPAND(agentsim_expand32_i32, float, int32_t, nearbyintf)
EXPAND(agentsim_expand32_i64, float, int64_t, nearbyintf)
EXPAND(agentsim_expand64_i32, double, int32_t, nearbyint)
EXPAND(agentsim_expand64_i64, double, int64_t, nearbyint)

/* Several scatter sums sharing one index: outs[c][index[p]] += srcs[c][p] for p = 0 .. m - 1 in
   that order, for each column c < k (k <= 8): each column the bits of torch's index_add_ on the
   CPU. 0, or 1 + the first p whose index is outside [0, n_out) (nothing is added then). A run of
   equal indices is summed in registers and stored once; the k columns' additions are independent
   chains, so they overlap (one column alone is a chain of dependent additions). */
#define ADD_COLUMNS(NAME, F, I)                                                                       \
static inline __attribute__((always_inline)) void NAME##_k(const int k, F *const *outs,               \
        const I *index, const F *const *srcs, int64_t m) {                                            \
    F acc[8];                                                                                         \
    int64_t cur = (int64_t)index[0];                                                                  \
    for (int c = 0; c < k; c++) acc[c] = outs[c][cur];                                                \
    for (int64_t p = 0; p < m; p++) {                                                                 \
        const int64_t t = (int64_t)index[p];                                                          \
        if (t != cur) {                                                                               \
            for (int c = 0; c < k; c++) { outs[c][cur] = acc[c]; acc[c] = outs[c][t]; }               \
            cur = t;                                                                                  \
        }                                                                                             \
        for (int c = 0; c < k; c++) acc[c] += srcs[c][p];                                             \
    }                                                                                                 \
    for (int c = 0; c < k; c++) outs[c][cur] = acc[c];                                                \
}                                                                                                     \
int64_t NAME(int64_t k, F *const *outs, int64_t n_out, const I *index, const F *const *srcs,           \
             int64_t m) {                                                                             \
    for (int64_t p = 0; p < m; p++)                                                                   \
        if ((uint64_t)(int64_t)index[p] >= (uint64_t)n_out) return p + 1;                             \
    if (m == 0) return 0;                                                                             \
    switch (k) {                                                                                      \
        case 1: NAME##_k(1, outs, index, srcs, m); break;                                             \
        case 2: NAME##_k(2, outs, index, srcs, m); break;                                             \
        case 3: NAME##_k(3, outs, index, srcs, m); break;                                             \
        case 4: NAME##_k(4, outs, index, srcs, m); break;                                             \
        case 5: NAME##_k(5, outs, index, srcs, m); break;                                             \
        case 6: NAME##_k(6, outs, index, srcs, m); break;                                             \
        case 7: NAME##_k(7, outs, index, srcs, m); break;                                             \
        default: NAME##_k(8, outs, index, srcs, m); break;                                            \
    }                                                                                                 \
    return 0;                                                                                         \
}
ADD_COLUMNS(agentsim_add_columns32_i32, float, int32_t)
ADD_COLUMNS(agentsim_add_columns32_i64, float, int64_t)
ADD_COLUMNS(agentsim_add_columns64_i32, double, int32_t)
ADD_COLUMNS(agentsim_add_columns64_i64, double, int64_t)

/* The entries of a radius search sorted by (cell, uid), ties in entry order (a stable sort by
   that key; without uid, by cell): perm[q] = the entry at sorted place q, and table[c] = the
   number of entries in cells < c (c = 0 .. n_cells). A counting sort by cell (stable), then each
   cell's run ordered by (uid, entry): insertion sort for short runs, qsort of (uid, entry) pairs
   (a total order: the same result) for long ones. 0, or 1 + the first entry whose cell is outside
   [0, n_cells); -1 where memory for a long run could not be had. */
typedef struct { int64_t uid, entry; } uid_entry;
static int by_uid_entry(const void *a, const void *b) {
    const uid_entry *x = (const uid_entry *)a, *y = (const uid_entry *)b;
    if (x->uid != y->uid) return x->uid < y->uid ? -1 : 1;
    return x->entry < y->entry ? -1 : (x->entry > y->entry);
}
static int sort_run(int64_t *perm, int64_t len, const int64_t *uid) {
    if (len <= 32) {
        for (int64_t a = 1; a < len; a++) {
            const int64_t e = perm[a], u = uid[e];
            int64_t b = a;
            while (b > 0 && (uid[perm[b - 1]] > u || (uid[perm[b - 1]] == u && perm[b - 1] > e))) {
                perm[b] = perm[b - 1];
                b--;
            }
            perm[b] = e;
        }
        return 0;
    }
    uid_entry *pairs = (uid_entry *)malloc((size_t)len * sizeof(uid_entry));
    if (pairs == NULL) return -1;
    for (int64_t a = 0; a < len; a++) { pairs[a].uid = uid[perm[a]]; pairs[a].entry = perm[a]; }
    qsort(pairs, (size_t)len, sizeof(uid_entry), by_uid_entry);
    for (int64_t a = 0; a < len; a++) perm[a] = pairs[a].entry;
    free(pairs);
    return 0;
}
#define CELL_SORT(NAME, I)                                                                            \
int64_t NAME(const I *cell, int64_t n, const int64_t *uid, int64_t n_cells, I *table, int64_t *perm) { \
    for (int64_t e = 0; e < n; e++)                                                                   \
        if ((uint64_t)(int64_t)cell[e] >= (uint64_t)n_cells) return e + 1;                            \
    memset(table, 0, (size_t)(n_cells + 1) * sizeof(I));                                              \
    for (int64_t e = 0; e < n; e++) table[cell[e] + 1]++;                                             \
    for (int64_t c = 0; c < n_cells; c++) table[c + 1] += table[c];                                   \
    for (int64_t e = 0; e < n; e++) perm[table[cell[e]]++] = e; /* table[c] ends at c's end */        \
    for (int64_t c = n_cells; c > 0; c--) table[c] = table[c - 1];                                    \
    table[0] = 0;                                                                                     \
    if (uid != NULL)                                                                                  \
        for (int64_t c = 0; c < n_cells; c++) {                                                       \
            const int64_t lo = (int64_t)table[c], len = (int64_t)table[c + 1] - lo;                   \
            if (len > 1 && sort_run(perm + lo, len, uid)) return -1;                                  \
        }                                                                                             \
    return 0;                                                                                         \
}
CELL_SORT(agentsim_cell_sort_i32, int32_t)
CELL_SORT(agentsim_cell_sort_i64, int64_t)

/* memmove within one buffer (the pieces of a threaded search moved together). */
void agentsim_move_bytes(char *base, int64_t dst, int64_t src, int64_t n) {
    memmove(base + dst, base + src, (size_t)n);
}

"""


class _Kernels:
    def __init__(self, library: ctypes.CDLL, path: Path) -> None:
        self.path = path
        self.push_count = library.agentsim_push_count
        self.push_count.restype = ctypes.c_int64
        self.push_count.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p,
                                    ctypes.c_int64, ctypes.c_void_p]
        p, i64 = ctypes.c_void_p, ctypes.c_int64
        self.add_wrap = _by_dtype(library, "agentsim_add_wrap", None, [p, p, i64, i64, p])
        self.sq_norm = _by_dtype(library, "agentsim_sq_norm", None, [p, i64, i64, p])
        self.grid_sum = library.agentsim_grid_sum64
        self.grid_sum.restype, self.grid_sum.argtypes = None, [p, i64, i64, i64, i64, p, p, i64, p]
        self.is_iota = library.agentsim_is_iota
        self.is_iota.restype, self.is_iota.argtypes = ctypes.c_int64, [p, i64]
        self.csr_count = library.agentsim_csr_count
        self.csr_count.restype, self.csr_count.argtypes = None, [p, p, i64, i64, p]
        self.csr_place = library.agentsim_csr_place
        self.csr_place.restype, self.csr_place.argtypes = None, [p, p, i64, i64, p, p]
        self.csr_sort_rows = library.agentsim_csr_sort_rows
        self.csr_sort_rows.restype, self.csr_sort_rows.argtypes = None, [p, i64, i64, p, p]
        self.csr_compact = library.agentsim_csr_compact
        self.csr_compact.restype, self.csr_compact.argtypes = None, [p, i64, p, p]
        self.fixed_sum = _by_dtype(library, "agentsim_fixed_sum", ctypes.c_int64, [p, i64, ctypes.c_double])
        self.sq_norm_fixed_sum = _by_dtype(library, "agentsim_sq_norm_fixed_sum", ctypes.c_int64,
                                           [p, i64, i64, ctypes.c_double])
        f64 = ctypes.c_double
        expand_args: list[type] = [i64, p, p, p, p, p, p, p, f64, f64, f64, i64, f64, i64, p, p, i64, i64, i64, i64,
                                   i64, i64, p, p, p, i64, p]
        self.expand = _by_dtypes(library, "agentsim_expand", i64, expand_args)
        self.add_columns = _by_dtypes(library, "agentsim_add_columns", i64, [i64, p, i64, p, p, i64])
        self.cell_sort = {idt: _bound(library, f"agentsim_cell_sort_i{ib}", i64, [p, i64, p, i64, p, p])
                          for idt, ib in _INDEX_BITS}
        self.move_bytes = _bound(library, "agentsim_move_bytes", None, [p, i64, i64, i64])


_FLOAT_BITS = ((torch.float32, 32), (torch.float64, 64))
_INDEX_BITS = ((torch.int32, 32), (torch.int64, 64))


def _bound(library: ctypes.CDLL, name: str, restype: type | None, argtypes: list[type]) -> Any:
    """The library's function ``name`` with its result and argument types set."""
    fn = getattr(library, name)
    fn.restype, fn.argtypes = restype, argtypes
    return fn


def _by_dtype(library: ctypes.CDLL, prefix: str, restype: type | None, argtypes: list[type]) -> dict[torch.dtype, Any]:
    """The float32 and float64 variants ``<prefix>32`` and ``<prefix>64`` of a kernel, by dtype."""
    return {dtype: _bound(library, f"{prefix}{bits}", restype, argtypes) for dtype, bits in _FLOAT_BITS}


def _by_dtypes(library: ctypes.CDLL, prefix: str, restype: type | None,
               argtypes: list[type]) -> dict[tuple[torch.dtype, torch.dtype], Any]:
    """The variants ``<prefix><32|64>_i<32|64>`` of a kernel, by (float dtype, index dtype)."""
    return {(fdt, idt): _bound(library, f"{prefix}{fb}_i{ib}", restype, argtypes)
            for fdt, fb in _FLOAT_BITS for idt, ib in _INDEX_BITS}


def _kernels() -> _Kernels | None:
    return native.load("cpu_kernels", _SOURCE, _Kernels, what="CPU kernel library")


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
    ptrs = [c.data_ptr() for c in cols] + [0] * (3 - d)
    sptrs = [c.data_ptr() for c in scols] + [0] * (3 - d)
    sides = [float(x) for x in lengths] + [1.0] * (3 - d)
    pieces = native.thread_ranges(n_targets, _SEARCH_MIN)
    ends = torch.cumsum(per_target, 0)
    first = [0, *ends.index_select(0, torch.tensor([a - 1 for a, _ in pieces[1:]], dtype=torch.int64)).tolist()]
    at = {a: f for (a, _), f in zip(pieces, first, strict=True)}  # candidates before each piece
    kept: dict[int, int] = {}

    def body(a: int, b: int) -> None:
        kept[a] = fn(d, *ptrs, *sptrs, order.data_ptr(), *sides, int(periodic), float(r2), int(include_self),
                     start.data_ptr(), cnt.data_ptr(), n_seg, n_targets, t0, a, b, at[a], out_i.data_ptr(),
                     out_j.data_ptr(), delta.data_ptr(), total, dist2.data_ptr())

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
    if x.device.type != "cpu" or x.dtype not in (torch.float32, torch.float64) or x.requires_grad:
        return None
    k = _kernels()
    if k is None:
        return None
    x = x.contiguous()
    fn, ptr, item, scale = k.fixed_sum[x.dtype], x.data_ptr(), x.element_size(), float(2**frac_bits)
    parts: list[int] = []  # one wrapping sum per thread's range
    native.parallel_for(x.numel(), _PARALLEL_MIN, lambda a, b: parts.append(fn(ptr + item * a, b - a, scale)))
    return _wrapped_total(parts)


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
