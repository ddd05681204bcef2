"""Start a multi-rank run from Python: W local processes, one gloo (or NCCL) group, clean exit.

:func:`launch` runs a model; :func:`run_ranks` runs any function ``fn(comm, *args)``
on every rank (the tests use it to run several models in one job).

How it works: the calling process hosts the group's TCPStore on a port the OS picks
(port 0, so no hard-coded ports and no race for a free one), then starts the workers
from multiprocessing's fork server, which has imported torch once (``spawn`` where there is no
fork server): as with ``spawn``, a worker imports the caller's script as ``__mp_main__``, so a
script starts runs under ``if __name__ == "__main__":``, and it runs with the caller's
environment variables as they are at the call. Each worker sets one torch thread, joins the group
(:func:`agentsim.distributed.process_group.init`), calls ``fn`` and sends back its
return value, or its traceback if it raises, over its own pipe. A worker that has reported
exits at once: its atexit handlers run, the interpreter's teardown (a second or more with
torch loaded) does not.

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

import atexit
import contextlib
import gc
import os
import pickle
import signal
import sys
import time
import traceback
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from multiprocessing import forkserver as mp_forkserver
from multiprocessing.connection import Connection, wait
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from agentsim import errors
from agentsim.core.comm import Comm
from agentsim.core.model import Model
from agentsim.distributed.comm import FAILURE_GRACE_SECONDS
from agentsim.distributed.process_group import DEFAULT_TIMEOUT, check_timeout, init, shutdown
from agentsim.engine import stops
from agentsim.engine.simulation import RunResult
from agentsim.engine.spec import RunOptions, RunSpec, make_simulation, model_ref, resolve_model, run_simulation
from agentsim.errors import AgentsimError, ConfigError
from agentsim.io.checkpoint import checkpoint_step, latest_checkpoint, resolve_checkpoint
from agentsim.io.locks import lock_run
from agentsim.runner.lifeline import die_with, refuse_unguarded_start

if TYPE_CHECKING:
    from typing_extensions import Unpack  # typing.Unpack from Python 3.11

__all__ = ["LaunchResult", "check_resume", "launch", "launch_spec", "model_ref", "resolve_model", "run_ranks"]

# After a first failure, how long to collect the other ranks' reports: long enough for a rank whose
# collective failed to ask who never arrived (FAILURE_GRACE_SECONDS) and report it.
_GRACE_SECONDS = FAILURE_GRACE_SECONDS + 2.0
_TERMINATE_SECONDS = 5.0  # SIGTERM, then SIGKILL after this long


# --------------------------------------------------------------------------- workers
def _describe_error(e: BaseException) -> dict[str, Any]:
    is_comm = isinstance(e, (dist.DistError, errors.CollectiveError)) or any(
        s in str(e) for s in ("Connection closed by peer", "Connection reset by peer", "gloo", "Broken pipe"))
    stop = [e.signum, e.step, e.checkpoint] if isinstance(e, errors.RunStopped) else None
    return {"type": type(e).__name__, "module": type(e).__module__, "message": str(e),
            "traceback": traceback.format_exc(), "is_comm": is_comm, "stop": stop,
            "out_of_memory": errors.out_of_memory(e)}


def _worker(rank: int, world_size: int, port: int, timeout: float, device: str | None,
            fn: Callable[..., Any], args: tuple[Any, ...], conn: Connection, launcher: int,
            environ: dict[str, str]) -> None:
    # A terminal's Ctrl-C reaches every process of its group: workers ignore it (they were started
    # ignoring it: run_ranks), and their launcher passes each stop on through the stop file
    # (stops.STOP_FILE), which a worker started late reads as well; a SIGTERM of its own stops it too.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.environ.update(environ)  # (the stop file's name, before the stops read it)
    with stops.graceful_stops((signal.SIGTERM,)):
        _work(rank, world_size, port, timeout, device, fn, args, conn, launcher, environ)


def _work(rank: int, world_size: int, port: int, timeout: float, device: str | None,
          fn: Callable[..., Any], args: tuple[Any, ...], conn: Connection, launcher: int,
          environ: dict[str, str]) -> None:
    die_with(launcher)  # a launcher killed with SIGKILL takes its workers with it (not the fork server)
    os.environ.clear()  # the launcher's environment now, not the fork server's at its start
    os.environ.update(environ)
    _write_where_the_launcher_writes(launcher)
    # Fresh global generators, as a new process has (a fork would share the server's): unkeyed
    # draws differ between processes, and the engine's checks see them do so.
    torch.seed()
    np.random.seed()
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
    _exit_at_once()


def _write_where_the_launcher_writes(launcher: int) -> None:
    """Point this worker's stdout and stderr (fds 1 and 2) at the launcher's as they are now: the
    fork server's are those of the launcher when the server started (Linux, through ``/proc``;
    elsewhere they stay as inherited). Regular files are opened to append.
    """
    for fd in (1, 2):
        target = f"/proc/{launcher}/fd/{fd}"
        try:
            if os.path.samestat(os.fstat(fd), os.stat(target)):
                continue
            opened = os.open(target, os.O_WRONLY | os.O_APPEND)
        except OSError:
            continue
        (sys.stdout if fd == 1 else sys.stderr).flush()
        os.dup2(opened, fd)
        os.close(opened)


def _context() -> Any:
    """The start method of the workers: a fork server that has imported torch (a worker starts
    in a fraction of a second instead of importing torch for 2 s or more), or spawn where there
    is none (Windows).
    """
    if "forkserver" not in mp.get_all_start_methods():
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["torch"])
    return ctx


def _exit_at_once() -> None:
    """End a worker that has reported: the atexit handlers and the collection of unreferenced
    objects run, the interpreter's teardown (a second or more with torch loaded) does not.
    """
    gc.collect()
    atexit._run_exitfuncs()  # noqa: SLF001 (CPython's own exit runs them so; no public equivalent)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


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
        if self.report.get("out_of_memory"):
            return f"out of memory ({errors.memory_text(self.report['message'])})"
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
            hint = ("; its output above says why (a worker that fails as it starts is often a script that starts "
                    "runs at module level, outside `if __name__ == \"__main__\":`)") if code == 1 else ""
            return f"rank {self.rank} of {world_size} died ({how}) without reporting an error{hint}"
        r = self.report
        if r["module"] == errors.__name__:  # agentsim's own error: its message says it all
            return f"rank {self.rank} of {world_size} failed with {r['type']}: {r['message']}"
        if r.get("out_of_memory"):  # (where is not the point: the process had no more memory)
            return f"rank {self.rank} of {world_size} ran out of memory ({errors.memory_text(r['message'])})"
        return (f"rank {self.rank} of {world_size} failed with {r['type']}: {r['message']}\n"
                f"--- traceback of rank {self.rank} ---\n{r['traceback'].rstrip()}")


def _error_class(report: dict[str, Any] | None) -> type[AgentsimError]:
    if report is not None and report["module"] == errors.__name__:
        cls = getattr(errors, report["type"], None)
        if isinstance(cls, type) and issubclass(cls, AgentsimError) and cls is not errors.RunStopped:
            return cls
    return AgentsimError


def _stop(procs: Sequence[Any], finished: bool) -> None:
    """Let finished workers exit on their own (briefly); SIGKILL the rest (their SIGTERM asks for a
    stop at the next step: :mod:`agentsim.engine.stops`).
    """
    deadline = time.monotonic() + _TERMINATE_SECONDS
    if finished:
        for p in procs:
            p.join(max(0.0, deadline - time.monotonic()))
    for p in procs:
        if p.is_alive():
            p.kill()
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

    The workers die with this process (:func:`agentsim.runner.lifeline.die_with`): a launcher
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
    ctx = _context()
    store = dist.TCPStore("127.0.0.1", 0, world_size=world_size, is_master=True,
                          timeout=timedelta(seconds=timeout), wait_for_workers=False)
    procs, conns = [], []
    finished = False
    try:
        stop_file = stops.stop_file_for_workers()  # (inside graceful_stops only)
        environ = {**os.environ, **({stops.STOP_FILE: stop_file} if stop_file else {})}
        forkserver = ctx.get_start_method() == "forkserver"
        if forkserver:  # started ignoring SIGINT: so are the workers it forks (the launcher stops them)
            with stops.children_ignore_sigint():
                mp_forkserver.ensure_running()
        for rank in range(world_size):
            parent, child = ctx.Pipe(duplex=False)
            p = ctx.Process(target=_worker, name=f"agentsim-rank-{rank}", daemon=True,
                            args=(rank, world_size, store.port, timeout, device, fn, args, child, os.getpid(),
                                  environ))
            with stops.children_ignore_sigint() if not forkserver else contextlib.nullcontext():
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
    stopped = sorted((f.rank, f.report) for f in failures if f.report is not None and f.report.get("stop"))
    if stopped and len(stopped) == len(failures) and len(stopped) + len(results) == world_size:
        report = stopped[0][1]  # the lowest rank's (rank 0 names the final checkpoint); every rank stopped alike
        signum, step, checkpoint = report["stop"]
        raise errors.RunStopped(report["message"], signum, step, checkpoint)
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


def _run_simulation(comm: Comm, spec: dict[str, Any]) -> RunResult | None:
    """A worker's run: the spec as :meth:`RunSpec.to_dict` wrote it, checked again here."""
    run = RunSpec.from_dict(spec)
    # The launcher holds the locks on the output file and checkpoint directory for the job.
    result = run_simulation(run, make_simulation(run, comm), progress=False, lock=False)
    if comm.rank != 0:
        return None
    result.state = None  # stays on the ranks
    result.model = None  # the caller has it
    return result


