/* agentsim's native CPU kernels: every function the Python side calls (through ctypes; no Python
   C API), by domain. Each kernel gives the bits of the torch ops it replaces (see
   agentsim/_native/kernels.py and rng.py for the reference ops and the conditions of each call).

   One prototype per function: tests/test_native_build.py parses this file and checks it against
   the bindings table of agentsim/_native/library.py (names, argument types, result types, source
   files), so a change here must be made there too. Conventions: n, m = counts of entries;
   pointers are to contiguous arrays (tensors' data); int64_t results that report a bad entry are
   0 (all good) or 1 + the position of the first bad one. */
#ifndef AGENTSIM_KERNELS_H
#define AGENTSIM_KERNELS_H

#include <stdint.h>

/* ---------------------------------------------------------------- library (library.c) */
/* "sources=<sha256 of the sources, 16 hex> flags=<...> cpu=<16 hex or portable>": what this library was
   built from, compared at load time with the installed sources and this machine. */
const char *agentsim_build_info(void);

/* ---------------------------------------------------------------- counter-based draws (rng.c) */
/* out[i * d + j] = draw j of id ids[i]: key = mix(ids[i] * golden + salt), bits = mix(key ^ salts[j]);
   bits: the raw int64; uniform64: a 53-bit uniform in [0, 1); uniform32: a 24-bit one. */
void agentsim_bits(const int64_t *ids, int64_t n, uint64_t golden, uint64_t salt, const uint64_t *salts,
                   int64_t d, int64_t *out);
void agentsim_uniform64(const int64_t *ids, int64_t n, uint64_t golden, uint64_t salt, const uint64_t *salts,
                        int64_t d, double *out);
void agentsim_uniform32(const int64_t *ids, int64_t n, uint64_t golden, uint64_t salt, const uint64_t *salts,
                        int64_t d, float *out);
/* integers in [0, high): min(floor(u * high), high - 1) of the 53-bit uniform u */
void agentsim_integers(const int64_t *ids, int64_t n, uint64_t golden, uint64_t salt, const uint64_t *salts,
                       int64_t d, int64_t *out, int64_t high);
/* d normals per id from Box-Muller pairs of raw draws (salts[2 p], salts[2 p + 1]); paired (0 or 1):
   both outputs of each transform; first (0 or 1): skip the first output; scale ([1]) and shift ([d]):
   z * scale + shift, or both NULL for standard normals. */
void agentsim_normal64(const int64_t *ids, int64_t n, uint64_t golden, uint64_t salt, const uint64_t *salts,
                       int64_t d, double *out, int64_t paired, int64_t first, const double *scale,
                       const double *shift);
void agentsim_normal32(const int64_t *ids, int64_t n, uint64_t golden, uint64_t salt, const uint64_t *salts,
                       int64_t d, float *out, int64_t paired, int64_t first, const double *scale,
                       const double *shift);

/* ---------------------------------------------------------------- graphs (graph.c) */
/* counts[v] += 1 for every neighbor v of every node of nodes[m] in the CSR (indptr, indices) */
int64_t agentsim_push_count(const int64_t *indptr, const int32_t *indices, int64_t n_nodes,
                            const int64_t *nodes, int64_t m, int32_t *counts);
/* the CSR of an undirected graph from pair chunks: count, (the caller's cumsum), place, sort rows, compact */
void agentsim_csr_count(const int64_t *u, const int64_t *v, int64_t stride, int64_t m, int64_t *counts);
void agentsim_csr_place(const int64_t *u, const int64_t *v, int64_t stride, int64_t m, int64_t *rows,
                        int32_t *indices);
void agentsim_csr_sort_rows(const int64_t *rows, int64_t r0, int64_t r1, int32_t *indices, int32_t *lengths);
void agentsim_csr_compact(int64_t *rows, int64_t n, int32_t *indices, const int32_t *lengths);
/* a group field's co-member lists: its memberships group by group (a counting sort), then each agent's
   group-mates (GroupIndex.co_members); and the push of integer values along such lists */
void agentsim_group_members(const int32_t *of, int64_t m, int64_t groups, int64_t *cursor, int64_t k,
                            int32_t *order);
void agentsim_co_member_degrees(const int64_t *start, int64_t groups, const int32_t *order, int64_t *degree);
void agentsim_co_member_place(const int64_t *start, int64_t groups, const int32_t *order, int64_t *rows,
                              int32_t *indices);
int64_t agentsim_push_changes(const int64_t *indptr, const int32_t *indices, int64_t n_nodes,
                              const int64_t *old_nodes, const int64_t *old_values, int64_t m_old,
                              const int64_t *new_nodes, const int64_t *new_values, int64_t m_new,
                              const int64_t *self_count, int64_t *scratch, int64_t *out);
