/* Continuous-space kernels (agentsim/_native/kernels.py: add_wrap, radius_expand, cell_sort; used
   by agentsim.space.continuous): the move in a periodic box and a radius search's sort and filter,
   with the operations of the torch ops in the same order (same bits). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "agentsim_kernels.h"

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

/* The loop with every field of the search as its own argument: passed in registers and on the
   stack, the values the loop keeps live fit the registers as they do not when they are read from
   the struct in the same function (that version ran about 16% slower with gcc 12 -O3). Not
   inlined, so that it is compiled as this stand-alone function. */
#define EXPAND_BODY(NAME, F, I, ROUND)                                                                \
__attribute__((noinline)) static int64_t NAME(                                                        \
        int64_t d, const F *c0, const F *c1, const F *c2, const F *s0, const F *s1, const F *s2,       \
        const I *order, double l0, double l1, double l2, int64_t periodic, double r2d,                 \
        int64_t include_self, const I *start, const I *cnt, int64_t n_seg, int64_t n_targets,          \
        int64_t t0, int64_t a, int64_t b, int64_t at, I *out_i, I *out_j, F *delta, int64_t cap,       \
        F *dist2) {                                                                                   \
    const F *col[3] = {c0, c1, c2}, *scol[3] = {s0, s1, s2};                                          \
    const F len[3] = {(F)l0, (F)l1, (F)l2}, r2 = (F)r2d;                                              \
    const F near[3] = {(F)(l0 / 4), (F)(l1 / 4), (F)(l2 / 4)};                                         \
    int64_t w = at;                                                                                   \
    if (d == 2) { EXPAND_LOOP(F, I, ROUND, 2) }                                                       \
    else if (d == 3) { EXPAND_LOOP(F, I, ROUND, 3) }                                                  \
    else { EXPAND_LOOP(F, I, ROUND, d) }                                                              \
    return w - at;                                                                                    \
}

/* The exported kernel: the search's fields unpacked into the loop's arguments. */
#define EXPAND(NAME, F, I, ROUND)                                                                     \
EXPAND_BODY(NAME##_loop, F, I, ROUND)                                                                 \
int64_t NAME(const agentsim_radius_search *search, int64_t a, int64_t b, int64_t at) {                \
    return NAME##_loop(search->d, (const F *)search->cols[0], (const F *)search->cols[1],              \
                       (const F *)search->cols[2], (const F *)search->scols[0],                        \
                       (const F *)search->scols[1], (const F *)search->scols[2],                       \
                       (const I *)search->order, search->lengths[0], search->lengths[1],               \
                       search->lengths[2], search->periodic, search->r2, search->include_self,          \
                       (const I *)search->start, (const I *)search->cnt, search->n_seg,                \
                       search->n_targets, search->t0, a, b, at, (I *)search->out_i,                    \
                       (I *)search->out_j, (F *)search->delta, search->cap, (F *)search->dist2);       \
}
EXPAND(agentsim_expand32_i32, float, int32_t, nearbyintf)
EXPAND(agentsim_expand32_i64, float, int64_t, nearbyintf)
EXPAND(agentsim_expand64_i32, double, int32_t, nearbyint)
EXPAND(agentsim_expand64_i64, double, int64_t, nearbyint)

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

