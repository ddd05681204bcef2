"""Gradient synchronization for training on several ranks: DistributedDataParallel on a process
group of its own, with an optional compression hook, timed.

The policy network is wrapped in ``torch.nn.parallel.DistributedDataParallel`` on a new group of
the simulation's ranks (DDP's collectives never interleave with the simulation's). Every trainer
creates one, with local synchronization (only its ranks take part), so trainers on sub-groups of
one job must be created in the same order on their ranks, and a job should not run trainers on
overlapping sub-groups one after another (the ranks' group counters would then differ). DDP averages
gradients over ranks; the trainer scales each rank's summed loss by ``W / N_global``, so the
average is the gradient of the global mean over samples, right also when ranks hold uneven
numbers of samples (LEARNING_NOTES.md: a per-rank mean is wrong by 0.45-0.72 there).

Compression (``compress=``), as DDP communication hooks:

- ``"none"``: a plain all-reduce (the same training on any number of ranks, to rounding);
- ``"fp16"`` / ``"bf16"``: gradients travel as 16-bit floats and are averaged back in the
  gradient's dtype; half the bytes. torch's own ``bf16_compress_hook`` refuses gloo, so both are
  written here, for any backend;
- ``"powersgd"``: PowerSGD (rank 1) with error feedback (torch's hook); matrices travel as two
  thin factors.

Compression changes the gradients, so the equality across numbers of ranks holds for ``"none"``
only. :attr:`GradientSync.compression` is the fraction of the gradient's bytes that travel.
"""

# No postponed annotations here: DDP checks a hook's annotations against the real
# dist.GradBucket and torch.futures.Future[torch.Tensor] objects.
import time
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from ..comm import Comm
from ..errors import ConfigError

__all__ = ["COMPRESSIONS", "GradientSync"]

COMPRESSIONS = ("none", "fp16", "bf16", "powersgd")


Future = torch.futures.Future[torch.Tensor]


def _cast_hook(dtype: torch.dtype) -> Any:
    """A DDP hook: the bucket travels as ``dtype``, summed, divided by the world size, cast back."""

    def hook(group: Any, bucket: dist.GradBucket) -> Future:
        buffer = bucket.buffer()
        world = group.size() if group is not None else dist.get_world_size()
        sent = buffer.to(dtype).div_(world)
        future: Future = dist.all_reduce(sent, group=group, async_op=True).get_future()

        def back(fut: Any) -> torch.Tensor:
            buffer.copy_(fut.value()[0])
            return buffer

        return future.then(back)

    return hook


class GradientSync:
    """The policy network as the trainer calls it: DDP on its own group of ``comm``'s ranks (W > 1),
    the network itself on one rank.

    Args:
        net: The network (identical on every rank; DDP broadcasts rank 0's parameters anyway).
        comm: The run's communication (its ranks form the new group).
        compress: One of :data:`COMPRESSIONS`.

    Attributes:
        module: What to call for a forward pass.
        seconds: Seconds the gradient all-reduces took (from the hook's call to its result), since
            the last :meth:`take_seconds`.
        compression: The fraction of the gradient's bytes that travel per all-reduce.
    """

    def __init__(self, net: nn.Module, comm: Comm, compress: str = "none") -> None:
        if compress not in COMPRESSIONS:
            raise ConfigError(f"compress: expected one of {', '.join(COMPRESSIONS)} (got {compress!r})")
        self.net = net
        self.compress = compress
        self.seconds = 0.0
        self.compression = _compression(net, compress)
        self.module: nn.Module = net
        if comm.world_size == 1:
            return
        base = getattr(comm, "group", None)
        ranks = dist.get_process_group_ranks(base) if base is not None else list(range(dist.get_world_size()))
        group = dist.new_group(ranks, use_local_synchronization=True)
        ddp = nn.parallel.DistributedDataParallel(net, process_group=group)
        state: Any
        hook: Any
        if compress == "powersgd":
            from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd

            state = powersgd.PowerSGDState(process_group=group, matrix_approximation_rank=1,
                                           start_powerSGD_iter=2, use_error_feedback=True, warm_start=True)
            hook = powersgd.powerSGD_hook
        elif compress in ("fp16", "bf16"):
            state, hook = group, _cast_hook(torch.float16 if compress == "fp16" else torch.bfloat16)
        else:
            from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

            state, hook = group, default_hooks.allreduce_hook
        ddp.register_comm_hook(state, self._timed(hook))
        self.module = ddp

    def _timed(self, hook: Any) -> Any:
        def timed(state: Any, bucket: dist.GradBucket) -> Future:
            t0 = time.perf_counter()

            def done(fut: Any) -> torch.Tensor:
                self.seconds += time.perf_counter() - t0
                result: torch.Tensor = fut.value()
                return result

            future: Future = hook(state, bucket).then(done)
            return future

        return timed

    def take_seconds(self) -> float:
        """The all-reduce seconds since the last call (and start counting anew)."""
        seconds, self.seconds = self.seconds, 0.0
        return seconds


def _compression(net: nn.Module, compress: str) -> float:
    """Bytes that travel over the gradient's bytes: 1 (none), 0.5 (16-bit), PowerSGD rank 1: ``(r + c)``
    numbers per ``r x c`` matrix (biases and vectors uncompressed).
    """
    if compress == "none":
        return 1.0
    if compress in ("fp16", "bf16"):
        return 0.5
    total = sent = 0
    for p in net.parameters():
        total += p.numel()
        if p.dim() >= 2:
            rows = p.shape[0]
            cols = p.numel() // rows
            sent += min(p.numel(), rows + cols)
        else:
            sent += p.numel()
    return sent / max(total, 1)
