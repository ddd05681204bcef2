"""The agentsim command: main job, models listing, config files and error exits."""

import subprocess
import sys

import h5py
import numpy as np
import pytest
import torch

from agentsim import Simulation, get_model
from agentsim.cli.main import main
from agentsim.core.catalog import BUILTIN
from agentsim.io.hdf5 import read_trajectory


def run_cli(*args):
    """Run the real console entry point in a subprocess; return (code, stdout, stderr)."""
    proc = subprocess.run([sys.executable, "-m", "agentsim", *args], capture_output=True, text=True, timeout=240)
    return proc.returncode, proc.stdout, proc.stderr


def test_run_sir_writes_epidemic_curve(tmp_path):
    out = tmp_path / "sir.h5"
    code, stdout, stderr = run_cli("run", "sir", "--agents", "20000", "--steps", "40", "--out", str(out))
    assert code == 0, stderr
    assert "wrote" in stdout and "infect" in stdout  # summary and plan with timings
    with h5py.File(out) as f:
        assert f.attrs["model"].decode() == "sir" and bool(f.attrs["completed"])
        s, i, r = (f["metrics"][k][:] for k in ("S", "I", "R"))
        assert len(s) == 41 and np.all(s + i + r == 20000)
        assert list(f["agents/person/step"][:]) == [0, 40]
        assert "perf" in f
    traj = read_trajectory(out)
    assert traj.metrics["I"].max() > 100


@pytest.mark.parametrize("model", ["sir", "boids", "schelling", "wolfsheep", "randomwalk"])
def test_every_model_runs_from_cli_at_10k(model, tmp_path):
    out = tmp_path / f"{model}.h5"
    assert main(["run", model, "--agents", "10000", "--steps", "3", "--out", str(out), "--quiet"]) == 0
    traj = read_trajectory(out)
    assert traj.attrs["completed"] and len(traj.metrics["step"]) == 4


def test_record_every_and_fields(tmp_path):
    out = tmp_path / "w.h5"
    assert main(["run", "wolfsheep", "--steps", "6", "--every", "2", "--record", "sheep.energy,env.grass",
                 "--out", str(out), "--quiet"]) == 0
    traj = read_trajectory(out)
    assert list(traj.steps("sheep")) == [0, 2, 4, 6]
    assert traj.fields("sheep") == ["uid", "energy"] and traj.populations == ["sheep"]
    assert traj.env("grass", step=6).shape == (20, 20)


def test_set_and_config_file(tmp_path):
    cfg = tmp_path / "run.toml"
    cfg.write_text('model = "sir"\nagents = 3000\nsteps = 5\nseed = 4\nsubsteps = ["infect", "recover"]\n'
                   '[params]\nbeta = 0.2\n')
    out = tmp_path / "a.h5"
    assert main(["run", "--config", str(cfg), "--set", "gamma=0.5", "--out", str(out), "--quiet"]) == 0
    traj = read_trajectory(out)
    assert traj.attrs["params"]["beta"] == 0.2 and traj.attrs["params"]["gamma"] == 0.5
    assert traj.attrs["seed"] == 4 and len(traj.metrics["step"]) == 6
    ycfg = tmp_path / "run.yaml"
    ycfg.write_text("model: randomwalk\nagents: 100\nsteps: 2\nparams:\n  step_size: 0.5\n")
    assert main(["run", "--config", str(ycfg), "--quiet"]) == 0


def test_models_lists_parameters(capsys):
    assert main(["models"]) == 0
    text = capsys.readouterr().out
    for name in ("sir", "boids", "schelling", "wolfsheep", "randomwalk", "beta", "0.03", "vision"):
        assert name in text


@pytest.mark.parametrize("args, message", [
    (["run", "sri"], "unknown model 'sri'.*Perhaps you meant 'sir'"),
    (["run", "sir", "--set", "betta=0.1"], "unknown parameter 'betta'.*Perhaps you meant 'beta'"),
    (["run", "sir", "--set", "beta=high"], "parameter 'beta': expected a float"),
    (["run", "sir", "--set", "beta"], "expected NAME=VALUE"),
    (["run", "sir", "--agents", "0"], "agents: expected a positive int"),
    (["run", "sir", "--agents", "-5"], "agents: expected a positive int"),
    (["run", "sir", "--steps", "-1"], "steps: expected an int >= 0"),
    (["run", "sir", "--record", "person.colour", "--steps", "1", "--agents", "100"], "unknown field 'person.colour'"),
    (["run", "sir", "--device", "tpu"], "unknown device"),
])
def test_config_errors_exit_2_with_message(args, message, capsys):
    assert main(args) == 2
    import re
    assert re.search(message, capsys.readouterr().err)


def test_unwritable_output_exits_1(tmp_path, capsys):
    code = main(["run", "sir", "--agents", "100", "--steps", "1", "--out", str(tmp_path / "no" / "such" / "x.h5")])
    assert code == 1
    assert "x.h5" in capsys.readouterr().err


