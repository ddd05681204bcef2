"""``agentsim check``: does a model give the same bits on any number of processes? Runs it at a small
size and says either "identical on W = 1, 2, 3 (data, spatial), ..." or where the first difference
is (step, substep, field, agents) with a hint.

The runs, all from the same seed and parameters:

1. one process in check mode (:mod:`agentsim.engine.contract`): a broken contract is reported at the
   substep that breaks it, and nothing else is run;
2. one process with every population's rows shuffled before each step;
3. 2 and 3 processes with each partitioner that applies (``"data"`` always, ``"spatial"`` when
   every population is placed in the model's space), in one 3-process job (sub-groups of it);
4. a checkpoint saved on one process halfway, resumed on 2 processes.

After every substep of every step each run gathers its agents (uid-sorted) and env layers on its
first process; they must equal the first run's, bit for bit. The first difference names the run,
the step, the substep, the field and the agents, with what usually causes it there.

Each run on several processes also counts the agents each process holds once they are placed
(``"W = 2, spatial: 160 + 140"``). A run in which one process held every agent tested nothing
of its partition: the check says so and fails (``agentsim check`` exits 1), naming the run.

Examples:
    >>> from agentsim.models.randomwalk import MODEL
    >>> report = check_model(MODEL, agents=50, steps=2, world_sizes=(1,))
    >>> report.identical, report.summary()  # doctest: +ELLIPSIS
    (True, 'identical on W = 1 (rows shuffled): randomwalk, 50 agents, 2 steps, 1 substep')
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from agentsim.core.comm import Comm
from agentsim.core.model import Model
from agentsim.core.state import UID
from agentsim.core.substep import Substep
from agentsim.engine.simulation import Simulation
from agentsim.errors import ConfigError, ContractError

__all__ = ["CHECK_STEPS", "CheckReport", "Divergence", "check_model"]

#: The steps a check runs by default: long enough for motion that builds up over steps (a car that
#: speeds up by one cell a step from rest to five reads five cells ahead only after five steps, and
#: its reads beyond a too short reach change a result only once neighbours have sped up too).
CHECK_STEPS = 30

Trace = list[tuple[int, str, dict[str, np.ndarray]]]  # (step, substep, "pop.field"/"env.layer" -> values)


@dataclass
class Divergence:
    """The first difference of a run from the one-process run."""

    run: str
    step: int
    substep: str
    field: str
    detail: str
    hint: str

    def __str__(self) -> str:
        return (f"{self.run}: first difference at step {self.step}, substep '{self.substep}', {self.field}: "
                f"{self.detail}\nhint: {self.hint}")


@dataclass
class CheckReport:
    """What :func:`check_model` found.

    Attributes:
        model: The model's name.
        agents, steps: The size checked.
        substeps: How many substeps a step has.
        runs: The runs compared with the one-process run (``"W = 2, data"``, ...).
        contract: The check mode's error, if the model broke the contract (nothing else then ran).
        divergence: The first difference, if any.
    """

    model: str
    agents: int
    steps: int
    substeps: int
    world_sizes: tuple[int, ...] = ()
    partitions: tuple[str, ...] = ()
    runs: list[str] = field(default_factory=list)
    resumed_at: int | None = None
    contract: str | None = None
    divergence: Divergence | None = None
    #: Agents each process held once placed, per run on several processes.
    splits: dict[str, list[int]] = field(default_factory=dict)
    #: Partitions that apply to the model's populations but were not run, and why.
    not_checked: dict[str, str] = field(default_factory=dict)

    @property
    def unsplit(self) -> list[str]:
        """The runs on several processes in which one process held every agent (none split)."""
        return [run for run, counts in self.splits.items() if sum(counts) > 0 and max(counts) == sum(counts)]

    @property
    def identical(self) -> bool:
        """Whether every run gave the one-process bits, each run on several processes with its agents
        split between them.
        """
        return self.contract is None and self.divergence is None and not self.unsplit

    def summary(self) -> str:
        """One line (identical) or the problem found, with its hint."""
        size = (f"{self.model}, {self.agents:,} agents, {self.steps} steps, {self.substeps} "
                f"substep{'s' if self.substeps != 1 else ''}")
        if self.contract is not None:
            return f"contract broken ({size}):\n{self.contract}"
        if self.divergence is not None:
            return f"not identical ({size}):\n{self.divergence}"
        split = "; ".join(f"{run}: {' + '.join(f'{c:,}' for c in counts)}" for run, counts in self.splits.items())
        if self.unsplit:
            runs = ", ".join(f"'{r}'" for r in self.unsplit)
            return (f"not a test of the partition ({size}): in {runs} one process held every agent, so those runs "
                    f"split nothing (agents per process: {split}). Check with more agents or a larger space (the "
                    "spatial partitioner cuts the space's first axis into strips; blocks and rcb cut both), or "
                    "leave a partition out (agentsim check --partition data)")
        extra = ["rows shuffled"]
        if self.resumed_at is not None:
            extra.append(f"resumed at step {self.resumed_at} on W = 2")
        parts = f" ({', '.join(self.partitions)})" if self.partitions else ""
        ws = ", ".join(map(str, self.world_sizes))
        agents = f"\nagents per process once placed: {split}" if split else ""
        skipped = "".join(f"\n{p} partition not checked: {why}" for p, why in self.not_checked.items())
        return f"identical on W = {ws}{parts} ({'; '.join(extra)}): {size}{agents}{skipped}"


def _record(trace: Trace, sim: Simulation, s: Substep) -> None:
    """After substep ``s``: every population (uid-sorted) and env layer, on the first rank."""
    got: dict[str, np.ndarray] = {}
    for name, pop in sim.state.populations.items():
        rows = sim.comm.gather_rows(pop.fields())
        if rows is not None:
            order = torch.argsort(rows[UID])
            got.update({f"{name}.{k}": v[order].cpu().numpy() for k, v in rows.items()})
    if sim.comm.rank == 0:
        got.update({f"env.{k}": v.detach().cpu().numpy() for k, v in sim.state.env.items()})
        trace.append((sim.state.step + 1, s.name, got))


def _traced_run(model: Model, agents: int, steps: int, seed: int, comm: Comm | None = None,
                **options: Any) -> Trace:
    return _counted_run(model, agents, steps, seed, comm, **options)[0]


def _counted_run(model: Model, agents: int, steps: int, seed: int, comm: Comm | None = None,
                 **options: Any) -> tuple[Trace, list[int]]:
    """The run's trace, and the agents each process held once placed."""
    sim = Simulation(model, agents=agents, seed=seed, comm=comm, **options)
    held = torch.zeros(sim.comm.world_size, dtype=torch.int64)
    held[sim.comm.rank] = sum(p.n for p in sim.state.populations.values())
    counts = sim.comm.sum_int64(held).tolist()
    trace: Trace = []
    sim.trace = lambda simulation, s: _record(trace, simulation, s)
    sim.run(steps - sim.state.step)
    return trace, counts


