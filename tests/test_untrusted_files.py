"""Files from elsewhere never execute code (issue 33).

For each file the package loads with ``torch.load`` (a simulation checkpoint's shards and env, a
training checkpoint's state: policies trained by ``agentsim train`` live only there; calibration
results, study files and training logs are HDF5 or JSON, which never unpickle), a crafted pickle
whose ``__reduce__`` would create a marker file is put where the loader reads, with every checksum
made to match, and the loader and the command are run: a clear error, a non-zero exit, and no
marker. Pointers that leave their directory, flipped bytes, edited and incomplete manifests are
refused too; and the package's source holds no unpickling loader.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from agentsim.models.spillover import MODEL as SPILLOVER

import agentsim as asim
from agentsim.cli.main import main
from agentsim.io.checkpoint import CheckpointError, manifest_checksum, read_checkpoint, tensor_bytes
from agentsim.learn import PPOConfig, Trainer
from agentsim.learn.checkpoint import load_latest

PACKAGE = Path(asim.__file__).resolve().parent
CONFIG = PPOConfig(horizon=6, hidden=(16,), minibatches=2, epochs=2)
TRAIN = ["train", "spillover", "--agents", "300", "--updates", "3", "--horizon", "6", "--hidden", "16",
         "--minibatches", "2", "--epochs", "2", "--seed", "5", "--quiet"]


class Payload:
    """Unpickled, it would create ``marker`` (``open(marker, "w")``)."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def malicious(marker: Path, zipped: bool = True) -> bytes:
    """A torch.save file (or a bare pickle) whose loading with weights_only=False runs the payload."""
    import io
    import pickle

    if not zipped:
        return pickle.dumps({"a": {"uid": Payload(marker)}})
    buf = io.BytesIO()
    torch.save({"a": {"uid": Payload(marker)}, "net": Payload(marker)}, buf)
    return buf.getvalue()


def cli(*argv: str) -> tuple[int, str]:
    proc = subprocess.run([sys.executable, "-m", "agentsim", *argv], capture_output=True, text=True, timeout=240)
    return proc.returncode, proc.stderr


def sim_checkpoint(d: Path) -> Path:
    sim = asim.Simulation(asim.get_model("randomwalk"), agents=50, seed=0)
    sim.run(2)
    return Path(sim.save_checkpoint(d / "ck"))


def reseal_sim(step_dir: Path, file: str | None = None) -> None:
    """Make the manifest match ``file``'s new bytes (and itself): what an attacker would do."""
    path = step_dir / "manifest.json"
    manifest = json.loads(path.read_text())
    if file is not None:
        digest = hashlib.sha256((step_dir / file).read_bytes()).hexdigest()
        for entry in [*manifest["shards"], manifest["env"]]:
            if entry["file"] == file:
                entry["sha256"] = digest
    manifest["checksum"] = manifest_checksum(manifest)
    path.write_text(json.dumps(manifest))


def train_checkpoint(d: Path) -> Path:
    Trainer(SPILLOVER, agents=300, seed=5, updates=3, config=CONFIG).train(1, checkpoint_dir=d)
    return d


def reseal_train(d: Path) -> None:
    path = d / (d / "latest").read_text()
    manifest = json.loads(path.read_text())
    manifest["sha256"] = hashlib.sha256((d / manifest["file"]).read_bytes()).hexdigest()
    manifest["checksum"] = manifest_checksum(manifest)
    path.write_text(json.dumps(manifest))


def test_the_payload_is_real(tmp_path):
    """The crafted file does run its payload when unpickled the unsafe way (so the tests below test)."""
    marker = tmp_path / "MARKER"
    (tmp_path / "evil.pt").write_bytes(malicious(marker))
    torch.load(tmp_path / "evil.pt", weights_only=False)  # on purpose: the unsafe way
    assert marker.exists()


