"""One-pass counter-based draws: a small C kernel compiled on first use, with an eager fallback.

:class:`agentsim.core.random.CounterRNG` evaluated with torch ops makes a dozen passes over int64
columns per draw (the SplitMix64 steps, then the float transform). This module fuses a whole draw
(hash the id into its key, hash in the step and draw index, turn the bits into a uniform or a
normal) into one loop written in C, compiled on first use by :mod:`agentsim._native.build` (the system
C compiler; the library is cached under ``~/.cache/agentsim/kernels``), loaded with :mod:`ctypes`
and run on ``torch.get_num_threads()`` threads (the call releases the GIL).

**The same bits on either path.** Integer hashing is exact in both. The normal transform
(Box-Muller) is defined here with IEEE-754 operations that are correctly rounded
(``+ - * /``, ``sqrt``, exact exponent extraction) evaluated in a fixed order: ``log`` and
``cos`` are this module's own polynomials (:func:`box_muller`), not the C library's or
ATen's (which differ from each other in the last bit), and ``sqrt`` is IEEE's. The kernel is
compiled with ``-ffp-contract=off`` (no fused multiply-adds), so the kernel, the eager torch evaluation, CPU
and CUDA all give the same bits, and a machine without a compiler gives the same trajectory,
only slower. ``tests/test_random.py`` checks kernel == eager bit for bit.

With ``CounterRNG.normal(..., paired=True)`` both outputs of each transform are used (``r cos``,
``r sin``: two independent normals from two uniforms), so a pair of normals costs one logarithm,
one square root and two hashes; the default stream uses the cosine output only.

Accuracy: the normals differ from the textbook ``sqrt(-2 log1p(-u1)) cos(2 pi u2)`` (and ``sin``)
evaluated with ATen's functions by less than 1e-14 in absolute value (tested on 1M draws).

Set ``AGENTSIM_RNG_KERNEL=0`` to use the eager path (for A/B measurements).
"""

from __future__ import annotations

import ctypes
import math
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from agentsim._native import build as native


def as_int64(c: int) -> int:
    """A uint64 constant written as the int64 with the same bits (torch has no uint64 ops)."""
    c &= (1 << 64) - 1
    return c - (1 << 64) if c >= (1 << 63) else c

__all__ = ["box_muller", "kernel", "kernel_status"]

# ---------------------------------------------------------------- the transform's constants
LN2_HI = 6.93147180369123816490e-01  # fdlibm's split of ln 2: LN2_HI * e is exact for |e| < 2**20
LN2_LO = 1.90821492927058770002e-10
SQRT_HALF = math.sqrt(0.5)
# log(m) = s * (2 + z * Q(z)) with s = (m - 1) / (m + 1), z = s * s <= 0.0295, Q(z) = sum 2 z^k / (2k + 3)
LOG_Q = tuple(2.0 / (2 * k + 3) for k in range(11))
# cos(pi/2 f) and sin(pi/2 f) for |f| <= 1/2 as polynomials in w = f * f (Taylor; error < 1e-17)
COS_C = tuple((-1) ** k * (math.pi / 2) ** (2 * k) / math.factorial(2 * k) for k in range(11))
SIN_C = tuple((-1) ** k * (math.pi / 2) ** (2 * k + 1) / math.factorial(2 * k + 1) for k in range(11))


def _horner(coefficients: tuple[float, ...], w: Tensor) -> Tensor:
    """``sum c_k w^k`` by Horner's rule, each ``*`` and ``+`` rounded on its own (as the kernel)."""
    p = w * coefficients[-1]
    p.add_(coefficients[-2])
    for c in reversed(coefficients[:-2]):
        p.mul_(w).add_(c)
    return p


def _sqrt(x: Tensor) -> Tensor:
    """Correctly rounded square root: ATen's float64 ``sqrt`` on the CPU is not (it differs from
    IEEE ``sqrt`` in the last bit for about 1% of inputs), NumPy's and CUDA's are.
    """
    if x.device.type == "cpu":
        return torch.from_numpy(np.sqrt(x.detach().numpy()))
    return torch.sqrt(x)


