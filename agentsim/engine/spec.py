"""One description of a run: :class:`RunSpec`, what :func:`agentsim.run`, :func:`agentsim.launch`,
``agentsim run`` and config files all build, checked once, and what the worker processes receive.

A RunSpec is a frozen dataclass of the run's options (the model, its size and length, the
partitioner and its options, what to record, checkpoints, timeouts, the check mode). Building one
checks every option with the checks the engine uses (the same messages); :meth:`RunSpec.to_dict`
and :meth:`RunSpec.from_dict` turn it into a plain dict of JSON values and back (a config file's
keys are its field names), which is how it reaches the worker processes of :func:`agentsim.launch`.

:func:`make_simulation` and :func:`run_simulation` are the one place where a spec becomes a
:class:`~agentsim.engine.simulation.Simulation` and its run: one process, a worker of
:func:`agentsim.launch`, or a rank under torchrun.

Examples:
    >>> spec = RunSpec("randomwalk", agents=100, steps=3, seed=1, params={"step_size": 0.5})
    >>> RunSpec.from_dict(spec.to_dict()) == spec
    True
    >>> spec.to_dict()["params"], spec.replace(steps=5).steps
    ({'step_size': 0.5}, 5)
    >>> RunSpec.from_dict({"model": "randomwalk", "agnets": 100})
    Traceback (most recent call last):
    ...
    agentsim.errors.ConfigError: unknown run option 'agnets' (valid: model, agents, ...). Perhaps you meant 'agents'?
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, TypedDict

import numpy as np

from agentsim.core.catalog import BUILTIN, get_model, is_file_reference, module_reference
from agentsim.core.comm import Comm
from agentsim.core.model import Model
from agentsim.distributed.partition import SPATIAL_OPTIONS
from agentsim.distributed.partitioners import check_run_partition
from agentsim.distributed.process_group import DEFAULT_TIMEOUT, check_timeout
from agentsim.engine.contract import check_every_steps
from agentsim.engine.simulation import RunResult, Simulation, check_agents, check_seed, check_steps, resolve_device
from agentsim.errors import ConfigError, did_you_mean
from agentsim.io.checkpoint import check_keep
from agentsim.io.recording import check_every

__all__ = ["ModelRef", "RunOptions", "RunSpec", "make_simulation", "model_ref", "resolve_model", "run_simulation"]

PathLike = str | os.PathLike[str]


def _check_bool(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"{name}: expected true or false (got {value!r})")
    return value


def _check_count(name: str, value: object, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        raise ConfigError(f"{name}: expected an int >= {low} (got {value!r})")
    return int(value)


def _path(name: str, value: object) -> str | None:
    if value is None:
        return None
    if not isinstance(value, (str, os.PathLike)):
        raise ConfigError(f"{name}: expected a path (got {type(value).__name__})")
    return os.fspath(value)


def _names(name: str, value: object) -> tuple[str, ...] | None:
    """None, or a list of names (a string: comma-separated) as a tuple."""
    if value is None:
        return None
    if isinstance(value, str):
        value = [v.strip() for v in value.split(",") if v.strip()]
    if not isinstance(value, Iterable) or isinstance(value, Mapping) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{name}: expected a list of names (got {value!r})")
    return tuple(value)


@dataclass(frozen=True)
class RunSpec:
    """A run, checked (see the module docstring). Every field but ``model`` has a default.

    Attributes:
        model: A model name (``"sir"``), ``"package.module:ATTR"``, ``"path/to/file.py:ATTR"``, or a
            :class:`~agentsim.core.model.Model` (in-process; :meth:`to_dict` finds where it is defined,
            as :func:`model_ref` does).
        agents: Agents at step 0 (None: the model's default).
        steps: Steps to run (from step 0, or from the checkpoint of ``resume``).
        seed: The run seed.
        params: Parameter overrides (checked against the model: a misspelt name is an error).
        substeps: The substeps to run, in order, by name (None: the model's).
        device: ``"cpu"``, ``"cuda"`` or ``"cuda:N"``.
        nprocs: Local processes (> 1: :func:`agentsim.launch`; the result is bitwise the same).
        partition: ``"data"`` or ``"spatial"`` (None: ``"data"``), with several processes.
        layout, balance_every, balance_threshold, bins, overlap: Options of ``partition="spatial"``
            (:class:`~agentsim.distributed.spatial.SpatialPartition`; None: its defaults).
        sync_every: Neighbor refresh period in steps (1: exact; see :mod:`agentsim.distributed.snapshot`).
        out: The HDF5 trajectory file to write (None: metrics in memory only).
        record, every: What to record and how often (see :meth:`Simulation.run <agentsim.Simulation.run>`).
        append: Continue the trajectory file ``out`` of the run ``resume`` continues.
        resume: A checkpoint, or a directory of them, to start from.
        checkpoint_every, checkpoint_dir, keep, checkpoint_async: Checkpoints during the run (as
            :meth:`Simulation.run <agentsim.Simulation.run>`).
        timeout: Seconds a collective waits for the other processes before failing.
        max_restarts: With several processes, restarts from the newest checkpoint after a failure.
        check: The check mode (:mod:`agentsim.engine.contract`): True, or K to check every K-th step.
        progress: A progress bar (one process, on a terminal).

    Raises:
        ConfigError: A bad value (the message names the field, what was expected and what was got).
    """

    model: str | Model
    agents: int | None = None
    steps: int = 100
    seed: int = 0
    params: Mapping[str, Any] | None = None
    substeps: tuple[str, ...] | None = None
    device: str = "cpu"
    nprocs: int = 1
    partition: str | None = None
    layout: str | None = None
    balance_every: int | None = None
    balance_threshold: float | None = None
    bins: int | None = None
    overlap: bool | None = None
    sync_every: int = 1
    out: PathLike | None = None
    record: tuple[str, ...] | None = None
    every: int | None = None
    append: bool = False
    resume: PathLike | None = None
    checkpoint_every: int | None = None
    checkpoint_dir: PathLike | None = None
    keep: int | None = None
    checkpoint_async: bool = False
    timeout: float = DEFAULT_TIMEOUT
    max_restarts: int = 0
    check: bool | int = False
    progress: bool = False
    _resolved: Model | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        put = object.__setattr__  # frozen: the checked values replace the given ones, once, here
        if not isinstance(self.model, (str, Model)):
            raise ConfigError(f"model: expected a Model or a model name (got {type(self.model).__name__})")
        if self.params is not None and not isinstance(self.params, Mapping):
            raise ConfigError(f"params: expected a mapping of parameter name to value (got {self.params!r})")
        put(self, "params", None if self.params is None else dict(self.params))
        put(self, "substeps", _names("substeps", self.substeps))
        resolved = self._configured()  # an unknown model, parameter or substep fails here
        put(self, "_resolved", resolved)
        if self.params is not None:  # as the model converted them ('0.05' from the command line: 0.05)
            put(self, "params", {name: resolved.params[name] for name in self.params})
        put(self, "agents", None if self.agents is None else check_agents(self.agents))
        put(self, "steps", check_steps(self.steps))
        put(self, "seed", check_seed(self.seed))
        if not isinstance(self.device, str):
            raise ConfigError(f"device: expected a name such as 'cpu' or 'cuda' (got {self.device!r})")
        resolve_device(self.device)
        put(self, "nprocs", _check_count("nprocs", self.nprocs, 1))
        _, _, sync_every = check_run_partition(self.partition, self.sync_every, **self.partition_options())
        put(self, "sync_every", sync_every)
        put(self, "out", _path("out", self.out))
        put(self, "record", _names("record", self.record))
        check_every(self.every)
        _check_bool("append", self.append)
        put(self, "resume", _path("resume", self.resume))
        check_every(self.checkpoint_every, "checkpoint_every")
        put(self, "checkpoint_dir", _path("checkpoint_dir", self.checkpoint_dir))
        if self.checkpoint_every is not None and self.checkpoint_dir is None:
            raise ConfigError("checkpoint_every needs a checkpoint_dir (where the checkpoints go)")
        check_keep(self.keep)
        _check_bool("checkpoint_async", self.checkpoint_async)
        put(self, "timeout", check_timeout(self.timeout))
        put(self, "max_restarts", _check_count("max_restarts", self.max_restarts, 0))
        check_every_steps(self.check)
        _check_bool("progress", self.progress)

    def _configured(self) -> Model:
        model = get_model(self.model) if isinstance(self.model, str) else self.model
        if self.params or self.substeps is not None:
            model = model.configure(params=self.params, substeps=self.substeps)
        return model

    # ------------------------------------------------------------------ derived values
    def resolved_model(self) -> Model:
        """The model that runs: ``model`` with ``params`` and ``substeps`` applied."""
        assert self._resolved is not None
        return self._resolved

    def resolved_agents(self) -> int:
        """``agents``, or the model's default."""
        return self.resolved_model().default_agents if self.agents is None else self.agents

    @property
    def partition_name(self) -> str:
        """The partitioner of a run on several processes (``partition``, by default ``"data"``)."""
        return self.partition or "data"

    def partition_options(self) -> dict[str, Any]:
        """The spatial partitioner's options given (those not None), by name."""
        return {k: getattr(self, k) for k in SPATIAL_OPTIONS if getattr(self, k) is not None}

    def checkpoint_options(self) -> dict[str, Any]:
        """The checkpoint keywords of :meth:`Simulation.run <agentsim.Simulation.run>`."""
        return {"checkpoint_every": self.checkpoint_every, "checkpoint_dir": self.checkpoint_dir, "keep": self.keep,
                "checkpoint_async": self.checkpoint_async}

    def replace(self, **changes: Any) -> RunSpec:
        """A copy with ``changes`` (checked again)."""
        return dataclasses.replace(self, **changes)

    # ------------------------------------------------------------------ plain values
    @classmethod
    def fields(cls) -> tuple[str, ...]:
        """The run options, in order (the keys of :meth:`to_dict`)."""
        return tuple(f.name for f in dataclasses.fields(cls) if f.init)

    def to_dict(self) -> dict[str, Any]:
        """The spec as a dict of plain values (JSON values when ``params`` holds JSON values); every
        field, also those left at their default. A :class:`~agentsim.core.model.Model` becomes the
        reference that imports it (:func:`model_ref`) with its parameters and
        substeps; a file reference ``'file.py:ATTR'`` an absolute path.
        """
        out = {name: getattr(self, name) for name in self.fields()}
        what, params, substeps = model_ref(self.model)
        out["model"] = what
        if params is not None:  # a Model object: its values, with this spec's overrides on top
            out["params"] = {**params, **(self.params or {})}
            out["substeps"] = list(self.substeps) if self.substeps is not None else substeps
        for key in ("substeps", "record"):
            if isinstance(out[key], tuple):
                out[key] = list(out[key])
        return out

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> RunSpec:
        """A spec from :meth:`to_dict`'s dict, a config file's keys, or any subset with ``model``.

        Raises:
            ConfigError: An unknown key (with the closest valid one), no ``model``, or a bad value.
        """
        known = cls.fields()
        for key in values:
            if key not in known:
                raise ConfigError(f"unknown run option '{key}' (valid: {', '.join(known)})."
                                  + did_you_mean(str(key), known))
        if "model" not in values:
            raise ConfigError("no model given: a run needs 'model' (a model name, 'module:ATTR' or 'file.py:ATTR')")
        return cls(**values)

    @classmethod
    def make(cls, model: str | Model | RunSpec, **options: Any) -> RunSpec:
        """``model`` itself when it is a spec (and no options are given), else a spec of ``model`` and
        ``options`` (an unknown option is a ConfigError with the closest valid one).
        """
        if isinstance(model, RunSpec):
            if options:
                raise ConfigError(f"a RunSpec holds every run option: got it with {', '.join(sorted(options))} "
                                  "as well (use spec.replace(...) to change some)")
            return model
        return cls.from_dict({"model": model, **options})


# --------------------------------------------------------------------------- model references
ModelRef = tuple[str, dict[str, Any] | None, list[str] | None]


class RunOptions(TypedDict, total=False):
    """The keyword options of :func:`agentsim.run` and :func:`agentsim.launch`: the fields of
    :class:`RunSpec` but ``model`` (what each means: :class:`RunSpec`), as they may be given
    (iterables for ``record`` and ``substeps``, any path-like for paths). For editors and type
    checkers; :class:`RunSpec` checks the values (tests/test_runspec.py keeps the two in step).
    """

    agents: int | None
    steps: int
    seed: int
    params: Mapping[str, Any] | None
    substeps: Iterable[str] | None
    device: str
    nprocs: int
    partition: str | None
    layout: str | None
    balance_every: int | None
    balance_threshold: float | None
    bins: int | None
    overlap: bool | None
    sync_every: int
    out: PathLike | None
    record: Iterable[str] | None
    every: int | None
    append: bool
    resume: PathLike | None
    checkpoint_every: int | None
    checkpoint_dir: PathLike | None
    keep: int | None
    checkpoint_async: bool
    timeout: float
    max_restarts: int
    check: bool | int
    progress: bool


def model_ref(model: Model | str) -> ModelRef:
    """A picklable reference to a model, ``(what, params, substep names)`` with ``what`` a built-in
    name, ``'module:ATTR'`` or ``'/abs/path/file.py:ATTR'``: :func:`resolve_model` turns it back
    into the model on a worker process.

    A :class:`~agentsim.core.model.Model` object is found by where it is defined: the first module,
    in this order, that holds it (or the definition it was configured from) at module level:
    the modules of its ``init`` function, of its substeps, metrics, derived metrics and rewards
    (a model is usually defined next to its functions), then the script's ``__main__``, then
    every imported module (a model assembled from functions defined elsewhere). A model found
    in ``__main__`` is named ``__main__:ATTR``: a worker process started by ``spawn`` runs the
    script's module level again (not its ``if __name__ == "__main__":`` block), so the model
    must be defined there.

    Raises:
        ConfigError: a name that does not resolve, or a model that no imported module holds
            (defined inside a function, or in an interactive session).
    """
    if isinstance(model, str):
        get_model(model)  # fail here, not on every rank
        where, sep, attr = model.rpartition(":")
        if sep and is_file_reference(where):  # workers start in this working directory; absolute all the same
            return f"{os.path.abspath(where)}:{attr}", None, None
        return model, None, None
    if not isinstance(model, Model):
        raise ConfigError(f"model: expected a Model or a model name (got {type(model).__name__})")
    params, substeps = dict(model.params), [s.name for s in model.substeps]
    if model.name in BUILTIN and model.same_definition(get_model(model.name)):
        return model.name, params, substeps
    for module in _candidate_modules(model):
        # type(v), not isinstance: it would read v.__class__, which some module attributes warn about
        found = next((k for k, v in list(vars(module).items())
                      if issubclass(type(v), Model) and model.same_definition(v)), None)
        if found is None:
            continue
        if module.__name__ == "__main__" and not os.path.isfile(getattr(module, "__file__", None) or ""):
            raise ConfigError(f"model '{model.name}' is defined in an interactive session (or `python -c`), "
                              "which worker processes cannot import: define it at module level in a file and "
                              "pass the Model, 'package.module:ATTR' or 'path/to/file.py:ATTR'")
        return module_reference(module, found), params, substeps
    raise ConfigError(f"model '{model.name}': cannot find it to import on the worker processes (no imported "
                      "module holds it at module level); define it at module level and pass "
                      "'package.module:ATTR' or 'path/to/file.py:ATTR'")


def _candidate_modules(model: Model) -> Iterator[ModuleType]:
    """The modules that may hold ``model``, in the order :func:`model_ref` searches them."""
    names = [n for n in (getattr(fn, "__module__", None) for fn in model.functions()) if isinstance(n, str)]
    seen: set[str] = set()
    for name in [*names, "__main__", *list(sys.modules)]:
        module = sys.modules.get(name)
        if not isinstance(module, ModuleType) or name in seen or name == "__mp_main__":
            continue
        if name != "__main__" and getattr(module, "__spec__", None) is None:
            continue  # made at run time (types.ModuleType): another process cannot import it
        seen.add(name)
        yield module


def resolve_model(ref: ModelRef) -> Model:
    """The model a :func:`model_ref` names (on a worker process)."""
    name, params, substeps = ref
    model = get_model(name)
    return model.configure(params=params, substeps=substeps) if params is not None or substeps else model


# --------------------------------------------------------------------------- the run
def make_simulation(spec: RunSpec, comm: Comm | None = None) -> Simulation:
    """The :class:`~agentsim.engine.simulation.Simulation` of ``spec`` on this process: one process
    (``comm`` None or of one rank: no partitioner options), or one rank of several.
    """
    several = comm is not None and comm.world_size > 1
    return Simulation(spec.resolved_model(), agents=spec.agents, seed=spec.seed, device=spec.device, comm=comm,
                      partition=spec.partition_name if several else None, sync_every=spec.sync_every,
                      resume=spec.resume, check=spec.check, **(spec.partition_options() if several else {}))


def run_simulation(spec: RunSpec, sim: Simulation, *, progress: bool | None = None, lock: bool = True) -> RunResult:
    """Run ``sim`` (made by :func:`make_simulation`) for ``spec.steps`` steps with ``spec``'s recording
    and checkpoints. ``progress``: instead of ``spec.progress``; ``lock``: as for :meth:`Simulation.run
    <agentsim.Simulation.run>` (False on the workers of :func:`agentsim.launch`, whose launcher holds the locks).
    """
    return sim.run(spec.steps, out=spec.out, record=spec.record, every=spec.every,
                   progress=spec.progress if progress is None else progress, append=spec.append, lock=lock,
                   **spec.checkpoint_options())
