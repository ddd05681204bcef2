"""Bacteria chasing a diffusing attractant on a grid torus: the same rules as ``bacteria.py``
in plain NumPy (one process, ``numpy.random.default_rng(seed)``; another random stream, so the
same dynamics statistically, not the same bits).

Each step: diffuse (``A += rate * (N + S + E + W - 4 A) + source``, torus), move each bacterium
to one of its 4 von Neumann neighbours or stay (5 equal choices), eat (the ``k`` bacteria of a
cell take ``min(k * ration, A)`` together, ``1/k`` each), pay ``cost``, divide above
``divide_at`` (half the energy each), die at energy <= 0.
"""

from __future__ import annotations

import numpy as np

DEFAULTS = dict(agents=200_000, height=500, width=500, rate=0.1, source=0.01, initial=1.0,
                ration=0.05, cost=0.02, divide_at=2.0)
DR = np.array([0, -1, 1, 0, 0])
DC = np.array([0, 0, 0, -1, 1])


def run(steps: int, seed: int, **sizes) -> dict:
    p = {**DEFAULTS, **sizes}
    h, w = p["height"], p["width"]
    rng = np.random.default_rng(seed)
    row = rng.integers(0, h, p["agents"])
    col = rng.integers(0, w, p["agents"])
    energy = 0.5 + rng.random(p["agents"])
    a = np.full((h, w), float(p["initial"]))
    count, total = [len(row)], [a.sum()]
    for _ in range(steps):
        around = np.roll(a, 1, 0) + np.roll(a, -1, 0) + np.roll(a, 1, 1) + np.roll(a, -1, 1)
        a += p["rate"] * (around - 4.0 * a) + p["source"]
        d = rng.integers(0, 5, len(row))
        row = (row + DR[d]) % h
        col = (col + DC[d]) % w
        cell = row * w + col
        flat = a.reshape(-1)
        k = np.bincount(cell, minlength=h * w)
        want = p["ration"] * k
        taken = np.minimum(want, flat)
        flat -= taken
        energy += taken[cell] / k[cell] - p["cost"]
        divides = energy > p["divide_at"]
        energy[divides] /= 2
        keep = energy > 0
        row = np.concatenate([row[keep], row[divides]])
        col = np.concatenate([col[keep], col[divides]])
        energy = np.concatenate([energy[keep], energy[divides]])
        count.append(len(row))
        total.append(a.sum())
    return {"count": np.array(count), "attractant": np.array(total)}
