"""What a run records, and the :class:`Recorder` that writes it to a trajectory file.

The engine hands the recorder one row of metrics per step (a vector metric's value a numpy
array ``[K]``, with the same K at every step: checked here; a histogram's edges go into the
file), one of ``/perf`` figures per step after step 0 and, on frame steps, the agents and
environment layers gathered on rank 0 by the partitioner. Agent frames are written at step 0, at the last step and
every ``every`` steps. Only rank 0 writes; the other ranks take part in the gathers.

:func:`recording` resolves which fields to record: ``"pop"`` (every field of a
population), ``"pop.field"``, ``"field"`` (that field of every population that has it),
``"env"`` (every layer) or ``"env.name"``; None records everything.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from torch import Tensor

from agentsim.core.state import UID, State
from agentsim.core.substep import ENV
from agentsim.errors import ConfigError, did_you_mean
from agentsim.io.hdf5 import TrajectoryWriter
from agentsim.space.continuous import Box
from agentsim.space.graph import Graph
from agentsim.space.grid import Grid
from agentsim.space.line import Line

__all__ = ["FLUSH_SECONDS", "Frame", "Recorder", "Recording", "recording", "space_record"]

# Seconds between flushes of a run's trajectory file (and at every checkpoint): a run killed at
# any moment leaves a readable file with every step up to the last flush. Runs write without
# compression: appending rewrites the last chunk of every dataset in place, and a kill during
# that rewrite left 2 of 4 gzip files unreadable ("filter returned failure") in
# benchmarks/stress_writer_kills.py; uncompressed chunks rewrite the flushed rows with the same
# bytes.
FLUSH_SECONDS = 1.0


@dataclass
class Recording:
    """The fields a run records.

    Attributes:
        fields: Population to recorded fields (``uid`` first).
        env: Recorded environment layers.
    """

    fields: dict[str, list[str]]
    env: list[str] = field(default_factory=list)


@dataclass
class Frame:
    """One frame gathered on rank 0: population to field to rows (CPU), and env layers."""

    agents: dict[str, dict[str, Tensor]]
    env: dict[str, Tensor]


def recording(state: State, record: Iterable[str] | None) -> Recording:
    """Resolve ``record`` against ``state`` (see the module docstring).

    Raises:
        ConfigError: An unknown population, field or env layer, with the valid names.
    """
    pops = state.populations
    if record is None:
        return Recording({p: [UID] + [f for f in pops[p].specs if f != UID] for p in pops}, list(state.env))
    if isinstance(record, str):
        record = record.split(",")
    rec = Recording({})
    for item in record:
        item = item.strip()
        if not item:
            continue
        if item in pops:
            rec.fields[item] = list(pops[item].specs)
        elif item == ENV:
            rec.env = list(state.env)
        elif "." in item:
            p, f = item.split(".", 1)
            if p == ENV:
                if f not in state.env:
                    raise ConfigError(f"record: unknown env field '{f}' (valid: {sorted(state.env)})")
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
    rec.env = list(dict.fromkeys(rec.env))
    return rec


def _shape(value: Any) -> tuple[int, ...]:
    """The shape of a metric value: ``()`` for a number, ``(K,)`` for a vector."""
    if isinstance(value, (int, float)):
        return ()
    shape = getattr(value, "shape", None)
    return tuple(shape) if shape is not None else tuple(np.shape(value))


def _shape_text(shape: tuple[int, ...]) -> str:
    if not shape:
        return "a scalar"
    return f"a vector of {shape[0]} entries" if len(shape) == 1 else f"shape {list(shape)}"


def check_every(every: object, name: str = "every") -> int | None:
    """Validate ``every`` (None, or an int >= 1); ``name`` for the message."""
    if every is not None and (isinstance(every, bool) or not isinstance(every, int) or every < 1):
        raise ConfigError(f"{name}: expected an int >= 1 (got {every!r})")
    return every


def space_record(space: object) -> dict[str, Any] | None:
    """What a trajectory file records of a model's space (its root attribute ``space``, JSON), so
    that figures draw it from the file alone: ``{"kind": "grid", "shape": [h, w], "periodic": ...}``,
    ``{"kind": "box", "size": [...], "periodic": ...}``, ``{"kind": "graph", "nodes": n}``,
    ``{"kind": "line", "length": L, "periodic": ..., "cells": ...}``; None for
    no space or another kind.
    """
    if isinstance(space, Grid):
        return {"kind": "grid", "shape": [int(x) for x in space.shape], "periodic": bool(space.periodic)}
    if isinstance(space, Box):
        return {"kind": "box", "size": [float(x) for x in space.size], "periodic": bool(space.periodic)}
    if isinstance(space, Graph):
        return {"kind": "graph", "nodes": int(space.n_nodes)}
    if isinstance(space, Line):
        length = int(space.length) if space.cells else float(space.length)
        return {"kind": "line", "length": length, "periodic": bool(space.periodic), "cells": bool(space.cells)}
    return None


class Recorder:
    """Writes one run's rows and frames (see the module docstring).

    Args:
        out: The HDF5 path, or None (nothing is written and no rank gathers frames).
        spec: What to record.
        rank: This rank (only rank 0 opens the file).
        every: Also record agents every this many steps (default: the first and last step only).
        continue_before: Continue the existing file ``out`` of the run this one resumes, from this
            step (its rows and frames from there on are dropped and written again).
        header: The file's root attributes: ``model``, ``params``, ``seed``, ``steps``, ``world_size``;
            and ``display``, how each metric is drawn (:class:`~agentsim.io.hdf5.TrajectoryWriter`).
    """

    def __init__(self, out: str | os.PathLike[str] | None, spec: Recording, rank: int, every: int | None = None,
                 continue_before: int | None = None, **header: Any) -> None:
        self.path = None if out is None else os.fspath(out)
        self.spec = spec
        self.every = check_every(every)
        self.writer: TrajectoryWriter | None = None
        self._shapes: dict[str, tuple[int, ...]] | None = None  # each metric's shape in the first row
        self._first_step = 0
        self._flushed: float | None = None  # monotonic time of the last flush
        if out is not None and rank == 0:
            self.writer = TrajectoryWriter(out, compression=None, **header) if continue_before is None else \
                TrajectoryWriter.continue_file(out, before=continue_before, **header)

    @property
    def gathers(self) -> bool:
        """Whether frames are gathered (some rank writes a file)."""
        return self.path is not None

    def frame_due(self, done: int, steps: int) -> bool:
        """Whether agents are recorded after ``done`` of the run's ``steps`` steps (always at 0 and
        at the end, and every ``every`` steps).
        """
        return self.gathers and (done == 0 or done == steps or (self.every is not None and done % self.every == 0))

    def write_row(self, step: int, metrics: Mapping[str, Any], perf: Mapping[str, float] | None) -> None:
        """The metrics of ``step`` (without ``step``), and its ``/perf`` figures (none at step 0).

        Every rank checks the row (the same on every rank): each metric keeps the shape of the
        run's first row.

        Raises:
            ConfigError: A metric's shape changed (a vector metric's K, or a scalar that became
                a vector), naming the metric.
        """
        self._check_shapes(step, metrics)
        if self.writer is None:
            return
        values = {k: v for k, v in metrics.items() if k != "step"}
        edges = {k: e for k, v in values.items()
                 if isinstance(v, np.ndarray) and v.ndim == 1 and (e := getattr(v, "edges", None))}
        self.writer.write_metrics(step, values, edges=edges or None)
        if perf is not None:
            self.writer.write_perf(step, perf)

    def _check_shapes(self, step: int, metrics: Mapping[str, Any]) -> None:
        shapes = {k: _shape(v) for k, v in metrics.items() if k != "step"}
        if self._shapes is None:
            self._shapes, self._first_step = shapes, step
            return
        for name, shape in shapes.items():
            want = self._shapes.get(name)
            if want is not None and shape != want:
                raise ConfigError(
                    f"metric '{name}': expected {_shape_text(want)} at every step, as at step {self._first_step} "
                    f"(got {_shape_text(shape)} at step {step}); a vector metric returns [n, K] with the same K on "
                    "every rank and at every step ([0, K] on a rank without agents)")

    def write_frame(self, step: int, frame: Frame | None) -> None:
        """A frame gathered on rank 0 (None on the other ranks)."""
        if self.writer is None or frame is None:
            return
        for population, rows in frame.agents.items():  # (a field of no columns, [n, 0], has nothing to record)
            self.writer.write_agents(step, population, {k: v for k, v in rows.items() if 0 not in v.shape[1:]})
        if frame.env:
            self.writer.write_env(step, frame.env)

    def flush(self, force: bool = False) -> None:
        """Put everything written so far into the file on disk (a run killed later keeps it): when
        ``force``d, on the first call, and then at most every :data:`FLUSH_SECONDS` (a flush costs
        about 28 ms on the development machine, several times a fast model's step).
        """
        if self.writer is None:
            return
        now = time.monotonic()
        if force or self._flushed is None or now - self._flushed >= FLUSH_SECONDS:
            self.writer.flush()
            self._flushed = now

    def write_perf_attrs(self, figures: Mapping[str, float]) -> None:
        """Figures of the whole run, kept as attributes of the file's ``/perf`` (rank 0 writes)."""
        if self.writer is not None and figures:
            self.writer.write_perf_attrs(figures)

    def close(self, completed: bool) -> None:
        """Close the file; ``completed`` marks a run that finished."""
        if self.writer is not None:
            self.writer.close(completed=completed)
