"""Elementwise math with the same bits on every device: the CPU, CUDA, and agentsim's GPU kernels.

torch's CPU kernels and CUDA's math library compute ``sqrt``, ``sin``, ``cos`` and friends by
different algorithms: on the CPU ``torch.sqrt`` of float32 differs from the correctly rounded
square root in about one value in seven (by one unit in the last place), and ``torch.sin``
differs from CUDA's ``sinf`` likewise. A model that must give the same trajectory on a CPU and
on a GPU uses these functions instead, in its rules:

- :func:`sqrt`: the correctly rounded square root (IEEE 754), which the GPU computes natively
  and the CPU through NumPy's (hardware) square root;
- :func:`exp`: ``2**k * exp(r)`` with ``|r| <= ln(2) / 2`` by a Taylor polynomial, ``2**k`` made
  from its bits (within 2 units in the last place in float64 and float32);
- :func:`sin`, :func:`cos`: a fixed sequence of additions, multiplications and ``floor`` (a
  Cody-Waite range reduction and minimax polynomials), each operation correctly rounded on every
  device, so the result is the same everywhere. Float32: within 2 units in the last place of the
  true value for ``|x| < 2**15`` (accuracy, not reproducibility, degrades beyond).

Each is also what :mod:`agentsim.space.fused` (the GPU neighbor kernels) emits for it when a
pair rule calls it, so a rule gives the same bits through the torch ops and through a kernel.
Autograd flows through all three.

Examples:
    >>> import torch
    >>> from agentsim.core import portable
    >>> x = torch.tensor([0.0, 1.0, 2.0])
    >>> portable.sqrt(x).tolist()
    [0.0, 1.0, 1.4142135381698608]
    >>> [round(v, 6) for v in portable.sin(torch.tensor([0.0, 1.5707964, 3.0])).tolist()]
    [0.0, 1.0, 0.14112]
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor

from agentsim._native import kernels as cpu_kernels

__all__ = ["cos", "exp", "sin", "sqrt"]

# pi / 2 in three pieces (float32 Cody-Waite): n * _PIO2_HI is exact for |n| < 2**16.
_TWO_OVER_PI = 0.6366197723675814
_PIO2_HI = 1.5703125
_PIO2_MID = 4.837512969970703125e-4
_PIO2_LO = 7.54978995489188216e-8
# Minimax polynomials of sin and cos on [-pi/4, pi/4] (Cephes' sinf / cosf).
_S1, _S2, _S3 = -1.6666654611e-1, 8.3321608736e-3, -1.9515295891e-4
_C1, _C2, _C3 = 4.166664568298827e-2, -1.388731625493765e-3, 2.443315711809948e-5


def _exact_sqrt(x: Tensor) -> Tensor:
    """The traced stand-in of :func:`sqrt` (a rule traced for a GPU kernel calls this by name)."""
    return sqrt(x)


def sqrt(x: Tensor) -> Tensor:
    """The correctly rounded square root of ``x`` (any shape, float), the same bits on any device.

    Args:
        x: A float tensor (any shape).

    Returns:
        ``sqrt(x)``, the shape and dtype of ``x`` (NaN where ``x < 0``).
    """
    if isinstance(x, torch.fx.Proxy):  # a rule being traced for a GPU kernel
        return x.tracer.create_proxy("call_function", _exact_sqrt, (x,), {})
    if x.device.type != "cpu":
        return torch.sqrt(x)  # CUDA's sqrt (and torch's on it) is IEEE's, correctly rounded
    if x.requires_grad and torch.is_grad_enabled():
        # torch's float64 square root rounds to float32 correctly (53 >= 2 * 24 + 2 bits)
        return torch.sqrt(x.double()).to(x.dtype) if x.dtype == torch.float32 else torch.sqrt(x)
    with np.errstate(invalid="ignore"):
        return torch.from_numpy(np.sqrt(x.detach().numpy()))


def _quadrant_sin_cos(x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """``(q, s, c)``: ``x = n * pi / 2 + r`` with ``|r| <= pi / 4``, ``q = n mod 4`` (float), and
    ``sin(r)``, ``cos(r)``. Only additions, multiplications, ``floor`` and ``where``.
    """
    n = torch.floor(x * _TWO_OVER_PI + 0.5)
    r = x - n * _PIO2_HI
    r = r - n * _PIO2_MID
    r = r - n * _PIO2_LO
    q = n - torch.floor(n * 0.25) * 4.0
    r2 = r * r
    s = r + r * r2 * (_S1 + r2 * (_S2 + r2 * _S3))
    c = 1.0 - r2 * 0.5 + r2 * r2 * (_C1 + r2 * (_C2 + r2 * _C3))
    return q, s, c


def _by_quadrant(q: Tensor, s: Tensor, c: Tensor) -> Tensor:
    """``sin(n * pi / 2 + r)`` for ``q = n mod 4``, from ``s = sin(r)`` and ``c = cos(r)``."""
    return torch.where(q == 0.0, s, torch.where(q == 1.0, c, torch.where(q == 2.0, -s, -c)))


def sin(x: Tensor) -> Tensor:
    """``sin(x)`` (radians), the same bits on any device.

    Args:
        x: A float tensor (any shape; radians).

    Returns:
        ``sin(x)``, the shape and dtype of ``x``.
    """
    q, s, c = _quadrant_sin_cos(x)
    return _by_quadrant(q, s, c)


def cos(x: Tensor) -> Tensor:
    """``cos(x)`` (radians), the same bits on any device.

    Args:
        x: A float tensor (any shape; radians).

    Returns:
        ``cos(x)``, the shape and dtype of ``x``.
    """
    q, s, c = _quadrant_sin_cos(x)
    return _by_quadrant(q + 1.0 - torch.floor((q + 1.0) * 0.25) * 4.0, s, c)  # cos(x) = sin(x + pi / 2)


_LN2_HI, _LN2_LO = 0.693147180369123816490, 1.90821492927058770002e-10  # ln 2 in two pieces (fdlibm)
_LOG2_E = 1.4426950408889634


def exp(x: Tensor) -> Tensor:
    """``exp(x)``, the same bits on any device (float32 or float64; 0 below ``-700``, inf above 700).

    Args:
        x: A float tensor (any shape).

    Returns:
        ``exp(x)``, the shape and dtype of ``x``.
    """
    if x.dtype not in (torch.float32, torch.float64):
        raise TypeError(f"portable.exp: expected a float32 or float64 tensor (got {x.dtype})")
    wide = x.dtype == torch.float64
    lo = -700.0 if wide else -87.0
    hi = 700.0 if wide else 88.0
    hi_part, lo_part = (_LN2_HI, _LN2_LO) if wide else (0.693145751953125, 1.428606765330187e-06)
    top = 13 if wide else 8
    if isinstance(x, Tensor) and x.device.type == "cpu" and not (x.requires_grad and torch.is_grad_enabled()):
        consts = torch.tensor([lo, hi, _LOG2_E, hi_part, lo_part, *(1.0 / math.factorial(j) for j in range(top + 1))],
                              dtype=x.dtype)
        fused = cpu_kernels.exp(x.contiguous(), consts, top)  # the same operations in one pass
        if fused is not None:
            return fused.reshape(x.shape)
    c = torch.clamp(x, lo, hi)
    k = torch.floor(c * _LOG2_E + 0.5)
    r = c - k * hi_part  # exact: k * hi_part has few significant bits
    r = r - k * lo_part
    # Taylor series to r**13 / 13! in float64, r**8 / 8! in float32 (|r| <= 0.35), by Horner's rule
    # with the coefficients 1 / j! (each a correctly rounded constant), in place
    p = torch.full_like(r, 1.0 / math.factorial(top))
    for j in range(top - 1, -1, -1):
        p.mul_(r).add_(1.0 / math.factorial(j))
    bits, bias, mantissa = (torch.int64, 1023, 52) if wide else (torch.int32, 127, 23)
    scale = ((k.to(bits) + bias) << mantissa).view(x.dtype)  # 2**k, exactly
    out = p * scale
    return torch.where(x < lo, torch.zeros_like(out), torch.where(x > hi, torch.full_like(out, float("inf")), out))
