"""Metapopulation SEIR: the same rules as ``metapop.py`` in plain NumPy (one process,
``numpy.random.default_rng(seed)``: the same dynamics statistically, not the same bits).

Each day: each person is in their home city, or with probability ``p_travel`` in a uniformly
random other city; per city ``force = beta * I_present / N_present`` (``np.bincount``);
S -> E with probability ``1 - exp(-force)``, E -> I with ``sigma``, I -> R with ``gamma``, all from
the state at the start of the day. ``seeds`` random people are infectious at day 0.
"""

from __future__ import annotations

import numpy as np

DEFAULTS = dict(agents=1_000_000, cities=1000, p_travel=0.05, beta=0.3, sigma=1 / 3, gamma=1 / 5, seeds=100)
S, E, I, R = 0, 1, 2, 3  # noqa: E741 (compartment codes)


def run(steps: int, seed: int, **sizes) -> dict:
    p = {**DEFAULTS, **sizes}
    n, c = p["agents"], p["cities"]
    rng = np.random.default_rng(seed)
    home = rng.integers(0, c, n)
    status = np.full(n, S, dtype=np.int8)
    status[rng.choice(n, p["seeds"], replace=False)] = I
    out = {k: [int((status == code).sum())] for k, code in zip("SEIR", (S, E, I, R), strict=True)}
    for _ in range(steps):
        away = rng.random(n) < p["p_travel"]
        loc = np.where(away, (home + 1 + rng.integers(0, c - 1, n)) % c, home)
        present = np.bincount(loc, minlength=c)
        infectious = np.bincount(loc, weights=status == I, minlength=c)
        force = p["beta"] * infectious / np.maximum(present, 1)
        u = rng.random(n)
        new = np.where((status == S) & (u < -np.expm1(-force[loc])), E, status)
        new = np.where((status == E) & (u < p["sigma"]), I, new)
        status = np.where((status == I) & (u < p["gamma"]), R, new).astype(np.int8)
        for k, code in zip("SEIR", (S, E, I, R), strict=True):
            out[k].append(int((status == code).sum()))
    return {k: np.array(v) for k, v in out.items()}
