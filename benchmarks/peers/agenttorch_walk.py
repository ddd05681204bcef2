"""AgentTorch side of the random-walk suite (run by bench_peers.py in AgentTorch's own venv): prints one JSON line.

agentsim's ``randomwalk`` at its defaults (density 1, step_size 1, no drift) as an AgentTorch 0.6.0 model:
``n`` walkers, float32 positions uniform in a periodic square of side ``sqrt(n)``; each step every
walker moves by ``N(0, I)`` and wraps into the box (``remainder``, a tiny negative coordinate that
rounds to the side set to 0, as agentsim's ``Box.wrap``); the unwrapped displacement is kept in
``disp``. In AgentTorch terms: one agent type ``walker`` (properties ``position``, ``disp``; the
position made by a registered initialization helper), an environment variable ``side``, and one
substep ``Move`` with no observation, a policy ``gaussian_step`` (draws the step; its ``step_size``
is a fixed argument) and a transition ``move`` (returns the new ``position`` and ``disp``), all
registered in AgentTorch's ``Registry`` and run by its ``Runner`` (``runner.init()``, then
``runner.step(1)`` per step, as its predator-prey example does). The config is the plain dict that
``read_config`` makes of a YAML file, built here in Python; device CPU (torch's default dtype,
float32). AgentTorch has no metric facility, so agentsim's per-step mean squared displacement is not
computed here. The Runner keeps a CPU copy of the whole state after every substep
(``state_trajectory``) and its controller clones the state before each transition: memory grows by
about one state (16 bytes per walker) per step, reported as ``rss_growth_bytes_per_step``. Random
numbers come from ``torch.manual_seed(seed)``. ``init_seconds`` builds the config and the Runner and
runs ``runner.init()``; ``seconds_per_step`` is the median of the timed steps after one untimed
warm-up step.
"""

import importlib.metadata
import json
import math
import os
import resource
import statistics
import sys
import time

import torch
from agent_torch.core import Registry, Runner
from agent_torch.core.helpers import get_by_path
from agent_torch.core.substep import SubstepAction, SubstepTransition


def _var(state, path):
    return get_by_path(state, path.split("/"))


@Registry.register_helper("uniform_box", "initialization")
def uniform_box(shape, params):
    """Positions uniform in [0, side)^2."""
    side = params["side"]
    r = torch.remainder(torch.rand(shape) * side, side)
    return r.masked_fill_(r >= side, 0.0)


@Registry.register_substep("gaussian_step", "policy")
class GaussianStep(SubstepAction):
    def forward(self, state, observation):
        pos = _var(state, self.input_variables["position"])
        return {self.output_variables[0]: torch.randn(pos.shape).mul_(self.args["step_size"])}


@Registry.register_substep("move", "transition")
class Move(SubstepTransition):
    def forward(self, state, action):
        iv = self.input_variables
        pos, disp, side = (_var(state, iv[k]) for k in ("position", "disp", "side"))
        delta = action["walker"]["delta"]
        new = torch.remainder(pos + delta, side)
        return {"position": new.masked_fill_(new >= side, 0.0), "disp": disp + delta}


def _value(name, shape, value):
    return {"name": name, "learnable": False, "shape": shape, "dtype": "float", "value": value,
            "initialization_function": None}


def config(n: int, side: float, step_size: float = 1.0) -> dict:
    """The model's config, as ``read_config`` would return it from YAML."""
    position = {"name": "Position", "learnable": False, "shape": [n, 2], "dtype": "float",
                "initialization_function": {"generator": "uniform_box",
                                            "arguments": {"side": _value("Side", [1], side)}}}
    walker = "agents/walker/"
    return {
        "simulation_metadata": {"device": "cpu", "calibration": False, "num_episodes": 1,
                                "num_steps_per_episode": 1, "num_substeps_per_step": 1},
        "state": {
            "environment": {"side": _value("Box side", [1], side)},
            "agents": {"walker": {"number": n, "properties": {"position": position,
                                                              "disp": _value("Displacement", [n, 2], 0.0)}}},
            "objects": None,
            "network": None,
        },
        "substeps": {"0": {
            "name": "Move", "description": "Gaussian step, wrapped into the periodic box",
            "active_agents": ["walker"],
            "observation": {"walker": None},
            "policy": {"walker": {"gaussian_step": {
                "generator": "GaussianStep", "arguments": {"step_size": _value("Step size", [1], step_size)},
                "input_variables": {"position": walker + "position"}, "output_variables": ["delta"]}}},
            "transition": {"move": {
                "generator": "Move", "arguments": None,
                "input_variables": {"position": walker + "position", "disp": walker + "disp",
                                    "side": "environment/side"},
                "output_variables": ["position", "disp"]}},
        }},
    }


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


n, steps, seed = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
torch.manual_seed(seed)
t0 = time.perf_counter()
runner = Runner(config(n, math.sqrt(n / 1.0)), Registry())
runner.init()
init_seconds = time.perf_counter() - t0
runner.step(1)  # warm-up
rss0 = rss()
times = []
for _ in range(steps):
    t = time.perf_counter()
    runner.step(1)
    times.append(time.perf_counter() - t)
print(json.dumps({"peer": "agenttorch", "version": importlib.metadata.version("agent-torch"), "agents": n,
                  "init_seconds": init_seconds, "seconds_per_step": statistics.median(times), "steps": steps,
                  "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                  "rss_growth_bytes_per_step": (rss() - rss0) / steps}))
