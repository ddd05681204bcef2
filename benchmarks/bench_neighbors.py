"""Paired rounds: a boids written from the docs with ``neighbor_reduce`` against ``models/boids.py``.

    python benchmarks/bench_neighbors.py --rounds 7 --agents 10000 200000 --out benchmarks/results/neighbors.json

Three boids with the same rules (Mesa's ``boid_flockers``), the same initial state and the same
work, each timed in a fresh process with one torch thread, in alternating order from round to
round (the order rotates, so slow phases of a shared machine hit every variant alike):

- ``user``: what a user writes from the README's "Neighbor interactions" section (below, in
  this file: one ``neighbor_reduce`` call with a per-pair rule, then the steering in ``[n, 2]``
  tensors), not copied from ``models/``;
- ``model``: ``agentsim.models.boids`` (the reference model, on the same primitive);
- ``handtuned``: the flock substep as the reference model wrote it before the primitive
  (``radius_pair_chunks`` with int32 rows, ``[2, n]`` columns, ``scatter_sum_columns``): how much
  the primitive costs against the plumbing it replaces.

Each figure is ms per step over ``--steps`` steps after 2 warm-up steps. The JSON holds every
round's figures, their medians, and per agent count the medians of the per-round ratios
``user / model`` (target <= 1.1) and ``model / handtuned``, plus whether the three give the same
final headings (``max_abs_heading_diff`` against ``model``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
VARIANTS = ("user", "model", "handtuned")


# ---------------------------------------------------------------- the user's boids, from the README
def user_boids() -> Any:
    """Boids as a user writes them with ``neighbor_reduce`` (Mesa's rules and defaults)."""
    import torch

    import agentsim as asim

    model = asim.Model("user_boids", params=_params())

    @model.substep(reads=["boid.pos"], writes=["boid.heading"], neighbors={"boid": ["pos", "heading"]},
                   reach="vision", agentwise=True)
    def flock(ctx: asim.Context) -> None:
        p, nb = ctx.params, ctx.neighbors("boid")

        def rules(pair: asim.PairView) -> dict[str, Any]:
            close = (pair.dist2 < p["separation"] ** 2).unsqueeze(1)
            return {"cohere": pair.delta, "separate": pair.delta * close, "match": pair.source["heading"],
                    "n": True}

        s = asim.neighbor_reduce(ctx.space, nb, rules, {"n": "count"}, radius=p["vision"])
        n = s["n"].unsqueeze(1)
        heading = ctx["boid"]["heading"]
        steer = (p["cohere"] * s["cohere"] - p["separate"] * s["separate"] + p["match"] * s["match"]) / n.clamp(min=1)
        new = heading + steer
        ctx["boid"]["heading"] = torch.where(n > 0, new / new.norm(dim=1, keepdim=True), heading)

    @model.substep(reads=["boid.heading"], writes=["boid.pos"])
    def move(ctx: asim.Context) -> None:
        boids = ctx["boid"]
        boids["pos"] = ctx.space.wrap(boids["pos"] + ctx.params["speed"] * boids["heading"])

    model.init(_init)
    return model


def _params() -> dict[str, Any]:
    from agentsim import Param

    return {
        "density": Param(0.01, "boids per unit area", gt=0),
        "vision": Param(10.0, "neighbor radius", gt=0),
        "separation": Param(1.0, "repel below this distance", ge=0),
        "cohere": Param(0.03, "pull toward neighbors", ge=0),
        "separate": Param(0.015, "push from close neighbors", ge=0),
        "match": Param(0.05, "heading alignment", ge=0),
        "speed": Param(1.0, "distance per step", ge=0),
    }


def _init(ic: Any) -> Any:
    """The reference model's initial state (same streams): every variant does the same work."""
    import torch

    from agentsim import Box

    n = ic.n_agents
    side = math.sqrt(n / ic.params["density"])
    box = Box((side, side), periodic=True)
    uid = ic.uids("boid", n)
    pos = box.wrap(ic.rng.uniform(uid, "init_pos", draws=2, dtype=torch.float32) * side)
    angle = ic.rng.uniform(uid, "init_heading", dtype=torch.float64) * (2 * math.pi)
    heading = torch.stack([torch.cos(angle), torch.sin(angle)], -1).to(torch.float32)
    ic.add("boid", uid=uid, pos=pos, heading=heading)
    return box


# ---------------------------------------------------------------- the pre-primitive plumbing
def handtuned_boids() -> Any:
    """The reference model's flock before ``neighbor_reduce``: chunks, int32 rows, [2, n] columns."""
    import torch

    import agentsim as asim
    from agentsim.core import ops

    model = asim.Model("handtuned_boids", params=_params())

    def headings(heading: torch.Tensor, i: torch.Tensor, j: torch.Tensor, delta: torch.Tensor, dist2: torch.Tensor,
                 params: Any, start: int, stop: int) -> torch.Tensor:
        n = stop - start
        t = i - start if start else i
        count = torch.bincount(t, minlength=n)
        denom = count.clamp(min=1).to(heading.dtype)
        close = dist2 < params["separation"] ** 2
        old = heading[:, start:stop]
        dims = range(heading.shape[0])
        columns = [col for k in dims for col in (delta[k], delta[k] * close, heading[k].index_select(0, j))]
        sums = ops.scatter_sum_columns(columns, t, n)
        new = []
        for k in dims:
            sum_delta, sum_close, sum_heading = sums[3 * k:3 * k + 3]
            steer = (params["cohere"] * sum_delta - params["separate"] * sum_close
                     + params["match"] * sum_heading) / denom
            new.append(old[k] + steer)
        norm = torch.sqrt(new[0] * new[0] + new[1] * new[1])
        return torch.where(count > 0, torch.stack(new) / norm, old)

    @model.substep(reads=["boid.pos"], writes=["boid.heading"], neighbors={"boid": ["pos", "heading"]},
                   reach="vision", agentwise=True)
    def flock(ctx: asim.Context) -> None:
        nb = ctx.neighbors("boid")
        heading = torch.stack([nb["heading"][:, k] for k in range(2)])
        new = heading[:, : nb.n_local].clone()
        for c in asim.radius_pair_chunks(nb["pos"], ctx.space, ctx.params["vision"], uid=nb["uid"],
                                         n_query=nb.n_local, with_delta=True, index_dtype=torch.int32):
            assert c.delta is not None and c.dist2 is not None
            new[:, c.start:c.stop] = headings(heading, c.i, c.j, c.delta, c.dist2, ctx.params, c.start, c.stop)
        ctx["boid"]["heading"] = torch.stack(list(new), dim=1)

    @model.substep(reads=["boid.heading"], writes=["boid.pos"])
    def move(ctx: asim.Context) -> None:
        boids = ctx["boid"]
        boids["pos"] = ctx.space.wrap(boids["pos"] + ctx.params["speed"] * boids["heading"])

    model.init(_init)
    return model


# ---------------------------------------------------------------- run in a fresh process
def per_step(variant: str, agents: int, steps: int, heading_out: str) -> float:
    """Seconds per step of one variant after 2 warm-up steps; writes the final headings by uid."""
    import torch

    import agentsim

    model = {"user": user_boids, "handtuned": handtuned_boids,
             "model": lambda: agentsim.get_model("boids")}[variant]()
    sim = agentsim.Simulation(model, agents=agents, seed=0)
    sim.run(2)
    seconds = float(sim.run(steps).seconds) / steps
    if variant == "model":
        import agentsim.models.boids

        assert Path(agentsim.models.boids.__file__).resolve().parent == ROOT / "models", agentsim.models.boids.__file__
    boids = sim.state["boid"]
    torch.save(boids["heading"][torch.argsort(boids["uid"])].clone(), heading_out)
    return seconds


def _env() -> dict[str, str]:
    """This checkout's agentsim and its own models/ (not an editable install's), one torch thread."""
    from bench_peers import checkout_env

    env = checkout_env(ROOT, HERE)
    env["OMP_NUM_THREADS"] = "1"
    return env


def _run(variant: str, agents: int, steps: int, heading_out: Path) -> float:
    code = (f"import bench_neighbors; print(bench_neighbors.per_step({variant!r}, {agents}, {steps}, "
            f"{str(heading_out)!r}))")
    done = subprocess.run([sys.executable, "-W", "ignore", "-c", code], capture_output=True, text=True, env=_env(),
                          cwd=ROOT)
    if done.returncode:
        raise SystemExit(f"bench_neighbors: {variant} at {agents} agents failed:\n{done.stderr[-2000:]}")
    return float(done.stdout.strip().splitlines()[-1]) * 1e3


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--agents", type=int, nargs="+", default=[10_000, 200_000])
    ap.add_argument("--steps", type=int, default=10, help="timed steps per run")
    ap.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    ap.add_argument("--out", help="JSON path (default: benchmarks/results/neighbors-<time>.json)")
    args = ap.parse_args(argv)
    if args.rounds < 1 or args.steps < 1 or min(args.agents) < 1:
        print("bench_neighbors: --rounds, --steps and --agents must be >= 1", file=sys.stderr)
        return 2
    import torch

    scratch = Path(os.environ.get("TMPDIR", "/tmp"))
    rounds: dict[str, dict[str, list[float]]] = {str(n): {v: [] for v in args.variants} for n in args.agents}
    heading_diff: dict[str, dict[str, float]] = {str(n): {} for n in args.agents}
    for r in range(args.rounds):
        k = r % len(args.variants)
        order = args.variants[k:] + args.variants[:k]
        for n in args.agents:
            headings = {}
            for v in order:
                path = scratch / f"bench_neighbors_{v}.pt"
                rounds[str(n)][v].append(_run(v, n, args.steps, path))
                headings[v] = torch.load(path)
            ref = headings.get("model")
            if ref is not None:
                for v, h in headings.items():
                    diff = float((h - ref).abs().max()) if h.numel() else 0.0
                    heading_diff[str(n)][v] = max(heading_diff[str(n)].get(v, 0.0), diff)
            print(f"round {r + 1}/{args.rounds}, {n} agents: " + "; ".join(
                f"{v} {rounds[str(n)][v][-1]:.2f} ms" for v in args.variants), flush=True)

    def ratio(n: str, a: str, b: str) -> float | None:
        if a not in rounds[n] or b not in rounds[n]:
            return None
        return statistics.median(x / y for x, y in zip(rounds[n][a], rounds[n][b], strict=True) if y > 0)

    figures = {
        "per_round_ms_per_step": rounds,
        "median_ms_per_step": {n: {v: statistics.median(x) for v, x in per.items()} for n, per in rounds.items()},
        "median_ratio_user_over_model": {n: ratio(n, "user", "model") for n in rounds},
        "median_ratio_model_over_handtuned": {n: ratio(n, "model", "handtuned") for n in rounds},
        "median_ratio_user_over_handtuned": {n: ratio(n, "user", "handtuned") for n in rounds},
        "max_abs_heading_diff_vs_model": heading_diff,
        "rounds": args.rounds, "steps": args.steps, "commit": _commit(), "cpu_count": os.cpu_count(),
        "torch_threads": 1, "python": platform.python_version(), "date": time.strftime("%Y-%m-%d"),
    }
    out = Path(args.out) if args.out else HERE / "results" / f"neighbors-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(figures, indent=1) + "\n")
    for n in rounds:
        print(f"{n} agents: median ms/step " + ", ".join(f"{v} {x:.2f}" for v, x in
                                                         figures["median_ms_per_step"][n].items())
              + f"; user/model {figures['median_ratio_user_over_model'][n]}, "
              f"model/handtuned {figures['median_ratio_model_over_handtuned'][n]}")
    print(f"wrote {out}")
    return 0


def _commit() -> str | None:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True,
                              cwd=ROOT).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


if __name__ == "__main__":
    sys.exit(main())
