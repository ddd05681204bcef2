"""Models for the study tests, importable by worker processes as ``study_models:NAME``."""

from __future__ import annotations

import os
import time

import torch

import agentsim as asim

flaky = asim.Model("flaky", params={
    "fail_times": asim.Param(0, "attempts that fail before one succeeds", ge=0),
    "how": asim.Param("die", "die (the worker process exits) or raise", choices=["die", "raise"]),
    "counter": asim.Param("", "file counting the attempts (one per run)"),
    "log": asim.Param("", "file with one line per execution (the seed)"),
    "sleep": asim.Param(0.0, "seconds each step sleeps", ge=0),
    "rate": asim.Param(0.1, "growth per step", ge=0),
})


@flaky.substep(writes=["cell.size"])
def grow(ctx: asim.Context) -> None:
    """Growth by ``rate`` plus noise; the first attempts of a run die or raise at step 1."""
    p = ctx.params
    if ctx.step == 1 and p["fail_times"] > 0:
        with open(p["counter"], "a+") as f:
            f.seek(0)
            attempt = len(f.read().splitlines()) + 1
            f.write(f"{attempt}\n")
        if attempt <= p["fail_times"]:
            if p["how"] == "die":
                os._exit(17)
            raise RuntimeError(f"deliberate failure of attempt {attempt}")
    if p["sleep"]:
        time.sleep(p["sleep"])
    c = ctx["cell"]
    c["size"] = c["size"] * (1 + p["rate"]) + ctx.rng.uniform(c["uid"])


@flaky.init
def init(ic: asim.InitContext) -> None:
    """``n`` cells of size 1; logs this execution's seed."""
    if ic.params["log"]:
        with open(ic.params["log"], "a") as f:
            f.write(f"{ic.seed}\n")
    uid = ic.uids("cell", ic.n_agents)
    ic.add("cell", uid=uid, size=torch.ones(ic.n_agents, dtype=torch.float64))


@flaky.metric()
def total_size(m: asim.MetricsContext) -> torch.Tensor:
    """Sum of the sizes."""
    return m["cell"]["size"]
