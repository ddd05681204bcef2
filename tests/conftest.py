"""Shared fixtures: the path-equivalence runs of a test module's ``CASES`` (see equivalence.py)."""

from __future__ import annotations

import pytest
from equivalence import reference_runs, run_on_subgroups

from agentsim.distributed import run_ranks


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
