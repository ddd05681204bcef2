"""The step loop: runs a model's substeps in order, checks their declarations, times them,
raises error flags once per step, and records metrics and agents to HDF5.

One step applies every substep in order to the state; the state before the first
step is step 0. Metrics are computed at step 0 and after every step; agent fields
at step 0, at the last step and every ``every`` steps.

Examples:
    >>> from agentsim.models.randomwalk import MODEL
    >>> sim = Simulation(MODEL, agents=100, seed=1)
    >>> result = sim.run(steps=3)
    >>> result.metrics["step"].tolist()
    [0, 1, 2, 3]
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor

from . import ops
from .comm import Comm, LocalComm
from .context import Context, NeighborView
from .errors import ConfigError, FieldAccessError, SimulationError, did_you_mean
from .locality import LocalityOrder
from .model import InitContext, MetricsContext, Model
from .random import CounterRNG
from .snapshot import NeighborSnapshots, check_sync_every
from .state import UID, State
from .substep import ENV, Substep


METRIC_FRAC_BITS = 24
# Positions change by a fraction of a cell per step in the built-in models: sorting rows
# every 10 steps keeps most of the locality for a tenth of the sorting cost.
DEFAULT_SORT_EVERY = 10


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


def check_agents(agents: Any) -> int:
    if isinstance(agents, bool) or not isinstance(agents, (int, np.integer)):
        raise ConfigError(f"agents: expected a positive int (got {agents!r})")
    if agents < 1:
        raise ConfigError(f"agents: expected a positive int (got {agents})")
    return int(agents)


@dataclass
class RunResult:
    """What :meth:`Simulation.run` returns.

    Attributes:
        metrics: Name to numpy array ``[steps + 1]`` (index = step), including ``"step"``.
        state: The final state.
        timings: Substep name to mean seconds per step.
        seconds: Wall time of the stepping loop (excludes initialization and step-0 recording).
        path: The HDF5 file written, or None.
    """

    metrics: dict[str, np.ndarray]
    state: State
    timings: dict[str, float]
    seconds: float
    path: str | None = None


@dataclass
class _Recording:
    fields: dict[str, list[str]]      # population -> recorded fields (uid first)
    env: list[str] = field(default_factory=list)


class Simulation:
    """One run of a model: state, RNG, space and the step loop.

    Args:
        model: A :class:`~agentsim.model.Model` (configured or default).
        agents: Number of agents at step 0 (models split it across their populations).
        seed: The run seed; all randomness is a function of (seed, uid, step, stream).
        device: ``"cpu"``, ``"cuda"`` or a torch.device.
        check_nan: Flag NaN in written floating-point fields at every step.
        shuffle_rows: Debug aid: permute every population's rows before each step. Results
            must not change (they never depend on row order); the tests use this.
        sort_every: Sort the rows of populations read through ``neighbors`` by cell every
            this many steps, for memory locality (0: never; see :mod:`agentsim.locality`).
            Changes run time only, never a result.
        sync_every: Refresh what substeps read through ``ctx.neighbors`` every this many
            steps (1: always current, exact; K > 1: stale between refreshes by the rule of
            :mod:`agentsim.snapshot`, the same on any number of ranks).
        comm: Communication for multi-rank runs (default: one process, no collectives).
    """

    def __init__(self, model: Model, agents: int | None = None, seed: int = 0,
                 device: str | torch.device | None = "cpu", *, check_nan: bool = True,
                 shuffle_rows: bool = False, sort_every: int = DEFAULT_SORT_EVERY, sync_every: int = 1,
                 comm: Comm | None = None) -> None:
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
            raise ConfigError(f"seed: expected an int (got {seed!r})")
        self.model = model
        self.n_agents = check_agents(model.default_agents if agents is None else agents)
        self.seed = int(seed)
        self.device = resolve_device(device)
        self.params = dict(model.params)
        self.rng = CounterRNG(self.seed)
        self.comm: Comm = comm or LocalComm()
        self.sync_every = check_sync_every(sync_every)
        self.snapshots = NeighborSnapshots(self.sync_every) if self.sync_every > 1 else None
        self.check_nan = check_nan
        self.shuffle_rows = shuffle_rows
        state, space = model.init(InitContext(self.params, self.n_agents, self.rng, self.device))
        self.state: State = state.to(self.device)
        self.space = space
        model.validate_state(self.state)
        self.locality = LocalityOrder(space, model.substeps, self.params, sort_every)
        self.step_seconds: list[float] = []
        self.substep_seconds: dict[str, list[float]] = {s.name: [] for s in model.substeps}

    # ---------------------------------------------------------------- stepping
    def halo(self, population: str, substep: Substep) -> Mapping[str, Tensor] | None:
        """Halo rows of ``population`` for ``substep`` (none on one process)."""
        return None

    def owned_env(self, name: str) -> Tensor:
        """The env cells this rank owns, flattened (all on one process)."""
        return self.state.env[name].reshape(-1)

    def step(self) -> None:
        """Advance the state by one step (every substep once, in order)."""
        if self._sort_due():
            self.locality.apply(self.state)
        if self.shuffle_rows:  # after the sort, so that the shuffle is what the step sees
            for pop in self.state.populations.values():
                pop.permute(torch.randperm(pop.n, device=self.device))
        flags: list[tuple[str, Tensor]] = []
        sync = self.device.type == "cuda"
        t_step = time.perf_counter()
        for s in self.model.substeps:
            t0 = time.perf_counter()
            flags += self._run_substep(s)
            if sync:
                torch.cuda.synchronize(self.device)
            self.substep_seconds[s.name].append(time.perf_counter() - t0)
        self.state.step += 1
        self._raise_flags(flags)
        self.step_seconds.append(time.perf_counter() - t_step)

    def _sort_due(self) -> bool:
        """Whether :meth:`step` sorts the rows by cell before computing the next step."""
        return self.locality.due(self.state.step)

    def refresh_due(self, s: Substep) -> bool:
        """Whether ``s`` reads current neighbor values in the step being computed (always, unless
        ``sync_every > 1``: then on refresh steps only)."""
        return self.snapshots is None or self.snapshots.due(s, self.state.step + 1)

    def neighbor_view(self, population: str, substep: Substep, fresh: bool = True) -> NeighborView:
        """What ``ctx.neighbors(population)`` returns: current rows and halo, or (``fresh=False``)
        the stored rows of the last refresh."""
        pop = self.state[population]
        fields = substep.neighbors[population]
        if fresh or self.snapshots is None:
            return NeighborView(pop, fields, substep, self.halo(population, substep))
        local, others = self.snapshots.view(substep, population, pop[UID])
        return NeighborView(pop, fields, substep, others, local=local)

    def _store_snapshot(self, s: Substep) -> None:
        assert self.snapshots is not None
        for name, fields in s.neighbors.items():
            rows = self.state[name].select(fields)
            halo = self.halo(name, s)
            if halo is not None:
                rows = {k: torch.cat([v, halo[k].to(v.device)]) for k, v in rows.items()}
            self.snapshots.store(s, name, rows)

    def _run_substep(self, s: Substep) -> list[tuple[str, Tensor]]:
        ctx = Context(self, s)
        if self.snapshots is not None and s.neighbors:
            ctx.fresh = self.refresh_due(s)
            if ctx.fresh:
                self._store_snapshot(s)
        self._call_checked(s, ctx, self.state)
        for pop, dies in ctx._deaths:
            self.state.populations[pop].keep(~dies)
        for pop, parents, fields in ctx._births:
            offset, total = self.comm.birth_offset(parents)
            population = self.state.populations[pop]
            population.spawn(parents, fields, uid_offset=offset, n_born_total=total)
            stored = self.snapshots.fields(pop) if self.snapshots is not None else []
            if stored:  # newborns join the neighbor snapshots with their values at birth, on every rank
                born = {k: population[k][population.n - parents.shape[0]:] for k in stored}
                self.snapshots.add_births(pop, self.comm.all_gather_rows(born))  # type: ignore[union-attr]
        return ctx._flags + self._nan_flags(s)

    def _nan_flags(self, s: Substep) -> list[tuple[str, Tensor]]:
        """With ``check_nan``: a flag per floating-point field ``s`` writes, set if it holds a NaN."""
        flags: list[tuple[str, Tensor]] = []
        if self.check_nan:
            for ref in s.writes:
                pop, key = ref.split(".")
                t = self.state.env[key] if pop == ENV else self.state.populations[pop][key]
                if t.is_floating_point():
                    flags.append((f"{s.name}: NaN in {ref}", torch.isnan(t).any()))
        return flags

    def _call_checked(self, s: Substep, ctx: Context, state: State) -> None:
        """Call ``s(ctx)`` on ``state`` and raise if it modified a read-only tensor in place."""
        versions = self._read_only_versions(s, state)
        s(ctx)
        for (pop, key), (tensor_id, version) in versions.items():
            t = state.env[key] if pop == ENV else state.populations[pop][key]
            if id(t) == tensor_id and t._version != version:
                raise FieldAccessError(
                    f"substep '{s.name}' modified '{pop}.{key}' in place but does not declare it in writes="
                )

    def _read_only_versions(self, s: Substep, state: State) -> dict[tuple[str, str], tuple[int, int]]:
        """Version counters of the tensors ``s`` may read but not write (in-place write detection)."""
        out: dict[tuple[str, str], tuple[int, int]] = {}
        for name, pop in state.populations.items():
            if not s.touches(name):
                continue
            writable = s.writable(name)
            for key in s.readable(name):
                if key not in writable and key in pop:
                    t = pop[key]
                    out[(name, key)] = (id(t), t._version)
        for key in s.readable(ENV) - {"uid"} - s.writable(ENV):
            if key in state.env:
                t = state.env[key]
                out[(ENV, key)] = (id(t), t._version)
        return out

    def _raise_flags(self, flags: list[tuple[str, Tensor]]) -> None:
        if not flags:
            self.comm.any_flags(torch.zeros(0, dtype=torch.bool, device=self.device))
            return
        self._raise_if_flagged(flags, self.comm.any_flags(torch.stack([f for _, f in flags])))

    def _raise_if_flagged(self, flags: list[tuple[str, Tensor]], raised: Tensor) -> None:
        """Raise a SimulationError naming the flags whose entry of ``raised`` (``[len(flags)]``
        bool, already OR-ed over ranks) is set, and the current step."""
        if bool(raised.any()):
            names = [name for (name, _), v in zip(flags, raised.tolist()) if v]
            raise SimulationError(f"step {self.state.step}: " + "; ".join(names))

    # ---------------------------------------------------------------- metrics
    def metrics(self) -> dict[str, int | float]:
        """Global metrics of the current state.

        The model's ``metrics`` function returns per-agent values (any shape); each is
        summed here over agents and ranks exactly: integers and bools in int64, floats in
        int64 fixed point with :data:`METRIC_FRAC_BITS` fractional bits, so the result has
        the same bits on any number of ranks. ``derive`` then computes ratios from the sums.
        """
        names, is_float, sums = self._local_metric_sums()
        return self._metrics_from(names, is_float, self.comm.sum_int64(sums))

    def _local_metric_sums(self) -> tuple[list[str], list[bool], Tensor]:
        """This rank's exact metric sums: names, which are floats, and ``[k]`` int64 on CPU
        (floats in fixed point)."""
        local: dict[str, Tensor] = {f"n_{name}": torch.tensor(pop.n, device=self.device) for name, pop in self.state.populations.items()}
        if self.model.metrics_fn is not None:
            local.update(self.model.metrics_fn(
                MetricsContext(self.state, self.params, self.space, self.state.step, self.owned_env)))
        names = list(local)
        is_float = [local[k].is_floating_point() for k in names]
        sums = torch.stack([
            ops.to_fixed(local[k].to(torch.float64), METRIC_FRAC_BITS).sum() if f
            else local[k].to(torch.int64).sum()
            for k, f in zip(names, is_float)
        ]).cpu()
        return names, is_float, sums

    def _metrics_from(self, names: list[str], is_float: list[bool], sums: Tensor) -> dict[str, int | float]:
        """Metrics from the global sums ``[k]`` int64 of :meth:`_local_metric_sums`."""
        out: dict[str, int | float] = {"step": self.state.step}
        for k, f, v in zip(names, is_float, sums.tolist()):
            out[k] = v * 2.0 ** -METRIC_FRAC_BITS if f else v
        if self.model.derive_fn is not None:
            out.update(self.model.derive_fn(dict(out)))
        return out

    # ---------------------------------------------------------------- running
    def record_spec(self, record: Iterable[str] | None) -> _Recording:
        """Resolve ``record`` (``"pop"``, ``"pop.field"``, ``"field"``, ``"env.name"``; None = all)."""
        pops = self.state.populations
        if record is None:
            return _Recording({p: list(pops[p].specs) for p in pops}, list(self.state.env))
        rec = _Recording({})
        for item in record:
            item = item.strip()
            if not item:
                continue
            if item in pops:
                rec.fields[item] = list(pops[item].specs)
            elif item == ENV:
                rec.env = list(self.state.env)
            elif "." in item:
                p, f = item.split(".", 1)
                if p == ENV:
                    if f not in self.state.env:
                        raise ConfigError(f"record: unknown env field '{f}' (valid: {sorted(self.state.env)})")
                    rec.env.append(f)
                    continue
                if p not in pops or f not in pops[p].specs:
                    valid = [f"{q}.{g}" for q in pops for g in pops[q].specs]
                    raise ConfigError(f"record: unknown field '{item}' (valid: {', '.join(valid)})."
                                      + did_you_mean(item, valid))
                rec.fields.setdefault(p, []).append(f)
            else:
                owners = [p for p in pops if item in pops[p].specs]
                if not owners:
                    valid = sorted({g for q in pops for g in pops[q].specs} | set(pops))
                    raise ConfigError(f"record: unknown field or population '{item}' (valid: {', '.join(valid)})."
                                      + did_you_mean(item, valid))
                for p in owners:
                    rec.fields.setdefault(p, []).append(item)
        for p, fs in rec.fields.items():
            rec.fields[p] = [UID] + [f for f in dict.fromkeys(fs) if f != UID]
        return rec

    def run(self, steps: int, out: str | os.PathLike | None = None, *, record: Iterable[str] | None = None,
            every: int | None = None, progress: bool = False) -> RunResult:
        """Run ``steps`` steps; optionally stream a trajectory to the HDF5 file ``out``.

        Args:
            steps: Number of steps (>= 0).
            out: HDF5 path, or None to keep metrics in memory only.
            record: Agent/env fields to record (default all).
            every: Also record agents every ``every`` steps (default: first and last only).
            progress: Show a progress bar (only when stderr is a terminal).
        """
        if isinstance(steps, bool) or not isinstance(steps, (int, np.integer)) or steps < 0:
            raise ConfigError(f"steps: expected an int >= 0 (got {steps!r})")
        if every is not None and (isinstance(every, bool) or not isinstance(every, int) or every < 1):
            raise ConfigError(f"every: expected an int >= 1 (got {every!r})")
        rec = self.record_spec(record)
        writer = None
        # With several ranks, rank 0 writes the file; the others take part in its gathers.
        gathers = out is not None
        if out is not None and self.comm.rank == 0:
            from .io.hdf5 import TrajectoryWriter

            writer = TrajectoryWriter(out, model=self.model.name, params=self.params, seed=self.seed,
                                      steps=int(steps), world_size=self.comm.world_size)
        rows: list[dict[str, int | float]] = []
        start = self.state.step
        t_run = 0.0
        try:
            self._record(writer, rows, rec, agents=True, gathers=gathers)
            bar = _progress(steps, progress)
            t0 = time.perf_counter()
            for _ in range(steps):
                self.step()
                done = self.state.step - start
                self._record(writer, rows, rec,
                             agents=done == steps or (every is not None and done % every == 0), gathers=gathers)
                if bar is not None:
                    bar.update(1)
            t_run = time.perf_counter() - t0
            if bar is not None:
                bar.close()
        except BaseException:
            if writer is not None:
                writer.close(completed=False)
            raise
        timings = {k: float(np.mean(v)) if v else 0.0 for k, v in self.substep_seconds.items()}
        self.model.timings = timings
        if writer is not None:
            writer.close(completed=True)
        metrics = {k: np.asarray([r[k] for r in rows]) for k in rows[0]}
        return RunResult(metrics, self.state, timings, t_run, None if out is None else os.fspath(out))

    def perf_row(self) -> dict[str, float]:
        """The ``/perf`` row of the last step (machine-dependent figures: seconds, bytes)."""
        perf = {"step_seconds": self.step_seconds[-1]}
        perf.update({f"substep_seconds/{k}": v[-1] for k, v in self.substep_seconds.items() if v})
        return perf

    def _record(self, writer: Any, rows: list[dict[str, int | float]], rec: _Recording, agents: bool,
                gathers: bool = True) -> None:
        """Metrics (every rank), then, when recording, the file rows. ``gathers``: a file is
        being written by some rank, so every rank takes part in the agent gathers."""
        m = self.metrics()
        rows.append(m)
        if writer is None and not gathers:
            return
        step = self.state.step
        if writer is not None:
            writer.write_metrics(step, {k: v for k, v in m.items() if k != "step"})
            if self.step_seconds and step > 0:
                writer.write_perf(step, self.perf_row())
        if agents:
            for p, fs in rec.fields.items():
                gathered = self.comm.gather_rows({f: self.state.populations[p][f] for f in fs})
                if gathered is not None and writer is not None:
                    writer.write_agents(step, p, gathered)
            if rec.env and writer is not None:
                writer.write_env(step, {k: self.state.env[k] for k in rec.env})


def _progress(total: int, enabled: bool) -> Any:
    import sys

    if not enabled or total < 1 or not sys.stderr.isatty():
        return None
    from tqdm import tqdm

    return tqdm(total=total, unit="step", leave=False)
