"""``agentsim info``: what this machine gives agentsim, and what to change when something is missing.

:func:`collect` gathers the facts (versions; CPU cores this process may use, torch threads, the
cores other processes keep busy over 0.2 s, native bf16; CUDA devices with memory; the
distributed backends; optional packages; the native CPU kernels: which library is in use and
why, loading it, or building it on first use, where needed) without starting anything heavy;
:func:`recommendations` turns them into advice; :func:`format_info` prints both.

Examples:
    >>> facts = collect()
    >>> sorted(facts)
    ['backends', 'cpu', 'cuda', 'kernels', 'optional', 'versions']
    >>> facts["backends"]["gloo"]  # the CPU backend of every multi-rank run
    True
    >>> isinstance(recommendations(facts), list)
    True
"""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import platform
import time
from typing import Any

import torch

from agentsim.threads import CpuSample, busy_threads, other_load, usable_cores

__all__ = ["collect", "format_info", "recommendations"]

_OPTIONAL = {"torch_scatter": "torch-scatter", "yaml": "pyyaml", "ray": "ray", "scipy": "scipy"}


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _other_load(seconds: float = 0.2) -> float | None:
    """Cores the other processes kept busy over ``seconds`` (None off Linux)."""
    before = CpuSample.take()
    time.sleep(seconds)
    after = CpuSample.take()
    return None if before is None or after is None else round(other_load(before, after), 2)


def collect() -> dict[str, Any]:
    """The facts, as a JSON-serializable dict (see the module docstring)."""
    from agentsim._version import __version__
    from agentsim.learn.trainer import bf16_supported

    versions = {"agentsim": __version__, "python": platform.python_version(), "torch": torch.__version__,
                "torch_cuda": torch.version.cuda, "numpy": _version("numpy"), "h5py": _version("h5py"),
                "matplotlib": _version("matplotlib")}
    bf16, found = bf16_supported(torch.device("cpu"))
    cpu = {"cores": usable_cores(), "logical_cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(),
           "omp_num_threads": os.environ.get("OMP_NUM_THREADS"), "agentsim_threads": os.environ.get("AGENTSIM_THREADS"),
           "other_load": _other_load(), "bf16": bf16, "bf16_detail": found, "machine": platform.machine()}
    devices = []
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            devices.append({"index": i, "name": p.name, "memory_gib": round(p.total_memory / 2**30, 1),
                            "capability": f"{p.major}.{p.minor}", "bf16": bf16_supported(torch.device("cuda", i))[0]})
    import torch.distributed as dist

    available = dist.is_available()
    backends = {"distributed": available, "gloo": available and dist.is_gloo_available(),
                "nccl": available and dist.is_nccl_available(), "mpi": available and dist.is_mpi_available()}
    optional = {name: _version(dist_name) for name, dist_name in _OPTIONAL.items()}
    return {"versions": versions, "cpu": cpu, "cuda": {"available": bool(devices), "devices": devices},
            "backends": backends, "optional": optional, "kernels": kernels()}


def kernels() -> dict[str, Any]:
    """The native CPU kernels: ``state`` (``installed``: built by ``pip install``; ``cache``: built
    on first use; ``disabled``; ``unavailable``), ``active``, the library's ``path``, ``detail``
    (why), and ``rng`` (whether the counter-based draws use it: ``AGENTSIM_RNG_KERNEL=0`` turns
    them off alone).
    """
    from agentsim._native import build as native

    status = native.library_status()
    return {"state": status.state, "active": status.active, "path": status.path, "detail": status.detail,
            "rng": status.active and os.environ.get("AGENTSIM_RNG_KERNEL", "1") != "0"}


