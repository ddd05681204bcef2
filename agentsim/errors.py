"""Exceptions raised by agentsim.

Every error a user can trigger derives from :class:`AgentsimError`. Configuration
mistakes (unknown model, bad parameter, malformed config file) are
:class:`ConfigError`, which is also a :class:`ValueError` so that generic callers
catch them as bad values.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable


class AgentsimError(Exception):
    """Base class of every agentsim error."""


class ConfigError(AgentsimError, ValueError):
    """A model, parameter, config file or command-line value is invalid."""


class FieldAccessError(AgentsimError, RuntimeError):
    """A substep read or wrote a field it did not declare."""


class SimulationError(AgentsimError, RuntimeError):
    """An error flag was raised inside vectorized code (NaN, overflow, ...)."""


class ContractError(SimulationError):
    """A model broke the contract that makes results the same on any number of processes, found by
    the check mode (:mod:`agentsim.engine.contract`): the message names the step, substep, field and agents.
    """


class CollectiveError(AgentsimError, RuntimeError):
    """A collective failed (timed out, or a peer went away); the message names the ranks that
    never arrived (stuck outside collectives, or dead).
    """


class RunStopped(AgentsimError):
    """A run stopped at a step boundary because the process was asked to (SIGINT, SIGTERM; see
    :mod:`agentsim.engine.stops`).

    Attributes:
        signum: The signal.
        step: The last step completed.
        checkpoint: The final checkpoint written, or None.
    """

    def __init__(self, message: str, signum: int, step: int, checkpoint: str | None = None) -> None:
        super().__init__(message)
        self.signum, self.step, self.checkpoint = signum, step, checkpoint

    def __reduce__(self) -> tuple[type, tuple[str, int, int, str | None]]:
        return (type(self), (str(self), self.signum, self.step, self.checkpoint))


class OutputError(AgentsimError, OSError):
    """A trajectory file could not be created, written or read."""


def write_cause(e: BaseException) -> str:
    """The cause of a failed write, short: HDF5's ``errno = 28, error message = '...'`` as
    ``No space left on device (errno 28)``; an OSError's strerror; else the message.
    """
    text = str(e)
    m = re.search(r"errno = (\d+), error message = '([^']*)'", text)
    if m:
        return f"{m.group(2)} (errno {m.group(1)})"
    if isinstance(e, OSError) and e.strerror:
        return f"{e.strerror} (errno {e.errno})" if e.errno else e.strerror
    return text.splitlines()[0] if text else type(e).__name__


_OUT_OF_MEMORY = ("can't allocate memory", "out of memory", "cannot allocate memory")


def out_of_memory(e: BaseException) -> bool:
    """Whether ``e`` says the process could not get memory (a MemoryError, or torch's allocators'
    RuntimeError under a memory limit).
    """
    return isinstance(e, MemoryError) or (isinstance(e, RuntimeError) and not isinstance(e, AgentsimError)
                                          and any(s in str(e).lower() for s in _OUT_OF_MEMORY))


def memory_text(message: str) -> str:
    """The first line of an out-of-memory message, at most 300 characters, after torch's
    allocator's name (``"can't allocate memory: you tried to allocate ..."``).
    """
    text = message.strip().splitlines()[0] if message.strip() else "MemoryError"
    at = text.find("DefaultCPUAllocator: ")
    return text[at + len("DefaultCPUAllocator: "):][:300] if at >= 0 else text[:300]


def did_you_mean(name: str, choices: Iterable[str]) -> str:
    """Return ``" Perhaps you meant 'x'?"`` for the closest choice, or ``""``."""
    close = difflib.get_close_matches(name, list(choices), n=1, cutoff=0.6)
    return f" Perhaps you meant '{close[0]}'?" if close else ""


class UnknownParameterError(ConfigError, KeyError):
    """A parameter name that the model does not declare (also a KeyError, so ``Mapping.get``
    and ``in`` keep working on read-only parameters).
    """

    def __str__(self) -> str:  # KeyError would print the repr of its message
        return str(self.args[0]) if self.args else ""


class NetworkError(AgentsimError, ConnectionError):
    """An address could not be reached in time (a Ray cluster, a process group's rendezvous);
    the message names the address and how long it waited.
    """
