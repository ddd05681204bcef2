"""matplotlib for agentsim's figures (:mod:`agentsim.plot`, training curves, calibration fits)."""

from __future__ import annotations

import sys
from types import ModuleType

__all__ = ["pyplot"]


def pyplot() -> ModuleType:
    """``matplotlib.pyplot``, drawing off-screen (Agg) unless the program already uses pyplot.

    A script or the command line draws to files without a display; a notebook or an interactive
    session that imported pyplot keeps its own backend, so its later inline figures still show.
    """
    import matplotlib

    if "matplotlib.pyplot" not in sys.modules:
        matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
