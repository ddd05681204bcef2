"""Define a model in a few lines: a population, one substep, parameters, metrics.

    python examples/custom_model.py

Walkers on a ring take Gaussian steps; the metric is the mean squared displacement.
"""

from __future__ import annotations

import torch

from agentsim import FieldSpec, InitContext, Model, Param, ParamSpec, Population, Registry, Simulation, State
from agentsim.space.continuous import Box

registry = Registry()


@registry.substep(reads=["walker.pos", "walker.disp"], writes=["walker.pos", "walker.disp"])
def move(ctx):
    """Gaussian step of standard deviation sigma, wrapped into the periodic box."""
    w = ctx["walker"]
    step = ctx.params["sigma"] * ctx.rng.normal(w["uid"], "move", draws=2, dtype=torch.float32)
    w["disp"] = w["disp"] + step
    w["pos"] = ctx.space.wrap(w["pos"] + step)


def init(ic: InitContext):
    uid = torch.arange(ic.n_agents)
    pos = ic.rng.uniform(uid, 0, "init", draws=2, dtype=torch.float32) * 100
    spec = {"pos": FieldSpec(torch.float32, (2,)), "disp": FieldSpec(torch.float32, (2,))}
    walkers = Population("walker", spec, {"uid": uid, "pos": pos, "disp": torch.zeros(ic.n_agents, 2)})
    return State({"walker": walkers}), Box((100.0, 100.0))


def metrics(mc):
    d = mc.state["walker"]["disp"].double()
    return {"sum_sq_disp": (d * d).sum(-1)}  # per-agent values; the engine sums them exactly


model = Model("walk", registry, ["move"], ParamSpec({"sigma": Param(1.0, float, "step std (length units)")}),
              init, metrics, derive=lambda m: {"msd": m["sum_sq_disp"] / m["n_walker"]})

if __name__ == "__main__":
    result = Simulation(model.configure(params={"sigma": 0.5}), agents=1000, seed=1).run(20)
    print(model.plan())
    print("MSD after 20 steps:", round(float(result.metrics["msd"][-1]), 3), "(expected 2 * 0.5**2 * 20 = 10)")
