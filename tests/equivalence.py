"""Path equivalence, shared by the multi-rank tests: models run on sub-groups of ONE 4-rank gloo job
(process start-up dominates the cost) and must give the bits of a one-process run: metrics, final
agents sorted by uid, and the HDF5 ``/agents``, ``/env`` and ``/metrics``.

A test module declares its ``CASES`` (:class:`Case`) and ``PARTITION``; the fixtures
``reference`` and ``multi_rank`` of ``conftest.py`` run them.
"""

from __future__ import annotations

import os
from typing import Any, NamedTuple

import h5py
import numpy as np
import torch
import torch.distributed as dist

from agentsim import Simulation, get_model
from agentsim.distributed import TorchComm

STEPS, EVERY, SEED, WORLD_SIZES = 15, 5, 7, (2, 3, 4)


class Case(NamedTuple):
    """One run: a key, a built-in model, its agents, parameters, partition options, sync period."""

    key: str
    model: str
    agents: int
    params: dict[str, Any] = {}  # noqa: RUF012  read-only
    options: dict[str, Any] = {}  # noqa: RUF012  read-only
    sync_every: int = 1


def model_of(case: Case) -> Any:
    model = get_model(case.model)
    return model.configure(params=case.params) if case.params else model


def sorted_fields(fields: dict[str, torch.Tensor]) -> dict[str, np.ndarray]:
    order = torch.argsort(fields["uid"])
    return {k: v[order].cpu().numpy() for k, v in fields.items()}


def h5_datasets(path: str) -> dict[str, np.ndarray]:
    """Every dataset under /agents, /env and /metrics (what must match bit for bit)."""
    out: dict[str, np.ndarray] = {}
    with h5py.File(path, "r") as f:
        for group in ("agents", "env", "metrics"):
            if group in f:
                f[group].visititems(
                    lambda name, obj, g=group: out.__setitem__(f"{g}/{name}", obj[...])
                    if isinstance(obj, h5py.Dataset) else None)
    return out


def same_values(a: Any, b: Any) -> bool:
    """Whether two values a reader served are the same: dicts with the same keys, lists of the same
    length, arrays of the same dtype and values, other values equal, all the way down.
    """
    if isinstance(a, dict):
        return isinstance(b, dict) and sorted(a) == sorted(b) and all(same_values(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(same_values(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.dtype == b.dtype and np.array_equal(a, b)
    return bool(a == b)


def flip_bit(data: bytes, at: int, bit: int) -> bytes:
    """``data`` with bit ``bit`` of byte ``at`` flipped (the bit-flip tests of files)."""
    flipped = bytearray(data)
    flipped[at] ^= 1 << bit
    return bytes(flipped)


def assert_same_bits(a: dict[str, np.ndarray], b: dict[str, np.ndarray], what: str) -> None:
    assert sorted(a) == sorted(b), what
    for k in a:
        x, y = np.asarray(a[k]), np.asarray(b[k])
        assert x.dtype == y.dtype and x.shape == y.shape, f"{what}: {k} {x.dtype}{x.shape} vs {y.dtype}{y.shape}"
        assert x.tobytes() == y.tobytes(), f"{what}: {k} differs"


def run_cases(comm: Any, cases: list[Case], partition: str, out_dir: str, steps: int = STEPS, every: int = EVERY,
              seed: int = SEED) -> dict[str, dict[str, Any]] | None:
    """Every case on this comm's ranks; rank 0 returns metrics, file, figures and final agents."""
    results = {}
    for case in cases:
        sim = Simulation(model_of(case), agents=case.agents, seed=seed, comm=comm, partition=partition,
                         sync_every=case.sync_every, **case.options)
        path = os.path.join(out_dir, f"{case.key}_w{comm.world_size}.h5")
        result = sim.run(steps, out=path, every=every)
        agents = {pop: comm.gather_rows(p.fields()) for pop, p in sim.state.populations.items()}
        if comm.rank == 0:
            results[case.key] = {"metrics": result.metrics, "path": path, "perf": result.perf,
                                 "overlap": getattr(sim.partition, "overlap", None) is not None,
                                 "agents": {pop: sorted_fields(f) for pop, f in agents.items()},
                                 "local": {pop: p.n for pop, p in sim.state.populations.items()}}
    return results if comm.rank == 0 else None


def run_on_subgroups(comm: Any, cases: list[Case], partition: str, out_dir: str,
                     world_sizes: tuple[int, ...] = WORLD_SIZES) -> dict[int, Any] | None:
    """On a 4-rank job: :func:`run_cases` on ranks {0, 1}, then {0, 1, 2}, then all four."""
    groups = {w: dist.new_group(list(range(w))) for w in world_sizes}  # every rank creates every group
    out = {}
    for w in world_sizes:
        if comm.rank < w:
            out[w] = run_cases(TorchComm(group=groups[w]), cases, partition, out_dir)
        dist.barrier()
    return out if comm.rank == 0 else None


def reference_runs(cases: list[Case], out_dir: str) -> dict[str, dict[str, Any]]:
    """One-process runs (the identity partitioner)."""
    ref = {}
    for case in cases:
        sim = Simulation(model_of(case), agents=case.agents, seed=SEED, sync_every=case.sync_every)
        path = os.path.join(out_dir, f"{case.key}.h5")
        result = sim.run(STEPS, out=path, every=EVERY)
        ref[case.key] = {"metrics": result.metrics, "path": path,
                         "agents": {pop: sorted_fields(p.fields()) for pop, p in sim.state.populations.items()}}
    return ref


def check_figures(perf: list[dict[str, float]], what: str) -> None:
    """One entry per step; a step's collectives fit in its seconds (one window, agentsim.engine.perf)."""
    assert len(perf) == STEPS, what
    for step, p in enumerate(perf, 1):
        assert 0 <= p["comm/seconds_max"] <= p["rank_step_seconds/max"], (what, step, p)
        assert p["agents/imbalance"] >= 1.0 and p["agents/mean"] > 0, (what, step, p)


def check_same_as_reference(ref: dict[str, Any], got: dict[str, Any], what: str) -> None:
    assert_same_bits(ref["metrics"], got["metrics"], f"{what} metrics")
    assert sorted(ref["agents"]) == sorted(got["agents"])
    for pop in ref["agents"]:
        assert_same_bits(ref["agents"][pop], got["agents"][pop], f"{what} final {pop}")
    assert_same_bits(h5_datasets(ref["path"]), h5_datasets(got["path"]), f"{what} HDF5")
