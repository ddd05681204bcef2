"""The :class:`Space` protocol: what the engine, the locality sort and the partitioners ask of a
model's space, so that none of them dispatches on a concrete class.

Three spaces implement it: :class:`~agentsim.space.continuous.Box` (continuous),
:class:`~agentsim.space.grid.Grid` (cells) and :class:`~agentsim.space.graph.Graph`
(a static network). A model may also have no space (``None``): its substeps may then
read neighbors with ``reach="global"`` only, and ``partition="spatial"`` is refused.

What a space says:

- where an agent is: the field named :attr:`Space.position_field` (``"pos"`` ``[n, d]``
  float in a box, ``"cell"`` ``[n]`` int64 on a grid, ``"uid"`` on a graph, whose agents
  are its nodes and never move);
- which neighbor reaches make sense in it (:attr:`Space.reaches`; ``"global"`` always does);
- region coordinates: a 2D system in which a spatial partitioner cuts rectangles,
  ``[0, extent[0]) x [0, extent[1])`` (:meth:`Space.region_coords`); ``discrete`` spaces
  (grids, graphs) have integer coordinates, so borders are cut at integers;
- how to order rows for memory locality (:meth:`Space.sort_key`);
- the shape of environment layers that hold one value per cell (:attr:`Space.layer_shape`;
  a spatial partitioner makes each cell authoritative on its owner).

Examples:
    >>> import torch
    >>> from agentsim.space.continuous import Box
    >>> from agentsim.space.grid import Grid
    >>> space: Space = Grid((3, 4))
    >>> space.position_field, space.region_extent, space.reaches
    ('cell', (3.0, 4.0), ('cell', 'moore'))
    >>> space.region_coords(torch.tensor([5, 11])).tolist()
    [[1.0, 1.0], [2.0, 3.0]]
    >>> key = Box((10.0, 10.0)).sort_key([("length", 5.0)])
    >>> key(torch.tensor([[1.0, 1.0], [1.0, 6.0], [6.0, 1.0]])).tolist()  # row-major cells of side 5
    [0, 1, 2]
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from torch import Tensor

from agentsim.core.substep import Substep, resolve_reach
from agentsim.errors import ConfigError

__all__ = ["REACH_KINDS", "SortKey", "Space", "check_reaches"]

# Neighbor reaches (see agentsim.core.substep.resolve_reach): "global" fits any space.
REACH_KINDS = ("global", "length", "cell", "moore", "graph")

SortKey = Callable[[Tensor], Tensor]


@runtime_checkable
class Space(Protocol):
    """A model's space, as the engine and the partitioners see it (see the module docstring)."""

    @property
    def position_field(self) -> str:
        """The field that places an agent: ``"pos"``, ``"cell"`` or ``"uid"``."""
        ...

    @property
    def periodic(self) -> bool:
        """Whether region coordinates wrap around (a torus)."""
        ...

    @property
    def discrete(self) -> bool:
        """Whether region coordinates are integers (cells, nodes): borders are cut at integers."""
        ...

    @property
    def reaches(self) -> tuple[str, ...]:
        """The reach kinds a substep may declare in this space, besides ``"global"``."""
        ...

    @property
    def region_extent(self) -> tuple[float, float]:
        """``(L0, L1)``: region coordinates lie in ``[0, L0) x [0, L1)``."""
        ...

    @property
    def layer_shape(self) -> tuple[int, ...] | None:
        """Shape of the environment layers with one value per cell, or None."""
        ...

    def region_coords(self, position: Tensor, axis: int | None = None) -> Tensor:
        """Region coordinates of positions: ``[n, 2]`` float64, or ``[n]`` for one ``axis``, on the
        device of ``position``.
        """
        ...

    def sort_key(self, reaches: Sequence[tuple[str, float]]) -> SortKey | None:
        """A function from positions to an ``[n]`` int64 key that keeps agents which interact
        near each other in memory, for a population read within ``reaches`` (``(kind, value)``
        pairs); None when no order helps.
        """
        ...


def check_reaches(substeps: Iterable[Substep], params: Mapping[str, Any], space: Any) -> None:
    """Every reach the substeps declare fits ``space`` (a :class:`Space`; a space that does not
    implement the protocol, or None, is not checked: one process ignores reach).

    A space whose agents are placed by ``uid`` (a network) must also give its edges
    (``space.edges() -> (src, dst)``) for the ghost nodes of a ``"graph"`` reach.

    Raises:
        ConfigError: a reach kind the space does not have, naming the valid ones.
    """
    if not isinstance(space, Space):
        return
    kinds = ("global", *space.reaches)
    for s in substeps:
        if s.neighbors:
            kind, _ = resolve_reach(s, params)
            if kind not in kinds:
                raise ConfigError(f"substep '{s.name}': reach {s.reach!r} is a '{kind}' reach, which a "
                                  f"{type(space).__name__} space does not have (valid: {', '.join(kinds)})")
