"""The study file: one HDF5 file per study, written by the driver only.

Layout (``format = "agentsim-study"``, ``format_version = 1``)::

    /                       attrs: format, format_version, spec (JSON: model, grid, seeds, agents,
                            steps, ...), runs_total, completed (bool: every run done or failed
                            and the summary written)
    /runs/<run_id>/         attrs: params (JSON) and each parameter by name, seed, combo,
                            replicate, attempts, seconds, completed (True once every series is in)
    /runs/<run_id>/<metric> [T] the metric's series (``step`` included); [T, K] for a vector metric
    /failures/<run_id>      attrs: params, seed, attempts, kind ("exception" or "system"),
                            error, traceback (a run that failed for good; removed if it
                            succeeds after a resume)
    /summary/<column>       one row per completed run: run_id, combo, replicate, seed, each
                            parameter, and per scalar metric ``final_<m>``, ``peak_<m>``,
                            ``peak_step_<m>`` (vector metrics have no summary columns)
    /bands/<combo>/<metric> [Q, T] quantiles over the combination's runs (attrs: quantiles,
                            params), equal to ``np.quantile(series, q, axis=0)``; [Q, T, K]
                            for a vector metric, each entry's quantiles

Every dataset is chunked with HDF5's Fletcher-32 checksum (``CHECKSUM``), and the summary's
strings are fixed-length UTF-8 bytes (files of agentsim < 0.4: variable-length strings, no
checksums; both read).

A run's group is written whole and the file flushed before the driver goes on, so a study
killed at any moment leaves every run finished before the last flush (a run group without
``completed`` is ignored and run again). The file is created under a temporary name and renamed
once its header is flushed; ``/summary`` and ``/bands`` are written into a copy of the file
(``.FILE.finishing``) that replaces it once flushed, so a failure there leaves the file
unchanged. Like a trajectory, it is written in SWMR mode, so other processes read it while the
study runs (:mod:`agentsim.io.live`).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shutil
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar, cast

import h5py
import numpy as np

from agentsim.errors import AgentsimError, ConfigError, OutputError, write_cause
from agentsim.io.faults import write_fault
from agentsim.io.h5check import DamagedFileError, check_regular, check_self_contained, dataset_problem
from agentsim.io.hdf5 import _why, attr_value, detach_file, injected_error, open_for_writing
from agentsim.io.live import UncopiedError, open_to_read, reopen_to_write, reopen_unshared, share

_F = TypeVar("_F", bound=Callable[..., Any])

__all__ = ["FORMAT", "StudyData", "StudyFile", "read_study", "study_status"]

FORMAT = "agentsim-study"
FORMAT_VERSION = 1
QUANTILES = (0.1, 0.5, 0.9)
#: Every numeric dataset is stored with HDF5's Fletcher-32 checksum of each chunk (chunks of h5py's
#: choosing; a dataset is written once, whole, never rewritten in place), which HDF5 checks on every
#: read: a flipped bit is an error, never a value. (The summary's strings are fixed-length UTF-8
#: bytes, which the filter covers; HDF5's variable-length strings are kept unchecked in a heap.)
CHECKSUM = {"chunks": True, "fletcher32": True}


def _text(value: str) -> np.ndarray:
    """``value`` as a fixed-length UTF-8 string attribute: kept in its object's header, which HDF5's
    v110 format checksums (a variable-length string sits in a heap no checksum covers, where a
    flipped bit can make HDF5 loop for ever).
    """
    data = value.encode()
    return np.array(data, dtype=h5py.string_dtype("utf-8", max(1, len(data))))


def _attrs(values: Mapping[str, Any]) -> dict[str, Any]:
    """``values`` with every string made a fixed-length attribute (:func:`_text`)."""
    return {k: _text(v) if isinstance(v, str) else v for k, v in values.items()}


def _open(path: str, mode: str, writing: bool = False) -> h5py.File:
    """``path`` opened to read (readable while a driver writes it), or to write (``mode`` "w" or
    "a"; a file whose driver was killed is first copied into a fresh one: :mod:`agentsim.io.live`).
    """
    try:
        if not writing:
            return open_to_read(path)
        opener = functools.partial(open_for_writing, fault=write_fault(path))
        file = opener(path, mode) if mode == "w" else reopen_to_write(path, mode, opener)
        if mode != "w":
            share(file)  # (a new file is shared once its header is in: StudyFile._create)
        return file
    except UncopiedError as e:
        raise DamagedFileError(f"cannot open study file '{path}': {e}") from e
    except OSError as e:
        text = str(e)
        if "unable to lock file" in text.lower():
            raise OutputError(f"study file '{path}' is open in another process (a study still running, or a "
                              "reader: close it there)") from e
        raise OutputError(f"cannot open study file '{path}': {text}") from e


def _check_format(f: h5py.File, path: str) -> dict[str, Any]:
    try:
        fmt = f.attrs.get("format")
    except (KeyError, OSError, RuntimeError, ValueError) as e:  # its root group was never written whole
        raise DamagedFileError(f"study file '{path}' is damaged beyond repair: its root group does not read ({e}); "
                               "move it away and run the study again") from e
    if attr_value(fmt) != FORMAT:
        raise OutputError(f"'{path}' is not an agentsim study file (format {attr_value(fmt)!r})")
    version = int(f.attrs.get("format_version", 0))
    if version > FORMAT_VERSION:
        raise OutputError(f"'{path}' has study format_version {version}; this agentsim reads <= {FORMAT_VERSION}")
    return dict(json.loads(f.attrs["spec"]))


def _writes(method: _F) -> _F:
    """Make a failed write of the study file fatal: an OutputError naming the file and the cause;
    the file is then given up (closed without writing more), so nothing later marks a run whose
    group did not reach the disk as complete, and ``--resume`` runs it again.
    """

    @functools.wraps(method)
    def wrapper(self: StudyFile, *args: Any, **kwargs: Any) -> Any:
        if self.error is not None:
            raise OutputError(self.error)
        try:
            return method(self, *args, **kwargs)
        except AgentsimError:
            raise
        except (OSError, RuntimeError) as e:  # h5py raises RuntimeError for failed flushes
            what = f" (run {args[0]})" if method.__name__ in ("write_run", "write_failure") and args else ""
            cause = write_cause(injected_error(self.file, e))
            then = ("every run is in the file, which is unchanged; --resume writes the summary" if
                    method.__name__ == "finish" else "runs not yet in the file run again with --resume")
            self.error = f"writing study file '{self.path}' failed{what}: {cause}; the study stops ({then})"
            self._abandon()
            raise OutputError(self.error) from e

    return cast(_F, wrapper)


class StudyFile:
    """The driver's handle on a study file (see the module docstring).

    Args:
        path: The file.
        spec: The study's specification (JSON-able); a resumed file must hold the same.
        resume: Continue an existing file (its completed runs are kept); else the file must not
            exist, unless ``overwrite``.
        overwrite: Replace an existing file (without ``resume``).
    """

    def __init__(self, path: str | os.PathLike[str], spec: Mapping[str, Any], total: int, *, resume: bool = False,
                 overwrite: bool = False) -> None:
        self.path = os.fspath(path)
        self._counts: dict[str, int] | None = None
        self.error: str | None = None  # the first write failure: the file is given up
        parent = os.path.dirname(os.path.abspath(self.path))
        if not os.path.isdir(parent):
            raise OutputError(f"cannot create study file '{self.path}': directory '{parent}' does not exist")
        text = json.dumps(spec, sort_keys=True)
        try:
            self._create(text, total, parent, resume, overwrite, spec)
        except (OSError, RuntimeError) as e:
            if isinstance(e, AgentsimError):
                raise
            self.error = f"cannot write study file '{self.path}': {write_cause(e)}"
            if hasattr(self, "file"):
                self._abandon()
            raise OutputError(self.error) from e

    def _create(self, text: str, total: int, parent: str, resume: bool, overwrite: bool,
                spec: Mapping[str, Any]) -> None:
        if resume and os.path.exists(self.path):
            with _open(self.path, "r") as f:  # is it this study? (read-only: a killed driver's file opens too)
                saved = _check_format(f, self.path)
                try:
                    check_self_contained(f, self.path, "study file", strings=True)
                    damaged = False
                except DamagedFileError:  # (rebuilt below from what reads back)
                    damaged = True
            if json.dumps(saved, sort_keys=True) != text:
                diff = sorted(k for k in set(saved) | set(spec) if saved.get(k) != spec.get(k))
                raise ConfigError(f"--resume: study file '{self.path}' holds another study (it differs in: "
                                  f"{', '.join(diff)})")
            if not damaged:
                try:
                    self.file = _open(self.path, "a", writing=True)
                except DamagedFileError:  # a killed driver's file that does not copy
                    damaged = True
            if not damaged:
                try:  # a write that failed part way (a full disk) can leave links to blocks never written,
                    # and a run's series whose bits changed fail their checksums: such runs run again
                    for run in self.done():
                        for series in self.file["runs"][run].values():
                            series[...]
                    len(self.file["failures"])
                except (KeyError, OSError, RuntimeError, ValueError):
                    self.file.close()
                    damaged = True
            if damaged:
                self._salvage(text, total, parent)
                self.file = _open(self.path, "a", writing=True)
            self.file.attrs["completed"] = False
            self.file.flush()
            self.write_status()
            return
        if os.path.exists(self.path) and not overwrite:
            raise OutputError(f"study file '{self.path}' exists: pass resume to continue it or overwrite to "
                              "replace it")
        tmp = os.path.join(parent, f".{os.path.basename(self.path)}.tmp{os.getpid()}")
        f = self._new_file(tmp, text, total)
        try:
            f.flush()
            f.close()
        except BaseException:
            detach_file(f)
            f.close()
            os.remove(tmp)
            raise
        os.replace(tmp, self.path)
        self.file = _open(self.path, "a", writing=True)
        self.write_status()

    def _new_file(self, tmp: str, text: str, total: int) -> h5py.File:
        f = _open(tmp, "w", writing=True)
        f.attrs.update(_attrs(dict(format=FORMAT, format_version=FORMAT_VERSION, spec=text, runs_total=total,
                                   completed=False)))
        f.create_group("runs")
        f.create_group("failures")
        return f

    def _salvage(self, text: str, total: int, parent: str) -> None:
        """Rebuild a damaged study file from what still reads back: every complete run and every
        failure whose group is intact is copied into a new file that replaces it (the damaged one
        is kept as ``FILE.damaged``); the rest run again.
        """
        tmp = os.path.join(parent, f".{os.path.basename(self.path)}.tmp{os.getpid()}")
        kept = 0
        with open_to_read(self.path) as src:
            dst = self._new_file(tmp, text, total)
            try:
                for group in ("runs", "failures"):
                    try:
                        names = list(src[group].keys())
                    except (KeyError, OSError, RuntimeError, ValueError):
                        continue
                    for name in names:
                        try:
                            g = src[group][name]
                            if group == "runs" and not g.attrs.get("completed", False):
                                continue
                            for key in g:  # every series reads back, from this file only
                                link = g.get(key, getlink=True)
                                if not isinstance(link, h5py.HardLink) or dataset_problem(g[key], True):
                                    raise ValueError(f"series {key!r} is not a dataset of this file")
                                g[key][...]
                            src.copy(g, dst[group], name=name)
                            kept += group == "runs"
                        except (KeyError, OSError, RuntimeError, ValueError):
                            continue
                dst.flush()
                dst.close()
            except BaseException:
                detach_file(dst)
                dst.close()
                os.remove(tmp)
                raise
        os.replace(self.path, f"{self.path}.damaged")
        os.replace(tmp, self.path)
        print(f"agentsim: warning: study file '{self.path}' was damaged (a write failed part way); rebuilt it "
              f"with the {kept} complete runs that read back (the damaged file is '{self.path}.damaged'); the "
              "other runs run again", file=sys.stderr)

    def _abandon(self) -> None:
        """Close the file after a failed write without writing to it again (see
        :meth:`agentsim.io.hdf5.TrajectoryWriter._abandon`): it keeps what its last flush wrote.
        """
        detach_file(self.file)
        try:
            self.file.close()
        except (OSError, RuntimeError):
            pass

    def _unshare(self) -> h5py.File:
        """The file opened again outside SWMR mode, to delete an object (see
        :func:`~agentsim.io.live.reopen_unshared`; shared again after the change's flush).
        """
        if self.file.swmr_mode:
            self.file = reopen_unshared(self.file, self.path,
                                        functools.partial(open_for_writing, fault=write_fault(self.path)))
        return self.file

    def done(self) -> set[str]:
        """The ids of the runs whose results are complete in the file."""
        return {k for k, g in self.file["runs"].items() if g.attrs.get("completed", False)}

    @_writes
    def write_run(self, run_id: str, params: Mapping[str, Any], seed: int, combo: int, replicate: int,
                  metrics: Mapping[str, np.ndarray], attempts: int, seconds: float) -> None:
        """Record a finished run (replacing a partial group from a killed driver) and flush: the
        series first, then (once they are on disk) the run's ``completed`` flag.
        """
        runs = self.file["runs"]
        if run_id in runs:
            if runs[run_id].attrs.get("completed", False) and self._counts is not None:
                self._counts["done"] -= 1
            runs = self._unshare()["runs"]
            del runs[run_id]
        g = runs.create_group(run_id)
        # (kept open until the flush, see _write_summary)
        made = [g.create_dataset(name, data=np.asarray(series), **CHECKSUM) for name, series in metrics.items()]
        g.attrs.update(_attrs(dict(params=json.dumps(dict(params), sort_keys=True), seed=seed, combo=combo,
                                   replicate=replicate, attempts=attempts, seconds=seconds)))
        g.attrs.update(_attrs({f"param.{k}": v for k, v in params.items()}))
        if run_id in self.file["failures"]:
            del self._unshare()["failures"][run_id]
            if self._counts is not None:
                self._counts["failed"] -= 1
            g = self.file["runs"][run_id]
        self.file.flush()  # the series on disk before the flag that says they are
        g.attrs["completed"] = True
        self.file.flush()
        made.clear()
        share(self.file)
        if self._counts is not None:
            self._counts["done"] += 1
        self.write_status()

    @_writes
    def write_failure(self, run_id: str, params: Mapping[str, Any], seed: int, attempts: int, kind: str,
                      error: str, traceback: str) -> None:
        """Record a run that failed for good, and flush."""
        failures = self.file["failures"]
        if run_id in failures:
            failures = self._unshare()["failures"]
            del failures[run_id]
        elif self._counts is not None:
            self._counts["failed"] += 1
        g = failures.create_group(run_id)
        g.attrs.update(_attrs(dict(params=json.dumps(dict(params), sort_keys=True), seed=seed, attempts=attempts,
                                   kind=kind, error=error, traceback=traceback)))
        self.file.flush()
        share(self.file)
        self.write_status()

    @_writes
    def finish(self, combos: Sequence[Mapping[str, Any]], quantiles: Sequence[float] = QUANTILES) -> None:
        """Write ``/summary`` and ``/bands`` from the completed runs and set ``completed``, in a copy
        of the file (``.FILE.finishing``) that replaces it once flushed: a failure (a full disk)
        leaves the file as its last run left it, and ``--resume`` writes the summary again.
        """
        self.file.flush()
        self.file.close()
        tmp = finishing_path(self.path)
        try:
            shutil.copyfile(self.path, tmp)
            f = open_for_writing(tmp, "r+", fault=write_fault(tmp))
        except BaseException:
            with contextlib.suppress(OSError):
                os.remove(tmp)
            raise
        try:
            _write_summary(f, combos, quantiles)
            f.close()
        except BaseException as e:
            detach_file(f)  # its handles then close without writing (see _write_summary)
            with contextlib.suppress(OSError, RuntimeError):
                f.close()
            os.remove(tmp)
            cause = injected_error(f, e)  # (the test hook's error, where one is injected)
            if cause is not e:
                raise cause from e
            raise
        os.replace(tmp, self.path)
        self.file = _open(self.path, "a", writing=True)
        self._counts = None
        self.write_status()

    def write_status(self) -> None:
        """The counts of :func:`study_status` in a side file (``FILE.status.json``, replaced
        atomically by a rename; not fsync-ed: it is a progress report, the HDF5 file is the
        record), for readers of a running study, whose HDF5 file the driver keeps locked.
        """
        if self._counts is None:  # once per open; then kept up to date by write_run / write_failure
            self._counts = {"done": len(self.done()), "failed": len(self.file["failures"])}
        total = int(self.file.attrs["runs_total"])
        done, failed = self._counts["done"], self._counts["failed"]
        status = {"total": total, "done": done, "failed": failed, "remaining": total - done - failed,
                  "completed": bool(self.file.attrs.get("completed", False))}
        target = status_path(self.path)
        tmp = f"{target}.tmp{os.getpid()}"
        try:
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump(status, f)
        except BaseException:
            with contextlib.suppress(OSError):
                os.remove(tmp)
            raise
        os.replace(tmp, target)

    def close(self) -> None:
        """Flush and close (a file given up after a failed write is closed already)."""
        if self.error is None and self.file.id.valid:
            self._close()

    @_writes
    def _close(self) -> None:
        self.file.flush()
        self.file.close()


def status_path(path: str) -> str:
    """The side file with a running study's counts (see :meth:`StudyFile.write_status`)."""
    return f"{path}.status.json"


def finishing_path(path: str) -> str:
    """The copy :meth:`StudyFile.finish` writes the summary into before it replaces the file."""
    return os.path.join(os.path.dirname(os.path.abspath(path)), f".{os.path.basename(path)}.finishing")


def _write_summary(f: h5py.File, combos: Sequence[Mapping[str, Any]], quantiles: Sequence[float]) -> None:
    """``/summary`` and ``/bands`` of the completed runs of ``f`` (replacing any), ``completed``
    set, and ``f`` flushed.

    Every object made here stays open until the flush: HDF5 cannot close a handle whose write
    failed (the process then crashes as it exits), so on a failure the caller detaches the file
    first, and only then are these closed, their writes going nowhere.
    """
    for name in ("summary", "bands"):
        if name in f:
            del f[name]
    made: list[h5py.Group | h5py.Dataset] = []
    table = summary_table(f)
    s = f.create_group("summary")
    made.append(s)
    for col, values in table.items():  # strings as fixed-length bytes, which the checksum covers
        data = np.char.encode(values, "utf-8") if values.dtype.kind == "U" else values
        made.append(s.create_dataset(col, data=data, **CHECKSUM))
    b = f.create_group("bands")
    made.append(b)
    b.attrs["quantiles"] = np.asarray(quantiles, dtype=np.float64)
    by_combo: dict[int, list[h5py.Group]] = {}
    for g in f["runs"].values():  # one pass: the runs of every combination
        if g.attrs.get("completed", False):
            by_combo.setdefault(int(g.attrs["combo"]), []).append(g)
    for combo, params in enumerate(combos):
        runs = by_combo.get(combo, [])
        if not runs:
            continue
        cg = b.create_group(f"c{combo:04d}")
        made.append(cg)
        cg.attrs["params"] = _text(json.dumps(dict(params), sort_keys=True))
        cg.attrs["runs"] = len(runs)
        for metric in runs[0].keys():
            bands = quantile_bands((g[metric][...] for g in runs), quantiles)
            made.append(cg.create_dataset(metric, data=bands, **CHECKSUM))
    f.attrs["completed"] = len(f["runs"]) + len(f["failures"]) >= int(f.attrs["runs_total"]) and not len(
        f["failures"])
    f.flush()
    made.clear()


def summary_table(f: h5py.File) -> dict[str, np.ndarray]:
    """One row per completed run: ids, seed, parameters, and final / peak / peak step of every scalar
    metric (vector metrics, ``[T, K]`` series, are left out).
    """
    runs = sorted((k, g) for k, g in f["runs"].items() if g.attrs.get("completed", False))
    cols: dict[str, list[Any]] = {"run_id": [], "combo": [], "replicate": [], "seed": []}
    for k, g in runs:
        cols["run_id"].append(k)
        cols["combo"].append(int(g.attrs["combo"]))
        cols["replicate"].append(int(g.attrs["replicate"]))
        cols["seed"].append(int(g.attrs["seed"]))
        for name, v in json.loads(g.attrs["params"]).items():
            cols.setdefault(name, []).append(v)
        for metric in g.keys():
            if metric == "step":
                continue
            series = np.asarray(g[metric][...])
            if series.ndim != 1:  # a vector metric
                continue
            steps = np.asarray(g["step"][...]) if "step" in g else np.arange(len(series))
            peak = int(np.argmax(series)) if len(series) else 0
            cols.setdefault(f"final_{metric}", []).append(series[-1] if len(series) else np.nan)
            cols.setdefault(f"peak_{metric}", []).append(series[peak] if len(series) else np.nan)
            cols.setdefault(f"peak_step_{metric}", []).append(int(steps[peak]) if len(series) else -1)
    return {k: np.asarray(v) for k, v in cols.items()}


@dataclass
class StudyData:
    """A study file read back (see :func:`read_study`).

    Attributes:
        path: The file.
        spec: The study's specification.
        completed: Whether every run is done (none failed) and the summary written.
        runs: Run id to ``{"params", "seed", "combo", "replicate", "attempts", "metrics"}``.
        failures: Run id to ``{"params", "seed", "attempts", "kind", "error", "traceback"}``.
        summary: Column name to ``[R]`` array (one row per completed run).
        bands: Combination id to ``{"params", "runs", metric: [Q, T]}``; ``quantiles`` the Q levels.
    """

    path: str
    spec: dict[str, Any]
    completed: bool
    runs: dict[str, dict[str, Any]]
    failures: dict[str, dict[str, Any]]
    summary: dict[str, np.ndarray]
    bands: dict[str, dict[str, Any]]
    quantiles: np.ndarray

    def to_dataframe(self) -> Any:
        """The summary as a pandas DataFrame (needs pandas)."""
        import importlib

        try:
            pd = importlib.import_module("pandas")
        except ImportError:
            raise ImportError('to_dataframe needs pandas: pip install "agentsim[analysis]" (.summary is a dict of '
                              "numpy arrays)") from None
        return pd.DataFrame(self.summary)


def read_study(path: str | os.PathLike[str]) -> StudyData:
    """Read a study file: runs, failures, the summary (computed from the runs if the study did
    not finish) and the quantile bands.
    """
    path = os.fspath(path)
    check_regular(path, "study file")
    if not h5py.is_hdf5(path):
        raise OutputError(f"cannot read study file '{path}': not an HDF5 file")
    with _open(path, "r") as f:
        spec = _check_format(f, path)
        check_self_contained(f, path, "study file", strings=True)
        try:
            return _read_study(f, path, spec)
        except (KeyError, OSError, RuntimeError, ValueError) as e:
            what = _why(e) if isinstance(e, OSError) else f"{type(e).__name__}: {e}"
            raise DamagedFileError(f"study file '{path}' is damaged ({what}); --resume runs again the runs that "
                                   "do not read back") from e


def _read_study(f: h5py.File, path: str, spec: dict[str, Any]) -> StudyData:
    """The body of :func:`read_study`, on its open file."""
    runs = {}
    for k, g in f["runs"].items():
        if g.attrs.get("completed", False):
            runs[k] = {"params": json.loads(g.attrs["params"]), "seed": int(g.attrs["seed"]),
                       "combo": int(g.attrs["combo"]), "replicate": int(g.attrs["replicate"]),
                       "attempts": int(g.attrs["attempts"]), "metrics": {m: g[m][...] for m in g.keys()}}
    failures = {k: {"params": json.loads(g.attrs["params"]), "seed": int(g.attrs["seed"]),
                    "attempts": int(g.attrs["attempts"]), "kind": attr_value(g.attrs["kind"]),
                    "error": attr_value(g.attrs["error"]), "traceback": attr_value(g.attrs["traceback"])}
                for k, g in f["failures"].items()}
    if "summary" in f:
        summary = {}
        for col, d in f["summary"].items():
            values = d[...]
            summary[col] = (np.char.decode(values, "utf-8") if values.dtype.kind == "S" else
                            values.astype(str) if values.dtype.kind == "O" else values)
    else:
        summary = summary_table(f)
    bands: dict[str, dict[str, Any]] = {}
    quantiles = np.asarray(f["bands"].attrs["quantiles"]) if "bands" in f else np.asarray(QUANTILES)
    for cid, cg in (f["bands"].items() if "bands" in f else []):
        bands[cid] = {"params": json.loads(cg.attrs["params"]), "runs": int(cg.attrs["runs"]),
                      **{m: cg[m][...] for m in cg.keys()}}
    return StudyData(path, spec, bool(f.attrs.get("completed", False)), runs, failures, summary, bands,
                     quantiles)


def study_status(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Done, failed and remaining runs of a study file (running, finished or crashed).

    A study whose driver is running holds the file's lock: its counts come from the side file
    the driver rewrites (atomically) after every run (:meth:`StudyFile.write_status`); otherwise
    from the file itself.
    """
    path = os.fspath(path)
    check_regular(path, "study file")
    try:
        f = open_to_read(path)
    except OSError as e:
        if "unable to lock file" not in str(e).lower():
            raise OutputError(f"cannot open study file '{path}': {e}") from e
        try:  # the driver is running
            with open(status_path(path), encoding="utf-8") as side:
                return {"path": path, **json.load(side)}
        except (OSError, ValueError):
            raise OutputError(f"study file '{path}' is being written and has no status file yet: "
                              "ask again") from e
    with f:
        _check_format(f, path)
        check_self_contained(f, path, "study file", strings=True)
        total = int(f.attrs["runs_total"])
        try:
            done = sum(1 for g in f["runs"].values() if g.attrs.get("completed", False))
            failed = len(f["failures"])
        except (KeyError, RuntimeError, ValueError) as e:
            raise OutputError(f"study file '{path}' is damaged (a write failed part way?): {e}; --resume rebuilds "
                              "it from the runs that read back") from e
        completed = bool(f.attrs.get("completed", False))
    return {"path": path, "total": total, "done": done, "failed": failed, "remaining": total - done - failed,
            "completed": completed}


def quantile_bands(series: Iterable[np.ndarray], quantiles: Sequence[float] = QUANTILES) -> np.ndarray:
    """``[Q, T]`` quantiles over runs of equal length (what ``/bands`` holds; ``[Q, T, K]`` for
    ``[T, K]`` series).
    """
    return np.quantile(np.stack([np.asarray(s, dtype=np.float64) for s in series]), list(quantiles), axis=0)
