"""RunSpec: one checked description of a run, built by agentsim.run, agentsim.launch, `agentsim run`
and config files; its dict form (what the workers receive) round-trips; typed step figures."""

from __future__ import annotations

import argparse
import json

import numpy as np
import pytest
import torch

import agentsim as asim
from agentsim import RunSpec
from agentsim.cli.main import main, run_spec
from agentsim.distributed.partition import PERF_FIGURES, RankFigures, RanksFigures
from agentsim.errors import ConfigError
from agentsim.io.config import KEYS
from agentsim.io.hdf5 import read_trajectory
from agentsim.runner.launch import launch_spec

# One bad value per field and the message it gets (the messages of the checks the engine, the
# launcher and the command line used before RunSpec). Spatial options are checked with
# partition="spatial" (under "data" they are refused as options of another partitioner).
BAD = {
    "model": (42, "model: expected a Model or a model name (got int)"),
    "agents": (0, "agents: expected a positive int (got 0)"),
    "steps": (-1, "steps: expected an int >= 0 (got -1)"),
    "seed": ("x", "seed: expected an int (got 'x')"),
    "params": ({"betta": 0.1}, "unknown parameter 'betta' for model 'sir'"),
    "substeps": (["nope"], "unknown substep 'nope' (valid: infect, recover)"),
    "device": ("tpu", "unknown device 'tpu' (valid: cpu, cuda, cuda:N)"),
    "nprocs": (0, "nprocs: expected an int >= 1 (got 0)"),
    "partition": ("grid", "unknown partition 'grid' (valid: data, spatial)"),
    "layout": ("hex", "unknown layout 'hex' (valid: strips, blocks, rcb)"),
    "balance_every": (-1, "balance_every: expected an int >= 0 (got -1)"),
    "balance_threshold": (0.5, "balance_threshold: expected a number >= 1 (got 0.5)"),
    "bins": (0, "bins: expected an int >= 2 (got 0)"),
    "overlap": ("yes", "overlap: expected True or False (got 'yes')"),
    "sync_every": (0, "sync_every: expected an int >= 1 (got 0)"),
    "out": (3, "out: expected a path (got int)"),
    "record": (3, "record: expected a list of names (got 3)"),
    "every": (0, "every: expected an int >= 1 (got 0)"),
    "append": ("no", "append: expected true or false (got 'no')"),
    "resume": (3, "resume: expected a path (got int)"),
    "checkpoint_every": (0, "checkpoint_every: expected an int >= 1 (got 0)"),
    "checkpoint_dir": (3, "checkpoint_dir: expected a path (got int)"),
    "keep": (0, "keep: expected an int >= 1 (got 0)"),
    "checkpoint_async": ("y", "checkpoint_async: expected true or false (got 'y')"),
    "timeout": (0, "timeout: expected seconds > 0 (got 0)"),
    "max_restarts": (-1, "max_restarts: expected an int >= 0 (got -1)"),
    "check": ("y", "check: expected True, False, or a number of steps K >= 1 (check every K-th step) (got 'y')"),
    "progress": ("y", "progress: expected true or false (got 'y')"),
}
SPATIAL = {"layout", "balance_every", "balance_threshold", "bins", "overlap"}


def test_every_field_has_a_bad_value_case():
    assert set(BAD) == set(RunSpec.fields())


@pytest.mark.parametrize("name", sorted(BAD))
def test_a_bad_value_of_each_field_gets_its_clear_error(name):
    value, message = BAD[name]
    values = {"model": "boids" if name in SPATIAL else "sir", name: value}
    if name in SPATIAL:
        values["partition"] = "spatial"
    if name == "checkpoint_dir":
        values["checkpoint_every"] = 1
    with pytest.raises(ConfigError) as got:
        RunSpec.from_dict(values)
    assert message in str(got.value)


def test_checkpoint_every_needs_a_directory():
    with pytest.raises(ConfigError, match="checkpoint_every needs a checkpoint_dir"):
        RunSpec("sir", checkpoint_every=2)


