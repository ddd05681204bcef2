"""Nagel-Schreckenberg traffic on a ring road: the same rules as ``traffic.py`` in plain NumPy
(one process, ``numpy.random.default_rng(seed)``: the same dynamics statistically, not the same
bits).

Cars are kept in ring order (sorted by position at the start; nobody overtakes), so the car
ahead of car ``i`` is car ``i + 1`` (wrapping) and ``gap = (x[i+1] - x[i] - 1) mod length``.
Each step: ``v = min(v + 1, vmax)``, ``v = min(v, gap)``, ``v -= 1`` with probability
``p_slow`` if ``v > 0``, ``x = (x + v) mod length``. Units: cells and steps.
"""

from __future__ import annotations

import numpy as np

DEFAULTS = dict(agents=200_000, length=1_000_000, vmax=5, p_slow=0.3)


def run(steps: int, seed: int, **sizes) -> dict:
    p = {**DEFAULTS, **sizes}
    n, length, vmax = p["agents"], p["length"], p["vmax"]
    rng = np.random.default_rng(seed)
    x = np.sort(rng.choice(length, n, replace=False))  # distinct cells, in ring order
    v = np.zeros(n, dtype=np.int64)
    speed = [0.0]
    for _ in range(steps):
        gap = (np.roll(x, -1) - x - 1) % length
        v = np.minimum(np.minimum(v + 1, vmax), gap)
        v -= (v > 0) & (rng.random(n) < p["p_slow"])
        x = (x + v) % length  # order kept: the ring just turns
        speed.append(v.mean())
    return {"speed": np.array(speed)}
