/* Tensor-op kernels (agentsim/_native/kernels.py: squared_norm, is_iota, add_columns; used by
   agentsim.core.ops): the same correctly rounded operations as torch's, in the same order. */
#include <math.h>
#include <string.h>

#include "agentsim_kernels.h"

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

/* 1 if x[i] == i for every i < n, else 0 (stops at the first difference) */
int64_t agentsim_is_iota(const int64_t *x, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        if (x[i] != i) return 0;
    return 1;
}

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


/* exp(x) as agentsim.core.portable.exp computes it, operation by operation (each correctly
   rounded, no fused multiply-adds): consts = [lo, hi, log2(e), ln2_hi, ln2_lo, 1 / 0!, ..., 1 / top!]
   in F (as torch converts those Python floats); x clamped to [lo, hi], k = floor(c * log2(e) + 0.5),
   r = (c - k * ln2_hi) - k * ln2_lo, the Taylor polynomial to r**top / top! by Horner's rule, times
   2**k made from its bits; 0 below lo, inf above hi, NaN for NaN. */
#define EXP(NAME, F, BITS_T, BIAS, MANTISSA, FLOOR, TOP)                                             \
void NAME(const F *x, int64_t n, const F *consts, int64_t top, F *out) {                             \
    if (top != TOP) return; /* the wrapper passes TOP; the loop is unrolled for it */                \
    const F lo = consts[0], hi = consts[1], log2e = consts[2], ln2_hi = consts[3], ln2_lo = consts[4]; \
    F coef[TOP + 1];                                                                                 \
    for (int j = 0; j <= TOP; j++) coef[j] = consts[5 + j];                                          \
    for (int64_t i = 0; i < n; i++) { /* no branches: the compiler vectorizes it */                 \
        const F v = x[i];                                                                            \
        const F c = v < lo ? lo : (v > hi ? hi : v);  /* NaN stays NaN */                            \
        const F k = FLOOR(c * log2e + (F)0.5);                                                       \
        F r = c - k * ln2_hi;                                                                        \
        r = r - k * ln2_lo;                                                                          \
        F p = coef[TOP];                                                                             \
        for (int j = TOP - 1; j >= 0; j--) { p = p * r; p = p + coef[j]; }                           \
        const BITS_T kb = (BITS_T)(c == c ? k : (F)0); /* (int)NaN is undefined */                   \
        BITS_T bits = (BITS_T)((kb + BIAS) << MANTISSA);                                             \
        F scale;                                                                                     \
        memcpy(&scale, &bits, sizeof scale);                                                         \
        const F e = p * scale;                                                                       \
        out[i] = v < lo ? (F)0 : (v > hi ? (F)INFINITY : e);                                         \
    }                                                                                                \
}
EXP(agentsim_exp64, double, int64_t, 1023, 52, floor, 13)
EXP(agentsim_exp32, float, int32_t, 127, 23, floorf, 8)

/* out[i] = ((0 + t_0[g_0[r]]) + t_1[g_1[r]]) + ... over the k columns in order, r = rows[i] (or
   first + i when rows is NULL): a sum over an agent's groups of a per-group value, the bits of adding the
   columns' gathers one after another in float64. 0, or 1 + the first i whose row is outside [0, n) or
   at which a group number is outside its table (out is then partly written). */
#define GATHER_SUM(NAME, I)                                                                           \
int64_t NAME(int64_t k, const void *const *tables, const double *scales, const int64_t *sizes,        \
             const I *const *numbers, int64_t n, const int64_t *rows, int64_t first, int64_t m,       \
             double *out) {                                                                           \
    for (int64_t i = 0; i < m; i++) {                                                                 \
        const int64_t r = rows ? rows[i] : first + i;                                                 \
        if ((uint64_t)r >= (uint64_t)n) return i + 1;                                                 \
        double s = 0.0;                                                                               \
        for (int64_t c = 0; c < k; c++) {                                                             \
            const int64_t g = numbers[c] ? (int64_t)numbers[c][r] : r;                                \
            if ((uint64_t)g >= (uint64_t)sizes[c]) return i + 1;                                      \
            if (scales && scales[c] == scales[c])                                                     \
                s = s + (double)((const int64_t *)tables[c])[g] * scales[c];                          \
            else                                                                                      \
                s = s + ((const double *)tables[c])[g];                                               \
        }                                                                                             \
        out[i] = s;                                                                                   \
    }                                                                                                 \
    return 0;                                                                                         \
}
GATHER_SUM(agentsim_gather_sum_i32, int32_t)
GATHER_SUM(agentsim_gather_sum_i64, int64_t)

/* Dense numbering of group ids by a bitmap (agentsim.core.groups): ids in [lo, top], negative for
   no group. mark: sets bit v - lo of bits for every id v >= 0 (bits zeroed by the caller); 0, or 1 +
   the first i whose id is outside [lo, top]. number: of[i] = the number of distinct ids below
   field[i] (ranks[w]: the set bits in the words before w), none for a negative id. */
