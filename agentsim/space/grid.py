"""Rectangular 2D grids of cells: indexing, neighborhoods, occupancy, neighbor sums.

A :class:`Grid` of shape ``(height, width)`` numbers its cells row-major:
``flat = row * width + col``. It is either periodic (a torus: rows and columns
wrap) or bounded (cells outside the grid do not exist).

Neighborhoods are lists of offsets ``(drow, dcol)``:

* ``"moore"`` of radius ``r``: ``max(|drow|, |dcol|) <= r`` (the 8 surrounding
  cells for ``r = 1``);
* ``"von_neumann"`` of radius ``r``: ``|drow| + |dcol| <= r`` (the 4 edge-adjacent
  cells for ``r = 1``);

without ``(0, 0)`` unless ``include_center=True``. Offsets always come in one
fixed order, lexicographic in ``(drow, dcol)``, so column ``j`` of
:meth:`Grid.neighbor_cells` means the same offset for every cell.

Two conventions follow from that fixed list:

* Bounded grids: a neighbor outside the grid is reported as ``-1`` by
  :meth:`Grid.neighbor_cells` and contributes zero to :meth:`Grid.neighbor_sum`
  (zero padding).
* Periodic grids smaller than the neighborhood (``height`` or ``width`` at most
  ``2 * radius``): several offsets wrap onto the same cell, possibly the cell
  itself. Every offset is kept, so such a cell appears several times in a row of
  :meth:`Grid.neighbor_cells` and is counted as many times by
  :meth:`Grid.neighbor_sum`. The two methods always agree:
  ``neighbor_sum(layer).flatten()[c] == layer.flatten()[neighbor_cells(c)].sum()``.

Examples:
    >>> import torch
    >>> grid = Grid((3, 4), periodic=True)
    >>> grid.n_cells
    12
    >>> grid.offsets("von_neumann").tolist()
    [[-1, 0], [0, -1], [0, 1], [1, 0]]
    >>> grid.neighbor_cells(torch.tensor([0]), kind="von_neumann").tolist()
    [[8, 3, 1, 4]]
    >>> Grid((3, 4), periodic=False).neighbor_cells(torch.tensor([0]), "von_neumann").tolist()
    [[-1, -1, 1, 4]]
    >>> layer = torch.ones(3, 4, dtype=torch.int64)
    >>> Grid((3, 4), periodic=False).neighbor_sum(layer).tolist()
    [[3, 5, 5, 3], [5, 8, 8, 5], [3, 5, 5, 3]]
    >>> grid.occupancy(torch.tensor([0, 0, 5])).tolist()
    [2, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0]
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor

from agentsim._native import kernels as cpu_kernels
from agentsim.errors import ConfigError, did_you_mean
from agentsim.space.base import SortKey

__all__ = ["NEIGHBORHOODS", "Grid"]

NEIGHBORHOODS: tuple[str, ...] = ("moore", "von_neumann")


def _cell_key(cells: Tensor) -> Tensor:
    return cells


def _check_int(name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"Expected {name} to be an int (got {type(value).__name__} {value!r})")
    if value < minimum:
        raise ConfigError(f"Expected {name} >= {minimum} (got {value})")
    return value


def _as_index(name: str, x: Tensor | int) -> Tensor:
    """Turn an int or integer tensor into an int64 tensor; reject other dtypes."""
    if not isinstance(x, Tensor):
        if isinstance(x, bool) or not isinstance(x, int):
            raise ConfigError(f"Expected {name} to be an int or an integer tensor (got {type(x).__name__})")
        return torch.tensor(x, dtype=torch.int64)
    if x.dtype.is_floating_point or x.dtype.is_complex or x.dtype == torch.bool:
        raise ConfigError(f"Expected {name} to be an integer tensor (got dtype {x.dtype})")
    return x.to(torch.int64)


@dataclass(frozen=True)
class Grid:
    """A ``height x width`` grid of cells, periodic (torus) or bounded.

    Attributes:
        shape: ``(height, width)`` in cells, both >= 1.
        periodic: If True the grid is a torus; if False cells beyond the border
            do not exist.
    """

    shape: tuple[int, int]
    periodic: bool = True

    # The Space protocol (agentsim.space.base): agents sit in a ``cell``; regions are
    # blocks of (row, column); neighbors are read in the same cell or a Moore radius.
    position_field: ClassVar[str] = "cell"
    discrete: ClassVar[bool] = True
    reaches: ClassVar[tuple[str, ...]] = ("cell", "moore")

    def __post_init__(self) -> None:
        shape = self.shape
        if not isinstance(shape, (tuple, list)) or len(shape) != 2:
            raise ConfigError(f"Expected shape to be a pair (height, width) (got {shape!r})")
        height = _check_int("height (shape[0])", shape[0], 1)
        width = _check_int("width (shape[1])", shape[1], 1)
        if not isinstance(self.periodic, bool):
            raise ConfigError(f"Expected periodic to be a bool (got {type(self.periodic).__name__})")
        object.__setattr__(self, "shape", (height, width))

    @property
    def height(self) -> int:
        """Number of rows."""
        return self.shape[0]

    @property
    def width(self) -> int:
        """Number of columns."""
        return self.shape[1]

    @property
    def n_cells(self) -> int:
        """Number of cells, ``height * width``."""
        return self.shape[0] * self.shape[1]

    @property
    def region_extent(self) -> tuple[float, float]:
        """``(height, width)``: region coordinates are (row, column)."""
        return float(self.shape[0]), float(self.shape[1])

    @property
    def layer_shape(self) -> tuple[int, ...]:
        """Environment layers of this shape hold one value per cell."""
        return self.shape

    def region_coords(self, position: Tensor, axis: int | None = None) -> Tensor:
        """(row, column) of cells ``[n]`` as float64, ``[n, 2]`` (or ``[n]`` for one ``axis``)."""
        width = self.shape[1]
        if axis is not None:
            return (torch.div(position, width, rounding_mode="floor") if axis == 0 else position % width
                    ).to(torch.float64)
        return torch.stack([torch.div(position, width, rounding_mode="floor"), position % width],
                           -1).to(torch.float64)

    def sort_key(self, reaches: Sequence[tuple[str, float]]) -> SortKey | None:
        """The cell itself: agents of one cell, then of the next, row-major."""
        return _cell_key

    # ------------------------------------------------------------------ indexing
    def cell_index(self, row: Tensor | int, col: Tensor | int) -> Tensor:
        """Flat cell index ``row * width + col``.

        Args:
            row: Row numbers, int or integer tensor of any shape.
            col: Column numbers, broadcastable with ``row``.

        Returns:
            int64 tensor of the broadcast shape. On a periodic grid rows and
            columns wrap (``row = -1`` is the last row); on a bounded grid a
            position outside the grid gives ``-1``.
        """
        r = _as_index("row", row)
        c = _as_index("col", col)
        height, width = self.shape
        if self.periodic:
            return torch.remainder(r, height) * width + torch.remainder(c, width)
        inside = (r >= 0) & (r < height) & (c >= 0) & (c < width)
        return torch.where(inside, r * width + c, torch.full_like(r * width + c, -1))

    def coords(self, cells: Tensor | int) -> tuple[Tensor, Tensor]:
        """Inverse of :meth:`cell_index` for cells in ``[0, n_cells)``.

        Args:
            cells: Flat cell indices, int or integer tensor of any shape.

        Returns:
            ``(row, col)``, two int64 tensors shaped like ``cells``.
        """
        flat = _as_index("cells", cells)
        width = self.shape[1]
        return torch.div(flat, width, rounding_mode="floor"), torch.remainder(flat, width)

    # ------------------------------------------------------------- neighborhoods
    def offsets(self, kind: str = "moore", radius: int = 1, include_center: bool = False) -> Tensor:
        """Neighborhood offsets in lexicographic ``(drow, dcol)`` order.

        Args:
            kind: ``"moore"`` (Chebyshev ball) or ``"von_neumann"`` (Manhattan ball).
            radius: Radius in cells, >= 1.
            include_center: Whether ``(0, 0)`` is part of the neighborhood.

        Returns:
            int64 tensor ``[k, 2]`` of ``(drow, dcol)``; ``k = (2r+1)^2`` for Moore
            and ``2r(r+1) + 1`` for von Neumann, minus one without the center.
        """
        return _offset_table(kind, radius, include_center).clone()

    def neighbor_cells(
        self,
        cells: Tensor | int,
        kind: str = "moore",
        radius: int = 1,
        include_center: bool = False,
    ) -> Tensor:
        """Flat indices of the neighbors of each cell.

        Args:
            cells: Flat cell indices in ``[0, n_cells)``, integer tensor ``[...]``
                (values are not checked: this is a hot-path call).
            kind: ``"moore"`` or ``"von_neumann"``.
            radius: Radius in cells, >= 1.
            include_center: Whether the cell itself is listed (first in the
                center position of the lexicographic order).

        Returns:
            int64 tensor ``[..., k]``; column ``j`` is the cell at
            ``offsets(kind, radius, include_center)[j]``. Periodic grids wrap;
            bounded grids give ``-1`` for neighbors outside. On a periodic grid
            with ``height`` or ``width <= 2 * radius`` offsets that wrap onto the
            same cell are all kept, so a row may hold duplicates.
        """
        flat = _as_index("cells", cells)
        off = _offset_table(kind, radius, include_center).to(flat.device)  # (read only)
        height, width = self.shape
        row = torch.div(flat, width, rounding_mode="floor").unsqueeze(-1) + off[:, 0]
        col = torch.remainder(flat, width).unsqueeze(-1) + off[:, 1]
        if self.periodic:
            return torch.remainder(row, height) * width + torch.remainder(col, width)
        inside = (row >= 0) & (row < height) & (col >= 0) & (col < width)
        return torch.where(inside, row * width + col, torch.full_like(row, -1))

    def occupancy(self, cells: Tensor, weights: Tensor | None = None) -> Tensor:
        """Number (or total weight) of agents in each cell.

        Args:
            cells: Flat cell index of each agent, integer tensor ``[n]`` with
                values in ``[0, n_cells)`` (not checked: hot path).
            weights: Optional per-agent weights ``[n]`` or ``[n, ...]``, any
                numeric dtype.

        Returns:
            ``[n_cells]`` int64 counts without weights; with weights
            ``[n_cells, ...]`` sums in the dtype of ``weights`` (integer weights
            are exact; on CPU float sums are accumulated in agent order).
        """
        flat = _as_index("cells", cells)
        if flat.dim() != 1:
            raise ConfigError(f"Expected cells of shape [n] (got {list(flat.shape)})")
        if weights is None:
            return torch.bincount(flat, minlength=self.n_cells)
        if weights.shape[:1] != flat.shape:
            raise ConfigError(
                f"Expected weights of shape [{flat.shape[0]}, ...] to match cells (got {list(weights.shape)})"
            )
        if weights.dtype == torch.bool:
            weights = weights.to(torch.int64)
        out = torch.zeros((self.n_cells, *weights.shape[1:]), dtype=weights.dtype, device=weights.device)
        return out.index_add_(0, flat, weights)

    def neighbor_sum(
        self,
        layer: Tensor,
        kind: str = "moore",
        radius: int = 1,
        include_center: bool = False,
    ) -> Tensor:
        """Sum of a cell layer over each cell's neighborhood.

        ``out[i, j] = sum over (dr, dc) in offsets of layer[i + dr, j + dc]``,
        wrapped on a periodic grid and zero outside a bounded one. Agrees exactly
        with summing ``layer.flatten()[neighbor_cells(...)]`` (duplicates on
        small tori included).

        Args:
            layer: Per-cell values ``[..., height, width]``, any numeric or bool
                dtype; leading dims are batch dims.
            kind: ``"moore"`` or ``"von_neumann"``.
            radius: Radius in cells, >= 1.
            include_center: Whether a cell's own value is part of its sum.

        Returns:
            Tensor shaped like ``layer``. Floating layers keep their dtype;
            integer and bool layers are summed exactly in int64 (as ``torch.sum``
            does), so ``int8`` counts never overflow.
        """
        if layer.dim() < 2 or tuple(layer.shape[-2:]) != self.shape:
            raise ConfigError(
                f"Expected layer of shape [..., {self.shape[0]}, {self.shape[1]}] (got {list(layer.shape)})"
            )
        if layer.dtype.is_complex:
            raise ConfigError(f"Expected a real or integer layer (got dtype {layer.dtype})")
        if not layer.dtype.is_floating_point:
            layer = layer.to(torch.int64)
        _check_kind(kind)
        _check_int("radius", radius, 1)
        if self.periodic and not layer.dtype.is_floating_point and radius <= 3:  # exact in any order: a pass
            fused = cpu_kernels.periodic_grid_sum(layer.contiguous(), [
                (int(dr), int(dc)) for dr, dc in self.offsets(kind, radius, include_center).tolist()])
            if fused is not None:
                return fused
        if kind == "moore":
            # A Moore box is separable: sum the row shifts, then the column shifts
            # of that, O(r) shifted adds instead of O(r^2). Without the center the
            # middle row is added apart (no subtraction, so inf/nan stay local).
            span = range(-radius, radius + 1)
            rows = [(d, 0) for d in span if include_center or d != 0]
            cols = [(0, d) for d in span]
            out = _shifted_sum(_shifted_sum(layer, rows, self.periodic, radius), cols, self.periodic, radius)
            if not include_center:
                out += _shifted_sum(layer, [(0, d) for d in span if d != 0], self.periodic, radius)
            return out
        off = self.offsets(kind, radius, include_center).tolist()
        return _shifted_sum(layer, [(dr, dc) for dr, dc in off], self.periodic, radius)


def _check_kind(kind: str) -> None:
    if kind not in NEIGHBORHOODS:
        choices = ", ".join(repr(k) for k in NEIGHBORHOODS)
        raise ConfigError(
            f"Expected neighborhood kind in ({choices}) (got {kind!r}).{did_you_mean(str(kind), NEIGHBORHOODS)}"
        )


def _shifted_sum(x: Tensor, offsets: list[tuple[int, int]], periodic: bool, radius: int) -> Tensor:
    """``sum_k x[..., i + dr_k, j + dc_k]`` with wrap (periodic) or zero padding."""
    height, width = x.shape[-2:]
    out = torch.zeros_like(x)
    if periodic and radius >= min(height, width):  # wraps more than once: roll
        for dr, dc in offsets:
            # roll moves x[i] to i + shift, so shift by -offset to read x[i + offset].
            out += torch.roll(x, shifts=(-dr, -dc), dims=(-2, -1))
        return out
    if periodic:
        # Padded once with the wrapped edges, then every offset is a view: the same terms added
        # in the same order as rolling x per offset (so the same bits), without a copy per offset.
        r = radius
        padded = torch.cat([x[..., height - r:, :], x, x[..., :r, :]], dim=-2)
        padded = torch.cat([padded[..., width - r:], padded, padded[..., :r]], dim=-1)
    else:
        padded = F.pad(x, (radius, radius, radius, radius))
    for dr, dc in offsets:
        out += padded[..., radius + dr : radius + dr + height, radius + dc : radius + dc + width]
    return out


@functools.lru_cache(maxsize=64)
def _offset_table(kind: str, radius: int, include_center: bool) -> Tensor:
    """:meth:`Grid.offsets`, made once per argument triple (never written: callers copy it or read it)."""
    _check_kind(kind)
    _check_int("radius", radius, 1)
    span = torch.arange(-radius, radius + 1, dtype=torch.int64)
    drow, dcol = torch.meshgrid(span, span, indexing="ij")  # row-major = lexicographic
    off = torch.stack([drow.reshape(-1), dcol.reshape(-1)], dim=1)
    keep = torch.ones(off.shape[0], dtype=torch.bool)
    if kind == "von_neumann":
        keep &= off.abs().sum(1) <= radius
    if not include_center:
        keep &= (off != 0).any(1)
    return off[keep]
