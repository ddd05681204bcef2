"""The engine on one rank of a multi-rank run: a :class:`~agentsim.engine.Simulation`
whose state is this rank's share of the agents and whose neighbor views include halos.

The one-process :class:`~agentsim.engine.Simulation` is untouched (no collectives);
this subclass adds three things, all delegated to the partitioner:

- after ``init``: keep this rank's share of the agents (:meth:`DataPartition.scatter`);
- before each substep: refresh the halos it reads (:meth:`DataPartition.before_substep`);
  after it: migrate agents that changed owner (spatial partitioner);
- ``halo`` and ``owned_env``: what the engine's neighbor views and metrics use;
- after each step: per-rank figures gathered (:attr:`DistributedSimulation.perf_steps`, also
  in the file's ``/perf``) and, with the spatial partitioner, load balancing;
- before a trajectory frame with env layers: the layers made whole from their owners;
- with the overlapped exchange (:mod:`agentsim.distributed.overlap`): the split run of
  the first substep, and inside ``run`` the step's metrics row recorded when its figures
  arrive (during the next step, or before a frame).

Births, error flags, metrics and trajectory frames go through ``comm`` in the base
engine. Per-step communication figures are kept in :attr:`DistributedSimulation.comm_steps`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from ..comm import Comm
from ..context import Context
from ..engine import DEFAULT_SORT_EVERY, Simulation
from ..model import Model
from ..state import Population, State
from ..substep import Substep
from .comm import CommStats
from .overlap import OverlapExchange, overlap_plan
from .partition import DataPartition, check_sync_every_for, make_partition
from .spatial import SpatialPartition

__all__ = ["DistributedSimulation"]


# What a step's report leaves to read once every rank's arrives: its flags and metric names.
_Posted = tuple[list[tuple[str, Tensor]], tuple[list[str], list[bool]] | None]

PERF_FIGURES = ("agents", "step_seconds", "comm_seconds", "bytes_sent", "halo_rows", "halo_bytes", "migrated")


class DistributedSimulation(Simulation):
    """One rank's part of a run split by a partitioner.

    Args:
        model, agents, seed, device, check_nan, shuffle_rows, sort_every: As for :class:`~agentsim.engine.Simulation`.
        comm: This rank's communication (a :class:`~agentsim.distributed.comm.TorchComm`, or
            :class:`~agentsim.comm.LocalComm` for one rank).
        partition: ``"data"``, ``"spatial"``, or a :class:`DataPartition` /
            :class:`~agentsim.distributed.spatial.SpatialPartition`.
        sync_every: Neighbor refresh period in steps (1: exact; K > 1: stale reads by the rule of
            :mod:`agentsim.snapshot`, with partition ``"data"`` only).
        partition_options: For ``"spatial"``: ``layout``, ``balance_every``, ``balance_threshold``, ``bins``,
            ``overlap``.

    Attributes:
        overlap: The :class:`~agentsim.distributed.overlap.OverlapExchange` when the run
            qualifies for it (see :func:`~agentsim.distributed.overlap.overlap_plan`), else None.
        comm_steps: Per step, the :class:`CommStats` of the collectives inside :meth:`step`
            (halos, migration, births, error flags, balancing); empty when ``comm`` keeps no stats.
        perf_steps: Per step, figures over all ranks (same on every rank): ``agents/max``,
            ``agents/mean``, ``agents/imbalance`` (max / mean, after any rebalancing),
            ``agents/imbalance_before_balance``,
            ``rank_step_seconds/max``, ``rank_step_seconds/mean``, ``comm/seconds_max``, ``comm/seconds_mean``,
            ``comm/bytes_sent`` (sum), ``halo/rows``, ``halo/bytes`` (sums), ``migrated`` (sum),
            ``rebalanced`` (0/1). Written to the file's ``/perf`` by rank 0.
    """

    def __init__(self, model: Model, agents: int | None = None, seed: int = 0,
                 device: str | torch.device | None = "cpu", *, comm: Comm,
                 partition: str | DataPartition | SpatialPartition = "data", sync_every: int = 1,
                 check_nan: bool = True, shuffle_rows: bool = False, sort_every: int = DEFAULT_SORT_EVERY,
                 **partition_options: object) -> None:
        self.partition = make_partition(partition, **partition_options)
        check_sync_every_for(self.partition, sync_every)
        super().__init__(model, agents, seed, device, check_nan=check_nan, shuffle_rows=shuffle_rows,
                         sort_every=sort_every, sync_every=sync_every, comm=comm)
        self.partition.bind(self.space, self.params)
        self.state = self.partition.scatter(self.state, self.comm)
        self.comm_steps: list[CommStats] = []
        self.perf_steps: list[dict[str, float]] = []
        self._step_flags: list[tuple[str, Tensor]] = []
        self._in_run = False
        self._fused_metrics: tuple[int, list[str], list[bool], Tensor] | None = None
        plan = overlap_plan(model, self.partition, self.params, self.comm, sync_every)
        self.overlap = OverlapExchange(self.partition, *plan) if plan is not None else None  # type: ignore[arg-type]
        self._posted: _Posted | None = None
        self._deferred: tuple[Any, list[dict[str, int | float]], Any, bool] | None = None
        self._stats_at_post: CommStats | None = None
        self._sorted_at = -1  # the step after which the rows were last sorted by cell

    def halo(self, population: str, substep: Substep) -> Mapping[str, Tensor] | None:
        return self.partition.halo(population, substep)

    def owned_env(self, name: str) -> Tensor:
        return self.partition.owned_env(self.state, name, self.comm)

    def _run_substep(self, s: Substep) -> list[tuple[str, Tensor]]:
        ov = self.overlap
        if ov is not None:  # migration waits for the end-of-step exchange
            if s is not ov.substep:
                return super()._run_substep(s)
            if ov.pending is not None:
                return self._run_split(s)
            if ov.halo is not None:  # received with the last exchange
                self.partition._halo[ov.name] = ov.halo
                ov.halo = None
                try:
                    return super()._run_substep(s)
                finally:
                    self.partition.drop_halos()
        if self.refresh_due(s):  # between refreshes (sync_every > 1) the engine reads its snapshot
            self.partition.before_substep(self.state, s, self.comm)
        ok = False
        try:
            flags = super()._run_substep(s)
            ok = True
        finally:
            # Migration is a collective: only after a substep that returned on this rank.
            self.partition.after_substep(self.state if ok and ov is None else None, s, self.comm)
        return flags

    # ------------------------------------------------------------ overlapped exchange
    def _run_split(self, s: Substep) -> list[tuple[str, Tensor]]:
        """Run the agentwise substep ``s`` while the exchange is in flight: for every agent with
        the agents of this rank as its only neighbors, then (after the exchange) again for the
        agents whose neighbors that missed (see :mod:`agentsim.distributed.overlap`)."""
        ov, part = self.overlap, self.partition
        assert ov is not None and ov.pending is not None and isinstance(part, SpatialPartition)
        name = ov.name
        pop = self.state[name]
        out_in, flags_in = self._run_part(s, name, pop.fields(), None)
        try:
            self._complete_exchange(merge=False)  # may raise the last step's flags
            assert ov.arrived is not None and ov.halo is not None
            limit = part.halo_limit(ov.reach)
            # The agents within reach of the halo (limit) or of an arrival (its depth + limit).
            depth = max(0.0, float(ov.arrived_dist.max())) if ov.arrived_dist.numel() else 0.0
            redo_limit = limit + depth
            near, dist = ov.near_border(pop, self.comm.rank, redo_limit + limit)
            stays = ~torch.isin(near, ov.leave)  # agents given away: in the halo if within reach
            near, dist = near[stays], dist[stays]
            redo_near = dist <= redo_limit
            redo, band = near[redo_near], near[~redo_near]  # band: their other neighbors
            targets = {k: torch.cat([v.index_select(0, redo.to(v.device)), ov.arrived[k]])
                       for k, v in pop.fields().items()}
            others = {k: torch.cat([pop[k].index_select(0, band.to(pop[k].device)), ov.halo[k].to(pop[k].device)])
                      for k in ov.nb_fields}
            out_b, flags_b = self._run_part(s, name, targets, others)
        except BaseException:
            if ov.arrived is not None:
                ov.merge(self.state)  # no agent lost: the arrivals join with their old values
            raise
        # Per-agent flags of the first run count for the agents it got right (not redone, not
        # given away), the others' flags come from the second run.
        flags = []
        if flags_in:
            right = torch.ones(pop.n, dtype=torch.bool)
            right[redo] = False
            right[ov.leave] = False
            flags = [(msg, (f & right.to(f.device)).any()) for msg, f in flags_in]
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
        ov.merge(self.state, written, arrived_written)
        ov.halo = None
        return flags + [(msg, f.any()) for msg, f in flags_b] + self._nan_flags(s)

    def _run_part(self, s: Substep, name: str, targets: dict[str, Tensor],
                  others: dict[str, Tensor] | None) -> tuple[dict[str, Tensor], list[tuple[str, Tensor]]]:
        """Run agentwise ``s`` for the agents ``targets`` (every field of population ``name``,
        ``[m, ...]``) with the agents ``others`` (``s``'s neighbor fields) as their other
        neighbors; return the targets' written fields (``[m, ...]``) and the flags, one
        ``[m]`` bool per flag (the target agents it holds for)."""
        pop = self.state[name]
        part_pop = Population(name, pop.specs, targets, next_uid=pop.next_uid)
        state = State({name: part_pop}, self.state.env, self.state.step)
        ctx = Context(self, s, state=state, halo={name: others or {}})
        ctx.rows_flagged = True
        self._call_checked(s, ctx, state)
        return {k: part_pop[k] for k in s.writable(name)}, ctx._flags

    def _post_exchange(self) -> None:
        """Start the end-of-step exchange with this step's figures, flags and (inside run) metric sums."""
        ov, stats = self.overlap, getattr(self.comm, "stats", None)
        assert ov is not None
        # Communication since the last exchange was posted, so a wait that ends a step counts in the next.
        since = stats.since(self._stats_at_post or CommStats()) if stats is not None else CommStats()
        part = self.partition
        halo_rows, halo_bytes = part.halo_rows + ov.received_rows, part.halo_bytes + ov.received_bytes
        ov.received_rows = ov.received_bytes = 0
        header, self._posted = self._report([self.n_local(), self.step_seconds[-1], since.seconds,
                                             since.bytes_sent, halo_rows, halo_bytes, 0.0])
        wait = not self._in_run or part.balance_due(self.state.step)  # type: ignore[union-attr]
        if stats is not None:  # the exchange's own bytes and its wait count in the next step
            self._stats_at_post = stats.snapshot()
        ov.post(self.state, self.comm, header, wait=wait)

    def _complete_exchange(self, merge: bool = True) -> None:
        """Finish the posted exchange; take the step's figures (raise its flags on every rank)
        and record the step if the run loop left it for then. ``merge``: see
        :meth:`~agentsim.distributed.overlap.OverlapExchange.complete`."""
        ov = self.overlap
        assert ov is not None and self._posted is not None
        at_step_end = ov.pending is not None and ov.pending.work is None
        heads = ov.complete(self.state, self.comm, merge=merge)
        got = {k: torch.cat([h[k] for h in heads]) for k in heads[0]}  # every rank's report, rank order
        sent = got["ints"][:, 4:]  # [W, W] migrants from row rank to column rank
        figs = got["v"]  # [W, k]
        figs[:, 0] += sent.sum(0).to(torch.float64) - sent.sum(1).to(torch.float64)  # agents after migration
        figs[:, 6] = sent.sum(1).to(torch.float64)
        posted, self._posted = self._posted, None
        self._take_report(got, *posted)
        self._take_figures(figs, balance=at_step_end)
        if self._deferred is not None:
            writer, rows, rec, gathers = self._deferred
            self._deferred = None
            Simulation._record(self, writer, rows, rec, False, gathers)

    def _sort_due(self) -> bool:
        return super()._sort_due() and self._sorted_at != self.state.step

    def n_local(self) -> int:
        return sum(p.n for p in self.state.populations.values())

    def _report(self, values: list[float]) -> tuple[dict[str, Tensor], _Posted]:
        """This rank's report of the step, as one-row tensors with the same names and shapes on
        every rank: the figures ``values`` (``"v"``, float64; columns :data:`PERF_FIGURES`),
        the step's error flags (``"flags"``, if any) and, inside ``run``, the metric sums
        (``"sums"``); and what :meth:`_take_report` needs to read every rank's reports."""
        rows = {"v": torch.tensor([values], dtype=torch.float64)}
        flags = self._step_flags
        if flags:
            rows["flags"] = torch.stack([f for _, f in flags]).to(device="cpu", dtype=torch.bool)[None]
        metric_parts = self._local_metric_sums() if self._in_run else None
        if metric_parts is not None:
            rows["sums"] = metric_parts[2][None]
        return rows, (flags, None if metric_parts is None else (metric_parts[0], metric_parts[1]))

    def _take_report(self, got: Mapping[str, Tensor], flags: list[tuple[str, Tensor]],
                     metric_names: tuple[list[str], list[bool]] | None) -> None:
        """From every rank's reports (:meth:`_report`, rows in rank order): raise the step's
        flags on every rank at once; keep the summed metrics for :meth:`metrics`."""
        if flags:
            self._raise_if_flagged(flags, got["flags"].any(0))
        if metric_names is not None:
            self._fused_metrics = (self.state.step, metric_names[0], metric_names[1], got["sums"].sum(0))

    def _gather_figures(self, values: list[float]) -> Tensor:
        """One all_gather of this rank's figures ``values``: ``[W, k]`` float64, rank order."""
        return self.comm.all_gather_rows({"v": torch.tensor([values], dtype=torch.float64)}, rows_per_rank=1)["v"]

    def _raise_flags(self, flags: list[tuple[str, Tensor]]) -> None:
        # Deferred: step() sends the flags with the step's figures (and metric sums) in one
        # collective, then every rank raises together.
        self._step_flags = flags

    def metrics(self) -> dict[str, int | float]:
        fused, self._fused_metrics = self._fused_metrics, None
        if fused is not None and fused[0] == self.state.step:  # summed in step()'s gather
            return self._metrics_from(*fused[1:])
        return super().metrics()

    def run(self, *args: Any, **kwargs: Any) -> Any:
        self._in_run = True  # run() takes the metrics right after each step: fuse their sums
        if self.overlap is not None:  # no one else holds the state's tensors until run returns
            self.overlap.reuse = True
        try:
            return super().run(*args, **kwargs)
        finally:
            self._in_run = False
            self._fused_metrics = None
            self._deferred = None
            if self.overlap is not None:
                self.overlap.halo = None  # the state may change before the next run
                self.overlap.reuse = False
                self.overlap.forget_allocated()  # the caller may now hold the state's tensors

    def step(self) -> None:
        stats: CommStats | None = getattr(self.comm, "stats", None)
        before = stats.snapshot() if stats is not None else None
        self.partition.start_step()
        self._step_flags = []
        self._fused_metrics = None
        ov = self.overlap
        try:
            if ov is not None and ov.pending is not None and (self._sort_due() or self.shuffle_rows):
                self._complete_exchange()  # rows are about to be reordered
            super().step()
            if ov is not None:
                if self._sort_due() and not self.shuffle_rows:
                    # Sorted now, before the exchange takes row numbers, rather than at the
                    # start of the next step, which would have to wait for the exchange first.
                    self.locality.apply(self.state)
                    self._sorted_at = self.state.step
                self._post_exchange()
                if ov.pending is not None and ov.pending.work is None:  # waited at once: take it now
                    self._complete_exchange()
                if not self._in_run:  # the state may change before the next step: no halo kept
                    ov.halo = None
        finally:
            if stats is not None and before is not None:
                self.comm_steps.append(stats.since(before))
        if ov is not None:
            return
        part = self.partition
        last = self.comm_steps[-1] if stats is not None else CommStats()
        # One collective for the step's figures, error flags and (inside run) metric sums.
        rows, posted = self._report([self.n_local(), self.step_seconds[-1], last.seconds, last.bytes_sent,
                                     part.halo_rows, part.halo_bytes, getattr(part, "migrated", 0)])
        got = self.comm.all_gather_rows(rows, rows_per_rank=1)
        self._take_report(got, *posted)
        self._take_figures(got["v"], balance=True)

    def _take_figures(self, figs: Tensor, balance: bool) -> None:
        """Append the step's :attr:`perf_steps` entry from every rank's figures ``[W, k]``
        (columns :data:`PERF_FIGURES`); with ``balance``, rebalance first if due."""
        part = self.partition
        counts = [int(v) for v in figs[:, 0].tolist()]
        before_mean = sum(counts) / len(counts)
        imbalance_before = max(counts) / before_mean if before_mean > 0 else 1.0
        rebalanced = balance and part.maybe_balance(self.state, self.comm, counts)
        if rebalanced:
            counts = [int(v) for v in self._gather_figures([self.n_local()])[:, 0].tolist()]
            if self.overlap is not None:
                self.overlap.halo = None  # borders moved: the halo received with them is stale
        mean = sum(counts) / len(counts)
        col = {name: figs[:, i] for i, name in enumerate(PERF_FIGURES)}
        self.perf_steps.append({
            "agents/max": float(max(counts)), "agents/mean": mean,
            "agents/imbalance": max(counts) / mean if mean > 0 else 1.0,
            "agents/imbalance_before_balance": imbalance_before,
            "rank_step_seconds/max": float(col["step_seconds"].max()),
            "rank_step_seconds/mean": float(col["step_seconds"].mean()),
            "comm/seconds_max": float(col["comm_seconds"].max()),
            "comm/seconds_mean": float(col["comm_seconds"].mean()),
            "comm/bytes_sent": float(col["bytes_sent"].sum()),
            "halo/rows": float(col["halo_rows"].sum()), "halo/bytes": float(col["halo_bytes"].sum()),
            "migrated": float(col["migrated"].sum()), "rebalanced": float(rebalanced),
        })

    def perf_row(self) -> dict[str, float]:
        row = super().perf_row()
        if self.perf_steps:
            row.update(self.perf_steps[-1])
        return row

    def _record(self, writer: Any, rows: list[dict[str, int | float]], rec: Any, agents: bool,
                gathers: bool = True) -> None:
        ov = self.overlap
        if ov is not None and ov.pending is not None:
            if not agents and self._in_run:  # recorded when the step's figures arrive
                self._deferred = (writer, rows, rec, gathers)
                return
            self._complete_exchange()  # a frame needs every agent on its owner
        if agents and (gathers or writer is not None) and rec.env:
            self.partition.sync_env(self.state, self.comm)  # a frame holds every cell's owner value
        super()._record(writer, rows, rec, agents, gathers)


def summarize_perf(perf_steps: list[dict[str, float]]) -> str:
    """A few lines on the per-step figures of :attr:`DistributedSimulation.perf_steps`."""
    if not perf_steps:
        return "perf: no steps"
    n = len(perf_steps)

    def mean(key: str) -> float:
        return sum(p[key] for p in perf_steps) / n

    step = mean("rank_step_seconds/max")
    comm = mean("comm/seconds_max")
    share = comm / step if step > 0 else 0.0
    return (f"per step (mean over {n}): {mean('comm/bytes_sent') / 1e3:.1f} kB sent, "
            f"{comm * 1e3:.2f} ms in collectives (slowest rank; {share:.0%} of the step), "
            f"halo {mean('halo/rows'):.0f} rows / {mean('halo/bytes') / 1e3:.1f} kB, "
            f"step {step * 1e3:.2f} ms (slowest rank)\n"
            f"agents per rank: max/mean {perf_steps[-1]['agents/imbalance']:.3f} at the end "
            f"(worst {max(p['agents/imbalance'] for p in perf_steps):.3f}); "
            f"{sum(p['migrated'] for p in perf_steps):.0f} migrations; "
            f"{sum(p['rebalanced'] for p in perf_steps):.0f} rebalancings")
