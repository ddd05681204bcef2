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
import threading
from collections.abc import Iterator
from types import FrameType

__all__ = ["Terminated", "exit_status", "forward_to", "graceful_stops", "request", "requested", "terminate_on_sigterm"]

_requested = 0  # the signal number of the first stop request, 0 for none
_forward: list[int] = []  # processes each signal is passed on to (as SIGTERM): a launcher's workers
_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Terminated(BaseException):
    """SIGTERM in a command that has no step boundary to stop at (:func:`terminate_on_sigterm`)."""


def forward_to(pids: list[int]) -> None:
    """Inside :func:`graceful_stops`: pass every stop signal on to ``pids`` as SIGTERM (a launcher's
    workers, which stop at the same step boundary; a second signal stops them at once).
    """
    _forward[:] = [int(p) for p in pids]


def requested() -> int:
    """The signal that asked this process to stop (``signal.SIGINT``, ...), or 0."""
    return _requested


def request(signum: int) -> None:
    """Record a stop request (what the first signal does; tests and embedding programs may call it)."""
    global _requested
    _requested = _requested or int(signum)


def exit_status(signum: int) -> int:
    """The shell's status of a process ended by ``signum``: 128 + the signal (130 for SIGINT, 143
    for SIGTERM).
    """
    return 128 + int(signum)


def _handle(signum: int, frame: FrameType | None) -> None:
    for pid in _forward:
        try:
            os.kill(pid, signal.SIGTERM)
        except OSError:  # (gone already)
            pass
    if _requested:  # the second signal: at once
        raise KeyboardInterrupt
    request(signum)


@contextlib.contextmanager
def graceful_stops(signals: tuple[int, ...] = _SIGNALS) -> Iterator[None]:
    """``signals`` (SIGINT and SIGTERM) record a stop request for the ``with`` block (in the main
    thread; elsewhere nothing changes); the previous handlers, no request and no forwarding
    afterwards.
    """
    global _requested
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, _handle) for sig in signals}
    _requested = 0
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        _requested = 0
        _forward.clear()


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
