"""The "Writing a model" example of the README of release 0.1 (a3a3343), ported to the 0.3 API as
CHANGELOG.md tells a user to port it: ``Registry`` -> ``@model.substep``, ``ParamSpec`` and
``Param(default, type, doc)`` -> ``params={...: Param(default, doc)}``, the positional ``Model``
-> ``Model(name, params=...)`` with ``@model.init``, and an init that adds its population with
``ic.add`` and returns the space (its draws from ``ic.rng``, a StepRNG at step 0 with the default
stream ``"init"``: the numbers the 0.1 init drew with ``rng.uniform(uid, 0, "init", ...)``).

tests/test_legacy_api.py checks that the port gives the bits the 0.1 model gave (on 1-4 ranks,
both partitioners). The 0.1 source, verbatim, is ``README_0_1`` in that test.
"""

import torch

from agentsim import InitContext, Model, Param
from agentsim.space.continuous import Box

model = Model("walk", params={"sigma": Param(1.0, "step std")})


@model.substep(reads=["walker.pos"], writes=["walker.pos"])
def move(ctx):
    w = ctx["walker"]  # checked view: undeclared reads/writes raise
    step = ctx.rng.normal(w["uid"], "move", draws=2, dtype=torch.float32)
    w["pos"] = ctx.space.wrap(w["pos"] + ctx.params["sigma"] * step)


@model.init
def init(ic: InitContext) -> Box:
    uid = ic.uids("walker", ic.n_agents)  # 0 .. n-1, as torch.arange(ic.n_agents) was
    pos = ic.rng.uniform(uid, draws=2, dtype=torch.float32) * 100  # step 0, stream "init"
    ic.add("walker", uid=uid, pos=pos)
    return Box((100.0, 100.0))
