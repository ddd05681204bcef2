"""torch's CPU threads where users run: capped by the cores the process may use, and fewer while
other processes keep cores busy.

torch runs its large CPU operations on an OpenMP pool whose threads spin at every barrier. On a
machine where another process holds a core, one of those threads waits for the scheduler while
the others spin, and every parallel operation waits for it: one busy process beside a run of two
threads on two cores made it several times slower than the same run on one thread. Waiting
passively (``OMP_WAIT_POLICY=PASSIVE``) removes most of that loss but makes an idle machine
slower (each operation wakes its threads), so agentsim keeps torch's default waiting and instead
runs as many threads as there are cores to run them:

- :func:`usable_cores`: the cores this process may use, from its CPU affinity and its cgroup's
  CPU quota (a container limited to 2 CPUs on a 64-core host has 2).
- :func:`cap_threads`: called by ``import agentsim``; torch's threads capped by
  :func:`usable_cores` unless ``OMP_NUM_THREADS`` or ``AGENTSIM_THREADS`` sets them.
- :class:`ThreadGovernor`: a :class:`~agentsim.Simulation` on the CPU reads, at most every
  :data:`SAMPLE_SECONDS`, how much CPU time the other processes took on its cores
  (``/proc/stat`` less this process's own time) and runs ``floor(cores - busy + 0.25)`` threads
  (at least 1, at most the cap): with one CPU-bound process beside it on 2 cores, 1 thread.
  Before the first sample (the run's initialization) it goes by the threads running on the
  machine at its start (:func:`running_others`), where the process may use every core.
  The number of threads never changes a result (every sum agentsim makes is exact and every
  kernel's split is fixed), only the time.

``AGENTSIM_THREADS``: ``auto`` (the default: the above), or a whole number of threads to use
without adapting (as ``torch.set_num_threads``). Off Linux (no ``/proc/stat``) nothing adapts.

Examples:
    >>> usable_cores() >= 1
    True
    >>> busy_threads(cores=2, others=1.0, cap=2)  # a CPU-bound process beside the run
    1
    >>> busy_threads(cores=2, others=0.1, cap=2)
    2
"""

from __future__ import annotations

import math
import os
import re
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field

from agentsim.errors import ConfigError

__all__ = ["FIRST_SAMPLE_SECONDS", "SAMPLE_SECONDS", "CpuSample", "ThreadGovernor", "busy_threads", "cap_threads",
           "configured_threads", "other_load", "quota_cores", "running_others", "usable_cores"]

SAMPLE_SECONDS = 0.25  # the governor reads the machine's CPU times at most this often (seconds of wall time)
FIRST_SAMPLE_SECONDS = 0.05  # ... and first after this long (the samples count 10 ms ticks)
_SPARE = 0.25  # a core counts as free while the other processes use less than this share of it


def quota_cores(root: str = "/sys/fs/cgroup") -> float | None:
    """The cgroup's CPU quota in cores (v2 ``cpu.max``, v1 ``cpu/cpu.cfs_quota_us``), or None if unlimited."""
    for path, parse in ((os.path.join(root, "cpu.max"), _parse_v2),
                        (os.path.join(root, "cpu", "cpu.cfs_quota_us"), _parse_v1)):
        try:
            with open(path) as f:
                text = f.read()
        except OSError:
            continue
        quota = parse(text, path)
        if quota is not None:
            return quota
    return None


def _parse_v2(text: str, path: str) -> float | None:
    parts = text.split()
    if len(parts) != 2 or parts[0] == "max":
        return None
    try:
        return int(parts[0]) / int(parts[1])
    except (ValueError, ZeroDivisionError):
        return None


def _parse_v1(text: str, path: str) -> float | None:
    try:
        quota = int(text)
        with open(os.path.join(os.path.dirname(path), "cpu.cfs_period_us")) as f:
            period = int(f.read())
    except (OSError, ValueError):
        return None
    return quota / period if quota > 0 and period > 0 else None


