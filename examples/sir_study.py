"""A population study from Python: SIR over three transmission rates, replicates each, and the
median and 10-90 % band of the infectious fraction per rate.

    python examples/sir_study.py --agents 20000 --replicates 20 --workers 2 --out sir_study
    python examples/sir_study.py --executor ray ...     # the same study on a local Ray instance

writes ``sir_study.h5`` (the study file: every run, the summary, the bands) and
``sir_study.png``. Run it again with ``--resume`` after an interruption: finished runs are kept.
"""

from __future__ import annotations

import argparse

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from agentsim import Study, read_study


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--agents", type=int, default=20_000)
    ap.add_argument("--steps", type=int, default=120)
    ap.add_argument("--replicates", type=int, default=20)
    ap.add_argument("--betas", default="0.02,0.03,0.05", help="per-contact daily transmission probabilities")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--executor", default="local", help="local (a process pool) or ray (pip install 'agentsim[ray]')")
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--out", default="sir_study", help="output path without suffix")
    args = ap.parse_args()

    betas = [float(b) for b in args.betas.split(",")]
    study = Study("sir", {"beta": betas}, replicates=args.replicates, seed=1, agents=args.agents, steps=args.steps)
    result = study.run(f"{args.out}.h5", workers=args.workers, executor=args.executor, resume=args.resume,
                       overwrite=not args.resume)
    data = read_study(f"{args.out}.h5")
    q = [float(x) for x in data.quantiles]

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for band, color in zip(data.bands.values(), plt.cm.viridis(np.linspace(0.1, 0.85, len(data.bands))),
                           strict=True):
        days = band["step"][1]  # the median of the step column: the days themselves
        low, mid, high = (band["I"][k] / args.agents for k in range(3))
        ax.fill_between(days, low, high, color=color, alpha=0.25, linewidth=0)
        ax.plot(days, mid, color=color, label=f"beta = {band['params']['beta']:g} ({band['runs']} runs)")
    ax.set_xlabel("day")
    ax.set_ylabel("infectious fraction")
    ax.set_title(f"SIR on {args.agents:,} people: median and {q[0]:.0%}-{q[-1]:.0%} band over replicates")
    ax.legend(frameon=False)
    fig.tight_layout()
    fig.savefig(f"{args.out}.png", dpi=120)
    final = data.summary["final_R"] / args.agents
    for beta in betas:
        sizes = final[data.summary["beta"] == beta]
        print(f"beta {beta:g}: final size median {np.median(sizes):.3f} (10-90 %: {np.quantile(sizes, 0.1):.3f}-"
              f"{np.quantile(sizes, 0.9):.3f}) over {len(sizes)} runs")
    print(f"{len(study.runs)} runs: executed {result.executed}, kept {result.skipped}; wrote {args.out}.h5, "
          f"{args.out}.png")


if __name__ == "__main__":
    main()