def _first_difference(want: Trace, got: Trace, run: str, hint: str) -> Divergence | None:
    """The first (step, substep, field) where ``got`` differs from ``want`` (aligned by step and substep)."""
    ref = {(step, name): values for step, name, values in want}
    for step, name, values in got:
        expected = ref.get((step, name))
        if expected is None:
            continue
        for key in dict.fromkeys([*expected, *values]):
            a, b = expected.get(key), values.get(key)
            if a is None or b is None:
                return Divergence(run, step, name, key, "present in one run only", hint)
            if a.shape != b.shape:
                pop = key.split(".")[0]
                uid_a, uid_b = expected.get(f"{pop}.uid"), values.get(f"{pop}.uid")
                detail = f"{a.shape[0]} rows on one process, {b.shape[0]} here"
                if uid_a is not None and uid_b is not None:
                    only_a = np.setdiff1d(uid_a, uid_b)[:5].tolist()
                    only_b = np.setdiff1d(uid_b, uid_a)[:5].tolist()
                    detail += f" (uids only on one process: {only_a}; only here: {only_b})"
                return Divergence(run, step, name, key, detail, hint)
            if a.tobytes() != b.tobytes():
                differ = np.nonzero((a != b).reshape(a.shape[0], -1).any(1) if a.ndim else np.array([True]))[0]
                if key.startswith("env."):
                    flat = np.nonzero((a != b).reshape(-1))[0]
                    detail = (f"{flat.size} cells differ, first cell {int(flat[0])}: {a.reshape(-1)[flat[0]]} on "
                              f"one process, {b.reshape(-1)[flat[0]]} here")
                else:
                    uids = expected[f"{key.split('.')[0]}.uid"][differ]
                    first = int(differ[0])
                    detail = (f"{differ.size} agents differ (uids {', '.join(map(str, uids[:5].tolist()))}"
                              f"{' ...' if differ.size > 5 else ''}); uid {int(uids[0])}: {a[first]} on one process, "
                              f"{b[first]} here")
                return Divergence(run, step, name, key, detail, hint)
    return None


