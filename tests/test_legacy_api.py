"""The model API of release 0.1 was removed in 0.3. Its README model, ported as CHANGELOG.md says
(legacy_readme_port.py), gives the bits the 0.1 model gave (tests/baselines/legacy_readme_walk.json
was written by commit a3a3343 from the 0.1 README example, kept verbatim below as ``README_0_1``)
on 1-4 ranks; every removed form raises an error that says what to write instead."""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import h5py
import pytest
import torch.distributed as dist

import agentsim as asim
from agentsim.distributed import TorchComm
from agentsim.errors import ConfigError
from agentsim.runner.launch import run_ranks

HERE = Path(__file__).parent
ROOT = HERE.parent
GOLDEN = json.loads((HERE / "baselines" / "legacy_readme_walk.json").read_text())
RUN = GOLDEN["run"]

README_0_1 = '''
import torch
from agentsim import FieldSpec, InitContext, Model, Param, ParamSpec, Population, Registry, Simulation, State
from agentsim.space.continuous import Box

registry = Registry()                      # one registry per model: no global names

@registry.substep(reads=["walker.pos"], writes=["walker.pos"])
def move(ctx):
    w = ctx["walker"]                      # checked view: undeclared reads/writes raise
    step = ctx.rng.normal(w["uid"], "move", draws=2, dtype=torch.float32)
    w["pos"] = ctx.space.wrap(w["pos"] + ctx.params["sigma"] * step)

def init(ic: InitContext):
    uid = torch.arange(ic.n_agents)
    pos = ic.rng.uniform(uid, 0, "init", draws=2, dtype=torch.float32) * 100
    walkers = Population("walker", {"pos": FieldSpec(torch.float32, (2,))}, {"uid": uid, "pos": pos})
    return State({"walker": walkers}), Box((100.0, 100.0))

model = Model("walk", registry, ["move"], ParamSpec({"sigma": Param(1.0, float, "step std")}), init)
'''


def digests(path: str) -> dict[str, str]:
    out: dict[str, str] = {}
    with h5py.File(path) as f:
        for group in ("agents", "metrics"):
            def add(name: str, obj: object, g: str = group) -> None:
                if isinstance(obj, h5py.Dataset) and name.split("/")[-1] != "checksums":  # (format 2's, of
                    out[f"{g}/{name}"] = hashlib.sha256(obj[...].tobytes()).hexdigest()  # these same bits)

            f[group].visititems(add)
    return out


def ported_model():
    return importlib.reload(importlib.import_module("legacy_readme_port")).model


def test_a_removed_name_is_absent_to_hasattr_and_explained_when_read():
    assert not hasattr(asim, "Registry") and getattr(asim, "ParamSpec", None) is None
    with pytest.raises(AttributeError, match=r"agentsim\.Registry was removed in 0\.3"):
        asim.Registry  # noqa: B018


def test_the_old_readme_example_fails_at_its_import_line_saying_what_to_write():
    with pytest.raises(ImportError, match=r"agentsim\.(ParamSpec|Registry) was removed in 0\.3: .*CHANGELOG\.md"):
        exec(compile(README_0_1, "README.md (0.1)", "exec"), {"__name__": "readme_0_1"})


