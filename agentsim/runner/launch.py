"""Start a multi-rank run from Python: W local processes, one gloo (or NCCL) group, clean exit.

:func:`launch` runs a model; :func:`run_ranks` runs any function ``fn(comm, *args)``
on every rank (the tests use it to run several models in one job).

How it works: the calling process hosts the group's TCPStore on a port the OS picks
(port 0, so no hard-coded ports and no race for a free one), then starts the workers
with the ``spawn`` start method. Each worker sets one torch thread, joins the group
(:func:`agentsim.distributed.process_group.init`), calls ``fn`` and sends back its
return value, or its traceback if it raises, over its own pipe.

Failure handling: the launcher waits on the workers' pipes and process handles at
once. When a worker reports an exception or exits without reporting, the launcher
collects for a short grace period what the other ranks report (ranks talking to a
dead peer fail with connection errors soon after), terminates the rest, and raises
an :class:`~agentsim.errors.AgentsimError` (or the worker's own agentsim error class,
e.g. :class:`~agentsim.errors.ConfigError`) naming the rank that failed first, with
its traceback or exit code. A rank waiting in a collective for a peer that never
comes raises after the group's ``timeout``, so a run never hangs.
"""

from __future__ import annotations

import os
import pickle
import signal
import sys
import time
import traceback
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from multiprocessing.connection import Connection, wait
from types import ModuleType
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from agentsim import errors
from agentsim.core.catalog import BUILTIN, get_model, is_file_reference, module_reference
from agentsim.core.comm import Comm
from agentsim.core.model import Model
from agentsim.distributed.comm import FAILURE_GRACE_SECONDS
from agentsim.distributed.partitioners import check_run_partition
from agentsim.distributed.process_group import DEFAULT_TIMEOUT, check_timeout, init, shutdown
from agentsim.engine.simulation import RunResult, Simulation, check_agents, check_seed, check_steps
from agentsim.errors import AgentsimError, ConfigError
from agentsim.io.checkpoint import checkpoint_step, latest_checkpoint, resolve_checkpoint
from agentsim.io.locks import lock_run
from agentsim.io.recording import check_every
from agentsim.runner.lifeline import die_with_parent

__all__ = ["LaunchResult", "check_resume", "launch", "model_ref", "resolve_model", "run_ranks"]

# After a first failure, how long to collect the other ranks' reports: long enough for a rank whose
# collective failed to ask who never arrived (FAILURE_GRACE_SECONDS) and report it.
_GRACE_SECONDS = FAILURE_GRACE_SECONDS + 2.0
_TERMINATE_SECONDS = 5.0  # SIGTERM, then SIGKILL after this long


# --------------------------------------------------------------------------- workers
def _describe_error(e: BaseException) -> dict[str, Any]:
    is_comm = isinstance(e, (dist.DistError, errors.CollectiveError)) or any(
        s in str(e) for s in ("Connection closed by peer", "Connection reset by peer", "gloo", "Broken pipe"))
    return {"type": type(e).__name__, "module": type(e).__module__, "message": str(e),
            "traceback": traceback.format_exc(), "is_comm": is_comm}


def _worker(rank: int, world_size: int, port: int, timeout: float, device: str | None,
            fn: Callable[..., Any], args: tuple[Any, ...], conn: Connection, parent: int) -> None:
    die_with_parent(parent)  # a launcher killed with SIGKILL takes its workers with it
    torch.set_num_threads(1)
    try:
        comm = init(rank, world_size, "127.0.0.1", port, timeout=timeout, device=device, host_store=False)
        result = fn(comm, *args)
        shutdown(ok=True)
        payload = pickle.dumps(result, protocol=pickle.HIGHEST_PROTOCOL)
    except BaseException as e:
        report = _describe_error(e)
        shutdown(ok=False)
        try:
            conn.send(("error", report))
        finally:
            conn.close()
        sys.exit(1)
    conn.send(("ok", payload))
    conn.close()


