"""Worker processes that die with the process that started them.

A worker started by :func:`agentsim.runner.launch.run_ranks` (``agentsim run --nprocs W``,
``agentsim train --nprocs W``) calls :func:`die_with_parent` first thing: on Linux the kernel then
sends it SIGKILL when its parent dies (``prctl(PR_SET_PDEATHSIG, SIGKILL)``), so a launcher killed
with SIGKILL leaves no worker writing on into its output file and checkpoints. The parent may have
died before the call: the worker checks ``os.getppid()`` right after setting it. Where ``prctl`` is
not available (not Linux), a daemon thread polls ``os.getppid()`` every
:data:`PARENT_POLL_SECONDS` and ends the process when the parent is gone.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import sys
import threading
import time

__all__ = ["PARENT_POLL_SECONDS", "die_with_parent", "parent_death_signal"]

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
        def watch() -> None:
            while os.getppid() == parent:
                time.sleep(PARENT_POLL_SECONDS)
            os.kill(os.getpid(), signal.SIGKILL)

        threading.Thread(target=watch, name="agentsim-parent-watch", daemon=True).start()
    return how
