"""The continuous domain: a 2D or 3D :class:`Box`, periodic or bounded."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import ClassVar

import torch
from torch import Tensor

from agentsim._native import kernels as cpu_kernels
from agentsim.errors import ConfigError
from agentsim.space.base import SortKey
from agentsim.space.continuous.cells import CellGrid, wrap_dim

__all__ = ["Box", "min_image", "wrap_dim"]


def min_image(d: Tensor, length: float, inplace: bool = False) -> Tensor:
    """Minimum image of one displacement component, ``d - L * round(d / L)``.

    Written once, with ``L`` a Python float, so that :meth:`Box.displacement`
    and the pair search round identically (a scalar divisor may be applied as
    a multiply by its reciprocal, which can differ from a tensor divisor).
    ``inplace`` writes the result into ``d`` (one temporary instead of two).
    """
    q = d / length
    q.round_()
    q *= length
    return d.sub_(q) if inplace else d - q


@dataclass(frozen=True)
class Box:
    """A 2D or 3D box ``[0, size_d)`` per dim, periodic or bounded.

    Attributes:
        size: Side lengths, 2 or 3 positive finite floats (length units).
        periodic: If True positions wrap and distances use the minimum
            image; if False positions are clamped into ``[0, size_d]``.

    Examples:
        >>> import torch
        >>> box = Box((10.0, 10.0))
        >>> box.wrap(torch.tensor([[10.5, -0.5]])).tolist()
        [[0.5, 9.5]]
        >>> round(float(box.distance(torch.tensor([9.9, 0.0]), torch.tensor([0.1, 0.0]))), 4)
        0.2
    """

    size: tuple[float, ...]
    periodic: bool = True
    #: Set by the engine on the box a substep sees (``ctx.space``): the largest radius its
    #: declared ``reach`` covers, and the declaration, so a search beyond it is an error.
    query_limit: tuple[float, str] | None = field(default=None, compare=False, repr=False)

    # The Space protocol (agentsim.space.base): agents sit at ``pos``; regions are cut in
    # the first two coordinates; neighbors are read within a length.
    position_field: ClassVar[str] = "pos"
    discrete: ClassVar[bool] = False
    reaches: ClassVar[tuple[str, ...]] = ("length",)
    layer_shape: ClassVar[tuple[int, ...] | None] = None

    def __post_init__(self) -> None:
        try:
            size = tuple(float(s) for s in self.size)
        except (TypeError, ValueError):
            raise ConfigError(
                f"Expected Box size to be a tuple of 2 or 3 numbers (got {self.size!r})."
            ) from None
        if len(size) not in (2, 3):
            raise ConfigError(
                f"Expected Box size with 2 or 3 side lengths (got {len(size)}: {self.size!r})."
            )
        bad = [s for s in size if not (math.isfinite(s) and s > 0)]
        if bad:
            raise ConfigError(
                f"Expected positive finite Box side lengths (got {self.size!r})."
            )
        object.__setattr__(self, "size", size)
        object.__setattr__(self, "periodic", bool(self.periodic))

    @property
    def ndim(self) -> int:
        """Number of spatial dimensions, 2 or 3."""
        return len(self.size)

    def _lengths(self, like: Tensor) -> Tensor:
        return torch.tensor(self.size, dtype=like.dtype, device=like.device)

    def wrap(self, pos: Tensor) -> Tensor:
        """Map positions into the box.

        Args:
            pos: Positions, ``[..., ndim]`` float (length units).

        Returns:
            ``[..., ndim]``: periodic boxes give ``pos mod L`` in ``[0, L)``;
            bounded boxes clamp into ``[0, L]``.
        """
        if not self.periodic:
            lengths = self._lengths(pos)
            return torch.clamp(pos, min=torch.zeros_like(lengths), max=lengths)
        # One dim at a time with a scalar L: the same remainder as with a [ndim] tensor of
        # lengths (bit for bit), several times faster than the broadcast on CPU.
        if len(set(self.size)) == 1:
            return wrap_dim(pos, self.size[0])
        out = torch.empty_like(pos)
        for k, length in enumerate(self.size):
            out[..., k] = wrap_dim(pos[..., k], length)
        return out

    def move(self, pos: Tensor, delta: Tensor) -> Tensor:
        """Move agents by ``delta`` and map them into the box, in place: ``pos`` becomes
        ``wrap(pos + delta)`` and is returned.

        The same bits as ``pos.add_(delta)`` then :meth:`wrap`; on the CPU a periodic box does it
        in one pass (:func:`agentsim._native.kernels.add_wrap`) instead of five.

        Args:
            pos: Positions ``[n, ndim]`` float, overwritten (length units).
            delta: Displacements, the same shape and dtype (length units).

        Examples:
            >>> pos = torch.tensor([[9.5, 0.5]])
            >>> Box((10.0, 10.0)).move(pos, torch.tensor([[1.0, -1.0]])).tolist()
            [[0.5, 9.5]]
        """
        if self.periodic and cpu_kernels.add_wrap(pos, delta, self.size):
            return pos
        return pos.copy_(self.wrap(pos.add_(delta)))

    def displacement(self, frm: Tensor, to: Tensor) -> Tensor:
        """Displacement ``to - frm``, minimum image when periodic.

        Args:
            frm: Start positions, ``[..., ndim]`` float (length units).
            to: End positions, broadcastable with ``frm``.

        Returns:
            ``[..., ndim]`` displacement in the dtype of the inputs; when
            periodic each component is in ``[-L/2, L/2]``.
        """
        d = to - frm
        if not self.periodic:
            return d
        return torch.stack(
            [min_image(d[..., k], length) for k, length in enumerate(self.size)], dim=-1
        )

    def distance(self, frm: Tensor, to: Tensor) -> Tensor:
        """Euclidean (minimum-image when periodic) distance, ``[...]``."""
        norm: Tensor = torch.linalg.vector_norm(self.displacement(frm, to), dim=-1)
        return norm

    @property
    def region_extent(self) -> tuple[float, float]:
        """Side lengths of the first two dims: the region coordinates of a spatial partition."""
        return self.size[0], self.size[1]

    def with_query_limit(self, radius: float, why: str) -> Box:
        """This box, refusing radius searches beyond ``radius`` (length units) with ``why`` in the
        error: a substep's searches must stay within the reach it declares.
        """
        return replace(self, query_limit=(radius, why))

    def region_coords(self, position: Tensor, axis: int | None = None) -> Tensor:
        """The first two coordinates of ``position`` ``[n, ndim]`` as float64, ``[n, 2]`` (or
        ``[n]`` for one ``axis``); a 3D box is cut in x and y only.
        """
        return (position[:, :2] if axis is None else position[:, axis]).to(torch.float64)

    def sort_key(self, reaches: Sequence[tuple[str, float]]) -> SortKey | None:
        """Row-major cell ids in the :class:`~agentsim.space.continuous.cells.CellGrid` of the
        largest length reach (the cells the radius search visits); None without one.
        """
        lengths = [value for kind, value in reaches if kind == "length" and value > 0]
        return CellGrid(self, max(lengths)).cell_id if lengths else None