# --------------------------------------------------------------------------- launcher
@dataclass
class _Failure:
    rank: int
    report: dict[str, Any] | None = None  # None: the process exited without reporting
    exitcode: int | None = None

    @property
    def weight(self) -> int:
        """Which failure to blame: a silent death, then a real exception, then a comm error."""
        if self.report is None:
            return 0
        return 2 if self.report["is_comm"] else 1

    def summary(self) -> str:
        """One line: the error's type and the first line of its message, or the exit code."""
        if self.report is None:
            return f"exit code {self.exitcode}"
        first = self.report["message"].strip().splitlines()[0] if self.report["message"].strip() else ""
        return f"{self.report['type']}: {first[:400]}" if first else self.report["type"]

    def describe(self, world_size: int) -> str:
        if self.report is None:
            code = self.exitcode
            how = f"exit code {code}"
            if code is not None and code < 0:
                try:
                    how = f"signal {signal.Signals(-code).name}"
                except ValueError:
                    how = f"signal {-code}"
            return f"rank {self.rank} of {world_size} died ({how}) without reporting an error"
        r = self.report
        if r["module"] == errors.__name__:  # agentsim's own error: its message says it all
            return f"rank {self.rank} of {world_size} failed with {r['type']}: {r['message']}"
        return (f"rank {self.rank} of {world_size} failed with {r['type']}: {r['message']}\n"
                f"--- traceback of rank {self.rank} ---\n{r['traceback'].rstrip()}")


def _error_class(report: dict[str, Any] | None) -> type[AgentsimError]:
    if report is not None and report["module"] == errors.__name__:
        cls = getattr(errors, report["type"], None)
        if isinstance(cls, type) and issubclass(cls, AgentsimError):
            return cls
    return AgentsimError


def _stop(procs: Sequence[Any], finished: bool) -> None:
    """Let finished workers exit on their own (briefly); SIGTERM the rest, then SIGKILL."""
    deadline = time.monotonic() + _TERMINATE_SECONDS
    if finished:
        for p in procs:
            p.join(max(0.0, deadline - time.monotonic()))
    for p in procs:
        if p.is_alive():
            p.terminate()
    deadline = time.monotonic() + _TERMINATE_SECONDS
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
        if p.is_alive():
            p.kill()
            p.join()


def run_ranks(fn: Callable[..., Any], world_size: int, args: Iterable[Any] = (), *,
              timeout: float = DEFAULT_TIMEOUT, device: str | None = None,
              started: Callable[[list[int]], None] | None = None) -> list[Any]:
    """Run ``fn(comm, *args)`` on ``world_size`` new local processes; return their results.

    Args:
        fn: A module-level (picklable) function; its first argument is the rank's
            :class:`~agentsim.distributed.comm.TorchComm`. Its return value is pickled
            back (keep it small: metrics, rank 0's gathered rows).
        world_size: Number of processes (>= 1; 1 still starts a process, with a LocalComm).
        args: Further arguments for ``fn`` (picklable).
        timeout: Seconds a collective waits before it fails (the process group's timeout).
        device: ``"cpu"`` (gloo) or ``"cuda"`` (NCCL, one GPU per rank).
        started: Called with the workers' pids once they are all started.

    The workers die with this process (:func:`agentsim.runner.lifeline.die_with_parent`): a launcher
    killed with SIGKILL leaves no worker running.

    Returns:
        The return values in rank order.

    Raises:
        AgentsimError: A rank raised or died (the error names the rank, with its
            traceback or exit code); a worker's agentsim error keeps its class.
    """
    if isinstance(world_size, bool) or not isinstance(world_size, (int, np.integer)) or world_size < 1:
        raise ConfigError(f"world_size: expected an int >= 1 (got {world_size!r})")
    world_size = int(world_size)
    timeout = check_timeout(timeout)
    args = tuple(args)
    ctx = mp.get_context("spawn")
    store = dist.TCPStore("127.0.0.1", 0, world_size=world_size, is_master=True,
                          timeout=timedelta(seconds=timeout), wait_for_workers=False)
    procs, conns = [], []
    finished = False
    try:
        for rank in range(world_size):
            parent, child = ctx.Pipe(duplex=False)
            p = ctx.Process(target=_worker, name=f"agentsim-rank-{rank}", daemon=True,
                            args=(rank, world_size, store.port, timeout, device, fn, args, child, os.getpid()))
            p.start()
            child.close()
            procs.append(p)
            conns.append(parent)
        if started is not None:
            started([p.pid for p in procs if p.pid is not None])
        results = _collect(procs, conns, world_size)
        finished = True
        return results
    finally:
        _stop(procs, finished)
        for c in conns:
            c.close()
        del store


