"""Define a model in a few lines: a population, one substep, a parameter, a metric.

    python examples/custom_model.py [--out walk]

Walkers in a periodic box take Gaussian steps; the metric is the mean squared
displacement, which for steps of standard deviation sigma per axis is 2 sigma**2 t.
Writes ``walk.h5`` (the README's "Writing a model" example, plus a check of the MSD).
"""

from __future__ import annotations

import argparse

import torch

import agentsim as asim

walk = asim.Model("walk", params={"sigma": asim.Param(1.0, "step std (length units)", ge=0.0)})


@walk.substep(writes=["walker.pos", "walker.disp"])  # order = definition order
def move(ctx: asim.Context) -> None:
    w = ctx["walker"]
    step = ctx.params["sigma"] * ctx.rng.normal(w["uid"], draws=2)  # stream: the substep's name
    w["disp"] = w["disp"] + step
    w["pos"] = ctx.space.wrap(w["pos"] + step)


@walk.init
def init(ic: asim.InitContext) -> asim.Box:
    uid = ic.uids("walker", ic.n_agents)  # uids reserved by the engine
    pos = ic.rng.uniform(uid, "pos", draws=2) * 100  # same signature as in substeps
    ic.add("walker", uid=uid, pos=pos, disp=torch.zeros_like(pos))  # field specs inferred
    return asim.Box((100.0, 100.0))


@walk.metric(reduce="mean")  # exact sum / count over agents and ranks
def msd(state: asim.MetricsContext) -> torch.Tensor:
    return (state["walker"]["disp"].double() ** 2).sum(-1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="walk", help="output path without suffix")
    ap.add_argument("--steps", type=int, default=20)
    args = ap.parse_args()
    result = asim.run(walk, agents=1000, steps=args.steps, seed=1, params={"sigma": 0.5}, out=f"{args.out}.h5")
    print(result.plan())
    print(f"MSD after {args.steps} steps: {result.metrics['msd'][-1]:.3f} "
          f"(expected 2 * 0.5**2 * {args.steps} = {2 * 0.25 * args.steps:g})")
    print(f"wrote {args.out}.h5")


if __name__ == "__main__":
    main()