HINTS = {
    "shuffled": ("results depend on row order: key draws by uid (ctx.rng), break ties with uid-keyed random keys "
                 "(agentsim.rank_in_group), never by row position; or the model keeps state outside agent fields "
                 "and env layers (a Python variable), so a second run differs from the first"),
    "data": ("a substep reads other agents not through ctx.neighbors (a sum or choice over ctx[pop] rows sees only "
             "this process's agents), or an env write whose combine does not fit (run with check=True / "
             "agentsim run --check for the substep and field)"),
    "spatial": ("with the data partitioner identical and the spatial one not, a substep most likely reads agents "
                "beyond its declared reach: declare a reach that covers every read (run with check=True for the "
                "agents and the distance)"),
    "resumed": ("the run does not continue from its checkpoint: the state must be all in agent fields and env "
                "layers (nothing kept in Python variables between steps)"),
}


def _ranks_job(comm: Comm, model_ref: Any, agents: int, steps: int, seed: int, plans: list[tuple[int, str]],
               resume: tuple[str, int] | None, timeout: float) -> dict[str, tuple[Trace, list[int]]] | None:
    """On a job of max(W) ranks: each (W, partition) of ``plans`` on ranks 0..W-1, then the resume."""
    import torch.distributed as dist

    from agentsim.distributed.comm import TorchComm
    from agentsim.engine.spec import resolve_model

    model = resolve_model(model_ref)
    sizes = sorted({w for w, _ in plans} | ({2} if resume else set()))
    groups = {w: dist.new_group(list(range(w))) for w in sizes if w > 1}  # every rank creates every group
    out: dict[str, tuple[Trace, list[int]]] = {}
    runs: list[tuple[str, int, dict[str, Any]]] = [(f"W = {w}, {p}", w, {"partition": p}) for w, p in plans]
    if resume is not None:
        runs.append((f"resumed at step {resume[1]} on W = 2", 2, {"partition": "data", "resume": resume[0]}))
    for key, w, options in runs:
        if comm.rank < w:
            out[key] = _counted_run(model, agents, steps, seed, TorchComm(group=groups[w]), **options)
        dist.barrier()
    return out if comm.rank == 0 else None


def _spatial_applies(model: Model, agents: int, seed: int, world_size: int) -> tuple[bool, str | None]:
    """Whether every population is placed in a space the spatial partitioner splits on ``world_size``
    processes, and if they are placed but the space cannot be split, why.
    """
    from agentsim.distributed.spatial import check_layout_splits

    sim = Simulation(model, agents=agents, seed=seed)
    field_name = getattr(sim.space, "position_field", None)
    if field_name is None or not all(field_name in p for p in sim.state.populations.values()):
        return False, None
    if field_name == UID:  # a network's nodes: split in uid blocks
        return True, None
    try:
        check_layout_splits(sim.space, "strips", world_size)
    except ConfigError as e:
        return False, str(e).removeprefix("partition 'spatial': ")
    return True, None


