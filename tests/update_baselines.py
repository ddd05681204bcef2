"""Refresh the golden baselines of the reference models: ``python tests/update_baselines.py``.

Review the diff of ``tests/baselines/models.json`` before committing: a change means
a model's results changed.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agentsim import Simulation, get_model
from agentsim.core.catalog import BUILTIN

PATH = Path(__file__).parent / "baselines" / "models.json"
CONFIG = {"agents": 600, "steps": 12, "seed": 7}
AGENTS = {"wolfsheep": 300, "covid": 5000}


def compute() -> dict[str, dict[str, list]]:
    out = {}
    for name in BUILTIN:
        sim = Simulation(get_model(name), agents=AGENTS.get(name, CONFIG["agents"]), seed=CONFIG["seed"])
        res = sim.run(CONFIG["steps"])
        out[name] = {k: v.tolist() for k, v in res.metrics.items()}
    return out


if __name__ == "__main__":
    PATH.parent.mkdir(exist_ok=True)
    PATH.write_text(json.dumps({"config": CONFIG, "agents": AGENTS, "metrics": compute()}, indent=1) + "\n")
    print(f"wrote {PATH}")
