/* Exact metric sums (agentsim/_native/kernels.py: fixed_sum_checked, squared_norm_fixed_sum; used by
   agentsim.core.metrics): fixed-point sums in wrapping int64, the bits of the torch ops on any
   split over threads. */
#include <math.h>

#include "agentsim_kernels.h"
#include "common.h"

/* The wrapping sum of (int64) nearbyint(x[i] * scale), as torch's int64 sum of
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
/* FIXED_SUM_CHECKED(NAME, T): the fixed-point sum of x [n] (FIXED_BLOCKS), and what a metric's sum
   needs checked about the values
   (agentsim.core.metrics: _range_entries): range[0] = 1 if some x[i] is NaN or |x[i]| >= limit
   (else 0), range[1] = the sum of floor(|x[i]|) in double (exact, in any order, below 2**53). */
#define FIXED_SUM_CHECKED(NAME, T) \
int64_t NAME(const T *x, int64_t n, double scale, double limit, double *range) { \
    int bad = 0; \
    double floors = 0.0; \
    for (int64_t i = 0; i < n; i++) { \
        const double v = (double)x[i]; \
        bad |= !(v > -limit && v < limit); \
        floors += floor(fabs(v)); \
    } \
    range[0] = bad ? 1.0 : 0.0; \
    range[1] = floors; \
    FIXED_BLOCKS((double)x[i]) \
}
FIXED_SUM_CHECKED(agentsim_fixed_sum_checked64, double)
FIXED_SUM_CHECKED(agentsim_fixed_sum_checked32, float)

/* SQ_NORM_FIXED_SUM(NAME, T): the fixed-point sum (FIXED_BLOCKS) of the SQ_NORM column of x [n, k]
   without the column: the wrapping sum of (int64) nearbyint(s[i] * scale), s[i] = x[i, 0]^2 + x[i, 1]^2 + ... in double
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

