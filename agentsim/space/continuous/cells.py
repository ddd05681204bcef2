"""The global cell grid of a box for a search radius (:class:`CellGrid`)."""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from agentsim.errors import ConfigError

if TYPE_CHECKING:
    from agentsim.space.continuous.box import Box


def wrap_dim(x: Tensor, length: float) -> Tensor:
    """Periodic wrap of coordinates along one dim into ``[0, L)``: ``remainder(x, L)``,
    with the remainder of a tiny negative ``x``, which rounds to exactly L, set to 0.
    """
    r = torch.remainder(x, length)
    return r.masked_fill_(r >= length, 0.0)


__all__ = ["MAX_CELLS", "CellGrid", "check_radius"]

# Largest number of cells a grid may have; keeps linear cell ids in int64.
MAX_CELLS = 2**62


def check_radius(radius: float) -> float:
    """Validate a search radius (positive, finite)."""
    try:
        r = float(radius)
    except (TypeError, ValueError):
        raise ConfigError(f"Expected a positive finite radius (got {radius!r}).") from None
    if not (math.isfinite(r) and r > 0):
        raise ConfigError(f"Expected a positive finite radius (got {radius!r}).")
    return r


@dataclass(frozen=True)
class CellGrid:
    """The global cell grid of a box for a search radius.

    Periodic dims have ``n_d = max(1, floor(L_d / radius))`` cells of side
    ``L_d / n_d >= radius``; bounded dims have ``n_d = max(1, ceil(L_d /
    radius))`` cells of side ``radius`` (the last may stick out of the box) and
    positions outside the box are clamped into the first / last cell, which
    keeps agents within ``radius`` of each other in adjacent cells. Cell ids are
    row-major over ``(c_0, ..., c_{d-1})``.

    Attributes:
        box: The box.
        radius: Search radius (length units).
        shape: Number of cells per dim.
        side: Cell side per dim (length units).
    """

    box: Box
    radius: float
    shape: tuple[int, ...] = field(init=False)
    side: tuple[float, ...] = field(init=False)

    def __post_init__(self) -> None:
        radius = check_radius(self.radius)
        object.__setattr__(self, "radius", radius)
        if self.box.periodic:
            shape = tuple(max(1, math.floor(n / radius)) for n in self.box.size)
            side = tuple(n / c for n, c in zip(self.box.size, shape, strict=True))
        else:
            shape = tuple(max(1, math.ceil(n / radius)) for n in self.box.size)
            side = (radius,) * self.box.ndim
        if math.prod(shape) > MAX_CELLS:
            raise ConfigError(
                f"Expected at most 2**62 cells (got {math.prod(shape)} for box "
                f"{self.box.size} and radius {radius}); use a larger radius."
            )
        object.__setattr__(self, "shape", shape)
        object.__setattr__(self, "side", side)

    @property
    def n_cells(self) -> int:
        """Total number of cells."""
        return math.prod(self.shape)

    def coords(self, pos: Tensor) -> Tensor:
        """Integer cell coordinates of positions.

        Args:
            pos: Positions, ``[n, ndim]`` float (length units).

        Returns:
            ``[n, ndim]`` int64 in ``[0, shape_d)``, computed in float64.
        """
        return torch.stack(self.coord_columns(pos), dim=1)

    def coord_columns(self, pos: Tensor, dtype: torch.dtype = torch.int64) -> list[Tensor]:
        """:meth:`coords` one dim at a time: ``ndim`` contiguous ``[n]`` tensors of ``dtype``.

        Each is ``floor(x / side_d)`` clamped into ``[0, shape_d)``, with ``x`` the
        position in float64, wrapped first when periodic. ``dtype`` (int64, or int32 for
        less memory) must hold ``shape_d``.
        """
        out = []
        for k, (length, side, n_k) in enumerate(zip(self.box.size, self.side, self.shape, strict=True)):
            x = pos[:, k].to(torch.float64)
            if self.box.periodic:
                x = wrap_dim(x, length)
            c = (x / side).floor_().clamp_(min=0, max=n_k - 1).to(dtype)  # x may be a view of pos
            out.append(c)
        return out

    def linear(self, coords: Tensor) -> Tensor:
        """Row-major cell id of ``[..., ndim]`` int64 coordinates, ``[...]``."""
        return self._linear_columns(coords.unbind(-1))

    def cell_id(self, pos: Tensor) -> Tensor:
        """Row-major cell id of positions ``[n, ndim]``, ``[n]`` int64."""
        return self._linear_columns(self.coord_columns(pos))

    def _linear_columns(self, cols: Sequence[Tensor]) -> Tensor:
        """Row-major cell id from one coordinate tensor per dim (all the same shape)."""
        cid = cols[0]
        for d in range(1, self.box.ndim):
            cid = cid * self.shape[d] + cols[d]
        return cid

    def dim_offsets(self) -> list[tuple[int, ...]]:
        """Per-dim neighbor-cell offsets, ascending and consecutive.

        A periodic dim with 2 cells keeps ``(-1, 0)`` and one with 1 cell keeps
        ``(-1,)``: the first offset of each group landing on the same cell.
        A bounded dim with 1 cell keeps ``(0,)`` since the others leave it.
        """
        per_dim: list[tuple[int, ...]] = []
        for n in self.shape:
            if n >= 3:
                per_dim.append((-1, 0, 1))
            elif self.box.periodic:
                per_dim.append((-1, 0) if n == 2 else (-1,))
            else:
                per_dim.append((-1, 0, 1) if n == 2 else (0,))
        return per_dim

    def offsets(self) -> list[tuple[int, ...]]:
        """Neighbor-cell offsets in the fixed (lexicographic) visiting order."""
        return list(itertools.product(*self.dim_offsets()))