def _collect(procs: list[Any], conns: list[Connection], world_size: int) -> list[Any]:
    """Wait for every rank's message; on a failure, give the others a grace period, then raise."""
    results: dict[int, Any] = {}
    failures: list[_Failure] = []
    open_conns = {c: r for r, c in enumerate(conns)}
    live = {p.sentinel: r for r, p in enumerate(procs)}

    def receive(conn: Connection) -> None:
        rank = open_conns.pop(conn)  # one message per worker
        try:
            kind, payload = conn.recv()
        except (EOFError, OSError):
            return  # closed without a message: its exit code tells what happened
        if kind == "ok":
            results[rank] = pickle.loads(payload)
        else:
            failures.append(_Failure(rank, report=payload))

    grace_end: float | None = None
    while len(results) < world_size and (open_conns or live):
        left = None if grace_end is None else grace_end - time.monotonic()
        if left is not None and left <= 0:
            break
        ready = wait([*open_conns, *live], timeout=left)
        for obj in ready:
            if obj in open_conns:
                receive(obj)
        for obj in ready:
            if obj in live:
                rank = live.pop(obj)
                procs[rank].join()
                # A process sends before it exits, so what it sent is in the pipe by now.
                if conns[rank] in open_conns:
                    if conns[rank].poll():
                        receive(conns[rank])
                    else:
                        open_conns.pop(conns[rank])
                if rank not in results and not any(f.rank == rank for f in failures):
                    failures.append(_Failure(rank, exitcode=procs[rank].exitcode))
        if failures and grace_end is None:
            grace_end = time.monotonic() + _GRACE_SECONDS
    if failures or len(results) < world_size:
        if not failures:  # unreachable in practice: every rank either reports or exits
            failures = [_Failure(r, exitcode=procs[r].exitcode) for r in range(world_size) if r not in results]
        first = min(failures, key=lambda f: f.weight)  # min is stable: the earliest among equals
        others = [f for f in failures if f is not first]
        msg = first.describe(world_size)
        if others:
            msg += "\nalso stopped: " + "; ".join(f"rank {f.rank} ({f.summary()})" for f in others)
        failed = {f.rank for f in failures}
        running = [r for r in range(world_size) if r not in results and r not in failed and procs[r].is_alive()]
        if running:
            msg += (f"\nstill running, terminated: rank{'s' if len(running) > 1 else ''} "
                    f"{', '.join(map(str, running))} (a rank stuck outside collectives makes the others time out)")
        raise _error_class(first.report)(msg)
    return [results[r] for r in range(world_size)]


# --------------------------------------------------------------------------- launch
LaunchResult = RunResult  # the name of earlier releases


def model_ref(model: Model | str) -> tuple[str, dict[str, Any] | None, list[str] | None]:
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
        if module.__name__ == "__main__" and getattr(module, "__file__", None) is None:
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


def resolve_model(ref: tuple[str, dict[str, Any] | None, list[str] | None]) -> Model:
    """The model a :func:`model_ref` names (on a worker process)."""
    name, params, substeps = ref
    model = get_model(name)
    return model.configure(params=params, substeps=substeps) if params is not None or substeps else model


def _run_simulation(comm: Comm, ref: tuple[str, dict[str, Any] | None, list[str] | None],
                    run: dict[str, Any]) -> RunResult | None:
    sim = Simulation(resolve_model(ref), agents=run["agents"], seed=run["seed"], device=run["device"], comm=comm,
                     partition=run["partition"], sync_every=run["sync_every"], resume=run["resume"],
                     check=run.get("check", False), **run["options"])
    # The launcher holds the locks on the output file and checkpoint directory for the job.
    result = sim.run(run["steps"], out=run["out"], record=run["record"], every=run["every"], append=run["append"],
                     lock=False, **run["checkpoints"])
    if comm.rank != 0:
        return None
    result.state = None  # stays on the ranks
    result.model = None  # the caller has it
    return result


