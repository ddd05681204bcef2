"""Communication between ranks, behind one protocol.

The engine and the partitioners call these operations, never ``torch.distributed``
directly, so one process runs the same code path with no collectives
(:class:`LocalComm`, where every operation is the identity). The multi-rank
implementation over gloo / NCCL is :class:`agentsim.distributed.comm.TorchComm`.

Every rank must call the same operations in the same order (as for any collective).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from torch import Tensor

__all__ = ["Comm", "CommStats", "LocalComm", "Work", "post_all_gather", "row_counts"]


@dataclass
class CommStats:
    """Running totals of one rank's collectives.

    Attributes:
        calls: Number of collectives.
        bytes_sent: Bytes this rank put into collectives (payload and counts; padding included).
        seconds: Wall seconds spent inside collectives (waiting for slower ranks included).
    """

    calls: int = 0
    bytes_sent: int = 0
    seconds: float = 0.0

    def snapshot(self) -> CommStats:
        """A copy of the totals now."""
        return CommStats(self.calls, self.bytes_sent, self.seconds)

    def since(self, before: CommStats) -> CommStats:
        """The difference ``self - before`` (the collectives of one step, say)."""
        return CommStats(self.calls - before.calls, self.bytes_sent - before.bytes_sent,
                         self.seconds - before.seconds)


def row_counts(fields: Mapping[str, Tensor]) -> tuple[int, int]:
    """``(rows, bytes)`` of a dict of ``[n, ...]`` tensors (halo figures).

    Examples:
        >>> import torch
        >>> row_counts({"uid": torch.zeros(3, dtype=torch.int64), "pos": torch.zeros(3, 2)})
        (3, 48)
    """
    if not fields:
        return 0, 0
    n = next(iter(fields.values())).shape[0]
    return n, sum(t.element_size() * t.numel() for t in fields.values())


class Work(Protocol):
    """A collective started without waiting (``torch.distributed.Work``)."""

    def wait(self) -> Any:
        """Block until the collective is done."""
        ...


class Comm(Protocol):
    """The collectives a run uses (see the module docstring).

    Attributes:
        rank: This rank, ``0 <= rank < world_size``.
        world_size: Number of ranks.
        stats: Running totals of this rank's collectives.
    """

    rank: int
    world_size: int
    stats: CommStats

    def birth_offset(self, parent_uid: Tensor) -> tuple[Tensor | int, int]:
        """Per parent, the number of parents with smaller uids on other ranks (``[m]`` int64, or an
        int for all); and the global number of births.
        """
        ...

    def sum_int64(self, values: Tensor) -> Tensor:
        """Exact sum over ranks of an int64 tensor ``[k]`` (every rank calls it)."""
        ...

    def gather_rows(self, fields: Mapping[str, Tensor]) -> dict[str, Tensor] | None:
        """All ranks' rows of ``fields`` on rank 0, in rank order, on the CPU (None on the others)."""
        ...

    def all_gather_rows(self, fields: Mapping[str, Tensor], include_self: bool = True,
                        rows_per_rank: int | None = None) -> dict[str, Tensor]:
        """Every rank's rows of ``fields`` on every rank, in rank order (halos: ``include_self=False``).
        ``rows_per_rank``: every rank sends exactly that many rows (saves the exchange of counts).
        """
        ...

    def exchange_rows(self, fields: Mapping[str, Tensor], dest: Tensor,
                      index: Tensor | None = None) -> dict[str, Tensor]:
        """Point to point: row ``index[k]`` of ``fields`` goes to rank ``dest[k]`` (never this rank);
        returns the rows received, in source-rank order.
        """
        ...

    def exchange_counts(self, send: list[int]) -> list[int]:
        """``send[d]``: what this rank has for rank ``d``; returns ``recv[s]``, what rank ``s`` has for
        this one.
        """
        ...

    def post_all_to_all(self, send: Tensor, send_splits: list[int],
                        recv_splits: list[int]) -> tuple[Tensor, Work | None]:
        """Start an all-to-all of a flat uint8 buffer with uneven splits without waiting; returns the
        receive buffer (read it after :meth:`wait`) and the work (None: already done).
        """
        ...

    def wait(self, work: Work | None) -> None:
        """Wait for a collective started by :meth:`post_all_to_all`."""
        ...

    def barrier(self) -> None:
        """Wait until every rank gets here."""
        ...


class LocalComm:
    """One process: every collective is the identity (and costs nothing).

    Examples:
        >>> import torch
        >>> comm = LocalComm()
        >>> comm.sum_int64(torch.tensor([2, 3])).tolist(), comm.exchange_counts([4])
        ([2, 3], [4])
    """

    rank = 0
    world_size = 1

    def __init__(self) -> None:
        self.stats = CommStats()

    def __repr__(self) -> str:
        return "LocalComm()"

    def birth_offset(self, parent_uid: Tensor) -> tuple[Tensor | int, int]:
        """No parents on other ranks: offset 0, and the local count."""
        return 0, int(parent_uid.shape[0])

    def sum_int64(self, values: Tensor) -> Tensor:
        """The values themselves."""
        return values

    def gather_rows(self, fields: Mapping[str, Tensor]) -> dict[str, Tensor] | None:
        """This rank's rows, on the CPU."""
        return {k: v.detach().cpu() for k, v in fields.items()}

    def all_gather_rows(self, fields: Mapping[str, Tensor], include_self: bool = True,
                        rows_per_rank: int | None = None) -> dict[str, Tensor]:
        """This rank's rows (or none of them, with ``include_self=False``)."""
        return dict(fields) if include_self else {k: v[:0] for k, v in fields.items()}

    def exchange_rows(self, fields: Mapping[str, Tensor], dest: Tensor,
                      index: Tensor | None = None) -> dict[str, Tensor]:
        """Nothing arrives: there is no other rank to send rows to."""
        if dest.numel():
            raise ValueError(f"exchange_rows: one process has no rank to send to (got {dest.numel()} rows)")
        return {k: v[:0] for k, v in fields.items()}

    def exchange_counts(self, send: list[int]) -> list[int]:
        """What this rank has for itself."""
        return list(send)

    def post_all_to_all(self, send: Tensor, send_splits: list[int],
                        recv_splits: list[int]) -> tuple[Tensor, Work | None]:
        """The buffer itself, already done."""
        if list(send_splits) != list(recv_splits):
            raise ValueError(f"post_all_to_all: one process receives what it sends (got {send_splits} "
                             f"and {recv_splits})")
        return send.clone(), None

    def wait(self, work: Work | None) -> None:
        """Nothing to wait for."""

    def barrier(self) -> None:
        """Nothing to wait for."""


def post_all_gather(comm: Comm, row: Tensor) -> tuple[Tensor, Work | None]:
    """Start gathering every rank's ``row`` (``[b]`` uint8, the same ``b`` on every rank) without
    waiting: one all-to-all of ``W`` copies of it. Returns the receive buffer (``[W * b]`` uint8,
    rank by rank; read it after ``comm.wait(work)``) and the work (None: already done).

    Examples:
        >>> import torch
        >>> got, work = post_all_gather(LocalComm(), torch.tensor([1, 2], dtype=torch.uint8))
        >>> got.tolist(), work is None
        ([1, 2], True)
    """
    world, size = comm.world_size, row.numel()
    return comm.post_all_to_all(row.reshape(-1).repeat(world), [size] * world, [size] * world)
