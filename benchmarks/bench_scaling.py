"""Strong scaling with the spatial partitioner: W=1 against W=2 (one torch thread per rank).

    python benchmarks/bench_scaling.py boids --agents 100000 --steps 20   # -> benchmarks/results/

Same as ``agentsim bench --scaling MODEL``; writes JSON with device, torch version, git
commit and world size (see :mod:`agentsim.runner.bench`). Not part of the test run.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from agentsim.runner.bench import format_scaling, scaling


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("model")
    p.add_argument("--agents", type=int)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--layout", default="strips")
    p.add_argument("--nprocs", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", default=None)
    a = p.parse_args()
    out = a.out or str(Path(__file__).parent / "results" / f"scaling_{a.model}_{a.agents or 'default'}.json")
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    figures = scaling(a.model, agents=a.agents, steps=a.steps, warmup=a.warmup, layout=a.layout,
                      world_size=a.nprocs, repeats=a.repeats, out=out)
    print(format_scaling(figures))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