# The positional parameters of launch after (model, world_size), in the order of earlier releases.
_POSITIONAL = ("agents", "steps", "seed", "out", "record", "every", "partition", "timeout")


def launch_spec(model: Model | str | RunSpec, world_size: int | None = None, args: tuple[Any, ...] = (),
                options: Mapping[str, Any] | None = None) -> RunSpec:
    """The :class:`~agentsim.engine.spec.RunSpec` of a :func:`launch` call (checked)."""
    options = dict(options or {})
    if len(args) > len(_POSITIONAL):
        raise ConfigError(f"launch: expected at most {2 + len(_POSITIONAL)} positional arguments (model, world_size, "
                          f"{', '.join(_POSITIONAL)}); got {2 + len(args)}")
    for name, value in zip(_POSITIONAL, args, strict=False):
        if name in options:
            raise ConfigError(f"launch: {name} given twice (as a positional and a keyword argument)")
        options[name] = value
    if "nprocs" in options:
        raise ConfigError("launch: the number of processes is world_size (nprocs is agentsim.run's name for it)")
    if isinstance(model, RunSpec):
        spec = RunSpec.make(model, **options)
        return spec if world_size is None else spec.replace(nprocs=_check_world_size(world_size))
    return RunSpec.make(model, nprocs=_check_world_size(world_size), **options)


