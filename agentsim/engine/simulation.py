"""The one step loop: runs a model's substeps in order on this rank's agents, through a
partitioner (:mod:`agentsim.distributed.partition`), on one process or many.

One step applies every substep in order to the state; the state before the first step is
step 0. For each substep the partitioner supplies the halo (the other ranks' agents the
substep may read), the engine calls the substep through a checked
:class:`~agentsim.core.context.Context`, applies the births and deaths it asked for, and the
partitioner migrates the agents whose owner changed. At the end of the step every rank
sends its report (error flags, metric sums, figures) through the partitioner; when the
summary arrives every rank raises the same flags at the same point, and a run records the
step's metrics (and, on frame steps, the agents) with :mod:`agentsim.io.recording`.

Examples:
    >>> from agentsim.models.randomwalk import MODEL
    >>> result = Simulation(MODEL, agents=100, seed=1).run(steps=3)
    >>> result.metrics["step"].tolist()
    [0, 1, 2, 3]
    >>> print(result.plan())  # doctest: +ELLIPSIS
    model randomwalk: ...
    #  substep  reads ...  ms/step  share
    ...
"""

from __future__ import annotations

import math
import os
import time
import uuid
import zlib
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import Tensor

from agentsim._native import build as native
from agentsim.core import ops
from agentsim.core.comm import Comm, CommStats, LocalComm
from agentsim.core.context import CLEAR, Birth, Context, Effects, Flag, Halos, InitContext, MetricsContext, NeighborView
from agentsim.core.env import add_deposits, deposit_layer
from agentsim.core.groups import GroupSums
from agentsim.core.metrics import MetricSums
from agentsim.core.model import Model
from agentsim.core.params import Params
from agentsim.core.policy import resolve_actors
from agentsim.core.random import CounterRNG
from agentsim.core.state import UID, State
from agentsim.core.substep import ENV, Substep
from agentsim.distributed.partition import Partitioner, RankFigures, StepReport, StepSummary
from agentsim.distributed.partitioners import check_sync_every_for, make_partition
from agentsim.distributed.snapshot import NeighborSnapshots
from agentsim.engine import stops
from agentsim.engine.contract import ContractChecks, check_every_steps, checked_env, plain
from agentsim.engine.locality import LocalityOrder
from agentsim.engine.memory import check_memory
from agentsim.engine.perf import GROUP_COLUMNS, group_figures, step_figures
from agentsim.engine.progress import progress_bar
from agentsim.errors import ConfigError, FieldAccessError, OutputError, RunStopped, SimulationError
from agentsim.io.locks import lock_on_rank0
from agentsim.io.recording import Recorder, check_every, recording, space_record
from agentsim.space.base import check_reaches
from agentsim.space.grid import Grid
from agentsim.space.line import Line
from agentsim.threads import ThreadGovernor

if TYPE_CHECKING:
    from agentsim.io.checkpoint import CheckpointWrite

__all__ = ["DEFAULT_SORT_EVERY", "PERF_WINDOW", "RunResult", "Simulation", "check_agents", "resolve_device"]

# Positions change by a fraction of a cell per step in the built-in models: sorting rows
# every 10 steps keeps most of the locality for a tenth of the sorting cost.
DEFAULT_SORT_EVERY = 10

# How many steps' figures (perf, comm, seconds) a Simulation keeps in memory: the last this many.
# A run writes every step's to the file's /perf; kept without bound they cost about 1.4 KB per
# step (gigabytes over hours). Running totals give the means over a whole run.
PERF_WINDOW = 1000


def resolve_device(device: str | torch.device | None) -> torch.device:
    """``"cpu"``, ``"cuda"``, ``"cuda:1"`` or None (cpu) to a device; clear error if CUDA is missing."""
    if device is None:
        return torch.device("cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise ConfigError(f"unknown device {device!r} (valid: cpu, cuda, cuda:N)") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device 'cuda' requested but CUDA is not available on this machine (use --device cpu)")
    if dev.type not in ("cpu", "cuda"):
        raise ConfigError(f"unsupported device {device!r} (valid: cpu, cuda, cuda:N)")
    return dev


def check_positions(state: State, space: Any) -> None:
    """Refuse initial agents placed outside the space (a grid's cells are 0 to n_cells - 1; a line's
    positions are on it, of the dtype it holds).
    """
    if isinstance(space, Line):
        for name, pop in state.populations.items():
            if Line.position_field in pop and pop.n:
                x = pop[Line.position_field]
                if x.dim() != 1 or space.cells == x.dtype.is_floating_point:
                    want = "int64 cells" if space.cells else "float positions"
                    raise ConfigError(f"init: population '{name}': {space.describe()} places agents by 'x', "
                                      f"{want} of shape [n] (got {x.dtype} of shape {tuple(x.shape)})")
                bad = x[space.outside(x)]
                if bad.numel():
                    raise ConfigError(f"init: population '{name}' has an agent at x = {bad[0].item()}, "
                                      f"outside {space.describe()}")
        return
    if not isinstance(space, Grid):
        return
    for name, pop in state.populations.items():
        if Grid.position_field in pop and pop.n:
            cells = pop[Grid.position_field]
            bad = cells[(cells < 0) | (cells >= space.n_cells)]
            if bad.numel():
                raise ConfigError(f"init: population '{name}' has agents on cell {int(bad[0])}, outside the "
                                  f"{space.height} x {space.width} grid (valid cells: 0 to {space.n_cells - 1})")


def check_agents(agents: Any) -> int:
    """Validate an agent count (a positive int)."""
    if isinstance(agents, bool) or not isinstance(agents, (int, np.integer)):
        raise ConfigError(f"agents: expected a positive int (got {agents!r})")
    if agents < 1:
        raise ConfigError(f"agents: expected a positive int (got {agents})")
    return int(agents)


def check_steps(steps: Any) -> int:
    """Validate a number of steps (an int >= 0)."""
    if isinstance(steps, bool) or not isinstance(steps, (int, np.integer)) or steps < 0:
        raise ConfigError(f"steps: expected an int >= 0 (got {steps!r})")
    return int(steps)


SEED_LIMIT = 2**63  # seeds are in [0, SEED_LIMIT): what a trajectory file's int64 attribute holds


def check_seed(seed: Any) -> int:
    """Validate a seed: an int in ``[0, 2**63)`` (draws are keyed by the seed modulo ``2**64``, so a
    negative seed would silently be another one's alias).
    """
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise ConfigError(f"seed: expected an int (got {seed!r})")
    if not 0 <= int(seed) < SEED_LIMIT:
        raise ConfigError(f"seed: expected an int in [0, 2**63) (got {int(seed)})")
    return int(seed)


