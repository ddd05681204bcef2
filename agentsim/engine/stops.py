"""Graceful stops: SIGINT (Ctrl-C) and SIGTERM end a run at the next step boundary.

Inside :func:`graceful_stops` (the ``agentsim`` command holds it around a run), the first SIGINT or
SIGTERM only records the request (:func:`requested`); the run's loop
(:meth:`agentsim.engine.simulation.Simulation.run`) sends it in the step's report, so that every
process learns of it at the same step, finishes that step, writes a final checkpoint where a
checkpoint directory is set, leaves its output file not completed (every step written so far
readable), and raises :class:`~agentsim.errors.RunStopped`. A second signal stops at once
(KeyboardInterrupt). Outside the context nothing is installed: a Python program keeps its own
handlers.

Examples:
    >>> with graceful_stops():
    ...     requested()
    0
"""

from __future__ import annotations

import contextlib
import os
import signal
import tempfile
import threading
import uuid
from collections.abc import Iterator
from types import FrameType

__all__ = ["STOP_FILE", "Terminated", "children_ignore_sigint", "exit_status", "graceful_stops", "request",
           "requested", "signal_name", "stop_file_for_workers", "terminate_on_sigterm"]

STOP_FILE = "AGENTSIM_STOP_FILE"  # a worker's: where its launcher writes the signal it was stopped by
_requested = 0  # the signal number of the first stop request, 0 for none
_active = False  # inside graceful_stops
_stop_file_in: str | None = None  # this worker's launcher's stop file
_stop_file_out: str | None = None  # the stop file this process writes for its workers
_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Terminated(BaseException):
    """SIGTERM in a command that has no step boundary to stop at (:func:`terminate_on_sigterm`)."""


def stop_file_for_workers() -> str | None:
    """Inside :func:`graceful_stops`: a path (not yet existing) that this process writes the signal
    into when asked to stop; workers given it as ``AGENTSIM_STOP_FILE`` stop at the same step as
    if they had been asked themselves (None outside the context: nothing is passed on).
    """
    global _stop_file_out
    if not _active:
        return None
    if _stop_file_out is None:
        _stop_file_out = os.path.join(tempfile.gettempdir(), f"agentsim-stop-{os.getpid()}-{uuid.uuid4().hex[:8]}")
        if _requested:  # asked before the workers were known
            _write_stop_file(_requested)
    return _stop_file_out


def _write_stop_file(signum: int) -> None:
    if _stop_file_out is not None:
        with contextlib.suppress(OSError):
            with open(_stop_file_out, "w") as f:
                f.write(str(int(signum)))


def requested() -> int:
    """The signal that asked this process (or, through ``AGENTSIM_STOP_FILE``, its launcher) to
    stop (``signal.SIGINT``, ...), or 0.
    """
    global _requested
    if not _requested and _stop_file_in and os.path.exists(_stop_file_in):
        try:
            with open(_stop_file_in) as f:
                _requested = int(f.read().strip() or signal.SIGTERM)
        except (OSError, ValueError):
            _requested = int(signal.SIGTERM)
    return _requested


def request(signum: int) -> None:
    """Record a stop request (what the first signal does; tests and embedding programs may call it)."""
    global _requested
    _requested = _requested or int(signum)


def signal_name(signum: int) -> str:
    """``"SIGINT"`` for ``signal.SIGINT``; ``"signal N"`` for a number that names none."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def exit_status(signum: int) -> int:
    """The shell's status of a process ended by ``signum``: 128 + the signal (130 for SIGINT, 143
    for SIGTERM).
    """
    return 128 + int(signum)


def _handle(signum: int, frame: FrameType | None) -> None:
    if _requested:  # the second signal: at once
        raise KeyboardInterrupt
    request(signum)
    _write_stop_file(signum)


@contextlib.contextmanager
def graceful_stops(signals: tuple[int, ...] = _SIGNALS) -> Iterator[None]:
    """``signals`` (SIGINT and SIGTERM) record a stop request for the ``with`` block (in the main
    thread; elsewhere nothing changes); the previous handlers, no request and no forwarding
    afterwards.
    """
    global _requested, _active, _stop_file_in, _stop_file_out
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, _handle) for sig in signals}
    _requested, _active, _stop_file_in = 0, True, os.environ.get(STOP_FILE) or None
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if _stop_file_out is not None:
            with contextlib.suppress(OSError):
                os.remove(_stop_file_out)
        _requested, _active, _stop_file_in, _stop_file_out = 0, False, None, None


def _terminated(signum: int, frame: FrameType | None) -> None:
    raise Terminated


@contextlib.contextmanager
def terminate_on_sigterm() -> Iterator[None]:
    """SIGTERM raises :class:`Terminated` in the ``with`` block (main thread only), so that a command
    ends with its own words and status instead of dying silently.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def children_ignore_sigint() -> Iterator[None]:
    """SIGINT ignored in this process for the ``with`` block (main thread): processes started in it
    (a fork server, a pool's workers, a launcher's ranks) keep ignoring it, so that a terminal's
    Ctrl-C, which reaches the whole process group, cannot stop them half-way or print their
    tracebacks; this process stops them. A Ctrl-C in the block itself is not seen.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
