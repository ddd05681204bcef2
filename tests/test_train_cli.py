"""`agentsim train` and `agentsim info`, and the Python API behind them (agentsim.learn.train,
evaluate, plot_training): the same training on 1 and 2 processes, logs, plots, resume, errors."""

from __future__ import annotations

import json
import subprocess
import sys

import h5py
import numpy as np
import pytest
import torch
from agentsim.models.spillover import MODEL as SPILLOVER
from agentsim.models.spillover import protect_if_exposed

from agentsim import ConfigError
from agentsim.cli.info import collect, format_info, recommendations
from agentsim.cli.main import main
from agentsim.learn import PPOConfig, Trainer, evaluate, plot_training, train
from agentsim.learn.checkpoint import load_latest
from agentsim.learn.trainer import bf16_supported

ARGS = ["--agents", "300", "--updates", "3", "--horizon", "6", "--hidden", "16", "--minibatches", "2",
        "--epochs", "2", "--seed", "5"]
CONFIG = PPOConfig(horizon=6, hidden=(16,), minibatches=2, epochs=2)


def run_cli(*args: str) -> tuple[int, str, str]:
    proc = subprocess.run([sys.executable, "-m", "agentsim", *args], capture_output=True, text=True, timeout=240)
    return proc.returncode, proc.stdout, proc.stderr


def flat(state: dict[str, torch.Tensor]) -> torch.Tensor:
    return torch.cat([v.flatten().to(torch.float64) for v in state.values()])


@pytest.mark.long
def test_train_cli_two_processes_equals_one_and_writes_log_plot_and_checkpoints(tmp_path):
    runs = {}
    for w in (1, 2):
        d = tmp_path / f"w{w}"
        d.mkdir()
        code, out, err = run_cli("train", "spillover", *ARGS, "--nprocs", str(w), "--out", str(d / "train.h5"),
                                 "--plot", str(d / "curve.png"), "--checkpoint-dir", str(d / "ck"), "--keep", "2")
        assert code == 0, err
        assert "3 updates on" in out and "wrote" in out
        assert err.count("update ") == 3  # one line per update (stderr is not a terminal)
        runs[w] = load_latest(d / "ck")
        assert sorted(p.name for p in (d / "ck").glob("ppo-*.pt")) == ["ppo-000002.pt", "ppo-000003.pt"]
        assert (d / "curve.png").stat().st_size > 10_000
        with h5py.File(d / "train.h5") as f:
            assert list(f["metrics/step"][:]) == [1, 2, 3] and bool(f.attrs["completed"])
            for key in ("mean_return", "policy_loss", "value_loss", "entropy", "approx_kl", "clip_fraction"):
                assert np.all(np.isfinite(f["metrics"][key][:])), key
            for key in ("agent_steps_per_s", "allreduce_seconds", "scaling_efficiency"):
                assert key in f["perf"], key
            assert int(f.attrs["world_size"]) == w
    assert torch.equal(flat(runs[1]["net"]), flat(runs[2]["net"]))  # exact gradient sums: the same bits
    figures = [[{k: v for k, v in row.items() if "seconds" not in k and "per_s" not in k and k != "scaling_efficiency"}
                for row in runs[w]["history"]] for w in (1, 2)]
    assert figures[0] == figures[1]


@pytest.mark.long
def test_train_cli_resume_after_interruption_equals_uninterrupted(tmp_path):
    code, _, err = run_cli("train", "spillover", *ARGS, "--checkpoint-dir", str(tmp_path / "full"), "--quiet")
    assert code == 0, err
    # the interrupted run: one of the three planned updates done, then stopped
    Trainer(SPILLOVER, agents=300, seed=5, updates=3, config=CONFIG).train(1, checkpoint_dir=tmp_path / "part")
    code, _, err = run_cli("train", "spillover", *ARGS, "--nprocs", "2", "--checkpoint-dir",
                             str(tmp_path / "part"), "--resume")
    assert code == 0, err
    assert err.count("update ") == 2 and "update 2/3" in err  # continued at update 2
    full, part = load_latest(tmp_path / "full"), load_latest(tmp_path / "part")
    assert part["update"] == 3
    assert torch.equal(flat(full["net"]), flat(part["net"]))  # resumed on 2 processes, bit for bit


