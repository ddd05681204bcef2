"""One exchange per step that does not stop the ranks: migration, the next halo and the figures.

Scope (:func:`overlap_plan`): the spatial partitioner on a continuous space with
several ranks and ``sync_every=1``, and a model with one population ``P`` whose first
substep ``S`` is ``agentwise`` (see :mod:`agentsim.core.substep`) and reads neighbors of ``P``
within a length ``reach``; no other substep reads neighbors, none has births or deaths.
``SpatialPartition(overlap=False)`` turns it off. Boids qualifies.

For such a model the step's communication is one exchange at the end of the step,
posted without waiting (an asynchronous ``all_to_all_single``), instead of a halo
exchange before ``S``, a migration after each position write and a gather of the
step's figures (five collectives, three points where every rank waits for the slowest).
Each rank sends to each other rank ``d``, in one buffer:

- a fixed-size header: this rank's figures of the step (agents, seconds, bytes...),
  error flags and, inside ``run``, metric sums (exact int64 sums, the same whichever
  rank holds an agent, so they can be taken before the agents move);
- the agents that now belong to ``d``, with every field (migration);
- every other agent within ``reach`` of ``d``'s region that ``d`` will not own, with the
  fields ``S`` reads of neighbors (``d``'s halo for ``S`` of the next step). Agents this
  rank gives away but needs as halo itself stay here as halo rows.

The next step runs ``S`` in two parts. First for every agent of the rank, with the
agents of the rank as the only neighbors, while the exchange travels: every agent
farther than :meth:`~agentsim.distributed.spatial.SpatialPartition.halo_limit` ``+ D``
from the region's borders, where ``D`` is how deep inside the region the deepest arriving
agent lies, then has all its neighbors within reach (an agent outside the region, such
as one leaving, lies farther than reach from it). Then the rank waits for the exchange
(by then usually long done) and runs ``S`` again for the agents within ``halo_limit + D``
of a border and for the arrivals, with the agents near them and the halo as neighbors,
and keeps those values. ``S`` being agentwise, each agent gets the values of one run over
all agents: results keep their bits (the tests compare them with one process and with
``overlap=False``). A flag of ``S`` is per agent (see :meth:`agentsim.core.context.Context.flag`):
the first run's flags count for the agents whose values it keeps, the second's for the
rest. After the second run the leaving agents leave and the arriving ones take their
rows (:meth:`OverlapExchange.merge`; row order never changes results).

A rank thus waits for the others only when it has finished its first run, not at each
collective. Buffers have a capacity per pair of ranks, known to both: twice the bytes
of the pair's last exchange, at least :data:`MIN_CAPACITY`. A pair that needs more sends
the rest in a second, waiting round, which every rank joins (each header says whether
its sender overflowed). The first exchange agrees on sizes first.

The exchange waits at once (no overlap) outside ``run`` and on load-balancing steps; at
the last step of a ``run`` and before a trajectory frame the run loop completes it right
after the step (:meth:`~agentsim.distributed.partition.Partitioner.settle`). The run loop records a
step's metrics when its figures arrive (during the next step), so a NaN flag raises on
every rank at the same point, after the first substep of the next step, naming its step.
Rows due for the cell sort (:mod:`agentsim.engine.locality`) are sorted at the end of the step,
before the exchange is posted, so that the sort does not make the next step wait.

Tested with gloo on CPU (tests/test_overlap.py, tests/test_distributed_spatial.py); the
NCCL path goes through the same calls but has not run on a GPU yet.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from agentsim.core.comm import Comm, Work
from agentsim.core.context import Flag
from agentsim.core.ops import flatnonzero, take_rows
from agentsim.core.state import UID, Population, State
from agentsim.core.substep import ENV, Substep, resolve_reach
from agentsim.distributed.comm import pack_rows, unpack_rows
from agentsim.distributed.partition import CallSubstep, StepReport

if TYPE_CHECKING:
    from agentsim.distributed.spatial import SpatialPartition

__all__ = ["MIN_CAPACITY", "OverlapExchange", "overlap_plan"]

MIN_CAPACITY = 4096  # bytes per pair of ranks and step, at least


def overlap_plan(partition: SpatialPartition, substeps: Sequence[Substep], params: Mapping[str, Any],
                 comm: Comm) -> tuple[str, Substep, float] | None:
    """``(population, substep S, reach)`` when the run qualifies for the overlapped exchange
    (see the module docstring), else None.
    """
    if (comm.world_size == 1 or not substeps or partition.discrete or partition.nodes
            or len(partition.position) != 1):
        return None
    name = next(iter(partition.position))
    first = substeps[0]
    if not first.agentwise or set(first.neighbors) != {name} or first.writable(name) == set():
        return None
    kind, reach = resolve_reach(first, params)
    if kind != "length":
        return None
    for s in substeps:
        if s.births or s.deaths or (s is not first and s.neighbors) or "add" in map(s.env_combine, s.writable(ENV)):
            return None  # (a layer that adds may take deposits: their sums are not split around the exchange)
    return name, first, reach


def _capacity(payload: int) -> int:
    return max(MIN_CAPACITY, -(-2 * payload // 64) * 64)


@dataclass
class _Pending:
    out: Tensor  # receive buffer of round one (valid after the wait)
    work: Work | None
    waited: bool  # waited for at once, at the end of its step
    recv_splits: list[int]
    payload_out: list[int]  # bytes this rank has for each rank
    rest_out: list[Tensor]  # what did not fit the capacity, per rank
    leave: Tensor  # [k] int64 rows this rank gives away (by destination)
    self_halo: dict[str, Tensor]
    header: dict[str, Tensor]  # this rank's own header
    header_bytes: int  # packed size of a header (the same on every rank)


class OverlapExchange:
    """The end-of-step exchange of one population (see the module docstring).

    Args:
        partition: The bound, scattered spatial partitioner.
        name: The population.
        substep: ``S``, the first substep (agentwise, reads neighbors of ``name``).
        reach: ``S``'s reach (length units).

    Attributes:
        pending: The posted exchange, until :meth:`complete`.
        halo: After :meth:`complete`: the halo rows for ``S`` of the next step
            (uid and ``S``'s neighbor fields), received and kept; None when stale.
        arrived: After ``complete(merge=False)``, until :meth:`merge`: the arriving agents
            (every field, ``[m, ...]``); ``arrived_dist`` ``[m]`` float64 is how deep inside
            this rank's region each lies (length units).
        leave: From :meth:`post` until :meth:`merge`: ``[k]`` int64 rows given away (rows
            as at :meth:`post`).
        depth: How deep inside this rank's region the deepest arrival so far lay (length
            units): :meth:`post` finds the agents the next step may run again with that guess.
        reuse: Let :meth:`merge` write into the field tensors that an earlier merge allocated
            (the partitioner sets it only inside a run, where no one else holds them, and
            forgets them when the run ends); otherwise every merge allocates new ones.
    """

    def __init__(self, partition: SpatialPartition, name: str, substep: Substep, reach: float) -> None:
        self.partition = partition
        self.name = name
        self.substep = substep
        self.reach = reach
        self.nb_fields = (UID, *[f for f in substep.neighbors[name] if f != UID])
        self.cap_out: list[int] | None = None
        self.cap_in: list[int] | None = None
        self.pending: _Pending | None = None
        self.halo: dict[str, Tensor] | None = None
        self.arrived: dict[str, Tensor] | None = None
        self.arrived_dist = torch.zeros(0, dtype=torch.float64)
        self.leave = torch.zeros(0, dtype=torch.int64)
        self.depth = 0.0
        self._near: tuple[Tensor, Tensor, float] | None = None
        self.reuse = False
        self._allocated: dict[str, Tensor] = {}  # field tensors the last merge made (with reuse)
        self._report: StepReport | None = None  # the report that travels with the posted exchange

    # ------------------------------------------------------------------ sending
    def post(self, state: State, comm: Comm, header: dict[str, Tensor], wait: bool) -> None:
        """Start the exchange for the current state (see the module docstring). The rows stay
        as they are until :meth:`merge`.

        Args:
            header: One-row tensors (same names, dtypes and shapes on every rank): this
                rank's figures, flags and metric sums for the step; ``"ints"`` is added.
            wait: Complete at once (:meth:`complete` still has to be called).
        """
        assert self.pending is None and self.arrived is None, "the previous exchange was not completed"
        part, pop, rank, W = self.partition, state[self.name], comm.rank, comm.world_size
        # Only agents within the limit of a border may leave or be another rank's halo. The
        # next step's second run of S needs those within 2 limits + the arrivals' depth: found
        # in the same pass (the rows stay as they are until merge), unless arrivals come deeper.
        limit = part.halo_limit(self.reach)
        width = 2 * (limit + self.depth)  # room for arrivals somewhat deeper than any so far
        self._near = (*part.near_border(self.name, pop, rank, width), width)
        near, dist = self.near_border(pop, rank, limit)
        # Agents outside the region have dist <= 0 (half-open borders: = 0 may be either side).
        at_edge = flatnonzero(dist <= 0)
        edge = near.index_select(0, at_edge)
        coords = part.coords(self.name, pop, near)  # [m, 2] float64
        edge_owner = part.owner_of(coords.index_select(0, at_edge))
        owner = torch.full((near.shape[0],), rank, dtype=torch.int64)  # of the near rows
        owner[at_edge] = edge_owner
        gone = edge_owner != rank
        mig_dest, by_dest = torch.sort(edge_owner[gone], stable=True)
        leave = edge[gone].index_select(0, by_dest)
        row, dest = part.halo_destinations(coords, "length", self.reach, rank, exclude=owner)
        rows = near.index_select(0, row)
        own = dest == rank  # agents given away that this rank needs as halo itself
        self_rows = rows[own]
        h_dest, by_dest = torch.sort(dest[~own], stable=True)
        h_rows = rows[~own].index_select(0, by_dest)
        mig = pack_rows({k: v.index_select(0, leave.to(v.device)) for k, v in pop.fields().items()}).cpu()
        halo = pack_rows({k: pop[k].index_select(0, h_rows.to(pop[k].device)) for k in self.nb_fields}).cpu()
        self_halo = {k: pop[k].index_select(0, self_rows.to(pop[k].device)) for k in self.nb_fields}
        n_mig = torch.bincount(mig_dest, minlength=W).tolist()
        n_halo = torch.bincount(h_dest, minlength=W).tolist()
        payload = [n_mig[d] * mig.shape[1] + n_halo[d] * halo.shape[1] for d in range(W)]
        if self.cap_out is None:  # first exchange: agree on sizes
            self.cap_out = [0 if d == rank else p for d, p in enumerate(payload)]
            self.cap_in = comm.exchange_counts(self.cap_out)
        assert self.cap_in is not None
        overflow = any(payload[d] > self.cap_out[d] for d in range(W) if d != rank)
        ints = torch.tensor([[0, 0, 0, int(overflow), *n_mig]], dtype=torch.int64)
        own_header = {"ints": ints, **header}
        pieces, rest, send_splits = [], [], []
        mig_at = [0, *torch.cumsum(torch.tensor(n_mig), 0).tolist()]
        halo_at = [0, *torch.cumsum(torch.tensor(n_halo), 0).tolist()]
        for d in range(W):
            if d == rank:
                rest.append(mig.new_empty(0))
                send_splits.append(0)
                continue
            ints_d = ints.clone()
            ints_d[0, :3] = torch.tensor([payload[d], n_mig[d], n_halo[d]])
            data = torch.cat([mig[mig_at[d]:mig_at[d + 1]].reshape(-1), halo[halo_at[d]:halo_at[d + 1]].reshape(-1)])
            cap = self.cap_out[d]
            head = pack_rows({**own_header, "ints": ints_d}).reshape(-1)
            pieces += [head, data[:cap], data.new_zeros(max(0, cap - data.numel()))]
            rest.append(data[cap:])
            send_splits.append(head.numel() + cap)
        h = pack_rows(own_header).shape[1]
        recv_splits = [0 if s == rank else h + self.cap_in[s] for s in range(W)]
        send = torch.cat(pieces) if pieces else torch.zeros(0, dtype=torch.uint8)
        out, work = comm.post_all_to_all(send, send_splits, recv_splits)
        self.pending = _Pending(out, work, wait, recv_splits, payload, rest, leave, self_halo, own_header, h)
        if wait:
            comm.wait(work)
            self.pending.work = None

    def near_border(self, pop: Population, rank: int, width: float) -> tuple[Tensor, Tensor]:
        """:meth:`~agentsim.distributed.spatial.SpatialPartition.near_border` of the rows as
        they were at :meth:`post` (until :meth:`merge`), from the pass that post made when
        ``width`` is within its width.
        """
        if self._near is not None and width <= self._near[2]:
            rows, dist, _ = self._near
            close = dist <= width
            return rows[close], dist[close]
        return self.partition.near_border(self.name, pop, rank, width)

    # ------------------------------------------------------------------ receiving
    def complete(self, state: State, comm: Comm, merge: bool = True) -> list[dict[str, Tensor]]:
        """Wait for the posted exchange and keep the halo; return every rank's header (rank
        order; one-row tensors; ``"ints"[0, 4:]`` is the rank's migrants per destination).

        Args:
            merge: Also :meth:`merge` at once: the leaving agents out of the population,
                the arriving ones in. Otherwise they wait in :attr:`arrived` and
                :attr:`leave` until the caller merges.
        """
        p = self.pending
        assert p is not None and self.cap_in is not None and self.cap_out is not None
        self.pending = None
        if p.work is not None:
            comm.wait(p.work)
        rank, W = comm.rank, comm.world_size
        pop = state[self.name]
        h = p.header_bytes
        heads, data, offset = [], [], 0
        for s in range(W):
            if s == rank:
                heads.append(p.header)
                data.append(p.out.new_empty(0))
                continue
            block = p.out[offset:offset + p.recv_splits[s]]
            offset += p.recv_splits[s]
            head = unpack_rows(block[:h].reshape(1, h), p.header)
            heads.append(head)
            data.append(block[h:h + min(int(head["ints"][0, 0]), self.cap_in[s])])
        payload_in = [0 if s == rank else int(heads[s]["ints"][0, 0]) for s in range(W)]
        if any(bool(hd["ints"][0, 3]) for hd in heads):  # someone overflowed: a second round, all join
            send = torch.cat(p.rest_out)
            rest_in = [max(0, payload_in[s] - self.cap_in[s]) for s in range(W)]
            out, work = comm.post_all_to_all(send, [t.numel() for t in p.rest_out], rest_in)
            comm.wait(work)
            at = [0, *torch.cumsum(torch.tensor(rest_in), 0).tolist()]
            data = [torch.cat([data[s], out[at[s]:at[s + 1]]]) for s in range(W)]
        self.cap_out = [0 if d == rank else _capacity(p.payload_out[d]) for d in range(W)]
        self.cap_in = [0 if s == rank else _capacity(payload_in[s]) for s in range(W)]
        like = {k: v[:0] for k, v in pop.fields().items()}
        nb_like = {k: pop[k][:0] for k in self.nb_fields}
        mig_row = pack_rows(like).shape[1]
        nb_row = pack_rows(nb_like).shape[1]
        mig_parts, halo_parts = [], []
        for s in range(W):
            if s == rank:
                continue
            m, n_h = int(heads[s]["ints"][0, 1]), int(heads[s]["ints"][0, 2])
            mig_parts.append(data[s][:m * mig_row].reshape(m, mig_row))
            halo_parts.append(data[s][m * mig_row:m * mig_row + n_h * nb_row].reshape(n_h, nb_row))
        device = pop[UID].device
        self.arrived = {k: v.to(device) for k, v in unpack_rows(torch.cat(mig_parts), like).items()}
        received = {k: v.to(device) for k, v in unpack_rows(torch.cat(halo_parts), nb_like).items()}
        where = self.partition.space.region_coords(self.arrived[self.partition.position[self.name]]).cpu()
        self.arrived_dist = self.partition.border_distance(self.name, None, rank, coords=where)
        if self.arrived_dist.numel():
            self.depth = max(self.depth, float(self.arrived_dist.max()))
        self.leave = p.leave
        self.partition.count_halo(received)
        self.halo = {k: torch.cat([received[k], p.self_halo[k]]) for k in self.nb_fields}
        if merge:
            self.merge(state)
        return heads

    def merge(self, state: State, written: Mapping[str, Tensor] | None = None,
              arrived_written: Mapping[str, Tensor] | None = None) -> None:
        """Take the leaving agents out of the population and put the arriving ones in: each
        arrival takes a leaver's row, further arrivals go after the last row, and rows left
        empty past the new end are filled from the end. One copy of each field plus the
        moved rows, or only the moved rows for a field written in place (``written``, or with
        :attr:`reuse` a tensor the last merge allocated); the order of rows changes, results
        never depend on it.

        Args:
            written: New values ``[n, ...]`` of some fields for the rows as they were at
                :meth:`post` (the split run's output, contiguous), used instead of the
                population's; updated in place when the population does not grow.
            arrived_written: The same fields' new values for the arrivals ``[m, ...]``.
        """
        assert self.arrived is not None, "nothing to merge"
        pop, arrived = state[self.name], {**self.arrived, **(arrived_written or {})}
        leave = torch.sort(self.leave).values
        self.arrived, self.leave, self._near = None, self.leave[:0], None
        n, n_leave, n_arrived = pop.n, leave.shape[0], arrived[UID].shape[0]
        n_new = n - n_leave + n_arrived
        if n_arrived >= n_leave:  # every leaver's row takes an arrival, the rest follow row n
            holes, movers = leave, leave[:0]
        else:  # holes past the new end vanish; the stayers there move into the other holes
            holes = leave[leave < n_new]
            past = torch.ones(n - n_new, dtype=torch.bool)
            past[leave[leave >= n_new] - n_new] = False
            movers = n_new + flatnonzero(past)
        fields, allocated = {}, self._allocated
        self._allocated = {}
        written = written or {}
        for key in pop.keys():
            own = key in written  # the split's output: updated in place
            src = written[key] if own else pop[key]
            mine = self.reuse and allocated.get(key) is src  # made by the last merge, still in place
            fill = torch.cat([arrived[key][:holes.shape[0]], take_rows(src, movers.to(src.device))])
            if (own or mine) and n_new <= n:
                new = src
            else:
                new = src.new_empty((n_new, *src.shape[1:]))
                new[:min(n, n_new)] = src[:n_new]
            new.index_copy_(0, holes.to(new.device), fill.to(new.device))
            if n_new > n:
                new[n:] = arrived[key][n_leave:]
            fields[key] = new[:n_new]
        pop.replace(fields)
        if self.reuse:
            self._allocated = {k: pop[k] for k in fields if k not in written}

    def forget_allocated(self) -> None:
        """From now on, :meth:`merge` writes into no tensor it allocated before (the
        population's tensors may be held elsewhere).
        """
        self._allocated = {}

    # ------------------------------------------------------------------ the step's report
    def post_report(self, state: State, comm: Comm, report: StepReport, wait: bool) -> None:
        """Post the step's exchange with ``report`` as its header; with ``wait``, finish at once."""
        self._report = report
        self.post(state, comm, report.rows(), wait=wait)
        if wait:
            self.finish(state, comm)

    def finish(self, state: State, comm: Comm, merge: bool = True) -> None:
        """Complete the posted exchange (see :meth:`complete`) and hand the step's summary, from
        every rank's header, to the partitioner: its figures count the agents after migration
        and the migrants of the exchange.
        """
        assert self.pending is not None and self._report is not None
        at_step_end = self.pending.waited
        heads = self.complete(state, comm, merge=merge)
        got = {k: torch.cat([h[k] for h in heads]) for k in heads[0]}  # every rank's header, rank order
        sent = got["ints"][:, 4:].to(torch.float64)  # [W, W] migrants from row rank to column rank
        report, self._report = self._report, None
        summary = report.summary(got, at_step_end, rank=comm.rank)
        figures = summary.figures
        figures.agents = [a + d for a, d in zip(figures.agents, (sent.sum(0) - sent.sum(1)).tolist(), strict=True)]
        # and any of a rebalance, counted before
        figures.migrated = [m + d for m, d in zip(figures.migrated, sent.sum(1).tolist(), strict=True)]
        self.partition.add_summary(summary)

    # ------------------------------------------------------------------ the split run
    def run_split(self, state: State, call: CallSubstep, comm: Comm) -> list[Flag]:
        """Run ``S`` while the exchange is in flight: for every agent with the agents of this rank
        as its only neighbors, then (after the exchange) again for the agents whose neighbors
        that missed; then merge leavers and arrivals (see the module docstring). Returns the
        flags, each reduced over the agents whose values were kept.
        """
        part, name = self.partition, self.name
        pop = state[name]
        try:
            out_in, flags_in = self._run_part(state, call, pop.fields(), None)
            self.finish(state, comm, merge=False)
            assert self.arrived is not None and self.halo is not None
            limit = part.halo_limit(self.reach)
            # The agents within reach of the halo (limit) or of an arrival (its depth + limit).
            depth = max(0.0, float(self.arrived_dist.max())) if self.arrived_dist.numel() else 0.0
            redo_limit = limit + depth
            near, dist = self.near_border(pop, comm.rank, redo_limit + limit)
            stays = ~torch.isin(near, self.leave)  # agents given away: in the halo if within reach
            near, dist = near[stays], dist[stays]
            redo_near = dist <= redo_limit
            redo, band = near[redo_near], near[~redo_near]  # band: their other neighbors
            targets = {k: torch.cat([v.index_select(0, redo.to(v.device)), self.arrived[k]])
                       for k, v in pop.fields().items()}
            others = {k: torch.cat([pop[k].index_select(0, band.to(pop[k].device)), self.halo[k].to(pop[k].device)])
                      for k in self.nb_fields}
            out_b, flags_b = self._run_part(state, call, targets, others)
        except BaseException:
            if self.arrived is not None:
                self.merge(state)  # no agent lost: the arrivals join with their old values
            raise
        # Per-agent flags of the first run count for the agents it got right (not redone, not
        # given away), the others' flags come from the second run.
        flags = []
        if flags_in:
            right = torch.ones(pop.n, dtype=torch.bool)
            right[redo] = False
            right[self.leave] = False
            flags = [Flag(f.message, (f.condition & right.to(f.condition.device)).any()) for f in flags_in]
        n_redo = redo.shape[0]
        written, arrived_written = {}, {}
        taken = {v.untyped_storage().data_ptr() for v in pop.fields().values()}
        for key, new in out_in.items():
            if not new.is_contiguous() or new.untyped_storage().data_ptr() in taken:
                # A view of the state (or of another written field): copy, then write into it.
                new = new.clone(memory_format=torch.contiguous_format)
            taken.add(new.untyped_storage().data_ptr())
            new.index_copy_(0, redo.to(new.device), out_b[key][:n_redo])
            written[key] = new
            arrived_written[key] = out_b[key][n_redo:]
        self.merge(state, written, arrived_written)
        self.halo = None
        return flags + [Flag(f.message, f.condition.any()) for f in flags_b]

    def _run_part(self, state: State, call: CallSubstep, targets: dict[str, Tensor],
                  others: dict[str, Tensor] | None) -> tuple[dict[str, Tensor], list[Flag]]:
        """Run ``S`` for the agents ``targets`` (every field of the population, ``[m, ...]``) with
        the agents ``others`` (``S``'s neighbor fields) as their other neighbors; return the
        targets' written fields (``[m, ...]``) and the flags, one ``[m]`` bool per flag (the
        target agents it holds for).
        """
        pop = state[self.name]
        part_pop = Population(self.name, pop.specs, targets, next_uid=pop.next_uid)
        effects = call(State({self.name: part_pop}, state.env, state.step), {self.name: others or {}})
        return {k: part_pop[k] for k in self.substep.writable(self.name)}, effects.flags