void agentsim_keep_only(int64_t *out, const int64_t *src, const uint8_t *only, int64_t n);
void agentsim_scaled_total(double *out, const int64_t *const *srcs, const double *scales, int64_t k,
                           const uint8_t *only, int64_t n);

/* ---------------------------------------------------------------- grids (grid.c) */
/* out[b, i, j] = sum_k x[b, (i + dr[k]) mod h, (j + dc[k]) mod w] for the rows r0 <= b * h + i < r1 */
void agentsim_grid_sum64(const int64_t *x, int64_t r0, int64_t r1, int64_t h, int64_t w,
                         const int64_t *dr, const int64_t *dc, int64_t k, int64_t *out);

/* ---------------------------------------------------------------- continuous space (continuous.c) */
/* pos = wrap(pos + delta) in a periodic box of sides lengths[d], pos and delta [n, d], in place */
void agentsim_add_wrap32(float *pos, const float *delta, int64_t n, int64_t d, const double *lengths);
void agentsim_add_wrap64(double *pos, const double *delta, int64_t n, int64_t d, const double *lengths);

/* A radius search's block of targets and its candidates (what agentsim_expand* filters); the
   pointers' element types are the float type F (float or double: the columns, delta, dist2) and
   the index type I (int32_t or int64_t: order, start, cnt, out_i, out_j) named by the function. */
typedef struct agentsim_radius_search {
    int64_t d;                /* dims, 1 to 3 */
    const void *cols[3];      /* F [n]: the positions' columns in row order (unused dims: NULL) */
    const void *scols[3];     /* F [E]: the sorted source entries' columns */
    const void *order;        /* I [E]: the row of each sorted entry */
    double lengths[3];        /* the box's side per dim (unused dims: 1) */
    int64_t periodic;         /* 1: minimum image */
    double r2;                /* squared radius (compared as F) */
    int64_t include_self;     /* 1: keep the pairs (row, row) */
    const void *start;        /* I [n_seg, n_targets]: each target's segments: first sorted entry */
    const void *cnt;          /* I [n_seg, n_targets]: and length */
    int64_t n_seg, n_targets;
    int64_t t0;               /* row of target 0 */
    void *out_i, *out_j;      /* I [cap]: target and source rows of the kept pairs */
    void *delta;              /* F [d, cap]: their displacements (source minus target) */
    int64_t cap;              /* slots of out_i, out_j, dist2 and of each row of delta */
    void *dist2;              /* F [cap]: their squared lengths */
} agentsim_radius_search;
/* the pairs within the radius of targets a <= t < b, written from slot at on; returns how many */
int64_t agentsim_expand32_i32(const agentsim_radius_search *search, int64_t a, int64_t b, int64_t at);
int64_t agentsim_expand32_i64(const agentsim_radius_search *search, int64_t a, int64_t b, int64_t at);
int64_t agentsim_expand64_i32(const agentsim_radius_search *search, int64_t a, int64_t b, int64_t at);
int64_t agentsim_expand64_i64(const agentsim_radius_search *search, int64_t a, int64_t b, int64_t at);
/* entries sorted by (cell, uid) (uid may be NULL: by cell, stably) and the cell table; -1: no memory */
int64_t agentsim_cell_sort_i32(const int32_t *cell, int64_t n, const int64_t *uid, int64_t n_cells,
                               int32_t *table, int64_t *perm);
int64_t agentsim_cell_sort_i64(const int64_t *cell, int64_t n, const int64_t *uid, int64_t n_cells,
                               int64_t *table, int64_t *perm);
/* memmove(base + dst, base + src, n) */
void agentsim_move_bytes(char *base, int64_t dst, int64_t src, int64_t n);

/* ---------------------------------------------------------------- tensor ops (ops.c) */
/* out[i] = x[i, 0]^2 + ... + x[i, k - 1]^2 in double, x [n, k] */
void agentsim_sq_norm32(const float *x, int64_t n, int64_t k, double *out);
void agentsim_sq_norm64(const double *x, int64_t n, int64_t k, double *out);
/* 1 if x[i] == i for every i < n, else 0 */
int64_t agentsim_is_iota(const int64_t *x, int64_t n);
/* outs[c][index[p]] += srcs[c][p] for p < m, for each column c < k (1 <= k <= 8) */
int64_t agentsim_add_columns32_i32(int64_t k, float *const *outs, int64_t n_out, const int32_t *index,
                                   const float *const *srcs, int64_t m);
int64_t agentsim_add_columns32_i64(int64_t k, float *const *outs, int64_t n_out, const int64_t *index,
                                   const float *const *srcs, int64_t m);
