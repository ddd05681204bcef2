"""The spatial partitioner: each rank owns a region of space and the agents in it.

:class:`SpatialPartition` (``partition="spatial"``) splits the model's space:

- continuous :class:`~agentsim.space.continuous.Box`: axis-aligned rectangles over the
  first two axes (a 3D box is split in x and y only). ``layout="strips"``: equal strips
  along x; ``"blocks"``: a ``px x py`` grid of equal blocks (``px * py = W``);
  ``"rcb"``: recursive coordinate bisection of the initial agent positions (cuts at
  the bin edges of a global count histogram, so they are the same on every rank). An
  agent's owner is the region that contains its ``pos``;
- :class:`~agentsim.space.grid.Grid`: the same rectangles in (row, column) cell
  coordinates with integer borders (strips are blocks of rows); an agent's owner is
  the owner of its ``cell``. Env layers of the grid's shape are authoritative only on
  the owner of each cell: :meth:`SpatialPartition.owned_env` is the rank's own cells,
  :meth:`SpatialPartition.sync_env` rebuilds the whole layers from the owners (before
  a trajectory frame and before borders move);
- :class:`~agentsim.space.graph.Graph`: nodes (uid = node id) in contiguous uid
  blocks; the nodes adjacent to a rank's nodes are its ghosts.

Halos, before each substep that declares ``neighbors``, per the substep's ``reach``
(only ``uid`` and the declared fields travel, packed in one buffer, with
:meth:`TorchComm.exchange_rows <agentsim.distributed.comm.TorchComm.exchange_rows>`):

- a length (or the name of a length parameter): every agent goes to every other rank
  whose region lies within that distance (minimum image on periodic boxes; the
  Euclidean distance from the point to the rectangle, with a small safety margin);
- ``"moore:R"``: agents within R cells (Chebyshev, wrapping on a torus) of a region;
- ``"cell"``: no halo (all agents of a cell are on its owner);
- ``"graph"``: the ghost nodes, from send lists computed once at scatter;
- ``"global"``: every agent (an all_gather, as the data partitioner).

Migration: after every substep that writes a population's position field (``pos`` or
``cell``) or adds agents to it, agents whose owner changed move there with all their
fields (one packed exchange per population). Halos are therefore built from current
positions, and a substep with reach ``"cell"`` sees every agent of its cells.

With ``overlap=True`` (the default), a model whose first substep is agentwise and
reads neighbors within a length instead migrates once, at the end of the step, in the
same exchange as the next step's halo (:mod:`agentsim.distributed.overlap`).

Load balancing (``balance_every=K > 0``): every K steps, when the largest per-rank
agent count exceeds ``balance_threshold`` times the mean, borders are recomputed from
the global position histogram (strips: quantile cuts along x; blocks: quantile
columns, then quantile rows within each column; rcb: bisection again) and agents
migrate. Results do not change: they never depend on which rank holds an agent.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import Tensor

from ..comm import Comm
from ..errors import ConfigError, did_you_mean
from ..ops import flatnonzero
from ..state import UID, Population, State
from ..substep import Substep, resolve_reach
from .halo import HaloBook

__all__ = ["LAYOUTS", "SpatialPartition"]

LAYOUTS = ("strips", "blocks", "rcb")


def _factor(world_size: int) -> tuple[int, int]:
    """``(px, py)`` with ``px * py = W`` and ``px >= py`` as close to square as possible."""
    py = max(d for d in range(1, int(math.isqrt(world_size)) + 1) if world_size % d == 0)
    return world_size // py, py


def _nearest_cut(counts: Tensor, fraction: float) -> int:
    """Index ``k`` in ``[0, len(counts)]``: the cut (before bin k) whose count to the left is
    nearest ``fraction`` of the total (the first of equals)."""
    cum = torch.cat([counts.new_zeros(1), torch.cumsum(counts, 0)])
    target = float(cum[-1]) * fraction
    return int(torch.argmin((cum.to(torch.float64) - target).abs()))


class SpatialPartition(HaloBook):
    """Agents owned by region of space (see the module docstring).

    Args:
        layout: ``"strips"``, ``"blocks"`` or ``"rcb"``.
        balance_every: Check the load every this many steps (0: never).
        balance_threshold: Rebalance when max/mean agents per rank exceeds this (> 1).
        bins: Histogram bins per axis for cuts (rcb and rebalancing; a 2D histogram uses
            at most 256 per axis).
        overlap: Overlap the step's communication with the first substep's work when
            the model allows it (:mod:`agentsim.distributed.overlap`); same results either way.

    Attributes:
        migrated: Agents this rank sent away in migrations during the current step.
        halo_rows, halo_bytes: Halo rows and bytes this rank received during the current step.
        rebalanced: Whether borders moved at the end of the current step.

    Examples:
        >>> from agentsim.comm import LocalComm
        >>> from agentsim.engine import Simulation
        >>> from agentsim.models.boids import MODEL
        >>> sim = Simulation(MODEL, agents=10, seed=0)
        >>> part = SpatialPartition("rcb")
        >>> part.bind(sim.space, sim.params)
        >>> part.scatter(sim.state, LocalComm())["boid"].n  # one rank keeps everything
        10
    """

    name = "spatial"

    def __init__(self, layout: str = "strips", balance_every: int = 0,
                 balance_threshold: float = 1.1, bins: int = 1024, overlap: bool = True) -> None:
        if not isinstance(layout, str) or layout not in LAYOUTS:
            hint = did_you_mean(layout, LAYOUTS) if isinstance(layout, str) else ""
            raise ConfigError(f"unknown layout {layout!r} (valid: {', '.join(LAYOUTS)})." + hint)
        if isinstance(balance_every, bool) or not isinstance(balance_every, int) or balance_every < 0:
            raise ConfigError(f"balance_every: expected an int >= 0 (got {balance_every!r})")
        if isinstance(balance_threshold, bool) or not isinstance(balance_threshold, (int, float)) \
                or not balance_threshold >= 1.0:
            raise ConfigError(f"balance_threshold: expected a number >= 1 (got {balance_threshold!r})")
        if isinstance(bins, bool) or not isinstance(bins, int) or bins < 2:
            raise ConfigError(f"bins: expected an int >= 2 (got {bins!r})")
        if not isinstance(overlap, bool):
            raise ConfigError(f"overlap: expected True or False (got {overlap!r})")
        super().__init__()
        self.overlap = overlap
        self.layout = layout
        self.balance_every = balance_every
        self.balance_threshold = float(balance_threshold)
        self.bins = bins
        self.kind: str | None = None
        self.space: Any = None
        self.params: Mapping[str, Any] = {}
        self.lo: Tensor | None = None  # [W, 2] float64 region corners (continuous / grid)
        self.hi: Tensor | None = None
        self.position: dict[str, str] = {}
        self._owned_cells: Tensor | None = None
        self.migrated = 0
        self.rebalanced = False

    def __repr__(self) -> str:
        return (f"SpatialPartition(layout={self.layout!r}, balance_every={self.balance_every}, "
                f"balance_threshold={self.balance_threshold}, overlap={self.overlap})")

    # ------------------------------------------------------------------ set-up
    def bind(self, space: Any, params: Mapping[str, Any]) -> None:
        """Attach the model's space (Box, Grid or Graph) and resolved parameters."""
        from ..space.continuous import Box
        from ..space.graph import Graph
        from ..space.grid import Grid

        if isinstance(space, Box):
            self.kind, self.size = "continuous", (float(space.size[0]), float(space.size[1]))
        elif isinstance(space, Grid):
            self.kind, self.size = "grid", (float(space.shape[0]), float(space.shape[1]))
        elif isinstance(space, Graph):
            self.kind, self.size = "graph", (float(space.n_nodes), 1.0)
        else:
            raise ConfigError(f"partition 'spatial' needs a Box, Grid or Graph space "
                              f"(got {type(space).__name__}); use partition 'data'")
        self.periodic = bool(getattr(space, "periodic", False))
        self.space, self.params = space, params

    def _position_field(self, pop: Population) -> str:
        want = {"continuous": "pos", "grid": "cell", "graph": UID}[self.kind]  # type: ignore[index]
        if want not in pop:
            raise ConfigError(f"partition 'spatial': population '{pop.name}' has no '{want}' field "
                              f"(a {self.kind} space places agents by '{want}'); use partition 'data'")
        return want

    def scatter(self, state: State, comm: Comm) -> State:
        """Compute the regions from the (global) initial state and keep this rank's agents."""
        if self.kind is None:
            raise ConfigError("SpatialPartition.scatter: call bind(space, params) first")
        self.position = {name: self._position_field(pop) for name, pop in state.populations.items()}
        W = comm.world_size
        if self.kind == "graph":
            n = self.space.n_nodes
            self.bounds = torch.tensor([n * r // W for r in range(W + 1)], dtype=torch.int64)
            self._graph_send_lists(comm)
        else:
            if self.layout == "rcb":
                self._set_rcb(self._histogram2d(state), W)
            else:
                self._set_uniform(W)
            self._update_owned_cells(state, comm)
        for name, pop in state.populations.items():
            pop.keep(self.owner(name, pop) == comm.rank)
        return state

    # ------------------------------------------------------------------ regions
    def _edges(self, axis: int, bins: int) -> Tensor:
        length = self.size[axis]
        if self.kind == "grid":
            return torch.unique(torch.round(torch.linspace(0, length, min(bins, int(length)) + 1,
                                                           dtype=torch.float64)))
        return torch.linspace(0, length, bins + 1, dtype=torch.float64)

    def coords(self, name: str, pop: Population, rows: Tensor | None = None) -> Tensor:
        """``[n, 2]`` float64 region coordinates of the agents (position, or (row, col) of the cell);
        of the agents at ``rows`` (int64 ``[m]``) only, if given."""
        field = pop[self.position[name]]
        if rows is not None:
            field = field.index_select(0, rows.to(field.device))
        if self.kind == "continuous":
            return field[:, :2].to(torch.float64).cpu()
        cell = field.cpu()
        width = int(self.size[1])
        return torch.stack([torch.div(cell, width, rounding_mode="floor"), cell % width], -1).to(torch.float64)

    def _axis(self, name: str, pop: Population, axis: int) -> Tensor:
        """``[n]`` float64 region coordinate ``axis`` of every agent (one column of :meth:`coords`)."""
        field = pop[self.position[name]]
        if self.kind == "continuous":
            return field[:, axis].to(torch.float64).cpu()
        width = int(self.size[1])
        cell = field.cpu()
        return (torch.div(cell, width, rounding_mode="floor") if axis == 0 else cell % width).to(torch.float64)

    def _bordered_axes(self, rank: int) -> list[int]:
        """The axes along which ``rank``'s region does not span the whole space."""
        assert self.lo is not None and self.hi is not None
        return [a for a in (0, 1) if self.lo[rank, a] > 0 or self.hi[rank, a] < self.size[a]]

    def owner(self, name: str, pop: Population, rank: int | None = None) -> Tensor:
        """``[n]`` int64 owning rank of every agent of ``pop`` (on CPU).

        With ``rank``, the agents inside that rank's region (usually nearly all of its own
        agents) are found first with :meth:`_contains`, the rule of the full search, reading
        only the coordinates of the axes where the region has borders; the full search runs
        on the others only. Regions do not overlap, so the result is the same.
        """
        if self.kind == "graph":
            uid = pop[UID].cpu()
            return (torch.bucketize(uid, self.bounds[1:-1], right=True)).to(torch.int64)
        if rank is None:
            return self._owner_of(self.coords(name, pop))
        inside = self._contains(rank, pop.n, lambda axis: self._axis(name, pop, axis))
        owner = torch.full((pop.n,), rank, dtype=torch.int64)
        out = flatnonzero(~inside)
        if out.numel():
            owner[out] = self._owner_of(self.coords(name, pop, out))
        return owner

    def _contains(self, r: int, n: int, column: Callable[[int], Tensor]) -> Tensor:
        """``[n]`` bool: which points lie in region ``r``, half-open ``[lo, hi)``. The box's outer
        borders are open (a bounded box clamps positions into ``[0, L]``), so only the axes where
        the region has a border are compared, and only they are asked of ``column(axis)``
        (``[n]`` float64 coordinates)."""
        assert self.lo is not None and self.hi is not None
        lo, hi = self.lo[r].tolist(), self.hi[r].tolist()
        inside = torch.full((n,), hi[0] > lo[0] and hi[1] > lo[1], dtype=torch.bool)
        for axis in self._bordered_axes(r):
            v = column(axis)
            if lo[axis] > 0:
                inside &= v >= lo[axis]
            if hi[axis] < self.size[axis]:
                inside &= v < hi[axis]
        return inside

    def _owner_of(self, c: Tensor) -> Tensor:
        """``[n]`` int64 owner of points ``c`` ``[n, 2]``: the first region that contains each."""
        assert self.lo is not None
        owner = torch.zeros(c.shape[0], dtype=torch.int64)
        for r in reversed(range(self.lo.shape[0])):
            owner.masked_fill_(self._contains(r, c.shape[0], lambda axis: c[:, axis]), r)
        return owner

    def _set_uniform(self, W: int) -> None:
        px, py = (W, 1) if self.layout == "strips" else _factor(W)
        xs = self._uniform_cuts(0, px)
        ys = self._uniform_cuts(1, py)
        lo, hi = [], []
        for i in range(px):
            for j in range(py):
                lo.append([xs[i], ys[j]])
                hi.append([xs[i + 1], ys[j + 1]])
        self.lo, self.hi = torch.tensor(lo, dtype=torch.float64), torch.tensor(hi, dtype=torch.float64)

    def _uniform_cuts(self, axis: int, parts: int) -> list[float]:
        length = self.size[axis]
        cuts = [length * k / parts for k in range(parts + 1)]
        return [float(round(c)) for c in cuts] if self.kind == "grid" else cuts

    def _histogram2d(self, state: State, comm: Comm | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """Global agent counts ``[bx, by]`` int64 and the bin edges per axis."""
        nb = min(self.bins, 256)
        ex, ey = self._edges(0, nb), self._edges(1, nb)
        hist = torch.zeros(len(ex) - 1, len(ey) - 1, dtype=torch.int64)
        for name, pop in state.populations.items():
            c = self.coords(name, pop)
            bx = torch.bucketize(c[:, 0].contiguous(), ex[1:-1], right=True)
            by = torch.bucketize(c[:, 1].contiguous(), ey[1:-1], right=True)
            hist += torch.bincount(bx * hist.shape[1] + by, minlength=hist.numel()).reshape(hist.shape)
        if comm is not None:
            hist = comm.sum_int64(hist.reshape(-1)).reshape(hist.shape)
        return hist, ex, ey

    def _set_rcb(self, hist_edges: tuple[Tensor, Tensor, Tensor], W: int) -> None:
        hist, ex, ey = hist_edges
        lo = torch.zeros(W, 2, dtype=torch.float64)
        hi = torch.zeros(W, 2, dtype=torch.float64)

        def split(ranks: list[int], b: list[int]) -> None:  # b = [i0, i1, j0, j1] bin ranges
            if len(ranks) == 1:
                r = ranks[0]
                lo[r] = torch.tensor([ex[b[0]], ey[b[2]]])
                hi[r] = torch.tensor([ex[b[1]], ey[b[3]]])
                return
            extent = [float(ex[b[1]] - ex[b[0]]), float(ey[b[3]] - ey[b[2]])]
            axis = 0 if extent[0] >= extent[1] else 1
            if b[2 * axis + 1] - b[2 * axis] < 2 and b[3 - 2 * axis] - b[2 - 2 * axis] >= 2:
                axis = 1 - axis
            sub = hist[b[0]:b[1], b[2]:b[3]]
            marginal = sub.sum(1 - axis)
            w1 = len(ranks) // 2
            k = b[2 * axis] + _nearest_cut(marginal, w1 / len(ranks))
            left, right = list(b), list(b)
            left[2 * axis + 1] = k
            right[2 * axis] = k
            split(ranks[:w1], left)
            split(ranks[w1:], right)

        split(list(range(W)), [0, len(ex) - 1, 0, len(ey) - 1])
        self.lo, self.hi = lo, hi

    def _set_balanced(self, state: State, comm: Comm) -> None:
        """New borders from the global position histogram (collective)."""
        W = comm.world_size
        hist, ex, ey = self._histogram2d(state, comm)
        if self.layout == "rcb":
            self._set_rcb((hist, ex, ey), W)
            return
        px, py = (W, 1) if self.layout == "strips" else _factor(W)
        if self.layout == "strips":  # finer cuts from the 1D marginal
            ex = self._edges(0, self.bins)
            counts = torch.zeros(len(ex) - 1, dtype=torch.int64)
            for name, pop in state.populations.items():
                c = self.coords(name, pop)
                bx = torch.bucketize(c[:, 0].contiguous(), ex[1:-1], right=True)
                counts += torch.bincount(bx, minlength=len(counts))
            hist = comm.sum_int64(counts).reshape(-1, 1)
        col = hist.sum(1)
        xk = [0] + [_nearest_cut(col, i / px) for i in range(1, px)] + [len(ex) - 1]
        xk = [max(xk[: i + 1]) for i in range(len(xk))]
        lo, hi = [], []
        for i in range(px):
            rows = hist[xk[i]:xk[i + 1]].sum(0)
            yk = [0] + [_nearest_cut(rows, j / py) for j in range(1, py)] + [len(ey) - 1]
            yk = [max(yk[: j + 1]) for j in range(len(yk))]
            for j in range(py):
                lo.append([float(ex[xk[i]]), float(ey[yk[j]]) if py > 1 else 0.0])
                hi.append([float(ex[xk[i + 1]]), float(ey[yk[j + 1]]) if py > 1 else self.size[1]])
        self.lo, self.hi = torch.tensor(lo, dtype=torch.float64), torch.tensor(hi, dtype=torch.float64)

    # ------------------------------------------------------------------ env (grid)
    def _is_layer(self, t: Tensor) -> bool:
        return self.kind == "grid" and tuple(t.shape) == tuple(self.space.shape)

    def _update_owned_cells(self, state: State, comm: Comm) -> None:
        if self.kind != "grid":
            self._owned_cells = None
            return
        n = self.space.n_cells
        cells = torch.arange(n)
        width = int(self.size[1])
        c = torch.stack([torch.div(cells, width, rounding_mode="floor"), cells % width], -1).to(torch.float64)
        self._owned_cells = torch.nonzero(self._owner_of(c) == comm.rank).squeeze(-1)

    def owned_env(self, state: State, name: str, comm: Comm) -> Tensor:
        """The cells of env layer ``name`` this rank owns (grid layers), or all on rank 0 (others)."""
        t = state.env[name]
        flat = t.reshape(-1)
        if self._is_layer(t) and self._owned_cells is not None:
            return flat[self._owned_cells.to(flat.device)]
        return flat if comm.rank == 0 else flat[:0]

    def sync_env(self, state: State, comm: Comm) -> None:
        """Make every grid env layer whole on every rank: each cell's value from its owner."""
        if self.kind != "grid" or comm.world_size == 1 or self._owned_cells is None:
            return
        names = [k for k, v in state.env.items() if self._is_layer(v)]
        if not names:
            return
        idx = self._owned_cells.to(state.env[names[0]].device)
        send = {"cell": idx, **{k: state.env[k].reshape(-1)[idx] for k in names}}
        got = comm.all_gather_rows(send, include_self=False)
        for k in names:
            flat = state.env[k].reshape(-1).clone()
            flat[got["cell"]] = got[k]
            state.env[k] = flat.reshape(state.env[k].shape)

    # ------------------------------------------------------------------ halos
    def _resolve_reach(self, substep: Substep) -> tuple[str, float]:
        kind, value = resolve_reach(substep, self.params)
        need = {"cell": ("grid", "Grid"), "moore": ("grid", "Grid"), "graph": ("graph", "Graph"),
                "length": ("continuous", "Box")}.get(kind)
        if need is not None and self.kind != need[0]:
            raise ConfigError(f"substep '{substep.name}': reach {substep.reach!r} needs a {need[1]} space "
                              f"(got a {self.kind} space)")
        return kind, value

    def _margin(self, reach: float) -> float:
        return reach * 1e-5 + 1e-6 * max(self.size)  # extra halo agents never change results

    def _near_border(self, name: str, pop: Population, kind: str, reach: float, rank: int) -> Tensor:
        """``[m]`` int64 rows of the agents within ``reach`` (plus margin) of ``rank``'s region
        border, on the axes where it has one: the only agents that can be within reach of
        another region, which :meth:`_near` then tests exactly.

        The shortest way from a point of this rank's rectangle to another region (or to a
        periodic image of one) crosses this rectangle's border, on an axis where it has one
        (a region spanning a whole axis is separated from the others along the other axis).
        A point outside the rectangle has a negative distance and is kept. Typically a few
        percent of the agents qualify."""
        limit = self.halo_limit(reach)
        if self.kind == "continuous":
            return self.near_border(name, pop, rank, limit)[0]
        last = -1 if kind == "moore" else 0  # cells: the region's last cell is hi - 1
        return flatnonzero(self._border_distance(rank, pop.n, lambda axis: self._axis(name, pop, axis), last) <= limit)

    def near_border(self, name: str, pop: Population, rank: int, width: float) -> tuple[Tensor, Tensor]:
        """The agents of ``pop`` (continuous space) whose :meth:`border_distance` from ``rank``'s
        region is at most ``width`` (those outside it included): ``(rows [m] int64 ascending,
        distance [m] float64)``.

        The same rows as ``border_distance(...) <= width``, found by comparing the raw position
        columns with the borders, widened by a rounding tolerance, then the exact float64
        distance of those candidates only: no float64 copy of every position."""
        assert self.lo is not None and self.hi is not None and self.kind == "continuous"
        lo, hi = self.lo[rank].tolist(), self.hi[rank].tolist()
        field = pop[self.position[name]]
        mask = None
        for axis in self._bordered_axes(rank):
            v = field[:, axis]
            if v.dtype not in (torch.float32, torch.float64):
                v = v.to(torch.float32)
            tol = 8 * torch.finfo(v.dtype).eps * (abs(lo[axis]) + abs(hi[axis]) + abs(width)) + 1e-30
            near = (v <= lo[axis] + width + tol) | (v >= hi[axis] - width - tol)
            mask = near if mask is None else mask | near
        if mask is None:  # a region with no border
            return torch.zeros(0, dtype=torch.int64), torch.zeros(0, dtype=torch.float64)
        rows = flatnonzero(mask.cpu())
        dist = self.border_distance(name, None, rank, coords=self.coords(name, pop, rows))
        close = dist <= width
        return rows[close], dist[close]

    def halo_limit(self, reach: float) -> float:
        """Distance to a region border within which an agent may be within ``reach`` (plus the
        safety margin) of another region."""
        return reach + 2 * self._margin(reach)

    def border_distance(self, name: str, pop: Population | None, rank: int, coords: Tensor | None = None) -> Tensor:
        """``[n]`` float64 distance from each agent of ``pop`` (or each point of ``coords``
        ``[n, 2]``) to the nearest border of ``rank``'s region, over the axes where it has
        borders: ``min(v - lo, hi - v)``; negative outside the region, ``inf`` if it has none.
        An agent at a larger distance than :meth:`halo_limit` is within reach of no other region."""
        if coords is not None:
            return self._border_distance(rank, coords.shape[0], lambda axis: coords[:, axis])
        assert pop is not None
        return self._border_distance(rank, pop.n, lambda axis: self._axis(name, pop, axis))

    def _border_distance(self, r: int, n: int, column: Callable[[int], Tensor], last: int = 0) -> Tensor:
        assert self.lo is not None and self.hi is not None
        lo, hi = self.lo[r].tolist(), self.hi[r].tolist()
        d = torch.full((n,), math.inf, dtype=torch.float64)
        for axis in self._bordered_axes(r):
            v = column(axis)
            d = torch.minimum(d, torch.minimum(v - lo[axis], hi[axis] + last - v))
        return d

    def _near(self, c: Tensor, kind: str, reach: float, rank: int,
              exclude: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """(row of ``c``, destination rank) for every point of ``c`` ``[n, 2]`` within ``reach`` of
        another rank's region: the distance to each region, over periodic images. Given the
        candidates of :meth:`_near_border` in production; any points in the tests. With
        ``exclude`` (``[n]`` int64), point ``k`` skips rank ``exclude[k]`` instead of ``rank``."""
        assert self.lo is not None and self.hi is not None
        margin = self._margin(reach)
        lo, hi = self.lo[None], self.hi[None]
        if kind == "moore":
            hi = hi - 1  # last cell of the region
        x = c[:, None, :]
        d = torch.clamp(torch.maximum(lo - x, x - hi), min=0)
        if self.periodic:
            # Coordinates and borders lie in [0, L]: the images x + L (right of hi) and x - L
            # (left of lo) are at distances x + L - hi and lo + L - x, so one pass covers all three.
            size = torch.tensor(self.size, dtype=torch.float64)
            d = torch.minimum(d, torch.minimum(x + size - hi, lo + size - x))
        if kind == "moore":
            near = d.amax(-1) <= reach
        else:
            near = (d * d).sum(-1) <= (reach + margin) ** 2
        near &= (self.hi > self.lo).all(-1)[None]
        if exclude is None:
            near[:, rank] = False
        else:
            near[torch.arange(c.shape[0]), exclude] = False
        row, dest = torch.nonzero(near, as_tuple=True)
        return row, dest

    def _graph_send_lists(self, comm: Comm) -> None:
        src, dst = self.space.edges()
        src, dst = src.cpu(), dst.cpu()
        own_src = torch.bucketize(src, self.bounds[1:-1], right=True)
        own_dst = torch.bucketize(dst, self.bounds[1:-1], right=True)
        cut = (own_src == comm.rank) & (own_dst != comm.rank)
        key = torch.unique(own_dst[cut] * self.space.n_nodes + src[cut])
        self._send_dest = torch.div(key, self.space.n_nodes, rounding_mode="floor")
        self._send_uid = key % self.space.n_nodes

    def _ghost_rows(self, pop: Population) -> Tensor:
        """Local rows of the nodes in the send lists; cached while the uid column is the same
        tensor (any change of rows -- births, deaths, permutation -- replaces it)."""
        uid_t = pop[UID]
        if getattr(self, "_rows_of", None) is not uid_t:
            uid = uid_t.cpu()
            order = torch.argsort(uid)
            self._rows = order[torch.searchsorted(uid[order], self._send_uid)]
            self._rows_of = uid_t
        return self._rows

    def before_substep(self, state: State, substep: Substep, comm: Comm) -> None:
        """Refresh the halo of every population ``substep`` reads through ``neighbors``."""
        self.drop_halos()
        if comm.world_size == 1 or not substep.neighbors:
            return
        kind, reach = self._resolve_reach(substep)
        for name, fields in substep.neighbors.items():
            pop = state[name]
            send = pop.select(fields)
            if kind == "cell":
                continue
            if kind == "global":
                got = comm.all_gather_rows(send, include_self=False)
            elif kind == "graph":
                got = comm.exchange_rows(send, self._send_dest, self._ghost_rows(pop))  # type: ignore[attr-defined]
            else:
                near = self._near_border(name, pop, kind, reach, comm.rank)
                row, dest = self._near(self.coords(name, pop, near), kind, reach, comm.rank)
                got = comm.exchange_rows(send, dest, near.index_select(0, row))  # type: ignore[attr-defined]
            self.keep_halo(name, got)

    def after_substep(self, state: State | None = None, substep: Substep | None = None,
                      comm: Comm | None = None) -> None:
        """Drop the halos; migrate the populations whose position ``substep`` wrote or grew."""
        self.drop_halos()
        if state is None or substep is None or comm is None or comm.world_size == 1 or self.kind == "graph":
            return
        for name, field in self.position.items():
            if f"{name}.{field}" in substep.writes or name in substep.births:
                self.migrate(state, name, comm)

    # ------------------------------------------------------------------ migration
    def migrate(self, state: State, name: str, comm: Comm) -> int:
        """Send the agents of ``name`` whose owner is another rank there (all fields); return how many left."""
        pop = state[name]
        owner = self.owner(name, pop, rank=comm.rank).to(pop[UID].device)
        leaving = owner != comm.rank
        rows = flatnonzero(leaving)
        got = comm.exchange_rows(pop.fields(), owner[rows], rows)  # type: ignore[attr-defined]
        stay = flatnonzero(~leaving) if rows.numel() else None  # one nonzero for all fields
        if got[UID].shape[0]:
            pop.extend(got, keep=stay)  # one copy of every field
        elif stay is not None:
            pop.keep(stay)
        self.migrated += int(rows.numel())
        return int(rows.numel())

    # ------------------------------------------------------------------ balance
    def start_step(self) -> None:
        super().start_step()
        self.migrated = 0
        self.rebalanced = False

    def balance_due(self, step: int) -> bool:
        """Whether :meth:`maybe_balance` checks the load at the end of ``step``."""
        return self.balance_every > 0 and self.kind != "graph" and step % self.balance_every == 0

    def maybe_balance(self, state: State, comm: Comm, counts: list[int]) -> bool:
        """Rebalance when due and ``max(counts) / mean(counts) > balance_threshold`` (every rank
        passes the same per-rank agent counts, so all decide alike)."""
        if comm.world_size == 1 or not self.balance_due(state.step):
            return False
        mean = sum(counts) / len(counts)
        if mean == 0 or max(counts) / mean <= self.balance_threshold:
            return False
        self.sync_env(state, comm)
        self._set_balanced(state, comm)
        self._update_owned_cells(state, comm)
        for name in state.populations:
            self.migrate(state, name, comm)
        self.rebalanced = True
        return True