def test_malformed_and_unknown_config(tmp_path, capsys):
    bad = tmp_path / "bad.toml"
    bad.write_text("model = \n")
    assert main(["run", "--config", str(bad)]) == 2
    assert "malformed TOML" in capsys.readouterr().err
    typo = tmp_path / "typo.toml"
    typo.write_text('model = "sir"\nagnets = 10\n')
    assert main(["run", "--config", str(typo)]) == 2
    err = capsys.readouterr().err
    assert "unknown key 'agnets'" in err and "Perhaps you meant 'agents'" in err
    assert main(["run", "--config", str(tmp_path / "missing.toml")]) == 1
    wrong = tmp_path / "c.ini"
    wrong.write_text("x")
    assert main(["run", "--config", str(wrong)]) == 2


def test_wrong_type_from_argparse_exits_nonzero():
    code, _, err = run_cli("run", "sir", "--agents", "many")
    assert code == 2 and "invalid int value" in err


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("model", list(BUILTIN))
def test_cuda_run_matches_cpu(model):
    """The same bits on both devices, and on the GPU from run to run: draws, integer and float
    fields, metrics (continuous neighbor sums through the fused kernel, in canonical order)."""
    cpu_sim = Simulation(get_model(model), agents=2000, seed=1)
    gpu_sim = Simulation(get_model(model), agents=2000, seed=1, device="cuda")
    again = Simulation(get_model(model), agents=2000, seed=1, device="cuda")
    cpu, gpu, gpu2 = cpu_sim.run(5).metrics, gpu_sim.run(5).metrics, again.run(5).metrics
    assert gpu_sim.state[next(iter(gpu_sim.state.populations))]["uid"].device.type == "cuda"

    def same(a: np.ndarray, b: np.ndarray, what: str) -> None:
        assert a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes(), what

    assert sorted(cpu) == sorted(gpu)
    for k in cpu:
        same(cpu[k], gpu[k], f"metric {k}")
        same(gpu[k], gpu2[k], f"metric {k} (GPU run to run)")
    for name, pop in cpu_sim.state.populations.items():
        other, other2 = gpu_sim.state[name], again.state[name]
        a_order, b_order = torch.argsort(pop["uid"]), torch.argsort(other["uid"].cpu())
        c_order = torch.argsort(other2["uid"].cpu())
        for field in pop.keys():
            same(pop[field][a_order].numpy(), other[field].cpu()[b_order].numpy(), f"{name}.{field}")
            same(other[field].cpu()[b_order].numpy(), other2[field].cpu()[c_order].numpy(), f"{name}.{field} (GPU)")
    assert main(["run", model, "--agents", "2000", "--steps", "3", "--device", "cuda", "--quiet"]) == 0


def test_sync_every_runs_stale_and_is_refused_with_the_spatial_partition(tmp_path, capsys):
    out = tmp_path / "stale.h5"
    assert main(["run", "boids", "--agents", "300", "--steps", "4", "--sync-every", "2", "--seed", "2",
                 "--out", str(out), "--quiet"]) == 0
    ref = Simulation(get_model("boids"), agents=300, seed=2, sync_every=2).run(4).metrics
    assert np.array_equal(read_trajectory(out).metrics["polarization"], ref["polarization"])
    assert main(["run", "boids", "--agents", "300", "--steps", "2", "--nprocs", "2", "--partition", "spatial",
                 "--sync-every", "2", "--quiet"]) == 2
    assert "sync_every=2 needs partition 'data'" in capsys.readouterr().err
    assert main(["run", "boids", "--steps", "2", "--sync-every", "0", "--quiet"]) == 2
    assert "sync_every: expected an int >= 1 (got 0)" in capsys.readouterr().err


def test_config_file_carries_the_multi_rank_options(tmp_path, capsys):
    cfg = tmp_path / "stale.toml"
    cfg.write_text('model = "boids"\nagents = 300\nsteps = 3\nseed = 2\nsync_every = 2\npartition = "data"\n')
    out = tmp_path / "stale.h5"
    assert main(["run", "--config", str(cfg), "--out", str(out), "--quiet"]) == 0
    ref = Simulation(get_model("boids"), agents=300, seed=2, sync_every=2).run(3).metrics
    assert np.array_equal(read_trajectory(out).metrics["polarization"], ref["polarization"])
    bad = tmp_path / "bad.toml"
    bad.write_text('model = "boids"\npartition = "spatail"\n')
    assert main(["run", "--config", str(bad)]) == 2
    assert "unknown partition 'spatail'" in capsys.readouterr().err


def test_the_run_header_counts_the_agents_init_built(tmp_path, capsys):
    model_file = tmp_path / "pairs.py"
    model_file.write_text(
        "import torch\nimport agentsim as asim\n"
        "MODEL = asim.Model('pairs')\n"
        "@MODEL.init\n"
        "def init(ic):\n"
        "    ic.add('a', uid=ic.uids('a', 2 * ic.n_agents), w=torch.zeros(2 * ic.n_agents))  # two per agent asked\n"
        "@MODEL.substep(reads=['a.w'], writes=['a.w'])\n"
        "def grow(ctx):\n"
        "    ctx['a']['w'] = ctx['a']['w'] + 1.0\n")
    assert main(["run", f"{model_file}:MODEL", "--agents", "10000", "--steps", "2"]) == 0
    assert capsys.readouterr().out.startswith("pairs: 20,000 agents (--agents 10000), 2 steps")
    assert main(["run", f"{model_file}:MODEL", "--agents", "500", "--steps", "2", "--nprocs", "2"]) == 0
    assert capsys.readouterr().out.startswith("pairs: 1,000 agents (--agents 500), 2 steps")