def test_dict_round_trip_through_json():
    spec = RunSpec("boids", agents=300, steps=7, seed=5, params={"cohere": 0.02}, device="cpu", nprocs=2,
                   partition="spatial", layout="rcb", balance_every=3, balance_threshold=1.2, bins=8, overlap=False,
                   out="x.h5", record=["boid"], every=2, checkpoint_every=2, checkpoint_dir="ck", keep=2,
                   checkpoint_async=True, timeout=30.0, max_restarts=1, check=True, progress=True)
    plain = spec.to_dict()
    assert set(plain) == set(RunSpec.fields())
    again = RunSpec.from_dict(json.loads(json.dumps(plain)))
    assert again == spec
    assert again.record == ("boid",) and again.partition_options() == {
        "layout": "rcb", "balance_every": 3, "balance_threshold": 1.2, "bins": 8, "overlap": False}
    assert RunSpec.from_dict({"model": "sir"}) == RunSpec("sir")
    assert spec.replace(steps=9).steps == 9 and spec.replace(steps=9).layout == "rcb"


def test_a_model_object_becomes_a_reference_with_its_parameters():
    model = asim.get_model("sir").configure(params={"beta": 0.05}, substeps=["infect"])
    spec = RunSpec(model, agents=100, params={"gamma": 0.2})
    plain = spec.to_dict()
    assert plain["model"] == "sir" and plain["substeps"] == ["infect"]
    assert plain["params"]["beta"] == 0.05 and plain["params"]["gamma"] == 0.2
    rebuilt = RunSpec.from_dict(json.loads(json.dumps(plain))).resolved_model()
    assert rebuilt.same_definition(model) and dict(rebuilt.params) == dict(spec.resolved_model().params)
    assert [s.name for s in rebuilt.substeps] == ["infect"]


def test_unknown_keys_are_refused_with_the_closest_name():
    with pytest.raises(ConfigError, match="unknown run option 'agnets'.*Perhaps you meant 'agents'"):
        RunSpec.from_dict({"model": "sir", "agnets": 10})
    with pytest.raises(ConfigError, match="unknown run option 'stpes'.*Perhaps you meant 'steps'"):
        asim.run("sir", agents=10, stpes=2)
    with pytest.raises(ConfigError, match="no model given"):
        RunSpec.from_dict({"agents": 10})


def test_a_spec_comes_alone():
    spec = RunSpec("randomwalk", agents=50, steps=2)
    with pytest.raises(ConfigError, match="a RunSpec holds every run option"):
        asim.run(spec, steps=3)
    with pytest.raises(ConfigError, match="a RunSpec holds every run option"):
        asim.launch(spec, 1, seed=3)
    with pytest.raises(ConfigError, match="world_size: expected an int >= 1 .got 0."):
        asim.launch("randomwalk", 0)


def test_launch_keeps_its_positional_order():
    spec = launch_spec("randomwalk", 2, (50, 3, 4, None, None, 2, "data", 20.0))
    assert (spec.nprocs, spec.agents, spec.steps, spec.seed, spec.every, spec.partition, spec.timeout) == \
        (2, 50, 3, 4, 2, "data", 20.0)
    assert launch_spec(RunSpec("randomwalk", nprocs=2), 3).nprocs == 3


def _same(a, b):
    assert a.keys() == b.keys()
    for k in a:
        assert np.array_equal(a[k], b[k]), k


def test_run_of_a_spec_equals_the_keyword_form_bitwise():
    keywords = asim.run("randomwalk", 200, 6, 3, params={"step_size": 0.7}).metrics
    spec = RunSpec("randomwalk", agents=200, steps=6, seed=3, params={"step_size": 0.7})
    _same(asim.run(spec).metrics, keywords)
    _same(asim.launch(spec).metrics, keywords)  # nprocs 1: here
    _same(asim.launch("randomwalk", 1, 200, 6, 3, params={"step_size": 0.7}).metrics, keywords)


def test_a_spec_on_two_processes_equals_one_process_bitwise():
    one = asim.run("sir", agents=400, steps=4, seed=2).metrics
    two = asim.run(RunSpec("sir", agents=400, steps=4, seed=2, nprocs=2, timeout=60.0))
    assert two.world_size == 2
    _same(two.metrics, one)


