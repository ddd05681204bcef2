"""A one-dimensional space: a road, a river, a corridor, a chromosome.

A :class:`Line` of length ``L`` is either continuous (agents at ``x`` float, in
``[0, L)``) or a row of ``L`` cells (``cells=True``: agents at ``x`` int64, a cell
``0 <= x < L``), and either periodic (a ring: ``x`` wraps, the agent at ``L - 1`` has
the one at ``0`` ahead of it) or bounded (two ends).

"Ahead" is the direction of increasing ``x``. The distance ahead from ``a`` to ``b`` is
``b - a``, plus ``L`` when it would not be positive on a ring (:meth:`Line.ahead`).
Agents read each other along the line with :func:`~agentsim.space.ordered.nearest`
(the next agents ahead or behind, or the nearest either way), within a ``reach`` that
the substep declares as a length (cells on a cell line).

The spatial partitioner cuts a line into ``W`` consecutive stretches (layouts
``"strips"`` and ``"rcb"``; a line has no second axis for ``"blocks"``). Env layers of a
cell line hold one value per cell (shape ``(L,)``).

Examples:
    >>> import torch
    >>> road = Line(10, cells=True)
    >>> road.move(torch.tensor([8, 3]), torch.tensor([3, 1])).tolist()
    [1, 4]
    >>> road.ahead(torch.tensor([8, 3]), torch.tensor([1, 4])).tolist()
    [3, 1]
    >>> Line(10.0, periodic=False).move(torch.tensor([9.5, 0.5]), torch.tensor([1.0, -1.0])).tolist()
    [10.0, 0.0]
    >>> road.occupancy(torch.tensor([1, 1, 4])).tolist()
    [0, 2, 0, 0, 1, 0, 0, 0, 0, 0]
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import ClassVar

import torch
from torch import Tensor

from agentsim.errors import ConfigError
from agentsim.space.base import SortKey

__all__ = ["Line"]


def _cell_key(x: Tensor) -> Tensor:
    return x


def _turned_round(x: Tensor, length: float | int, fresh: bool) -> Tensor:
    """``torch.remainder(x, length)`` (the same bits), in a pass that finds the positions already on
    the ring (steps shorter than the ring leave most of them there) and the few that went round
    once; a full remainder only where some went farther.
    """
    if x.numel() == 0:
        return x if fresh else x.clone()
    low, high = (v.item() for v in torch.aminmax(x))
    if not (-length <= low and high < 2 * length):  # also NaN: the general remainder
        return torch.remainder(x, length)
    out = x if fresh else x.clone()
    if high >= length:
        out[out >= length] -= length  # x - length: exact for x in [L, 2L), as remainder computes it
    if low < 0:
        out[out < 0] += length  # x + length, as remainder computes it for x in [-L, 0)
    return out


@dataclass(frozen=True)
class Line:
    """A line of length ``length``, continuous or in cells, periodic (a ring) or bounded.

    Attributes:
        length: Continuous: a positive finite float (length units). Cells: the number of
            cells, an int >= 1.
        periodic: If True the line is a ring: positions wrap and the distance ahead goes
            round; if False positions are clamped to the ends (``[0, L]`` continuous,
            cells ``0`` to ``L - 1``).
        cells: If True agents sit in cells ``x`` (int64); else at ``x`` (float).
    """

    length: float | int
    periodic: bool = True
    cells: bool = False
    #: Set by the engine on the line a substep sees (``ctx.space``): the reach the substep
    #: declares, and the declaration, so a query beyond it is an error.
    query_limit: tuple[float, str] | None = field(default=None, compare=False, repr=False)

    # The Space protocol (agentsim.space.base): agents sit at ``x``; regions are stretches of
    # the line (region coordinates (x, 0)); neighbors are read within a length.
    position_field: ClassVar[str] = "x"
    reaches: ClassVar[tuple[str, ...]] = ("length",)
    #: Region coordinates have one axis that can be cut (the spatial partitioner has no
    #: second axis to split).
    region_axes: ClassVar[int] = 1

    def __post_init__(self) -> None:
        if not isinstance(self.cells, bool):
            raise ConfigError(f"Line: expected cells to be True or False (got {self.cells!r})")
        if not isinstance(self.periodic, bool):
            raise ConfigError(f"Line: expected periodic to be True or False (got {self.periodic!r})")
        length = self.length
        if self.cells:
            if isinstance(length, bool) or not isinstance(length, int) or length < 1:
                raise ConfigError(f"Line: a line of cells has an int length >= 1 (the number of cells; "
                                  f"got {length!r})")
        else:
            if isinstance(length, bool) or not isinstance(length, (int, float)) \
                    or not (math.isfinite(length) and length > 0):
                raise ConfigError(f"Line: expected a positive finite length (got {length!r})")
            object.__setattr__(self, "length", float(length))

    # ------------------------------------------------------------------ the Space protocol
    @property
    def discrete(self) -> bool:
        """Whether positions are cells (region borders are cut at integers)."""
        return self.cells

    @property
    def region_extent(self) -> tuple[float, float]:
        """``(L, 1)``: region coordinates are ``(x, 0)``."""
        return float(self.length), 1.0

    @property
    def layer_shape(self) -> tuple[int, ...] | None:
        """``(L,)`` on a line of cells (one value per cell), else None."""
        return (int(self.length),) if self.cells else None

    def region_coords(self, position: Tensor, axis: int | None = None) -> Tensor:
        """``(x, 0)`` as float64, ``[n, 2]`` (or ``[n]`` for one ``axis``)."""
        x = position.reshape(-1).to(torch.float64)
        if axis is not None:
            return x if axis == 0 else torch.zeros_like(x)
        return torch.stack([x, torch.zeros_like(x)], -1)

    def sort_key(self, reaches: Sequence[tuple[str, float]]) -> SortKey | None:
        """Rows in order along the line: the cell, or ``floor(x / r)`` for the largest length
        reach ``r`` of a continuous line (None without one).
        """
        if self.cells:
            return _cell_key
        lengths = [value for kind, value in reaches if kind == "length" and value > 0]
        if not lengths:
            return None
        side = max(lengths)
        return lambda x: torch.div(x, side, rounding_mode="floor").to(torch.int64)

    def with_query_limit(self, reach: float, why: str) -> Line:
        """This line, refusing queries beyond ``reach`` with ``why`` in the error: a substep's
        queries must stay within the reach it declares.
        """
        return replace(self, query_limit=(reach, why))

    def outside(self, x: Tensor) -> Tensor:
        """``[n]`` bool: which positions are not on the line (``x`` outside ``[0, L)`` on a ring,
        ``[0, L]`` bounded; a cell outside ``0 .. L - 1``; NaN).
        """
        if self.cells:
            return (x < 0) | (x >= int(self.length))
        if self.periodic:
            return ~((x >= 0) & (x < self.length))
        return ~((x >= 0) & (x <= self.length))

    def describe(self) -> str:
        """``"a ring of 100 cells"``, ``"a line of length 2.5"``: for messages."""
        shape = "ring" if self.periodic else "line"
        return f"a {shape} of {int(self.length)} cells" if self.cells else f"a {shape} of length {self.length:g}"

    # ------------------------------------------------------------------ positions
    def wrap(self, x: Tensor) -> Tensor:
        """Positions mapped onto the line: modulo ``L`` on a ring, clamped to the ends if bounded.

        Args:
            x: ``[...]`` float (continuous) or integer (cells) positions.
        """
        return self._wrapped(x, fresh=False)

    def _wrapped(self, x: Tensor, fresh: bool) -> Tensor:
        """:meth:`wrap`, writing into ``x`` itself where it is ``fresh`` (a temporary of the caller)."""
        if self.cells:
            if x.dtype.is_floating_point:
                raise ConfigError(f"Line.wrap: a line of cells holds integer cells (got dtype {x.dtype})")
            n = int(self.length)
            if not self.periodic:
                return torch.clamp(x, 0, n - 1)
            return _turned_round(x, n, fresh)
        if self.periodic:
            out = _turned_round(x, self.length, fresh)
            # remainder may round a tiny negative x up to L itself: that point is 0 on the ring
            return torch.where(out >= self.length, torch.zeros_like(out), out)
        return torch.clamp(x, 0.0, self.length)

    def move(self, x: Tensor, dx: Tensor) -> Tensor:
        """``wrap(x + dx)``: positions after moving ``dx`` (a new tensor; ``[...]``)."""
        return self._wrapped(x + dx, fresh=True)

    def ahead(self, frm: Tensor, to: Tensor) -> Tensor:
        """Distance ahead from ``frm`` to ``to`` (broadcast): ``to - frm``, plus ``L`` where that is
        not positive on a ring (so in ``(0, L]``; ``L`` for the same position). Bounded: ``to - frm``
        (negative when ``to`` is behind).
        """
        d = to - frm
        if not self.periodic:
            return d
        return torch.where(d > 0, d, d + self.length if not self.cells else d + int(self.length))

    def occupancy(self, x: Tensor, weights: Tensor | None = None) -> Tensor:
        """Agents per cell of a line of cells: ``[L]`` int64 counts, or the sums of ``weights``
        ``[n]`` per cell (their dtype).
        """
        if not self.cells:
            raise ConfigError("Line.occupancy: a continuous line has no cells (use Line(L, cells=True))")
        if weights is None:
            return torch.bincount(x, minlength=int(self.length))
        out = torch.zeros(int(self.length), dtype=weights.dtype, device=weights.device)
        return out.index_add_(0, x, weights)
