/* Tensor-op kernels (agentsim/_native/kernels.py: squared_norm, is_iota, add_columns; used by
   agentsim.core.ops): the same correctly rounded operations as torch's, in the same order. */
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