def launch(model: Model | str, world_size: int, agents: int | None = None, steps: int = 100, seed: int = 0,
           out: str | os.PathLike[str] | None = None, record: Iterable[str] | None = None,
           every: int | None = None, partition: str = "data", timeout: float = DEFAULT_TIMEOUT, *,
           params: Mapping[str, Any] | None = None, sync_every: int = 1, device: str = "cpu",
           layout: str | None = None, balance_every: int | None = None, balance_threshold: float | None = None,
           bins: int | None = None, overlap: bool | None = None, resume: str | os.PathLike[str] | None = None,
           checkpoint_every: int | None = None, checkpoint_dir: str | os.PathLike[str] | None = None,
           keep: int | None = None, checkpoint_async: bool = False, append: bool = False,
           max_restarts: int = 0, check: bool = False) -> RunResult:
    """Run ``model`` on ``world_size`` local processes; rank 0 writes ``out``.

    The result (metrics, the file's ``/agents``, ``/env`` and ``/metrics``) is bitwise
    the one of a one-process :class:`~agentsim.Simulation` run with the same
    arguments. ``world_size=1`` runs in this process, with no process group.

    Args:
        model: A :class:`~agentsim.core.model.Model` (built-in or defined at module level) or a
            name (``"sir"``, ``"package.module:ATTR"``).
        world_size: Number of processes (one torch thread each).
        agents, steps, seed, out, record, every: As for :meth:`Simulation.run <agentsim.Simulation.run>`.
        partition: ``"data"`` or ``"spatial"``.
        timeout: Seconds a collective may wait for the other ranks before failing.
        params: Parameter overrides.
        sync_every: Neighbor refresh period in steps (1: exact; K > 1: stale reads by the rule of
            :mod:`agentsim.distributed.snapshot`, partition ``"data"`` only; the result still equals one process's).
        device: ``"cpu"`` (gloo) or ``"cuda"`` (NCCL; one GPU per rank).
        layout, balance_every, balance_threshold, bins, overlap: Options of ``partition="spatial"``
            (:class:`~agentsim.distributed.spatial.SpatialPartition`).
        resume: Start from this checkpoint (see :class:`Simulation <agentsim.engine.simulation.Simulation>`);
            ``steps`` more steps follow. A directory of checkpoints is resolved here, once, to its
            newest complete checkpoint, which every rank loads (one committed later is not used);
            a checkpoint of another run (model, agents, seed, parameters, substeps, ``sync_every``,
            and when appending ``record``/``every``) is refused here, listing the differences.
        checkpoint_every, checkpoint_dir, keep, checkpoint_async, append: As for :meth:`Simulation.run
            <agentsim.Simulation.run>`.
        max_restarts: When a rank fails (dies, or raises), stop the others and start all ranks
            again, up to this many times, from the newest complete checkpoint in
            ``checkpoint_dir`` (from step 0 if there is none), writing on into ``out``; the
            result is the uninterrupted run's. As torchrun, any failure restarts (an error that
            repeats fails every attempt), except a failed write (an OutputError: a full disk stays
            full), which stops the run at once.
        check: The check mode (see :class:`Simulation <agentsim.engine.simulation.Simulation>`).

    This process holds the locks of ``out`` and ``checkpoint_dir`` (:mod:`agentsim.io.locks`) for the
    whole job, restarts included, and its workers die with it (:mod:`agentsim.runner.lifeline`).

    Returns:
        Rank 0's :class:`~agentsim.engine.simulation.RunResult`; its ``state`` is None (it stays on the ranks),
        except with ``world_size=1``, which runs here.

    Raises:
        ConfigError: A bad argument (checked here, before any process starts).
        CheckpointError: ``resume`` is missing, unreadable, or of another run.
        LockedError: Another running process writes ``out`` or ``checkpoint_dir``.
        AgentsimError: A rank failed; the message names it, with its traceback or exit code.

    Examples:
        >>> result = launch("randomwalk", world_size=1, agents=100, steps=2)
        >>> result.metrics["step"].tolist()
        [0, 1, 2]
    """
    partition, options, sync_every = check_run_partition(partition, sync_every, layout=layout,
                                                         balance_every=balance_every,
                                                         balance_threshold=balance_threshold, bins=bins,
                                                         overlap=overlap)
    if params:
        model = (get_model(model) if isinstance(model, str) else model).configure(params=params)
    ref = model_ref(model)
    resolved = resolve_model(ref)
    agents = check_agents(resolved.default_agents if agents is None else agents)
    steps = check_steps(steps)
    check_every(every)
    check_seed(seed)
    if out is not None:
        parent = os.path.dirname(os.path.abspath(out))
        if not os.path.isdir(parent):
            raise errors.OutputError(f"cannot create trajectory file '{os.fspath(out)}': "
                                     f"directory '{parent}' does not exist")
    path = None if out is None else os.fspath(out)
    fields = None if record is None else list(record)
    checkpoints: dict[str, Any] = {"checkpoint_every": checkpoint_every,
                   "checkpoint_dir": None if checkpoint_dir is None else os.fspath(checkpoint_dir), "keep": keep,
                   "checkpoint_async": bool(checkpoint_async)}
    resume = None if resume is None else os.fspath(resume)
    if isinstance(max_restarts, bool) or not isinstance(max_restarts, int) or max_restarts < 0:
        raise ConfigError(f"max_restarts: expected an int >= 0 (got {max_restarts!r})")
    # This process holds the locks on the file and the checkpoints for the whole job (restarts
    # included), taken before the checkpoint to resume is chosen: a killed run's workers are gone by then.
    locks = lock_run(path, checkpoints["checkpoint_dir"])
    try:
        if resume is not None:  # one checkpoint for every rank, chosen now; refused here if of another run
            resume = str(resolve_checkpoint(resume))
            check_resume(resume, resolved, agents=agents, seed=seed, sync_every=sync_every,
                         record=fields, every=every, append=append)
        if isinstance(world_size, int) and not isinstance(world_size, bool) and world_size == 1:
            return Simulation(resolved, agents=agents, seed=seed, device=device, sync_every=sync_every,
                              resume=resume, check=check).run(steps, out=path, record=fields, every=every,
                                                              append=append, **checkpoints)
        run = {"agents": agents, "steps": steps, "seed": seed, "out": path, "record": fields, "every": every,
               "partition": partition, "sync_every": sync_every, "device": device, "options": options,
               "resume": resume, "checkpoints": checkpoints, "append": append, "check": check}
        results = _run_attempts(ref, run, world_size, timeout, device, max_restarts, locks)
    finally:
        for lock in reversed(locks):
            lock.release()
    result: RunResult = results[0]
    result.model = resolved
    return result


