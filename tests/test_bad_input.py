"""Bad input: every case of the table in docs/reference/errors.md gets a clear message and a non-zero
exit from the ``agentsim`` command, never a traceback from inside torch or h5py.

Each case writes what it needs under a temporary directory (``DIR`` in the messages), runs
``agentsim`` in this process, and checks the exit status and that the error line holds the
documented excerpt. ``python tests/test_bad_input.py`` prints the table of the docs.
"""

from __future__ import annotations

import json
import sys
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from agentsim.cli.main import main

DOC = Path(__file__).resolve().parents[1] / "docs" / "reference" / "errors.md"
RUN = ["run", "--quiet", "--steps", "3"]


@dataclass(frozen=True)
class Case:
    id: str
    group: str
    what: str
    setup: Callable[[Path], list[str]]  # writes the case's files under DIR, returns the argv
    code: int  # the exit status
    excerpt: str  # part of the error line, with DIR for the temporary directory


def args(*argv: str) -> Callable[[Path], list[str]]:
    return lambda d: [a.replace("DIR", str(d)) for a in argv]


def with_file(name: str, text: str | bytes, *argv: str) -> Callable[[Path], list[str]]:
    def setup(d: Path) -> list[str]:
        path = d / name
        path.write_bytes(text if isinstance(text, bytes) else textwrap.dedent(text).encode())
        return [a.replace("DIR", str(d)) for a in argv]
    return setup


# A model module: one population 'a' of float fields x, y; BODY is the substep's declaration
# and code, INIT what init adds besides the uids.
MODEL = """
import torch
import agentsim as asim

model = asim.Model("bad")
not_a_model = 42

{body}

@model.init
def init(ic):
    n = ic.n_agents
    uid = ic.uids("a", n)
    {init}
    return asim.Box((10.0, 10.0))
"""
INIT = ("ic.add('a', uid=uid, x=torch.rand(n) * 10, y=torch.zeros(n), pos=torch.rand(n, 2) * 10, "
        "k=torch.zeros(n, dtype=torch.int32))")


def model_case(name: str, body: str, init: str = INIT, attr: str = "model", extra: tuple[str, ...] = ()) -> Callable:
    def setup(d: Path) -> list[str]:
        (d / f"{name}.py").write_text(MODEL.format(body=textwrap.dedent(body), init=init))
        sys.path.insert(0, str(d))
        return [*RUN, "--agents", "20", f"{name}:{attr}", *extra]
    return setup


def edges(text: str, *extra: str) -> Callable[[Path], list[str]]:
    return with_file("edges.csv", text, *RUN, "sir", "--agents", "6", "--set", "network=csv",
                     "--set", "edges_csv=DIR/edges.csv", *extra)


def trajectory(d: Path, name: str = "run.h5") -> Path:
    assert main(["run", "randomwalk", "--agents", "50", "--steps", "4", "--quiet", "--out", str(d / name)]) == 0
    return d / name


def truncated(d: Path) -> list[str]:
    path = trajectory(d)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    return ["inspect", str(path)]


