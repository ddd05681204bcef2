"""The model API of release 0.1 keeps working for this release, with a DeprecationWarning, and gives
the bits it gave then (tests/baselines/legacy_readme_walk.json was written by commit a3a3343 from
the README example kept verbatim in legacy_readme_model.py)."""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import h5py
import pytest
import torch.distributed as dist

import agentsim as asim
from agentsim.distributed import TorchComm
from agentsim.runner.launch import run_ranks

HERE = Path(__file__).parent
GOLDEN = json.loads((HERE / "baselines" / "legacy_readme_walk.json").read_text())
RUN = GOLDEN["run"]


def digests(path: str) -> dict[str, str]:
    out: dict[str, str] = {}
    with h5py.File(path) as f:
        for group in ("agents", "metrics"):
            def add(name: str, obj: object, g: str = group) -> None:
                if isinstance(obj, h5py.Dataset):
                    out[f"{g}/{name}"] = hashlib.sha256(obj[...].tobytes()).hexdigest()

            f[group].visititems(add)
    return out


def legacy_model():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return importlib.reload(importlib.import_module("legacy_readme_model")).model


def test_the_old_readme_example_runs_as_written_and_warns(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # it writes walk.h5 into the working directory
    source = (HERE / "legacy_readme_model.py").read_text()
    source += ('result = Simulation(model.configure(params={"sigma": 0.5}), agents=1000, seed=1).run(10, '
               'out="walk.h5")\nprint(model.plan())\n')  # its last two lines
    with pytest.warns(DeprecationWarning) as caught:
        exec(compile(source, "README.md (0.1)", "exec"), {"__name__": "readme_0_1"})
    said = " ".join(str(w.message) for w in caught)
    for name in ("Registry", "ParamSpec", "Param(default, type, doc)", "Model(name, registry"):
        assert name in said, name
    assert digests(str(tmp_path / "walk.h5")) == GOLDEN["sha256"]


def run_legacy_everywhere(comm, out_dir: str) -> dict[str, dict[str, str]] | None:
    """The legacy model on ranks {0, 1}, {0, 1, 2} and all four, with both partitioners; rank 0
    returns every file's digests."""
    model = legacy_model().configure(params=RUN["params"])
    groups = {w: dist.new_group(list(range(w))) for w in (2, 3, 4)}
    got = {}
    for w, group in groups.items():
        if comm.rank < w:
            sub = TorchComm(group=group)
            runs = [("data", asim.Simulation), ("spatial", asim.Simulation)]
            for name, cls in runs:
                partition = name.split("-")[0]
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", DeprecationWarning)
                    sim = cls(model, agents=RUN["agents"], seed=RUN["seed"], comm=sub, partition=partition)
                path = os.path.join(out_dir, f"{name}_w{w}.h5")
                sim.run(RUN["steps"], out=path)
                if sub.rank == 0:
                    got[f"{name} W={w}"] = digests(path)
        dist.barrier()
    return got if comm.rank == 0 else None


@pytest.mark.timeout(120)
def test_the_old_readme_model_gives_its_old_bits_on_1_to_4_ranks(tmp_path):
    one = str(tmp_path / "one.h5")
    asim.Simulation(legacy_model().configure(params=RUN["params"]), agents=RUN["agents"], seed=RUN["seed"]).run(
        RUN["steps"], out=one)
    assert digests(one) == GOLDEN["sha256"]
    got = run_ranks(run_legacy_everywhere, 4, (str(tmp_path),), timeout=60.0)[0]
    assert len(got) == 6
    for what, files in got.items():
        assert files == GOLDEN["sha256"], what


def test_each_legacy_form_warns_and_names_its_replacement():
    def step(ctx):
        pass

    with pytest.warns(DeprecationWarning, match=r"Registry is deprecated.*@model.substep"):
        asim.Registry()
    with pytest.warns(DeprecationWarning, match=r"ParamSpec is deprecated.*params=\{name: Param"):
        asim.ParamSpec({})
    with pytest.warns(DeprecationWarning, match=r"Param\(default, type, doc\) is deprecated.*Param\(default, doc\)"):
        asim.Param(1.0, float, "x")
    with pytest.warns(DeprecationWarning, match=r"check=..., expect=...\) is deprecated.*ge=, gt=, le=, lt="):
        asim.Param(1.0, "x", check=lambda v: v > 0, expect="> 0")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        registry = asim.Registry()
        registry.substep(writes=["a.x"])(step)
    with pytest.warns(DeprecationWarning, match=r"Model\(name, registry, substeps, params, init, ...\) is deprecated"):
        asim.Model("m", registry, ["step"], {}, lambda ic: (asim.State({}), None))


def test_the_reference_models_use_no_deprecated_api():
    code = ("import agentsim as asim\n"
            "for name in ('sir', 'boids', 'schelling', 'wolfsheep', 'randomwalk'):\n"
            "    asim.run(name, agents=60, steps=2, seed=1)\n")
    done = subprocess.run([sys.executable, "-W", "error::DeprecationWarning", "-c", code], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