@pytest.mark.parametrize(("file", "zipped"), [("rank-00000-of-00001.pt", True),
                                             pytest.param("env.pt", False, marks=pytest.mark.long),
                                             pytest.param("rank-00000-of-00001.pt", False, marks=pytest.mark.long),
                                             pytest.param("env.pt", True, marks=pytest.mark.long)])
def test_a_crafted_simulation_checkpoint_file_is_refused_and_never_runs(tmp_path, file, zipped):
    step = sim_checkpoint(tmp_path)
    marker = tmp_path / "MARKER"
    (step / file).write_bytes(malicious(marker, zipped))
    reseal_sim(step, file)
    with pytest.raises(CheckpointError, match=f"{file} holds objects other than tensors and plain data: refused"):
        read_checkpoint(step)
    code, err = cli("run", "randomwalk", "--agents", "50", "--steps", "4", "--quiet", "--resume", str(step))
    assert code == 2 and "agentsim: error:" in err and "never execute code" in err and "Traceback" not in err, err
    code, err = cli("inspect", str(step))
    assert code == 2 and "Traceback" not in err, err
    assert not marker.exists()


@pytest.mark.long
def test_a_crafted_training_checkpoint_is_refused_and_never_runs(tmp_path):
    d = train_checkpoint(tmp_path / "ck")
    marker = tmp_path / "MARKER"
    (d / "ppo-000001.pt").write_bytes(malicious(marker))
    reseal_train(d)
    with pytest.raises(CheckpointError, match="ppo-000001.pt' holds objects other than tensors"):
        load_latest(d)
    code, err = cli(*TRAIN, "--checkpoint-dir", str(d), "--resume")
    assert code == 2 and "agentsim: error:" in err and "never execute code" in err and "Traceback" not in err, err
    code, err = cli(*TRAIN, "--checkpoint-dir", str(d), "--resume", "--nprocs", "2")
    assert code == 2 and "Traceback" not in err, err
    assert not marker.exists()


def test_an_old_pickled_training_checkpoint_is_refused_as_older_and_never_runs(tmp_path):
    marker = tmp_path / "MARKER"
    (tmp_path / "ppo-000001.pt").write_bytes(malicious(marker))
    (tmp_path / "latest").write_text("ppo-000001.pt")
    with pytest.raises(CheckpointError, match="training checkpoint of an older format"):
        load_latest(tmp_path)
    assert not marker.exists()


@pytest.mark.parametrize("target", ["/etc/passwd", "../outside.json", "sub/../../outside.json", "..", ""])
def test_a_training_pointer_that_leaves_its_directory_is_refused(tmp_path, target):
    d = train_checkpoint(tmp_path / "ck")
    (tmp_path / "outside.json").write_text((d / (d / "latest").read_text()).read_text())
    (d / "latest").write_text(target)
    with pytest.raises(CheckpointError, match="may only name files in its own directory"):
        load_latest(d)


def test_links_and_manifest_names_that_leave_the_directory_are_refused(tmp_path):
    d = train_checkpoint(tmp_path / "ck")
    name = (d / "latest").read_text()
    (tmp_path / "outside.json").write_text((d / name).read_text())
    (d / "link.json").symlink_to(tmp_path / "outside.json")
    (d / "latest").write_text("link.json")
    with pytest.raises(CheckpointError, match="a link that leaves"):
        load_latest(d)
    (d / "latest").unlink()
    (d / "latest").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(CheckpointError, match="is not a plain file"):
        load_latest(d)
    (d / "latest").unlink()
    (d / "latest").write_text(name)
    manifest = json.loads((d / name).read_text())
    manifest["file"] = "../ppo-000001.pt"
    manifest["checksum"] = manifest_checksum(manifest)
    (d / name).write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError, match="may only name files in its own directory"):
        load_latest(d)
    code, err = cli(*TRAIN, "--checkpoint-dir", str(d), "--resume")
    assert code == 2 and "may only name files in its own directory" in err and "Traceback" not in err, err
    # a simulation manifest naming its env or a shard elsewhere
    step = sim_checkpoint(tmp_path / "sim")
    manifest = json.loads((step / "manifest.json").read_text())
    env_named = "names '/etc/passwd', not a file in"
    shard_list = re.escape("lists the shards ['/etc/passwd'], not one shard of each")
    for entry, message in ((manifest["env"], env_named), (manifest["shards"][0], shard_list)):
        before = entry["file"]
        entry["file"] = "/etc/passwd"
        manifest["checksum"] = manifest_checksum(manifest)
        (step / "manifest.json").write_text(json.dumps(manifest))
        with pytest.raises(CheckpointError, match=message):
            read_checkpoint(step)
        entry["file"] = before


