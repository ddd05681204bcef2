"""Partitioners: which rank holds which agents, what each rank sees of the others, and how the
ranks agree on each step. The one engine (:class:`~agentsim.engine.simulation.Simulation`) runs every
model through this protocol, on one process or many.

The data flow of a run::

    Model.build (init) -> State  -- Partitioner.place -> this rank's share
    every step, for each substep s (Simulation.step):
        halos = Partitioner.halos(state, s)             rows of other ranks' agents s may read
        effects = s(Context(state, neighbors=halos...)) writes, births, deaths, flags
        Partitioner.merge_env(state, s, before)         every rank's env changes, combined (agentsim.core.env)
        engine applies births / deaths (uids from comm.birth_offset)
        Partitioner.migrate(state, s)                   agents whose owner changed move
    Partitioner.end_step(report)                        flags, metric sums, figures to every rank
    Partitioner.reports() -> StepSummary                (now, or after the next step's first substep)
        engine raises flags, keeps the metrics row;     Partitioner.rebalance(counts)
    on frame steps: Partitioner.frame(...) -> rank 0 -> io.recording.Recorder -> HDF5

Three partitioners implement it:

- :class:`IdentityPartition` (``partition=None`` on one process): every agent on the one
  rank; halos empty; nothing migrates; a step's report is its own summary. It is also the
  base class of the other two, which override what differs;
- :class:`~agentsim.distributed.data.DataPartition` (``"data"``): agents split by uid blocks;
- :class:`~agentsim.distributed.spatial.SpatialPartition` (``"spatial"``): regions of space,
  halos within reach, migration, load balancing, and, for models whose first substep is
  agentwise, the overlapped exchange (:meth:`Partitioner.split_run`).

Every operation that communicates is a collective: every rank calls it, in the same order.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

import torch
from torch import Tensor

from agentsim.core.comm import Comm, post_all_gather, row_counts
from agentsim.core.context import CLEAR, Effects, Flag, Halos
from agentsim.core.env import changed_cells, merge_layer, raised_cells
from agentsim.core.metrics import MetricSums
from agentsim.core.params import Params
from agentsim.core.state import State
from agentsim.core.substep import Substep
from agentsim.distributed.comm import pack_rows, unpack_rows
from agentsim.errors import ConfigError

if TYPE_CHECKING:
    from agentsim.io.recording import Frame, Recording

__all__ = ["PARTITIONS", "PERF_FIGURES", "SPATIAL_OPTIONS", "IdentityPartition", "Partitioner", "RankFigures",
           "RanksFigures", "SplitRun", "StepReport", "StepSummary"]

PARTITIONS = ("data", "spatial")
SPATIAL_OPTIONS = ("layout", "balance_every", "balance_threshold", "bins", "overlap")
MAX_FLAGS = 64  # a step report's flag slots (more flags share the last one)


class RankFigures(NamedTuple):
    """One rank's figures of one step (see :mod:`agentsim.engine.perf`), sent to every rank in the
    step's report as one float64 row (:meth:`to_tensor`).

    Attributes:
        agents: Agents this rank holds at the end of the step.
        step_seconds: Seconds of the step on this rank (with the last report's exchange).
        comm_seconds: Seconds of it in collectives.
        bytes_sent: Bytes this rank sent in them.
        halo_rows, halo_bytes: Halo rows and bytes this rank received (the partitioner's count).
        migrated: Agents this rank sent away (the partitioner's count).
    """

    agents: float
    step_seconds: float
    comm_seconds: float
    bytes_sent: float
    halo_rows: float = 0.0
    halo_bytes: float = 0.0
    migrated: float = 0.0

    def to_tensor(self) -> Tensor:
        """The figures as one row: ``[1, 7]`` float64, in field order."""
        return torch.tensor([self], dtype=torch.float64)


# The figures every rank reports for every step, in the order of the rows RankFigures.to_tensor makes.
PERF_FIGURES = RankFigures._fields


@dataclass
class RanksFigures:
    """Every rank's :class:`RankFigures` of one step: each field a list ``[W]`` of floats (rank
    order), the columns of the gathered rows.
    """

    agents: list[float]
    step_seconds: list[float]
    comm_seconds: list[float]
    bytes_sent: list[float]
    halo_rows: list[float]
    halo_bytes: list[float]
    migrated: list[float]

    @classmethod
    def from_tensor(cls, rows: Tensor) -> RanksFigures:
        """From every rank's :meth:`RankFigures.to_tensor` row, gathered: ``[W, 7]`` float64."""
        if rows.dim() != 2 or rows.shape[1] != len(PERF_FIGURES):
            raise ValueError(f"expected [W, {len(PERF_FIGURES)}] figures (got {list(rows.shape)})")
        return cls(*rows.t().tolist())

    @classmethod
    def of_one(cls, figures: RankFigures) -> RanksFigures:
        """The figures of a run on one process."""
        return cls(*[[v] for v in figures])

    def rank(self, rank: int) -> RankFigures:
        """One rank's figures."""
        return RankFigures(*(getattr(self, name)[rank] for name in PERF_FIGURES))

# Runs a substep on a (sub)state with the given halos and returns what it asked for; flags
# of an agentwise substep stay per agent (see Context(per_agent_flags=True)).
CallSubstep = Callable[[State, Halos], Effects]
# A run of one substep that overlaps the step's exchange: (state, call, comm) -> flags.
SplitRun = Callable[[State, CallSubstep, Comm], list[Flag]]


@dataclass
class StepReport:
    """This rank's account of one step, sent to every rank at the end of the step.

    Attributes:
        step: The step (the state's step after it).
        flags: The step's error flags (0-dim bool conditions).
        figures: This rank's figures (the partitioner fills its own: halo and migrations).
        sums: This rank's exact metric sums, when the run records the step's metrics.
        seconds: This rank's seconds per substep (kept here, not sent).
        stop: The signal that asked this rank's process to stop (:mod:`agentsim.engine.stops`), or 0.
    """

    step: int
    flags: list[Flag]
    figures: RankFigures
    sums: MetricSums | None = None
    seconds: dict[str, float] = field(default_factory=dict)
    env: dict[str, Tensor] | None = None
    stop: int = 0

    def rows(self) -> dict[str, Tensor]:
        """The report as one-row tensors, the same names, dtypes and shapes on every rank, whatever
        flags this rank recorded: their conditions in :data:`MAX_FLAGS` slots (flags past the last
        slot share it) and their signature (count, checksum of the messages).
        """
        rows = {"v": self.figures.to_tensor()}
        slots = torch.zeros(MAX_FLAGS, dtype=torch.bool)
        if self.flags:
            up = torch.stack([f.condition.reshape(()) for f in self.flags]).to(device="cpu", dtype=torch.bool)
            slots[:min(len(up), MAX_FLAGS)] = up[:MAX_FLAGS]
            slots[MAX_FLAGS - 1] |= bool(up[MAX_FLAGS - 1:].any())
        rows["flags"] = slots[None]
        messages = "\n".join(f.message for f in self.flags).encode()
        rows["flag_sig"] = torch.tensor([[len(self.flags), zlib.crc32(messages), self.stop]], dtype=torch.int64)
        if self.sums is not None:
            rows["sums"] = torch.as_tensor(self.sums.values, dtype=torch.int64)[None]
        if self.env:
            rows["env"] = torch.stack([env_checksum(layer) for layer in self.env.values()]).cpu()[None]
        return rows

    def alone(self) -> StepSummary:
        """The summary on one process, as :meth:`summary` of this report's own :meth:`rows` (the same
        flags raised), without making them: one stack of the flags' conditions and no exchange.
        """
        raised: list[str] = []
        if any(f.condition is not CLEAR for f in self.flags):
            up = torch.stack([f.condition.reshape(()) for f in self.flags]).to(device="cpu", dtype=torch.bool)
            if bool(up.any()):
                on = up.tolist()
                raised = _raised(self.flags, [*on[:MAX_FLAGS - 1], any(on[MAX_FLAGS - 1:])])  # the slots of rows()
        return StepSummary(self.step, raised, RanksFigures.of_one(self.figures), self.sums,
                           True, self.seconds, self.stop)

    def summary(self, got: Mapping[str, Tensor], at_step_end: bool, rank: int) -> StepSummary:
        """What every rank learns from every rank's :meth:`rows` (``[W, ...]``, rank order); ``rank``: this rank.

        Where every rank recorded the same flags (the usual case: a substep calls ``ctx.flag`` on
        every rank, with a condition that may be False), every rank raises the messages of the flags
        set on any rank. Where ranks recorded different flags (a flag recorded on some ranks only),
        each rank raises its own and names the other ranks that raised theirs.
        """
        up = got["flags"]
        same = bool((got["flag_sig"][:, :2] == got["flag_sig"][0, :2]).all())
        stop = int(got["flag_sig"][:, 2].max())  # any rank's request stops every rank
        slots = up.any(0) if same else up[rank]
        raised = _raised(self.flags, slots.tolist())
        if not same:
            others = [r for r in range(up.shape[0]) if r != rank and bool(up[r].any())]
            if others:
                raised.append(f"rank {', '.join(map(str, others))} raised error conditions of its own (see its "
                              "messages; the ranks recorded different flags: a ctx.flag called on some ranks only)")
        if self.env:
            differ = (got["env"] != got["env"][:1]).any(0).tolist()
            names = [name for name, d in zip(self.env, differ, strict=True) if d]
            if names:
                raised.append(
                    f"env {', '.join(names)}: the processes' copies differ after this step (every process holds "
                    "every layer whole, and a substep must change it alike on every process): a substep that writes "
                    "it draws from torch.rand or another source not keyed like ctx.rng, or computes a cell from "
                    "this process's agents without declaring a combine; draw with ctx.rng keyed by cell index "
                    "(`agentsim check` names the substep)")
        sums = None
        if self.sums is not None:
            sums = MetricSums(self.sums.names, self.sums.is_float, got["sums"].sum(0))
        return StepSummary(self.step, raised, RanksFigures.from_tensor(got["v"]), sums, at_step_end, self.seconds,
                           stop)


def _raised(flags: list[Flag], slots: list[bool]) -> list[str]:
    """The messages of the flags whose slot is set (flags past the last slot share it)."""
    return [f.message for i, f in enumerate(flags) if slots[min(i, MAX_FLAGS - 1)]]


def env_checksum(layer: Tensor) -> Tensor:
    """A 0-d int64 checksum of an env layer's bits (their int64 sum, with a weight per position class
    so that most moves of a value change it too): equal copies give equal checksums (one pass).
    """
    flat = layer.detach().reshape(-1)
    if flat.dtype == torch.bool:
        flat = flat.to(torch.uint8)
    size = flat.element_size()
    bits = flat.view({8: torch.int64, 4: torch.int32, 2: torch.int16, 1: torch.uint8}[size])
    odd = bits[1::2].sum(dtype=torch.int64)  # 0 for a single value
    return bits.sum(dtype=torch.int64) + 3 * odd  # on the layer's device: the report moves them at once


@dataclass
class StepSummary:
    """A step as every rank knows it once every rank's report arrived.

    Attributes:
        step: The step.
        raised: Messages of the flags set on some rank.
        figures: Every rank's figures.
        sums: The metric sums over ranks, or None.
        at_step_end: Reduced at the end of its own step (the engine may rebalance then).
        seconds: This rank's seconds per substep.
        stop: The signal with which some rank's process was asked to stop, or 0: every rank
            stops after the step it learns this in.
    """

    step: int
    raised: list[str]
    figures: RanksFigures
    sums: MetricSums | None
    at_step_end: bool
    seconds: dict[str, float]
    stop: int = 0


class Partitioner(Protocol):
    """What the engine asks of a partitioner (see the module docstring).

    Attributes:
        name: The partitioner's name.
        grad_links: In a differentiable run, the received rows that carry gradients back to
            other ranks, in the order they arrived (see :mod:`agentsim.grad.autograd`).
    """

    name: str
    grad_links: list[Tensor]

    def place(self, state: State, space: Any, substeps: Sequence[Substep], params: Params, comm: Comm,
              shared: bool = False) -> State:
        """Keep this rank's share of the initial state: every rank built the same global state, or,
        ``shared``, each built its own share of the agents (``InitContext.share``) and the agents
        that another rank owns are sent there. The engine passes ``shared`` only when it is True,
        so a partitioner that never meets such an init may omit the argument.
        """
        ...

    def halos(self, state: State, substep: Substep, comm: Comm) -> Halos:
        """Before ``substep``: the rows of other ranks' agents it may read (population to field to
        ``[m, ...]``; uid and the declared neighbor fields), on every rank.
        """
        ...

    def migrate(self, state: State, substep: Substep, comm: Comm) -> None:
        """After ``substep``: move the agents whose owner changed (with all their fields)."""
        ...

    def merge_env(self, state: State, substep: Substep, before: Mapping[str, Tensor], comm: Comm) -> list[Flag]:
        """After ``substep``, which wrote the env layers of ``before`` (their values before it):
        apply every rank's changes on every rank with the declared combine (:mod:`agentsim.core.env`),
        so that every rank's copy is whole and the same; the flags of broken combines.
        """
        ...

    def split_run(self, substep: Substep) -> SplitRun | None:
        """A run of ``substep`` that overlaps the step's exchange, when one is in flight; else None."""
        ...

    def end_step(self, state: State, report: StepReport, comm: Comm, *, hold: bool) -> None:
        """Send this rank's report of the step. ``hold``: inside a run, the exchange may stay in
        flight into the next step (its summary arrives later).
        """
        ...

    def finish_report(self, comm: Comm) -> None:
        """After the first substep of a step: the last step's report, if still in flight, arrives
        (its flags are raised on every rank at the same point, before the step goes on).
        """
        ...

    def reports(self) -> list[StepSummary]:
        """The summaries that arrived since the last call, in step order."""
        ...

    def settle(self, state: State, comm: Comm) -> None:
        """Finish what is in flight (before rows are reordered, a frame, the end of a run)."""
        ...

    def release(self) -> None:
        """Forget what was kept between steps (the state may change outside a run); no collective."""
        ...

    def rebalance(self, state: State, comm: Comm, counts: list[int]) -> list[int] | None:
        """At the end of a step, given every rank's agent count: move borders if due; return the
        new counts, or None if nothing moved.
        """
        ...

    def frame(self, state: State, spec: Recording, comm: Comm) -> Frame | None:
        """Every rank's recorded fields and the environment on rank 0 (None on the others)."""
        ...

    def owned_env(self, state: State, name: str, comm: Comm) -> Tensor:
        """The cells of env layer ``name`` this rank counts in metrics, flattened."""
        ...

    def sync_env(self, state: State, comm: Comm) -> None:
        """Make every env tensor whole on every rank (before a frame or a checkpoint)."""
        ...


class IdentityPartition:
    """Every agent on this rank: the one-process partitioner, and the base of the others.

    The other partitioners override what differs; what they share lives here: the step's
    report reduced with one all_gather (the identity on one rank), the halo and migration
    figures of the step, frames gathered on rank 0.

    Attributes:
        halo_rows, halo_bytes: Halo rows and bytes this rank received since the last report.
        migrated: Agents this rank sent away since the last report.
        grad_links: In a differentiable run on several ranks, the received rows that carry
            gradients, in the order they arrived (:func:`~agentsim.grad.autograd.reach_exchanges`).
    """

    name = "identity"

    def __init__(self) -> None:
        self.halo_rows = 0
        self.halo_bytes = 0
        self.migrated = 0
        self.grad_links: list[Tensor] = []
        self._summaries: list[StepSummary] = []
        self._in_flight: tuple[StepReport, dict[str, Tensor], Tensor, Any] | None = None  # a report posted

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"

    def place(self, state: State, space: Any, substeps: Sequence[Substep], params: Params, comm: Comm,
              shared: bool = False) -> State:
        """Keep every agent (one rank only: on several, each would run the whole population)."""
        if comm.world_size > 1:
            raise ConfigError(f"the identity partitioner keeps every agent on its rank; with {comm.world_size} ranks "
                              f"use partition 'data' or 'spatial'")
        return state

    def halos(self, state: State, substep: Substep, comm: Comm) -> Halos:
        """No other rank, no halo."""
        return {}

    def migrate(self, state: State, substep: Substep, comm: Comm) -> None:
        """Nothing moves."""

    def merge_env(self, state: State, substep: Substep, before: Mapping[str, Tensor], comm: Comm) -> list[Flag]:
        """Every rank's changes to the env layers ``substep`` wrote, applied on every rank with the
        layer's combine (:mod:`agentsim.core.env`): one all_gather of (cell, value) rows per layer. On
        one rank the writes are the result.
        """
        if comm.world_size == 1 or not before:
            return []
        from agentsim.grad.autograd import gather_with_grad

        flags = []
        for name, old in before.items():
            new, mode = state.env[name], substep.env_combine(name)
            cells = changed_cells(old, new)
            mine = {"cell": cells, "value": new.reshape(-1)[cells], "raised": raised_cells(old, new, cells, mode)}
            got = gather_with_grad(comm, mine, self.grad_links)  # the other ranks' rows
            every = {k: torch.cat([mine[k], got[k].to(mine[k].device)]) for k in mine}
            merged, conflict = merge_layer(old, every["cell"], every["value"], mode)
            state.env[name] = merged
            where = f"env.{name}"
            if mode == "set":
                flags.append(Flag(
                    f"{substep.name}: {where}: {_cell_text(conflict, old.shape)} was set to different values on "
                    f"different processes: agents on several processes change the same cell. "
                    + _combine_hint(where, old.dtype), torch.tensor(conflict is not None)))
            elif mode in ("min", "max"):
                bad = every["cell"][every["raised"]]
                first = int(bad.min()) if bad.numel() else None
                flags.append(Flag(
                    f"{substep.name}: {where} combines by '{mode}' but {_cell_text(first, old.shape)} was "
                    f"{'raised' if mode == 'min' else 'lowered'} (from {_value_at(old, first)}); with '{mode}' a "
                    f"substep may only {'lower' if mode == 'min' else 'raise'} cells (declare 'set' or 'add')",
                    torch.tensor(first is not None)))
        return flags

    def split_run(self, substep: Substep) -> SplitRun | None:
        """No exchange to overlap."""
        return None

    def count_halo(self, rows: Mapping[str, Tensor]) -> None:
        """Count received halo rows in the step's figures."""
        n, nbytes = row_counts(rows)
        self.halo_rows += n
        self.halo_bytes += nbytes

    def take_figures(self, report: StepReport) -> None:
        """Put this partitioner's figures of the step into ``report`` and start counting anew."""
        report.figures = report.figures._replace(halo_rows=float(self.halo_rows), halo_bytes=float(self.halo_bytes),
                                                 migrated=float(self.migrated))
        self.halo_rows = self.halo_bytes = self.migrated = 0

    def end_step(self, state: State, report: StepReport, comm: Comm, *, hold: bool) -> None:
        """Every rank's report, in one exchange. With ``hold`` (inside a run, on several ranks,
        no rebalancing due: :meth:`report_due`) it is posted without waiting, and its summary
        arrives after the next step's first substep (:meth:`finish_report`, or at :meth:`settle`):
        a rank done with its step starts the next one instead of waiting for the slowest rank to
        end it. Without ``hold``, now (one all_gather).
        """
        self.take_figures(report)
        if comm.world_size == 1:  # nothing to exchange
            self._summaries.append(report.alone())
            return
        self.finish_report(comm)  # the last step's, if still in flight (one at a time, in step order)
        rows = report.rows()
        if comm.world_size == 1 or not hold or self.report_due(state.step):
            got = comm.all_gather_rows(rows, rows_per_rank=1)
            self._summaries.append(report.summary(got, at_step_end=True, rank=comm.rank))
            return
        received, work = post_all_gather(comm, pack_rows(rows).reshape(-1))  # (one size: StepReport.rows)
        self._in_flight = (report, rows, received, work)

    def report_due(self, step: int) -> bool:
        """Whether the report of ``step`` is needed at the step's end (to rebalance): not here."""
        return False

    def finish_report(self, comm: Comm) -> None:
        """Wait for the report in flight, if any; its summary joins :meth:`reports`."""
        if self._in_flight is None:
            return
        (report, like, received, work), self._in_flight = self._in_flight, None
        comm.wait(work)
        rows = unpack_rows(received.cpu().view(comm.world_size, -1), like)
        self._summaries.append(report.summary(rows, at_step_end=False, rank=comm.rank))

    def add_summary(self, summary: StepSummary) -> None:
        """Queue a summary for :meth:`reports`."""
        self._summaries.append(summary)

    def reports(self) -> list[StepSummary]:
        """The summaries that arrived, in step order."""
        out, self._summaries = self._summaries, []
        return out

    def settle(self, state: State, comm: Comm) -> None:
        """Finish the step's report in flight, if any (its summary joins :meth:`reports`)."""
        self.finish_report(comm)

    def release(self) -> None:
        """Nothing kept."""

    def rebalance(self, state: State, comm: Comm, counts: list[int]) -> list[int] | None:
        """Nothing to balance."""
        return None

    def sync_env(self, state: State, comm: Comm) -> None:
        """Make env layers whole on every rank (nothing to do when they are replicated)."""

    def frame(self, state: State, spec: Recording, comm: Comm) -> Frame | None:
        """Rank 0 gathers every rank's rows; env layers from rank 0 (whole after :meth:`sync_env`)."""
        from agentsim.io.recording import Frame

        if spec.env:
            self.sync_env(state, comm)
        agents: dict[str, dict[str, Tensor]] = {}
        for p, fields in spec.fields.items():
            rows = comm.gather_rows({f: state.populations[p][f] for f in fields})
            if rows is not None:
                agents[p] = rows
        if comm.rank != 0:
            return None
        return Frame(agents, {k: state.env[k] for k in spec.env})

    def owned_env(self, state: State, name: str, comm: Comm) -> Tensor:
        """Every cell on rank 0, none elsewhere (env replicated)."""
        flat = state.env[name].reshape(-1)
        return flat if comm.rank == 0 else flat[:0]


def _combine_hint(where: str, dtype: torch.dtype) -> str:
    """What to declare or write instead, for a layer of ``dtype`` changed by several processes."""
    idiom = ("compute the cell's new value from ctx.neighbors, so that every process computes the same (what the "
             "agents of a cell take or leave, summed over ctx.neighbors of the cell: the wolfsheep model's grazing)")
    if dtype.is_floating_point:
        return (f"For amounts that add up (deposits, consumption) declare combine={{'{where}': 'add'}} and add "
                f"them with ctx.deposit('{where}', cells, amounts) (summed exactly, on any number of processes), "
                f"or {idiom}; 'min'/'max' keep one process's value, not the sum of the changes: only for a rule "
                "where the lowest or highest value wins")
    return (f"Declare combine={{'{where}': 'add'}} if the changes add up (deposits, consumption, counts), 'min' or "
            f"'max' if the lowest or highest value wins; or {idiom}")


def _cell_text(cell: int | None, shape: torch.Size) -> str:
    """``cell 37 (row 0, column 37)`` for a flat index of a 2D layer; ``cell 37`` otherwise."""
    if cell is None:
        return "a cell"
    if len(shape) == 2:
        return f"cell {cell} (row {cell // shape[1]}, column {cell % shape[1]})"
    return f"element {cell} (flat index)"


def _value_at(layer: Tensor, cell: int | None) -> str:
    return "?" if cell is None else str(layer.reshape(-1)[cell].item())