def _affinity() -> set[int] | None:
    try:
        return set(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return None


def usable_cores() -> int:
    """The cores this process may use: its CPU affinity, capped by its cgroup's quota (rounded up)."""
    cpus = _affinity()
    cores = len(cpus) if cpus else (os.cpu_count() or 1)
    quota = quota_cores()
    if quota is not None:
        cores = min(cores, max(1, math.ceil(quota)))
    return max(1, cores)


def configured_threads() -> int | None:
    """The thread count fixed by ``AGENTSIM_THREADS=N`` (None: ``auto``, the default).

    Raises:
        ConfigError: ``AGENTSIM_THREADS`` is neither ``auto`` nor a whole number >= 1.
    """
    value = os.environ.get("AGENTSIM_THREADS", "auto").strip().lower()
    if value in ("", "auto"):
        return None
    if not value.isdigit() or int(value) < 1:
        raise ConfigError(f"AGENTSIM_THREADS: expected 'auto' or a whole number >= 1 (got {value!r})")
    return int(value)


def cap_threads() -> None:
    """Set torch's threads once, at ``import agentsim``: ``AGENTSIM_THREADS=N`` gives N; else, unless
    ``OMP_NUM_THREADS`` chose them, at most :func:`usable_cores`. A bad ``AGENTSIM_THREADS`` is
    only warned of here (the import goes on); a run, or the ``agentsim`` command, refuses it.
    """
    import torch

    try:
        fixed = configured_threads()
    except ConfigError as e:
        warnings.warn(f"agentsim: {e}; a run refuses it", RuntimeWarning, stacklevel=2)
        return
    if fixed is not None:
        torch.set_num_threads(fixed)
    elif "OMP_NUM_THREADS" not in os.environ and torch.get_num_threads() > usable_cores():
        torch.set_num_threads(usable_cores())


def _procs_running() -> tuple[int, int] | None:
    """``procs_running`` of ``/proc/stat`` (threads running or runnable on the whole machine now,
    this one included) and the machine's cores listed there; None off Linux.
    """
    try:
        with open("/proc/stat") as f:
            text = f.read()
    except OSError:
        return None
    found = re.search(r"^procs_running (\d+)$", text, re.MULTILINE)
    if found is None:
        return None
    return int(found.group(1)), len(re.findall(r"^cpu\d+ ", text, re.MULTILINE))


def running_others(cores: int, reads: int = 2, pause: float = 0.001) -> float | None:
    """Threads of other processes running now: the fewest of ``reads`` readings of ``procs_running``
    ``pause`` seconds apart, less this thread (a thread that ran for a moment is not counted). None
    where that cannot tell: off Linux, or where the process may use fewer than the machine's cores
    (a container's threads elsewhere on its host do not compete with it).
    """
    fewest: int | None = None
    for k in range(reads):
        if k:
            time.sleep(pause)
        got = _procs_running()
        if got is None or got[1] > cores:
            return None
        fewest = got[0] if fewest is None else min(fewest, got[0])
    return None if fewest is None else float(max(0, fewest - 1))


def busy_threads(cores: int, others: float, cap: int) -> int:
    """Threads to run on ``cores`` usable cores while other processes use ``others`` of them (in
    cores): ``floor(cores - others + 0.25)``, at least 1, at most ``cap``.
    """
    return max(1, min(cap, math.floor(cores - others + _SPARE)))


@dataclass
class CpuSample:
    """CPU times at one moment: ``busy`` (seconds the cores in the affinity mask ran anything),
    ``own`` (seconds of this process, every thread), ``wall`` (a monotonic clock).
    """

    busy: float
    own: float
    wall: float

    @classmethod
    def take(cls, cpus: set[int] | None = None) -> CpuSample | None:
        """Read ``/proc/stat`` (only the cores in ``cpus``, default the affinity mask); None off Linux."""
        cpus = _affinity() if cpus is None else cpus
        try:
            with open("/proc/stat") as f:
                lines = f.readlines()
        except OSError:
            return None
        tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        busy = 0
        for line in lines:
            if not line.startswith("cpu") or line.startswith("cpu "):
                continue
            name, *values = line.split()
            if cpus is not None and int(name[3:]) not in cpus:
                continue
            t = [int(v) for v in values[:8]]  # user nice system idle iowait irq softirq steal
            busy += t[0] + t[1] + t[2] + t[5] + t[6] + t[7]
        return cls(busy / tick, time.process_time(), time.monotonic())


def other_load(before: CpuSample, after: CpuSample) -> float:
    """Cores the other processes kept busy between two samples (0 when no time passed)."""
    wall = after.wall - before.wall
    if wall <= 0:
        return 0.0
    return max(0.0, ((after.busy - before.busy) - (after.own - before.own)) / wall)


@dataclass
class ThreadGovernor:
    """Adapts torch's threads to the cores other processes leave free (see the module docstring).

    Make it before the run's initialization (the first sample covers it) and call :meth:`tick`
    once a step: it costs a clock read, and reads ``/proc/stat`` at most every
    :data:`SAMPLE_SECONDS` (the first time after :data:`FIRST_SAMPLE_SECONDS`). ``history``
    counts the steps run with each thread count.

    Args:
        cap: The most threads (default: torch's threads now).
        cores: The usable cores (default: :func:`usable_cores`).
        sample: What reads the CPU times (default: :meth:`CpuSample.take`; None where it cannot).
        running: What counts the other processes' running threads at the start, for the threads
            until the first sample (default: :func:`running_others`; None where it cannot).

    Attributes:
        history: Thread count to the steps run with it.
        others, most_others: The cores other processes kept busy in the last sample, and the most.
        shed: Whether the load ever made it run fewer threads than the cap.
        active: Whether it adapts (not where ``AGENTSIM_THREADS`` fixes the threads, nor with a cap of 1).
    """

    cap: int = 0
    cores: int = field(default_factory=usable_cores)
    sample: Callable[[], CpuSample | None] = field(default=CpuSample.take, repr=False)
    running: Callable[[int], float | None] = field(default=running_others, repr=False)
    history: dict[int, int] = field(default_factory=dict, init=False)
    others: float = field(default=0.0, init=False)
    most_others: float = field(default=0.0, init=False)
    shed: bool = field(default=False, init=False)
    active: bool = field(default=True, init=False)
    _last: CpuSample | None = field(default=None, init=False, repr=False)
    _set: int = field(default=0, init=False, repr=False)  # what this governor last gave torch

    def __post_init__(self) -> None:
        import torch

        self.cap = self.cap or torch.get_num_threads()
        self._set = torch.get_num_threads()
        self.active = configured_threads() is None and self.cap > 1
        self._last = self.sample() if self.active else None
        if self._last is None:
            self.active = False
            return
        others = self.running(self.cores)  # until the first sample: the threads running now
        if others is not None:
            self._adapt(others)

    def _adapt(self, others: float) -> None:
        """Run the threads that ``others`` busy cores leave (torch's threads set where they change)."""
        import torch

        self.others = others
        self.most_others = max(self.most_others, others)
        want = busy_threads(self.cores, others, self.cap)
        self.shed |= want < self.cap
        if want != self._set:
            torch.set_num_threads(want)
            self._set = want

    def tick(self) -> int:
        """Before a step: the threads it runs with (changed where the load changed)."""
        import torch

        now = torch.get_num_threads()
        if now != self._set:  # the user changed them: that is the new cap
            self.cap = self._set = now
        wait = SAMPLE_SECONDS if self.history else FIRST_SAMPLE_SECONDS
        if self.active and self._last is not None and time.monotonic() - self._last.wall >= wait:
            sample = self.sample()
            if sample is not None:
                others = other_load(self._last, sample)
                self._last = sample
                self._adapt(others)
                now = self._set
        self.history[now] = self.history.get(now, 0) + 1
        return now

    def restore(self) -> None:
        """Give torch back the cap (after a run)."""
        import torch

        if self.active and torch.get_num_threads() == self._set != self.cap:
            torch.set_num_threads(self.cap)
            self._set = self.cap

    def summary(self) -> str:
        """One line: the threads the steps ran with, and why fewer than the cap."""
        if not self.history:
            return f"threads: {self.cap}"
        used = ", ".join(f"{k} for {n} steps" for k, n in sorted(self.history.items(), reverse=True))
        return (f"threads: {used} (cap {self.cap}, {self.cores} usable cores"
                + (f"; other processes kept up to {self.most_others:.1f} cores busy" if self.shed else "") + ")")