@pytest.mark.long
def test_flipped_bytes_and_an_edited_training_manifest_are_refused(tmp_path):
    d = train_checkpoint(tmp_path / "ck")
    state = d / "ppo-000001.pt"
    data = bytearray(state.read_bytes())
    data[len(data) // 2] ^= 0x01
    state.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="ppo-000001.pt' does not match its checksum"):
        load_latest(d)
    code, err = cli(*TRAIN, "--checkpoint-dir", str(d), "--resume")
    assert code == 2 and "does not match its checksum" in err and "Traceback" not in err, err
    d2 = train_checkpoint(tmp_path / "ck2")
    manifest = json.loads((d2 / "ppo-000001.json").read_text())
    manifest["update"] = 2
    (d2 / "ppo-000001.json").write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError, match="ppo-000001.json' does not match its checksum"):
        load_latest(d2)
    del manifest["sha256"]
    (d2 / "ppo-000001.json").write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError, match="has no key 'sha256'"):
        load_latest(d2)


def test_an_edited_simulation_manifest_step_is_refused(tmp_path):
    step = sim_checkpoint(tmp_path)
    manifest = json.loads((step / "manifest.json").read_text())
    manifest["step"] = 1
    (step / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError, match="manifest.json does not match its checksum"):
        read_checkpoint(step)
    assert main(["run", "randomwalk", "--agents", "50", "--steps", "4", "--quiet", "--resume", str(step)]) == 2


@pytest.mark.parametrize("key", ["seed", "step", "next_uid", "shards", "env", "checksum", "fingerprint", "params"])
@pytest.mark.parametrize("resealed", [True, False])
def test_a_simulation_manifest_missing_a_key_names_it(tmp_path, key, resealed):
    step = sim_checkpoint(tmp_path)
    manifest = json.loads((step / "manifest.json").read_text())
    del manifest[key]
    if resealed and key != "checksum":
        manifest["checksum"] = manifest_checksum(manifest)
    (step / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError, match=f"manifest.json has no key '{key}'"):
        read_checkpoint(step)


@pytest.mark.parametrize(("change", "message"), [
    (lambda m: m.update(step="2"), "'step' is a str, expected a int"),
    (lambda m: m.update(seed=True), "'seed' is a bool, expected a int"),
    (lambda m: m.update(shards={}), "'shards' is a dict, expected a list"),
    (lambda m: m["shards"][0].pop("sha256"), "'shards[0].sha256' is missing or not a string"),
    (lambda m: m["env"].update(file=3), "'env.file' is missing or not a string"),
    (lambda m: m["next_uid"].update(agents="x"), "'next_uid.agents' is 'x', expected an int >= 0"),
    (lambda m: m.update(step=-1), "'step' is -1, expected >= 0"),
    (lambda m: m.update(format=1), "has format 1, older than this agentsim's 2"),
])
def test_a_mistyped_simulation_manifest_gets_a_clear_message(tmp_path, change, message):
    step = sim_checkpoint(tmp_path)
    manifest = json.loads((step / "manifest.json").read_text())
    change(manifest)
    manifest["checksum"] = manifest_checksum(manifest)
    (step / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError, match=re.escape(message)):
        read_checkpoint(step)


