""":class:`Study`: a parameter grid (or scenarios) times seeds, run by a process pool, into one
study file, with retries, an error policy, resume and progress.

Runs and seeds. Combination ``c`` (in grid order) and replicate ``r`` make the run
``c0003-r0007``. With ``seeds=[...]`` replicate ``r`` runs with ``seeds[r]``; with
``replicates=R`` its seed is derived from the study seed, the combination's parameters and
``r`` (SHA-256), so it does not depend on the order runs are scheduled in, on the executor, or
on the attempt: a retried run is its first attempt bit for bit.

Failures. A worker process that dies (killed, out of memory, a crash in native code) is a
*system* failure: the run is submitted again, up to ``retries`` more attempts (with the local
pool, every run in the pool at that moment: the pool cannot tell which run killed it). A Python
exception in a run is retried only with ``retry_exceptions=True``. A run out of attempts is
recorded in ``/failures`` with its parameters, seed, attempts and traceback. ``errors``:
``"off"`` goes on and returns; ``"slow"`` (default) goes on, then raises a
:class:`StudyError` listing the failed runs; ``"fast"`` stops scheduling at the first failure,
waits for the runs in flight (their results are kept) and raises.

Resume. ``resume=True`` reopens the study file (it must hold the same study) and runs only the
runs that are not complete in it (failed ones again); a run finished before the driver died is
never run again.

Executors (:mod:`agentsim.study.executors`): ``"local"`` (a ``spawn`` process pool of
``workers`` processes, one torch thread each) and ``"ray"`` (one Ray task per run, on a running
cluster or a local instance). The same study gives the same file on either.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sys
import time
import traceback
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import IO, Any

import numpy as np

from agentsim.core.catalog import get_model
from agentsim.core.model import Model
from agentsim.distributed.netcheck import DEFAULT_CONNECT_TIMEOUT, check_connect_timeout
from agentsim.engine.progress import progress_bar
from agentsim.engine.simulation import Simulation, check_agents, check_steps
from agentsim.errors import AgentsimError, ConfigError
from agentsim.io.locks import lock_run
from agentsim.runner.lifeline import refuse_unguarded_start
from agentsim.study.executors import EXECUTORS, LocalExecutor, RayExecutor, make_executor
from agentsim.study.store import StudyFile, read_study, status_path
from agentsim.study.sweep import grid

__all__ = ["ERROR_POLICIES", "Study", "StudyError", "StudyResult", "execute_run"]

ERROR_POLICIES = ("off", "slow", "fast")


class StudyError(AgentsimError):
    """Runs of a study failed for good (they are recorded in the study file's ``/failures``)."""


@dataclass(frozen=True)
class RunSpec:
    """One run of a study."""

    run_id: str
    combo: int
    replicate: int
    params: dict[str, Any]
    seed: int


@dataclass
class StudyResult:
    """What :meth:`Study.run` did (the results are in the study file, ``read_study(path)``).

    Attributes:
        path: The study file.
        executed: Runs executed by this call, successful attempts (resumed runs not counted twice).
        skipped: Runs already complete in the file (resume).
        failed: Run ids that failed for good.
        retries: Attempts submitted again after a failure.
        seconds: Wall time of the call.
    """

    path: str
    executed: int
    skipped: int
    failed: list[str]
    retries: int
    seconds: float


def derived_seed(study_seed: int, params: Mapping[str, Any], replicate: int) -> int:
    """A run's seed from the study seed, its parameters and its replicate index (62 bits)."""
    key = json.dumps({"seed": study_seed, "params": dict(params), "replicate": replicate}, sort_keys=True)
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "little") >> 2


