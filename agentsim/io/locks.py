"""One writer per output: locks on a run's trajectory file and checkpoint directory.

A run that writes ``--out FILE`` holds the lock file ``.FILE.lock`` next to it; one that writes
checkpoints into ``DIR`` holds ``DIR/.lock`` (a training run: the same for its ``--out`` and
``--checkpoint-dir``). The lock is an ``fcntl.flock`` on a file descriptor kept open for the run,
taken without waiting; the file holds JSON about the holder (pid, host, command, start time, and
the pids of its worker processes). A second writer fails at once with
:class:`LockedError` naming the holder. The kernel releases a ``flock`` when its holder dies,
however it dies, so a killed run's lock never blocks the next one: the next writer takes it over
(and says so on stderr). If the dead holder's workers are still alive on this host (they die
with their parent, see :mod:`agentsim.runner.lifeline`, but not in the same instant), the next writer
waits up to :data:`WORKER_WAIT_SECONDS` for them to exit before it touches anything.

A finished run unlinks its lock file. Locks are counted per process: taking a lock this process
already holds succeeds (the command line takes them before it reads ``--resume``, then the run
takes them again). ``flock`` works between processes of one machine; on a network file system it
may not (NFS emulates it with byte-range locks on recent Linux kernels).

Who holds the lock of a job: the launching process for ``--nprocs W`` (through restarts with
``--max-restarts``: it never lets go in between), rank 0 under torchrun (a torchrun restart starts
a new rank 0, which takes it again once the old one is gone), the process itself for one process.
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import fcntl
import json
import os
import socket
import stat
import sys
import time
from collections.abc import Iterable, Iterator
from typing import Any

import torch

from agentsim.core.comm import Comm
from agentsim.errors import AgentsimError, OutputError

__all__ = ["WORKER_WAIT_SECONDS", "Lock", "LockedError", "hold", "lock_file", "lock_on_rank0", "lock_run"]

#: Seconds a new holder waits for the worker processes of a dead holder to exit.
WORKER_WAIT_SECONDS = 10.0

_HELD: dict[str, Lock] = {}  # lock file (absolute) -> this process's lock on it


class LockedError(OutputError):
    """An output (trajectory file or checkpoint directory) is being written by another running process."""


def lock_file(target: str | os.PathLike[str], kind: str) -> str:
    """The lock file of ``target``: ``.NAME.lock`` next to a file, ``DIR/.lock`` in a directory."""
    target = os.path.abspath(os.fspath(target))
    if kind == "dir":
        return os.path.join(target, ".lock")
    directory, name = os.path.split(target)
    return os.path.join(directory, f".{name}.lock")


def _process_start(pid: int) -> str | None:
    """The start time of ``pid`` in clock ticks since boot (Linux), to tell a pid from a reused one."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def process_exists(pid: int) -> bool:
    """Whether process ``pid`` exists (perhaps a zombie, or another user's: signal 0 tells)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, owned by another user
        return True
    return True


def _alive(pid: int, start: str | None) -> bool:
    if not process_exists(pid):
        return False
    if start is None:
        return True
    now = _process_start(pid)
    if now is None:
        return True
    if now != start:
        return False  # the pid was reused
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie writes nothing
    except OSError:
        return False


def _command() -> str:
    try:
        with open("/proc/self/cmdline", "rb") as f:
            parts = [p.decode(errors="replace") for p in f.read().split(b"\0") if p]
    except OSError:
        parts = [sys.executable, *sys.argv]
    return " ".join(parts)[:500]


def _describe(info: dict[str, Any]) -> str:
    return (f"pid {info.get('pid')} on host {info.get('host')}, started {info.get('started')}, "
            f"command: {info.get('command')}")


class Lock:
    """This process's lock on one output (see the module docstring)."""

    def __init__(self, path: str, target: str, what: str, fd: int, info: dict[str, Any]) -> None:
        self.path, self.target, self.what, self.fd, self.info = path, target, what, fd, info
        self.count = 1

    def write(self) -> None:
        """Put the holder's description into the lock file."""
        data = (json.dumps(self.info, indent=1) + "\n").encode()
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, data, 0)

    def set_workers(self, pids: Iterable[int]) -> None:
        """Record the worker processes writing for the holder (a later holder waits for them)."""
        self.info["workers"] = [[int(p), _process_start(int(p))] for p in pids]
        with contextlib.suppress(OSError):
            self.write()

    def release(self) -> None:
        """Give the lock back (when every taker of this process has released it)."""
        self.count -= 1
        if self.count > 0:
            return
        _HELD.pop(self.path, None)
        with contextlib.suppress(OSError):
            os.unlink(self.path)  # still holding it: a waiting taker sees the unlink and opens anew
        os.close(self.fd)