def check_model(model: Model | str, agents: int = 1000, steps: int = CHECK_STEPS, seed: int = 1,
                params: Mapping[str, Any] | None = None, world_sizes: Sequence[int] = (1, 2, 3),
                partitions: Sequence[str] | None = None, resume: bool = True, timeout: float = 60.0,
                contract: bool = True) -> CheckReport:
    """Run ``model`` at a small size in the ways listed in the module docstring and compare.

    Args:
        model: A Model, a built-in name or ``"module:ATTR"`` / ``"file.py:ATTR"``.
        agents, steps, seed, params: The run.
        world_sizes: Process counts (1 is the reference; at most 4).
        partitions: ``"data"`` and/or ``"spatial"`` (default: every one that applies).
        resume: Also resume a one-process checkpoint on 2 processes.
        timeout: Seconds a collective waits (a stuck rank fails the check instead of hanging it).
        contract: Run the one-process reference in check mode (False: compare the runs only).

    Returns:
        The :class:`CheckReport`.
    """
    from agentsim.core.catalog import get_model
    from agentsim.engine.spec import model_ref
    from agentsim.runner.launch import run_ranks

    base = get_model(model) if isinstance(model, str) else model
    if not isinstance(base, Model):
        raise ConfigError(f"model: expected a Model or a model name (got {type(model).__name__})")
    configured = base.configure(params=params) if params else base
    sizes = tuple(sorted(set(world_sizes)))
    if not sizes or sizes[0] != 1 or sizes[-1] > 4:
        raise ConfigError(f"world_sizes: expected 1 and up to three more sizes of at most 4 (got {list(world_sizes)})")
    spatial, cannot_split = _spatial_applies(configured, agents, seed, sizes[-1])
    applies = ["data"] + (["spatial"] if spatial else [])
    if partitions is None:
        chosen = tuple(applies)
    else:
        chosen = tuple(partitions)
        for p in chosen:
            if p not in applies:
                why = f": {cannot_split}" if p == "spatial" and cannot_split else ""
                raise ConfigError(f"partition {p!r} does not apply to model '{configured.name}' "
                                  f"(applies: {', '.join(applies)}){why}")
    report = CheckReport(configured.name, agents, steps, len(configured.substeps), sizes,
                         chosen if len(sizes) > 1 else ())
    if cannot_split and partitions is None and len(sizes) > 1:
        report.not_checked["spatial"] = cannot_split
    try:
        reference = _traced_run(configured, agents, steps, seed, check=contract)
    except ContractError as e:
        report.contract = str(e)
        return report
    report.runs.append("rows shuffled")
    found = _first_difference(reference, _traced_run(configured, agents, steps, seed, shuffle_rows=True),
                              "one process, rows shuffled", HINTS["shuffled"])
    if found is not None:
        report.divergence = found
        return report
    multi = [(w, p) for w in sizes if w > 1 for p in chosen]
    if not multi:
        return report
    with tempfile.TemporaryDirectory(prefix="agentsim-check-") as tmp:
        resumed = None
        if resume and steps >= 2:
            half = steps // 2
            sim = Simulation(configured, agents=agents, seed=seed)
            sim.run(half)
            resumed = (sim.save_checkpoint(os.path.join(tmp, "ckpt")), half)
            report.resumed_at = half
        traces = run_ranks(_ranks_job, max(w for w, _ in multi),
                           (model_ref(configured), agents, steps, seed, multi, resumed, timeout), timeout=timeout)[0]
    for key, (trace, counts) in traces.items():
        report.runs.append(key)
        kind = "resumed" if key.startswith("resumed") else key.split(", ")[-1]
        if kind != "resumed":
            report.splits[key] = counts
        found = _first_difference(reference, trace, key, HINTS[kind])
        if found is not None:
            if kind == "spatial" and any(k.endswith("data") and _first_difference(reference, t, k, "") is not None
                                         for k, (t, _) in traces.items()):
                found.hint = HINTS["data"]
            report.divergence = found
            return report
    return report
