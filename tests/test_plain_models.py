"""The benchmark's plain user models (benchmarks/plain/, issue 52): each agentsim model runs the same
on 1 and 2 processes with every partitioner that applies (``agentsim check``), and its NumPy twin
returns the same summary series, close at the end (other random streams: statistically, not
bitwise).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from agentsim.cli.main import main

PLAIN = Path(__file__).resolve().parents[1] / "benchmarks" / "plain"
SMALL = {  # model: (agents, steps, parameters, series, relative tolerance at the last step)
    "bacteria": (4000, 30, {"height": 60, "width": 60}, "count", 0.1),
    "traffic": (3000, 30, {"length": 10_000}, "speed", 0.1),
    "metapop": (20_000, 30, {"cities": 20, "seeds": 200}, "R", 0.35),
}


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"plain_{name}", PLAIN / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", list(SMALL))
def test_a_plain_model_is_the_same_on_two_processes_and_close_to_its_numpy_twin(name, capsys):
    agents, steps, params, series, tolerance = SMALL[name]
    sets = [x for k, v in params.items() for x in ("--set", f"{k}={v}")]
    assert main(["check", f"{PLAIN / name}.py:MODEL", "--agents", str(agents), "--steps", "6",
                 "--world-sizes", "1,2", "--no-resume", *sets]) == 0, capsys.readouterr().err
    assert "identical" in capsys.readouterr().out
    ours = _load(name).run(steps, 1, agents=agents, **params)
    theirs = _load(f"{name}_numpy").run(steps, 1, agents=agents, **params)
    assert set(ours) == set(theirs)
    for key in ours:
        assert len(ours[key]) == len(theirs[key]) == steps + 1, key
    a, b = float(np.asarray(ours[series])[-1]), float(np.asarray(theirs[series])[-1])
    assert abs(a - b) <= tolerance * max(abs(a), abs(b)), (series, a, b)
