"""Order-free ranking inside groups, for conflict resolution without per-agent loops.

When several agents compete for one thing (sheep for the grass of a cell, wolves
for the sheep of a cell, movers for empty cells), each gets a random key from the
counter-based RNG and the competitors are ranked by key inside their group. The
ranks depend only on (group, key, uid), never on row order, so the outcome is the
same on any number of ranks.
"""

from __future__ import annotations

import torch
from torch import Tensor


def sort_by_group(group: Tensor, key: Tensor) -> Tensor:
    """Permutation that sorts rows by ``(group, key)``; both int64 ``[n]``. Ties in both keep row order."""
    by_key = torch.argsort(key, stable=True)
    return by_key[torch.argsort(group[by_key], stable=True)]


def rank_in_group(group: Tensor, key: Tensor) -> Tensor:
    """Rank ``[n]`` (0 = smallest key) of each row among the rows of its group.

    Args:
        group: int64 ``[n]`` group id per row (e.g. a cell index).
        key: int64 ``[n]`` key per row (e.g. ``rng.bits(uid, stream)``), distinct within a group:
            equal keys are ranked by row order, which depends on how agents are split among
            processes (64-bit ``rng.bits`` keys are distinct but for a chance of about ``n**2 / 2**65``).

    Examples:
        >>> rank_in_group(torch.tensor([3, 1, 3, 3]), torch.tensor([5, 0, -2, 9])).tolist()
        [1, 0, 0, 2]
    """
    n = group.shape[0]
    order = sort_by_group(group, key)
    g = group[order]
    is_start = torch.ones(n, dtype=torch.bool, device=group.device)
    if n > 1:
        is_start[1:] = g[1:] != g[:-1]
    pos = torch.arange(n, device=group.device)
    start = torch.cummax(torch.where(is_start, pos, torch.zeros_like(pos)), 0).values
    rank = torch.empty_like(pos)
    rank[order] = pos - start
    return rank
