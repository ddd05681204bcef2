"""The "Writing a model" example of the README of release 0.1 (a3a3343), verbatim: the deprecated
positional Model / Registry / ParamSpec form. tests/test_legacy_api.py checks that it still runs,
with a DeprecationWarning, on 1-4 ranks and both partitioners, with the bits it had then."""

# ruff: noqa
import torch
from agentsim import FieldSpec, InitContext, Model, Param, ParamSpec, Population, Registry, Simulation, State
from agentsim.space.continuous import Box

registry = Registry()                      # one registry per model: no global names

@registry.substep(reads=["walker.pos"], writes=["walker.pos"])
def move(ctx):
    w = ctx["walker"]                      # checked view: undeclared reads/writes raise
    step = ctx.rng.normal(w["uid"], "move", draws=2, dtype=torch.float32)
    w["pos"] = ctx.space.wrap(w["pos"] + ctx.params["sigma"] * step)

def init(ic: InitContext):
    uid = torch.arange(ic.n_agents)
    pos = ic.rng.uniform(uid, 0, "init", draws=2, dtype=torch.float32) * 100
    walkers = Population("walker", {"pos": FieldSpec(torch.float32, (2,))}, {"uid": uid, "pos": pos})
    return State({"walker": walkers}), Box((100.0, 100.0))

model = Model("walk", registry, ["move"], ParamSpec({"sigma": Param(1.0, float, "step std")}), init)