def _acquire(target: str, kind: str, what: str) -> Lock | None:
    """The lock of ``target``; None where no lock file can be made (a missing or unwritable
    directory: the writer reports that in its own words when it tries to write).
    """
    path = lock_file(target, kind)
    held = _HELD.get(path)
    if held is not None:
        held.count += 1
        return held
    directory = os.path.dirname(path)
    if kind == "dir":
        try:
            os.makedirs(directory, exist_ok=True)
        except OSError:
            return None
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            previous = _read(fd)
            os.close(fd)
            if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise OutputError(f"cannot lock {what} '{target}': {e.strerror}") from None
            holder = _describe(previous) if previous else "another process (its lock file names none yet)"
            raise LockedError(f"{what} '{target}' is being written by another run: {holder} (lock {path}); "
                              "wait for it to end, or choose another path") from None
        try:  # the file we locked may have been unlinked by a holder that just released it
            if os.stat(path).st_ino == os.fstat(fd).st_ino:
                break
        except FileNotFoundError:
            pass
        os.close(fd)
    previous = _read(fd)
    info = {"pid": os.getpid(), "host": socket.gethostname(),
            "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "command": _command(), "what": what, "target": target, "workers": []}
    lock = Lock(path, target, what, fd, info)
    try:
        if previous:
            _take_over(previous, lock)
        lock.write()
    except BaseException:
        os.close(fd)
        raise
    _HELD[path] = lock
    return lock


def _read(fd: int) -> dict[str, Any]:
    try:
        data = os.pread(fd, 1 << 16, 0)
        info = json.loads(data) if data.strip() else {}
    except (OSError, ValueError):
        return {}
    return info if isinstance(info, dict) else {}


def _take_over(previous: dict[str, Any], lock: Lock) -> None:
    """The lock was left by a holder that died: say so, and wait for its workers to exit."""
    print(f"agentsim: note: {lock.what} '{lock.target}': the run that held it ({_describe(previous)}) ended "
          "without releasing it (killed?); taking it over", file=sys.stderr, flush=True)
    if previous.get("host") != socket.gethostname():
        return
    workers = [(int(p), s) for p, s in previous.get("workers") or [] if isinstance(p, int)]
    deadline = time.monotonic() + WORKER_WAIT_SECONDS
    while True:
        alive = [p for p, s in workers if _alive(p, s)]
        if not alive:
            return
        if time.monotonic() > deadline:
            raise LockedError(f"{lock.what} '{lock.target}': worker processes {', '.join(map(str, alive))} of the "
                              f"run that held it ({_describe(previous)}) are still running after "
                              f"{WORKER_WAIT_SECONDS:.0f} s; stop them (kill {' '.join(map(str, alive))}) and retry")
        time.sleep(0.02)


_SPECIAL = ((stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
            (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket"))


def special_file(path: str | os.PathLike[str]) -> str | None:
    """What ``path`` is (``"a character device"``, ...) where it exists (through links) and is
    neither a regular file nor a directory: never an output to write, replace or lock beside;
    else None.
    """
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):  # (absent; a NUL in the name is the writer's error to give)
        return None
    return next((kind for test, kind in _SPECIAL if test(mode)), None if stat.S_ISREG(mode) or stat.S_ISDIR(mode)
                else "not a regular file")


def check_output_path(path: str | os.PathLike[str], what: str) -> None:
    """An OutputError where ``path`` exists as a special file (a device, a FIFO, a socket):
    outputs are regular files or new paths.
    """
    kind = special_file(path)
    if kind is not None:
        raise OutputError(f"cannot write the {what} '{os.fspath(path)}': it is {kind}; an output must be a "
                          f"regular file or a path that does not exist yet")


def lock_run(out: str | os.PathLike[str] | None = None, checkpoint_dir: str | os.PathLike[str] | None = None, *,
             what: str = "trajectory file") -> list[Lock]:
    """Take the locks of a run's output file ``out`` and checkpoint directory (either may be None);
    all or none.

    Raises:
        LockedError: Another running process holds one (the message names it).
        OutputError: A lock file cannot be created, or ``out`` is a special file (a device, a FIFO,
            a socket: nothing is locked or written beside it).
    """
    if out is not None:
        check_output_path(out, what)
    taken: list[Lock] = []
    try:
        for target, kind, name in ((out, "file", what), (checkpoint_dir, "dir", "checkpoint directory")):
            lock = None if target is None else _acquire(os.fspath(target), kind, name)
            if lock is not None:
                taken.append(lock)
    except BaseException:
        for lock in reversed(taken):
            lock.release()
        raise
    return taken


def lock_on_rank0(comm: Comm, out: str | os.PathLike[str] | None = None,
                  checkpoint_dir: str | os.PathLike[str] | None = None, *, what: str = "trajectory file") -> list[Lock]:
    """:func:`lock_run` on rank 0 of ``comm``; every rank raises if rank 0 could not take the locks
    (a collective when there are several ranks, so that no rank goes on to wait for rank 0).
    """
    if out is None and checkpoint_dir is None:
        return []
    taken: list[Lock] = []
    error: AgentsimError | None = None
    if comm.rank == 0:
        try:
            taken = lock_run(out, checkpoint_dir, what=what)
        except AgentsimError as e:
            error = e
    if comm.world_size > 1:
        got = comm.all_gather_rows({"f": torch.tensor([[int(error is not None)]], dtype=torch.uint8)},
                                   rows_per_rank=1)["f"]
        if int(got[0, 0]) and error is None:
            raise LockedError(f"rank 0 could not lock the run's {what} or checkpoint directory (see rank 0's error)")
    if error is not None:
        raise error
    return taken


@contextlib.contextmanager
def hold(out: str | os.PathLike[str] | None = None, checkpoint_dir: str | os.PathLike[str] | None = None, *,
         what: str = "trajectory file") -> Iterator[list[Lock]]:
    """:func:`lock_run` for the ``with`` block."""
    taken = lock_run(out, checkpoint_dir, what=what)
    try:
        yield taken
    finally:
        for lock in reversed(taken):
            lock.release()