def execute_run(model_ref: str, params: dict[str, Any], seed: int, agents: int, steps: int, device: str,
                options: dict[str, Any]) -> dict[str, Any]:
    """One run in a worker: ``{"ok": True, "metrics", "seconds"}`` or ``{"ok": False, "error",
    "traceback"}`` for a Python exception (a dying worker reports nothing).
    """
    t0 = time.perf_counter()
    try:
        options = dict(options)
        nprocs = options.pop("nprocs", 1)
        if nprocs > 1:  # a multi-rank run (the same metrics as one process, bit for bit)
            from agentsim.engine.spec import RunSpec
            from agentsim.runner.launch import launch

            result = launch(RunSpec.make(model_ref, agents=agents, steps=steps, seed=seed, params=params,
                                         device=device, nprocs=nprocs, **options))
        else:
            model = get_model(model_ref).configure(params=params)
            result = Simulation(model, agents=agents, seed=seed, device=device, **options).run(steps)
        metrics = {k: np.asarray(v) for k, v in result.metrics.items() if k != "seconds"}
    except Exception as e:
        return {"ok": False, "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}
    return {"ok": True, "metrics": metrics, "seconds": time.perf_counter() - t0}


class Study:
    """A population study (see the module docstring).

    Args:
        model: A model name, or ``"package.module:ATTR"`` (a model defined at module level, so
            that worker processes can import it).
        params: Parameter name to the list of values (their Cartesian product), or None.
        scenarios: A list of parameter dicts, instead of ``params``.
        seeds: The seeds of the replicates of every combination.
        replicates: Instead of ``seeds``: this many replicates with seeds derived from ``seed``.
        seed: The study seed (with ``replicates``).
        agents, steps: Of every run.
        device: Of every run.
        options: Further options of every run: :class:`~agentsim.engine.simulation.Simulation` options, or,
            with ``nprocs`` > 1, each run on that many processes with the options of
            :func:`~agentsim.runner.launch.launch` (``partition``, ``layout``,
            ``balance_every``, ...): the same metrics as one process, bit for bit.

    Examples:
        >>> study = Study("sir", params={"beta": [0.02, 0.04]}, replicates=3, agents=500, steps=10)
        >>> len(study.runs), study.runs[0].run_id
        (6, 'c0000-r0000')
    """

    def __init__(self, model: str | Model, params: Mapping[str, Sequence[Any]] | None = None, *,
                 scenarios: Sequence[Mapping[str, Any]] | None = None, seeds: Sequence[int] | None = None,
                 replicates: int | None = None, seed: int = 0, agents: int | None = None, steps: int = 100,
                 device: str = "cpu", options: Mapping[str, Any] | None = None) -> None:
        if isinstance(model, Model):
            from agentsim.engine.spec import model_ref

            ref, overrides, _ = model_ref(model)
            if overrides:
                raise ConfigError("Study: pass the model by name and the parameters in params/scenarios")
            model = ref
        if not isinstance(model, str):
            raise ConfigError(f"Study: model: expected a model name or 'module:ATTR' (got {type(model).__name__})")
        base = get_model(model)
        if params is not None and scenarios is not None:
            raise ConfigError("Study: give params (a grid) or scenarios (a list), not both")
        combos = grid(params) if params is not None else [dict(s) for s in (scenarios or [{}])]
        if not combos:
            raise ConfigError("Study: no parameter combination (an empty grid or scenario list)")
        for combo in combos:  # every value checked before anything runs
            base.configure(params=combo)
        if (seeds is None) == (replicates is None):
            raise ConfigError("Study: give seeds=[...] or replicates=R (not both, not neither)")
        if seeds is not None:
            seeds = [int(s) for s in seeds]
            if not seeds or len(set(seeds)) != len(seeds):
                raise ConfigError(f"Study: seeds: expected distinct ints (got {seeds!r})")
        elif isinstance(replicates, bool) or not isinstance(replicates, int) or replicates < 1:
            raise ConfigError(f"Study: replicates: expected an int >= 1 (got {replicates!r})")
        self.model = model
        self.combos = combos
        self.seeds, self.replicates, self.seed = seeds, replicates, int(seed)
        self.agents = check_agents(base.default_agents if agents is None else agents)
        self.steps = check_steps(steps)
        self.device = device
        self.options = dict(options or {})
        n_rep = len(seeds) if seeds is not None else int(replicates or 0)
        self.runs = [RunSpec(f"c{c:04d}-r{r:04d}", c, r, combo,
                             seeds[r] if seeds is not None else derived_seed(self.seed, combo, r))
                     for c, combo in enumerate(combos) for r in range(n_rep)]

    def spec(self) -> dict[str, Any]:
        """The study as JSON values (stored in the study file; a resume must match it)."""
        return {"model": self.model, "combos": self.combos, "seeds": self.seeds, "replicates": self.replicates,
                "seed": self.seed, "agents": self.agents, "steps": self.steps, "device": self.device,
                "options": {k: repr(v) for k, v in self.options.items()}}

    def run(self, out: str | os.PathLike[str], *, workers: int | None = None, executor: str = "local",
            resume: bool = False, overwrite: bool = False, retries: int = 3, retry_exceptions: bool = False,
            errors: str = "slow", progress: bool = False, log_json: str | IO[str] | None = None,
            address: str | None = None, cpus_per_run: float = 1.0, gpus_per_run: float = 0.0,
            connect_timeout: float = DEFAULT_CONNECT_TIMEOUT) -> StudyResult:
        """Run every run not yet complete in ``out`` (see the module docstring).

        Args:
            out: The study file.
            workers: Worker processes (default: the CPU count).
            executor: ``"local"`` (a process pool) or ``"ray"`` (:mod:`agentsim.study.executors`).
            address, cpus_per_run, gpus_per_run: Ray: a running cluster's address (default: start
                a local instance with ``workers`` CPUs) and the resources of one run.
            connect_timeout: Ray with an ``address``: seconds to wait for it to accept a
                connection (default 15), then a :class:`~agentsim.errors.NetworkError`. A study
                whose executor did not start leaves no study file behind (a file it resumed
                stays as it was).
            resume: Continue ``out``; ``overwrite``: replace it.
            retries: Further attempts of a failed run (system failures; exceptions with
                ``retry_exceptions``).
            errors: ``"off"``, ``"slow"`` or ``"fast"``.
            progress: A progress bar (done / failed / running) when stderr is a terminal.
            log_json: A path or a text stream: one JSON line per event (start, done, retry,
                failed, end).

        Raises:
            StudyError: Runs failed for good (``errors`` "slow" or "fast").
        """
        if executor not in EXECUTORS:
            raise ConfigError(f"executor: expected one of {', '.join(EXECUTORS)} (got {executor!r})")
        if errors not in ERROR_POLICIES:
            raise ConfigError(f"errors: expected one of {', '.join(ERROR_POLICIES)} (got {errors!r})")
        if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
            raise ConfigError(f"retries: expected an int >= 0 (got {retries!r})")
        n_workers = (os.cpu_count() or 1) if workers is None else workers
        if isinstance(n_workers, bool) or not isinstance(n_workers, int) or n_workers < 1:
            raise ConfigError(f"workers: expected an int >= 1 (got {workers!r})")
        connect_timeout = check_connect_timeout(connect_timeout)
        # spawned pool workers run the script's module level again (Ray's workers do not)
        refuse_unguarded_start("a study on a process pool" if executor == "local" else "a study", "study.run(...)",
                               from_parent=executor == "local")
        # This driver alone writes the file: a second driver given the same path (even with overwrite)
        # fails at once, naming this one, instead of replacing the file under it.
        locks = lock_run(out, what="study file")
        try:
            return self._run_locked(out, n_workers, executor, resume, overwrite, retries, retry_exceptions, errors,
                                    progress, log_json, address, cpus_per_run, gpus_per_run, connect_timeout)
        finally:
            for lock in reversed(locks):
                lock.release()

    def _run_locked(self, out: str | os.PathLike[str], n_workers: int, executor: str, resume: bool, overwrite: bool,
                    retries: int, retry_exceptions: bool, errors: str, progress: bool,
                    log_json: str | IO[str] | None, address: str | None, cpus_per_run: float, gpus_per_run: float,
                    connect_timeout: float) -> StudyResult:
        t0 = time.perf_counter()
        fresh = not (resume and os.path.exists(out))  # the file is made now (not one resumed)
        store = StudyFile(out, self.spec(), len(self.runs), resume=resume, overwrite=overwrite)
        log = _EventLog(log_json)
        try:
            done = store.done()
            todo = deque(r for r in self.runs if r.run_id not in done)
            log.event("start", total=len(self.runs), done=len(done), todo=len(todo), workers=n_workers)
            try:
                pool = make_executor(executor, n_workers, address, cpus_per_run, gpus_per_run, connect_timeout)
            except BaseException:
                if fresh:  # nothing ran: no file that a next run would refuse
                    store.close()
                    for path in (out, status_path(os.fspath(out))):
                        with contextlib.suppress(OSError):
                            os.remove(path)
                raise
            result = self._drive(store, todo, pool, retries, retry_exceptions, errors, progress, log)
            result.skipped = len(done)
            store.finish(self.combos)
        finally:
            store.close()
        result.seconds = time.perf_counter() - t0
        log.event("end", executed=result.executed, skipped=result.skipped, failed=len(result.failed),
                  seconds=round(result.seconds, 3))
        log.close()
        if result.failed and errors != "off":
            shown = ", ".join(result.failed[:10]) + (", ..." if len(result.failed) > 10 else "")
            raise StudyError(f"{len(result.failed)} of {len(self.runs)} runs failed ({shown}); their errors "
                             f"and tracebacks are in {result.path} under /failures (read_study(...).failures)")
        return result

    def _drive(self, store: StudyFile, todo: deque[RunSpec], pool: LocalExecutor | RayExecutor, retries: int,
               retry_exceptions: bool, errors: str, progress: bool, log: _EventLog) -> StudyResult:
        result = StudyResult(store.path, 0, 0, [], 0, 0.0)
        attempts = {r.run_id: 0 for r in todo}
        bar = progress_bar(len(todo), progress, "run")
        inflight: dict[Any, RunSpec] = {}
        stopping = False
        try:
            while todo or inflight:
                while todo and not stopping and len(inflight) < pool.workers:
                    run = todo.popleft()
                    attempts[run.run_id] += 1
                    inflight[pool.submit(execute_run, self.model, run.params, run.seed, self.agents, self.steps,
                                         self.device, self.options)] = run
                for handle in pool.wait(list(inflight)):
                    run = inflight.pop(handle)
                    out, kind = pool.outcome(handle)
                    n = attempts[run.run_id]
                    if out["ok"]:
                        store.write_run(run.run_id, run.params, run.seed, run.combo, run.replicate, out["metrics"],
                                        n, out["seconds"])
                        result.executed += 1
                        log.event("done", run=run.run_id, attempts=n, seconds=round(out["seconds"], 3))
                    elif n <= retries and (kind == "system" or retry_exceptions) and not stopping:
                        result.retries += 1
                        todo.appendleft(run)
                        log.event("retry", run=run.run_id, attempt=n, kind=kind, error=out["error"])
                        continue
                    else:
                        store.write_failure(run.run_id, run.params, run.seed, n, kind, out["error"],
                                            out["traceback"])
                        result.failed.append(run.run_id)
                        log.event("failed", run=run.run_id, attempts=n, kind=kind, error=out["error"])
                        if errors == "fast":
                            stopping = True
                    if bar is not None:
                        bar.update(1)
                        bar.set_postfix(failed=len(result.failed), running=len(inflight), left=len(todo))
                pool.recover()
                if stopping:
                    todo.clear()
        except BaseException:  # (Ctrl-C, SIGTERM, an error of the driver: the runs in flight are dropped)
            pool.shutdown(now=True)
            raise
        else:
            pool.shutdown()
        finally:
            if bar is not None:
                bar.close()
        result.failed.sort()
        return result

    def read(self, out: str | os.PathLike[str]) -> Any:
        """The study file ``out`` read back (:func:`~agentsim.study.store.read_study`)."""
        return read_study(out)


class _EventLog:
    """One JSON line per event, to a path (appended) or a stream; nothing when None."""

    def __init__(self, target: str | IO[str] | None) -> None:
        self._own = False
        if isinstance(target, str):
            self.stream: IO[str] | None = sys.stdout if target == "-" else open(target, "a", encoding="utf-8")
            self._own = target != "-"
        else:
            self.stream = target

    def event(self, what: str, **fields: Any) -> None:
        if self.stream is not None:
            self.stream.write(json.dumps({"event": what, "time": round(time.time(), 3), **fields}) + "\n")
            self.stream.flush()

    def close(self) -> None:
        if self._own and self.stream is not None:
            self.stream.close()
