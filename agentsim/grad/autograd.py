"""Gradients through the partitioners' collectives (differentiable runs on several ranks).

Two rules make the gradient of a loss the same on any number of ranks (up to float rounding):

- a row received from another rank (a halo row, a migrating agent, a cell of an env layer
  owned elsewhere) is a copy of a value held there: the gradient that reaches the copy goes
  back to the sender and is added to the value's own (:func:`gather_with_grad` for the
  data partitioner's all_gather, :func:`exchange_with_grad` for the spatial partitioner's
  point-to-point exchange);
- a quantity summed over ranks (a metric) is the same on every rank, and every rank computes
  the same loss from it: its backward is the identity (:func:`sum_over_ranks`), each rank
  taking the gradient into its own agents; the parameters' gradients are then summed over
  ranks (:func:`sum_gradients`).

The first rule puts collectives into the backward pass: every rank must run the backward
passes of the same exchanges, in the same order. Autograd runs the nodes of a graph in the
reverse order of their creation (a node waits only for nodes created after it), and every
rank creates the exchanges in the same order (the engine's step order), so the order agrees;
but a rank skips a node that its loss does not reach (a rank whose agents read no halo row,
for instance), and the others would wait for it. Each exchange therefore records its output
in a list of links (the partitioner's ``grad_links``), and :meth:`Simulation.parameter_gradients
<agentsim.engine.simulation.Simulation.parameter_gradients>` adds ``0 * output.sum()`` of every recorded
output to the loss: every exchange is then reached on every rank (with a zero added to its
gradient). Take gradients of multi-rank runs through that method, not ``loss.backward()``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from agentsim.core.comm import Comm

__all__ = ["exchange_with_grad", "gather_with_grad", "reach_exchanges", "sum_gradients", "sum_over_ranks"]


def reach_exchanges(loss: Tensor, links: list[Tensor]) -> Tensor:
    """``loss`` plus ``0 * t.sum()`` of every tensor ``t`` in ``links`` (the outputs of the
    exchanges of a run, in order): the same value and gradients, but a graph that reaches every
    exchange (see the module docstring). Empties ``links``.
    """
    out = loss
    for t in links:
        out = out + 0.0 * t.sum().to(loss.dtype)
    links.clear()
    return out


def _all_rows(comm: Comm, value: Tensor) -> Tensor:
    """``[W, *value.shape]``: every rank's ``value`` (the same shape everywhere), rank order."""
    flat = value.detach().reshape(1, -1)
    got = comm.all_gather_rows({"v": flat}, rows_per_rank=1)["v"]
    return got.reshape(comm.world_size, *value.shape)


def tracked(fields: Mapping[str, Tensor]) -> list[str]:
    """The float fields of ``fields`` that an exchange joins to the graph: all of them while
    autograd records (a differentiable run), none otherwise; sorted. Every rank joins the same
    fields, whether or not its own copy of a field happens to require a gradient, so every rank
    builds the same backward collectives.
    """
    if not torch.is_grad_enabled():
        return []
    return sorted(k for k, v in fields.items() if v.is_floating_point())


def _anchor() -> Tensor:
    """A leaf that requires a gradient, passed to every exchange: its node exists on every rank."""
    return torch.zeros((), requires_grad=True)


class _Gathered(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, local: Tensor, halo: Tensor, anchor: Tensor, comm: Comm, counts: list[int]) -> Tensor:
        ctx.comm, ctx.counts = comm, counts
        return halo.clone()

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None, None, None]:
        comm, counts = ctx.comm, ctx.counts
        starts = [sum(counts[:r]) for r in range(len(counts))]
        full = grad.new_zeros((sum(counts), *grad.shape[1:]))
        at = 0
        for r in range(comm.world_size):  # the halo holds the other ranks' rows in rank order
            if r != comm.rank:
                full[starts[r]:starts[r] + counts[r]] = grad[at:at + counts[r]]
                at += counts[r]
        total = _all_rows(comm, full).sum(0)  # every rank's gradient for every row, added in rank order
        return total[starts[comm.rank]:starts[comm.rank] + counts[comm.rank]], None, None, None, None


def gather_with_grad(comm: Comm, fields: Mapping[str, Tensor], links: list[Tensor]) -> dict[str, Tensor]:
    """``comm.all_gather_rows(fields, include_self=False)`` (every other rank's rows, rank order),
    its float fields joined to the autograd graph in a differentiable run: the gradient reaching a
    received row returns to the rank that sent it (a collective in backward too).
    """
    names = tracked(fields)
    got = comm.all_gather_rows({k: v.detach() for k, v in fields.items()}, include_self=False)
    if names:
        n = torch.tensor([next(iter(fields.values())).shape[0]])
        counts = [int(c) for c in _all_rows(comm, n).reshape(-1).tolist()]
        for k in names:
            got[k] = _Gathered.apply(fields[k], got[k], _anchor(), comm, counts)
            links.append(got[k])
    return got


class _Exchanged(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, local: Tensor, received: Tensor, anchor: Tensor, comm: Comm, dest: Tensor,
                index: Tensor) -> Tensor:
        ctx.comm, ctx.dest, ctx.index, ctx.n = comm, dest, index, local.shape[0]
        return received.clone()

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None, None, None, None]:
        comm, W = ctx.comm, ctx.comm.world_size
        order = torch.argsort(ctx.dest, stable=True)  # the order exchange_rows sent the rows in
        index = ctx.index.to(grad.device)[order.to(grad.device)]
        sent = torch.bincount(ctx.dest, minlength=W).tolist()
        received = comm.exchange_counts([int(c) for c in sent])
        source = torch.repeat_interleave(torch.arange(W), torch.tensor(received, dtype=torch.int64))
        back = comm.exchange_rows({"g": grad.contiguous()}, source)["g"]  # from each rank, in our send order
        out = grad.new_zeros((ctx.n, *grad.shape[1:]))
        return out.index_add_(0, index, back), None, None, None, None, None


def exchange_with_grad(comm: Comm, fields: Mapping[str, Tensor], dest: Tensor, index: Tensor,
                       links: list[Tensor]) -> dict[str, Tensor]:
    """``comm.exchange_rows(fields, dest, index)`` (row ``index[k]`` to rank ``dest[k]``; received
    rows in source-rank order), its float fields joined to the autograd graph in a differentiable
    run: the gradient reaching a received row returns to its sender and is added to the row it
    was copied from (a collective in backward too).
    """
    names = tracked(fields)
    got = comm.exchange_rows({k: v.detach() for k, v in fields.items()}, dest, index)
    if names:
        dest_cpu, index_cpu = dest.to("cpu", torch.int64), index.to("cpu", torch.int64)
        for k in names:
            got[k] = _Exchanged.apply(fields[k], got[k], _anchor(), comm, dest_cpu, index_cpu)
            links.append(got[k])
    return got


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
    """Every rank's parameter gradients (0-dim) added in rank order: the same on every rank."""
    if comm.world_size == 1 or not grads:
        return grads
    total = _all_rows(comm, torch.stack([g.reshape(()) for g in grads])).sum(0)
    return [total[k] for k in range(len(grads))]
