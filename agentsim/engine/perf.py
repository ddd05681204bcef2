"""Per-step performance figures over all ranks: agents per rank, step and communication time,
bytes, halo size, migrations, load balancing.

Every rank reports its :class:`~agentsim.distributed.partition.RankFigures` for every step; from every
rank's (:class:`~agentsim.distributed.partition.RanksFigures`), each rank computes the same figures
(:func:`step_figures`): ``agents/max``,
``agents/mean``, ``agents/imbalance`` (max / mean, after any rebalancing),
``agents/imbalance_before_balance``, ``rank_step_seconds/max``, ``rank_step_seconds/mean``,
``comm/seconds_max``, ``comm/seconds_mean``, ``comm/bytes_sent`` (sum), ``halo/rows``,
``halo/bytes`` (sums), ``migrated`` (sum), ``rebalanced`` (0/1). A run writes every step's, with
this rank's seconds per substep, to the file's ``/perf``, and keeps those of its last
:data:`~agentsim.engine.simulation.PERF_WINDOW` (1,000) steps in ``RunResult.perf`` (every step of a
shorter run), so that memory stays bounded over any number of steps. They depend on the
machine, by design; nothing else in a file does.

A step's seconds and collectives cover, on each rank, the step itself (from entering
``Simulation.step`` to sending its report: the substeps, their halos and migrations, and
any wait for a slower rank inside them) plus the previous step's report exchange, which
only ends after that report was sent (an all_gather, or posting the overlapped exchange).
So ``comm/seconds_*`` never exceeds the step's seconds. What a run does between steps,
writing metric rows and frames, is not in any step, nor is rebalancing after a report.

Examples:
    >>> import torch
    >>> from agentsim.distributed.partition import RankFigures, RanksFigures
    >>> rows = torch.cat([RankFigures(10.0, 0.5, 0.1, 100.0, 2.0, 16.0, 1.0).to_tensor(),
    ...                   RankFigures(30.0, 1.0, 0.2, 50.0, 3.0, 24.0, 0.0).to_tensor()])
    >>> step = step_figures(RanksFigures.from_tensor(rows), [10, 30], moved=[20, 20])
    >>> step["agents/imbalance_before_balance"], step["agents/imbalance"], step["rebalanced"]
    (1.5, 1.0, 1.0)
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from agentsim.distributed.partition import RanksFigures

__all__ = ["GROUP_COLUMNS", "group_figures", "step_figures", "summarize_groups", "summarize_perf"]


def step_figures(figures: RanksFigures, counts: Sequence[int], moved: Sequence[int] | None) -> dict[str, float]:
    """A step's figures over ranks.

    Args:
        figures: Every rank's figures (each a list ``[W]``, rank order).
        counts: Agents per rank at the end of the step, before any rebalancing.
        moved: Agents per rank after rebalancing, or None if borders did not move.
    """
    before = sum(counts) / len(counts)
    after = list(moved) if moved is not None else list(counts)
    mean = sum(after) / len(after)
    seconds, comm, w = figures.step_seconds, figures.comm_seconds, len(figures.step_seconds)
    return {
        "agents/max": float(max(after)), "agents/mean": mean,
        "agents/imbalance": max(after) / mean if mean > 0 else 1.0,
        "agents/imbalance_before_balance": max(counts) / before if before > 0 else 1.0,
        "rank_step_seconds/max": max(seconds), "rank_step_seconds/mean": math.fsum(seconds) / w,
        "comm/seconds_max": max(comm), "comm/seconds_mean": math.fsum(comm) / w,
        "comm/bytes_sent": math.fsum(figures.bytes_sent), "halo/rows": math.fsum(figures.halo_rows),
        "halo/bytes": math.fsum(figures.halo_bytes), "migrated": math.fsum(figures.migrated),
        "rebalanced": float(moved is not None),
    }


#: The columns of a rank's figures per group field (:attr:`agentsim.core.groups.GroupSums.figures`).
GROUP_COLUMNS = ("members", "cut_members", "cut_groups", "pairs", "crossing_pairs")


def group_figures(names: Sequence[str], per_rank: Sequence[Sequence[Sequence[int]]]) -> dict[str, float]:
    """The cut of each group field of ``ctx.group_totals`` (:mod:`agentsim.core.groups`) over ranks.

    Args:
        names: The group fields (``"person.household"``), in the order of the rows.
        per_rank: ``[W][F][5]`` each rank's :data:`GROUP_COLUMNS` per field.

    Returns:
        ``groups/cut_share``: over every field, the share of memberships whose group has members on
        another rank; ``groups/contact_cut_share``: the share of contacts (pairs of members of a
        group) whose two members are on different ranks; and per field ``f`` the same two,
        ``groups/f/cut_share`` (the share of the field's members whose group spans ranks) and
        ``groups/f/contact_cut_share``, with ``groups/f/ghost_groups_max`` and
        ``.../ghost_groups_mean``, the groups a rank shares with others (its ghost places). One
        process: all 0.

    Examples:
        >>> figures = group_figures(["p.home"], [[[100, 4, 1, 60, 3]], [[50, 2, 1, 40, 0]]])
        >>> figures["groups/p.home/cut_share"], figures["groups/p.home/contact_cut_share"]
        (0.04, 0.03)
    """
    def share(part: float, whole: float) -> float:
        return part / whole if whole else 0.0

    # per field, each column summed over ranks
    fields = [{c: sum(rank[f][i] for rank in per_rank) for i, c in enumerate(GROUP_COLUMNS)}
              for f in range(len(names))]
    every = {c: sum(f[c] for f in fields) for c in GROUP_COLUMNS}
    out = {"groups/cut_share": share(every["cut_members"], every["members"]),
           "groups/contact_cut_share": share(every["crossing_pairs"], every["pairs"])}
    for f, (name, sums) in enumerate(zip(names, fields, strict=True)):
        ghosts = [rank[f][GROUP_COLUMNS.index("cut_groups")] for rank in per_rank]
        out[f"groups/{name}/contact_cut_share"] = share(sums["crossing_pairs"], sums["pairs"])
        out[f"groups/{name}/cut_share"] = share(sums["cut_members"], sums["members"])
        out[f"groups/{name}/ghost_groups_max"] = float(max(ghosts))
        out[f"groups/{name}/ghost_groups_mean"] = sum(ghosts) / len(ghosts)
    return out


def summarize_groups(figures: Mapping[str, float]) -> str:
    """One line on the cut of each group field (:func:`group_figures`); empty without any."""
    names = [k[len("groups/"):-len("/ghost_groups_max")] for k in figures if k.endswith("/ghost_groups_max")]
    if not names:
        return ""
    parts = [f"{name} {figures[f'groups/{name}/cut_share']:.2%} "
             f"(ghosts per rank: max {figures[f'groups/{name}/ghost_groups_max']:.0f})" for name in names]
    return (f"groups cut across ranks: {figures['groups/contact_cut_share']:.2%} of contacts, "
            f"{figures['groups/cut_share']:.2%} of memberships; by field (share of members): " + "; ".join(parts))


def summarize_perf(perf_steps: Sequence[Mapping[str, float]], steps: int | None = None) -> str:
    """A few lines on the per-step figures of a run (``RunResult.perf``: its last
    :data:`~agentsim.engine.simulation.PERF_WINDOW` steps; ``steps``, the run's steps, says so when it had more).
    """
    if not perf_steps:
        return "perf: no steps"
    n = len(perf_steps)
    over = f"the last {n} of {steps} steps" if steps is not None and steps > n else f"{n}"

    def mean(key: str) -> float:
        return sum(p[key] for p in perf_steps) / n

    step = mean("rank_step_seconds/max")
    comm = mean("comm/seconds_max")
    share = comm / step if step > 0 else 0.0
    return (f"per step (mean over {over}): {mean('comm/bytes_sent') / 1e3:.1f} kB sent, "
            f"{comm * 1e3:.2f} ms in collectives (slowest rank; {share:.0%} of the step), "
            f"halo {mean('halo/rows'):.0f} rows / {mean('halo/bytes') / 1e3:.1f} kB, "
            f"step {step * 1e3:.2f} ms (slowest rank)\n"
            f"agents per rank: max/mean {perf_steps[-1]['agents/imbalance']:.3f} at the end "
            f"(worst {max(p['agents/imbalance'] for p in perf_steps):.3f}); "
            f"{sum(p['migrated'] for p in perf_steps):.0f} migrations; "
            f"{sum(p['rebalanced'] for p in perf_steps):.0f} rebalancings")
