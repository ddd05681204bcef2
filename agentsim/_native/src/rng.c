/* Counter-based draws in one pass (agentsim/_native/rng.py; agentsim.core.random.CounterRNG):
   hash the id into its key, hash in the draw's salt, turn the bits into the value. Integer hashing
   is exact; the normal transform uses correctly rounded operations only, in the order of
   rng.box_muller's torch ops, with its own log and cos/sin polynomials (rng_constants.h), so both
   paths give the same bits (compiled without fused multiply-adds: -ffp-contract=off). */
#include <math.h>

#include "agentsim_kernels.h"
#include "common.h"
#include "rng_constants.h"

#define BLOCK 512

/* SplitMix64's finalizer */
static inline uint64_t mix(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

/* (double)(b >> 11) * 2**-53, exactly, without an int64 -> double conversion (none in AVX2) */
static inline double uniform53(uint64_t b) {
    uint64_t v = b >> 11;
    double lo = as_double(0x4330000000000000ULL | (v & 0xFFFFFFFFFFFFFULL)) - 0x1p52;
    double hi = as_double(0x4330000000000000ULL | (v >> 52)) - 0x1p52;
    return (hi * 0x1p52 + lo) * 0x1p-53;
}

/* sum c[k] w^k (k < n) by Horner's rule, each * and + rounded on its own (rng._horner) */
static inline double horner(const double *c, int n, double w) {
    double p = c[n - 1];
    for (int k = n - 2; k >= 0; k--) p = p * w + c[k];
    return p;
}

/* z0[k], z1[k] = r cos(2 pi u2[k]), r sin(2 pi u2[k]) with r = sqrt(-2 log(1 - u1[k])): the operations
   of rng.box_muller */
static void box_muller(const double *u1, const double *u2, double *z0, double *z1, int64_t n) {
    for (int64_t k = 0; k < n; k++) {
        double x = 1.0 - u1[k];
        uint64_t xb = as_bits(x);
        double e = as_double(0x4330000000000000ULL | (xb >> 52)) - 0x1p52 - 1022.0;
        double m = as_double((xb & 0x000FFFFFFFFFFFFFULL) | 0x3FE0000000000000ULL);
        int low = m < AGENTSIM_SQRT_HALF;
        m = low ? m * 2.0 : m;
        e = low ? e - 1.0 : e;
        double s = (m - 1.0) / (m + 1.0);
        double z = s * s;
        double log_m = s * (z * horner(AGENTSIM_LOG_Q, AGENTSIM_LOG_Q_LEN, z) + 2.0);
        double log_x = e * AGENTSIM_LN2_HI + (e * AGENTSIM_LN2_LO + log_m);
        double r = sqrt(log_x * -2.0);
        double t = u2[k] * 4.0;
        double q = floor(t);
        double f = t - q;
        int up = f > 0.5;
        f = up ? f - 1.0 : f;
        double quadrant = up ? q + 1.0 : q;
        double w = f * f;
        double c = horner(AGENTSIM_COS_C, AGENTSIM_COS_C_LEN, w);
        double sn = f * horner(AGENTSIM_SIN_C, AGENTSIM_SIN_C_LEN, w);
        double cs = quadrant == 1.0 ? -sn : quadrant == 2.0 ? -c : quadrant == 3.0 ? sn : c;
        double ss = quadrant == 1.0 ? c : quadrant == 2.0 ? -sn : quadrant == 3.0 ? -c : sn;
        z0[k] = r * cs;
        z1[k] = r * ss;
    }
}

/* Every function fills out[i * d + j] (the j-th draw of ids[i]) BLOCK ids at a time: the ids'
   keys, key = mix(id * golden + salt), first, then one draw for the whole block after another, in
   loops the compiler vectorizes. */
static inline void keys(const int64_t *ids, int64_t m, uint64_t golden, uint64_t salt, uint64_t *key) {
    for (int64_t i = 0; i < m; i++) key[i] = mix((uint64_t)ids[i] * golden + salt);
}

/* NAME(ids, n, golden, salt, salts, d, out): out[i * d + j] = VALUE(mix(key[i] ^ salts[j])) */
#define DRAWS(NAME, TYPE, VALUE)                                                                      \
    void NAME(const int64_t *ids, int64_t n, uint64_t golden, uint64_t salt, const uint64_t *salts,   \
              int64_t d, TYPE *out) {                                                                 \
        uint64_t key[BLOCK];                                                                          \
        for (int64_t i0 = 0; i0 < n; i0 += BLOCK) {                                                   \
            int64_t m = n - i0 < BLOCK ? n - i0 : BLOCK;                                              \
            keys(ids + i0, m, golden, salt, key);                                                     \
            for (int64_t j = 0; j < d; j++)                                                           \
                for (int64_t i = 0; i < m; i++) out[(i0 + i) * d + j] = VALUE(mix(key[i] ^ salts[j])); \
        }                                                                                             \
    }

static inline int64_t raw64(uint64_t b) { return (int64_t)b; }
/* a 24-bit integer: exact in float */
static inline float uniform24(uint64_t b) { return (float)(int32_t)(b >> 40) * 0x1p-24f; }

DRAWS(agentsim_bits, int64_t, raw64)
DRAWS(agentsim_uniform64, double, uniform53)
DRAWS(agentsim_uniform32, float, uniform24)

/* out[i * d + j] = min(floor(u * high), high - 1) for the 53-bit uniform u of draw j
   (CounterRNG.integers with an int high, in one pass) */
void agentsim_integers(const int64_t *ids, int64_t n, uint64_t golden, uint64_t salt, const uint64_t *salts,
                       int64_t d, int64_t *out, int64_t high) {
    double h = (double)high;
    uint64_t key[BLOCK];
    for (int64_t i0 = 0; i0 < n; i0 += BLOCK) {
        int64_t m = n - i0 < BLOCK ? n - i0 : BLOCK;
        keys(ids + i0, m, golden, salt, key);
        for (int64_t j = 0; j < d; j++) {
            if (high <= (1LL << 52)) {
                /* floor(u * h) < 2**52: its integer is the low bits of floor(u * h) + 2**52 (exact),
                   a conversion AVX2 vectorizes (it has no double -> int64 instruction) */
                for (int64_t i = 0; i < m; i++) {
                    double f = floor(uniform53(mix(key[i] ^ salts[j])) * h);
                    int64_t x = (int64_t)(as_bits(f + 0x1p52) & 0xFFFFFFFFFFFFFULL);
                    out[(i0 + i) * d + j] = x < high - 1 ? x : high - 1;
                }
            } else {
                for (int64_t i = 0; i < m; i++) {
                    int64_t x = (int64_t)floor(uniform53(mix(key[i] ^ salts[j])) * h);
                    out[(i0 + i) * d + j] = x < high - 1 ? x : high - 1;
                }
            }
        }
    }
}

/* column j of out[m, d] (rows i0 ..) = z, or z * scale[0] + shift[j] with both operations rounded in
   the output's type (as torch's mul_, add_) */
static void store(const double *z, int64_t i0, int64_t m, int64_t d, int64_t j, double *out64, float *out32,
                  const double *scale, const double *shift) {
    if (out64 && scale) {
        double a = scale[0], b = shift[j];
        for (int64_t i = 0; i < m; i++) out64[(i0 + i) * d + j] = z[i] * a + b;
    } else if (out64) {
        for (int64_t i = 0; i < m; i++) out64[(i0 + i) * d + j] = z[i];
    } else if (scale) {
        float a = (float)scale[0], b = (float)shift[j];
        for (int64_t i = 0; i < m; i++) out32[(i0 + i) * d + j] = (float)z[i] * a + b;
    } else {
        for (int64_t i = 0; i < m; i++) out32[(i0 + i) * d + j] = (float)z[i];
    }
}

/* d normals per id; transform p is made from raw draws (salts[2 p], salts[2 p + 1]). Unpaired: out
   column j is transform j's cosine output. Paired: transform p gives normals 2 p (cosine) and
   2 p + 1 (sine), and out column j is normal j + first (first = 1: a call that starts at an odd
   draw skips the first cosine). */
static void normals(const int64_t *ids, int64_t n, uint64_t golden, uint64_t salt, const uint64_t *salts,
                    int64_t d, double *out64, float *out32, int64_t paired, int64_t first,
                    const double *scale, const double *shift) {
    uint64_t key[BLOCK];
    double u1[BLOCK], u2[BLOCK], z[2][BLOCK];
    int64_t transforms = paired ? (first + d + 1) / 2 : d;
    for (int64_t i0 = 0; i0 < n; i0 += BLOCK) {
        int64_t m = n - i0 < BLOCK ? n - i0 : BLOCK;
        keys(ids + i0, m, golden, salt, key);
        for (int64_t p = 0; p < transforms; p++) {
            for (int64_t i = 0; i < m; i++) {
                u1[i] = uniform53(mix(key[i] ^ salts[2 * p]));
                u2[i] = uniform53(mix(key[i] ^ salts[2 * p + 1]));
            }
            box_muller(u1, u2, z[0], z[1], m);
            if (!paired) {
                store(z[0], i0, m, d, p, out64, out32, scale, shift);
                continue;
            }
            for (int64_t w = 0; w < 2; w++) {
                int64_t j = 2 * p + w - first;
                if (j >= 0 && j < d) store(z[w], i0, m, d, j, out64, out32, scale, shift);
            }
        }
    }
}

void agentsim_normal64(const int64_t *ids, int64_t n, uint64_t golden, uint64_t salt, const uint64_t *salts,
                       int64_t d, double *out, int64_t paired, int64_t first, const double *scale,
                       const double *shift) {
    normals(ids, n, golden, salt, salts, d, out, 0, paired, first, scale, shift);
}

void agentsim_normal32(const int64_t *ids, int64_t n, uint64_t golden, uint64_t salt, const uint64_t *salts,
                       int64_t d, float *out, int64_t paired, int64_t first, const double *scale,
                       const double *shift) {
    normals(ids, n, golden, salt, salts, d, 0, out, paired, first, scale, shift);
}