def test_a_shard_of_the_wrong_shape_is_refused(tmp_path):
    step = sim_checkpoint(tmp_path)
    (step / "env.pt").write_bytes(tensor_bytes([1, 2, 3]))
    reseal_sim(step, "env.pt")
    with pytest.raises(CheckpointError, match="env.pt does not hold tensors by name"):
        read_checkpoint(step)
    (step / "rank-00000-of-00001.pt").write_bytes(tensor_bytes({"agents": {"uid": 3}}))
    reseal_sim(step, "rank-00000-of-00001.pt")
    with pytest.raises(CheckpointError, match="does not hold populations of tensors"):
        read_checkpoint(step)


def test_checkpoints_hold_only_tensors_and_plain_data():
    from collections import namedtuple

    with pytest.raises(TypeError, match="Path is not a tensor or plain data"):
        tensor_bytes({"a": Path("x")})
    with pytest.raises(TypeError, match="is not a tensor or plain data"):
        tensor_bytes({"a": namedtuple("P", "x")(1)})
    trainer = Trainer(SPILLOVER, agents=300, seed=5, updates=3, config=CONFIG)
    tensor_bytes(trainer.state_dict())  # the trainer's state passes


_FORBIDDEN = [r"weights_only\s*=\s*False", r"pickle\.load\(", r"pickle\.Unpickler", r"allow_pickle\s*=\s*True",
              r"yaml\.load\(", r"yaml\.unsafe_load", r"(?<![.\w])eval\(", r"(?<![.\w])exec\(", r"\bmarshal\.",
              r"\bshelve\.", r"\bdill\b", r"\bjoblib\b"]


def test_the_package_source_has_no_unpickling_loader():
    hits = []
    for path in sorted(PACKAGE.rglob("*.py")):
        text = path.read_text()
        rel = path.relative_to(PACKAGE.parent)
        for pattern in _FORBIDDEN:
            hits += [f"{rel}: {m.group(0)}" for m in re.finditer(pattern, text)]
        for m in re.finditer(r"torch\.load\(([^()]|\([^()]*\))*\)", text):
            if "weights_only=True" not in m.group(0):
                hits.append(f"{rel}: {m.group(0)}")
        # pickle.loads only of what the package's own worker processes send (an in-memory pipe, never a file)
        if "pickle.loads(" in text and rel.as_posix() != "agentsim/runner/launch.py":
            hits.append(f"{rel}: pickle.loads")
    assert not hits, hits
    assert os.fspath(PACKAGE).endswith("agentsim")


def test_a_forged_manifest_that_disagrees_with_its_files_is_refused(tmp_path):
    """The checksum is recomputed (as a forger would): the step, row counts and next uids are
    still checked against the directory's name and the shards, and a training manifest's update
    against the state."""
    for change, message in [(lambda m: m.update(step=1), "manifest.json says step 1, its directory step 2"),
                            (lambda m: m["shards"][0]["rows"].update(walker=3), "its manifest says {'walker': 3}"),
                            (lambda m: m["next_uid"].update(walker=1), "'next_uid.walker' is 1, not above"),
                            (lambda m: m["next_uid"].update(walker=m["next_uid"]["walker"] + 2),
                             "but env.pt (the file its sha256 names) records")]:
        step = sim_checkpoint(tmp_path / str(len(message)))
        manifest = json.loads((step / "manifest.json").read_text())
        change(manifest)
        manifest["checksum"] = manifest_checksum(manifest)
        (step / "manifest.json").write_text(json.dumps(manifest))
        with pytest.raises(CheckpointError, match=re.escape(message)):
            read_checkpoint(step)
    d = train_checkpoint(tmp_path / "ck")
    manifest = json.loads((d / "ppo-000001.json").read_text())
    manifest["update"] = 2
    manifest["checksum"] = manifest_checksum(manifest)
    (d / "ppo-000001.json").write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError, match="is of update 1, its manifest 'ppo-000001.json' says 2"):
        load_latest(d)
