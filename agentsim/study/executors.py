"""Where a study's runs execute: a local process pool, or Ray.

Both take the same run function and arguments and report, per run, either the worker's result
(``{"ok": True, ...}`` or ``{"ok": False, ...}`` for a Python exception, see
:func:`~agentsim.study.study.execute_run`) or a *system* failure (the worker died). The driver
(:class:`~agentsim.study.study.Study`) does the rest (retries, the study file), so both give
the same study file.

- :class:`LocalExecutor`: a ``spawn`` process pool of ``workers`` processes with one torch thread
  each. A worker that dies breaks the pool: every run in it at that moment comes back as a system
  failure (the pool cannot tell which run killed it) and a fresh pool takes the rest. Workers
  exit within a second or so of their driver's death (a killed driver leaves no orphans).
- :class:`RayExecutor`: one Ray task per run (``num_cpus``/``num_gpus`` per run, Ray's own
  retries off so that attempts are counted here). Connects to ``address`` (a running cluster) or
  starts a local instance with ``workers`` CPUs; Ray is imported only here. A dying worker fails
  its own task only. Before Ray connects, the address must accept a TCP connection within
  ``connect_timeout`` seconds (default 15; :func:`agentsim.distributed.netcheck.reach`): a closed port or an
  unknown host fails with a :class:`~agentsim.errors.NetworkError` naming the address, instead
  of Ray retrying for minutes.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from typing import Any

import torch

from agentsim.distributed.netcheck import DEFAULT_CONNECT_TIMEOUT, check_connect_timeout, reach, speaks_grpc
from agentsim.engine import stops
from agentsim.errors import ConfigError, NetworkError

__all__ = ["EXECUTORS", "LocalExecutor", "RayExecutor", "make_executor"]

EXECUTORS = ("local", "ray")
SYSTEM_FAILURE = ("the worker process died (killed, out of memory, or a crash; its output says why: a script that "
                  "runs a study at module level, outside `if __name__ == \"__main__\":`, makes every worker fail "
                  "as it starts)")


_PARENT_POLL_SECONDS = 1.0


def _init_worker(driver: int) -> None:
    """One torch thread; and exit when the driver ``driver`` (a pid) is gone. A pool's workers
    do not notice a driver killed with SIGKILL (each holds the writing end of the pool's task
    pipe, so their read never ends): they would sleep on, orphaned.
    """
    torch.set_num_threads(1)  # (started ignoring SIGINT: the driver stops its workers, LocalExecutor.shutdown)

    def watch() -> None:
        while os.getppid() == driver:
            time.sleep(_PARENT_POLL_SECONDS)
        os._exit(1)

    threading.Thread(target=watch, name="agentsim-driver-watch", daemon=True).start()


class LocalExecutor:
    """A spawn process pool (see the module docstring)."""

    name = "local"

    def __init__(self, workers: int) -> None:
        self.workers = workers
        self._ctx = mp.get_context("spawn")
        self._pool = self._new_pool()
        self._broken = False

    def _new_pool(self) -> ProcessPoolExecutor:
        return ProcessPoolExecutor(max_workers=self.workers, mp_context=self._ctx, initializer=_init_worker,
                                   initargs=(os.getpid(),))

    def submit(self, fn: Callable[..., dict[str, Any]], *args: Any) -> Any:
        """Start ``fn(*args)``; returns a handle."""
        with stops.children_ignore_sigint():  # (workers start in submit)
            return self._pool.submit(fn, *args)

    def wait(self, handles: list[Any]) -> list[Any]:
        """Block until at least one handle is finished; return the finished ones."""
        done, _ = wait(handles, return_when=FIRST_COMPLETED)
        return list(done)

    def outcome(self, handle: Future[dict[str, Any]]) -> tuple[dict[str, Any], str]:
        """``(result, kind)``: kind ``"exception"`` for the run's own result, ``"system"`` if the worker died."""
        try:
            return handle.result(), "exception"
        except BrokenProcessPool:
            self._broken = True
            return {"ok": False, "error": SYSTEM_FAILURE, "traceback": ""}, "system"

    def recover(self) -> None:
        """After a batch of outcomes: replace a broken pool (its other runs fail as they come)."""
        if self._broken:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = self._new_pool()
            self._broken = False

    def shutdown(self, now: bool = False) -> None:
        """Stop the workers, waiting for the runs in flight; ``now``: killing them (an interrupted
        study: they ignore the terminal's Ctrl-C).
        """
        if now:
            for process in list(getattr(self._pool, "_processes", {}).values()):  # (no public handle)
                with contextlib.suppress(OSError):
                    process.kill()
        self._pool.shutdown(wait=True, cancel_futures=True)