_EAGER_CHUNK = 1 << 16  # elements per pass on the CPU: the temporaries stay in cache


def box_muller(u1: Tensor, u2: Tensor) -> Tensor:
    """Both outputs of Box-Muller, ``r cos(2 pi u2)`` and ``r sin(2 pi u2)`` with
    ``r = sqrt(-2 log(1 - u1))`` (two independent standard normals), in correctly rounded float64
    operations.

    Args:
        u1, u2: float64 uniforms in ``[0, 1)`` (multiples of 2**-53), shape ``[...]``.

    Returns:
        float64 ``[..., 2]``: the cosine output, then the sine output. The kernel computes the same bits.
    """
    if u1.device.type != "cpu" or u1.numel() <= _EAGER_CHUNK:
        return _box_muller(u1, u2)
    a, b = u1.reshape(-1), u2.reshape(-1)
    out = torch.empty((a.numel(), 2), dtype=torch.float64)
    for i in range(0, a.numel(), _EAGER_CHUNK):
        out[i:i + _EAGER_CHUNK] = _box_muller(a[i:i + _EAGER_CHUNK], b[i:i + _EAGER_CHUNK])
    return out.reshape(*u1.shape, 2)


def _box_muller(u1: Tensor, u2: Tensor) -> Tensor:
    x = 1.0 - u1  # exact: in [2**-53, 1]
    m, e = torch.frexp(x)  # x = m * 2**e, m in [0.5, 1) (exact)
    low = m < SQRT_HALF
    m = torch.where(low, m * 2.0, m)
    e = (e - low.to(e.dtype)).to(torch.float64)
    s = (m - 1.0) / (m + 1.0)
    z = s * s
    log_m = s * (z * _horner(LOG_Q, z) + 2.0)
    log_x = e * LN2_HI + (e * LN2_LO + log_m)
    r = _sqrt(log_x * -2.0)
    t = u2 * 4.0  # exact; the angle is (pi / 2) * t
    q = torch.floor(t)
    f = t - q  # exact, in [0, 1)
    up = f > 0.5
    f = torch.where(up, f - 1.0, f)  # exact, in [-1/2, 1/2]
    quadrant = (q + up.to(torch.float64)).to(torch.int64) & 3
    w = f * f
    c = _horner(COS_C, w)
    s_ = f * _horner(SIN_C, w)
    # the angle is (pi / 2) (quadrant + f): rotate (cos, sin) of (pi / 2) f by quadrant quarter turns
    cos = torch.where(quadrant == 0, c, torch.where(quadrant == 1, -s_, torch.where(quadrant == 2, -c, s_)))
    sin = torch.where(quadrant == 0, s_, torch.where(quadrant == 1, c, torch.where(quadrant == 2, -s_, -c)))
    return torch.stack((r * cos, r * sin), dim=-1)


# ---------------------------------------------------------------- the C kernel
def _c_array(name: str, values: tuple[float, ...]) -> str:
    return f"static const double {name}[{len(values)}] = {{{', '.join(v.hex() for v in values)}}};"


def _c_horner(name: str, n: int, var: str) -> str:
    expr = f"{name}[{n - 1}]"
    for k in range(n - 2, -1, -1):
        expr = f"({expr} * {var} + {name}[{k}])"
    return expr


