"""Shared fixtures: the path-equivalence runs of a test module's ``CASES`` (see equivalence.py), and
``torch_ops`` (a call with the compiled kernels switched off)."""

from __future__ import annotations

import os

import pytest
import torch

# Triton decides at import whether its kernels run compiled or in its interpreter: without a GPU
# the fused kernels' tests (test_fused.py) run them interpreted, on the CPU.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
from equivalence import reference_runs, run_on_subgroups

from agentsim.runner.launch import run_ranks


@pytest.fixture
def torch_ops(monkeypatch):
    """``torch_ops(fn, switch="AGENTSIM_KERNELS")``: ``fn()`` with the kernels behind ``switch``
    turned off (their torch ops run instead); the variable's earlier value is restored after.
    """
    def run(fn, switch="AGENTSIM_KERNELS"):
        with monkeypatch.context() as m:
            m.setenv(switch, "0")
            return fn()

    return run


@pytest.fixture(scope="module")
def reference(request, tmp_path_factory):
    """One-process runs of the module's CASES, by key."""
    return reference_runs(request.module.CASES, str(tmp_path_factory.mktemp("reference")))


@pytest.fixture(scope="module")
def multi_rank(request, tmp_path_factory):
    """The module's CASES with its PARTITION on 2, 3 and 4 ranks: {world size: {key: result}}."""
    out_dir = str(tmp_path_factory.mktemp("multi_rank"))
    return run_ranks(run_on_subgroups, 4, (request.module.CASES, request.module.PARTITION, out_dir),
                     timeout=120.0)[0]