@dataclass(repr=False)
class RunResult:
    """What :meth:`Simulation.run` (and :func:`agentsim.run`, :func:`agentsim.launch`) return.

    Attributes:
        metrics: Name to numpy array ``[steps + 1]`` (index = step), including ``"step"``; ``[steps + 1, K]``
            for a vector or histogram metric.
        state: This rank's final state (None from :func:`agentsim.launch`: it stays on the ranks).
        timings: Substep name to mean seconds per step of this run (this rank's; rank 0's from
            :func:`agentsim.launch`), over every step of the run (running sums).
        seconds: Wall time of the stepping loop (excludes initialization and step-0 recording).
        path: The HDF5 file written, or None.
        model: The model that ran (:meth:`plan` shows it with the timings).
        world_size: Number of ranks.
        perf: Per step, figures over all ranks (see :mod:`agentsim.engine.perf`): every step of a run of
            up to :data:`PERF_WINDOW` (1,000) steps, else its last :data:`PERF_WINDOW` steps (a run
            with a file has every step's in the file's ``/perf``).
        comm_seconds, comm_bytes: Per step, seconds this rank spent in collectives and bytes it
            sent: the same steps as ``perf``.
        groups: The cut of every group field summed with ``ctx.group_totals`` (share of members in
            groups that span ranks, ghost groups per rank: :func:`~agentsim.engine.perf.group_figures`;
            also attributes of the file's ``/perf``).
        agents: The agents at the start of the run, of every population on every rank (what ``init``
            built, for a run from step 0: it may differ from the ``agents`` asked for).
        threads: One line: the torch threads the steps ran with on the CPU, and why fewer than the
            cap where other processes kept cores busy (:class:`agentsim.threads.ThreadGovernor`);
            empty on a GPU or from :func:`agentsim.launch` (each process runs one thread).
    """

    metrics: dict[str, np.ndarray]
    state: State | None
    timings: dict[str, float]
    seconds: float
    path: str | None = None
    model: Model | None = None
    world_size: int = 1
    perf: list[dict[str, float]] = field(default_factory=list)
    comm_seconds: list[float] = field(default_factory=list)
    comm_bytes: list[int] = field(default_factory=list)
    groups: dict[str, float] = field(default_factory=dict)
    threads: str = ""
    agents: int | None = None

    def __repr__(self) -> str:
        steps = len(self.metrics.get("step", [])) - 1
        name = self.model.name if self.model is not None else "?"
        shown = [k for k in self.metrics if k != "step"]
        return (f"RunResult(model={name!r}, steps={steps}, world_size={self.world_size}, seconds={self.seconds:.3g}, "
                f"path={self.path!r}, metrics=[{', '.join(shown[:8])}{', ...' if len(shown) > 8 else ''}])")

    def plan(self) -> str:
        """The model's execution order with this run's milliseconds per substep and share, and the
        threads it ran with.
        """
        if self.model is None:
            raise ConfigError("this result holds no model to show")
        return self.model.plan(self.timings) + (f"\n{self.threads}" if self.threads else "")


@dataclass
class SavedState:
    """What :meth:`Simulation.save_state` keeps: a copy of the state, the step after which rows
    were last sorted by cell, and the per-step figures kept then (:class:`StepFigures`).
    """

    state: State
    sorted_at: int
    figures: StepFigures


class StepFigures:
    """The per-step figures a Simulation keeps: those of the last ``window`` steps (perf over
    ranks, this rank's CommStats, seconds and seconds per substep), and running totals over
    every step taken (a count and the seconds per substep), so that memory stays bounded
    however many steps run.
    """

    def __init__(self, window: int = PERF_WINDOW) -> None:
        self.perf: deque[dict[str, float]] = deque(maxlen=window)
        self.comm: deque[CommStats] = deque(maxlen=window)
        self.seconds: deque[float] = deque(maxlen=window)
        self.substeps: deque[dict[str, float]] = deque(maxlen=window)
        self.taken = 0  # summaries taken (perf, seconds, substeps), ever
        self.comm_taken = 0  # steps whose CommStats were kept, ever
        self.substep_totals: dict[str, float] = {}  # substep name to its seconds summed over every step taken

    def copy(self) -> StepFigures:
        out = StepFigures(self.perf.maxlen or PERF_WINDOW)
        out.perf.extend(self.perf)
        out.comm.extend(self.comm)
        out.seconds.extend(self.seconds)
        out.substeps.extend(self.substeps)
        out.taken, out.comm_taken, out.substep_totals = self.taken, self.comm_taken, dict(self.substep_totals)
        return out

    def take(self, perf: dict[str, float], seconds: float, substeps: dict[str, float]) -> None:
        self.perf.append(perf)
        self.seconds.append(seconds)
        self.substeps.append(substeps)
        self.taken += 1
        for k, v in substeps.items():
            self.substep_totals[k] = self.substep_totals.get(k, 0.0) + v

    def take_comm(self, stats: CommStats) -> None:
        self.comm.append(stats)
        self.comm_taken += 1

    @staticmethod
    def last(kept: deque[Any], n: int) -> list[Any]:
        """The last ``n`` entries kept (fewer if the window holds fewer)."""
        n = min(n, len(kept))
        return list(kept)[len(kept) - n:] if n else []


def grad_parameters(model: Model, grad: bool | Iterable[str]) -> dict[str, Tensor]:
    """The parameters a run differentiates (``Simulation(grad=...)``): name to a float64 leaf
    tensor that requires a gradient; a ConfigError for a name that is not a float parameter.
    """
    if grad is False or grad is None:
        return {}
    floats = [name for name, p in model.param_table.params.items() if p.type is float]
    if grad is True:
        names = floats
    elif isinstance(grad, str) or not isinstance(grad, Iterable):
        raise ConfigError(f"grad: expected True, False or a list of parameter names (got {grad!r})")
    else:
        names = list(grad)
        for name in names:
            if name not in floats:
                raise ConfigError(f"grad: {name!r} is not a float parameter of model '{model.name}' "
                                  f"(float parameters: {', '.join(floats) or 'none'})")
    if not names:
        raise ConfigError(f"grad: model '{model.name}' has no float parameter to differentiate")
    values = model.params
    return {name: torch.tensor(float(values[name]), dtype=torch.float64, requires_grad=True) for name in names}


