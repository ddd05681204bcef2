"""Gradient synchronization for training on several ranks: exact fixed-point sums (the default),
or DistributedDataParallel on a process group of its own with an optional compression hook; timed.

**Exact** (``sync="exact"``): the trainer computes the gradient of each *chunk* of a minibatch
(the rows of one tile of :data:`~agentsim.core.policy.TILE` uids, at most :data:`CHUNK` rows; a tile
always sits whole on one rank, so the chunks and their gradients do not depend on the number of
ranks) and :meth:`GradientSync.reduce_exact` sums them in int64 fixed point, over chunks and over
ranks: integer sums are associative, so the result has the same bits on any number of ranks. The
scale is per parameter element, from the largest chunk gradient over all ranks (an order-free max):
``step = 2**(e + h - 62)`` with ``|g| < 2**e`` and ``2**h`` above the number of chunks, so no
sum overflows and the resolution is about ``2**-40`` of the largest chunk's gradient. Two
collectives per minibatch (an all-gather of the maxima, an int64 all-reduce of the sums).

**DDP** (``sync="ddp"``): the policy network is wrapped in
``torch.nn.parallel.DistributedDataParallel`` on a new group of the simulation's ranks (DDP's
collectives never interleave with the simulation's). Every such trainer creates one, with local
synchronization (only its ranks take part), so trainers on sub-groups of one job must be created
in the same order on their ranks, and a job should not run trainers on overlapping sub-groups one
after another (the ranks' group counters would then differ). DDP averages
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
only (to rounding with DDP, bitwise with exact sums). :attr:`GradientSync.compression` is the
fraction of the gradient's bytes that travel.
"""

# No postponed annotations here: DDP checks a hook's annotations against the real
# dist.GradBucket and torch.futures.Future[torch.Tensor] objects.
import time
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from agentsim.core.comm import Comm
from agentsim.errors import ConfigError

__all__ = ["CHUNK", "COMPRESSIONS", "GradientSync", "chunk_bounds"]

COMPRESSIONS = ("none", "fp16", "bf16", "powersgd")
CHUNK = 2048  # most rows in one chunk's backward pass (bounded shapes: thread-count-independent bits)


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
        comm: The run's communication (its ranks form DDP's new group).
        compress: One of :data:`COMPRESSIONS`.
        sync: ``"exact"`` (:meth:`reduce_exact`, no DDP) or ``"ddp"``.

    Attributes:
        module: What to call for a forward pass.
        seconds: Seconds the gradient all-reduces took (from the hook's call to its result), since
            the last :meth:`take_seconds`.
        compression: The fraction of the gradient's bytes that travel per all-reduce.
    """

    def __init__(self, net: nn.Module, comm: Comm, compress: str = "none", sync: str = "ddp") -> None:
        if compress not in COMPRESSIONS:
            raise ConfigError(f"compress: expected one of {', '.join(COMPRESSIONS)} (got {compress!r})")
        if sync not in ("exact", "ddp") or (sync == "exact" and compress != "none"):
            raise ConfigError(f"sync: expected 'exact' (without compression) or 'ddp' (got {sync!r} with "
                              f"compress={compress!r})")
        self.net = net
        self.comm = comm
        self.compress = compress
        self.exact = sync == "exact"
        self.seconds = 0.0
        self.compression = _compression(net, compress)
        self.module: nn.Module = net
        if comm.world_size == 1 or self.exact:
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

    def reduce_exact(self, grads: torch.Tensor, chunks_bound: int) -> torch.Tensor:
        """The sum over chunks and ranks of per-chunk gradients (a collective on several ranks).

        Args:
            grads: ``[c, P]`` this rank's chunk gradients (flattened parameters), any float dtype.
            chunks_bound: An upper bound of the number of chunks over all ranks (the same on every rank).

        Returns:
            ``[P]`` float64, the same bits on any number of ranks for the same chunks.
        """
        t0 = time.perf_counter()
        width = grads.shape[1]
        peak = grads.abs().amax(0).double() if grads.shape[0] else grads.new_zeros(width, dtype=torch.float64)
        if self.comm.world_size > 1:
            peak = self.comm.all_gather_rows({"peak": peak[None]}, rows_per_rank=1)["peak"].amax(0)
        if not bool(torch.isfinite(peak).all()):  # every rank sees the gathered peak: all raise together
            from agentsim.errors import SimulationError

            raise SimulationError("gradient is not finite (NaN or inf) on some rank: lower the learning rate "
                                  "or check the reward and observations for NaN")
        _, exponent = torch.frexp(peak)  # peak < 2**exponent
        shift = 62 - exponent.to(torch.int64) - max(int(chunks_bound), 1).bit_length()
        fixed = torch.ldexp(grads.double(), shift).round_().to(torch.int64).sum(0) if grads.shape[0] \
            else torch.zeros(width, dtype=torch.int64, device=grads.device)
        total = self.comm.sum_int64(fixed) if self.comm.world_size > 1 else fixed
        self.seconds += time.perf_counter() - t0
        return torch.ldexp(total.double(), -shift)

    def take_seconds(self) -> float:
        """The all-reduce seconds since the last call (and start counting anew)."""
        seconds, self.seconds = self.seconds, 0.0
        return seconds


def chunk_bounds(uid: torch.Tensor, tile: int, cap: int = CHUNK) -> list[tuple[int, int]]:
    """``[(start, stop), ...]``: the rows of ``uid`` (``[m]``, sorted) cut where the tile ``uid // tile``
    changes, and every ``cap`` rows within a tile.
    """
    m = int(uid.shape[0])
    if m == 0:
        return []
    uid = uid.cpu()  # bounds are Python ints: work where they end up
    tile_of = torch.div(uid, tile, rounding_mode="floor")
    new_tile = torch.ones(m, dtype=torch.bool)
    new_tile[1:] = tile_of[1:] != tile_of[:-1]
    start_of_tile = torch.cummax(torch.where(new_tile, torch.arange(m), 0), 0).values
    cut = new_tile | ((torch.arange(m) - start_of_tile) % cap == 0)
    starts = torch.nonzero(cut).squeeze(1).tolist()
    return list(zip(starts, [*starts[1:], m], strict=True))


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