def test_the_ported_readme_example_runs_and_gives_the_old_bits(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    model = ported_model()
    result = asim.Simulation(model.configure(params={"sigma": 0.5}), agents=1000, seed=1).run(10, out="walk.h5")
    assert result.metrics["n_walker"].tolist() == [1000] * 11
    assert model.plan().splitlines()[3].split() == ["1", "move", "walker.pos", "walker.pos", "-", "-"]
    assert digests(str(tmp_path / "walk.h5")) == GOLDEN["sha256"]


def run_port_everywhere(comm, out_dir: str) -> dict[str, dict[str, str]] | None:
    """The ported model on ranks {0, 1}, {0, 1, 2} and all four, with both partitioners; rank 0
    returns every file's digests."""
    model = ported_model().configure(params=RUN["params"])
    groups = {w: dist.new_group(list(range(w))) for w in (2, 3, 4)}
    got = {}
    for w, group in groups.items():
        if comm.rank < w:
            sub = TorchComm(group=group)
            for partition in ("data", "spatial"):
                sim = asim.Simulation(model, agents=RUN["agents"], seed=RUN["seed"], comm=sub, partition=partition)
                path = os.path.join(out_dir, f"{partition}_w{w}.h5")
                sim.run(RUN["steps"], out=path)
                if sub.rank == 0:
                    got[f"{partition} W={w}"] = digests(path)
        dist.barrier()
    return got if comm.rank == 0 else None


@pytest.mark.timeout(120)
def test_the_ported_readme_model_gives_the_old_bits_on_1_to_4_ranks(tmp_path):
    one = str(tmp_path / "one.h5")
    asim.Simulation(ported_model().configure(params=RUN["params"]), agents=RUN["agents"], seed=RUN["seed"]).run(
        RUN["steps"], out=one)
    assert digests(one) == GOLDEN["sha256"]
    got = run_ranks(run_port_everywhere, 4, (str(tmp_path),), timeout=60.0)[0]
    assert len(got) == 6
    for what, files in got.items():
        assert files == GOLDEN["sha256"], what


def step(ctx):
    pass


def init(ic):
    return asim.State({}), None


@pytest.mark.parametrize(("build", "error", "message"), [
    (lambda: asim.Registry, asim.RemovedNameError,
     r"^agentsim\.Registry was removed in 0\.3: declare substeps on the model with @model\.substep\(\.\.\.\)"),
    (lambda: asim.ParamSpec, asim.RemovedNameError,
     r"^agentsim\.ParamSpec was removed in 0\.3: pass the parameters as a dict, agentsim\.Model\(name, params="),
    (lambda: asim.Model("m", object(), ["step"], {}, init), ConfigError,
     r"^Model\(name, registry, substeps, params, init, \.\.\.\) was removed in 0\.3: write Model\(name, "
     r"params=\{\.\.\.\}\) and declare substeps, init and metrics with @model\.substep"),
    (lambda: asim.Model("m", registry=object(), substeps=[], params={}, init=init), ConfigError,
     r"^Model\(name, registry, substeps, params, init, \.\.\.\) was removed in 0\.3"),
    (lambda: asim.Model("m", params={}, derive=lambda m: {}), ConfigError,
     r"^Model\(name, registry, substeps, params, init, \.\.\.\) was removed in 0\.3"),
    (lambda: asim.Model("m", metrics=lambda mc: {"x": mc["w"]["x"]}), ConfigError,
     r"^Model\(metrics=fn\): a function fn\(mc\) -> \{name: values\} was removed in 0\.3: declare each metric "
     r"with @model\.metric"),
    (lambda: asim.Model("m", derived=lambda m: {"y": 1}), ConfigError,
     r"derive= of 0\.1\) was removed in 0\.3: declare each derived metric with @model\.derived"),
    (lambda: asim.Param(1.0, float, "step std"), ConfigError,
     r"^Param\(default, type, doc\) was removed in 0\.3: write Param\(default, doc\) \(the type is the default's\)"
     r".*\(got Param\(1\.0, <class 'float'>, 'step std'\)\)"),
    (lambda: asim.Param(1.0, "step std", check=lambda v: v > 0, expect="> 0"), ConfigError,
     r"^Param\(check=\.\.\., expect=\.\.\.\) was removed in 0\.3: bound the value with ge=, gt=, le=, lt= or "
     r"choices="),
    (lambda: asim.Substep("move", step, (), ("w.x",)), ConfigError,
     r"^Substep\('move', fn, reads, writes, \.\.\.\) was removed in 0\.3: write Substep\(fn, name='move', "
     r"reads=\[\.\.\.\], writes=\[\.\.\.\]\)"),
])
def test_each_removed_form_raises_an_error_that_says_what_to_write_instead(build, error, message):
    with pytest.raises(error, match=message) as caught:
        build()
    assert "CHANGELOG.md" in str(caught.value)


def test_other_mistakes_near_the_removed_forms_keep_their_own_messages():
    with pytest.raises(ConfigError, match=r"^Model: unexpected keyword 'param' \(valid: params, substeps, .*"
                                          r"Perhaps you meant 'params'"):
        asim.Model("m", param={})
    with pytest.raises(ConfigError, match=r"^Param: unexpected keyword 'maximum' \(valid: default, doc, type, "):
        asim.Param(1.0, "x", maximum=2)
    with pytest.raises(AttributeError, match="module 'agentsim' has no attribute 'Regsitry'"):
        asim.Regsitry  # noqa: B018
    assert asim.Param(doc="required", type=float).required


def test_nothing_deprecated_is_left():
    """No DeprecationWarning is raised or mentioned in the package and the reference models."""
    hits = [f"{path}:{number}" for folder in ("agentsim", "models") for path in sorted((ROOT / folder).rglob("*.py"))
            for number, line in enumerate(path.read_text().splitlines(), 1) if "deprecat" in line.lower()]
    assert not hits, hits
    code = ("import agentsim as asim\n"
            "for name in ('sir', 'boids', 'schelling', 'wolfsheep', 'randomwalk'):\n"
            "    asim.run(name, agents=60, steps=2, seed=1)\n")
    done = subprocess.run([sys.executable, "-W", "error::DeprecationWarning", "-c", code], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