class Simulation:
    """One run of a model: state, RNG, space, partitioner and the step loop.

    Args:
        model: A :class:`~agentsim.core.model.Model` (configured or default).
        agents: Number of agents at step 0 (models split it across their populations).
        seed: The run seed; all randomness is a function of (seed, uid, step, stream).
        device: ``"cpu"``, ``"cuda"`` or a torch.device.
        params: Parameter overrides (as ``model.configure(params=...)``).
        partition: ``"data"``, ``"spatial"``, a partitioner, or None (one process: the identity;
            several: ``"data"``); see :mod:`agentsim.distributed.partition`.
        comm: This rank's communication (default: one process,
            :class:`~agentsim.core.comm.LocalComm`; several ranks:
            :class:`~agentsim.distributed.comm.TorchComm`).
        check_nan: Flag NaN in written floating-point fields at every step (the error names the
            step, the substep and the field).
        check_inf: Flag inf in them too (turn off for a model whose fields hold inf on purpose).
        check: The check mode (:mod:`agentsim.engine.contract`): every substep call is checked against the
            contract that makes results the same on any number of processes (row order, reach,
            sums over this process's agents, env combines, env indices, uids); a violation raises a
            :class:`~agentsim.errors.ContractError` naming the step, substep, field and agents.
            Several times slower: for writing a model (``agentsim check``), not for production.
            An int ``K`` checks every K-th step only (a sampled check of a production run, at about
            ``1/K`` of the check mode's extra time).
        shuffle_rows: Debug aid: permute every population's rows before each step. Results
            must not change (they never depend on row order); the tests use this.
        sort_every: Sort the rows of populations read through ``neighbors`` by cell every
            this many steps, for memory locality (0: never; see :mod:`agentsim.engine.locality`).
            Changes run time only, never a result.
        sync_every: Refresh what substeps read through ``ctx.neighbors`` every this many
            steps (1: always current, exact; K > 1: stale between refreshes by the rule of
            :mod:`agentsim.distributed.snapshot`, the same on any number of ranks).
        policies: Policy name to the actor that chooses its agents' actions: an actor, a rule
            ``obs -> actions``, or ``"random"`` (the default); see :mod:`agentsim.core.policy`.
        grad: A differentiable run: ``True`` (every float parameter) or a list of float
            parameter names. Those parameters become float64 leaf tensors that require a
            gradient (:attr:`grad_params`, also what ``ctx.params`` holds), and every substep
            runs with autograd on, so float fields carry gradients to them (discrete draws
            pass gradients only through :mod:`agentsim.grad.relax`). ``False`` (the default): the
            whole run, initialization included, records no autograd history. On several
            ranks, with either partitioner, gradients flow back through the halos, migrations
            and env exchanges (:mod:`agentsim.grad.autograd`); take them with
            :meth:`parameter_gradients`, which every rank calls together and which adds the
            ranks' parts (``loss.backward()`` alone may leave ranks waiting).
        resume: A checkpoint (:meth:`save_checkpoint`; a checkpoint directory or a directory of
            them, the newest complete one, rank 0's choice on every rank) to start from instead
            of the initial state: saved on any number of ranks, with either partitioner; by the
            same run: model, parameters, seed, ``agents``, substeps and ``sync_every`` (else a
            :class:`~agentsim.io.checkpoint.CheckpointError` listing the differences). The run then
            continues the trajectory of the run that saved it, bit for bit.
        partition_options: For ``partition="spatial"``: ``layout``, ``balance_every``,
            ``balance_threshold``, ``bins``, ``overlap``.

    Attributes:
        perf_steps: Per step, figures over all ranks (see :mod:`agentsim.engine.perf`), the same on
            every rank; a run writes them to the file's ``/perf``. Only the last
            :data:`PERF_WINDOW` steps' are kept (a deque), so memory stays bounded over any
            number of steps.
        comm_steps: Per step, the :class:`~agentsim.core.comm.CommStats` of this rank's collectives
            (the last :data:`PERF_WINDOW` steps).
        step_seconds: Per step, this rank's seconds (see :mod:`agentsim.engine.perf` for the window;
            the last :data:`PERF_WINDOW` steps).
        failed: None, or what stopped the simulation: after an error inside a step its state
            may be partly updated (and, on several ranks, an exchange in flight), so it refuses
            to go on; build a new one.

    Before it builds a state of more than 1,000 agents, a Simulation estimates the memory the
    state needs from two small trial builds and refuses (a ConfigError naming the estimate and
    the memory available) a run that clearly cannot fit; ``AGENTSIM_MEMORY_CHECK=0`` skips the
    check (:mod:`agentsim.engine.memory`).

    On the CPU, creating a Simulation also tells glibc to keep freed memory for reuse
    (:func:`agentsim._native.build.reuse_freed_memory`: large tensors otherwise cost a page fault per
    4 KiB each time; ``AGENTSIM_MALLOC=system`` keeps glibc's defaults). It changes run time,
    never a result.
    """

    def __init__(self, model: Model, agents: int | None = None, seed: int = 0,
                 device: str | torch.device | None = "cpu", *, params: Mapping[str, Any] | None = None,
                 partition: str | Partitioner | None = None, comm: Comm | None = None, check_nan: bool = True,
                 check_inf: bool = True, shuffle_rows: bool = False, sort_every: int = DEFAULT_SORT_EVERY,
                 sync_every: int = 1,
                 policies: Mapping[str, Any] | None = None, grad: bool | Iterable[str] = False,
                 resume: str | os.PathLike[str] | None = None, check: bool | int = False,
                 **partition_options: Any) -> None:
        if not isinstance(model, Model):
            raise ConfigError(f"model: expected an agentsim.Model (got {type(model).__name__}); "
                              "agentsim.get_model(name) loads one by name")
        self.model = model.configure(params=params) if params else model
        self.seed = check_seed(seed)
        self.n_agents = check_agents(self.model.default_agents if agents is None else agents)
        self.device = resolve_device(device)
        # torch's threads follow the cores other processes leave free (agentsim.threads)
        self.threads: ThreadGovernor | None = ThreadGovernor() if self.device.type == "cpu" else None
        self.comm: Comm = comm if comm is not None else LocalComm()
        self.groups = GroupSums(self.comm)  # ctx.group_totals: per-group sums over ranks, cut groups cached
        self.partition: Partitioner = make_partition(partition, self.comm.world_size, **partition_options)
        self.check_every = check_every_steps(check)  # 0: no check mode; K: every K-th step
        if self.check_every and hasattr(self.partition, "allow_overlap"):
            self.partition.allow_overlap = False  # every substep call is checked, none runs around an exchange
        self.sync_every = check_sync_every_for(self.partition, sync_every)
        self.snapshots = NeighborSnapshots(self.sync_every) if self.sync_every > 1 else None
        self.check_nan, self.check_inf = check_nan, check_inf
        self.shuffle_rows = shuffle_rows
        self.grad_params: dict[str, Tensor] = grad_parameters(self.model, grad)
        if self.check_every and self.grad_params:
            raise ConfigError("check=True runs every substep several times and compares the results: not in a "
                              "differentiable run (grad=); check the model without grad first")
        self.params: Params = Params({**self.model.params, **self.grad_params}, self.model.name) \
            if self.grad_params else self.model.params
        self.rng = CounterRNG(self.seed)
        self.actors = resolve_actors(self.model.policies, policies)
        if resume is None:  # a state that cannot fit: refused now, not by the allocator in the build
            check_memory(self.model, self.params, self.n_agents, self.device, self.seed)
        rng: Any = self.rng.at(0, "init")
        ic = InitContext(self.params, self.n_agents, rng, self.device, rank=self.comm.rank,
                         world_size=self.comm.world_size)
        failed: BaseException | None = None
        try:
            with torch.set_grad_enabled(self.differentiable):
                state, space = self.model.build(ic)
        except Exception as e:  # on several processes the others are told, not left waiting
            if self.comm.world_size == 1:
                raise
            failed = e
        # each rank built its share (a checkpoint holds every agent; one process builds everything)
        shared = ic.shared and resume is None and self.comm.world_size > 1
        if self.comm.world_size > 1:
            self._agree_init(ic, failed, state if shared and failed is None else None)
        state = state.to(self.device)
        self.model.validate_state(state)
        check_positions(state, space)
        self.run_id = uuid.uuid4().hex  # in its checkpoints' manifests: pruning touches only this run's
        self.resumed_from: str | None = None
        self.resume_manifest: dict[str, Any] | None = None  # the manifest of the checkpoint resumed
        self.file_settings: dict[str, Any] | None = None  # the trajectory's record/every (for checkpoints)
        if resume is not None:  # the saved agents replace init's, before the partitioner places them
            from agentsim.io.checkpoint import agree_checkpoint, read_checkpoint

            # One checkpoint for every rank (rank 0's choice): a newer one committed meanwhile is not used.
            saved = read_checkpoint(agree_checkpoint(resume, self.comm))
            saved.check_run(self.model, state, self.params, self.seed, self.n_agents, self.sync_every)
            state = saved.state(like=state)
            self.resumed_from = str(saved.path)
            self.resume_manifest = saved.manifest
            self.run_id = str(saved.manifest.get("run_id") or self.run_id)  # the run goes on
        self.space = space
        check_reaches(self.model.substeps, self.params, space)
        # shared= only when it is so: a partitioner written to the protocol before it (5 arguments) still works
        self.state: State = self.partition.place(state, space, self.model.substeps, self.params, self.comm,
                                                 **({"shared": True} if shared else {}))
        if shared:
            self._agree_next_uids()
        self.locality = LocalityOrder(space, self.model.substeps, self.params, sort_every)
        # Called after every substep with (simulation, substep) on every rank (agentsim.runner.invariance).
        self.trace: Callable[[Simulation, Substep], None] | None = None
        self._deposits_of: dict[str, list[str]] = {}  # substep name: its float layers that take deposits
        self.checks = ContractChecks(self._call, space, self.params, self.comm, self.partition.name,
                                     set(self.model.policies)) if self.check_every else None
        self._figures = StepFigures()  # the last PERF_WINDOW steps' figures and running totals
        self.failed: str | None = None
        self._rows: list[tuple[dict[str, Any], dict[str, float]]] = []  # metric rows arrived, not yet recorded
        self._checkpoint_write: CheckpointWrite | None = None  # an asynchronous checkpoint in flight
        self._in_run = False
        self._stop_signal = 0  # a stop request every rank learned of (engine.stops): the run ends after this step
        self._sorted_at = -1  # the step after which the rows were last sorted by cell
        self._carried = (0.0, CommStats())  # the last report's exchange, counted in the next step
        self._history = True  # a differentiable run's steps record autograd history (see without_history)
        self._read_only: dict[str, list[tuple[str, str]]] = {}  # per substep, the fields it may read, not write
        if self.device.type == "cpu":  # the steps' freed tensors reused, not fresh pages (after init: its
            native.reuse_freed_memory()  # one-off temporaries go back to the system)

    def _agree_init(self, ic: InitContext, failed: BaseException | None, shared: State | None) -> None:
        """After ``init`` on every rank, in one exchange: if it failed on some rank, every rank stops
        (that one with its own error, the others naming it); every rank must have read the same
        inputs (:meth:`InitContext.declare_input`); and after an init that built a share per rank
        (``shared``: its state), every rank must have built the same populations with the same
        fields (an empty share adds empty tensors; later steps would run mismatched collectives).
        Else every rank stops with the same error.
        """
        names = sorted(ic.inputs)
        inputs = ";".join(f"{name}={ic.inputs[name][0]}:{ic.inputs[name][1]}" for name in names)
        populations = "" if shared is None else ";".join(
            f"{name}:{','.join(f'{k}={spec}' for k, spec in sorted(pop.specs.items()))}"
            for name, pop in shared.populations.items())
        mine = torch.tensor([[int(failed is not None), zlib.crc32(populations.encode()), len(populations),
                              zlib.crc32(inputs.encode()), len(inputs)]], dtype=torch.int64)
        every = self.comm.all_gather_rows({"init": mine}, rows_per_rank=1)["init"]
        if failed is not None:
            raise failed

        def first_other(columns: slice) -> int | None:  # the first rank whose columns differ from rank 0's
            return next((r for r in range(every.shape[0]) if not torch.equal(every[r, columns], every[0, columns])),
                        None)

        broken = [r for r in range(every.shape[0]) if int(every[r, 0])]
        if broken:
            raise ConfigError(f"model '{self.model.name}': its init failed on process {broken[0]} (its error is in "
                              f"that process's output); process {self.comm.rank} stops too")
        if (rank := first_other(slice(1, 3))) is not None:
            raise ConfigError(f"model '{self.model.name}': its init builds a share per process (ic.share()), but "
                              f"process {rank} built other populations or fields than process 0 (this one: "
                              f"{populations[:200]}); every process must add the same populations with the same "
                              "fields, empty where its share has no agents")
        if (rank := first_other(slice(3, 5))) is not None:
            raise ConfigError(f"model '{self.model.name}': process {rank} read other inputs than process 0 "
                              f"(this one, process {self.comm.rank}, read {', '.join(names) or 'none declared'}): "
                              "every process must read the same files (the same path on every host, the same "
                              "content); a difference would give the processes' agents other tables, silently")

    def _agree_next_uids(self) -> None:
        """After an init that built a share per rank: every rank's ``next_uid`` of each population is the
        largest over ranks (births number from it, as on one process).
        """
        names = sorted(self.state.populations)
        mine = torch.tensor([[self.state.populations[n].next_uid for n in names]], dtype=torch.int64)
        every = self.comm.all_gather_rows({"next": mine}, rows_per_rank=1)["next"]
        for name, top in zip(names, every.max(0).values.tolist(), strict=True):
            self.state.populations[name].next_uid = int(top)

    def parameter_gradients(self, loss: Tensor) -> dict[str, Tensor]:
        """``d loss / d`` each of :attr:`grad_params`, added over ranks (a collective: every rank
        calls it with its copy of a loss that is the same on every rank).
        """
        from agentsim.grad.autograd import reach_exchanges, sum_gradients

        names = list(self.grad_params)
        loss = reach_exchanges(loss, self.partition.grad_links)
        got = torch.autograd.grad(loss, [self.grad_params[n] for n in names], allow_unused=True)
        grads = [g if g is not None else torch.zeros((), dtype=torch.float64) for g in got]
        return dict(zip(names, sum_gradients(grads, self.comm), strict=True))

    def rollout_gradients(self, steps: int, observe: Callable[[Simulation], Tensor], loss: Callable[[Tensor], Tensor],
                          checkpoint_every: int | None = None) -> tuple[Tensor, dict[str, Tensor]]:
        """Run ``steps`` steps; ``(loss, d loss / d parameters)`` in bounded memory, from the
        observations ``observe(self)`` after each step and ``loss(stacked observations)``, with a
        state checkpoint every ``checkpoint_every`` steps (see :mod:`agentsim.engine.gradients`).
        """
        from agentsim.engine.gradients import rollout_gradients

        return rollout_gradients(self, steps, observe, loss, checkpoint_every)

    def save_checkpoint(self, directory: str | os.PathLike[str], keep: int | None = None, *,
                        asynchronous: bool = False) -> str:
        """Save the state after the last step as a checkpoint under ``directory`` (every rank calls
        it together; see :mod:`agentsim.io.checkpoint`); keep the newest ``keep`` checkpoints there.
        Returns the checkpoint's path; ``Simulation(..., resume=path or directory)`` continues from it.

        With ``asynchronous`` the state is copied and the files are written in the background
        while the run goes on: the checkpoint is committed when every rank's shard is on disk.
        :meth:`wait_checkpoint` (every rank) waits for it and raises its errors; the next
        checkpoint and :meth:`run` wait for it by themselves.
        """
        from agentsim.io.checkpoint import json_params, model_fingerprint, run_record, start_checkpoint

        self.wait_checkpoint()  # one write in flight at a time
        self._settle()  # the step's summary (its flags) first
        self.partition.sync_env(self.state, self.comm)
        run = {"model": self.model.name, "fingerprint": model_fingerprint(self.model, self.state),
               "params": json_params(self.params), "seed": self.seed, "partition": self.partition.name,
               "run": {**run_record(self.model, self.n_agents, self.sync_every), "file": self.file_settings},
               "run_id": self.run_id}
        write = start_checkpoint(directory, self.state, self.comm, run, keep, asynchronous)
        if asynchronous:
            self._checkpoint_write = write
        return str(write.path)

    def wait_checkpoint(self) -> str | None:
        """Wait for the asynchronous checkpoint in flight, if any (every rank together); return
        its path (None if none was in flight). Raises an :class:`~agentsim.errors.OutputError`
        on every rank if any rank could not write it.
        """
        write, self._checkpoint_write = self._checkpoint_write, None
        return None if write is None else str(write.wait())

    def save_state(self) -> SavedState:
        """A copy of the state (every tensor) and of what the engine keeps about it, for :meth:`load_state`."""
        return SavedState(self.state.clone(), self._sorted_at, self._figures.copy())

    def load_state(self, saved: SavedState) -> None:
        """Go back (or forward) to a state saved by :meth:`save_state` of this simulation: a copy of
        it becomes the state, and the per-step figures become those taken when it was saved.
        """
        self._settle()
        self.partition.release()
        self.state, self._sorted_at = saved.state.clone(), saved.sorted_at
        self._figures = saved.figures.copy()

    @contextmanager
    def without_history(self) -> Iterator[None]:
        """Steps taken inside record no autograd history, even in a differentiable run."""
        old, self._history = self._history, False
        try:
            yield
        finally:
            self._history = old

    @property
    def differentiable(self) -> bool:
        """Whether this run records autograd history (``grad=``)."""
        return bool(self.grad_params)

    @property
    def perf_steps(self) -> deque[dict[str, float]]:
        """Per step, figures over all ranks (the last :data:`PERF_WINDOW` steps; see the class doc)."""
        return self._figures.perf

    @property
    def comm_steps(self) -> deque[CommStats]:
        """Per step, this rank's :class:`~agentsim.core.comm.CommStats` (the last :data:`PERF_WINDOW` steps)."""
        return self._figures.comm

    @property
    def step_seconds(self) -> deque[float]:
        """Per step, this rank's seconds (the last :data:`PERF_WINDOW` steps)."""
        return self._figures.seconds

    @property
    def substep_seconds(self) -> dict[str, list[float]]:
        """Substep name to this rank's seconds in it, per step taken (the last :data:`PERF_WINDOW` steps)."""
        return {s.name: [t.get(s.name, 0.0) for t in self._figures.substeps] for s in self.model.substeps}

    # ---------------------------------------------------------------- stepping
    def step(self) -> None:
        """Advance the state by one step (every substep once, in order)."""
        if self.failed is not None:
            raise SimulationError(f"this Simulation stopped with an error ({self.failed}); its state may be partly "
                                  "updated: build a new Simulation")
        computing = self.state.step + 1
        if self.threads is not None:
            self.threads.tick()
        grad = self.differentiable and self._history
        try:
            if grad == torch.is_grad_enabled():
                self._step()
            else:
                with torch.set_grad_enabled(grad):
                    self._step()
        except BaseException as e:
            self.failed = f"{type(e).__name__} in step {computing}: {e}"
            raise

    def _step(self) -> None:
        """One step, the same sequence on any number of processes.

        The spine:
        1. rows: sorted by cell or shuffled, where due (:meth:`_arrange_rows`);
        2. substeps, in order (:meth:`_run_substeps`): each with its halos, through a checked
           :class:`~agentsim.core.context.Context`, then env merges, deaths and births, error
           flags and migrations; the last step's report arrives after the first;
        3. the step closes (:meth:`_close_step`): its number, a sort where due, its metric sums in a run;
        4. its report (:meth:`_send_report`): flags, sums and figures to every process (on one
           process, taken at once), raised and recorded when it arrives (:meth:`_take`).
        """
        t_enter, stats_enter = time.perf_counter(), self.comm.stats.snapshot()
        self._arrange_rows()
        flags, seconds = self._run_substeps()
        sums = self._close_step()
        self._send_report(flags, seconds, sums, t_enter, stats_enter)

    def _arrange_rows(self) -> None:
        """Sort the rows by cell (:mod:`agentsim.engine.locality`) where due, then shuffle them
        (``shuffle_rows``); first finish what is in flight, since it may hold row numbers.
        """
        state = self.state
        sort_now = self.locality.due(state.step) and self._sorted_at != state.step
        if sort_now or self.shuffle_rows:
            self._settle()
            if sort_now:
                self.locality.apply(state)
            if self.shuffle_rows:  # after the sort, so that the shuffle is what the step sees
                for pop in state.populations.values():
                    pop.permute(torch.randperm(pop.n, device=self.device))

    def _run_substeps(self) -> tuple[list[Flag], dict[str, float]]:
        """Every substep once, in order: the step's flags and each substep's seconds."""
        flags: list[Flag] = []
        seconds: dict[str, float] = {}
        sync = self.device.type == "cuda"
        for i, s in enumerate(self.model.substeps):
            t0 = time.perf_counter()
            flags += self._run_substep(s)
            if self.trace is not None:
                self.trace(self, s)
            if i == 0:
                self.partition.finish_report(self.comm)  # the last step's report, if it was still in flight
            if sync:
                torch.cuda.synchronize(self.device)
            seconds[s.name] = time.perf_counter() - t0
            self._take_reports()  # the last step's summary may arrive with this step's exchange
        return flags, seconds

    def _close_step(self) -> MetricSums | None:
        """The state's step is the new one; sort where due; the metric sums, inside a run."""
        state = self.state
        state.step += 1
        if not self.shuffle_rows and self.locality.due(state.step):
            # Sorted now, before the report: an exchange that travels into the next step holds
            # row numbers, so the next step could not sort without waiting for it.
            self.locality.apply(state)
            self._sorted_at = state.step
        return self.model.metric_sums(self.view()) if self._in_run else None

    def _send_report(self, flags: list[Flag], seconds: dict[str, float], sums: MetricSums | None, t_enter: float,
                     stats_enter: CommStats) -> None:
        """This rank's report of the step, with its figures: the step itself and the last step's
        report exchange, which ended after that report was sent (see :mod:`agentsim.engine.perf`).
        """
        state = self.state
        carried_seconds, carried = self._carried
        stats = self.comm.stats.since(stats_enter)
        stats = CommStats(stats.calls + carried.calls, stats.bytes_sent + carried.bytes_sent,
                          stats.seconds + carried.seconds)
        self._figures.take_comm(stats)
        figures = RankFigures(agents=float(sum(p.n for p in state.populations.values())),
                              step_seconds=time.perf_counter() - t_enter + carried_seconds,
                              comm_seconds=stats.seconds, bytes_sent=float(stats.bytes_sent))
        t_report, stats_report = time.perf_counter(), self.comm.stats.snapshot()
        env = state.env if self.comm.world_size > 1 else None  # every process's copies compared
        report = StepReport(state.step, flags, figures, sums, seconds, env, stops.requested() if self._in_run else 0)
        self.partition.end_step(state, report, self.comm, hold=self._in_run)
        self._carried = (time.perf_counter() - t_report, self.comm.stats.since(stats_report))
        self._take_reports()

    def _run_substep(self, s: Substep) -> list[Flag]:
        state, part = self.state, self.partition
        split = part.split_run(s)
        if split is not None:  # the step's exchange is in flight: the partitioner runs s around it
            return (split(state, partial(self._call, s, per_agent_flags=True), self.comm) + self._nan_flags(s)
                    + self._position_flags(s))
        fresh = self.snapshots is None or not s.neighbors or self.snapshots.due(s, state.step + 1)
        halos = part.halos(state, s, self.comm) if fresh and s.neighbors else {}
        if self.snapshots is not None and s.neighbors and fresh:
            self._store_snapshot(s, halos)
        before = self._env_before(s)
        start = state.clone() if fresh and self.checks is not None and self._checking() else None
        effects = self._call(s, state, halos, fresh=fresh)
        if self.checks is not None and start is not None:
            self.checks.check(s, start, halos, state, effects, state.step + 1)
        flags = part.merge_env(state, s, before, self.comm) + self._apply(s, effects)
        if effects.deposits or (self.comm.world_size > 1 and self._deposit_layers(s)):
            self._add_deposits(s, effects)
        if self.checks is not None and s.births and self._checking():
            self.checks.check_uids(state, state.step + 1, s)
        part.migrate(state, s, self.comm)
        return flags

    def _deposit_layers(self, s: Substep) -> list[str]:
        """The float env layers ``s`` changes through ``ctx.deposit`` (combine 'add'), in name order
        (found once per substep: a layer keeps its dtype).
        """
        layers = self._deposits_of.get(s.name)
        if layers is None:
            layers = self._deposits_of[s.name] = [
                k for k in sorted(s.writable(ENV)) if deposit_layer(self.state.env[k].dtype, s.env_combine(k))]
        return layers

    def _add_deposits(self, s: Substep, effects: Effects) -> None:
        """Add the deposits of ``s`` into its float layers: every rank's exact sums (a substep on agents:
        each rank deposited for its own; one that touches no agents deposited alike on every rank).
        """
        for name in self._deposit_layers(s):
            layer = self.state.env[name]
            total = effects.deposits.get(name)
            if self.comm.world_size > 1 and s.touches_agents():
                if total is None:
                    total = torch.zeros(layer.numel(), dtype=torch.int64, device=layer.device)
                total = self.comm.sum_int64(total)
            if total is not None:
                self.state.env[name] = add_deposits(layer, total)

    def _checking(self) -> bool:
        """Whether the check mode checks the step being computed (every ``check_every``-th)."""
        return self.checks is not None and (self.state.step + 1) % self.check_every == 0

    def _env_before(self, s: Substep) -> dict[str, Tensor]:
        """On several ranks, a copy of the env layers ``s`` writes when it runs on agents (each rank
        then changed its own part, merged by :meth:`Partitioner.merge_env`); else nothing.
        """
        if self.comm.world_size == 1 or not s.touches_agents():
            return {}
        deposits = self._deposit_layers(s)  # (merged by their exact sums instead)
        return {key: self.state.env[key].clone() for key in sorted(s.writable(ENV)) if key not in deposits}

    def _call(self, s: Substep, state: State, halos: Halos, *, per_agent_flags: bool = False,
              fresh: bool = True, groups: Any = None) -> Effects:
        """Call ``s`` on ``state`` with ``halos`` as the other agents it may read (or, not
        ``fresh``, the neighbor snapshots); raise if it modified a read-only tensor in place.
        ``groups``: what ``ctx.group_totals`` sums with (default: the run's, over its ranks; the check
        mode's split calls pass their own).
        """
        snapshots = None if fresh else self.snapshots  # the closure holds what it needs, not the engine

        def neighbors(population: str) -> NeighborView:
            pop = state[population]
            fields = s.neighbors[population]
            if snapshots is None:
                return NeighborView(pop, fields, s, halos.get(population))
            local, others = snapshots.view(s, population, pop[UID])
            return NeighborView(pop, fields, s, others, local=local)

        step = state.step + 1
        ctx = Context(s, state, step=step, params=self.params, rng=self.rng.at(step, s.name), space=self.space,
                      device=self.device, neighbors=neighbors if s.neighbors else None,
                      per_agent_flags=per_agent_flags, policies=self.actors,
                      groups=self.groups if groups is None else groups)
        checking = self.checks is not None and self._checking()
        if checking:  # env layers that refuse negative indices, for this call
            state.env.update(checked_env(state.env, s))
        versions = _read_only_versions(s, state, self._read_only)
        layers = self._deposit_layers(s)
        deposited = [(k, id(state.env[k]), ops.tensor_version(state.env[k])) for k in layers] if layers else ()
        try:
            s(ctx)
            for key, tensor_id, version in deposited:
                t = state.env[key]
                if id(t) != tensor_id or ops.tensor_version(t) != version:
                    raise FieldAccessError(
                        f"substep '{s.name}' writes env.{key} directly: a float layer that combines by 'add' "
                        f"changes only through ctx.deposit('env.{key}', cells, amounts), summed exactly")
            for (pop, key), (tensor_id, version) in versions.items():
                t = state.env[key] if pop == ENV else state.populations[pop][key]
                if id(t) == tensor_id and ops.tensor_version(t) != version:
                    raise FieldAccessError(
                        f"substep '{s.name}' modified '{pop}.{key}' in place but does not declare it in writes=")
        finally:
            if checking:
                _plain_state(state, ctx.effects)
        return ctx.effects

    def _apply(self, s: Substep, effects: Effects) -> list[Flag]:
        """Apply the deaths and births a substep asked for; its flags and NaN flags."""
        for death in effects.deaths:
            self.state.populations[death.population].keep(~death.dies)
        for birth in self._births(s, effects):
            offset, total = self.comm.birth_offset(birth.parent_uid)
            population = self.state.populations[birth.population]
            population.spawn(birth.parent_uid, birth.fields, uid_offset=offset, n_born_total=total)
            stored = self.snapshots.fields(birth.population) if self.snapshots is not None else []
            if stored and self.snapshots is not None:  # newborns join the snapshots with their values at birth
                m = birth.parent_uid.shape[0]
                born = {k: population[k][population.n - m:] for k in stored}
                self.snapshots.add_births(birth.population, self.comm.all_gather_rows(born))
        return effects.flags + self._nan_flags(s) + self._position_flags(s)

    def _births(self, s: Substep, effects: Effects) -> list[Birth]:
        """One birth per population ``s`` declares births in, in the declared order: this rank's
        ``ctx.spawn`` calls for it joined, or none (an empty one), so that every rank takes part in the
        same collectives however often it called ``ctx.spawn`` (an ``if`` on local data may skip it).
        """
        out = []
        for name in s.births:
            calls = [b for b in effects.births if b.population == name]
            if len(calls) == 1:
                out.append(calls[0])
                continue
            population = self.state.populations[name]
            fields = [k for k in population.specs if k != UID]
            if not calls:
                out.append(Birth(name, torch.zeros(0, dtype=torch.int64, device=self.device),
                                 {k: population[k][:0] for k in fields}))
            else:
                out.append(Birth(name, torch.cat([b.parent_uid for b in calls]),
                                 {k: torch.cat([b.fields[k] for b in calls]) for k in fields}))
        return out

    def _position_flags(self, s: Substep) -> list[Flag]:
        """On a grid or a line: a flag per position field ``s`` writes, set if it holds a position
        outside the space.
        """
        if isinstance(self.space, Line):
            return self._line_flags(s, self.space)
        if not isinstance(self.space, Grid):
            return []
        flags = []
        for ref in s.writes:
            pop, key = ref.split(".")
            if pop != ENV and key == Grid.position_field:
                cells = self.state.populations[pop][key]
                if cells.numel():
                    low, high = torch.aminmax(cells)  # one pass
                    bad = (low < 0) | (high >= self.space.n_cells)
                else:
                    bad = torch.tensor(False)
                flags.append(Flag(f"{s.name}: {ref} holds a cell outside the {self.space.height} x "
                                  f"{self.space.width} grid (valid: 0 to {self.space.n_cells - 1}; on a bounded "
                                  "grid neighbor_cells gives -1 for cells beyond the border)", bad))
        return flags

    def _line_flags(self, s: Substep, line: Line) -> list[Flag]:
        flags = []
        for ref in s.writes:
            pop, key = ref.split(".")
            if pop != ENV and key == Line.position_field:
                x = self.state.populations[pop][key]
                # the smallest and largest positions (one pass; a NaN makes both NaN) off the line, or not
                bad = line.outside(torch.stack(torch.aminmax(x))).any() if x.numel() else torch.tensor(False)
                flags.append(Flag(f"{s.name}: {ref} holds a position outside {line.describe()} (map positions "
                                  "onto it with ctx.space.move(x, dx) or ctx.space.wrap(x))", bad))
        return flags

    def _nan_flags(self, s: Substep) -> list[Flag]:
        """With ``check_nan`` (``check_inf``): a flag per floating-point field ``s`` writes, set if
        it holds a NaN (an inf).
        """
        flags: list[Flag] = []
        if self.check_nan or self.check_inf:
            for ref in s.writes:
                pop, key = ref.split(".")
                t = self.state.env[key] if pop == ENV else self.state.populations[pop][key]
                if t.is_floating_point():
                    # One pass on the CPU: a NaN or an inf anywhere makes the sum non-finite (the four
                    # passes of isnan and isinf only then, or when the sum overflowed); elsewhere no host
                    # sync here. Every rank makes the same flags, whatever it found.
                    clean = t.device.type == "cpu" and math.isfinite(t.sum().item())
                    if self.check_nan:
                        flags.append(Flag(f"{s.name}: NaN in {ref}", CLEAR if clean else torch.isnan(t).any()))
                    if self.check_inf:
                        flags.append(Flag(f"{s.name}: inf in {ref} (check_inf=False allows it)",
                                          CLEAR if clean else torch.isinf(t).any()))
        return flags

    def _store_snapshot(self, s: Substep, halos: Halos) -> None:
        assert self.snapshots is not None
        for name, fields in s.neighbors.items():
            rows = self.state[name].select(fields)
            halo = halos.get(name)
            if halo is not None:
                rows = {k: torch.cat([v, halo[k].to(v.device)]) for k, v in rows.items()}
            self.snapshots.store(s, name, rows)

    def _settle(self) -> None:
        """Finish the exchange in flight (see :meth:`Partitioner.settle
        <agentsim.distributed.partition.Partitioner.settle>`) and take every summary that arrived:
        where the state is about to be read whole, reordered or saved. A collective.
        """
        self.partition.settle(self.state, self.comm)
        self._take_reports()

    def _take_reports(self) -> None:
        """Take the summaries that arrived (:meth:`_take`), without waiting for one in flight."""
        for summary in self.partition.reports():
            self._take(summary)

    def _take(self, summary: StepSummary) -> None:
        """A step's summary: raise its flags (every rank at once), balance the load, keep the
        figures and the metrics row.
        """
        if summary.raised:
            raise SimulationError(f"step {summary.step}: " + "; ".join(summary.raised))
        if summary.stop and self._in_run:
            self._stop_signal = self._stop_signal or summary.stop
        figures = summary.figures
        counts = [int(v) for v in figures.agents]
        moved = self.partition.rebalance(self.state, self.comm, counts) if summary.at_step_end else None
        perf = step_figures(figures, counts, moved)
        step_seconds = figures.step_seconds[self.comm.rank]
        self._figures.take(perf, step_seconds, summary.seconds)
        if summary.sums is not None:
            row = {"step_seconds": step_seconds,
                   **{f"substep_seconds/{k}": v for k, v in summary.seconds.items()}, **perf}
            self._rows.append((self.model.metric_row(summary.step, summary.sums, self.params, self.space), row))

    # ---------------------------------------------------------------- metrics
    def view(self) -> MetricsContext:
        """A read-only view of this rank's state for metrics and rewards (``view()["pop"]["field"]``,
        ``view().owned_env(name)``).
        """
        return MetricsContext(self.state, self.params, self.space, self.state.step,
                              partial(self.partition.owned_env, self.state, comm=self.comm))

    def metrics(self) -> dict[str, Any]:
        """Global metrics of the current state (a collective on several ranks).

        Per-agent values are summed over agents and ranks exactly (:mod:`agentsim.core.metrics`), so
        the result has the same bits on any number of ranks.
        """
        if self.failed is not None:
            raise SimulationError(f"this Simulation stopped with an error ({self.failed}); build a new Simulation")
        self._settle()
        sums = self.model.metric_sums(self.view())
        total = self.comm.sum_int64(torch.as_tensor(sums.values, dtype=torch.int64))
        return self.model.metric_row(self.state.step, sums._replace(values=total), self.params, self.space)

    # ---------------------------------------------------------------- running
    def run(self, steps: int, out: str | os.PathLike[str] | None = None, *, record: Iterable[str] | None = None,
            every: int | None = None, progress: bool = False, checkpoint_every: int | None = None,
            checkpoint_dir: str | os.PathLike[str] | None = None, keep: int | None = None,
            checkpoint_async: bool = False, append: bool = False, lock: bool = True) -> RunResult:
        """Run ``steps`` steps; optionally stream a trajectory to the HDF5 file ``out``.

        Args:
            steps: Number of steps (>= 0).
            out: HDF5 path, or None to keep metrics in memory only.
            record: Agent/env fields to record (default all; see :mod:`agentsim.io.recording`).
            every: Also record agents every ``every`` steps (default: first and last only).
            progress: Show a progress bar (only when stderr is a terminal).
            checkpoint_every: Save a checkpoint (:meth:`save_checkpoint`) into ``checkpoint_dir``
                after every step that is a multiple of this (counted from step 0).
            checkpoint_dir: Where checkpoints go (needed with ``checkpoint_every``).
            keep: Keep only the newest ``keep`` checkpoints there (default: all).
            checkpoint_async: Write checkpoints in the background while the next steps run (the
                state is copied first; see :meth:`save_checkpoint`); the run waits for the last
                one before it returns.
            append: Continue the existing file ``out`` of the run this simulation resumed (see
                ``resume``): its rows and frames from the current step on are dropped and written
                again, and frames follow the schedule of one run from step 0 to the new last step,
                so the file ends as that run's file would. Its ``record`` and ``every`` must be those of
                the run that saved the checkpoint (else a :class:`~agentsim.io.checkpoint.CheckpointError`).
            lock: Rank 0 holds the locks of ``out`` and ``checkpoint_dir`` for the run (see
                :mod:`agentsim.io.locks`): another run writing either makes this one fail at once with a
                :class:`~agentsim.io.locks.LockedError` naming it. False: the caller holds them (the
                workers of :func:`agentsim.launch`, whose launcher does).

        The file is flushed after the first step, then every second
        (:data:`~agentsim.io.recording.FLUSH_SECONDS`) and at every checkpoint: a run killed at
        any moment leaves a readable file with every step up to the last flush (root attribute
        ``completed`` False).
        """
        steps = check_steps(steps)
        check_every(every)
        if checkpoint_every is not None:
            check_every(checkpoint_every, "checkpoint_every")
            if checkpoint_dir is None:
                raise ConfigError("checkpoint_every needs a checkpoint_dir (where the checkpoints go)")
        start = self.state.step
        record = None if record is None else list(record)
        if append and (out is None or not os.path.isfile(out)):
            raise OutputError(f"append: no trajectory file to continue at {out!r}")
        if append and self.resume_manifest is not None:
            from agentsim.io.checkpoint import CheckpointError, file_differences, mismatch_message

            diffs = file_differences(self.resume_manifest, record, every)
            if diffs:
                raise CheckpointError(mismatch_message(self.resumed_from or "", diffs))
        locks = lock_on_rank0(self.comm, out, checkpoint_dir) if lock else []
        try:
            return self._run(steps, out, record, every, progress, checkpoint_every, checkpoint_dir, keep,
                             checkpoint_async, append, start)
        finally:
            for taken in reversed(locks):
                taken.release()

    def _run(self, steps: int, out: str | os.PathLike[str] | None, record: Iterable[str] | None, every: int | None,
             progress: bool, checkpoint_every: int | None, checkpoint_dir: str | os.PathLike[str] | None,
             keep: int | None, checkpoint_async: bool, append: bool, start: int) -> RunResult:
        from agentsim.io.checkpoint import file_record

        self.file_settings = None if out is None else file_record(record, every)
        # Frames at done = 0, every `every` steps and at the end, counted from the run's origin: this
        # run's start, or, continuing a file, step 0 of the run the file holds.
        origin, span = (0, start + steps) if append else (start, steps)
        recorder = Recorder(out, recording(self.state, record), self.comm.rank, every,
                            continue_before=start if append else None, model=self.model.name,
                            params=dict(self.params), seed=self.seed, steps=span, world_size=self.comm.world_size,
                            display=self.model.metric_display(), space=space_record(self.space),
                            agents=self.n_agents)
        rows = _MetricRows()
        t_run = 0.0
        self._in_run = True
        self._stop_signal = 0
        self._rows = []
        try:
            row = self.metrics()
            agents_at_start = sum(int(row[f"n_{name}"]) for name in self.state.populations)  # over every rank
            figs = self._figures
            first_perf, first_comm, first_totals = figs.taken, figs.comm_taken, dict(figs.substep_totals)
            rows.append(row)
            recorder.write_row(self.state.step, row, None)
            if recorder.frame_due(start - origin, span):
                recorder.write_frame(self.state.step, self.partition.frame(self.state, recorder.spec, self.comm))
            bar = progress_bar(steps, progress, "step")
            t0 = time.perf_counter()
            with torch.set_grad_enabled(self.differentiable and self._history):  # for every step at once
                for _ in range(steps):
                    self.step()
                    frame = recorder.frame_due(self.state.step - origin, span)
                    checkpoint = checkpoint_every is not None and self.state.step % checkpoint_every == 0
                    if frame or checkpoint or self._stop_signal or self.state.step - start == steps:
                        self._settle()  # this step's summary, now
                    stopping = self._stop_signal != 0 and self.state.step - start < steps
                    checkpoint = checkpoint or (stopping and checkpoint_dir is not None)
                    for row, perf in self._rows:
                        rows.append(row)
                        recorder.write_row(row["step"], row, perf)
                    self._rows = []
                    if frame:
                        frame_rows = self.partition.frame(self.state, recorder.spec, self.comm)
                        recorder.write_frame(self.state.step, frame_rows)
                    recorder.flush(force=checkpoint)  # before a checkpoint: the file holds every step it covers
                    saved = None
                    if checkpoint:
                        assert checkpoint_dir is not None
                        saved = self.save_checkpoint(checkpoint_dir, keep,
                                                     asynchronous=checkpoint_async and not stopping)
                    if bar is not None:
                        bar.update(1)
                    if stopping:
                        self._stop_run(saved)
            self.wait_checkpoint()
            t_run = time.perf_counter() - t0
            if bar is not None:
                bar.close()
        except BaseException as e:
            try:
                recorder.close(completed=False)
            except OutputError as close_error:  # the file failed too: say so, but raise the first error
                if not isinstance(e, OutputError):
                    getattr(e, "add_note", lambda _: None)(f"also: {close_error}")  # Python >= 3.11
            if self._checkpoint_write is not None:  # no collective here: the other ranks may be gone
                self._checkpoint_write.cancel()
                self._checkpoint_write = None
            if self.failed is None and not isinstance(e, RunStopped):  # raised while recording, between steps
                self.failed = f"{type(e).__name__} after step {self.state.step}: {e}"
            raise
        finally:
            self._in_run = False
            self._rows = []
            self.partition.release()
            if self.threads is not None:
                self.threads.restore()
        groups = self._group_figures()
        recorder.write_perf_attrs(groups)
        recorder.close(completed=True)
        figs = self._figures
        taken = figs.taken - first_perf
        timings = {s.name: (figs.substep_totals.get(s.name, 0.0) - first_totals.get(s.name, 0.0)) / taken
                   if taken else 0.0 for s in self.model.substeps}
        metrics = rows.arrays()
        comm = figs.last(figs.comm, figs.comm_taken - first_comm)
        return RunResult(metrics, self.state, timings, t_run, recorder.path, self.model, self.comm.world_size,
                         figs.last(figs.perf, taken), [c.seconds for c in comm], [c.bytes_sent for c in comm],
                         groups, self.threads.summary() if self.threads is not None and self.threads.active else "",
                         agents_at_start)

    def _stop_run(self, checkpoint: str | None) -> None:
        """End a run that was asked to stop (every rank after the same step, its final
        ``checkpoint`` written where the run has a directory): :class:`~agentsim.errors.RunStopped`.
        """
        self.wait_checkpoint()  # (an earlier one in flight)
        signum, step = self._stop_signal, self.state.step
        where = f"; final checkpoint {checkpoint}" if checkpoint is not None else ""
        raise RunStopped(f"stopped by {stops.signal_name(signum)} after step {step}{where}", signum, step, checkpoint)

    def _group_figures(self) -> dict[str, float]:
        """The cut of each group field over ranks (a collective on several ranks: every rank has
        the same fields, since ``ctx.group_totals`` is called on every rank alike).
        """
        mine = self.groups.figures
        names = list(mine)
        if not names:
            return {}
        rows = [[mine[n][c] for c in GROUP_COLUMNS] for n in names]
        if self.comm.world_size == 1:
            return group_figures(names, [rows])
        flat = torch.tensor(rows, dtype=torch.int64).reshape(1, -1)
        every = self.comm.all_gather_rows({"figures": flat})["figures"]
        return group_figures(names, every.reshape(self.comm.world_size, len(names), len(GROUP_COLUMNS)).tolist())