def _check_world_size(world_size: object) -> int:
    if isinstance(world_size, bool) or not isinstance(world_size, (int, np.integer)) or world_size < 1:
        raise ConfigError(f"world_size: expected an int >= 1 (got {world_size!r})")
    return int(world_size)


def launch(model: Model | str | RunSpec, world_size: int | None = None, *args: Any,
           **options: Unpack[RunOptions]) -> RunResult:
    """Run ``model`` on ``world_size`` local processes; rank 0 writes ``out``.

    The result (metrics, the file's ``/agents``, ``/env`` and ``/metrics``) is bitwise
    the one of a one-process :class:`~agentsim.Simulation` run with the same
    arguments. ``world_size=1`` runs in this process, with no process group.

    Args:
        model: A :class:`~agentsim.engine.spec.RunSpec` (its ``nprocs`` processes, or ``world_size``
            if given; no other argument), or a :class:`~agentsim.core.model.Model` (built-in or defined
            at module level) or a name (``"sir"``, ``"package.module:ATTR"``).
        world_size: Number of processes (one torch thread each).
        args, options: The other fields of :class:`~agentsim.engine.spec.RunSpec`, positional in the
            order ``agents, steps, seed, out, record, every, partition, timeout`` (as in earlier
            releases) or by name: ``params``, ``device``, ``sync_every``, the spatial options
            (``layout``, ``balance_every``, ``balance_threshold``, ``bins``, ``overlap``), ``resume``,
            ``append``, ``checkpoint_every``, ``checkpoint_dir``, ``keep``, ``checkpoint_async``,
            ``max_restarts``, ``check``. Notably:

            - ``resume``: a directory of checkpoints is resolved here, once, to its newest complete
              checkpoint, which every rank loads (one committed later is not used); a checkpoint of
              another run (model, agents, seed, parameters, substeps, ``sync_every``, and when
              appending ``record``/``every``) is refused here, listing the differences.
            - ``max_restarts``: when a rank fails (dies, or raises), stop the others and start all
              ranks again, up to this many times, from the newest complete checkpoint in
              ``checkpoint_dir`` (from step 0 if there is none), writing on into ``out``; the
              result is the uninterrupted run's. As torchrun, any failure restarts (an error that
              repeats fails every attempt), except a failed write (an OutputError: a full disk stays
              full), which stops the run at once.

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
        >>> launch(RunSpec("randomwalk", agents=100, steps=2)).metrics["step"].tolist()
        [0, 1, 2]
    """
    spec = launch_spec(model, world_size, args, options)
    if spec.nprocs > 1:
        refuse_unguarded_start(f"a run on {spec.nprocs} processes", "the run")
    resolved = spec.resolved_model()
    if spec.out is not None:
        parent = os.path.dirname(os.path.abspath(spec.out))
        if not os.path.isdir(parent):
            raise errors.OutputError(f"cannot create trajectory file '{spec.out}': directory '{parent}' does not exist")
    # This process holds the locks on the file and the checkpoints for the whole job (restarts
    # included), taken before the checkpoint to resume is chosen: a killed run's workers are gone by then.
    locks = lock_run(None if spec.out is None else os.fspath(spec.out),
                     None if spec.checkpoint_dir is None else os.fspath(spec.checkpoint_dir))
    try:
        if spec.resume is not None:  # one checkpoint for every rank, chosen now; refused here if of another run
            resume = str(resolve_checkpoint(spec.resume))
            spec = spec.replace(resume=resume)
            check_resume(resume, resolved, agents=spec.resolved_agents(), seed=spec.seed,
                         sync_every=spec.sync_every, record=spec.record, every=spec.every, append=spec.append)
        if spec.nprocs == 1:
            return run_simulation(spec, make_simulation(spec))
        results = _run_attempts(spec, locks)
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


