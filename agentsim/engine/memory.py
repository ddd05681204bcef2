"""The up-front memory estimate: refuse a run that cannot fit before building its state.

Before a :class:`~agentsim.engine.simulation.Simulation` builds a large state (more than
:data:`TRIAL_AGENTS` agents), the model is built twice at a small size (1,000 and 2,000
agents, on the CPU, with no autograd), the bytes of its state (every population field and env
layer) are measured, and a line through the two sizes (bytes at 1,000 agents plus bytes per
further agent) gives the bytes at the requested size. Times :data:`STEP_FACTOR` for the
temporaries of a step, that is compared with the memory this process can take: MemAvailable of
``/proc/meminfo`` (else ``SC_AVPHYS_PAGES``), less where a cgroup limit (``memory.max``) leaves
less, or the free memory of the CUDA device for a CUDA run. If the estimate exceeds it, the run
is refused with a :class:`~agentsim.errors.ConfigError` that names both; a run that fits is
never refused by the estimate. ``AGENTSIM_MEMORY_CHECK=0`` turns the check off.

The first small build alone often settles it: its bytes per agent, counting everything it built
(env layers too) as if it grew with the agents, bound the state at the requested size from
above; where that bound fits, the run is not refused and the second build is not made. That
matters for a model whose ``init`` visits every cell of a large space: each trial build costs
about as much as the real one. It costs one or two small builds (milliseconds for the built-in
models); it estimates, it does not reserve: other processes may take the memory afterwards.

Examples:
    >>> format_bytes(1.2e12), format_bytes(950)
    ('1.2 TB', '950 B')
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from agentsim.errors import ConfigError

if TYPE_CHECKING:
    from agentsim.core.model import Model
    from agentsim.core.params import Params
    from agentsim.core.state import State

__all__ = ["STEP_FACTOR", "TRIAL_AGENTS", "available_bytes", "check_memory", "estimate_bytes",
           "format_bytes", "state_bytes"]

TRIAL_AGENTS = 1000  # the small build's agents (and a second at twice as many); runs up to it are not checked
STEP_FACTOR = 1.5  # a step's temporaries on top of the state
ENV_SWITCH = "AGENTSIM_MEMORY_CHECK"


def format_bytes(n: float) -> str:
    """Bytes in decimal units (``"1.2 TB"``)."""
    for unit in ("B", "kB", "MB", "GB", "TB", "PB"):
        if abs(n) < 1000 or unit == "PB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    raise AssertionError("unreachable")


def state_bytes(state: State) -> int:
    """Bytes of every population field and env tensor (each storage counted once)."""
    seen: dict[int, int] = {}
    tensors = [t for p in state.populations.values() for t in p.fields().values()] + list(state.env.values())
    for t in tensors:
        if isinstance(t, torch.Tensor):
            storage = t.untyped_storage()
            seen[storage.data_ptr() or id(storage)] = storage.nbytes()
    return sum(seen.values())


def _read_int(path: str) -> int | None:
    try:
        text = Path(path).read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def available_bytes(device: torch.device | None = None) -> tuple[int | None, str]:
    """``(bytes this process can still take, where that figure comes from)``; None if unknown."""
    if device is not None and device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free), f"{device} has {format_bytes(free)} free"
    avail: int | None = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                avail = int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    if avail is None:
        try:
            avail = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError, AttributeError):
            avail = None
    where = "this machine has {} available"
    # cgroup v2, then v1: a limit below what the machine has free is what counts
    for limit_path, usage_path in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                                   ("/sys/fs/cgroup/memory/memory.limit_in_bytes",
                                    "/sys/fs/cgroup/memory/memory.usage_in_bytes")):
        limit = _read_int(limit_path)
        if limit is not None and limit < 1 << 60:
            left = max(limit - (_read_int(usage_path) or 0), 0)
            if avail is None or left < avail:
                avail, where = left, f"this process's cgroup limit ({format_bytes(limit)}) leaves {{}}"
            break
    return avail, where.format(format_bytes(avail)) if avail is not None else "unknown"


def _trial_bytes(model: Model, params: Params, n: int, seed: int) -> int:
    """The bytes of the state of ``model`` built with ``n`` agents on the CPU (no autograd)."""
    from agentsim.core.context import InitContext
    from agentsim.core.random import CounterRNG

    with torch.no_grad():
        ic = InitContext(params, n, CounterRNG(seed).at(0, "init"), torch.device("cpu"))
        state, _ = model.build(ic)
        return state_bytes(state)


def estimate_bytes(model: Model, params: Params, agents: int, seed: int = 0,
                   enough: float | None = None) -> tuple[float, float] | None:
    """``(estimated bytes of the state at agents, bytes per agent)`` from two small trial
    builds, or None when the model does not build at the trial sizes (the real build then
    reports its own error).

    With ``enough`` (bytes): when the first build's bound (its bytes per agent times ``agents``)
    is at most ``enough``, that bound and the bytes per agent it assumed, without the second build.
    """
    try:
        small = _trial_bytes(model, params, TRIAL_AGENTS, seed)
        if enough is not None and small / TRIAL_AGENTS * agents <= enough:
            return small / TRIAL_AGENTS * agents, small / TRIAL_AGENTS
        large = _trial_bytes(model, params, 2 * TRIAL_AGENTS, seed)
    except Exception:  # any failure: no estimate; the real build reports it
        return None
    per_agent = max((large - small) / TRIAL_AGENTS, 0.0)
    total = max(small + per_agent * (agents - TRIAL_AGENTS), float(large))
    return total, per_agent


def check_memory(model: Model, params: Params, agents: int, device: torch.device, seed: int = 0,
                 what: str | None = None) -> None:
    """Refuse (ConfigError) a run whose state and a step's temporaries clearly cannot fit in memory."""
    if agents <= TRIAL_AGENTS or os.environ.get(ENV_SWITCH, "1").strip().lower() in ("0", "false", "no", "off"):
        return
    avail, where = available_bytes(device)
    if avail is None:
        return
    got = estimate_bytes(model, params, agents, seed, enough=avail / STEP_FACTOR)
    if got is None:
        return
    total, per_agent = got
    need = total * STEP_FACTOR
    if need > avail:
        what = what or f"a run of {agents:,} agents of model '{model.name}'"
        raise ConfigError(f"{what} needs about {format_bytes(need)} (about {format_bytes(per_agent)} per agent "
                          f"of state, measured at {TRIAL_AGENTS:,} and {2 * TRIAL_AGENTS:,} agents, times "
                          f"{STEP_FACTOR} for a step's temporaries); {where}. Use fewer agents, more processes "
                          f"or machines; {ENV_SWITCH}=0 skips this check")