def _plain_state(state: State, effects: Effects) -> None:
    """Plain tensors again where a check-mode call left checked env layers (or values made from them)."""
    for key, value in state.env.items():
        state.env[key] = plain(value)
    for pop in state.populations.values():
        for key in pop.keys():
            value = pop[key]
            if key != UID and type(value) is not Tensor:
                pop[key] = plain(value)
    effects.births[:] = [b._replace(fields={k: plain(v) for k, v in b.fields.items()}) for b in effects.births]
    effects.flags[:] = [f._replace(condition=plain(f.condition)) for f in effects.flags]


def _read_only_versions(s: Substep, state: State, kept: dict[str, list[tuple[str, str]]]
                        ) -> dict[tuple[str, str], tuple[int, int]]:
    """Version counters of the tensors ``s`` may read but not write (in-place write detection);
    ``kept``: which they are, by substep name (found at the first call).
    """
    refs = kept.get(s.name)
    if refs is None:
        refs = kept[s.name] = [(name, key) for name in state.populations if s.touches(name)
                               for key in sorted(s.readable(name) - s.writable(name))]
        refs += [(ENV, key) for key in sorted(s.readable(ENV) - {UID} - s.writable(ENV))]
    out: dict[tuple[str, str], tuple[int, int]] = {}
    for name, key in refs:
        fields = state.env if name == ENV else state.populations[name]
        if key in fields:
            t = fields[key]
            out[(name, key)] = (id(t), ops.tensor_version(t))
    return out


class _MetricRows:
    """A run's metric rows, kept compact: every ``chunk`` rows become numpy arrays (about 8 bytes
    a value instead of a dict per step), joined by :meth:`arrays` as ``np.asarray`` over all
    rows would.
    """

    def __init__(self, chunk: int = 1024) -> None:
        self.chunk = chunk
        self.rows: list[dict[str, Any]] = []
        self.done: list[dict[str, np.ndarray]] = []

    def append(self, row: dict[str, Any]) -> None:
        self.rows.append(row)
        if len(self.rows) >= self.chunk:
            self.done.append(self._pack(self.rows))
            self.rows = []

    @staticmethod
    def _pack(rows: list[dict[str, Any]]) -> dict[str, np.ndarray]:
        return {k: np.asarray([r[k] for r in rows]) for k in rows[0]}

    def arrays(self) -> dict[str, np.ndarray]:
        parts = self.done + ([self._pack(self.rows)] if self.rows else [])
        if len(parts) == 1:
            return parts[0]
        return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
