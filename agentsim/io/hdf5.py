"""Trajectories streamed to HDF5 during a run, readable with plain h5py.

File format ``agentsim-trajectory``, version 2 (the contract; readers check both; version 1 is
the same without the ``checksums`` datasets):

Root attributes (every string a fixed-length UTF-8 string, ``bytes`` in h5py):
    ``format`` = ``"agentsim-trajectory"``; ``format_version`` = 2; ``model`` (str);
    ``params`` (JSON str); ``seed`` (int); ``steps`` (int, the number requested);
    ``steps_completed`` (int: the largest step in ``/metrics``, updated as the run
    goes, each time metric rows reach the file); ``agents`` (int, the run's agents at the start, in files
    written by runs); ``world_size`` (int); ``versions`` (JSON str with keys ``agentsim``,
    ``torch``, ``numpy``, ``h5py``, ``python``); ``completed`` (bool, False until the
    writer is closed with ``completed=True``).

``/metrics``:
    ``step`` int64 ``[T]`` and one dataset ``[T]`` per scalar metric, ``[T, K]`` per
    vector metric (K entries per row, fixed by the first row; int64 for integer values,
    float64 otherwise), one row per :meth:`TrajectoryWriter.write_metrics` call. A
    histogram metric's dataset has the attribute ``edges`` (float64 ``[K + 1]``, the bin
    edges, ``-inf`` / ``inf`` for open-ended bins). A metric whose model declares how it is
    drawn has the attribute ``display`` (a JSON str of the declared entries of
    :class:`~agentsim.core.metrics.Display`: ``label``, ``color``, ``panel``, ``share_of``,
    ``limits``, ``unit``; optional: files without it plot with generic panels). A name
    containing ``/`` is a nested group (``infected/young``). ``checksums`` uint32 ``[T]``: each
    row's CRC-32 (:func:`agentsim.io.checksums.row_checksums`).

``/agents/<population>``:
    ``step`` int64 ``[K]``: the step of each recorded frame; ``offsets`` int64
    ``[K + 1]``: the rows of frame ``k`` are ``offsets[k]:offsets[k + 1]`` of every
    other dataset; ``uid`` int64 ``[R]``; ``<field>`` ``[R, *field_shape]`` with the
    field's dtype (bool as HDF5 enum, read back as numpy bool). Within a frame rows are
    sorted by ``uid``, so populations whose size changes (births, deaths) are stored
    frame by frame. ``checksums`` uint32 ``[K, F]``: the CRC-32 of each frame's step and each
    field's rows, fields in sorted order (:func:`agentsim.io.checksums.frame_checksums`).
    ``step``, ``offsets`` and ``checksums`` are therefore not allowed as field names.

``/env``:
    ``step`` int64 ``[K_env]`` and ``<name>`` ``[K_env, *shape]``: environment layers
    (a grass grid, a field over cells) on recorded frames; ``checksums`` ``[K_env, L]`` as for
    a population.

``/perf``:
    ``step`` int64 ``[T_perf]``, ``checksums`` as for metrics, and ``<name>`` float64 ``[T_perf]`` (e.g.
    ``step_seconds``, ``substep_seconds/move``): machine-dependent figures. Everything
    outside ``/perf`` and the ``versions`` attribute is a function of (model, params,
    seed), so ``/agents``, ``/env`` and ``/metrics`` of two such runs are bitwise
    comparable.

The file is in HDF5's v110 format, written in single-writer / multiple-reader (SWMR) mode from its
creation, so other processes read it while it is written (:mod:`agentsim.io.live`).

Every series is an extendable dataset (``maxshape=(None, ...)``), chunked along the
first axis in chunks of about 64 KiB and compressed (gzip level 4 with the shuffle
filter by default; runs write uncompressed, see :mod:`agentsim.io.recording`: a
compressed chunk rewritten in place when a killed writer is interrupted corrupts the
rows already flushed to it). Agent and env frames are written when given, with one resize per
dataset per call. Metric and perf rows (one small row per step, where h5py's per-call
cost would dominate a fast model) are held in memory and written in batches: every
256 rows, when 10 s have passed since the last batch, and on ``flush()`` and
``close()``; the writer closes on exceptions, so a failed run keeps its rows.

Examples:
    >>> import os, tempfile, torch
    >>> path = os.path.join(tempfile.mkdtemp(), "run.h5")
    >>> with TrajectoryWriter(path, model="demo", params={"beta": 0.1}, seed=1, steps=1) as w:
    ...     w.write_metrics(0, {"n_sheep": 3})
    ...     w.write_agents(0, "sheep", {"uid": torch.tensor([7, 2, 5]), "energy": torch.tensor([0.5, 1.0, 2.0])})
    ...     w.close(completed=True)
    >>> traj = read_trajectory(path)
    >>> traj.attrs["completed"], traj.metrics["n_sheep"].tolist()
    (True, [3])
    >>> frame = traj.agents("sheep", "energy")
    >>> frame["uid"].tolist(), frame["energy"].tolist()
    ([2, 5, 7], [1.0, 2.0, 0.5])
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import json
import math
import os
import platform
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

import h5py
import numpy as np
import torch
from torch import Tensor

from agentsim.core.metrics import Display
from agentsim.errors import AgentsimError, ConfigError, OutputError, did_you_mean, write_cause
from agentsim.io.checksums import CHECKSUMS, first_mismatch, frame_checksum, frame_checksums, row_checksums
from agentsim.io.faults import FailingFile, Fault, write_fault
from agentsim.io.h5check import check_regular, check_self_contained
from agentsim.io.live import (
    CHUNK_CACHE_BYTES,
    LIBVER,
    bound_caches,
    open_to_read,
    reopen_to_write,
    reopen_unshared,
    share,
)
from agentsim.io.locks import process_exists, special_file

__all__ = ["FORMAT", "FORMAT_VERSION", "Trajectory", "TrajectoryWriter", "read_trajectory"]

FORMAT = "agentsim-trajectory"
FORMAT_VERSION = 2
CHECKSUMS_SINCE = 2  # the first format version with /.../checksums datasets
COMPRESSIONS = ("gzip", "lzf", None)
_CHUNK_BYTES = 65536
_GZIP_LEVEL = 4
_RESERVED_AGENT_NAMES = ("step", "offsets", CHECKSUMS)
_RESERVED_SERIES_NAMES = ("step", CHECKSUMS)  # of metrics, perf and env
_BUFFER_ROWS = 256  # metric / perf rows held in memory before a write ...
_BUFFER_SECONDS = 10.0  # ... or after this long since the last write

_F = TypeVar("_F", bound=Callable[..., Any])


# --------------------------------------------------------------------------- helpers
def _remove_stale_temporaries(directory: str, name: str) -> None:
    """Remove ``.NAME.creatingPID`` files left by writers of ``name`` killed before their first
    flush (their process is gone; a live writer's file is kept).
    """
    prefix = f".{name}.creating"
    try:
        entries = os.listdir(directory)
    except OSError:
        return
    for entry in entries:
        pid = entry[len(prefix):]
        if not (entry.startswith(prefix) and pid.isdigit()):
            continue
        if not process_exists(int(pid)):
            with contextlib.suppress(OSError):
                os.remove(os.path.join(directory, entry))


# HDF5 writes data when a handle is released too (a dataset's chunk cache on its last close), and
# h5py reports errors there only as "Exception ignored in ObjectID.__dealloc__". Files being written
# are watched: such an error naming one is kept for its writer (which raises it at its next call)
# instead of printed; errors about other files go on to the previous hook.
_watched: dict[str, list[str]] = {}
_hook_installed = False


def _unraisable(info: Any) -> None:
    value = info.exc_value
    if isinstance(value, (RuntimeError, OSError)):
        text = str(value)
        for name, errors in list(_watched.items()):
            if name in text:
                errors.append(text)
                return
    _previous_hook(info)


_previous_hook = sys.unraisablehook


def watch_file(names: Iterable[str], errors: list[str]) -> None:
    """Keep h5py's swallowed errors about ``names`` in ``errors`` (see :data:`_watched`)."""
    global _hook_installed, _previous_hook
    if not _hook_installed:
        _previous_hook, sys.unraisablehook = sys.unraisablehook, _unraisable
        _hook_installed = True
    for name in names:
        _watched[name] = errors


def unwatch_file(names: Iterable[str]) -> None:
    for name in names:
        _watched.pop(name, None)


def open_for_writing(path: str, mode: str, fault: Fault | None, **kwargs: Any) -> h5py.File:
    """``h5py.File(path, mode, **kwargs)`` as every agentsim writer opens its file: HDF5's v110
    format (for SWMR) and bounded caches (:mod:`agentsim.io.live`); through a
    :class:`~agentsim.io.faults.FailingFile` when a write fault is injected (a test hook, see
    :mod:`agentsim.io.faults`).
    """
    kwargs = {"libver": LIBVER, "rdcc_nbytes": CHUNK_CACHE_BYTES, **kwargs}
    if fault is None:
        return bound_caches(h5py.File(path, mode, **kwargs))
    raw = FailingFile(path, "w+b" if mode == "w" else "r+b", fault)
    file = h5py.File(raw, mode, **kwargs)
    file.agentsim_failing = raw  # the test hook's file, for its error
    return bound_caches(file)


def detach_file(file: h5py.File) -> None:
    """Send every later write of ``file`` to nowhere (see :meth:`TrajectoryWriter._abandon`)."""
    injected = getattr(file, "agentsim_failing", None)
    if injected is not None:
        injected.discard = True
        return
    with contextlib.suppress(Exception):
        raw = file.id.get_vfd_handle()
        if isinstance(raw, int):
            null = os.open(os.devnull, os.O_RDWR)
            try:
                os.dup2(null, raw)
            finally:
                os.close(null)


def injected_error(file: Any, e: BaseException) -> BaseException:
    """The error injected by the test hook into ``file`` if any (HDF5 reports only "driver write
    request failed" for it), else ``e``.
    """
    raw = getattr(file, "agentsim_failing", None)
    return raw.fault.tripped if raw is not None and raw.fault.tripped is not None else e


def _io_errors(method: _F) -> _F:
    """Make every h5py / OS failure inside a writer method fatal: an OutputError naming the file
    and the cause; the writer is broken from then on (each later call raises the same error, and
    :meth:`TrajectoryWriter.close` abandons the file, never marking it completed).
    """

    @functools.wraps(method)
    def wrapper(self: TrajectoryWriter, *args: Any, **kwargs: Any) -> Any:
        if self._error is not None:
            if method.__name__ == "close":
                return method(self, *args, **kwargs)
            raise OutputError(str(self._error))
        try:
            out = method(self, *args, **kwargs)
        except AgentsimError:
            raise
        except (OSError, RuntimeError) as e:  # h5py raises RuntimeError for failed flushes and closes
            raise self._fail(self._cause(e)) from e
        if self._swallowed:
            raise self._fail(write_cause(RuntimeError(self._swallowed[0])))
        return out

    return cast(_F, wrapper)


def _json_default(value: Any) -> Any:
    if isinstance(value, Tensor):
        return value.tolist()
    if isinstance(value, (np.ndarray, np.generic)):
        return value.tolist()
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if isinstance(value, (set, frozenset)):
        return sorted(value)
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def _versions() -> dict[str, str]:
    from agentsim._version import __version__

    return {
        "agentsim": __version__,
        "torch": torch.__version__,
        "numpy": np.__version__,
        "h5py": h5py.__version__,
        "python": platform.python_version(),
    }


def fixed_text(value: str) -> np.ndarray:
    """``value`` as a fixed-length UTF-8 string attribute: kept in its object's header, which HDF5's
    v110 format checksums (a variable-length string sits in a heap no checksum covers, where a
    flipped bit can make HDF5 loop for ever). h5py reads it back as ``bytes`` (:func:`attr_value`
    decodes it).
    """
    data = value.encode()
    return np.array(data, dtype=h5py.string_dtype("utf-8", max(1, len(data))))


def _check_int(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ConfigError(f"{name}: expected an int >= {minimum} (got {value!r})")
    return int(value)


def _check_name(kind: str, name: Any, nested: bool) -> str:
    """Names become HDF5 paths: no empty parts; ``/`` only where nesting is allowed."""
    if not isinstance(name, str) or not name:
        raise ConfigError(f"{kind} name: expected a non-empty str (got {name!r})")
    parts = name.split("/")
    if (not nested and len(parts) > 1) or any(p in ("", ".", "..") for p in parts):
        rule = "parts separated by single '/'" if nested else "no '/'"
        raise ConfigError(f"{kind} name {name!r}: expected a non-empty str with {rule}")
    return name


def _check_names(kind: str, expected: Sequence[str] | None, got: Iterable[str]) -> None:
    if expected is None:
        return
    got_set, exp_set = set(got), set(expected)
    if got_set != exp_set:
        missing, extra = sorted(exp_set - got_set), sorted(got_set - exp_set)
        raise ConfigError(
            f"{kind}: expected the names of the first write {sorted(exp_set)} (missing {missing}, unexpected {extra})"
        )


def _metric_value(name: str, value: Any) -> int | float | np.ndarray:
    """A metric value: a Python int or float (0-d, or a number), or a vector ``[K]`` (``K >= 1``,
    a 1-D tensor, array, list or tuple of numbers) as an int64 or float64 array.
    """
    if isinstance(value, Tensor):
        if value.dim() == 0:
            return _scalar("metric", name, value)
        value = _to_numpy(f"metric '{name}'", value)
    elif isinstance(value, (list, tuple)):
        value = np.asarray(value)
    if not isinstance(value, np.ndarray) or value.ndim == 0:
        return _scalar("metric", name, value)
    if value.ndim != 1 or value.size == 0 or value.dtype.kind not in "biuf":
        raise ConfigError(f"metric '{name}': expected a scalar or a vector [K] of K >= 1 numbers (got an array of "
                          f"{value.dtype} and shape {list(value.shape)})")
    return value.astype(np.float64 if value.dtype.kind == "f" else np.int64, copy=False)


def _shape_text(shape: tuple[int, ...]) -> str:
    return "a scalar" if not shape else f"a vector of {shape[0]} entries"


def _scalar(kind: str, name: str, value: Any) -> int | float:
    """A metric or perf value as a Python int or float."""
    if isinstance(value, Tensor):
        if value.numel() != 1:
            raise ConfigError(f"{kind} '{name}': expected a scalar (got a tensor of shape {list(value.shape)})")
        value = value.item()
    elif isinstance(value, np.ndarray):
        if value.size != 1:
            raise ConfigError(f"{kind} '{name}': expected a scalar (got an array of shape {list(value.shape)})")
        value = value.item()
    elif isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, (int, float)):
        return value
    raise ConfigError(f"{kind} '{name}': expected an int, float or scalar tensor (got {type(value).__name__})")


def _to_numpy(kind: str, value: Any) -> np.ndarray:
    if isinstance(value, Tensor):
        t = value.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        try:
            return t.numpy()
        except TypeError:
            raise ConfigError(
                f"{kind}: dtype {value.dtype} has no numpy/HDF5 equivalent; convert it (e.g. to float32) first"
            ) from None
    if isinstance(value, np.ndarray):
        return value
    raise ConfigError(f"{kind}: expected a tensor or numpy array (got {type(value).__name__})")


@dataclass
class _ScalarSeries:
    """A series of small rows (metrics, perf): rows buffered in memory, written in batches. A
    metric is a scalar or a vector (``shapes``: ``()`` or ``(K,)``, fixed by the first row).
    """

    group: h5py.Group
    names: tuple[str, ...] = ()
    last_step: int | None = None
    steps: list[int] = field(default_factory=list)
    rows: list[tuple[int | float | np.ndarray, ...]] = field(default_factory=list)
    is_created: bool = False
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    edges: dict[str, tuple[float, ...]] = field(default_factory=dict)  # histogram edges, stored with the rows


@dataclass
class _Series:
    """The datasets of one group appended together (metrics, env, perf, one population)."""

    group: h5py.Group
    names: tuple[str, ...] = ()
    dtypes: dict[str, np.dtype] = field(default_factory=dict)
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    last_step: int | None = None
    n_rows: int = 0  # rows of the per-agent datasets (populations only)


# --------------------------------------------------------------------------- writer
class TrajectoryWriter:
    """Stream one run to an HDF5 file in the ``agentsim-trajectory`` format (see module doc).

    Args:
        path: File to create. It is written under a temporary name in the same directory
            (``.NAME.creatingPID``) and renamed to ``path`` by the first :meth:`flush` or
            :meth:`close`; an existing ``path`` is replaced then.
        model: Model name.
        params: Resolved parameters; stored as JSON (tensors and arrays as lists).
        seed: Run seed.
        steps: Number of steps requested.
        world_size: Number of ranks of the run.
        compression: ``"gzip"`` (level 4, with shuffle), ``"lzf"`` or None.
        overwrite: Replace an existing file; if False an existing ``path`` is an error.
        display: Metric name to how a figure draws it (the entries of
            :meth:`Display.as_dict <agentsim.core.metrics.Display.as_dict>`), stored as the
            ``display`` attribute of the metric's dataset; names without rows are ignored.

    Raises:
        ConfigError: A bad argument (checked before the file is touched).
        OutputError: The file cannot be created: missing directory, no permission, an
            existing file with ``overwrite=False``.

    Steps passed to the ``write_*`` methods must increase strictly within each series
    (metrics, each population, env, perf). As a context manager the writer closes on
    exit: with ``completed=False`` if an exception escapes, with ``completed=True`` on
    a normal exit, and not at all if :meth:`close` was already called.

    Every write failure (a full disk, a lost mount) is fatal: the method raises an
    :class:`~agentsim.errors.OutputError` naming the file and the cause, every later call raises
    it again, and closing gives the file up with ``completed = False``.
    """

    _names: list[str]
    _error: OutputError | None

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        model: str,
        params: Mapping[str, Any],
        seed: int,
        steps: int,
        world_size: int = 1,
        compression: str | None = "gzip",
        overwrite: bool = True,
        display: Mapping[str, Mapping[str, Any]] | None = None,
        space: Mapping[str, Any] | None = None,
        agents: int | None = None,
    ) -> None:
        self.path = os.fspath(path)
        self._display = _display_attrs(display)
        if not isinstance(model, str) or not model:
            raise ConfigError(f"model: expected a non-empty str (got {model!r})")
        seed = _check_int("seed", seed, -(2**63))
        steps = _check_int("steps", steps, 0)
        world_size = _check_int("world_size", world_size, 1)
        if compression not in COMPRESSIONS:
            raise ConfigError(
                f"compression: expected one of {', '.join(map(repr, COMPRESSIONS))} (got {compression!r})"
            )
        try:
            params_json = json.dumps(dict(params), sort_keys=True, default=_json_default)
        except (TypeError, ValueError) as e:
            raise ConfigError(f"params: cannot be stored as JSON ({e})") from None
        self._check_writable(overwrite)
        # Created under a temporary name and renamed by the first flush() (or close()), once the
        # groups and datasets of the first rows and frames are on disk: HDF5 writes new objects'
        # metadata in no crash-safe order, so a process killed inside the flush that creates them
        # can leave links to headers past the file's recorded end ("address of object past end of
        # allocation"). Later flushes only extend datasets. An existing file at `path` stays until
        # then; a kill before it leaves only the hidden temporary file, removed by the next writer.
        directory, name = os.path.split(os.path.abspath(self.path))
        _remove_stale_temporaries(directory, name)
        creating = os.path.join(directory, f".{name}.creating{os.getpid()}")
        self._creating: str | None = creating
        self._setup(write_fault(self.path), [creating])
        try:
            self._file = open_for_writing(creating, "w", self._fault)
        except OSError as e:
            unwatch_file(self._names)
            raise OutputError(f"cannot create trajectory file '{self.path}': {write_cause(e)}") from e
        self._compression: dict[str, Any] = {}
        if compression == "gzip":
            self._compression = {"compression": "gzip", "compression_opts": _GZIP_LEVEL, "shuffle": True}
        elif compression == "lzf":
            self._compression = {"compression": "lzf", "shuffle": True}
        self.steps_completed = 0
        try:
            a = self._file.attrs
            a["format"] = fixed_text(FORMAT)
            a["format_version"] = FORMAT_VERSION
            a["model"] = fixed_text(model)
            a["params"] = fixed_text(params_json)
            a["seed"] = seed
            a["steps"] = steps
            a["steps_completed"] = 0
            a["world_size"] = world_size
            if agents is not None:
                a["agents"] = _check_int("agents", agents, 0)
            if space is not None:
                a["space"] = fixed_text(json.dumps(dict(space), sort_keys=True))
            a["versions"] = fixed_text(json.dumps(_versions(), sort_keys=True))
            a["completed"] = False
            self._metrics = _ScalarSeries(self._file.create_group("metrics", track_order=True))
            self._agents_group = self._file.create_group("agents", track_order=True)
            self._env = _Series(self._file.create_group("env", track_order=True))
            self._perf = _ScalarSeries(self._file.create_group("perf", track_order=True))
            self._file.flush()
            share(self._file)
            if self._swallowed:
                raise RuntimeError(self._swallowed[0])
        except (OSError, RuntimeError) as e:
            error = OutputError(f"cannot write trajectory file '{self.path}': "
                                f"{self._cause(e)}")
            self._error = error
            self._closed = True
            self._abandon()
            raise error from e
        self._populations: dict[str, _Series] = {}
        self._last_write = time.monotonic()

    def _setup(self, fault: Fault | None, names: list[str]) -> None:
        """The state every writer starts with: no error, no open dataset handles; its file watched."""
        self._fault = fault
        self._error = None
        self._swallowed: list[str] = []
        self._handles: dict[str, h5py.Dataset] = {}
        self._checksums = True  # (False: continuing a file of format version 1, which has none)
        self._closed = False
        self._names = [os.path.abspath(n) for n in names]
        watch_file(self._names, self._swallowed)

    def _cause(self, e: BaseException) -> str:
        """What made a write fail (the test hook's error where it injected one)."""
        tripped = self._fault.tripped if self._fault is not None else None
        return write_cause(tripped if tripped is not None else e)

    def _fail(self, cause: str) -> OutputError:
        """Record the first write failure (the writer is broken from now on) and return its error."""
        if self._error is None:
            self._error = OutputError(f"writing trajectory '{self.path}' failed: {cause}; the run stops and the "
                                      "file is not marked completed")
        return self._error

    def _abandon(self) -> None:
        """Close a broken file without writing to it again: HDF5's file descriptor is pointed at
        ``/dev/null`` first, so closing (which writes the cached chunks and metadata) neither fails,
        nor touches the file, nor leaves HDF5 to retry at exit ("Exception ignored" messages, and a
        segfault seen in one process). The file keeps what its last successful flush wrote, with
        ``completed = False``; an unpublished file (no flush succeeded) is removed.
        """
        detach_file(self._file)
        self._handles.clear()
        try:
            self._file.close()
        except (OSError, RuntimeError):
            pass  # the first error was raised already
        if self._creating is not None:
            with contextlib.suppress(OSError):
                os.remove(self._creating)
            self._creating = None

    @classmethod
    def continue_file(cls, path: str | os.PathLike[str], *, model: str, params: Mapping[str, Any], seed: int,
                      before: int, steps: int, world_size: int = 1,
                      display: Mapping[str, Mapping[str, Any]] | None = None,
                      space: Mapping[str, Any] | None = None, agents: int | None = None) -> TrajectoryWriter:
        """Open the file of an interrupted (or finished) run to write on from step ``before``.

        Every row and frame of a step ``>= before`` is dropped (the resumed run writes them
        again, the same), the ``steps`` attribute becomes the run's new total and
        ``completed`` False until :meth:`close`. New datasets use gzip compression.

        Raises:
            OutputError: The file cannot be opened for writing (missing, unreadable, not an
                agentsim trajectory).
            ConfigError: It is the trajectory of another model, other parameters or seed, or (both
                known) another number of agents at the start: nothing in it is changed.
        """
        self = cls.__new__(cls)
        self.path = os.fspath(path)
        self._display = _display_attrs(display)
        self._creating = None
        params_json = json.dumps(dict(params), sort_keys=True, default=_json_default)
        self._setup(write_fault(self.path), [self.path])
        try:
            self._file = reopen_to_write(self.path, "r+", functools.partial(open_for_writing, fault=self._fault))
        except OSError as e:
            unwatch_file(self._names)
            why = ("it is open in another process (a reader: close it there, then resume again)"
                   if "unable to lock file" in str(e).lower() else write_cause(e))
            raise OutputError(f"cannot continue trajectory file '{self.path}': {why}") from e
        try:
            share(self._file)  # before anything is cut: a kill from here on leaves a readable file
            a = self._file.attrs
            if attr_value(a.get("format")) != FORMAT:
                raise OutputError(f"cannot continue '{self.path}': not an agentsim trajectory")
            check_self_contained(self._file, self.path, "trajectory")
            checks: list[tuple[str, Any]] = [("model", model), ("params", params_json), ("seed", seed)]
            if agents is not None and "agents" in a:
                checks.append(("agents", agents))
            for key, want in checks:
                if attr_value(a.get(key)) != want:
                    raise ConfigError(f"cannot continue '{self.path}': it holds a run with {key} "
                                      f"{attr_value(a.get(key))!r}, not {want!r}")
            version = attr_value(a.get("format_version"))
            if not isinstance(version, int) or version > FORMAT_VERSION:
                raise OutputError(f"cannot continue '{self.path}': it has trajectory format_version {version!r}; "
                                  f"this agentsim writes versions <= {FORMAT_VERSION}")
            self._checksums = version >= CHECKSUMS_SINCE
            self._compression = {}
            for name in ("metrics", "perf"):  # (all checked before anything is cut)
                self._check_rows_before(self._file[name], before)
            self._metrics = self._scalar_series_before(self._file["metrics"], before)
            self._perf = self._scalar_series_before(self._file["perf"], before)
            self._env = self._frames_before(self._file["env"], before)
            self._agents_group = self._file["agents"]
            self._populations = {name: self._frames_before(g, before, rows=True)
                                 for name, g in self._agents_group.items()}
            self.steps_completed = max(0, self._metrics.last_step or 0)
            a["steps"], a["world_size"], a["completed"] = int(steps), int(world_size), False
            a["steps_completed"] = self.steps_completed
            if space is not None and "space" not in a:  # a file written before 0.3 records its space now
                a["space"] = fixed_text(json.dumps(dict(space), sort_keys=True))
            self._file.flush()
        except OutputError:  # refused before anything was cut
            self._file.close()
            unwatch_file(self._names)
            raise
        except (OSError, RuntimeError) as e:
            self._closed = True
            self._abandon()
            unwatch_file(self._names)
            raise OutputError(f"cannot continue trajectory file '{self.path}': "
                              f"{self._cause(e)}") from e
        except BaseException:
            self._file.close()
            unwatch_file(self._names)
            raise
        self._last_write = time.monotonic()
        return self

    @staticmethod
    def _datasets(group: h5py.Group, skip: tuple[str, ...]) -> list[str]:
        names: list[str] = []
        group.visititems(lambda name, obj: names.append(name) if isinstance(obj, h5py.Dataset) else None)
        return [n for n in names if n not in skip]

    @staticmethod
    def _rows_before(group: h5py.Group, before: int) -> tuple[np.ndarray, int]:
        """The steps of a metrics or perf group, and how many of its rows a resume from ``before`` keeps."""
        steps = group["step"][...]
        kept = int(np.searchsorted(steps[:_increasing_rows(steps)], before, side="left"))  # (no failed flush's rows)
        return steps, kept

    def _check_rows_before(self, group: h5py.Group, before: int) -> None:
        """Refuse to continue where a row a resume from ``before`` keeps fails its checksum."""
        if not self._checksums or "step" not in group:
            return
        steps, n = self._rows_before(group, before)
        kept = {name: group[name][:n] for name in self._datasets(group, _RESERVED_SERIES_NAMES)}
        bad = first_mismatch(group[CHECKSUMS][:n], row_checksums(steps[:n], kept))
        if bad is not None or len(group[CHECKSUMS]) < n:
            where = f"step {int(steps[bad])}" if bad is not None else "its last rows"
            raise OutputError(f"cannot continue '{self.path}': {group.name} at {where} fails its checksum (its "
                              "bytes changed after they were written); write the resumed run to a new file")

    def _scalar_series_before(self, group: h5py.Group, before: int) -> _ScalarSeries:
        """A metrics or perf group cut to its rows of steps ``< before``."""
        if "step" not in group:
            return _ScalarSeries(group)
        steps, n = self._rows_before(group, before)
        names = self._datasets(group, _RESERVED_SERIES_NAMES)
        for name in [*names, "step", *([CHECKSUMS] if self._checksums else [])]:
            group[name].resize(n, axis=0)  # [T] and [T, K] alike
        return _ScalarSeries(group, names=tuple(names), last_step=int(steps[n - 1]) if n else None, is_created=True,
                             shapes={name: tuple(group[name].shape[1:]) for name in names},
                             edges={name: tuple(group[name].attrs["edges"].tolist()) for name in names
                                    if "edges" in group[name].attrs})

    def _frames_before(self, group: h5py.Group, before: int, rows: bool = False) -> _Series:
        """An env or population group cut to its frames of steps ``< before`` (``rows``: per-agent
        datasets indexed through ``offsets``).
        """
        if "step" not in group:
            return _Series(group)
        steps = group["step"][...]
        k = int(np.searchsorted(steps[:_increasing_rows(steps)], before, side="left"))  # (not a failed flush's rows)
        names = self._datasets(group, _RESERVED_AGENT_NAMES)
        n_rows = int(group["offsets"][k]) if rows else k
        for name in names:
            group[name].resize(n_rows, axis=0)
        group["step"].resize(k, axis=0)
        if CHECKSUMS in group:
            group[CHECKSUMS].resize(k, axis=0)
        if rows:
            group["offsets"].resize(k + 1, axis=0)
        return _Series(group, names=tuple(names), dtypes={n: group[n].dtype for n in names},
                       shapes={n: group[n].shape[1:] for n in names}, last_step=int(steps[k - 1]) if k else None,
                       n_rows=n_rows if rows else 0)

    def _check_writable(self, overwrite: bool) -> None:
        parent = os.path.dirname(os.path.abspath(self.path))
        why = None
        if not os.path.isdir(parent):
            why = f"directory '{parent}' does not exist"
        elif os.path.isdir(self.path):
            why = "it is a directory"
        elif (kind := special_file(self.path)) is not None:
            why = f"it is {kind}; an output must be a regular file or a path that does not exist yet"
        elif os.path.exists(self.path):
            if not overwrite:
                why = "the file exists (pass overwrite=True to replace it)"
            elif not os.access(self.path, os.W_OK):
                why = "permission denied (the existing file is not writable)"
        elif not os.access(parent, os.W_OK):
            why = f"permission denied (directory '{parent}' is not writable)"
        if why is not None:
            raise OutputError(f"cannot create trajectory file '{self.path}': {why}")

    # ---------------------------------------------------------------- plumbing
    def _check_open(self) -> None:
        if self._closed:
            raise OutputError(f"trajectory writer for '{self.path}' is closed")

    def _next_step(self, series: _Series | _ScalarSeries, kind: str, step: Any) -> int:
        checked = _check_int(f"{kind} step", step, -(2**63))
        if series.last_step is not None and checked <= series.last_step:
            raise ConfigError(f"{kind}: step {checked} is not after the last written step {series.last_step}")
        return checked

    def _create(self, group: h5py.Group, name: str, dtype: np.dtype, shape: tuple[int, ...]) -> h5py.Dataset:
        """An empty extendable dataset ``[0, *shape]`` chunked along the first axis (~64 KiB chunks)."""
        if any(d == 0 for d in shape):
            raise ConfigError(f"'{group.name}/{name}': trailing shape {list(shape)} has a zero-size dimension")
        row_bytes = dtype.itemsize * math.prod(shape)
        chunks = (max(1, _CHUNK_BYTES // max(1, row_bytes)), *shape)
        ds = group.create_dataset(
            name, shape=(0, *shape), maxshape=(None, *shape), dtype=dtype, chunks=chunks, **self._compression
        )
        self._handles[f"{group.name}/{name}"] = ds
        return ds

    def _unshare(self) -> h5py.File:
        """The file opened again outside SWMR mode, to delete an object (see
        :func:`~agentsim.io.live.reopen_unshared`; the next :meth:`flush` shares it again); every
        group held is looked up again.
        """
        if not self._file.swmr_mode:
            return self._file
        self._handles.clear()  # (closed with the file)
        path = self._creating if self._creating is not None else self.path
        series: list[_Series | _ScalarSeries] = [self._metrics, self._perf, self._env, *self._populations.values()]
        names = [one.group.name for one in series]
        self._file = reopen_unshared(self._file, path, functools.partial(open_for_writing, fault=self._fault))
        for one, name in zip(series, names, strict=True):
            one.group = self._file[name]
        self._agents_group = self._file["agents"]
        return self._file

    def _ds(self, group: h5py.Group, name: str) -> h5py.Dataset:
        """The dataset ``name`` of ``group``, through one handle kept open until the file closes: a
        handle released in between would write its cached chunks from h5py's finalizer, where a
        failure is only printed ("Exception ignored"), not raised.
        """
        key = f"{group.name}/{name}"
        ds = self._handles.get(key)
        if ds is None:
            ds = self._handles[key] = group[name]
        return ds

    @staticmethod
    def _append(ds: h5py.Dataset, rows: np.ndarray) -> None:
        n0 = ds.shape[0]
        if len(rows) == 0:
            return
        ds.resize(n0 + len(rows), axis=0)
        ds[n0:] = rows

    def _buffer_row(self, series: _ScalarSeries, step: int, values: Mapping[str, int | float | np.ndarray]) -> None:
        if series.last_step is None:
            series.names = tuple(values)
        series.steps.append(step)
        series.rows.append(tuple(values[name] for name in series.names))
        series.last_step = step
        if len(series.rows) >= _BUFFER_ROWS or time.monotonic() - self._last_write > _BUFFER_SECONDS:
            self._write_buffers()

    def _write_buffers(self) -> None:
        """Write the buffered metric and perf rows: one resize per dataset."""
        for series in (self._metrics, self._perf):
            if not series.rows:
                continue
            g = series.group
            columns = list(zip(*series.rows, strict=True))
            if not series.is_created:
                self._create(g, "step", np.dtype(np.int64), ())
                if self._checksums:
                    self._create(g, CHECKSUMS, np.dtype(np.uint32), ())
            written: dict[str, np.ndarray] = {}
            promoted = False
            for name, column in zip(series.names, columns, strict=True):
                shape = series.shapes.get(name, ())
                if shape:  # a vector metric: [rows, K]
                    data = np.stack(column)
                    is_float = data.dtype.kind == "f"
                else:
                    is_float = any(isinstance(v, float) for v in column)
                if not series.is_created:
                    ds = self._create(g, name, np.dtype(np.float64 if is_float else np.int64), shape)
                else:
                    ds = self._ds(g, name)
                    if is_float and ds.dtype == np.int64:
                        # An integer series got a float (e.g. `x / n if n else 0`): promote to float64.
                        old, attrs = ds[...].astype(np.float64), dict(ds.attrs)
                        self._handles.pop(f"{g.name}/{name}")
                        del ds
                        where = g.name
                        g = self._unshare()[where]
                        del g[name]
                        ds = self._create(g, name, np.dtype(np.float64), shape)
                        ds.attrs.update(attrs)
                        self._append(ds, old)
                        promoted = True
                if name in series.edges and "edges" not in ds.attrs:
                    ds.attrs["edges"] = np.asarray(series.edges[name], dtype=np.float64)
                if series is self._metrics and name in self._display and "display" not in ds.attrs:
                    ds.attrs["display"] = fixed_text(self._display[name])
                written[name] = data.astype(ds.dtype, copy=False) if shape else np.asarray(column, dtype=ds.dtype)
                self._append(ds, written[name])
            steps = np.asarray(series.steps, dtype=np.int64)
            if self._checksums:
                if promoted:  # the earlier rows' bytes changed too: every row's checksum again
                    everything = {name: self._ds(g, name)[...] for name in series.names}
                    check = self._ds(g, CHECKSUMS)
                    check.resize(0, axis=0)
                    self._append(check, row_checksums(np.concatenate([self._ds(g, "step")[...], steps]), everything))
                else:
                    self._append(self._ds(g, CHECKSUMS), row_checksums(steps, written))
            self._append(self._ds(g, "step"), steps)
            series.is_created = True
            series.steps.clear()
            series.rows.clear()
        self._file.attrs["steps_completed"] = self.steps_completed
        self._last_write = time.monotonic()

    # ---------------------------------------------------------------- writing
    @_io_errors
    def write_metrics(self, step: int, metrics: Mapping[str, int | float | Tensor | np.ndarray | Sequence[float]],
                      *, edges: Mapping[str, Sequence[float]] | None = None) -> None:
        """Append one row to ``/metrics`` (buffered, see the module doc) and advance ``steps_completed``.

        Args:
            step: Step of this row, after the previous one.
            metrics: Name to scalar (int, float, bool, 0-d tensor or array) or vector ``[K]``
                (a 1-D tensor, array, list or tuple: a ``[T, K]`` dataset).
                The first call fixes the names and each one's K (a 1-D value is a vector, even
                of one entry); integer values give int64 series, others float64 (an int
                series turns float64 if a float arrives later).
            edges: Name of a vector metric to its histogram's ``K + 1`` bin edges, stored as the
                dataset's ``edges`` attribute (the first edges given for a name are kept).

        Raises:
            ConfigError: Names differ from the first call, ``"step"`` is used as a
                name, a value is neither a scalar nor a vector, a vector's K or a
                scalar's shape differs from the first row, edges that do not fit their
                vector, or ``step`` does not increase.
        """
        self._check_open()
        step = self._next_step(self._metrics, "metrics", step)
        if "step" in metrics:
            raise ConfigError("metrics: 'step' is reserved for the step column; pass the step as the first argument")
        if CHECKSUMS in metrics:
            raise ConfigError(f"metrics: '{CHECKSUMS}' is reserved for the rows' checksums; name the metric otherwise")
        values = {_check_name("metric", k, nested=True): _metric_value(k, v) for k, v in metrics.items()}
        series = self._metrics
        first = series.last_step is None
        _check_names("metrics", None if first else series.names, values)
        for name, v in values.items():
            shape = tuple(v.shape) if isinstance(v, np.ndarray) else ()
            if first and not series.is_created:
                series.shapes[name] = shape
            elif series.shapes.get(name, ()) != shape:
                raise ConfigError(f"metric '{name}': expected {_shape_text(series.shapes.get(name, ()))} as in the "
                                  f"first row (got {_shape_text(shape)} at step {step}); a vector metric has the "
                                  "same K at every step")
        for name, e in (edges or {}).items():
            if name in series.edges:
                continue
            k = series.shapes.get(name, ())
            if name not in values or not k or len(e) != k[0] + 1:
                raise ConfigError(f"metrics edges of '{name}': expected {k[0] + 1 if k else 'K + 1'} bin edges for "
                                  f"a vector metric of this row (got {len(e)} for {_shape_text(k)})")
            series.edges[name] = tuple(float(x) for x in e)
        self.steps_completed = max(self.steps_completed, step)
        self._buffer_row(series, step, values)

    @_io_errors
    def write_perf(self, step: int, figures: Mapping[str, float]) -> None:
        """Append one row of machine-dependent figures (seconds, bytes, ...) to ``/perf`` (buffered).

        Args:
            step: Step of this row, after the previous one.
            figures: Name to number, stored as float64; the first call fixes the names.
        """
        self._check_open()
        step = self._next_step(self._perf, "perf", step)
        if "step" in figures or CHECKSUMS in figures:
            raise ConfigError(f"perf: 'step' and '{CHECKSUMS}' are reserved (the step column, the rows' checksums)")
        values = {_check_name("perf", k, nested=True): float(_scalar("perf", k, v)) for k, v in figures.items()}
        _check_names("perf", self._perf.names if self._perf.last_step is not None else None, values)
        self._buffer_row(self._perf, step, values)

    @_io_errors
    def write_perf_attrs(self, figures: Mapping[str, float]) -> None:
        """Figures of the whole run (the cut of each group field: :mod:`agentsim.engine.perf`), as
        float attributes of ``/perf``.
        """
        self._check_open()
        for key, value in figures.items():
            self._perf.group.attrs[_check_name("perf", key, nested=True)] = float(value)

    @_io_errors
    def write_agents(self, step: int, population: str, fields: Mapping[str, Tensor | np.ndarray]) -> None:
        """Append one frame of a population to ``/agents/<population>``.

        Args:
            step: Step of the frame, after the population's previous frame.
            population: Population name (no ``/``).
            fields: Field name to ``[n, ...]`` tensor (any device; moved to CPU) or
                array, all with the same ``n``; must include ``"uid"`` (integer ``[n]``).
                Rows are written sorted by uid. The first frame fixes the field names,
                dtypes and trailing shapes.

        Raises:
            ConfigError: Missing ``uid``, mismatched row counts, or names, dtypes or
                shapes that differ from the population's first frame.
        """
        self._check_open()
        _check_name("population", population, nested=False)
        series = self._populations.get(population)
        kind = f"agents '{population}'"
        step = self._next_step(series if series is not None else _Series(self._agents_group), kind, step)
        if "uid" not in fields:
            raise ConfigError(f"{kind}: fields must include 'uid' (got {sorted(fields)})")
        for name in fields:
            _check_name("field", name, nested=False)
            if name in _RESERVED_AGENT_NAMES:
                raise ConfigError(f"{kind}: field name '{name}' is reserved ({', '.join(_RESERVED_AGENT_NAMES)})")
        arrays = {name: _to_numpy(f"{kind} field '{name}'", v) for name, v in fields.items()}
        uid = arrays["uid"]
        if uid.ndim != 1 or not np.issubdtype(uid.dtype, np.integer):
            raise ConfigError(f"{kind}: 'uid' must be an integer [n] array (got {uid.dtype} {list(uid.shape)})")
        n = uid.shape[0]
        for name, a in arrays.items():
            if a.ndim < 1 or a.shape[0] != n:
                raise ConfigError(f"{kind} field '{name}': expected {n} rows like 'uid' (got shape {list(a.shape)})")
        arrays["uid"] = uid.astype(np.int64, copy=False)
        if n > 1 and not bool(np.all(uid[1:] >= uid[:-1])):
            order = np.argsort(uid, kind="stable")
            arrays = {name: a[order] for name, a in arrays.items()}
        if series is None:
            series = self._new_population(population, arrays)
        else:
            _check_names(kind, series.names, arrays)
            for name, a in arrays.items():
                if a.dtype != series.dtypes[name] or a.shape[1:] != series.shapes[name]:
                    raise ConfigError(
                        f"{kind} field '{name}': expected dtype {series.dtypes[name]} and shape "
                        f"[{', '.join(['n', *map(str, series.shapes[name])])}] as in the first frame "
                        f"(got {a.dtype} {list(a.shape)})"
                    )
        g = series.group
        for name, a in arrays.items():
            self._append(self._ds(g, name), a)
        if self._checksums:
            self._append(self._ds(g, CHECKSUMS), frame_checksums(step, arrays)[None])
        series.n_rows += n
        self._append(self._ds(g, "step"), np.asarray([step], dtype=np.int64))
        self._append(self._ds(g, "offsets"), np.asarray([series.n_rows], dtype=np.int64))
        series.last_step = step

    def _new_population(self, population: str, arrays: Mapping[str, np.ndarray]) -> _Series:
        g = self._agents_group.create_group(population, track_order=True)
        series = _Series(g, names=tuple(arrays))
        self._create(g, "step", np.dtype(np.int64), ())
        self._append(self._create(g, "offsets", np.dtype(np.int64), ()), np.zeros(1, dtype=np.int64))
        if self._checksums:
            self._create(g, CHECKSUMS, np.dtype(np.uint32), (len(arrays),))
        for name in ("uid", *(k for k in arrays if k != "uid")):
            a = arrays[name]
            series.dtypes[name], series.shapes[name] = a.dtype, a.shape[1:]
            self._create(g, name, a.dtype, a.shape[1:])
        self._populations[population] = series
        return series

    @_io_errors
    def write_env(self, step: int, env: Mapping[str, Tensor | np.ndarray]) -> None:
        """Append one frame of environment layers to ``/env``.

        Args:
            step: Step of the frame, after the previous env frame.
            env: Layer name (no ``/``) to a tensor or array of any fixed shape (a grid
                ``[H, W]``, a per-cell vector, a 0-d value); names, dtypes and shapes
                are fixed by the first call.
        """
        self._check_open()
        step = self._next_step(self._env, "env", step)
        if "step" in env or CHECKSUMS in env:
            raise ConfigError(f"env: 'step' and '{CHECKSUMS}' are reserved (the step column, the frames' checksums)")
        arrays = {_check_name("env", k, nested=False): _to_numpy(f"env '{k}'", v) for k, v in env.items()}
        g = self._env.group
        if self._env.last_step is None:
            self._env.names = tuple(arrays)
            self._create(g, "step", np.dtype(np.int64), ())
            if self._checksums and arrays:
                self._create(g, CHECKSUMS, np.dtype(np.uint32), (len(arrays),))
            for name, a in arrays.items():
                self._env.dtypes[name], self._env.shapes[name] = a.dtype, a.shape
                self._create(g, name, a.dtype, a.shape)
        else:
            _check_names("env", self._env.names, arrays)
            for name, a in arrays.items():
                if a.dtype != self._env.dtypes[name] or a.shape != self._env.shapes[name]:
                    raise ConfigError(
                        f"env '{name}': expected dtype {self._env.dtypes[name]} and shape "
                        f"{list(self._env.shapes[name])} as in the first frame (got {a.dtype} {list(a.shape)})"
                    )
        for name, a in arrays.items():
            self._append(self._ds(g, name), a[None])
        if self._checksums and arrays:
            self._append(self._ds(g, CHECKSUMS), frame_checksums(step, arrays)[None])
        self._append(self._ds(g, "step"), np.asarray([step], dtype=np.int64))
        self._env.last_step = step

    # ---------------------------------------------------------------- closing
    @_io_errors
    def flush(self) -> None:
        """Write buffered metric / perf rows and ``steps_completed``, and flush HDF5 to disk (where
        other processes may read them while the file is written: :mod:`agentsim.io.live`).
        """
        self._check_open()
        self._write_buffers()
        self._file.flush()
        share(self._file)  # (again, after an object was deleted: _unshare)
        self._publish()

    def _publish(self) -> None:
        """Rename the file from its temporary name to ``path`` (after the first flush or close)."""
        if self._creating is not None:
            os.replace(self._creating, self.path)
            self._creating = None

    @_io_errors
    def close(self, completed: bool) -> None:
        """Set the ``completed`` and ``steps_completed`` attributes and close the file.

        The rows are flushed first and ``completed = True`` is written (and flushed) only after
        that succeeded, so a file whose data did not reach the disk never says it is complete.

        Args:
            completed: True when the run reached its last step. A second call does nothing.

        Raises:
            OutputError: A write failed (now, or earlier: then only with ``completed=True``); the
                file is left with ``completed = False`` (removed if no flush ever succeeded).
        """
        if self._closed:
            return
        self._closed = True
        if self._error is not None:  # broken earlier: give the file up (still watched: HDF5 retries at exit)
            self._abandon()
            if completed:
                raise OutputError(str(self._error))
            return
        try:
            if self._fault is not None:
                self._fault.closing = True
            self._write_buffers()
            self._file.flush()
            if completed and not self._swallowed:
                self._file.attrs["completed"] = True
                self._file.flush()
            if self._swallowed:
                raise RuntimeError(self._swallowed[0])
            self._handles.clear()
            self._file.close()
            if self._swallowed:
                raise RuntimeError(self._swallowed[0])
        except (OSError, RuntimeError) as e:
            error = self._fail(self._cause(e))
            self._abandon()
            raise error from e
        finally:
            if self._error is None:
                self._publish()
                unwatch_file(self._names)

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` has been called."""
        return self._closed

    def __enter__(self) -> TrajectoryWriter:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if not self._closed:
            self.close(completed=exc_type is None)

    def __repr__(self) -> str:
        return f"TrajectoryWriter({self.path!r}, {'closed' if self._closed else 'open'})"


def _display_attrs(display: Mapping[str, Mapping[str, Any]] | None) -> dict[str, str]:
    """Metric name to its checked display entries as the JSON str a dataset attribute holds."""
    if display is None:
        return {}
    if not isinstance(display, Mapping):
        raise ConfigError(f"display: expected {{metric: {{label: ..., color: ...}}}} (got {display!r})")
    return {name: json.dumps(Display.from_dict(f"metric '{name}'", entries).as_dict(), sort_keys=True)
            for name, entries in display.items()}


# --------------------------------------------------------------------------- reader
def attr_value(value: Any) -> Any:
    """An HDF5 attribute as plain Python: bytes (a fixed-length string) decoded, NumPy scalars unwrapped."""
    if isinstance(value, bytes):
        return value.decode()
    if isinstance(value, np.generic):
        return value.item()
    return value


def _read_series(group: h5py.Group) -> dict[str, np.ndarray]:
    """Every dataset under ``group``, keyed by its path relative to the group."""
    out: dict[str, np.ndarray] = {}

    def visit(name: str, obj: Any) -> None:
        if isinstance(obj, h5py.Dataset):
            out[name] = obj[...]

    group.visititems(visit)
    return out


def _read_display(group: h5py.Group, prefix: str = "") -> dict[str, Any]:
    """The ``display`` attribute of every dataset under ``group`` that has one, decoded from JSON
    (as stored: :mod:`agentsim.plot` checks it; one that is not JSON reads as the str itself), in
    the order the metrics were written.
    """
    out: dict[str, Any] = {}
    for key, obj in group.items():  # creation order (the metrics group tracks it)
        if isinstance(obj, h5py.Group):
            out.update(_read_display(obj, f"{prefix}{key}/"))
        elif "display" in obj.attrs:
            text = attr_value(obj.attrs["display"])
            try:
                out[prefix + key] = json.loads(text) if isinstance(text, str) else text
            except ValueError:
                out[prefix + key] = text
    return out


def _read_edges(group: h5py.Group) -> dict[str, np.ndarray]:
    """The ``edges`` attribute of every dataset under ``group`` that has one (histogram metrics)."""
    out: dict[str, np.ndarray] = {}

    def visit(name: str, obj: Any) -> None:
        if isinstance(obj, h5py.Dataset) and "edges" in obj.attrs:
            out[name] = np.asarray(obj.attrs["edges"], dtype=np.float64)

    group.visititems(visit)
    return out


@dataclass(frozen=True)
class _Population:
    steps: np.ndarray
    offsets: np.ndarray
    fields: list[str]
    checked: bool  # the group has a checksum per field and frame (format version >= 2)


class Trajectory:
    """A trajectory file opened for reading (see :func:`read_trajectory`).

    Metrics, perf figures and frame indexes are loaded when it is created; agent and
    env frames are read from the file on each call.

    Attributes:
        path: The file.
        attrs: Root attributes, with ``params`` and ``versions`` decoded from JSON and
            ``completed`` as a bool.
        metrics: Name to ``[T]`` array (``[T, K]`` for a vector metric), including ``"step"``.
        edges: Name of a histogram metric to its bin edges, float64 ``[K + 1]``.
        display: Name of a metric to how a figure draws it, as the model declared it (the
            decoded ``display`` attribute; empty for a file without one), in the order the
            metrics were written.
        perf: Name to ``[T_perf]`` array, including ``"step"`` (empty if none written).
        populations: Population names, in the order first written.
        env_names: Environment layer names.
    """

    def __init__(self, path: str, file: h5py.File, damaged: Sequence[str] = ()) -> None:
        self.path = path
        attrs = {k: attr_value(v) for k, v in file.attrs.items()}
        for key in ("params", "versions", "space"):
            if isinstance(attrs.get(key), str):
                attrs[key] = json.loads(attrs[key])
        if "completed" in attrs:
            attrs["completed"] = bool(attrs["completed"])
        self.attrs: dict[str, Any] = attrs
        complete = bool(attrs.get("completed"))
        checked = isinstance(attrs.get("format_version"), int) and attrs["format_version"] >= CHECKSUMS_SINCE
        # A file that did not complete may end in rows a failed flush sized but never filled (a full
        # disk): every series' steps increase strictly, so its readable rows are those before the
        # first step that does not, and no later than steps_completed; steps_completed is then the
        # last readable metrics step.
        until = None if complete or not isinstance(attrs.get("steps_completed"), int) else attrs["steps_completed"]
        self.metrics: dict[str, np.ndarray] = (_rows(file["metrics"], path, checked, complete, until)
                                               if "metrics" in file else {})
        self.edges: dict[str, np.ndarray] = _read_edges(file["metrics"]) if "metrics" in file else {}
        self.display: dict[str, Any] = _read_display(file["metrics"]) if "metrics" in file else {}
        self.perf: dict[str, np.ndarray] = {}
        if "perf" in file and "/perf" not in damaged:
            with contextlib.suppress(OSError, RuntimeError, KeyError, ValueError, OutputError):  # (figures only)
                self.perf = _rows(file["perf"], path, checked, complete, until)
        # Frames of a file that did not complete are read up to steps_completed: a frame after it
        # may have been sized by a failed flush and never filled (its steps written, its rows not).
        last: int | None = None
        if len(self.metrics.get("step", [])) and "steps_completed" in attrs:
            attrs["steps_completed"] = min(int(attrs["steps_completed"]), int(self.metrics["step"][-1]))
            last = None if attrs.get("completed") else attrs["steps_completed"]
        self._pops: dict[str, _Population] = {}
        for name, g in (file["agents"].items() if "agents" in file and "/agents" not in damaged else []):
            if f"/agents/{name}" in damaged:
                continue
            fields = [k for k in g.keys() if k not in _RESERVED_AGENT_NAMES]
            steps = g["step"][...]
            _check_increasing(steps, complete, g, path)
            k = _frames_checked(_readable_frames(steps, last), g, checked, complete, path)
            offsets = g["offsets"][...][:k + 1]
            if complete and (len(offsets) != k + 1 or offsets[0] != 0 or np.any(np.diff(offsets) < 0)
                             or ("uid" in g and offsets[-1] != g["uid"].shape[0])):
                raise OutputError(f"'{path}' is damaged: the offsets of {g.name} do not index its rows")
            if not complete:  # frames whose rows reach past what a failed flush left readable: not served
                k = _frames_that_read(k, _last_rows(g, fields, offsets))
            self._pops[name] = _Population(steps[:k], offsets[:k + 1], fields, checked)
        env_steps = file["env/step"][...] if "env/step" in file else np.zeros(0, dtype=np.int64)
        if "env" in file:
            _check_increasing(env_steps, complete, file["env"], path)
        env_names = [n for n in file["env"].keys() if n not in _RESERVED_SERIES_NAMES] if "env" in file else []
        self._env_checked = checked and bool(env_names)
        k = _readable_frames(env_steps, last)
        if self._env_checked:
            k = _frames_checked(k, file["env"], checked, complete, path)
        if not complete:
            k = _frames_that_read(k, lambda j: [file["env"][n][j] for n in env_names])
        self._env_steps = env_steps[:k]
        self.env_names: list[str] = env_names

    @property
    def populations(self) -> list[str]:
        """The populations with recorded frames."""
        return list(self._pops)

    def _population(self, population: str) -> _Population:
        if population not in self._pops:
            raise ConfigError(
                f"unknown population '{population}' in '{self.path}' (valid: {', '.join(self._pops) or 'none'})."
                + did_you_mean(population, self._pops)
            )
        return self._pops[population]

    def fields(self, population: str) -> list[str]:
        """Recorded fields of ``population``, ``"uid"`` first."""
        return list(self._population(population).fields)

    def steps(self, population: str) -> np.ndarray:
        """The steps of the recorded frames of ``population``, int64 ``[K]``."""
        return np.array(self._population(population).steps, copy=True)

    def env_steps(self) -> np.ndarray:
        """The steps of the recorded env frames, int64 ``[K_env]``."""
        return np.array(self._env_steps, copy=True)

    @staticmethod
    def _frame(steps: np.ndarray, step: int | None, what: str) -> int:
        if step is None:
            return len(steps) - 1
        k = int(np.searchsorted(steps, step))
        if k == len(steps) or steps[k] != step:
            shown = ", ".join(map(str, steps[:20].tolist())) + (", ..." if len(steps) > 20 else "")
            raise ConfigError(f"{what}: step {step} was not recorded (recorded: {shown})")
        return k

    def agents(
        self,
        population: str,
        fields: str | Sequence[str] | None = None,
        step: int | None = None,
        *,
        as_tensor: bool = False,
    ) -> dict[str, Any]:
        """One frame of a population.

        Args:
            population: Population name.
            fields: A field name, a list of them, or None for all recorded fields.
            step: The recorded step to read; None for the last recorded frame.
            as_tensor: Return torch tensors instead of numpy arrays.

        Returns:
            ``{"uid": [n], field: [n, ...], ...}``: always includes ``"uid"``; rows are
            sorted by uid and aligned across fields.

        Raises:
            ConfigError: Unknown population or field, or a step that was not recorded.
        """
        pop = self._population(population)
        names = pop.fields if fields is None else [fields] if isinstance(fields, str) else list(fields)
        for name in names:
            if name not in pop.fields:
                raise ConfigError(
                    f"unknown field '{name}' of population '{population}' (valid: {', '.join(pop.fields)})."
                    + did_you_mean(name, pop.fields)
                )
        names = ["uid", *(n for n in dict.fromkeys(names) if n != "uid")]
        k = self._frame(pop.steps, step, f"agents '{population}'")
        lo, hi = int(pop.offsets[k]), int(pop.offsets[k + 1])
        with _open(self.path) as f:
            try:
                g = f["agents"][population]
                out = {name: g[name][lo:hi] for name in names}
                checks = g[CHECKSUMS][k] if pop.checked else None
            except (KeyError, OSError) as e:
                raise OutputError(f"'{self.path}' is damaged: cannot read agents '{population}' at frame {k} "
                                  f"({_why(e) if isinstance(e, OSError) else e})") from e
        if checks is not None:
            check_frame(int(pop.steps[k]), checks, sorted(pop.fields), out,
                        f"'{self.path}' is damaged: agents '{population}' at step {int(pop.steps[k])}")
        return {k_: torch.from_numpy(v) for k_, v in out.items()} if as_tensor else out

    def env(self, name: str, step: int | None = None, *, as_tensor: bool = False) -> Any:
        """One frame of an environment layer (None: the last recorded frame), shape as written."""
        if name not in self.env_names:
            raise ConfigError(
                f"unknown env layer '{name}' (valid: {', '.join(self.env_names) or 'none'})."
                + did_you_mean(name, self.env_names)
            )
        k = self._frame(self._env_steps, step, f"env '{name}'")
        with _open(self.path) as f:
            try:
                value = f["env"][name][k]
                checks = f["env"][CHECKSUMS][k] if self._env_checked else None
            except (KeyError, OSError) as e:
                raise OutputError(f"'{self.path}' is damaged: cannot read env '{name}' at frame {k} "
                                  f"({_why(e) if isinstance(e, OSError) else e})") from e
        if checks is not None:
            check_frame(int(self._env_steps[k]), checks, sorted(self.env_names), {name: value},
                        f"'{self.path}' is damaged: env at step {int(self._env_steps[k])}")
        value = np.asarray(value)
        return torch.from_numpy(value) if as_tensor else value

    def verify(self) -> int:
        """Check every frame served (every population's, and env's) against its checksums; the
        metric and perf rows were checked on opening.

        Returns:
            The number of frames checked (0 for a file of format version 1, which has no checksums).

        Raises:
            OutputError: A frame fails its checksum or does not read.
        """
        frames = 0
        with _open(self.path) as f:
            try:
                for population, pop in self._pops.items():
                    if pop.checked:
                        g = f["agents"][population]
                        frames += check_frames(pop.steps, g[CHECKSUMS][:len(pop.steps)], pop.fields,
                                               ({n: g[n][lo:hi] for n in pop.fields}
                                                for lo, hi in itertools.pairwise(pop.offsets.tolist())),
                                               f"'{self.path}' is damaged: agents '{population}'")
                if self._env_checked:
                    env = f["env"]
                    frames += check_frames(self._env_steps, env[CHECKSUMS][:len(self._env_steps)], self.env_names,
                                           ({n: env[n][k] for n in self.env_names}
                                            for k in range(len(self._env_steps))),
                                           f"'{self.path}' is damaged: env")
            except OutputError:
                raise
            except (KeyError, OSError) as e:
                raise OutputError(f"'{self.path}' is damaged: a frame does not read "
                                  f"({_why(e) if isinstance(e, OSError) else e})") from e
        return frames

    def __repr__(self) -> str:
        return (
            f"Trajectory({self.path!r}, model={self.attrs.get('model')!r}, "
            f"steps_completed={self.attrs.get('steps_completed')}, populations={self.populations})"
        )


def _open(path: str) -> h5py.File:
    try:
        return open_to_read(path)
    except OSError as e:
        raise OutputError(f"cannot read trajectory '{path}': {_why(e)}") from e


def _why(e: OSError) -> str:
    """What an h5py error on opening or reading a file means for the user."""
    text = str(e)
    if "truncated file" in text:
        return f"the file is truncated (shorter than its header says: copied or written only in part?) ({text})"
    if "unable to lock file" in text.lower():
        return ("it is open for writing in another process (a run still going?): wait for it to end, "
                "or read a copy")
    if "filter returned failure" in text:  # a Fletcher-32 checksum, or a compressed chunk, that fails
        return f"a block fails its checksum: its bytes changed after they were written ({text})"
    return text


def _increasing_rows(steps: np.ndarray) -> int:
    """How many leading entries of ``steps`` increase strictly (all of them in a sound file)."""
    if steps.size < 2:
        return int(steps.size)
    bad = np.nonzero(np.diff(steps) <= 0)[0]
    return int(bad[0]) + 1 if bad.size else int(steps.size)


def _readable_frames(steps: np.ndarray, last: int | None) -> int:
    """How many leading frames of ``steps`` are read: those whose steps increase strictly, and
    (``last`` not None) are at most ``last``.
    """
    k = _increasing_rows(steps)
    return k if last is None else int(np.searchsorted(steps[:k], last, side="right"))


def _last_rows(group: h5py.Group, fields: list[str], offsets: np.ndarray) -> Callable[[int], Any]:
    """A reader of frame ``j``'s last row of every field of a population ``group``."""
    return lambda j: [group[f][int(offsets[j + 1]) - 1] for f in fields if offsets[j + 1] > offsets[j]]


def _frames_that_read(k: int, read: Callable[[int], Any]) -> int:
    """How many of the first ``k`` frames read back: the newest frame ``j`` for which ``read(j)``
    raises no h5py error, plus one (a failed flush leaves a suffix of frames unreadable).
    """
    while k > 0:
        try:
            read(k - 1)
            return k
        except (OSError, RuntimeError, KeyError, ValueError, IndexError):  # (IndexError: rows past the end)
            k -= 1
    return 0


def _readable(series: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``series`` cut to its rows before the first step that does not increase."""
    if "step" not in series:
        return series
    k = _increasing_rows(series["step"])
    return {name: values[:k] for name, values in series.items()}


def _rows(group: h5py.Group, path: str, checked: bool, complete: bool, until: int | None) -> dict[str, np.ndarray]:
    """The rows of a metrics or perf ``group`` that are served: those whose steps increase, up to
    step ``until`` (None: all), each checked against its checksum (``checked``: the file has them).

    Raises:
        OutputError: A row fails its checksum, or a completed file lacks checksums for its rows.
    """
    series = _read_series(group)
    if "step" not in series:
        return series
    _check_increasing(series["step"], complete, group, path)
    series = _readable(series)
    checks = series.pop(CHECKSUMS, None) if checked else None
    n = min((len(v) for v in series.values()), default=0)  # (a file read while it is written)
    if until is not None:
        n = min(n, int(np.searchsorted(series["step"][:n], until, side="right")))
    if checked:
        if checks is None or (complete and len(checks) < n):
            raise OutputError(f"'{path}' is damaged: {group.name} has {n} rows but checksums for "
                              f"{0 if checks is None else len(checks)}")
        n = min(n, len(checks))
    series = {name: values[:n] for name, values in series.items()}
    if checked and checks is not None:
        columns = {name: v for name, v in series.items() if name != "step"}
        bad = first_mismatch(checks[:n], row_checksums(series["step"], columns))
        if bad is not None:
            raise OutputError(f"'{path}' is damaged: {group.name} at step {int(series['step'][bad])} fails its "
                              "checksum (its bytes changed after they were written)")
    return series


def _check_increasing(steps: np.ndarray, complete: bool, group: h5py.Group, path: str) -> None:
    """Refuse a completed file whose ``steps`` do not increase (only an interrupted file may end in
    rows a failed flush sized and never filled).
    """
    k = _increasing_rows(steps)
    if complete and k < len(steps):
        raise OutputError(f"'{path}' is damaged: the steps of {group.name} do not increase at row {k} "
                          f"({int(steps[k - 1])}, then {int(steps[k])})")


def _frames_checked(k: int, group: h5py.Group, checked: bool, complete: bool, path: str) -> int:
    """How many of a frame ``group``'s first ``k`` frames have their checksums (all ``k`` in a
    completed file: else it is damaged; fewer in a file read while it is written).
    """
    if not checked:
        return k
    if CHECKSUMS not in group:
        raise OutputError(f"'{path}' is damaged: {group.name} has no checksums")
    have = len(group[CHECKSUMS])
    if complete and have < k:
        raise OutputError(f"'{path}' is damaged: {group.name} has {k} frames but checksums for {have}")
    return min(k, have)


def check_frames(steps: np.ndarray, stored: np.ndarray, fields: Sequence[str],
                 frames: Iterable[Mapping[str, np.ndarray]], what: str) -> int:
    """Check frames one after the other (:func:`check_frame`), each read only when its turn comes.

    Args:
        steps: The frames' steps, ``[K]``.
        stored: Their rows of a ``checksums`` dataset, uint32 ``[K, F]``.
        fields: The F field names (any order).
        frames: Each frame's values of some of those fields, in the order of ``steps``.
        what: The start of the error message (the file and the population or env).

    Returns:
        The number of frames checked.
    """
    order, k = sorted(fields), 0
    for k, (step, values) in enumerate(zip(steps.tolist(), frames, strict=True), start=1):
        check_frame(step, stored[k - 1], order, values, f"{what} at step {step}")
    return k


def check_frame(step: int, stored: np.ndarray, order: Sequence[str], values: Mapping[str, np.ndarray],
                what: str) -> None:
    """Check fields of one frame against the frame's stored checksums.

    Args:
        step: The frame's step (as the file gives it: a changed step fails the checksums too).
        stored: The frame's row of a ``checksums`` dataset, uint32 ``[F]``.
        order: The F field names in the order of their checksums (sorted).
        values: Some of those fields' values in the frame.
        what: The start of the error message (the file and the frame).

    Raises:
        OutputError: A field fails its checksum.
    """
    for name, value in values.items():
        if frame_checksum(step, np.asarray(value)) != int(stored[order.index(name)]):
            raise OutputError(f"{what}: field '{name}' fails its checksum (its bytes changed after they were "
                              "written)")


def read_trajectory(path: str | os.PathLike[str]) -> Trajectory:
    """Open an agentsim trajectory file.

    Args:
        path: An HDF5 file written by :class:`TrajectoryWriter`.

    Raises:
        OutputError: The file is missing, not HDF5, not an agentsim trajectory, or of a
            newer format version.
    """
    path = os.fspath(path)
    if os.path.isdir(path):
        raise OutputError(f"cannot read trajectory '{path}': not an HDF5 file")
    check_regular(path, "trajectory")
    if not h5py.is_hdf5(path):
        raise OutputError(f"cannot read trajectory '{path}': not an HDF5 file")
    with _open(path) as f:
        fmt = attr_value(f.attrs.get("format"))
        if fmt != FORMAT:
            raise OutputError(
                f"'{path}' is not an agentsim trajectory (root attribute 'format' is {fmt!r}, expected {FORMAT!r})"
            )
        version = attr_value(f.attrs.get("format_version"))
        if not isinstance(version, int) or version > FORMAT_VERSION:
            raise OutputError(
                f"'{path}' has trajectory format_version {version!r}; this agentsim reads versions <= {FORMAT_VERSION}"
            )
        damaged = check_self_contained(f, path, "trajectory", damaged_ok=not bool(attr_value(f.attrs.get("completed"))))
        try:
            return Trajectory(path, f, damaged)
        except (KeyError, ValueError, OSError, RuntimeError) as e:  # h5py raises RuntimeError on bad links
            why = _why(e) if isinstance(e, OSError) else e
            raise OutputError(f"'{path}' is a damaged agentsim trajectory: {why}") from e