int64_t agentsim_add_columns64_i32(int64_t k, double *const *outs, int64_t n_out, const int32_t *index,
                                   const double *const *srcs, int64_t m);
int64_t agentsim_add_columns64_i64(int64_t k, double *const *outs, int64_t n_out, const int64_t *index,
                                   const double *const *srcs, int64_t m);
/* exp of x [n] as agentsim.core.portable.exp, consts = [lo, hi, log2(e), ln2_hi, ln2_lo, 1 / j! for j <= top] */
void agentsim_exp32(const float *x, int64_t n, const float *consts, int64_t top, float *out);
void agentsim_exp64(const double *x, int64_t n, const double *consts, int64_t top, double *out);
/* out[i] = sum over c < k, in order, of tables[c][numbers[c][rows[i]]] (rows NULL: first + i), sizes[c]
   the entries of tables[c], n those of each numbers[c]; tables[c] float64, or int64 where scales is not
   NULL and scales[c] is not NaN: then its entry times scales[c] (each rounded in float64); numbers[c]
   NULL: the row itself (a table of n entries) */
int64_t agentsim_gather_sum_i32(int64_t k, const void *const *tables, const double *scales, const int64_t *sizes,
                                const int32_t *const *numbers, int64_t n, const int64_t *rows, int64_t first,
                                int64_t m, double *out);
int64_t agentsim_gather_sum_i64(int64_t k, const void *const *tables, const double *scales, const int64_t *sizes,
                                const int64_t *const *numbers, int64_t n, const int64_t *rows, int64_t first,
                                int64_t m, double *out);
/* group ids in [lo, top] (negative: none) numbered by a bitmap: mark their bits (bit id - lo); of[i] =
   the distinct ids below field[i] (none for a negative id), ranks[w] the set bits before word w */
int64_t agentsim_ids_i32_mark(const int32_t *field, int64_t n, int64_t lo, int64_t top, uint64_t *bits);
int64_t agentsim_ids_i64_mark(const int64_t *field, int64_t n, int64_t lo, int64_t top, uint64_t *bits);
void agentsim_ids_i32_number(const int32_t *field, int64_t n, int64_t lo, const uint64_t *bits,
                             const int64_t *ranks, int64_t none, int32_t *of);
void agentsim_ids_i64_number(const int64_t *field, int64_t n, int64_t lo, const uint64_t *bits,
                             const int64_t *ranks, int64_t none, int32_t *of);
int64_t agentsim_bitmap_ranks(const uint64_t *bits, int64_t words, int64_t *ranks);
void agentsim_bitmap_list(const uint64_t *bits, int64_t words, int64_t *out);
/* selection: the True entries of a bool mask (their count, then their positions from first on, a piece of
   the rows at a time), and where x holds one of values[0, k) */
int64_t agentsim_count_true(const uint8_t *mask, int64_t n);
void agentsim_true_positions(const uint8_t *mask, int64_t n, int64_t first, int64_t count, int64_t *out);
void agentsim_equal_any_i8(const int8_t *x, int64_t n, const int8_t *values, int64_t k, uint8_t *out);
void agentsim_equal_any_i16(const int16_t *x, int64_t n, const int16_t *values, int64_t k, uint8_t *out);
void agentsim_equal_any_i32(const int32_t *x, int64_t n, const int32_t *values, int64_t k, uint8_t *out);
void agentsim_equal_any_i64(const int64_t *x, int64_t n, const int64_t *values, int64_t k, uint8_t *out);
void agentsim_equal_any_u8(const uint8_t *x, int64_t n, const uint8_t *values, int64_t k, uint8_t *out);
void agentsim_equal_any_f32(const float *x, int64_t n, const float *values, int64_t k, uint8_t *out);
void agentsim_equal_any_f64(const double *x, int64_t n, const double *values, int64_t k, uint8_t *out);

/* ---------------------------------------------------------------- exact metric sums (metrics.c) */
/* the wrapping int64 sum of nearbyint(x[i] * scale), scale a power of two; range[0] = 1 if some
   x[i] is NaN or |x[i]| >= limit, range[1] = the sum of floor(|x[i]|) */
int64_t agentsim_fixed_sum_checked32(const float *x, int64_t n, double scale, double limit, double *range);
int64_t agentsim_fixed_sum_checked64(const double *x, int64_t n, double scale, double limit, double *range);
/* the same of the rows' squared norms in double, x [n, k] */
int64_t agentsim_sq_norm_fixed_sum32(const float *x, int64_t n, int64_t k, double scale);
int64_t agentsim_sq_norm_fixed_sum64(const double *x, int64_t n, int64_t k, double scale);

#endif