def check_resume(checkpoint: str | os.PathLike[str], model: Model, *, agents: int, seed: int, sync_every: int,
                 record: Iterable[str] | None = None, every: int | None = None, append: bool = False) -> None:
    """Refuse (:class:`~agentsim.io.checkpoint.CheckpointError`) to resume ``checkpoint`` with a run
    that is not the one that saved it, listing every difference (before any process starts).
    """
    from agentsim.io.checkpoint import (
        CheckpointError,
        file_differences,
        mismatch_message,
        read_manifest,
        run_differences,
    )

    manifest = read_manifest(checkpoint)
    if manifest["model"] != model.name:
        raise CheckpointError(f"checkpoint {checkpoint} is of model '{manifest['model']}', not '{model.name}'")
    diffs = run_differences(checkpoint, manifest, model, model.params, seed, agents, sync_every)
    if append:
        diffs += file_differences(manifest, None if record is None else list(record), every)
    if diffs:
        raise CheckpointError(mismatch_message(checkpoint, diffs))


def _run_attempts(ref: tuple[str, dict[str, Any] | None, list[str] | None], run: dict[str, Any], world_size: int,
                  timeout: float, device: str, max_restarts: int, locks: list[Any]) -> list[Any]:
    """Run the ranks, restarting them from the newest checkpoint after a failure (``max_restarts`` times)."""
    checkpoints, path = run["checkpoints"], run["out"]
    total = run["steps"] + (0 if run["resume"] is None else checkpoint_step(run["resume"]))

    def started(pids: list[int]) -> None:
        for lock in locks:
            lock.set_workers(pids)

    for attempt in range(max_restarts + 1):
        try:
            return run_ranks(_run_simulation, world_size, (ref, run), timeout=timeout,
                             device=None if device == "cpu" else device, started=started)
        except AgentsimError as e:
            if attempt == max_restarts or isinstance(e, errors.OutputError):  # a full disk stays full: no restart
                raise
            newest = None if checkpoints["checkpoint_dir"] is None else latest_checkpoint(checkpoints["checkpoint_dir"])
            start = 0 if newest is None else checkpoint_step(newest)
            run.update(resume=None if newest is None else str(newest), steps=total - start,
                       append=newest is not None and path is not None and os.path.isfile(path))
            print(f"agentsim: {str(e).splitlines()[0]}\nagentsim: restarting {world_size} ranks from "
                  f"{'step 0' if newest is None else f'the checkpoint of step {start}'} "
                  f"(restart {attempt + 1} of {max_restarts})", file=sys.stderr, flush=True)
    raise AssertionError("unreachable")
