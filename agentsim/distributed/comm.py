"""The :class:`~agentsim.core.comm.Comm` protocol over ``torch.distributed`` (gloo on CPU, NCCL on CUDA).

Every exchange of agent rows is two collectives: one for the row counts (one int64
per rank) and one for the payload. All fields of one exchange travel in ONE buffer:
each field's rows are viewed as bytes ``[n, nbytes]``, the fields are concatenated
along dim 1 into ``[n, row_bytes]`` uint8, exchanged, and cut apart again. Bytes are
moved, never converted, so received values have the sender's exact bits.

gloo cannot exchange uneven sizes with ``all_gather`` or ``gather`` (``gather`` even
hangs the non-root ranks), so:

- everyone needs everything (halos, birth uids): all_gather the counts, pad every
  buffer to the largest count, ``all_gather_single`` into a flat buffer, slice;
- only rank 0 needs the rows (trajectory frames): ``all_to_all_single`` with uneven
  splits, in which every rank sends its rows to rank 0 and nothing to the others.

Each rank must call the same methods in the same order (as for any collective); a
mismatch raises or times out after the process group's ``timeout``.

No hangs, and errors that name the culprit: a collective that fails (the group's timeout ran
out, or a peer closed its connection because it died) raises a
:class:`~agentsim.errors.CollectiveError` on every rank that was in it. Before raising, the
rank leaves a note in the process group's store (``agentsim/failed/R``) and waits up to
:data:`FAILURE_GRACE_SECONDS` for the other ranks' notes: the ranks that left none never
reached the collective (stuck in their own code, or dead), and the message names them.

:class:`CommStats` counts the bytes this rank sent and the seconds it spent inside
collectives (the sum over calls; including waiting for slower ranks).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from agentsim.core.comm import CommStats, Work, row_counts
from agentsim.errors import CollectiveError

__all__ = ["FAILURE_GRACE_SECONDS", "CommStats", "TorchComm", "pack_rows", "row_counts", "unpack_rows"]

#: Seconds a rank whose collective failed waits for the other ranks' notes before it raises.
FAILURE_GRACE_SECONDS = 3.0


# --------------------------------------------------------------------------- packing
def _row_bytes(t: Tensor) -> int:
    return t.element_size() * math.prod(t.shape[1:])


def pack_rows(fields: Mapping[str, Tensor]) -> Tensor:
    """Concatenate the bytes of every field's rows: ``[n, sum(row_bytes)]`` uint8.

    Args:
        fields: Name to ``[n, ...]`` tensor (same ``n`` for all; any dtype with a byte view).

    Examples:
        >>> f = {"uid": torch.tensor([3, 9]), "pos": torch.tensor([[0.5, 1.0], [2.0, -1.0]])}
        >>> packed = pack_rows(f)
        >>> packed.shape
        torch.Size([2, 16])
        >>> back = unpack_rows(packed, f)
        >>> bool(torch.equal(back["pos"], f["pos"])) and bool(torch.equal(back["uid"], f["uid"]))
        True
        >>> unpack_rows(pack_rows({"none": torch.zeros(2, 0)}), {"none": torch.zeros(2, 0)})["none"].shape
        torch.Size([2, 0])
    """
    tensors = list(fields.values())
    if not tensors:
        return torch.zeros(0, 0, dtype=torch.uint8)
    n = tensors[0].shape[0]
    # An empty tensor counts as contiguous whatever its strides, and view() needs a
    # last stride of 1: give it fresh memory.
    parts = [(t.detach().contiguous() if t.numel() else torch.empty_like(t, memory_format=torch.contiguous_format))
             .view(torch.uint8).reshape(n, _row_bytes(t)) for t in tensors]
    return torch.cat(parts, dim=1) if len(parts) > 1 else parts[0]


def unpack_rows(packed: Tensor, like: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """Inverse of :func:`pack_rows`: fields with the dtypes and trailing shapes of ``like``."""
    n = packed.shape[0]
    out: dict[str, Tensor] = {}
    offset = 0
    for name, t in like.items():
        nb = _row_bytes(t)
        # A fresh dense buffer: a column slice may look contiguous (n <= 1) with a stride
        # or storage offset that a view as a wider dtype rejects.
        if nb == 0:  # a field of no columns ([n, 0]): nothing to view
            out[name] = torch.empty((n, *t.shape[1:]), dtype=t.dtype, device=packed.device)
            continue
        column = packed.new_empty((n, nb)).copy_(packed[:, offset:offset + nb])
        out[name] = column.view(t.dtype).reshape(n, *t.shape[1:])
        offset += nb
    return out


# --------------------------------------------------------------------------- comm

def all_gather_single(out: Tensor, flat: Tensor, group: Any = None) -> None:
    """Every rank of ``group``'s 1-D ``flat`` into ``out`` (``[world_size * flat.numel()]``), in rank
    order: ``dist.all_gather_single`` where torch has it (2.13 and later), else ``dist.all_gather``
    into views of ``out`` (older torch; gloo and NCCL alike). The same bytes either way.
    """
    gather = getattr(dist, "all_gather_single", None)
    if gather is not None:
        gather(out, flat, group=group)
    else:
        dist.all_gather(list(out.chunk(dist.get_world_size(group))), flat, group=group)

class TorchComm:
    """Collectives of one rank of an initialized ``torch.distributed`` process group.

    Args:
        group: The process group (default: the default group).
        device: Where exchange buffers live: CUDA for NCCL; CPU (the default) for gloo.
            Inputs on another device are copied there and results copied back.

    Attributes:
        rank, world_size: This rank and the number of ranks of ``group``.
        stats: :class:`CommStats` running totals.
    """

    def __init__(self, group: dist.ProcessGroup | None = None, device: torch.device | str | None = None,
                 store: dist.Store | None = None) -> None:
        self.group, self.store = group, store
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)
        if device is None:
            device = "cuda" if dist.get_backend(group) == "nccl" else "cpu"
        self.device = torch.device(device)
        self.stats = CommStats()

    def __repr__(self) -> str:
        return f"TorchComm(rank={self.rank}, world_size={self.world_size}, device={self.device})"

    # ------------------------------------------------------------ timed primitives
    def _timed(self, nbytes: int, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            result = fn(*args, group=self.group, **kwargs)
        except RuntimeError as e:  # gloo/NCCL: a timeout, or a peer that went away
            raise self._failed(getattr(fn, "__name__", "collective"), time.perf_counter() - t0, e) from e
        self.stats.seconds += time.perf_counter() - t0
        self.stats.calls += 1
        self.stats.bytes_sent += nbytes
        return result

    def _failed(self, op: str, waited: float, error: RuntimeError) -> CollectiveError:
        """The error for a failed collective, naming the ranks that never reached it."""
        what = f"rank {self.rank}: {op} (collective {self.stats.calls + 1}) failed after {waited:.1f} s"
        cause = f" [{_backend_reason(error)}]"
        if self.store is None:
            return CollectiveError(what + cause)
        started = time.time() - waited
        try:
            absent, earlier = _absent_ranks(self.store, self.rank, self.world_size, started)
        except Exception as e:  # the store's host (rank 0, or torchrun's agent) may be gone too
            return CollectiveError(f"{what}: could not ask the other ranks ({type(e).__name__}: the store is "
                                   f"unreachable: the process that hosts it may be dead){cause}")
        if absent:
            ranks = ", ".join(map(str, absent))
            return CollectiveError(f"{what}: rank{'s' if len(absent) > 1 else ''} {ranks} never arrived (stuck "
                                   f"outside collectives, in a substep?, or dead){cause}")
        if earlier:
            ranks = ", ".join(map(str, earlier))
            return CollectiveError(f"{what}: rank{'s' if len(earlier) > 1 else ''} {ranks} had given up on a "
                                   "collective before this rank reached it: this rank came late (stuck outside "
                                   f"collectives for longer than the timeout?){cause}")
        return CollectiveError(f"{what}: every rank reported a failed collective (a mismatch of collectives "
                               f"between ranks, or a network failure){cause}")

    def _all_gather_counts(self, n: int) -> list[int]:
        mine = torch.tensor([n], dtype=torch.int64, device=self.device)
        out = torch.empty(self.world_size, dtype=torch.int64, device=self.device)
        self._timed(8, all_gather_single, out, mine)
        return out.tolist()

    def _all_gather_padded(self, rows: Tensor, rows_per_rank: int | None = None) -> tuple[list[Tensor], list[int]]:
        """Every rank's ``rows`` (``[n_r, *trailing]``, same trailing shape and dtype everywhere);
        with ``rows_per_rank``, every ``n_r`` is that (one collective instead of two).
        """
        if rows_per_rank is not None:
            if rows.shape[0] != rows_per_rank:
                raise ValueError(f"all_gather_rows: expected {rows_per_rank} rows on every rank (got {rows.shape[0]})")
            counts = [rows_per_rank] * self.world_size
        else:
            counts = self._all_gather_counts(rows.shape[0])
        n_max = max(counts)
        trailing = tuple(rows.shape[1:])
        if n_max == 0:
            return [rows.new_empty((0, *trailing)) for _ in counts], counts
        padded = rows.new_zeros((n_max, *trailing), device=self.device)
        padded[: rows.shape[0]] = rows.to(self.device)
        flat = padded.reshape(-1)
        out = flat.new_empty(self.world_size * flat.numel())
        self._timed(flat.numel() * flat.element_size(), all_gather_single, out, flat)
        blocks = out.view(self.world_size, n_max, *trailing)
        return [blocks[r, :c] for r, c in enumerate(counts)], counts

    # ------------------------------------------------------------ Comm protocol
    def birth_offset(self, parent_uid: Tensor) -> tuple[Tensor, int]:
        """Per parent, the number of parents with a smaller uid on other ranks; and the global count.

        With these, ``Population.spawn`` gives each child ``next_uid + (rank of its parent's
        uid among all parents of all ranks)``: the uid it gets on one process.

        Args:
            parent_uid: ``[m]`` int64 distinct uids of this rank's parents.

        Returns:
            ``(offset [m] int64 on parent_uid's device, total births over ranks)``.
        """
        uid = parent_uid.to(torch.int64)
        blocks, counts = self._all_gather_padded(uid)
        others = [b for r, b in enumerate(blocks) if r != self.rank]
        other = torch.sort(torch.cat(others)).values if others else uid.new_empty(0)
        offset = torch.searchsorted(other.to(uid.device), uid)
        return offset, int(sum(counts))

    def sum_int64(self, values: Tensor) -> Tensor:
        """Exact sum over ranks of an int64 tensor (all_reduce SUM)."""
        buf = values.to(device=self.device, dtype=torch.int64).clone()
        self._timed(buf.numel() * 8, dist.all_reduce, buf, op=dist.ReduceOp.SUM)
        return buf.to(values.device)

    def all_gather_rows(self, fields: Mapping[str, Tensor], include_self: bool = True,
                        rows_per_rank: int | None = None) -> dict[str, Tensor]:
        """Every rank's rows of ``fields``, concatenated in rank order (one packed exchange).

        Args:
            fields: Name to ``[n_local, ...]`` tensor; the same names, dtypes and trailing
                shapes on every rank.
            include_self: Whether this rank's own rows are part of the result (a halo
                leaves them out).
            rows_per_rank: Every rank sends exactly this many rows: one collective instead
                of two (no exchange of counts).

        Returns:
            Name to ``[n, ...]`` on the input device.
        """
        if not fields:
            return {}
        device = next(iter(fields.values())).device
        blocks, _ = self._all_gather_padded(pack_rows(fields), rows_per_rank)
        keep = [b for r, b in enumerate(blocks) if include_self or r != self.rank]
        packed = torch.cat(keep) if keep else blocks[0][:0]
        return {k: v.to(device) for k, v in unpack_rows(packed, fields).items()}

    def gather_rows(self, fields: Mapping[str, Tensor]) -> dict[str, Tensor] | None:
        """All ranks' rows on rank 0 (CPU tensors, rank order); None on the other ranks."""
        if not fields:
            return {} if self.rank == 0 else None
        packed = pack_rows(fields).to(self.device)
        row_bytes = packed.shape[1]
        counts = self._all_gather_counts(packed.shape[0])
        send = [packed.shape[0] * row_bytes if r == 0 else 0 for r in range(self.world_size)]
        recv = [c * row_bytes for c in counts] if self.rank == 0 else [0] * self.world_size
        out = packed.new_empty(sum(recv))
        self._timed(packed.numel(), dist.all_to_all_single, out, packed.reshape(-1),
                    output_split_sizes=recv, input_split_sizes=send)
        if self.rank != 0:
            return None
        rows = out.view(sum(counts), row_bytes).cpu()
        return unpack_rows(rows, {k: v[:0].cpu() for k, v in fields.items()})

    def exchange_rows(self, fields: Mapping[str, Tensor], dest: Tensor,
                      index: Tensor | None = None) -> dict[str, Tensor]:
        """Point-to-point rows: row ``index[k]`` of ``fields`` goes to rank ``dest[k]`` (one packed exchange).

        Two collectives: the per-destination row counts (``all_to_all_single`` on an int64
        ``[W]``), then the packed rows with uneven splits (nothing travels to ranks that
        need nothing). A row may go to several ranks (halos) by repeating it in ``index``.

        Args:
            fields: Name to ``[n, ...]`` tensor; the same names, dtypes and trailing shapes
                on every rank.
            dest: ``[m]`` int64 destination rank of each sent row (never this rank).
            index: ``[m]`` int64 rows of ``fields`` to send (default: ``arange(n)``, ``m = n``).

        Returns:
            The received rows, in source-rank order (name to ``[n_received, ...]`` on the
            input device).
        """
        device = next(iter(fields.values())).device
        dest = dest.to(device, torch.int64)
        if dest.numel() > 1 and not bool((dest[1:] >= dest[:-1]).all()):  # send lists come sorted
            order = torch.argsort(dest, stable=True)
            index = order if index is None else index.to(device)[order]
            dest = dest[order]
        if index is not None:  # select the sent rows before packing: fewer bytes to copy
            index = index.to(device)
            fields = {k: v.index_select(0, index) for k, v in fields.items()}
        packed = pack_rows(fields).to(self.device)
        row_bytes = packed.shape[1]
        send_counts = torch.bincount(dest, minlength=self.world_size).tolist()
        recv_counts = self.exchange_counts(send_counts)
        send = [int(c) * row_bytes for c in send_counts]
        recv = [int(c) * row_bytes for c in recv_counts]
        out = packed.new_empty(sum(recv))
        self._timed(packed.numel(), dist.all_to_all_single, out, packed.reshape(-1),
                    output_split_sizes=recv, input_split_sizes=send)
        rows = out.view(sum(recv) // row_bytes if row_bytes else 0, row_bytes)
        return {k: v.to(device) for k, v in unpack_rows(rows, {k: v[:0] for k, v in fields.items()}).items()}

    def exchange_counts(self, send: list[int]) -> list[int]:
        """``send[d]``: what this rank has for rank ``d``; returns ``recv[s]``, what rank ``s`` has
        for this one (one all_to_all_single of ``W`` int64).
        """
        mine = torch.tensor(send, dtype=torch.int64, device=self.device)
        out = torch.empty_like(mine)
        self._timed(8 * self.world_size, dist.all_to_all_single, out, mine)
        return [int(c) for c in out.tolist()]

    def post_all_to_all(self, send: Tensor, send_splits: list[int],
                        recv_splits: list[int]) -> tuple[Tensor, Work | None]:
        """Start an ``all_to_all_single`` of a flat uint8 buffer with uneven splits, without
        waiting; returns ``(receive buffer, work)``. Finish with :meth:`wait`; read the buffer
        only after that. Every rank must post its part (a collective).
        """
        send = send.to(self.device)
        out = send.new_empty(sum(recv_splits))
        work = self._timed(send.numel(), dist.all_to_all_single, out, send, output_split_sizes=recv_splits,
                           input_split_sizes=send_splits, async_op=True)
        return out, work

    def wait(self, work: Work | None) -> None:
        """Wait for a collective started by :meth:`post_all_to_all` (timed as communication)."""
        if work is None:
            return
        t0 = time.perf_counter()
        try:
            work.wait()
        except RuntimeError as e:
            raise self._failed("all_to_all_single", time.perf_counter() - t0, e) from e
        self.stats.seconds += time.perf_counter() - t0

    def barrier(self) -> None:
        """Wait until every rank gets here."""
        self._timed(0, dist.barrier)


def _absent_ranks(store: dist.Store, rank: int, world_size: int, started: float) -> tuple[list[int], list[int]]:
    """Leave a note (the time this rank gave up) under ``agentsim/failed/RANK`` in ``store``;
    return the ranks that left none within :data:`FAILURE_GRACE_SECONDS` (they never reached a
    collective), and those whose note says they gave up before ``started`` (a time.time() at
    which this rank entered its collective: it came late).
    """
    store.set(f"agentsim/failed/{rank}", repr(time.time()))
    keys = {r: f"agentsim/failed/{r}" for r in range(world_size) if r != rank}
    deadline = time.monotonic() + FAILURE_GRACE_SECONDS
    store.set_timeout(timedelta(seconds=max(1.0, FAILURE_GRACE_SECONDS)))
    noted: list[int] = []
    while keys and time.monotonic() < deadline:
        arrived = [r for r, k in keys.items() if store.check([k])]
        noted += arrived
        keys = {r: k for r, k in keys.items() if r not in arrived}
        if keys:
            time.sleep(0.05)
    earlier = sorted(r for r in noted if float(store.get(f"agentsim/failed/{r}").decode()) < started)
    return sorted(keys), earlier


def _backend_reason(error: RuntimeError) -> str:
    """The backend's error in one short line (gloo's file:line prefix and advice dropped)."""
    text = " ".join(str(error).split()) or type(error).__name__
    if text.startswith("[") and "] " in text:
        text = text.split("] ", 1)[1]
    text = text.split(" This is typically caused by", 1)[0]
    if "Application timeout caused pair closure" in text:  # another collective on the pair timed out first
        return "Timed out: a collective in flight on the same connection timed out first and closed it"
    return text if len(text) <= 160 else text[:157] + "..."