_SOURCE = f"""
#include <stdint.h>
#include <string.h>
#include <math.h>

{_c_array("LOG_Q", LOG_Q)}
{_c_array("COS_C", COS_C)}
{_c_array("SIN_C", SIN_C)}

#define BLOCK 512

static inline uint64_t mix(uint64_t z) {{
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}}

static inline double as_double(uint64_t b) {{ double d; memcpy(&d, &b, 8); return d; }}
static inline uint64_t as_bits(double d) {{ uint64_t b; memcpy(&b, &d, 8); return b; }}

/* (double)(b >> 11) * 2**-53, exactly, without an int64 -> double conversion (none in AVX2) */
static inline double uniform53(uint64_t b) {{
    uint64_t v = b >> 11;
    double lo = as_double(0x4330000000000000ULL | (v & 0xFFFFFFFFFFFFFULL)) - 0x1p52;
    double hi = as_double(0x4330000000000000ULL | (v >> 52)) - 0x1p52;
    return (hi * 0x1p52 + lo) * 0x1p-53;
}}

/* z0[k], z1[k] = r cos(2 pi u2[k]), r sin(2 pi u2[k]) with r = sqrt(-2 log(1 - u1[k])): the operations
   of rng_kernel.box_muller */
static void box_muller(const double *u1, const double *u2, double *z0, double *z1, int64_t n) {{
    for (int64_t k = 0; k < n; k++) {{
        double x = 1.0 - u1[k];
        uint64_t xb = as_bits(x);
        double e = as_double(0x4330000000000000ULL | (xb >> 52)) - 0x1p52 - 1022.0;
        double m = as_double((xb & 0x000FFFFFFFFFFFFFULL) | 0x3FE0000000000000ULL);
        int low = m < {SQRT_HALF.hex()};
        m = low ? m * 2.0 : m;
        e = low ? e - 1.0 : e;
        double s = (m - 1.0) / (m + 1.0);
        double z = s * s;
        double log_m = s * (z * {_c_horner("LOG_Q", len(LOG_Q), "z")} + 2.0);
        double log_x = e * {LN2_HI.hex()} + (e * {LN2_LO.hex()} + log_m);
        double r = sqrt(log_x * -2.0);
        double t = u2[k] * 4.0;
        double q = floor(t);
        double f = t - q;
        int up = f > 0.5;
        f = up ? f - 1.0 : f;
        double quadrant = up ? q + 1.0 : q;
        double w = f * f;
        double c = {_c_horner("COS_C", len(COS_C), "w")};
        double sn = f * {_c_horner("SIN_C", len(SIN_C), "w")};
        double cs = quadrant == 1.0 ? -sn : quadrant == 2.0 ? -c : quadrant == 3.0 ? sn : c;
        double ss = quadrant == 1.0 ? c : quadrant == 2.0 ? -sn : quadrant == 3.0 ? -c : sn;
        z0[k] = r * cs;
        z1[k] = r * ss;
    }}
}}

/* Every function fills out[i * d + j] (the j-th draw of ids[i]) BLOCK ids at a time: the ids'
   keys, key = mix(id * golden + salt), first, then one draw for the whole block after another, in
   loops the compiler vectorizes. */
#define KEYS(i0, m) \
    uint64_t key[BLOCK]; \
    for (int64_t i = 0; i < m; i++) key[i] = mix((uint64_t)ids[i0 + i] * golden + salt);

/* NAME(ids, n, golden, salt, salts, d, out): out[i * d + j] = VALUE(mix(key[i] ^ salts[j])) */
#define DRAWS(NAME, TYPE, VALUE) \
void NAME(const int64_t *ids, int64_t n, uint64_t golden, uint64_t salt, \
          const uint64_t *salts, int64_t d, TYPE *out) {{ \
    for (int64_t i0 = 0; i0 < n; i0 += BLOCK) {{ \
        int64_t m = n - i0 < BLOCK ? n - i0 : BLOCK; \
        KEYS(i0, m) \
        for (int64_t j = 0; j < d; j++) \
            for (int64_t i = 0; i < m; i++) out[(i0 + i) * d + j] = VALUE(mix(key[i] ^ salts[j])); \
    }} \
}}

static inline int64_t raw64(uint64_t b) {{ return (int64_t)b; }}
/* a 24-bit integer: exact in float */
static inline float uniform24(uint64_t b) {{ return (float)(int32_t)(b >> 40) * 0x1p-24f; }}

/* agentsim_integers: out[i * d + j] = min(floor(u * high), high - 1) for the 53-bit uniform u of
   draw j (CounterRNG.integers with an int high, in one pass) */
void agentsim_integers(const int64_t *ids, int64_t n, uint64_t golden, uint64_t salt,
                       const uint64_t *salts, int64_t d, int64_t *out, int64_t high) {{
    double h = (double)high;
    for (int64_t i0 = 0; i0 < n; i0 += BLOCK) {{
        int64_t m = n - i0 < BLOCK ? n - i0 : BLOCK;
        KEYS(i0, m)
        for (int64_t j = 0; j < d; j++) {{
            if (high <= (1LL << 52)) {{
                /* floor(u * h) < 2**52: its integer is the low bits of floor(u * h) + 2**52 (exact),
                   a conversion AVX2 vectorizes (it has no double -> int64 instruction) */
                for (int64_t i = 0; i < m; i++) {{
                    double f = floor(uniform53(mix(key[i] ^ salts[j])) * h);
                    int64_t x = (int64_t)(as_bits(f + 0x1p52) & 0xFFFFFFFFFFFFFULL);
                    out[(i0 + i) * d + j] = x < high - 1 ? x : high - 1;
                }}
            }} else {{
                for (int64_t i = 0; i < m; i++) {{
                    int64_t x = (int64_t)floor(uniform53(mix(key[i] ^ salts[j])) * h);
                    out[(i0 + i) * d + j] = x < high - 1 ? x : high - 1;
                }}
            }}
        }}
    }}
}}

DRAWS(agentsim_bits, int64_t, raw64)
DRAWS(agentsim_uniform64, double, uniform53)
DRAWS(agentsim_uniform32, float, uniform24)

/* column j of out[m, d] (rows i0 ..) = z, or z * scale[0] + shift[j] with both operations rounded in
   the output's type (as torch's mul_, add_) */
static void store(const double *z, int64_t i0, int64_t m, int64_t d, int64_t j, double *out64, float *out32,
                  const double *scale, const double *shift) {{
    if (out64 && scale) {{
        double a = scale[0], b = shift[j];
        for (int64_t i = 0; i < m; i++) out64[(i0 + i) * d + j] = z[i] * a + b;
    }} else if (out64) {{
        for (int64_t i = 0; i < m; i++) out64[(i0 + i) * d + j] = z[i];
    }} else if (scale) {{
        float a = (float)scale[0], b = (float)shift[j];
        for (int64_t i = 0; i < m; i++) out32[(i0 + i) * d + j] = (float)z[i] * a + b;
    }} else {{
        for (int64_t i = 0; i < m; i++) out32[(i0 + i) * d + j] = (float)z[i];
    }}
}}

/* d normals per id; transform p is made from raw draws (salts[2 p], salts[2 p + 1]). Unpaired: out
   column j is transform j's cosine output. Paired: transform p gives normals 2 p (cosine) and
   2 p + 1 (sine), and out column j is normal j + first (first = 1: a call that starts at an odd
   draw skips the first cosine). */
static void normals(const int64_t *ids, int64_t n, uint64_t golden, uint64_t salt, const uint64_t *salts,
                    int64_t d, double *out64, float *out32, int64_t paired, int64_t first,
                    const double *scale, const double *shift) {{
    double u1[BLOCK], u2[BLOCK], z[2][BLOCK];
    int64_t transforms = paired ? (first + d + 1) / 2 : d;
    for (int64_t i0 = 0; i0 < n; i0 += BLOCK) {{
        int64_t m = n - i0 < BLOCK ? n - i0 : BLOCK;
        KEYS(i0, m)
        for (int64_t p = 0; p < transforms; p++) {{
            for (int64_t i = 0; i < m; i++) {{
                u1[i] = uniform53(mix(key[i] ^ salts[2 * p]));
                u2[i] = uniform53(mix(key[i] ^ salts[2 * p + 1]));
            }}
            box_muller(u1, u2, z[0], z[1], m);
            if (!paired) {{
                store(z[0], i0, m, d, p, out64, out32, scale, shift);
                continue;
            }}
            for (int64_t w = 0; w < 2; w++) {{
                int64_t j = 2 * p + w - first;
                if (j >= 0 && j < d) store(z[w], i0, m, d, j, out64, out32, scale, shift);
            }}
        }}
    }}
}}

void agentsim_normal64(const int64_t *ids, int64_t n, uint64_t golden, uint64_t salt, const uint64_t *salts,
                       int64_t d, double *out, int64_t paired, int64_t first, const double *scale,
                       const double *shift) {{
    normals(ids, n, golden, salt, salts, d, out, 0, paired, first, scale, shift);
}}

void agentsim_normal32(const int64_t *ids, int64_t n, uint64_t golden, uint64_t salt, const uint64_t *salts,
                       int64_t d, float *out, int64_t paired, int64_t first, const double *scale,
                       const double *shift) {{
    normals(ids, n, golden, salt, salts, d, 0, out, paired, first, scale, shift);
}}
"""