def recommendations(facts: dict[str, Any]) -> list[str]:
    """Advice for what is missing or misconfigured in ``facts`` (empty when all is well)."""
    out = []
    cpu, cuda, backends, optional = facts["cpu"], facts["cuda"], facts["backends"], facts["optional"]
    if not backends["distributed"] or not backends["gloo"]:
        out.append("torch.distributed with gloo is missing: multi-rank runs (--nprocs, torchrun) cannot start; "
                   "install an official torch wheel (pip install torch)")
    if cpu["torch_threads"] > cpu["cores"]:
        out.append(f"torch uses {cpu['torch_threads']} threads on {cpu['cores']} available cores: "
                   f"set OMP_NUM_THREADS={cpu['cores']} (or fewer) to avoid oversubscription")
    load = cpu.get("other_load")
    if load is not None and cpu["torch_threads"] > 1:
        free = busy_threads(cpu["cores"], load, cpu["torch_threads"])
        if free < cpu["torch_threads"]:
            fixed = cpu.get("agentsim_threads") not in (None, "", "auto")
            out.append(f"the machine is busy: other processes keep {load:.1f} of {cpu['cores']} cores busy, so "
                       f"{cpu['torch_threads']} threads outnumber the free cores; "
                       + (f"AGENTSIM_THREADS={cpu['agentsim_threads']} fixes the threads: unset it to let runs "
                          "adapt" if fixed else f"runs adapt and use {free} (AGENTSIM_THREADS=N fixes them)"))
    if not cpu["bf16"]:
        out.append(f"no native bf16 on this CPU ({cpu['bf16_detail']}): train with --precision fp32 "
                   "(--precision bf16 is refused here); --compress bf16 still works")
    if cuda["devices"]:
        if not backends["nccl"]:
            out.append("CUDA devices but no NCCL: multi-GPU runs need a torch build with NCCL")
    elif facts["versions"]["torch_cuda"]:
        out.append(f"this torch is a CUDA {facts['versions']['torch_cuda']} build but no GPU is visible: "
                   "on a CPU-only machine the CPU wheel is far smaller (README: install)")
    kernels = facts["kernels"]
    if kernels["state"] == "unavailable":
        out.append("no native CPU kernels (graph pushes, random draws, metric sums, ... run as slower torch ops, "
                   "same results): install a C compiler (gcc or clang), then pip install agentsim again")
    elif kernels["state"] == "cache" and "other sources" in kernels["detail"]:
        out.append("the kernels built at install are older than the installed sources: pip install agentsim "
                   "again (until then they are built on first use into the cache)")
    if optional["torch_scatter"] is None:
        out.append("torch-scatter not installed: agentsim uses torch's native scatter_reduce/index_add_ "
                   "(the default, tested); pip install 'agentsim[scatter]' for the optional backend")
    return out


def format_info(facts: dict[str, Any]) -> str:
    """The facts and the advice as text."""
    v, cpu, cuda, backends, optional = (facts[k] for k in ("versions", "cpu", "cuda", "backends", "optional"))
    lines = ["versions: " + ", ".join(f"{k} {val}" for k, val in v.items() if val is not None and k != "torch_cuda")
             + (f" (CUDA {v['torch_cuda']} build)" if v["torch_cuda"] else " (CPU build)")]
    lines.append(f"cpu: {cpu['machine']}, {cpu['cores']} cores available ({cpu['logical_cpus']} logical), "
                 f"torch threads {cpu['torch_threads']}"
                 + (f" (OMP_NUM_THREADS={cpu['omp_num_threads']})" if cpu["omp_num_threads"] else "")
                 + (f" (AGENTSIM_THREADS={cpu['agentsim_threads']})" if cpu.get("agentsim_threads") else "")
                 + ("" if cpu.get("other_load") is None else f"; other processes busy on {cpu['other_load']:.1f} cores")
                 + f"; bf16 {'yes' if cpu['bf16'] else 'no'} ({cpu['bf16_detail']})")
    if cuda["devices"]:
        for d in cuda["devices"]:
            lines.append(f"cuda:{d['index']}: {d['name']}, {d['memory_gib']} GiB, capability {d['capability']}, "
                         f"bf16 {'yes' if d['bf16'] else 'no'}")
    else:
        lines.append("cuda: no devices")
    lines.append("distributed: " + ", ".join(f"{k} {'yes' if ok else 'no'}" for k, ok in backends.items()
                                             if k != "distributed"))
    lines.append("optional: " + ", ".join(f"{k} {val or 'not installed'}" for k, val in optional.items()))
    kernels = facts["kernels"]
    lines.append(f"native kernels: {kernels['state']}" + (f" ({kernels['path']})" if kernels["path"] else "")
                 + f": {kernels['detail']}"
                 + ("" if kernels["rng"] or not kernels["active"] else "; random draws: off (AGENTSIM_RNG_KERNEL=0)"))
    advice = recommendations(facts)
    lines.append("recommendations:" if advice else "recommendations: none, all is well")
    lines += [f"  - {a}" for a in advice]
    return "\n".join(lines)
