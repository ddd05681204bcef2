"""Fused GPU kernels for neighbor interactions (optional: the ``gpu`` extra, Triton).

:func:`agentsim.neighbor_reduce` in a continuous :class:`~agentsim.space.continuous.Box` runs
as one Triton kernel per call on a CUDA device when Triton is installed and the pair rule
translates (:mod:`.rule`): each target walks its neighbor cells in the canonical order and
adds its pairs' messages in registers, with no pair list, and gets the same bits as the torch
path on the CPU. Anything else runs through the torch ops, as before: the torch path stays the
reference, and :func:`status` says which path a call takes and why.

``AGENTSIM_FUSED`` chooses: ``auto`` (default: the kernel on CUDA where it applies), ``never``,
or ``always`` (also on the CPU, through Triton's interpreter when ``TRITON_INTERPRET=1``: how
the kernels are tested on a machine without a GPU).
"""

from __future__ import annotations

import os
from typing import Any

__all__ = ["available", "mode", "status"]

MODES = ("auto", "never", "always")
_last: dict[str, str] = {}


def mode() -> str:
    """``AGENTSIM_FUSED``: ``auto``, ``never`` or ``always`` (ValueError naming the choices otherwise)."""
    got = os.environ.get("AGENTSIM_FUSED", "auto").strip().lower() or "auto"
    if got not in MODES:
        raise ValueError(f"AGENTSIM_FUSED={got!r}: expected one of {', '.join(MODES)}")
    return got


def available() -> bool:
    """Whether Triton can be imported (the ``gpu`` extra; CUDA builds of torch ship it)."""
    try:
        import triton  # noqa: F401
    except Exception:
        return False
    return True


def wanted(device: Any) -> bool:
    """Whether a call on ``device`` should try the fused kernel."""
    chosen = mode()
    if chosen == "never":
        return False
    if chosen == "always":
        return available() and (getattr(device, "type", "cpu") == "cuda" or os.environ.get("TRITON_INTERPRET") == "1")
    return getattr(device, "type", "cpu") == "cuda" and available()


def note(path: str) -> None:
    """Record which path the last neighbor reduction took (``fused`` or the reason it did not)."""
    _last["path"] = path


def status() -> str:
    """The path the last continuous :func:`~agentsim.neighbor_reduce` took: ``"fused"``, or
    ``"torch: <reason>"`` (``""`` before any).
    """
    return _last.get("path", "")