_FUNCTIONS = {"bits": (torch.int64, "agentsim_bits"), "uniform64": (torch.float64, "agentsim_uniform64"),
              "uniform32": (torch.float32, "agentsim_uniform32"), "normal64": (torch.float64, "agentsim_normal64"),
              "normal32": (torch.float32, "agentsim_normal32"), "integers": (torch.int64, "agentsim_integers")}
_EXTRA: dict[str, list[type]] = {"integers": [ctypes.c_int64],  # high
                                 # paired (0 or 1), first (0 or 1), scale, shift (NULL: standard)
                                 "normal64": [ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p],
                                 "normal32": [ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p]}
MAX_DRAWS = 256  # raw draws per id the kernel takes in one call (more: the eager path)
_PARALLEL_MIN = 1 << 15  # ids per call below which one thread runs it (a thread pool call costs ~50 us)


class Kernel:
    """The loaded library: ``run(name, ids, golden, salt, salts, d)`` fills a new ``[n, d]`` tensor."""

    def __init__(self, library: ctypes.CDLL, path: Path) -> None:
        self.path = path
        self._functions = {}
        for name, (_, symbol) in _FUNCTIONS.items():
            fn = getattr(library, symbol)
            fn.restype = None
            fn.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_void_p,
                           ctypes.c_int64, ctypes.c_void_p, *_EXTRA.get(name, [])]
            self._functions[name] = fn

    def run(self, name: str, ids: Tensor, golden: int, salt: int, salts: list[int], d: int,
            *extra: int | list[float] | None) -> Tensor:
        """Draws for contiguous CPU int64 ``ids`` ``[n]``: a ``[n, d]`` tensor of the function's dtype
        (``extra``: ``integers``' upper bound ``high``; the normals' ``paired`` (1: both outputs of
        each transform), ``first`` (1: skip the first cosine output), ``[scale]`` and ``[shift per
        draw]`` lists, or None, None for standard normals).
        ``salts``: one per raw draw (normals: two per Box-Muller pair).
        """
        dtype, _ = _FUNCTIONS[name]
        n = ids.numel()
        out = torch.empty((n, d), dtype=dtype)
        salt_array = (ctypes.c_uint64 * len(salts))(*(s & 0xFFFFFFFFFFFFFFFF for s in salts))
        args = [(ctypes.c_double * len(x))(*x) if isinstance(x, list) else x for x in extra]  # alive during the call
        fn = self._functions[name]
        g, s = golden & 0xFFFFFFFFFFFFFFFF, salt & 0xFFFFFFFFFFFFFFFF
        ids_ptr, out_ptr, out_item = ids.data_ptr(), out.data_ptr(), out.element_size() * d
        native.parallel_for(n, _PARALLEL_MIN, lambda a, b: fn(ids_ptr + 8 * a, b - a, g, s, salt_array, d,
                                                              out_ptr + out_item * a, *args))
        return out


def kernel_status() -> str:
    """``"kernel: PATH"`` when the compiled kernel is in use, else why the eager path is used."""
    k = kernel()
    return f"kernel: {k.path}" if k is not None else (native.status("counter_rng") or "eager")


def kernel() -> Kernel | None:
    """The compiled kernel, built on first use; None where it is disabled or cannot be built
    (no C compiler, a failed build: warned once, and the eager path gives the same bits).
    """
    return native.load("counter_rng", _SOURCE, Kernel, switch="AGENTSIM_RNG_KERNEL", what="random-number kernel")
