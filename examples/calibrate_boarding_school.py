"""Fit beta and gamma of the well-mixed SIR (``flu``) to the 1978 boarding-school influenza
outbreak and compare with the published fits.

    python examples/calibrate_boarding_school.py --out boarding_school_fit

fits the daily counts of boys confined to bed (``data/boarding_school_flu.csv``) with
Nelder-Mead on common random numbers: 16 schools of 763 boys per evaluation (one vectorized
run), 24 steps a day, the schools whose outbreak died out left out (never more than 20 in
bed), the mean over the schools of each school's sum of squared errors. Writes

- ``boarding_school_fit.png``: the data against the fitted model's mean and 10-90 % band;
- ``boarding_school_fit.json``: the fit (values, standard errors from the curvature, R0, loss).

With ``--nprocs 2`` every run is split over two processes: the same numbers, bit for bit.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import agentsim as asim
from agentsim.calibrate import Objective, calibrate, plot_fit, read_series

DATA = Path(__file__).resolve().parent.parent / "data" / "boarding_school_flu.csv"
PUBLISHED = [  # (source, beta per day, gamma per day)
    ("Keeling & Rohani (2008), textbook", 1.66, 1 / 2.2),
    ("least-squares ODE refit", 1.669, 0.443),
    ("negative-binomial refit", 1.727, 0.541),
]
SCHOOLS = 16
SETTINGS = {"agents": 763 * SCHOOLS, "params": {"schools": SCHOOLS, "steps_per_day": 24}, "replicates": "school",
            "takeoff": 20.0, "aggregate": "each", "loss": "sse"}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default="boarding_school_fit", help="output prefix (default boarding_school_fit)")
    p.add_argument("--nprocs", type=int, default=1, help="processes per run (default 1; same numbers)")
    a = p.parse_args()
    data = read_series(DATA, "in_bed")
    model = asim.get_model("flu")
    result = calibrate(model, data, ["beta", "gamma"], "I", world_size=a.nprocs, start={"beta": 1.4, "gamma": 0.6},
                       progress=True, **SETTINGS)
    print(result.summary())
    print(f"{'':34s} {'beta':>6s} {'gamma':>6s} {'R0':>5s}")
    print(f"{'this fit':34s} {result.params['beta']:6.3f} {result.params['gamma']:6.3f} {result.derived['R0']:5.2f}")
    for source, beta, gamma in PUBLISHED:
        print(f"{source:34s} {beta:6.3f} {gamma:6.3f} {beta / gamma:5.2f}")
    result.to_json(f"{a.out}.json")
    plot_fit(Objective(model, data, ("beta", "gamma"), "I", **SETTINGS), result, f"{a.out}.png")
    print(f"wrote {a.out}.json, {a.out}.png")


if __name__ == "__main__":
    main()
