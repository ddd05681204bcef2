"""The spatial partitioner: each rank owns a region of space and the agents in it.

:class:`SpatialPartition` (``partition="spatial"``) splits the model's space through the
:class:`~agentsim.space.base.Space` protocol, in the space's region coordinates
(:mod:`agentsim.distributed.regions`):

- a continuous :class:`~agentsim.space.continuous.Box`: axis-aligned rectangles over the
  first two axes (a 3D box is split in x and y only). ``layout="strips"``: equal strips
  along x; ``"blocks"``: a ``px x py`` grid of equal blocks (``px * py = W``);
  ``"rcb"``: recursive coordinate bisection of the initial agent positions (cuts at
  the bin edges of a global count histogram, so they are the same on every rank). An
  agent's owner is the region that contains its ``pos``;
- a :class:`~agentsim.space.grid.Grid` (a discrete space): the same rectangles in (row,
  column) cell coordinates with integer borders (strips are blocks of rows); an agent's
  owner is the owner of its ``cell``. Env layers are whole on every rank, as on the data
  partitioner: after a substep that writes them, every rank's changes are applied on every
  rank with the layer's declared combine (:mod:`agentsim.core.env`), so a substep may read env
  cells anywhere, whatever its reach;
- a :class:`~agentsim.space.graph.Graph` (agents placed by ``uid``: nodes that never move):
  contiguous uid blocks; the nodes adjacent to a rank's nodes are its ghosts.

Halos, before each substep that declares ``neighbors``, per the substep's ``reach``
(only ``uid`` and the declared fields travel, packed in one buffer, with
:meth:`TorchComm.exchange_rows <agentsim.distributed.comm.TorchComm.exchange_rows>`):

- a length (or the name of a length parameter): every agent goes to every other rank
  whose region lies within that distance (minimum image on periodic boxes; the
  Euclidean distance from the point to the rectangle, with a small safety margin);
- ``"moore:R"``: agents within R cells (Chebyshev, wrapping on a torus) of a region;
- ``"cell"``: no halo (all agents of a cell are on its owner);
- ``"graph"``: the ghost nodes, from send lists computed once when agents are placed;
- ``"global"``: every agent (an all_gather, as the data partitioner).

Migration: after every substep that writes a population's position field (``pos`` or
``cell``) or adds agents to it, agents whose owner changed move there with all their
fields (one packed exchange per population). Halos are therefore built from current
positions, and a substep with reach ``"cell"`` sees every agent of its cells.

With ``overlap=True`` (the default), a model whose first substep is agentwise and
reads neighbors within a length instead migrates once, at the end of the step, in the
same exchange as the next step's halo and the step's report
(:mod:`agentsim.distributed.overlap`; :meth:`SpatialPartition.split_run`); not in a
differentiable run (``grad=``), which exchanges substep by substep.

Differentiable runs: halo rows, migrating agents and env cells received from another
rank carry the gradient that reaches them back to their sender
(:mod:`agentsim.grad.autograd`), so gradients equal the one-process ones.

Load balancing (``balance_every=K > 0``): every K steps, when the largest per-rank
agent count exceeds ``balance_threshold`` times the mean, borders are recomputed from
the global position histogram (strips: quantile cuts along x; blocks: quantile
columns, then quantile rows within each column; rcb: bisection again) and agents
migrate. Results do not change: they never depend on which rank holds an agent.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from agentsim.core.comm import Comm
from agentsim.core.context import Halos
from agentsim.core.ops import flatnonzero
from agentsim.core.params import Params
from agentsim.core.state import UID, Population, State
from agentsim.core.substep import Substep, resolve_reach
from agentsim.distributed import regions as geo
from agentsim.distributed.overlap import OverlapExchange, overlap_plan
from agentsim.distributed.partition import IdentityPartition, SplitRun, StepReport
from agentsim.distributed.regions import LAYOUTS, Regions
from agentsim.errors import ConfigError, did_you_mean
from agentsim.grad.autograd import exchange_with_grad, gather_with_grad
from agentsim.space.base import Space, check_reaches

__all__ = ["LAYOUTS", "SpatialPartition"]


def check_layout_splits(space: Any, layout: str, world_size: int) -> None:
    """Refuse a ``strips`` or ``blocks`` layout that would leave a rank without a region: an axis cut
    into more parts than a grid has cells along it, or a line's missing second axis cut at all.

    Raises:
        ConfigError: naming the axis, its size and the layouts or shapes that split.
    """
    if world_size == 1:
        return
    parts = (world_size, 1) if layout == "strips" else geo.factor(world_size)
    one_axis = getattr(space, "region_axes", 2) == 1
    name = type(space).__name__
    for axis, (p, size) in enumerate(zip(parts, space.region_extent, strict=True)):
        if p == 1:
            continue
        if one_axis and axis == 1:
            raise ConfigError(f"partition 'spatial': layout {layout!r} at W = {world_size} cuts a {parts[0]} x "
                              f"{parts[1]} grid of blocks, but a {name} has one axis: use layout 'strips' or "
                              "'rcb', which cut it into W stretches")
        if space.discrete and size < p:
            what = ("rows", "columns")[axis] if name == "Grid" else f"cells along axis {axis}"
            other = ""
            if name == "Grid":
                h, w = space.shape
                other = f", a Grid(({w}, {h})) turned round," if h < w and axis == 0 else ""
            raise ConfigError(f"partition 'spatial': layout {layout!r} at W = {world_size} cuts axis {axis} "
                              f"({what}) into {p} parts, but the {name} has {int(size)} {what}: some processes "
                              f"would hold no region. Use layout 'rcb' (it cuts the longer axis){other} or fewer "
                              "processes")


class SpatialPartition(IdentityPartition):
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
        regions: The regions (:class:`~agentsim.distributed.regions.Regions`) once agents are
            placed (None on a graph: nodes go by uid blocks, :attr:`bounds`).
        overlap: The :class:`~agentsim.distributed.overlap.OverlapExchange` when the run
            qualifies for it, else None.
        migrated: Agents this rank sent away in migrations since the last report.
        halo_rows, halo_bytes: Halo rows and bytes this rank received since the last report.

    Examples:
        >>> from agentsim.core.comm import LocalComm
        >>> from agentsim.engine.simulation import Simulation
        >>> from agentsim.models.boids import MODEL
        >>> sim = Simulation(MODEL, agents=10, seed=0)
        >>> part = SpatialPartition("rcb")
        >>> part.place(sim.state, sim.space, MODEL.substeps, sim.params, LocalComm())["boid"].n  # one rank keeps all
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
        self.allow_overlap = overlap
        self.layout = layout
        self.balance_every = balance_every
        self.balance_threshold = float(balance_threshold)
        self.bins = bins
        self.space: Any = None
        self.params: Params | dict[str, Any] = {}
        self.regions: Regions | None = None
        self.bounds: Tensor | None = None  # [W + 1] int64 node-id borders (graph)
        self.position: dict[str, str] = {}
        self.overlap: OverlapExchange | None = None
        self._send_dest = self._send_uid = torch.zeros(0, dtype=torch.int64)
        # population -> (uid column, its rows in the send lists, their destinations)
        self._ghost_cache: dict[str, tuple[Tensor, Tensor, Tensor]] = {}

    def __repr__(self) -> str:
        return (f"SpatialPartition(layout={self.layout!r}, balance_every={self.balance_every}, "
                f"balance_threshold={self.balance_threshold}, overlap={self.allow_overlap})")

    # ------------------------------------------------------------------ set-up
    @property
    def nodes(self) -> bool:
        """Whether agents are the nodes of a network (placed by uid; they never move)."""
        return self.space is not None and self.space.position_field == UID

    @property
    def discrete(self) -> bool:
        """Whether region coordinates are integers (cells, nodes)."""
        return bool(self.space.discrete)

    def bind(self, space: Any, params: Params | dict[str, Any]) -> None:
        """Attach the model's space and resolved parameters (:meth:`place` does it)."""
        if not isinstance(space, Space):
            raise ConfigError(f"partition 'spatial' needs a space (a Box, Grid, Line or Graph; got "
                              f"{type(space).__name__}); use partition 'data'")
        self.space, self.params = space, params

    def _position_field(self, pop: Population) -> str:
        want = self.space.position_field
        if want not in pop:
            raise ConfigError(f"partition 'spatial': population '{pop.name}' has no '{want}' field "
                              f"(a {type(self.space).__name__} places agents by '{want}'); use partition 'data'")
        return str(want)

    def place(self, state: State, space: Any, substeps: Sequence[Substep], params: Params, comm: Comm,
              shared: bool = False) -> State:
        """Compute the regions from the (global) initial state and keep this rank's agents; or,
        ``shared`` (each rank built its own share of the agents), compute them from the histogram
        of every rank's agents and send each agent to the rank whose region holds it.
        """
        self.bind(space, params)
        check_reaches(substeps, params, space)
        self.position = {name: self._position_field(pop) for name, pop in state.populations.items()}
        W = comm.world_size
        if self.nodes:
            if not callable(getattr(space, "edges", None)):
                raise ConfigError(f"partition 'spatial': a {type(space).__name__} places agents by uid (a network) "
                                  "but has no edges() for the ghost nodes; use partition 'data'")
            n = int(self.space.region_extent[0])
            self.bounds = torch.tensor([n * r // W for r in range(W + 1)], dtype=torch.int64)
            self._graph_send_lists(comm)
        else:
            if self.layout == "rcb":
                self.regions = geo.bisection(*self._histogram2d(state, comm if shared else None), W,
                                             self.space.region_extent, self.space.periodic)
            else:
                check_layout_splits(self.space, self.layout, W)
                self.regions = geo.uniform(self.space.region_extent, W, self.layout, self.discrete,
                                           self.space.periodic)
        for name, pop in state.populations.items():
            if shared and W > 1:
                self.move_agents(state, name, comm)
            else:
                pop.keep(self.owner(name, pop) == comm.rank)
        self.migrated = 0  # placing is not migrating
        # A differentiable run (grad parameters among params) exchanges step by step, without the overlap.
        differentiable = any(isinstance(v, Tensor) and v.requires_grad for v in params.values())
        plan = overlap_plan(self, substeps, params, comm) if self.allow_overlap and not differentiable else None
        self.overlap = OverlapExchange(self, *plan) if plan is not None else None
        return state

    # ------------------------------------------------------------------ regions
    def coords(self, name: str, pop: Population, rows: Tensor | None = None) -> Tensor:
        """``[n, 2]`` float64 region coordinates of the agents on the CPU; of the agents at
        ``rows`` (int64 ``[m]``) only, if given.
        """
        field = pop[self.position[name]]
        if rows is not None:
            field = field.index_select(0, rows.to(field.device))
        coords: Tensor = self.space.region_coords(field).cpu()
        return coords

    def _axis(self, name: str, pop: Population, axis: int) -> Tensor:
        """``[n]`` float64 region coordinate ``axis`` of every agent (one column of :meth:`coords`)."""
        column: Tensor = self.space.region_coords(pop[self.position[name]], axis).cpu()
        return column

    def owner(self, name: str, pop: Population, rank: int | None = None) -> Tensor:
        """``[n]`` int64 owning rank of every agent of ``pop`` (on CPU).

        With ``rank``, the agents inside that rank's region (usually nearly all of its own
        agents) are found first with :func:`~agentsim.distributed.regions.contains`, the rule of
        the full search, reading only the coordinates of the axes where the region has
        borders; the full search runs on the others only. Regions do not overlap, so the
        result is the same.
        """
        if self.nodes:
            assert self.bounds is not None
            return torch.bucketize(pop[UID].cpu(), self.bounds[1:-1], right=True).to(torch.int64)
        assert self.regions is not None
        if rank is None:
            return geo.owner_of(self.regions, self.coords(name, pop))
        inside = geo.contains(self.regions, rank, pop.n, lambda axis: self._axis(name, pop, axis))
        owner = torch.full((pop.n,), rank, dtype=torch.int64)
        out = flatnonzero(~inside)
        if out.numel():
            owner[out] = geo.owner_of(self.regions, self.coords(name, pop, out))
        return owner

    def owner_of(self, coords: Tensor) -> Tensor:
        """``[n]`` int64 owner of region coordinates ``coords`` ``[n, 2]``."""
        assert self.regions is not None
        return geo.owner_of(self.regions, coords)

    def _histogram(self, state: State, ex: Tensor, ey: Tensor, comm: Comm | None = None) -> Tensor:
        """Agent counts ``[len(ex) - 1, len(ey) - 1]`` int64 in the bins of edges ``ex``, ``ey``, of
        every population (of every rank, with ``comm``: a collective).
        """
        hist = torch.zeros(len(ex) - 1, len(ey) - 1, dtype=torch.int64)
        for name, pop in state.populations.items():
            hist += geo.histogram(self.coords(name, pop), ex, ey)
        return hist if comm is None else comm.sum_int64(hist.reshape(-1)).reshape(hist.shape)

    def _histogram2d(self, state: State, comm: Comm | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """Agent counts ``[bx, by]`` int64 in at most 256 bins per axis, and the bin edges per axis."""
        nb = min(self.bins, 256)
        extent = self.space.region_extent
        ex, ey = geo.bin_edges(extent[0], nb, self.discrete), geo.bin_edges(extent[1], nb, self.discrete)
        return self._histogram(state, ex, ey, comm), ex, ey

    def _balanced_regions(self, state: State, comm: Comm) -> Regions:
        """New borders from the global position histogram (collective)."""
        W, extent, periodic = comm.world_size, self.space.region_extent, self.space.periodic
        hist, ex, ey = self._histogram2d(state, comm)
        if self.layout == "rcb":
            return geo.bisection(hist, ex, ey, W, extent, periodic)
        if self.layout == "strips":  # finer cuts from the 1D marginal: one bin along the other axis
            ex = geo.bin_edges(extent[0], self.bins, self.discrete)
            hist = self._histogram(state, ex, torch.tensor([0.0, extent[1]], dtype=torch.float64), comm)
        return geo.balanced(hist, ex, ey, W, self.layout, extent, periodic)

    # ------------------------------------------------------------------ halos

    def halo_limit(self, reach: float) -> float:
        """Distance to a region border within which an agent may be within ``reach`` (plus the
        safety margin) of another region.
        """
        return geo.halo_limit(reach, self.space.region_extent)

    def halo_destinations(self, coords: Tensor, kind: str, reach: float, rank: int,
                          exclude: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """(row of ``coords``, destination rank) of the points within ``reach`` of another region
        (see :func:`~agentsim.distributed.regions.halo_destinations`).
        """
        assert self.regions is not None
        return geo.halo_destinations(self.regions, coords, kind, reach, rank, exclude)

    def border_candidates(self, name: str, pop: Population, kind: str, reach: float, rank: int) -> Tensor:
        """``[m]`` int64 rows of the agents within ``reach`` (plus margin) of ``rank``'s region
        border, on the axes where it has one: the only agents that can be within reach of
        another region, which :meth:`halo_destinations` then tests exactly.

        The shortest way from a point of this rank's rectangle to another region (or to a
        periodic image of one) crosses this rectangle's border, on an axis where it has one
        (a region spanning a whole axis is separated from the others along the other axis).
        A point outside the rectangle has a negative distance and is kept. Typically a few
        percent of the agents qualify.
        """
        limit = self.halo_limit(reach)
        if not self.discrete:
            return self.near_border(name, pop, rank, limit)[0]
        assert self.regions is not None
        last = -1 if kind == "moore" else 0  # cells: the region's last cell is hi - 1
        dist = geo.border_distance(self.regions, rank, pop.n, lambda axis: self._axis(name, pop, axis), last)
        return flatnonzero(dist <= limit)

    def near_border(self, name: str, pop: Population, rank: int, width: float) -> tuple[Tensor, Tensor]:
        """The agents of ``pop`` (continuous space) whose :meth:`border_distance` from ``rank``'s
        region is at most ``width`` (those outside it included): ``(rows [m] int64 ascending,
        distance [m] float64)``.

        The same rows as ``border_distance(...) <= width``, found by comparing the raw position
        columns with the borders, widened by a rounding tolerance, then the exact float64
        distance of those candidates only: no float64 copy of every position.
        """
        assert self.regions is not None and not self.discrete
        lo, hi = self.regions.lo[rank].tolist(), self.regions.hi[rank].tolist()
        field = pop[self.position[name]]
        mask = None
        for axis in geo.bordered_axes(self.regions, rank):
            v = field[:, axis] if field.dim() == 2 else field  # a line's x: [n], one axis
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

    def border_distance(self, name: str, pop: Population | None, rank: int, coords: Tensor | None = None) -> Tensor:
        """``[n]`` float64 distance from each agent of ``pop`` (or each point of ``coords``
        ``[n, 2]``) to the nearest border of ``rank``'s region, over the axes where it has
        borders; negative outside the region, ``inf`` if it has none. An agent farther than
        :meth:`halo_limit` is within reach of no other region.
        """
        assert self.regions is not None
        if coords is not None:
            return geo.border_distance(self.regions, rank, coords.shape[0], lambda axis: coords[:, axis])
        assert pop is not None
        return geo.border_distance(self.regions, rank, pop.n, lambda axis: self._axis(name, pop, axis))

    def _graph_send_lists(self, comm: Comm) -> None:
        assert self.bounds is not None
        n = int(self.space.region_extent[0])
        src, dst = self.space.edges()
        src, dst = src.cpu(), dst.cpu()
        own_src = torch.bucketize(src, self.bounds[1:-1], right=True)
        own_dst = torch.bucketize(dst, self.bounds[1:-1], right=True)
        cut = (own_src == comm.rank) & (own_dst != comm.rank)
        key = torch.unique(own_dst[cut] * n + src[cut])
        self._send_dest = torch.div(key, n, rounding_mode="floor")
        self._send_uid = key % n

    def _ghost_rows(self, pop: Population) -> tuple[Tensor, Tensor]:
        """``(local rows, destination ranks)`` of this population's nodes in the send lists (the nodes
        of a graph may belong to several populations: each sends its own); cached per population
        while its uid column is the same tensor (any change of rows -- births, deaths, permutation --
        replaces it).
        """
        uid_t = pop[UID]
        cached = self._ghost_cache.get(pop.name)
        if cached is None or cached[0] is not uid_t:
            uid = uid_t.cpu()
            order = torch.argsort(uid)
            ordered = uid[order]
            at = torch.searchsorted(ordered, self._send_uid)
            held = at < ordered.numel()
            held[held.clone()] = ordered[at[held]] == self._send_uid[held]
            cached = (uid_t, order[at[held]], self._send_dest[held])
            self._ghost_cache[pop.name] = cached
        return cached[1], cached[2]

    def halos(self, state: State, substep: Substep, comm: Comm) -> Halos:
        """The rows of other ranks' agents ``substep`` may read, per its reach (module docstring)."""
        if comm.world_size == 1 or not substep.neighbors:
            return {}
        ov = self.overlap
        if ov is not None and substep is ov.substep and ov.halo is not None:
            halo, ov.halo = ov.halo, None  # received with the last step's exchange (counted there)
            return {ov.name: halo}
        kind, reach = resolve_reach(substep, self.params)  # checked against the space by place()
        out = {}
        for name, fields in substep.neighbors.items():
            pop = state[name]
            if kind == "cell":
                continue
            send = pop.select(fields)  # in a differentiable run, with a way back for gradients
            if kind == "global":
                got = gather_with_grad(comm, send, self.grad_links)
            elif kind == "graph":
                rows, dest = self._ghost_rows(pop)
                got = exchange_with_grad(comm, send, dest, rows, self.grad_links)
            else:
                near = self.border_candidates(name, pop, kind, reach, comm.rank)
                row, dest = self.halo_destinations(self.coords(name, pop, near), kind, reach, comm.rank)
                got = exchange_with_grad(comm, send, dest, near.index_select(0, row), self.grad_links)
            self.count_halo(got)
            out[name] = got
        return out

    # ------------------------------------------------------------------ migration
    def migrate(self, state: State, substep: Substep, comm: Comm) -> None:
        """After ``substep``: migrate the populations whose position it wrote or that it grew (with
        the overlapped exchange, migration travels with the step's exchange instead).
        """
        if comm.world_size == 1 or self.nodes or self.overlap is not None:
            return
        for name, field in self.position.items():
            if f"{name}.{field}" in substep.writes or name in substep.births:
                self.move_agents(state, name, comm)

    def move_agents(self, state: State, name: str, comm: Comm) -> int:
        """Send the agents of ``name`` whose owner is another rank there (all fields); return how many left."""
        pop = state[name]
        owner = self.owner(name, pop, rank=comm.rank).to(pop[UID].device)
        leaving = owner != comm.rank
        rows = flatnonzero(leaving)
        got = exchange_with_grad(comm, pop.fields(), owner[rows], rows, self.grad_links)
        stay = flatnonzero(~leaving) if rows.numel() else None  # one nonzero for all fields
        if got[UID].shape[0]:
            pop.extend(got, keep=stay)  # one copy of every field
        elif stay is not None:
            pop.keep(stay)
        self.migrated += int(rows.numel())
        return int(rows.numel())

    # ------------------------------------------------------------------ the step's exchange
    def split_run(self, substep: Substep) -> SplitRun | None:
        """The overlapped run of the model's first substep while the last step's exchange travels."""
        ov = self.overlap
        if ov is not None and substep is ov.substep and ov.pending is not None:
            return ov.run_split
        return None

    def end_step(self, state: State, report: StepReport, comm: Comm, *, hold: bool) -> None:
        """Without the overlap: as :meth:`IdentityPartition.end_step` (posted inside a run unless a
        rebalance is due). With it: the report
        travels with migrants and the next halo in one exchange, posted without waiting when
        ``hold`` (inside a run) and no rebalancing is due.
        """
        ov = self.overlap
        if ov is None:
            super().end_step(state, report, comm, hold=hold)
            return
        self.take_figures(report)
        ov.reuse = hold  # no one else holds the state's tensors inside a run
        ov.post_report(state, comm, report, wait=not hold or self.balance_due(state.step))
        if not hold:  # the state may change before the next step: keep no halo
            ov.halo = None

    def report_due(self, step: int) -> bool:
        """Whether the report of ``step`` is needed at the step's end: when a rebalance is due."""
        return self.balance_due(step)

    def settle(self, state: State, comm: Comm) -> None:
        """Finish the exchange in flight, if any (its summary joins :meth:`reports`)."""
        super().settle(state, comm)
        if self.overlap is not None and self.overlap.pending is not None:
            self.overlap.finish(state, comm)

    def release(self) -> None:
        """Forget the halo received for the next step and the tensors kept for reuse."""
        if self.overlap is not None:
            self.overlap.halo = None
            self.overlap.reuse = False
            self.overlap.forget_allocated()  # the caller may now hold the state's tensors

    # ------------------------------------------------------------------ balance
    def balance_due(self, step: int) -> bool:
        """Whether :meth:`rebalance` checks the load at the end of ``step``."""
        return self.balance_every > 0 and not self.nodes and step % self.balance_every == 0

    def rebalance(self, state: State, comm: Comm, counts: list[int]) -> list[int] | None:
        """Move the borders when due and ``max(counts) / mean(counts) > balance_threshold`` (every
        rank passes the same per-rank agent counts, so all decide alike); return the new counts.
        """
        if comm.world_size == 1 or not self.balance_due(state.step):
            return None
        mean = sum(counts) / len(counts)
        if mean == 0 or max(counts) / mean <= self.balance_threshold:
            return None
        self.regions = self._balanced_regions(state, comm)
        for name in state.populations:
            self.move_agents(state, name, comm)
        if self.overlap is not None:
            self.overlap.halo = None  # borders moved: the halo received with the last exchange is stale
            self.overlap.depth = 0.0  # and the arrivals' depth is measured against the new borders
        n_local = torch.tensor([[sum(p.n for p in state.populations.values())]], dtype=torch.int64)
        return [int(v) for v in comm.all_gather_rows({"n": n_local}, rows_per_rank=1)["n"][:, 0].tolist()]