@pytest.mark.parametrize(("args", "message"), [
    (["train", "sir"], "declares no policy"),
    (["train", "spillover", "--policy", "nope"], "has no policy 'nope'"),
    (["train", "spillover", "--hidden", "16,x"], "--hidden"),
    (["train", "spillover", "--horizon", "0"], "horizon: expected an int >= 1"),
    (["train", "spillover", "--resume"], "--resume needs --checkpoint-dir"),
    (["train", "spillover", "--set", "nope=1"], "nope"),
    (["train", "spillover", "--partition", "diagonal"], "diagonal"),
])
def test_train_cli_bad_configuration_exits_2_with_a_clear_message(args, message, capsys):
    try:
        code = main(args)
    except SystemExit as e:  # (argparse's own errors)
        code = e.code
    err = capsys.readouterr().err
    assert code == 2, err
    assert message in err and "Traceback" not in err


def test_train_cli_bf16_where_the_cpu_has_it_and_a_clear_message_where_not(tmp_path):
    code, _, err = run_cli("train", "spillover", *ARGS, "--precision", "bf16", "--quiet")
    if bf16_supported(torch.device("cpu"))[0]:
        assert code == 0, err
    else:
        assert code == 2 and "no native bf16" in err and "--precision fp32" in err


def test_resume_from_another_training_is_refused_before_processes_start(tmp_path):
    Trainer(SPILLOVER, agents=300, seed=5, updates=3, config=CONFIG).train(1, checkpoint_dir=tmp_path)
    with pytest.raises(ConfigError, match=r"seed: 5 there, 6 here"):
        train(SPILLOVER, 300, 3, 6, world_size=2, config=CONFIG, checkpoint_dir=tmp_path, resume=True)
    with pytest.raises(ConfigError, match=r"anneals over the planned updates"):
        train(SPILLOVER, 300, 4, 5, world_size=2, config=CONFIG, checkpoint_dir=tmp_path, resume=True)


def test_evaluate_and_plot(tmp_path):
    result = train("spillover", 300, 2, 5, config=CONFIG)
    learned = evaluate(SPILLOVER, result.net, agents=300, seeds=[1, 2], horizon=6)
    rule = evaluate(SPILLOVER, protect_if_exposed, agents=300, seeds=[1, 2], horizon=6)
    rand = evaluate(SPILLOVER, "random", agents=300, seeds=[1, 2], horizon=6)
    assert len(learned) == len(rule) == len(rand) == 2
    assert rule != rand and all(r < 0 for r in rand)
    path = plot_training(result.history, tmp_path / "c.png", baselines={"random": sum(rand) / 2})
    assert (tmp_path / "c.png").stat().st_size > 10_000 and path.endswith("c.png")
    with pytest.raises(ConfigError, match="no updates"):
        plot_training([], tmp_path / "empty.png")


def test_evaluate_gives_the_same_returns_on_two_ranks():
    from agentsim.runner.launch import run_ranks

    one = evaluate(SPILLOVER, protect_if_exposed, agents=300, seeds=[3], horizon=6)
    two = run_ranks(_evaluate_rank, 2, timeout=60.0)
    assert two[0] == two[1] == one


def _evaluate_rank(comm):
    return evaluate(SPILLOVER, protect_if_exposed, agents=300, seeds=[3], horizon=6, comm=comm)


@pytest.mark.long
def test_info_prints_facts_and_json():
    code, out, err = run_cli("info")
    assert code == 0, err
    for word in ("versions:", "torch", "cores", "bf16", "cuda", "gloo", "torch_scatter", "recommendations"):
        assert word in out, word
    code, out, err = run_cli("info", "--json")
    assert code == 0, err
    facts = json.loads(out)
    assert facts["backends"]["gloo"] is True and facts["cpu"]["cores"] >= 1
    assert isinstance(facts["recommendations"], list)


def test_info_recommendations_follow_the_facts():
    facts = collect()
    facts["cpu"].update(torch_threads=64, cores=2, bf16=False)
    facts["optional"]["torch_scatter"] = None
    facts["backends"]["gloo"] = False
    facts["cuda"] = {"available": False, "devices": []}
    facts["versions"]["torch_cuda"] = "12.8"
    advice = " ".join(recommendations(facts))
    for text in ("OMP_NUM_THREADS=2", "gloo is missing", "--precision fp32", "agentsim[scatter]", "CPU wheel"):
        assert text in advice, text
    facts["cpu"].update(torch_threads=2, bf16=True)
    facts["optional"]["torch_scatter"] = "2.1.2"
    facts["backends"].update(gloo=True, nccl=False)
    facts["versions"]["torch_cuda"] = None
    assert recommendations(facts) == []
    assert "all is well" in format_info(facts)
    facts["cuda"] = {"available": True, "devices": [{"index": 0, "name": "H100", "memory_gib": 79.6,
                                                     "capability": "9.0", "bf16": True}]}
    assert "NCCL" in " ".join(recommendations(facts))  # gloo but no nccl
