"""Train the spillover model's `protect` policy with PPO on 1 and 2 processes and compare it with
a random policy and the hand-written rule.

    python examples/train_spillover.py --out spillover_ppo

trains with the same seed at W = 1 and W = 2 (the two learning curves coincide), evaluates the
learned policies, uniform random choices and :func:`~agentsim.models.spillover.protect_if_exposed`
on the same held-out episode seeds, and writes

- ``spillover_ppo.png``: both learning curves with the random and rule returns (mean +- sd band);
- ``spillover_ppo.json``: every figure (per-update returns, per-seed evaluation returns);
- ``spillover_ppo-w1.h5``, ``spillover_ppo-w2.h5``: the training logs.

Returns are per person over the episode (costs, so higher is better).
"""

from __future__ import annotations

import argparse
import json
import statistics

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from agentsim.models.spillover import MODEL, protect_if_exposed
from matplotlib.ticker import MaxNLocator

from agentsim.learn import PPOConfig, evaluate, train


def summary(values: list[float]) -> dict[str, float]:
    """Mean and sample standard deviation over the evaluation seeds."""
    return {"mean": statistics.fmean(values), "sd": statistics.stdev(values) if len(values) > 1 else 0.0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--agents", type=int, default=2000, help="hosts + persons (half each)")
    ap.add_argument("--updates", type=int, default=20)
    ap.add_argument("--horizon", type=int, default=40, help="days per episode")
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--minibatches", type=int, default=8)
    ap.add_argument("--hidden", default="64,64")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--eval-seeds", type=int, default=8, help="held-out episodes per policy")
    ap.add_argument("--out", default="spillover_ppo", help="output path without suffix")
    args = ap.parse_args()

    model = MODEL.configure(params={"horizon": args.horizon})
    config = PPOConfig(horizon=args.horizon, lr=args.lr, minibatches=args.minibatches,
                       hidden=tuple(int(w) for w in args.hidden.split(",")))
    seeds = [10_000 + k for k in range(args.eval_seeds)]  # never used in training (episode seeds are hashed)
    figures: dict = {"agents": args.agents, "updates": args.updates, "config": config.to_dict(), "seed": args.seed,
                     "eval_seeds": seeds, "curves": {}, "eval": {}}
    for w in (1, 2):
        result = train(model, args.agents, args.updates, args.seed, world_size=w, config=config,
                       out=f"{args.out}-w{w}.h5")
        figures["curves"][f"W={w}"] = [row["mean_return"] for row in result.history]
        figures["eval"][f"learned (W={w})"] = evaluate(model, result.net, agents=args.agents, seeds=seeds,
                                                       horizon=args.horizon)
    figures["eval"]["rule (protect if exposed)"] = evaluate(model, protect_if_exposed, agents=args.agents,
                                                            seeds=seeds, horizon=args.horizon)
    figures["eval"]["random"] = evaluate(model, "random", agents=args.agents, seeds=seeds, horizon=args.horizon)
    stats = {name: summary(v) for name, v in figures["eval"].items()}
    figures["summary"] = stats
    figures["curves_equal"] = figures["curves"]["W=1"] == figures["curves"]["W=2"]

    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    x = list(range(1, args.updates + 1))
    ax.plot(x, figures["curves"]["W=1"], lw=2.5, color="tab:blue", label="PPO, 1 process")
    ax.plot(x, figures["curves"]["W=2"], lw=1, ls="--", color="black", label="PPO, 2 processes (same seed)")
    for name, color in (("rule (protect if exposed)", "tab:orange"), ("random", "tab:red")):
        m, sd = stats[name]["mean"], stats[name]["sd"]
        ax.axhline(m, color=color, lw=1.5, label=f"{name}: {m:.2f} ± {sd:.2f}")
        ax.axhspan(m - sd, m + sd, color=color, alpha=0.2)
    learned = stats["learned (W=1)"]
    ax.axhline(learned["mean"], color="tab:blue", lw=1, ls=":",
               label=f"learned, held-out seeds: {learned['mean']:.2f} ± {learned['sd']:.2f}")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("PPO update")
    ax.set_ylabel("mean return per person (episode)")
    ax.set_title(f"spillover: {args.agents // 2:,} people learn when to protect ({args.eval_seeds} eval seeds)",
                 fontsize=10)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(f"{args.out}.png", dpi=120)
    with open(f"{args.out}.json", "w") as f:
        json.dump(figures, f, indent=1)
    for name, s in stats.items():
        print(f"{name:28s} {s['mean']:8.3f} ± {s['sd']:.3f}")
    print(f"learning curves at W=1 and W=2 equal: {figures['curves_equal']}")
    print(f"wrote {args.out}.png, {args.out}.json, {args.out}-w1.h5, {args.out}-w2.h5")


if __name__ == "__main__":
    main()
