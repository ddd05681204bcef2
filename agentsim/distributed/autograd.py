"""Gradients through the data partitioner's collectives (differentiable runs on several ranks).

Two rules make the gradient of a loss the same on any number of ranks (up to float rounding):

- a halo row is a copy of an agent held by another rank: the gradient that reaches the copy
  goes back to the agent's rank and is added to the agent's own (:func:`halo_with_grad`);
- a quantity summed over ranks (a metric) is the same on every rank, and every rank computes
  the same loss from it: its backward is the identity (:func:`sum_over_ranks`), each rank
  taking the gradient into its own agents; the parameters' gradients are then summed over
  ranks (:func:`sum_gradients`).

All three are collectives in backward or forward: every rank must call ``backward`` /
``torch.autograd.grad`` on its copy of the loss together (the engine's step order makes the
graphs of all ranks the same).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ..comm import Comm

__all__ = ["halo_with_grad", "sum_gradients", "sum_over_ranks"]


def _all_rows(comm: Comm, value: Tensor) -> Tensor:
    """``[W, *value.shape]``: every rank's ``value`` (the same shape everywhere), rank order."""
    flat = value.detach().reshape(1, -1)
    got = comm.all_gather_rows({"v": flat}, rows_per_rank=1)["v"]
    return got.reshape(comm.world_size, *value.shape)


class _Halo(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, local: Tensor, halo: Tensor, comm: Comm, counts: list[int]) -> Tensor:
        ctx.comm, ctx.counts = comm, counts
        return halo.clone()

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, None, None, None]:
        comm, counts = ctx.comm, ctx.counts
        starts = [sum(counts[:r]) for r in range(len(counts))]
        full = grad.new_zeros((sum(counts), *grad.shape[1:]))
        others = [r for r in range(comm.world_size) if r != comm.rank]
        at = 0
        for r in others:  # the halo holds the other ranks' rows in rank order
            full[starts[r]:starts[r] + counts[r]] = grad[at:at + counts[r]]
            at += counts[r]
        total = _all_rows(comm, full).sum(0)  # every rank's gradient for every agent, added in rank order
        mine = total[starts[comm.rank]:starts[comm.rank] + counts[comm.rank]]
        return mine, None, None, None


def halo_with_grad(local: Tensor, halo: Tensor, comm: Comm) -> Tensor:
    """``halo`` (the other ranks' rows of ``local``'s field, received in rank order) joined to the
    autograd graph: the gradient reaching it returns to the rows' ranks (a collective, in forward
    and backward).
    """
    counts = [int(c) for c in _all_rows(comm, torch.tensor([local.shape[0]])).reshape(-1).tolist()]
    out: Tensor = _Halo.apply(local, halo, comm, counts)
    return out


class _SumOverRanks(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, local: Tensor, comm: Comm) -> Tensor:
        return _all_rows(comm, local).sum(0).to(local.device)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        return grad, None


def sum_over_ranks(local: Tensor, comm: Comm) -> Tensor:
    """The sum of ``local`` over ranks (rank order); backward: the identity (see the module)."""
    if comm.world_size == 1:
        return local
    out: Tensor = _SumOverRanks.apply(local, comm)
    return out


def sum_gradients(grads: list[Tensor], comm: Comm) -> list[Tensor]:
    """Every rank's parameter gradients added in rank order (the same on every rank)."""
    if comm.world_size == 1 or not grads:
        return grads
    stacked = torch.stack([g.reshape(()) if g.numel() == 1 else g for g in grads]) if all(
        g.numel() == 1 for g in grads) else None
    if stacked is not None:
        total = _all_rows(comm, stacked).sum(0)
        return [total[k] for k in range(len(grads))]
    return [_all_rows(comm, g).sum(0) for g in grads]
