"""Worker processes that die with the process that started them.

A worker started by :func:`agentsim.runner.launch.run_ranks` (``agentsim run --nprocs W``,
``agentsim train --nprocs W``) calls :func:`die_with` first thing with the launcher's pid: on
Linux a thread waits on the launcher's process descriptor (``pidfd_open``: it refers to that
process only, never to a later one with the same pid) and sends the worker SIGKILL when the
launcher ends, so a launcher killed with SIGKILL leaves no worker writing on into its output
file and checkpoints. Elsewhere the thread polls the pid every :data:`PARENT_POLL_SECONDS`. (The
workers' parent is multiprocessing's fork server, which outlives the launcher while workers
remain, so the parent death signal alone would not do.) :func:`die_with_parent` does the same
for a process whose parent is the one to follow: the kernel sends it SIGKILL when its parent
dies (``prctl(PR_SET_PDEATHSIG, SIGKILL)``); the parent may have died before the call, so the
process checks ``os.getppid()`` right after setting it.
"""

from __future__ import annotations

import ast
import ctypes
import ctypes.util
import inspect
import os
import select
import signal
import sys
import threading
import time
from collections.abc import Callable

from agentsim.errors import ConfigError
from agentsim.io.locks import process_exists

__all__ = ["PARENT_POLL_SECONDS", "die_with", "die_with_parent", "parent_death_signal", "refuse_unguarded_start",
           "script_being_imported_by_worker", "unguarded_script_line"]

PARENT_POLL_SECONDS = 0.5
_PR_SET_PDEATHSIG = 1


def parent_death_signal(sig: int = signal.SIGKILL) -> bool:
    """Ask the kernel to send ``sig`` to this process when its parent dies (Linux ``prctl``);
    False where that is not available.
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        return int(libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def die_with_parent(parent: int) -> str:
    """End this process when ``parent`` (the pid of the process that started it) dies; returns
    how: ``"prctl"`` or ``"watchdog"``. Exits at once if ``parent`` is already gone.
    """
    how = "prctl" if parent_death_signal() else "watchdog"
    if os.getppid() != parent:  # died before prctl took effect: the signal will never come
        os._exit(1)
    if how == "watchdog":
        _poll_until_gone(lambda: os.getppid() == parent, "agentsim-parent-watch")
    return how


def _poll_until_gone(present: Callable[[], bool], name: str) -> None:
    """A daemon thread that checks ``present()`` every :data:`PARENT_POLL_SECONDS` and sends this
    process SIGKILL once it is false.
    """
    def watch() -> None:
        while present():
            time.sleep(PARENT_POLL_SECONDS)
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name=name, daemon=True).start()


def die_with(pid: int) -> str:
    """End this process (SIGKILL) when process ``pid``, not necessarily its parent, ends; returns
    how it watches: ``"pidfd"`` (Linux: a thread that waits on the process's descriptor, which
    refers to that process only) or ``"poll"`` (every :data:`PARENT_POLL_SECONDS`). Exits at once
    if ``pid`` is already gone.
    """
    try:
        handle = os.pidfd_open(pid)  # type: ignore[attr-defined,unused-ignore]
    except ProcessLookupError:
        os._exit(1)
    except (AttributeError, OSError):  # not Linux 5.3+: poll
        handle = None
    if handle is not None:
        def wait() -> None:
            select.select([handle], [], [])  # readable once the process has ended
            os.kill(os.getpid(), signal.SIGKILL)

        threading.Thread(target=wait, name="agentsim-launcher-watch", daemon=True).start()
        return "pidfd"
    if not process_exists(pid):
        os._exit(1)
    _poll_until_gone(lambda: process_exists(pid), "agentsim-launcher-watch")
    return "poll"


def script_being_imported_by_worker() -> str | None:
    """The parent's script (path or module name) where this process is a spawned worker running it as
    ``__mp_main__`` (multiprocessing's spawn preparation: a run started there does not belong), else None.
    """
    frame = inspect.currentframe()
    while frame is not None:
        code = frame.f_code
        if code.co_name in ("_fixup_main_from_path", "_fixup_main_from_name") and "multiprocessing" in code.co_filename:
            return str(frame.f_locals.get("main_path", frame.f_locals.get("mod_name", "the script")))
        frame = frame.f_back
    return None


def unguarded_script_line() -> str | None:
    """``'script.py:LINE'`` where this call comes from the module level of the ``__main__`` script
    outside an ``if __name__ == "__main__":`` block, else None (no script file, or guarded).

    Worker processes started by ``spawn`` run the script's module level again: a call there would
    run again in every worker, so :func:`agentsim.launch` and :meth:`agentsim.Study.run` refuse it in
    the parent, before any worker starts.
    """
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if main is None or not isinstance(path, str) or not os.path.isfile(path):
        return None
    if str(getattr(getattr(main, "__spec__", None), "name", "")).endswith("__main__"):
        return None  # `python -m package`: spawn does not run a package's __main__ again
    frame = inspect.currentframe()
    while frame is not None and not (frame.f_code.co_name == "<module>" and frame.f_globals is vars(main)):
        frame = frame.f_back
    if frame is None:
        return None
    line = frame.f_lineno
    try:
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
    except (OSError, SyntaxError, ValueError):
        return None
    for node in tree.body:
        if isinstance(node, ast.If) and _is_main_guard(node.test) and node.lineno <= line <= (node.end_lineno or 0):
            return None
    return f"{path}:{line}"


def _is_main_guard(test: ast.expr) -> bool:
    """Whether ``test`` is ``__name__ == "__main__"`` (either way round)."""
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq)):
        return False
    sides = [test.left, test.comparators[0]]
    names = [s.id for s in sides if isinstance(s, ast.Name)]
    values = [s.value for s in sides if isinstance(s, ast.Constant)]
    return names == ["__name__"] and values == ["__main__"]


def refuse_unguarded_start(what: str, call: str, *, from_parent: bool = True) -> None:
    """Refuse to start ``what`` (e.g. ``"a run on 2 processes"``) where spawned worker processes would
    start it again: from a script's module level outside ``if __name__ == "__main__":``
    (:func:`unguarded_script_line`, checked in the parent where ``from_parent``), or in a worker that
    is running its parent's script (:func:`script_being_imported_by_worker`). ``call``: what to put
    under the guard.

    Raises:
        ConfigError: Naming the script's line (or the script) and the fix.
    """
    guard = '`if __name__ == "__main__":`'
    line = unguarded_script_line() if from_parent else None
    if line is not None:
        raise ConfigError(f"{what} is started at the module level of the script ({line}), outside {guard}: its "
                          "worker processes begin by running the script's module level, so each would start it "
                          f"again; put {call} under {guard} (the model stays at module level)")
    script = script_being_imported_by_worker()
    if script is not None:
        raise ConfigError(f"{what} was started while a worker process imported the script that started it "
                          f"({script}): worker processes begin by running the script's module level, so they "
                          f"would start it again; put {call} under {guard} (the model stays at module level)")