#define NUMBER_IDS(MARK, NUMBER, I)                                                                         \
int64_t MARK(const I *field, int64_t n, int64_t lo, int64_t top, uint64_t *bits) {                      \
    for (int64_t i = 0; i < n; i++) {                                                                 \
        const int64_t id = (int64_t)field[i];                                                         \
        if (id < 0) continue;                                                                         \
        if (id < lo || id > top) return i + 1;                                                        \
        const int64_t v = id - lo;                                                                    \
        bits[v >> 6] |= (uint64_t)1 << (v & 63);                                                      \
    }                                                                                                 \
    return 0;                                                                                         \
}                                                                                                     \
void NUMBER(const I *field, int64_t n, int64_t lo, const uint64_t *bits, const int64_t *ranks,          \
            int64_t none, int32_t *of) {                                                              \
    for (int64_t i = 0; i < n; i++) {                                                                 \
        const int64_t id = (int64_t)field[i];                                                         \
        if (id < 0) { of[i] = (int32_t)none; continue; }                                              \
        const int64_t v = id - lo;                                                                    \
        const uint64_t below = bits[v >> 6] & (((uint64_t)1 << (v & 63)) - 1);                        \
        of[i] = (int32_t)(ranks[v >> 6] + __builtin_popcountll(below));                               \
    }                                                                                                 \
}
NUMBER_IDS(agentsim_ids_i32_mark, agentsim_ids_i32_number, int32_t)
NUMBER_IDS(agentsim_ids_i64_mark, agentsim_ids_i64_number, int64_t)

/* ranks[w] = the set bits of bits[0 .. w - 1], for w < words; the total */
int64_t agentsim_bitmap_ranks(const uint64_t *bits, int64_t words, int64_t *ranks) {
    int64_t total = 0;
    for (int64_t w = 0; w < words; w++) {
        ranks[w] = total;
        total += __builtin_popcountll(bits[w]);
    }
    return total;
}

/* out[k] = the position of the k-th set bit of bits (ascending) */
void agentsim_bitmap_list(const uint64_t *bits, int64_t words, int64_t *out) {
    int64_t k = 0;
    for (int64_t w = 0; w < words; w++) {
        uint64_t word = bits[w];
        while (word) {
            out[k++] = w * 64 + __builtin_ctzll(word);
            word &= word - 1;
        }
    }
}

/* Selection (agentsim.core.ops.flatnonzero and equal on the CPU, a piece of the rows per thread). */

/* How many of the bytes mask[0, n) are nonzero (a bool tensor's True entries). */
int64_t agentsim_count_true(const uint8_t *mask, int64_t n) {
    int64_t count = 0;
    for (int64_t i = 0; i < n; i++) count += mask[i] != 0;
    return count;
}

/* out[0, count) = the positions first + i of the nonzero bytes mask[i], i < n, ascending, where
   count = agentsim_count_true(mask, n); nothing is written at out[count] or after (the next
   piece's part of a shared out): the loop stops at the last nonzero byte. Each row up to it
   writes out[j] and steps j past it where mask[i] is nonzero, with no branch on the mask (at an
   epidemic's peak a mask is as often True as not); 64 rows that are all zero are skipped (a
   sparse mask). */
void agentsim_true_positions(const uint8_t *mask, int64_t n, int64_t first, int64_t count, int64_t *out) {
    int64_t last = count > 0 ? n - 1 : -1;
    while (last >= 0 && mask[last] == 0) last--;  /* there is one where count > 0 */
    int64_t i = 0, j = 0;
    for (; i + 64 <= last; i += 64) {
        uint64_t any = 0;
        for (int w = 0; w < 8; w++) { uint64_t word; memcpy(&word, mask + i + 8 * w, 8); any |= word; }
        if (any == 0) continue;
        for (int64_t r = i; r < i + 64; r++) { out[j] = first + r; j += mask[r] != 0; }
    }
    for (; i <= last; i++) { out[j] = first + i; j += mask[i] != 0; }
}

/* out[i] = 1 if x[i] equals one of values[0, k), else 0 (k >= 1; a value is compared in x's type,
   as NumPy and torch compare a tensor with a number of its kind: NaN equals nothing, -0.0 equals
   0.0). One pass for up to three values, the common case (a state that is one of I, A, H). */
#define EQUAL_ANY(NAME, T)                                                                           \
void NAME(const T *x, int64_t n, const T *values, int64_t k, uint8_t *out) {                         \
    const T a = values[0], b = values[k > 1 ? 1 : 0], c = values[k > 2 ? 2 : 0];                     \
    if (k <= 3) {                                                                                    \
        for (int64_t i = 0; i < n; i++) out[i] = (uint8_t)((x[i] == a) | (x[i] == b) | (x[i] == c)); \
        return;                                                                                      \
    }                                                                                                \
    for (int64_t i = 0; i < n; i++) {                                                                \
        uint8_t hit = 0;                                                                             \
        for (int64_t v = 0; v < k; v++) hit |= (uint8_t)(x[i] == values[v]);                        \
        out[i] = hit;                                                                                \
    }                                                                                                \
}
EQUAL_ANY(agentsim_equal_any_i8, int8_t)
EQUAL_ANY(agentsim_equal_any_i16, int16_t)
EQUAL_ANY(agentsim_equal_any_i32, int32_t)
EQUAL_ANY(agentsim_equal_any_i64, int64_t)
EQUAL_ANY(agentsim_equal_any_u8, uint8_t)
EQUAL_ANY(agentsim_equal_any_f32, float)
EQUAL_ANY(agentsim_equal_any_f64, double)