def _run_attempts(spec: RunSpec, locks: list[Any]) -> list[Any]:
    """Run the ranks, restarting them from the newest checkpoint after a failure (``spec.max_restarts`` times)."""
    run = spec.to_dict()  # what every worker receives (the model found once, here)
    world_size, max_restarts = spec.nprocs, spec.max_restarts
    total = spec.steps + (0 if spec.resume is None else checkpoint_step(spec.resume))

    def started(pids: list[int]) -> None:
        for lock in locks:
            lock.set_workers(pids)

    for attempt in range(max_restarts + 1):
        try:
            return run_ranks(_run_simulation, world_size, (run,), timeout=spec.timeout,
                             device=None if spec.device == "cpu" else spec.device, started=started)
        except AgentsimError as e:
            if attempt == max_restarts or isinstance(e, errors.OutputError | errors.RunStopped):  # no restart: a
                # full disk stays full, a stop was asked for
                raise
            newest = None if spec.checkpoint_dir is None else latest_checkpoint(spec.checkpoint_dir)
            start = 0 if newest is None else checkpoint_step(newest)
            run.update(resume=None if newest is None else str(newest), steps=total - start,
                       append=newest is not None and spec.out is not None and os.path.isfile(spec.out))
            print(f"agentsim: {str(e).splitlines()[0]}\nagentsim: restarting {world_size} ranks from "
                  f"{'step 0' if newest is None else f'the checkpoint of step {start}'} "
                  f"(restart {attempt + 1} of {max_restarts})", file=sys.stderr, flush=True)
    raise AssertionError("unreachable")
