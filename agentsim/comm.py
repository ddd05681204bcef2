"""Communication between ranks, behind one small interface.

The engine calls these few operations, never torch.distributed directly, so one
process runs the same code path with no collectives (:class:`LocalComm`). The
multi-rank implementation (gloo / NCCL) provides the same methods.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from torch import Tensor


class Comm(Protocol):
    rank: int
    world_size: int

    def birth_offset(self, parent_uid: Tensor) -> tuple[Tensor | int, int]:
        """(per parent, the number of parents with smaller uids on other ranks, ``[m]`` int64 or
        an int for all; global number of births)."""
        ...

    def any_flags(self, flags: Tensor) -> Tensor:
        """Elementwise OR of bool flags ``[k]`` over ranks (every rank calls it once per step)."""
        ...

    def sum_int64(self, values: Tensor) -> Tensor:
        """Sum an int64 tensor ``[k]`` over ranks (exact; every rank calls it)."""
        ...

    def gather_rows(self, fields: Mapping[str, Tensor]) -> dict[str, Tensor] | None:
        """All ranks' rows of a population on the writing rank (None on the others)."""
        ...

    def all_gather_rows(self, fields: Mapping[str, Tensor], include_self: bool = True,
                        rows_per_rank: int | None = None) -> dict[str, Tensor]:
        """Every rank's rows of ``fields`` on every rank, in rank order (halos: ``include_self=False``).
        ``rows_per_rank``: every rank sends exactly that many rows (saves the exchange of counts)."""
        ...


class LocalComm:
    """One process: every collective is the identity."""

    rank = 0
    world_size = 1

    def birth_offset(self, parent_uid: Tensor) -> tuple[Tensor | int, int]:
        return 0, int(parent_uid.shape[0])

    def any_flags(self, flags: Tensor) -> Tensor:
        return flags

    def sum_int64(self, values: Tensor) -> Tensor:
        return values

    def gather_rows(self, fields: Mapping[str, Tensor]) -> dict[str, Tensor] | None:
        return {k: v.detach().cpu() for k, v in fields.items()}

    def all_gather_rows(self, fields: Mapping[str, Tensor], include_self: bool = True,
                        rows_per_rank: int | None = None) -> dict[str, Tensor]:
        return dict(fields) if include_self else {k: v[:0] for k, v in fields.items()}
