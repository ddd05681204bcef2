"""Golden baselines: each model's metric series must not change unnoticed.

Refresh with ``python tests/update_baselines.py`` and review the diff. Integer metrics
must match exactly; float metrics to 1e-6 relative (last-bit differences of
transcendental functions between CPUs must not fail the suite).
"""

import json

import numpy as np
import pytest
from update_baselines import PATH, compute

BASELINE = json.loads(PATH.read_text())


@pytest.fixture(scope="module")
def current():
    return compute()


@pytest.mark.parametrize("model", sorted(BASELINE["metrics"]))
def test_metrics_match_golden_baseline(model, current):
    want, got = BASELINE["metrics"][model], current[model]
    assert sorted(want) == sorted(got), "metric names changed: refresh the baseline if intended"
    for key in want:
        w, g = np.asarray(want[key]), np.asarray(got[key])
        if np.issubdtype(w.dtype, np.integer):
            assert np.array_equal(w, g), f"{model}.{key}"
        else:
            assert np.allclose(w, g, rtol=1e-6, atol=1e-9), f"{model}.{key}"