def _ray_run(fn: Callable[..., dict[str, Any]], *args: Any) -> dict[str, Any]:
    torch.set_num_threads(1)
    return fn(*args)


class RayExecutor:
    """Ray tasks (see the module docstring)."""

    name = "ray"

    def __init__(self, workers: int, address: str | None = None, cpus_per_run: float = 1.0,
                 gpus_per_run: float = 0.0, connect_timeout: float = DEFAULT_CONNECT_TIMEOUT) -> None:
        connect_timeout = check_connect_timeout(connect_timeout)
        try:
            import ray
        except ImportError:
            raise ConfigError("executor 'ray' needs Ray: pip install 'agentsim[ray]'") from None
        self._ray = ray
        self._started = False
        if not ray.is_initialized():
            # Workers see the driver's import path (a model given as module:ATTR must import there).
            env = {"PYTHONPATH": os.pathsep.join(p for p in sys.path if p), "OMP_NUM_THREADS": "1"}
            if address is None:
                ray.init(num_cpus=workers, include_dashboard=False, log_to_driver=False,
                         runtime_env={"env_vars": env})
            else:
                if address not in ("auto", "local"):  # Ray itself retries a dead address for minutes
                    t0 = time.monotonic()
                    reach(address, connect_timeout, f"ray: cluster address {address!r}")
                    speaks_grpc(address, max(0.5, connect_timeout - (time.monotonic() - t0)),
                                f"ray: cluster address {address!r}")
                try:
                    ray.init(address=address, log_to_driver=False, runtime_env={"env_vars": env})
                except (ConnectionError, TimeoutError) as e:
                    raise NetworkError(f"ray: cannot connect to the cluster at {address!r}: {e}") from None
            self._started = True
        self.workers = workers
        self._remote = ray.remote(num_cpus=cpus_per_run, num_gpus=gpus_per_run, max_retries=0)(_ray_run)

    def submit(self, fn: Callable[..., dict[str, Any]], *args: Any) -> Any:
        """Start ``fn(*args)`` as a Ray task; returns its object ref."""
        return self._remote.remote(fn, *args)

    def wait(self, handles: list[Any]) -> list[Any]:
        """Block until at least one task is finished; return the finished ones."""
        done, _ = self._ray.wait(handles, num_returns=1)
        return list(done)

    def outcome(self, handle: Any) -> tuple[dict[str, Any], str]:
        """As :meth:`LocalExecutor.outcome`."""
        exceptions = self._ray.exceptions
        try:
            return self._ray.get(handle), "exception"
        except (exceptions.WorkerCrashedError, exceptions.NodeDiedError, exceptions.OutOfMemoryError,
                exceptions.TaskUnschedulableError, exceptions.ActorDiedError) as e:
            return {"ok": False, "error": f"{SYSTEM_FAILURE}: {type(e).__name__}", "traceback": str(e)}, "system"

    def recover(self) -> None:
        """Nothing to do: a dead Ray worker fails its own task only."""

    def shutdown(self, now: bool = False) -> None:
        """Shut down the local Ray instance this executor started (not a cluster it joined; its
        tasks in flight are its own); ``now`` as :meth:`LocalExecutor.shutdown` (a local instance's
        workers end with it).
        """
        if self._started:
            self._ray.shutdown()


def make_executor(executor: str, workers: int, address: str | None = None, cpus_per_run: float = 1.0,
                  gpus_per_run: float = 0.0, connect_timeout: float = DEFAULT_CONNECT_TIMEOUT
                  ) -> LocalExecutor | RayExecutor:
    """The executor named ``executor`` (``"local"`` or ``"ray"``)."""
    if executor == "local":
        if address is not None or gpus_per_run:
            raise ConfigError("address and gpus_per_run are options of executor 'ray'")
        return LocalExecutor(workers)
    if executor == "ray":
        return RayExecutor(workers, address, cpus_per_run, gpus_per_run, connect_timeout)
    raise ConfigError(f"executor: expected one of {', '.join(EXECUTORS)} (got {executor!r})")
