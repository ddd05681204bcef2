"""Run wolf-sheep from the command line API and plot the populations from the HDF5 file.

python examples/wolfsheep_populations.py --agents 3000 --steps 300 --out wolfsheep
"""

from __future__ import annotations

import argparse

import matplotlib

matplotlib.use("Agg")
import h5py
import matplotlib.pyplot as plt

from agentsim.cli.main import main as agentsim_main


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--agents", type=int, default=3000)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--out", default="wolfsheep")
    args = ap.parse_args()
    code = agentsim_main(["run", "wolfsheep", "--agents", str(args.agents), "--steps", str(args.steps),
                          "--out", f"{args.out}.h5", "--quiet"])
    if code:
        raise SystemExit(code)
    with h5py.File(f"{args.out}.h5") as f:  # plain h5py: the format needs no agentsim to read
        step, sheep, wolves, grass = (f["metrics"][k][:] for k in ("step", "n_sheep", "n_wolf", "grass"))
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(step, sheep, label="sheep")
    ax.plot(step, wolves, label="wolves")
    ax.plot(step, grass, label="grown grass cells", alpha=0.6)
    ax.set_xlabel("step")
    ax.set_ylabel("count")
    ax.legend()
    fig.tight_layout()
    fig.savefig(f"{args.out}.png", dpi=120)
    print(f"wrote {args.out}.h5 and {args.out}.png")


if __name__ == "__main__":
    main()
