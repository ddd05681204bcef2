"""Starting and stopping the process group of a multi-rank run.

Two ways in, one code path:

- under ``torchrun``, :func:`from_env` reads ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``,
  ``MASTER_PORT`` and ``TORCHELASTIC_RESTART_COUNT``;
- :func:`agentsim.launch` hosts a store on a free port and calls :func:`init` in
  each worker.

The group is built on ``PrefixStore(f"attempt_{restart_count}", TCPStore(...))``:
after a torchrun restart the workers meet under a fresh prefix instead of reading
keys left by the failed attempt (without it, gloo often reconnected to stale
addresses). Every group gets an explicit ``timeout`` (default 60 s, not torch's 30
minutes), so a rank that stops taking part makes the others raise, not hang. The rendezvous
waits at most ``timeout`` too: no store at ``MASTER_ADDR:MASTER_PORT`` (an unknown host, nobody
listening) or ranks that never arrive raise a :class:`~agentsim.errors.NetworkError` naming the
address, the rank and the timeout.

World size 1 builds no process group at all: :class:`~agentsim.core.comm.LocalComm`.

Shutdown (:func:`shutdown`): barrier then ``destroy_process_group`` after a
successful run (one run in six aborted at exit without it); after an error,
``destroy_process_group`` only, guarded so that it never raises or waits for
ranks that may be gone.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta

import torch
import torch.distributed as dist

from agentsim.core.comm import Comm, LocalComm
from agentsim.distributed.comm import TorchComm
from agentsim.errors import ConfigError, NetworkError

__all__ = ["DEFAULT_TIMEOUT", "check_timeout", "from_env", "init", "process_group", "shutdown", "world_size_from_env"]

DEFAULT_TIMEOUT = 60.0


def check_timeout(timeout: float) -> float:
    """Validate a timeout in seconds (> 0)."""
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise ConfigError(f"timeout: expected seconds > 0 (got {timeout!r})")
    return float(timeout)


def _backend(device: torch.device | str | None) -> str:
    dev = torch.device(device or "cpu")
    return "nccl" if dev.type == "cuda" else "gloo"


def init(rank: int, world_size: int, addr: str, port: int, *, restart_count: int = 0,
         timeout: float = DEFAULT_TIMEOUT, device: torch.device | str | None = None,
         host_store: bool | None = None) -> Comm:
    """Join a process group and return its :class:`TorchComm` (LocalComm if ``world_size == 1``).

    Args:
        rank, world_size: This process and the number of processes.
        addr, port: Where the TCPStore server listens.
        restart_count: torchrun's attempt number; names the store prefix.
        timeout: Seconds before a collective (or the rendezvous) gives up.
        device: Device of the run: CUDA uses NCCL (one GPU per rank, ``LOCAL_RANK``), CPU gloo.
        host_store: Whether this process starts the store server. Default: no if torchrun's
            agent already hosts it (``TORCHELASTIC_USE_AGENT_STORE=True``), else rank 0.
    """
    timeout = check_timeout(timeout)
    if world_size == 1:
        return LocalComm()
    if not 0 <= rank < world_size:
        raise ConfigError(f"rank: expected 0 <= rank < {world_size} (got {rank})")
    if host_store is None:
        host_store = rank == 0 and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True"
    backend = _backend(device)
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)) % torch.cuda.device_count())
    td = timedelta(seconds=timeout)
    where = f"process group rendezvous at {addr}:{port} (MASTER_ADDR:MASTER_PORT), rank {rank} of {world_size}"
    if not host_store:  # the store's host first, within the timeout (torch's own client retries past it)
        from agentsim.distributed.netcheck import reach

        reach(f"[{addr}]:{port}" if ":" in addr else f"{addr}:{port}", timeout, where)
    try:
        tcp = dist.TCPStore(addr, int(port), world_size=world_size, is_master=host_store, timeout=td,
                            wait_for_workers=False)
    except (RuntimeError, OSError, ValueError) as e:  # DistNetworkError, DistStoreError: RuntimeErrors
        what = f"could not host the store there ({_first_line(e)})" if host_store else \
            f"no store answered within {timeout:g} s ({_first_line(e)}); is rank 0 (or torchrun) running there?"
        raise NetworkError(f"{where}: {what}") from None
    store = dist.PrefixStore(f"attempt_{restart_count}", tcp)
    try:
        dist.init_process_group(backend, store=store, rank=rank, world_size=world_size, timeout=td)
    except (RuntimeError, OSError) as e:
        raise NetworkError(f"{where}: not every rank arrived within {timeout:g} s ({_first_line(e)})") from None
    device_for_comm = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else None
    return TorchComm(device=device_for_comm, store=store)


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0][:300]


def world_size_from_env() -> int:
    """``WORLD_SIZE`` from the environment (1 when unset): > 1 means we run under torchrun."""
    value = os.environ.get("WORLD_SIZE", "1")
    try:
        return int(value)
    except ValueError:
        raise ConfigError(f"environment variable WORLD_SIZE: expected an int (got {value!r})") from None


def from_env(timeout: float = DEFAULT_TIMEOUT, device: torch.device | str | None = None) -> Comm:
    """Join the process group described by torchrun's environment variables.

    Args:
        timeout: Seconds before a collective gives up (default 60).
        device: Device of the run (CUDA: NCCL, CPU: gloo).
    """
    world_size = world_size_from_env()
    if world_size == 1:
        return LocalComm()
    missing = [k for k in ("RANK", "MASTER_ADDR", "MASTER_PORT") if k not in os.environ]
    if missing:
        raise ConfigError(f"WORLD_SIZE={world_size} but {', '.join(missing)} not set; start with "
                          "`torchrun --nproc_per_node N -m agentsim ...` or use `agentsim run --nprocs N`")
    return init(int(os.environ["RANK"]), world_size, os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                restart_count=int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")),
                timeout=timeout, device=device)


def shutdown(ok: bool = True) -> None:
    """Leave the process group: barrier + destroy after success; destroy only after an error."""
    if not dist.is_initialized():
        return
    try:
        if ok:
            dist.barrier()
    finally:
        try:
            dist.destroy_process_group()
        except Exception:
            pass


@contextmanager
def process_group(timeout: float = DEFAULT_TIMEOUT, device: torch.device | str | None = None) -> Iterator[Comm]:
    """Join the process group of torchrun's environment; leave it on the way out.

    ``with process_group() as comm:`` is :func:`from_env`, then :func:`shutdown`.

    Examples:
        >>> with process_group() as comm:  # no torchrun here: one process
        ...     comm.world_size
        1
    """
    comm = from_env(timeout=timeout, device=device)
    ok = False
    try:
        yield comm
        ok = True
    finally:
        shutdown(ok)