def being_written(d: Path) -> list[str]:
    import subprocess

    path = d / "live.h5"
    code = ("import h5py, sys, time; f = h5py.File(sys.argv[1], 'w'); f.attrs['format'] = 'agentsim-trajectory'; "
            "f.flush(); print('ready', flush=True); time.sleep(60)")
    proc = subprocess.Popen([sys.executable, "-c", code, str(path)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    WRITERS.append(proc)
    return ["inspect", str(path)]


WRITERS: list = []


def foreign_hdf5(d: Path) -> list[str]:
    import h5py

    with h5py.File(d / "other.h5", "w") as f:
        f["data"] = [1, 2, 3]
    return ["inspect", str(d / "other.h5")]


def checkpoint(d: Path, model: str = "boids", *extra: str) -> Path:
    assert main(["run", model, "--agents", "40", "--steps", "2", "--quiet", "--checkpoint-every", "2",
                 "--checkpoint-dir", str(d / "ck"), *extra]) == 0
    return d / "ck" / "step-00000002"


def corrupt_shard(d: Path) -> list[str]:
    shard = checkpoint(d) / "rank-00000-of-00001.pt"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    return [*RUN, "boids", "--agents", "40", "--steps", "4", "--resume", str(d / "ck")]


def unfinished(d: Path) -> list[str]:
    (checkpoint(d) / "manifest.json").unlink()
    return [*RUN, "boids", "--agents", "40", "--steps", "4", "--resume", str(d / "ck")]


def edit_manifest(change: Callable[[dict], None], *run: str, reseal: bool = False) -> Callable[[Path], list[str]]:
    """Change a checkpoint's manifest; ``reseal``: with its checksum recomputed (a manifest written so)."""
    def setup(d: Path) -> list[str]:
        from agentsim.io.checkpoint import manifest_checksum

        path = checkpoint(d) / "manifest.json"
        manifest = json.loads(path.read_text())
        change(manifest)
        if reseal:
            manifest.pop("checksum", None)
            manifest["checksum"] = manifest_checksum(manifest)
        path.write_text(json.dumps(manifest))
        return [*RUN, *run, "--resume", str(d / "ck")]
    return setup


def garbled_manifest(d: Path) -> list[str]:
    (checkpoint(d) / "manifest.json").write_text("{not json")
    return ["inspect", str(d / "ck")]


def resume_as(*run: str) -> Callable[[Path], list[str]]:
    def setup(d: Path) -> list[str]:
        checkpoint(d)
        return [*RUN, *run, "--resume", str(d / "ck")]
    return setup


CASES = [
    # ---------------------------------------------------------------- command-line arguments
    Case("cli-unknown-model", "command line", "an unknown model name", args(*RUN, "sri"), 2,
         "unknown model 'sri'"),
    Case("cli-unknown-param", "command line", "a misspelled parameter", args(*RUN, "sir", "--set", "betta=0.1"), 2,
         "unknown parameter 'betta' for model 'sir'"),
    Case("cli-param-type", "command line", "a parameter value of the wrong type",
         args(*RUN, "sir", "--set", "beta=high"), 2, "parameter 'beta': expected a float"),
    Case("cli-param-range", "command line", "a parameter value out of its range",
         args(*RUN, "sir", "--set", "beta=2"), 2, "parameter 'beta': expected a value in [0, 1] (got 2.0)"),
    Case("cli-param-nan", "command line", "a parameter set to NaN",
         args(*RUN, "randomwalk", "--set", "drift_x=nan"), 2, "parameter 'drift_x': expected a float (got 'nan')"),
    Case("cli-set-syntax", "command line", "--set without NAME=VALUE", args(*RUN, "sir", "--set", "beta"), 2,
         "expected NAME=VALUE"),
    Case("cli-agents-zero", "command line", "--agents 0", args(*RUN, "sir", "--agents", "0"), 2,
         "agents: expected a positive int"),
    Case("cli-agents-word", "command line", "--agents that is not a number", args(*RUN, "sir", "--agents", "many"), 2,
         "argument --agents: invalid int value: 'many'"),
    Case("cli-steps-negative", "command line", "--steps -1", args("run", "sir", "--steps", "-1"), 2,
         "steps: expected an int >= 0"),
    Case("cli-record-field", "command line", "--record of a field the model does not have",
         args(*RUN, "sir", "--agents", "100", "--record", "person.colour"), 2, "unknown field 'person.colour'"),
    Case("cli-device", "command line", "an unknown device", args(*RUN, "sir", "--device", "tpu"), 2,
         "unknown device"),
    Case("cli-partition", "command line", "an unknown partitioner",
         args(*RUN, "sir", "--nprocs", "2", "--partition", "grid"), 2,
         "unknown partition 'grid' (valid: data, spatial)"),
    Case("cli-nprocs", "command line", "--nprocs 0", args(*RUN, "sir", "--nprocs", "0"), 2, "nprocs: expected an int"),
    Case("cli-every", "command line", "--every 0", args(*RUN, "sir", "--every", "0"), 2, "every: expected"),
    Case("cli-timeout", "command line", "--timeout 0", args(*RUN, "sir", "--nprocs", "2", "--timeout", "0"), 2,
         "timeout: expected seconds > 0"),
    Case("cli-keep", "command line", "--keep 0", args(*RUN, "sir", "--checkpoint-every", "1", "--keep", "0"), 2,
         "--keep: expected an int >= 1 (got 0)"),
    Case("cli-checkpoint-dir-alone", "command line", "--checkpoint-dir without --checkpoint-every",
         args(*RUN, "sir", "--checkpoint-dir", "DIR/ck"), 2, "--checkpoint-dir needs --checkpoint-every K"),
    Case("cli-async-alone", "command line", "--checkpoint-async without --checkpoint-every",
         args(*RUN, "sir", "--checkpoint-async"), 2, "--checkpoint-async needs --checkpoint-every K"),
    Case("cli-max-restarts", "command line", "--max-restarts with one process",
         args(*RUN, "sir", "--checkpoint-every", "1", "--checkpoint-dir", "DIR/ck", "--max-restarts", "2"), 2,
         "--max-restarts restarts the processes of --nprocs W"),
    Case("cli-out-dir", "command line", "--out in a directory that does not exist",
         args(*RUN, "sir", "--agents", "100", "--out", "DIR/no/such/run.h5"), 1, "DIR/no/such"),
    # ---------------------------------------------------------------- config files
    Case("config-malformed", "config file", "malformed TOML", with_file("c.toml", "model = \n", "run", "--config",
                                                                         "DIR/c.toml"), 2, "malformed TOML in"),
    Case("config-unknown-key", "config file", "a misspelled key",
         with_file("c.toml", 'model = "sir"\nagnets = 10\n', "run", "--config", "DIR/c.toml"), 2,
         "unknown key 'agnets'"),
    Case("config-suffix", "config file", "a file that is not .toml/.yaml",
         with_file("c.ini", "x", "run", "--config", "DIR/c.ini"), 2, "expected a .toml, .yaml or .yml file"),
    Case("config-missing", "config file", "a config file that does not exist", args("run", "--config", "DIR/no.toml"),
         1, "cannot read config file 'DIR/no.toml'"),
    Case("config-params-table", "config file", "params that is not a table",
         with_file("c.toml", 'model = "sir"\nparams = 3\n', "run", "--config", "DIR/c.toml"), 2,
         "'params' must be a table of name = value"),
    Case("config-yaml-list", "config file", "a YAML file that is a list",
         with_file("c.yaml", "- sir\n- 10\n", "run", "--config", "DIR/c.yaml"), 2, "expected a table of keys"),
    Case("config-value-type", "config file", "a value of the wrong type",
         with_file("c.toml", 'model = "sir"\nagents = "ten"\n', "run", "--quiet", "--config", "DIR/c.toml"), 2,
         "agents: expected a positive int"),
    Case("config-async-type", "config file", "checkpoint_async that is not true or false",
         with_file("c.toml", 'model = "sir"\ncheckpoint_every = 2\ncheckpoint_async = "yes"\n', "run", "--quiet",
                   "--config", "DIR/c.toml"), 2, "checkpoint_async: expected true or false (got 'yes')"),
    # ---------------------------------------------------------------- model definitions
    Case("model-undeclared-read", "model definition", "a substep reads a field it did not declare",
         model_case("m_read", """
             @model.substep(writes=["a.x"])
             def step(ctx):
                 a = ctx["a"]
                 a["x"] = a["x"] + a["y"]
         """), 1, "substep 'step' reads 'a.y' but does not declare it"),
    Case("model-undeclared-write", "model definition", "a substep writes a field it did not declare",
         model_case("m_write", """
             @model.substep(writes=["a.x"])
             def step(ctx):
                 ctx["a"]["y"] = ctx["a"]["x"]
         """), 1, "substep 'step' writes 'a.y' but does not declare it"),
    Case("model-in-place", "model definition", "a substep changes a read-only field in place",
         model_case("m_inplace", """
             @model.substep(reads=["a.y"], writes=["a.x"])
             def step(ctx):
                 ctx["a"]["y"].add_(1)
                 ctx["a"]["x"] = ctx["a"]["x"] + 1
         """), 1, "modified 'a.y' in place"),
    Case("model-unknown-population", "model definition", "a declaration names a population init never adds",
         model_case("m_pop", """
             @model.substep(writes=["dog.x"])
             def step(ctx):
                 pass
         """), 2, "unknown population 'dog'"),
    Case("model-spawn-dtype", "model definition", "spawned fields of the wrong dtype",
         model_case("m_spawn_dtype", """
             @model.substep(reads=["a.x", "a.y", "a.pos", "a.k"], births=["a"])
             def step(ctx):
                 a = ctx["a"]
                 ctx.spawn("a", a["uid"][:2], {"x": a["x"][:2], "y": a["y"][:2], "pos": a["pos"][:2],
                                         "k": a["x"][:2]})
         """), 1, "a.k: expected dtype torch.int32 (got torch.float32)"),
    Case("model-spawn-shape", "model definition", "spawned fields of the wrong shape",
         model_case("m_spawn_shape", """
             @model.substep(reads=["a.x", "a.y", "a.pos", "a.k"], births=["a"])
             def step(ctx):
                 a = ctx["a"]
                 ctx.spawn("a", a["uid"][:2], {"x": a["x"][:3], "y": a["y"][:2], "pos": a["pos"][:2],
                                         "k": a["k"][:2]})
         """), 1, "a.x: expected shape [2] (got [3])"),
    Case("model-spawn-undeclared", "model definition", "a substep spawns without declaring births",
         model_case("m_spawn_decl", """
             @model.substep(reads=["a.x", "a.y", "a.pos", "a.k"])
             def step(ctx):
                 a = ctx["a"]
                 ctx.spawn("a", a["uid"][:2], {"x": a["x"][:2], "y": a["y"][:2], "pos": a["pos"][:2],
                                         "k": a["k"][:2]})
         """), 1, "spawns into 'a' but declares births=[]"),
    Case("model-neighbor-field", "model definition", "a substep reads a neighbor field it did not declare",
         model_case("m_nbfield", """
             @model.substep(writes=["a.x"], neighbors={"a": ["x"]}, reach=1.0)
             def step(ctx):
                 ctx["a"]["x"] = ctx["a"]["x"] + ctx.neighbors("a")["y"].sum()
         """), 1, "'a.y'"),
    Case("model-reach-short", "model definition", "a search beyond the declared reach",
         model_case("m_reach", """
             @model.substep(writes=["a.x"], neighbors={"a": ["pos"]}, reach=1.0)
             def step(ctx):
                 nb = ctx.neighbors("a")
                 i, j = asim.radius_pairs(nb["pos"], ctx.space, 2.5, uid=nb["uid"], n_query=nb.n_local)
                 ctx["a"]["x"] = ctx["a"]["x"] + 0 * i.numel()
         """), 1, "substep 'step' declares reach 1.0 but searches radius 2.5"),
    Case("model-reach-kind", "model definition", "a reach the space does not have",
         model_case("m_reachkind", """
             @model.substep(writes=["a.x"], neighbors={"a": ["x"]}, reach="moore:1")
             def step(ctx):
                 ctx["a"]["x"] = ctx["a"]["x"] + 1
         """, extra=("--nprocs", "2", "--partition", "spatial")), 2,
         "reach 'moore:1' is a 'moore' reach, which a Box space does not have"),
    Case("model-reach-param", "model definition", "a reach naming a parameter the model does not have",
         model_case("m_reachparam", """
             @model.substep(writes=["a.x"], neighbors={"a": ["x"]}, reach="vison")
             def step(ctx):
                 ctx["a"]["x"] = ctx["a"]["x"] + 1
         """), 2, "reach 'vison' is not a parameter"),
    Case("model-uid-dtype", "model definition", "init adds uids that are not int64",
         model_case("m_uid", "@model.substep(writes=['a.x'])\ndef step(ctx):\n    pass\n",
                    init="ic.add('a', uid=uid.float(), x=torch.zeros(n))"), 2, "uid must be a [n] int64 tensor"),
    Case("model-not-a-model", "model definition", "module:ATTR that is not a Model",
         model_case("m_attr", "", attr="not_a_model"), 2, "'m_attr:not_a_model' is not an agentsim Model (got int)"),
    Case("model-missing-module", "model definition", "module:ATTR whose module does not exist",
         args(*RUN, "no_such_module_here:model"), 2, "no_such_module_here"),
    # ---------------------------------------------------------------- NaN and inf in the state
    Case("state-nan", "agent state", "a substep writes NaN",
         model_case("m_nan", """
             @model.substep(writes=["a.x"])
             def grow(ctx):
                 a = ctx["a"]
                 a["x"] = torch.where(a["uid"] == 3, float("nan"), a["x"])
         """), 1, "step 1: grow: NaN in a.x"),
    Case("state-inf", "agent state", "a substep writes inf",
         model_case("m_inf", """
             @model.substep(reads=["a.x"], writes=["a.y"])
             def divide(ctx):
                 a = ctx["a"]
                 a["y"] = a["x"] / (a["uid"] - 4).float().clamp(min=0)
         """), 1, "step 1: divide: inf in a.y"),
    # ---------------------------------------------------------------- edge-list CSVs
    Case("edges-bad-row", "edge list", "a row that is not two integers", edges("0,1\n1,two\n"), 2,
         "line 2: expected two integer columns 'source,target' (got '1,two')"),
    Case("edges-missing-column", "edge list", "a row with one column", edges("0,1\n2\n"), 2,
         "line 2: expected two integer columns"),
    Case("edges-nan", "edge list", "a NaN id", edges("0,1\n1,nan\n"), 2, "(got '1,nan')"),
    Case("edges-negative", "edge list", "a negative id", edges("0,1\n-1,2\n"), 2, "line 2: expected node ids >= 0"),
    Case("edges-out-of-range", "edge list", "an id >= the number of agents", edges("0,1\n1,9\n"), 2,
         "line 2: expected node ids < n_nodes = 6 (got '1,9')"),
    Case("edges-self-loop", "edge list", "a self-loop", edges("0,1\n2,2\n"), 2, "line 2: a self-loop ('2,2')"),
    Case("edges-duplicate", "edge list", "an edge listed twice", edges("source,target\n0,1\n1,2\n0,1\n"), 2,
         "line 4: the edge '0,1' repeats line 2"),
    Case("edges-missing-file", "edge list", "an edge list that does not exist",
         args(*RUN, "sir", "--agents", "6", "--set", "network=csv", "--set", "edges_csv=DIR/none.csv"), 1,
         "Cannot read edge list 'DIR/none.csv': no such file"),
    Case("edges-no-path", "edge list", "network=csv without edges_csv", args(*RUN, "sir", "--set", "network=csv"), 2,
         "network = csv needs edges_csv=PATH"),
    # ---------------------------------------------------------------- trajectory files
    Case("h5-missing", "trajectory file", "a file that does not exist", args("inspect", "DIR/none.h5"), 1,
         "cannot read trajectory 'DIR/none.h5': no such file"),
    Case("h5-not-hdf5", "trajectory file", "a file that is not HDF5", with_file("x.h5", "hello", "inspect", "DIR/x.h5"),
         1, "cannot read trajectory 'DIR/x.h5': not an HDF5 file"),
    Case("h5-truncated", "trajectory file", "a file cut short (half of it copied)", truncated, 1,
         "the file is truncated"),
    Case("h5-foreign", "trajectory file", "an HDF5 file of another program", foreign_hdf5, 1,
         "'DIR/other.h5' is not an agentsim trajectory"),
    Case("h5-being-written", "trajectory file", "a file another process is still writing", being_written, 1,
         "it is open for writing in another process"),
    # ---------------------------------------------------------------- checkpoints
    Case("ckpt-missing", "checkpoint", "--resume of a directory that does not exist",
         args(*RUN, "boids", "--resume", "DIR/none"), 2, "no checkpoint at DIR/none"),
    Case("ckpt-empty", "checkpoint", "--resume of a directory without checkpoints",
         with_file("x.txt", "", *RUN, "boids", "--resume", "DIR"), 2, "no complete checkpoint in DIR"),
    Case("ckpt-unfinished", "checkpoint", "a checkpoint whose manifest was never written", unfinished, 2,
         "no complete checkpoint in DIR/ck (1 unfinished: no manifest.json)"),
    Case("ckpt-corrupt", "checkpoint", "a shard with a flipped byte", corrupt_shard, 2,
         "rank-00000-of-00001.pt does not match its checksum"),
    Case("ckpt-garbled-manifest", "checkpoint", "a manifest that is not JSON", garbled_manifest, 2,
         "unreadable manifest.json"),
    Case("ckpt-newer-format", "checkpoint", "a checkpoint of a newer format",
         edit_manifest(lambda m: m.update(format=99), "boids", "--agents", "40", "--steps", "4"), 2,
         "has format 99; this agentsim"),
    Case("ckpt-other-model", "checkpoint", "a checkpoint of another model",
         resume_as("wolfsheep", "--agents", "40", "--steps", "4"), 2, "is of model 'boids', not 'wolfsheep'"),
    Case("ckpt-other-params", "checkpoint", "a checkpoint saved with other parameters",
         resume_as("boids", "--agents", "40", "--steps", "4", "--set", "vision=5"), 2,
         "was saved with other parameters (vision: saved 10.0, now 5.0)"),
    Case("ckpt-other-seed", "checkpoint", "a checkpoint saved with another seed",
         resume_as("boids", "--agents", "40", "--steps", "4", "--seed", "7"), 2, "was saved with seed 0, not 7"),
    Case("ckpt-past-steps", "checkpoint", "--resume past the run's --steps",
         resume_as("boids", "--agents", "40", "--steps", "1"), 2, "the checkpoint is at step 2, past --steps 1"),
    # ---------------------------------------------------------------- user model references, calibration
    Case("model-missing-attr", "model definition", "module:ATTR whose attribute does not exist",
         model_case("m_noattr", "", attr="modle"), 2,
         "module 'm_noattr' (DIR/m_noattr.py) has no attribute 'modle' (Models there: model). Perhaps you meant "
         "'model'?"),
    Case("model-missing-file", "model definition", "file.py:ATTR whose file does not exist",
         args(*RUN, "DIR/none.py:model"), 2, "cannot read model file 'DIR/none.py': no such file"),
    Case("calibrate-unknown-metric", "command line", "calibrate --metric that is not a metric of the model",
         with_file("d.csv", "day,in_bed\n1,3\n2,8\n", "calibrate", "flu", "--data", "DIR/d.csv", "--column",
                   "in_bed", "--metric", "infected", "--fit", "beta", "--quiet"), 2,
         "metric: model 'flu' has no metric 'infected' (metrics: S, I, R)"),
]


# A grid model module: population 'a' (cell, w int64) on an 8 x 8 grid, env layer 'food' (int64).
GRID_MODEL = """
import torch
import agentsim as asim

model = asim.Model("badgrid")

{body}

@model.init
def init(ic):
    n = ic.n_agents
    uid = ic.uids("a", n)
    {init}
    return asim.Grid((8, 8), periodic={periodic})
"""
GRID_INIT = ("ic.add('a', uid=uid, cell=(uid * 3) % 64, w=torch.zeros(n, dtype=torch.int64)); "
             "ic.add_env(food=torch.ones(8, 8, dtype=torch.int64))")
WALK = """
@model.substep(writes=["a.cell"])
def walk(ctx):
    a = ctx["a"]
    choices = ctx.space.neighbor_cells(a["cell"], "moore", 1)
    a["cell"] = choices.gather(1, ctx.rng.integers(a["uid"], high=8)[:, None])[:, 0]
"""


def grid_case(name: str, body: str, init: str = GRID_INIT, periodic: bool = True, extra: tuple[str, ...] = (),
              agents: str = "20", walk: bool = False) -> Callable:
    def setup(d: Path) -> list[str]:
        code = (textwrap.dedent(WALK) if walk else "") + textwrap.dedent(body)
        (d / f"{name}.py").write_text(GRID_MODEL.format(body=code, init=init, periodic=periodic))
        sys.path.insert(0, str(d))
        return [*RUN, "--agents", agents, f"{name}:model", *extra]
    return setup


def config_check(d: Path) -> list[str]:
    (d / "c.toml").write_text('model = "randomwalk"\ncheck = "yes"\n')
    return [*RUN, "--config", str(d / "c.toml")]


CASES += [
    # ---------------------------------------------------------------- env layers (agentsim.core.env)
    Case("env-combine-not-written", "model definition", "combine names a layer the substep does not write",
         grid_case("g_cnw", """
         @model.substep(reads=["a.cell"], writes=["a.w"], combine={"env.food": "add"})
         def step(ctx): pass
         """), 2, "combine names 'env.food', which is not an env layer it writes"),
    Case("env-combine-unknown", "model definition", "a combine that does not exist",
         grid_case("g_cu", """
         @model.substep(reads=["a.cell"], writes=["env.food"], combine={"env.food": "sum"})
         def step(ctx): pass
         """), 2, "combine for env.food: expected one of set, add, min, max (got 'sum')"),
    Case("env-add-float", "model definition", "a float layer with combine 'add' written directly",
         grid_case("g_af", """
         @model.substep(reads=["a.cell"], writes=["env.heat"], combine={"env.heat": "add"})
         def step(ctx): ctx.env["heat"] = ctx.env["heat"] + 1.0
         """, init=GRID_INIT + "; ic.add_env(heat=torch.zeros(8, 8))"), 1,
         "substep 'step' writes env.heat directly: a float layer that combines by 'add' changes only through "
         "ctx.deposit('env.heat', cells, amounts)"),
    Case("env-deposit-outside", "agent state", "a deposit into a cell outside a float layer",
         grid_case("g_do", """
         @model.substep(reads=["a.cell"], writes=["env.heat"], combine={"env.heat": "add"})
         def step(ctx): ctx.deposit("heat", ctx["a"]["cell"] + 64, torch.ones(ctx["a"].n))
         """, init=GRID_INIT + "; ic.add_env(heat=torch.zeros(8, 8))"), 1,
         "step 1: substep 'step': ctx.deposit into env.heat: a cell outside the layer's 64 cells"),
    Case("env-set-conflict", "agent state", "processes that set one cell to different values (--nprocs 2)",
         grid_case("g_sc", """
         @model.substep(reads=["a.cell"], writes=["env.food"])
         def count(ctx):
             ctx.env["food"] = ctx.space.occupancy(ctx["a"]["cell"]).reshape(8, 8)
         """, init=GRID_INIT.replace("(uid * 3) % 64", "uid * 0"), agents="5", extra=("--nprocs", "2")), 1,
         "count: env.food: cell 0 (row 0, column 0) was set to different values on different processes"),
    Case("env-set-conflict-float", "agent state", "agents on two processes eat one cell of a float layer (--nprocs 2)",
         grid_case("g_scf", """
         @model.substep(reads=["a.cell"], writes=["env.heat"])
         def eat(ctx):
             heat = ctx.env["heat"].reshape(-1).clone()
             heat.index_add_(0, ctx["a"]["cell"], torch.full((ctx["a"].n,), -0.25))
             ctx.env["heat"] = heat.reshape(8, 8)
         """, init=GRID_INIT.replace("(uid * 3) % 64", "uid * 0") + "; ic.add_env(heat=torch.ones(8, 8))",
                   agents="5", extra=("--nprocs", "2")), 1,
         "was set to different values on different processes: agents on several processes change the same cell. "
         "For amounts that add up (deposits, consumption) declare combine={'env.heat': 'add'} and add them with "
         "ctx.deposit('env.heat', cells, amounts)"),
    Case("env-min-raised", "agent state", "a substep that raises a cell of a 'min' layer (--nprocs 2)",
         grid_case("g_mr", """
         @model.substep(reads=["a.cell"], writes=["env.food"], combine={"env.food": "min"})
         def lift(ctx):
             food = ctx.env["food"].reshape(-1).clone()
             food[ctx["a"]["cell"]] += 1
             ctx.env["food"] = food.reshape(8, 8)
         """, extra=("--nprocs", "2")), 1, "lift: env.food combines by 'min' but cell 0 (row 0, column 0) was raised"),
    Case("env-write-shape", "model definition", "an env layer written with another shape",
         grid_case("g_ws", """
         @model.substep(reads=["a.cell"], writes=["env.food"])
         def step(ctx):
             ctx.env["food"] = torch.zeros(3, dtype=torch.int64)
         """), 1, "env.food: expected shape [8, 8] (got [3])"),
    Case("env-write-not-tensor", "model definition", "an env layer written with a number",
         grid_case("g_wn", """
         @model.substep(reads=["a.cell"], writes=["env.food"])
         def step(ctx):
             ctx.env["food"] = 3
         """), 1, "env.food: expected a tensor (got int)"),
    Case("env-added-twice", "model definition", "init adds an env layer twice",
         grid_case("g_at", WALK, init=GRID_INIT + "; ic.add_env(food=torch.ones(8, 8))"), 2,
         "environment layer 'food' was already added"),
    # ---------------------------------------------------------------- the state, checked in every run
    Case("state-duplicate-uid", "model definition", "init adds two agents with one uid",
         grid_case("g_du", WALK, init=GRID_INIT.replace("uid=uid,", "uid=uid % 7,")), 2,
         "add('a'): uid 0 appears more than once"),
    Case("state-cell-outside", "model definition", "init puts agents on cells outside the grid",
         grid_case("g_co", WALK, init=GRID_INIT.replace("(uid * 3) % 64", "uid + 60")), 2,
         "init: population 'a' has agents on cell 64, outside the 8 x 8 grid (valid cells: 0 to 63)"),
    Case("state-cell-off-grid", "agent state", "a substep moves agents off a bounded grid",
         grid_case("g_og", """
         @model.substep(writes=["a.cell"])
         def fall(ctx):
             ctx["a"]["cell"] = ctx.space.neighbor_cells(ctx["a"]["cell"], "von_neumann", 1)[:, 0]
         """, periodic=False), 1, "step 1: fall: a.cell holds a cell outside the 8 x 8 grid"),
    Case("state-float-narrowed", "model definition", "a float64 value written into a float32 field",
         model_case("m_fn", """
         @model.substep(writes=["a.x"])
         def grow(ctx):
             ctx["a"]["x"] = ctx["a"]["x"].double() * 1.5
         """), 1, "a.x: expected dtype torch.float32 (got torch.float64); writing it would round or wrap"),
    Case("state-int-narrowed", "model definition", "an int64 value written into an int32 field",
         model_case("m_in", """
         @model.substep(writes=["a.k"])
         def count(ctx):
             ctx["a"]["k"] = ctx["a"]["k"].to(torch.int64) + 1
         """), 1, "a.k: expected dtype torch.int32 (got torch.int64)"),
    Case("state-float-into-int", "model definition", "a float value written into an int field",
         model_case("m_fi", """
         @model.substep(reads=["a.x"], writes=["a.k"])
         def count(ctx):
             ctx["a"]["k"] = ctx["a"]["x"]
         """), 1, "a.k: expected dtype torch.int32 (got torch.float32); convert explicitly"),
    Case("state-write-shape", "model definition", "a field written with the wrong number of rows",
         model_case("m_wsh", """
         @model.substep(writes=["a.x"])
         def step(ctx):
             ctx["a"]["x"] = torch.zeros(3)
         """), 1, "a.x: expected shape [20] (got [3])"),
    Case("state-write-uid", "model definition", "a substep writes uid",
         model_case("m_wu", """
         @model.substep(writes=["a.uid"])
         def step(ctx):
             ctx["a"]["uid"] = ctx["a"]["uid"] + 1
         """), 1, "uid is assigned by the engine and cannot be written"),
    Case("metric-population-count", "model definition", "a metric named n_<population>",
         model_case("m_np", """
         @model.substep(writes=["a.x"])
         def step(ctx):
             ctx["a"]["x"] = ctx["a"]["x"] + 1

         @model.metric(name="n_a")
         def count(state):
             return state["a"]["x"]
         """), 2, "metric 'n_a' has the name of the built-in count of population 'a'"),
    Case("metric-hist-edges", "model definition", "histogram edges that do not increase",
         model_case("m_he", """
         @model.substep(writes=["a.x"])
         def step(ctx):
             ctx["a"]["x"] = ctx["a"]["x"] + 1

         @model.metric(hist=[0, 5, 5])
         def spread(state):
             return state["a"]["x"]
         """), 2, "expected strictly increasing bin edges"),
    Case("metric-hist-mean", "model definition", "a histogram metric with reduce='mean'",
         model_case("m_hm", """
         @model.substep(writes=["a.x"])
         def step(ctx):
             ctx["a"]["x"] = ctx["a"]["x"] + 1

         @model.metric(hist=[0, 5, 10], reduce="mean")
         def spread(state):
             return state["a"]["x"]
         """), 2, "metric 'spread': hist counts values per bin, it has no reduce='mean'"),
    Case("metric-3d", "model definition", "a metric that returns [n, K, L] values",
         model_case("m_3d", """
         @model.substep(writes=["a.x"])
         def step(ctx):
             ctx["a"]["x"] = ctx["a"]["x"] + 1

         @model.metric()
         def cube(state):
             return state["a"]["x"][:, None, None].expand(-1, 2, 2)
         """), 2, "metric 'cube': expected per-agent values [n] or rows [n, K]"),
    # ---------------------------------------------------------------- model declarations
    Case("model-no-init", "model definition", "a model without init",
         model_case("m_ni", """
         bare = asim.Model("bare")

         @bare.substep(writes=["a.x"])
         def step(ctx): pass
         """, attr="bare"), 2, "model 'bare' has no init: declare one with @model.init"),
    Case("model-no-substep", "model definition", "a model without substeps", model_case("m_ns", ""), 2,
         "model 'bad' has no substep: declare one with @model.substep(...)"),
    Case("model-substep-twice", "model definition", "two substeps with one name",
         model_case("m_st", """
         @model.substep(writes=["a.x"])
         def step(ctx): pass

         @model.substep(writes=["a.y"], name="step")
         def other(ctx): pass
         """), 2, "substep 'step' is already defined"),
    Case("model-metric-twice", "model definition", "two metrics with one name",
         model_case("m_mt", """
         @model.substep(writes=["a.x"])
         def step(ctx): pass

         @model.metric(name="m")
         def m1(state):
             return state["a"]["x"]

         @model.metric(name="m")
         def m2(state):
             return state["a"]["x"]
         """), 2, "metric 'm' is already defined"),
    Case("model-init-tuple", "model definition", "init returns (state, space)",
         model_case("m_it", """
         other = asim.Model("other")

         @other.substep(writes=["a.x"])
         def step(ctx): pass

         @other.init
         def other_init(ic):
             ic.add("a", uid=ic.uids("a", 2), x=torch.zeros(2))
             return ic.state(), asim.Box((1.0, 1.0))
         """, attr="other"), 2, "init returns the space (got a tuple"),
    Case("model-population-twice", "model definition", "init adds a population twice",
         model_case("m_pt", """
         @model.substep(writes=["a.x"])
         def step(ctx): pass
         """, init=INIT + "; ic.add('a', uid=uid, x=torch.zeros(n))"), 2, "population 'a' was already added"),
    Case("model-kill-mask", "model definition", "ctx.kill with a mask of the wrong shape",
         model_case("m_km", """
         @model.substep(reads=["a.x"], deaths=["a"])
         def cull(ctx):
             ctx.kill("a", torch.ones(3, dtype=torch.bool))
         """), 1, "kill('a'): expected a bool mask of shape [20] (got torch.bool [3])"),
    Case("model-kill-undeclared", "model definition", "ctx.kill without declaring deaths",
         model_case("m_ku", """
         @model.substep(reads=["a.x"])
         def cull(ctx):
             ctx.kill("a", ctx["a"]["x"] > 100)
         """), 1, "kills in 'a' but declares deaths=[]"),
    Case("model-neighbors-undeclared", "model definition", "ctx.neighbors without declaring neighbors",
         model_case("m_nu", """
         @model.substep(reads=["a.x"], writes=["a.y"])
         def look(ctx):
             ctx.neighbors("a")
         """), 1, "asks for neighbors of 'a' but declares neighbors={}"),
    Case("model-agentwise-births", "model definition", "an agentwise substep that spawns",
         model_case("m_ab", """
         @model.substep(writes=["a.x"], births=["a"], agentwise=True)
         def grow(ctx): pass
         """), 2, "agentwise=True needs writes of one population only and no env writes, births or deaths"),
    Case("model-reach-negative", "model definition", "a negative reach",
         model_case("m_rn", """
         @model.substep(writes=["a.x"], neighbors={"a": ["pos"]}, reach=-1.0)
         def look(ctx): pass
         """), 2, "reach: expected a length >= 0 (got -1.0)"),
    Case("model-reach-scaled", "model definition", "a reach 2*PARAM naming no parameter",
         model_case("m_rs", """
         @model.substep(writes=["a.x"], neighbors={"a": ["pos"]}, reach="2*visoin")
         def look(ctx): pass
         """), 2, "reach '2*visoin' is not a parameter"),
    # ---------------------------------------------------------------- the check mode (agentsim.engine.contract)
    Case("check-reach-short", "check mode", "--check: a substep reads agents beyond its declared reach",
         grid_case("g_rs", """
         @model.substep(reads=["a.cell"], writes=["a.w"], neighbors={"a": ["cell"]}, reach="moore:1")
         def crowding(ctx):
             nb, grid = ctx.neighbors("a"), ctx.space
             near = grid.neighbor_sum(grid.occupancy(nb["cell"]).reshape(8, 8), "moore", 3).reshape(-1)
             ctx["a"]["w"] = ctx["a"]["w"] + near[ctx["a"]["cell"]]
         """, extra=("--check",), walk=True), 1, "the substep reads agents beyond its declared reach"),
    Case("check-local-sum", "check mode", "--check: a sum over this process's rows",
         grid_case("g_ls", """
         @model.substep(reads=["a.cell"], writes=["a.w"])
         def tax(ctx):
             ctx["a"]["w"] = ctx["a"]["w"] + ctx["a"]["cell"].sum()
         """, extra=("--check",)), 1,
         "changes when the agents are split over two processes: agents read other agents only through ctx.neighbors"),
    Case("check-row-order", "check mode", "--check: a result that depends on row order",
         grid_case("g_ro", """
         @model.substep(writes=["a.w"])
         def luck(ctx):
             ctx["a"]["w"] = ctx["a"]["w"] + torch.arange(ctx["a"].n) % 2
         """, extra=("--check",)), 1, "changes when its agents come in another row order"),
    Case("check-combine", "check mode", "--check: agents add to a layer declared 'set'",
         grid_case("g_cb", """
         @model.substep(reads=["a.cell"], writes=["env.food"])
         def trample(ctx):
             ctx.env["food"] = ctx.env["food"] + ctx.space.occupancy(ctx["a"]["cell"]).reshape(8, 8)
         """, extra=("--check",), walk=True), 1,
         "declare how writes to env.food combine: combine={'env.food': 'add'}"),
    Case("check-env-index", "check mode", "--check: env read at index -1",
         grid_case("g_ei", """
         @model.substep(reads=["a.cell", "env.food"], writes=["a.w"])
         def look_up(ctx):
             above = ctx.space.neighbor_cells(ctx["a"]["cell"], "von_neumann", 1)[:, 0]
             ctx["a"]["w"] = ctx["a"]["w"] + ctx.env["food"].reshape(-1)[above]
         """, periodic=False, extra=("--check",)), 1, "substep 'look_up': an env layer is indexed at -1"),
    Case("cli-check-world-sizes", "command line", "agentsim check --world-sizes that are not ints",
         args("check", "randomwalk", "--world-sizes", "1,x"), 2,
         "--world-sizes: expected comma-separated ints such as 1,2,3 (got '1,x')"),
    Case("cli-check-world-sizes-range", "command line", "agentsim check --world-sizes without 1 or above 4",
         args("check", "randomwalk", "--world-sizes", "2,8"), 2,
         "world_sizes: expected 1 and up to three more sizes of at most 4 (got [2, 8])"),
    Case("cli-check-partition", "command line", "agentsim check --partition spatial for a model without a space",
         args("check", "flu", "--agents", "50", "--partition", "spatial"), 2,
         "partition 'spatial' does not apply to model 'flu' (applies: data)"),
    Case("config-check-type", "config file", "check that is not true, false or a number of steps", config_check, 2,
         "check: expected True, False, or a number of steps K >= 1 (check every K-th step) (got 'yes')"),
    Case("cli-check-steps", "command line", "agentsim run --check 0",
         args("run", "sir", "--agents", "50", "--check", "0"), 2,
         "argument --check: expected a number of steps K >= 1 (got 0)"),
    Case("cli-check-before-model", "command line", "agentsim run --check MODEL (a bare --check before the model)",
         args("run", "--check", "sir", "--agents", "50"), 2,
         "argument --check: expected a number of steps K >= 1 (got 'sir'; a bare --check, which checks every "
         "step, goes after the model: agentsim run MODEL --check)"),
]

# Reliability cases (issue 33), one block per fault class; each block extends CASES.
# ---- cases: write failures
class _UnsetFault:
    """Undoes a case's write-fault hook (the test's cleanup calls kill() and wait() on WRITERS)."""

    def kill(self) -> None:
        import os

        os.environ.pop("AGENTSIM_TEST_WRITE_FAULT", None)

    def wait(self) -> None:
        pass


def write_fault(fault: str, setup: Callable[[Path], list[str]]) -> Callable[[Path], list[str]]:
    """``setup`` with writes failing as ``fault`` says (agentsim.io.faults; DIR: the case's directory)."""
    def with_fault(d: Path) -> list[str]:
        import os

        argv = setup(d)
        os.environ["AGENTSIM_TEST_WRITE_FAULT"] = fault.replace("DIR", str(d))
        WRITERS.append(_UnsetFault())
        return argv
    return with_fault


def truncated_plot(d: Path) -> list[str]:
    return ["plot", truncated(d)[1], "--out", str(d / "t.png")]


CASES += [
    Case("write-trajectory-full", "write failure", "the disk fills while the trajectory is written (injected)",
         write_fault("DIR/run.h5:close", args(*RUN, "randomwalk", "--agents", "20", "--out", "DIR/run.h5")), 1,
         "writing trajectory 'DIR/run.h5' failed: No space left on device"),
    Case("write-checkpoint-read-only", "write failure", "--checkpoint-dir on a read-only file system (injected)",
         write_fault("DIR/ck:1:EROFS", args(*RUN, "boids", "--agents", "40", "--steps", "2", "--checkpoint-every",
                                            "2", "--checkpoint-dir", "DIR/ck")), 1,
         "cannot create checkpoint directory 'DIR/ck/step-00000002': Read-only file system"),
    Case("write-plot-truncated", "write failure", "agentsim plot of a file cut short", truncated_plot, 1,
         "cannot plot 'DIR/run.h5': the file is truncated"),
    Case("write-study-full", "write failure", "the disk fills while a study run's group is written (injected)",
         write_fault("DIR/s.h5:8", args("sweep", "sir", "--grid", "beta=0.02,0.04", "--replicates", "1", "--agents",
                                        "100", "--steps", "5", "--out", "DIR/s.h5", "--workers", "1")), 1,
         "writing study file 'DIR/s.h5' failed (run c0000-r0000): No space left on device"),
]

# ---- cases: files from elsewhere never execute code
class _Payload:
    """Unpickled, it would create the file ``marker``."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def _reseal(manifest: dict) -> dict:
    from agentsim.io.checkpoint import manifest_checksum

    return {**manifest, "checksum": manifest_checksum({k: v for k, v in manifest.items() if k != "checksum"})}


def crafted_shard(d: Path) -> list[str]:
    import hashlib

    import torch

    step = checkpoint(d)
    shard = step / "rank-00000-of-00001.pt"
    torch.save({"boids": {"uid": _Payload(d / "MARKER")}}, shard)
    manifest = json.loads((step / "manifest.json").read_text())
    manifest["shards"][0]["sha256"] = hashlib.sha256(shard.read_bytes()).hexdigest()
    (step / "manifest.json").write_text(json.dumps(_reseal(manifest)))
    return [*RUN, "boids", "--agents", "40", "--steps", "4", "--resume", str(d / "ck")]


TRAIN = ["train", "spillover", "--agents", "300", "--updates", "3", "--horizon", "6", "--hidden", "16",
         "--minibatches", "2", "--epochs", "2", "--seed", "5", "--quiet"]


def training(change: Callable[[Path], None]) -> Callable[[Path], list[str]]:
    """A training checkpoint of update 1 of TRAIN in DIR/tck, changed, then ``agentsim train --resume``."""
    def setup(d: Path) -> list[str]:
        from agentsim.models.spillover import MODEL

        from agentsim.learn import PPOConfig, Trainer

        config = PPOConfig(horizon=6, hidden=(16,), minibatches=2, epochs=2)
        Trainer(MODEL, agents=300, seed=5, updates=3, config=config).train(1, checkpoint_dir=d / "tck")
        change(d / "tck")
        return [*TRAIN, "--checkpoint-dir", str(d / "tck"), "--resume"]
    return setup


def _flip(ck: Path) -> None:
    data = bytearray((ck / "ppo-000001.pt").read_bytes())
    data[len(data) // 2] ^= 0x01
    (ck / "ppo-000001.pt").write_bytes(bytes(data))


def _craft_training(ck: Path) -> None:
    import hashlib

    import torch

    torch.save({"format": "agentsim-ppo-checkpoint", "net": _Payload(ck / "MARKER")}, ck / "ppo-000001.pt")
    manifest = json.loads((ck / "ppo-000001.json").read_text())
    manifest["sha256"] = hashlib.sha256((ck / "ppo-000001.pt").read_bytes()).hexdigest()
    (ck / "ppo-000001.json").write_text(json.dumps(_reseal(manifest)))


CASES += [
    Case("untrusted-crafted-shard", "checkpoint", "a shard that is a pickle with a __reduce__ payload (checksums "
         "made to match)", crafted_shard, 2,
         "rank-00000-of-00001.pt holds objects other than tensors and plain data: refused, nothing in it was run"),
    Case("untrusted-manifest-step", "checkpoint", "a manifest whose step was edited",
         edit_manifest(lambda m: m.update(step=1), "boids", "--agents", "40", "--steps", "4"), 2,
         "manifest.json does not match its checksum"),
    Case("untrusted-manifest-key", "checkpoint", "a manifest missing a key",
         edit_manifest(lambda m: m.pop("seed"), "boids", "--agents", "40", "--steps", "4"), 2,
         "manifest.json has no key 'seed'"),
    Case("untrusted-train-pointer", "training checkpoint", "'latest' naming a file outside its directory",
         training(lambda ck: (ck / "latest").write_text("../elsewhere.json")), 2,
         "names '../elsewhere.json', not a file in DIR/tck"),
    Case("untrusted-train-flipped", "training checkpoint", "a state file with a flipped bit", training(_flip), 2,
         "checkpoint 'DIR/tck/ppo-000001.pt' does not match its checksum"),
    Case("untrusted-train-crafted", "training checkpoint", "a state file that is a pickle with a __reduce__ payload "
         "(checksums made to match)", training(_craft_training), 2,
         "checkpoint 'DIR/tck/ppo-000001.pt' holds objects other than tensors and plain data"),
]

# ---- cases: killed parents, locks and resumes
def locked_by_another(target: str, kind: str, *run: str) -> Callable[[Path], list[str]]:
    """Another running process holds the lock of DIR/target (a file, or a checkpoint directory)."""
    import os
    import subprocess

    def setup(d: Path) -> list[str]:
        code = ("import sys, time; from agentsim.io.locks import lock_run; "
                "lock_run(sys.argv[1]) if sys.argv[2] == 'file' else lock_run(None, sys.argv[1]); "
                "print('ready', flush=True); time.sleep(60)")
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[1]),
                                                            os.environ.get("PYTHONPATH", "")])}
        proc = subprocess.Popen([sys.executable, "-c", code, str(d / target), kind], stdout=subprocess.PIPE,
                                text=True, env=env)
        WRITERS.append(proc)
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        return [a.replace("DIR", str(d)) for a in run]
    return setup


CASES += [
    Case("resume-other-agents", "checkpoint", "--resume with another --agents than the run that saved it",
         resume_as("boids", "--agents", "50", "--steps", "4"), 2, "step-00000002 was saved with agents 40, not 50"),
    Case("resume-two-differences", "checkpoint", "--resume with another --agents and --seed",
         resume_as("boids", "--agents", "50", "--steps", "4", "--seed", "3"), 2,
         "was saved with seed 0, not 3; agents 40, not 50 (a resume continues the run that saved the checkpoint"),
    Case("resume-older-manifest", "checkpoint", "--resume of a checkpoint whose manifest does not record its run",
         edit_manifest(lambda m: m.pop("run"), "boids", "--agents", "40", "--steps", "4", reseal=True), 2,
         "is of an older format: its manifest does not record the run that saved it"),
    Case("out-locked", "trajectory file", "--out that another running process is writing",
         locked_by_another("run.h5", "file", *RUN, "boids", "--agents", "40", "--out", "DIR/run.h5"), 1,
         "trajectory file 'DIR/run.h5' is being written by another run: pid"),
    Case("ckpt-dir-locked", "checkpoint", "--checkpoint-dir that another running process is writing",
         locked_by_another("ck", "dir", *RUN, "boids", "--agents", "40", "--checkpoint-every", "1",
                           "--checkpoint-dir", "DIR/ck"), 1,
         "checkpoint directory 'DIR/ck' is being written by another run: pid"),
]

# ---- cases: hangs, leaks and memory
def _closed_port() -> int:
    """A port on 127.0.0.1 that nobody listens on (bound for a moment, never listened on)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def ray_at(host: str) -> Callable[[Path], list[str]]:
    def setup(d: Path) -> list[str]:
        address = f"127.0.0.1:{_closed_port()}" if host == "closed" else host
        return ["sweep", "randomwalk", "--grid", "step_size=1", "--seeds", "1", "--agents", "10", "--steps", "2",
                "--out", str(d / "study.h5"), "--executor", "ray", "--address", address, "--connect-timeout", "2",
                "--quiet"]
    return setup


class _Environ:
    """Environment variables for one case, put back by the cleanup of WRITERS (kill, wait)."""

    def __init__(self, values: dict[str, str]) -> None:
        import os

        self.old = {k: os.environ.get(k) for k in values}
        os.environ.update(values)

    def kill(self) -> None:
        import os

        for k, v in self.old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v

    def wait(self) -> None:
        pass


def rendezvous_nobody(d: Path) -> list[str]:
    WRITERS.append(_Environ({"WORLD_SIZE": "2", "RANK": "1", "MASTER_ADDR": "127.0.0.1",
                             "MASTER_PORT": str(_closed_port())}))
    return [*RUN, "randomwalk", "--timeout", "2"]


CASES += [
    Case("memory-too-many-agents", "command line", "--agents 10000000000: more than this machine's memory",
         args(*RUN, "sir", "--agents", "10000000000"), 2,
         "--agents 10000000000 needs about"),
    Case("ray-closed-port", "network", "--executor ray --address 127.0.0.1:PORT with nobody listening",
         ray_at("closed"), 1, "nothing accepted a connection within 2 s (last attempt: Connection refused)"),
    Case("ray-unknown-host", "network", "--executor ray --address on a host name that does not resolve",
         ray_at("no-such-host.invalid:6379"), 1,
         "ray: cluster address 'no-such-host.invalid:6379': cannot resolve host name 'no-such-host.invalid'"),
    Case("rendezvous-nobody", "network", "torchrun environment (MASTER_ADDR:MASTER_PORT) with no master listening",
         rendezvous_nobody, 1, "(MASTER_ADDR:MASTER_PORT), rank 1 of 2: nothing accepted a connection within 2 s"),
]

def _run(case: Case, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    argv = case.setup(tmp_path)
    capsys.readouterr()
    try:
        code = main(argv)
    except SystemExit as e:  # argparse's own errors
        code = e.code if isinstance(e.code, int) else 2
    return code, capsys.readouterr().err


@pytest.mark.timeout(120)
@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_gets_a_clear_message_and_a_non_zero_exit(case, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(sys, "path", list(sys.path))
    try:
        code, err = _run(case, tmp_path, capsys)
    finally:
        for proc in WRITERS:
            proc.kill()
            proc.wait()
        WRITERS.clear()
    assert "Traceback" not in err, err
    line = next((s for s in err.splitlines() if s.startswith(("agentsim: error:", "usage:", "agentsim run: error:"))
                 or "error:" in s), "")
    assert code == case.code, (code, err)
    assert case.excerpt.replace("DIR", str(tmp_path)) in err, err
    assert line, err


def test_there_are_at_least_100_distinct_cases():
    assert len({c.id for c in CASES}) == len(CASES) >= 100
    assert len({c.excerpt for c in CASES}) >= 100


def markdown() -> str:
    rows = ["| # | case | input | exit | message (excerpt) |", "| --- | --- | --- | --- | --- |"]
    for k, c in enumerate(CASES, 1):
        excerpt = c.excerpt.replace("|", "\\|")
        rows.append(f"| {k} | `{c.id}` | {c.group}: {c.what} | {c.code} | `{excerpt}` |")
    return "\n".join(rows) + "\n"


def test_the_docs_table_lists_every_case():
    text = DOC.read_text()
    table = text[text.index("| # | case |"):]
    table = table[:table.index("\n\n") + 1] if "\n\n" in table else table
    assert table == markdown(), "docs/reference/errors.md is out of date: python tests/test_bad_input.py --write"


if __name__ == "__main__":
    if "--write" in sys.argv:
        text = DOC.read_text()
        start = text.index("| # | case |")
        end = text.index("\n\n", start) + 1
        DOC.write_text(text[:start] + markdown() + text[end:])
    else:
        print(markdown(), end="")