def test_config_keys_are_run_spec_fields():
    assert set(KEYS) <= set(RunSpec.fields())


def _cli_args(*argv: str) -> argparse.Namespace:
    from agentsim.cli.main import build_parser

    return build_parser().parse_args(["run", *argv])


def test_a_config_file_run_equals_the_command_line_run(tmp_path):
    config = tmp_path / "run.toml"
    config.write_text('model = "sir"\nagents = 500\nsteps = 6\nseed = 4\nevery = 3\nrecord = ["person"]\n'
                      f'out = "{tmp_path / "config.h5"}"\n[params]\nbeta = 0.05\n')
    flags = ["sir", "--agents", "500", "--steps", "6", "--seed", "4", "--every", "3", "--record", "person",
             "--set", "beta=0.05", "--out", str(tmp_path / "flags.h5")]
    from agentsim.io.config import load_config

    from_file = run_spec(_cli_args("--config", str(config)), load_config(config))
    from_flags = run_spec(_cli_args(*flags), {})
    assert from_file.replace(out=None) == from_flags.replace(out=None)
    assert main(["run", "--quiet", "--config", str(config)]) == 0
    assert main(["run", "--quiet", *flags]) == 0
    a, b = read_trajectory(tmp_path / "config.h5"), read_trajectory(tmp_path / "flags.h5")
    _same(a.metrics, b.metrics)
    assert np.array_equal(a.agents("person", "status", 6)["status"], b.agents("person", "status", 6)["status"])
    # and the Python API with the same spec gives the same metrics
    _same(asim.run(from_flags.replace(out=None)).metrics, a.metrics)


def test_flags_override_the_config_file(tmp_path):
    config = tmp_path / "run.toml"
    config.write_text('model = "sir"\nagents = 500\nsteps = 6\nnprocs = 2\npartition = "data"\n')
    from agentsim.io.config import load_config

    spec = run_spec(_cli_args("--config", str(config), "--steps", "9", "--nprocs", "1"), load_config(config))
    assert (spec.model, spec.agents, spec.steps, spec.nprocs, spec.partition) == ("sir", 500, 9, 1, "data")


def test_rank_figures_travel_as_one_row_and_come_back_typed():
    mine = RankFigures(agents=10.0, step_seconds=0.5, comm_seconds=0.1, bytes_sent=100.0)
    theirs = mine._replace(agents=30.0, halo_rows=3.0, migrated=2.0)
    row = mine.to_tensor()
    assert row.shape == (1, len(PERF_FIGURES)) and row.dtype == torch.float64
    gathered = RanksFigures.from_tensor(torch.cat([row, theirs.to_tensor()]))
    assert gathered.agents == [10.0, 30.0] and gathered.migrated == [0.0, 2.0]
    assert RanksFigures.of_one(theirs).rank(0) == theirs
    assert gathered.rank(0) == mine and gathered.rank(1) == theirs
    with pytest.raises(ValueError, match=r"expected \[W, 7\] figures"):
        RanksFigures.from_tensor(torch.zeros(2, 6, dtype=torch.float64))


def test_the_typed_options_of_run_and_launch_are_the_fields_of_runspec():
    """RunOptions (what editors show for agentsim.run / launch keywords) names every RunSpec field but
    the model, and nothing else."""
    import dataclasses

    from agentsim.engine.spec import RunOptions

    fields = {f.name for f in dataclasses.fields(RunSpec) if f.init} - {"model"}
    assert set(RunOptions.__annotations__) == fields


def test_a_spec_saved_with_to_dict_loads_back_as_a_config_file(tmp_path):
    yaml = pytest.importorskip("yaml")
    spec = asim.RunSpec("sir", agents=300, steps=4, seed=2, params={"beta": 0.05}, out=str(tmp_path / "a.h5"))
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec.to_dict()))  # every field, None ones included
    from agentsim.io.config import load_config

    assert asim.RunSpec.from_dict(load_config(tmp_path / "spec.yaml")) == spec
