"""One-pass counter-based draws: a C kernel (``src/rng.c``) with an eager torch fallback.

:class:`agentsim.core.random.CounterRNG` evaluated with torch ops makes a dozen passes over int64
columns per draw (the SplitMix64 steps, then the float transform). This module fuses a whole draw
(hash the id into its key, hash in the step and draw index, turn the bits into a uniform or a
normal) into one loop written in C, part of the kernel library of :mod:`agentsim._native.build`
(built at install, or on first use into a cache), loaded with :mod:`ctypes` and run on
``torch.get_num_threads()`` threads (the call releases the GIL). The transform's constants below
are the C kernel's too, through the generated header ``src/rng_constants.h``
(:func:`constants_header`).

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
import os

import numpy as np
import torch
from torch import Tensor

from agentsim._native import build as native
from agentsim._native.bindings import Library


def as_int64(c: int) -> int:
    """A uint64 constant written as the int64 with the same bits (torch has no uint64 ops)."""
    c &= (1 << 64) - 1
    return c - (1 << 64) if c >= (1 << 63) else c

__all__ = ["box_muller", "constants_header", "kernel", "kernel_status"]

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
CONSTANTS_HEADER = "rng_constants.h"  # in agentsim/_native/src, generated by constants_header()


def constants_header() -> str:
    """The text of ``src/rng_constants.h``: the transform's constants above as C (hex floats,
    exact). Generated once and committed; ``tests/test_native_build.py`` checks that the file is
    this text, so a change of a constant here must regenerate it
    (``python -c "from agentsim._native import rng; print(rng.constants_header(), end='')"
    > agentsim/_native/src/rng_constants.h``).
    """
    lines = ["/* The Box-Muller transform's constants (agentsim/_native/rng.py), generated by",
             "   agentsim._native.rng.constants_header(); do not edit: tests/test_native_build.py checks that this",
             "   file is what that function writes. */",
             "#ifndef AGENTSIM_RNG_CONSTANTS_H", "#define AGENTSIM_RNG_CONSTANTS_H", "",
             f"#define AGENTSIM_SQRT_HALF {SQRT_HALF.hex()}",
             f"#define AGENTSIM_LN2_HI {LN2_HI.hex()}",
             f"#define AGENTSIM_LN2_LO {LN2_LO.hex()}"]
    for name, values in (("LOG_Q", LOG_Q), ("COS_C", COS_C), ("SIN_C", SIN_C)):
        lines += ["", f"#define AGENTSIM_{name}_LEN {len(values)}",
                  f"static const double AGENTSIM_{name}[AGENTSIM_{name}_LEN] = {{"]
        lines += [f"    {v.hex()}," for v in values]
        lines.append("};")
    lines += ["", "#endif", ""]
    return "\n".join(lines)


_FUNCTIONS = {"bits": (torch.int64, "agentsim_bits"), "uniform64": (torch.float64, "agentsim_uniform64"),
              "uniform32": (torch.float32, "agentsim_uniform32"), "normal64": (torch.float64, "agentsim_normal64"),
              "normal32": (torch.float32, "agentsim_normal32"), "integers": (torch.int64, "agentsim_integers")}
MAX_DRAWS = 256  # raw draws per id the kernel takes in one call (more: the eager path)
_PARALLEL_MIN = 1 << 15  # ids per call below which one thread runs it (a thread pool call costs ~50 us)


class Kernel:
    """The draws of the kernel library (``src/rng.c``): ``run(name, ids, golden, salt, salts, d)``
    fills a new ``[n, d]`` tensor.
    """

    def __init__(self, library: Library) -> None:
        self.path = library.path
        self.library = library
        self._functions = {name: library[symbol] for name, (_, symbol) in _FUNCTIONS.items()}

    def run(self, name: str, ids: Tensor, golden: int, salt: int, salts: list[int], d: int,
            *extra: int | list[float] | None, shape: tuple[int, ...] | None = None) -> Tensor:
        """Draws for contiguous CPU int64 ``ids`` ``[n]``: a ``[n, d]`` tensor of the function's dtype
        (``extra``: ``integers``' upper bound ``high``; the normals' ``paired`` (1: both outputs of
        each transform), ``first`` (1: skip the first cosine output), ``[scale]`` and ``[shift per
        draw]`` lists, or None, None for standard normals), or of ``shape`` (``n * d`` values: the
        same rows, in the caller's shape).
        ``salts``: one per raw draw (normals: two per Box-Muller pair).
        """
        dtype, _ = _FUNCTIONS[name]
        n = ids.numel()
        out = torch.empty((n, d) if shape is None else shape, dtype=dtype)
        salt_array = (ctypes.c_uint64 * len(salts))(*(s & 0xFFFFFFFFFFFFFFFF for s in salts))
        args = [(ctypes.c_double * len(x))(*x) if isinstance(x, list) else x for x in extra]  # alive during the call
        fn = self._functions[name]
        g, s = golden & 0xFFFFFFFFFFFFFFFF, salt & 0xFFFFFFFFFFFFFFFF
        ids_ptr, out_ptr, out_item = ids.data_ptr(), out.data_ptr(), out.element_size() * d
        native.parallel_for(n, _PARALLEL_MIN, lambda a, b: fn(ids_ptr + 8 * a, b - a, g, s, salt_array, d,
                                                              out_ptr + out_item * a, *args))
        return out


_bound: Kernel | None = None


def kernel_status() -> str:
    """``"kernel: PATH"`` when the compiled kernel is in use, else why the eager path is used."""
    if os.environ.get("AGENTSIM_RNG_KERNEL", "1") == "0":
        return "eager: disabled by AGENTSIM_RNG_KERNEL=0"
    k = kernel()
    if k is not None:
        return f"kernel: {k.path}"
    status = native.library_status(load=False)
    return f"eager: {status.detail}" if status.state != "not loaded" else "eager"


def kernel() -> Kernel | None:
    """The draws of the kernel library; None where they are switched off (``AGENTSIM_RNG_KERNEL=0``,
    ``AGENTSIM_KERNELS=0``) or there is no library (no C compiler, a failed build: warned once, and
    the eager path gives the same bits).
    """
    global _bound
    if os.environ.get("AGENTSIM_RNG_KERNEL", "1") == "0":
        return None
    library = native.library()
    if library is None:
        return None
    if _bound is None or _bound.library is not library:
        _bound = Kernel(library)
    return _bound
