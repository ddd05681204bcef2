"""Trajectories carry a CRC-32 per metric row and per field of each frame (format version 2, issue
58): a flipped bit in what a reader serves is refused in one line, a resume never keeps rows that
fail theirs, and files of format version 1 still read and resume.
"""

from __future__ import annotations

import sys
import zlib
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
from equivalence import assert_same_bits, flip_bit, h5_datasets, same_values

from agentsim.cli.main import main
from agentsim.errors import OutputError
from agentsim.io.hdf5 import FORMAT_VERSION, TrajectoryWriter, read_trajectory
from agentsim.io.tables import read_frames

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from stress_trajectory_flips import data_spans


@pytest.fixture(scope="module")
def wolfsheep(tmp_path_factory):
    """A small complete run with two populations, env layers, metrics and perf rows."""
    path = tmp_path_factory.mktemp("ws") / "run.h5"
    assert main(["run", "wolfsheep", "--agents", "40", "--steps", "4", "--every", "2", "--quiet",
                 "--out", str(path)]) == 0
    return path


def _values(path) -> dict:
    """Everything the reader serves of ``path`` but the machine's figures."""
    traj = read_trajectory(path)
    out: dict = {"attrs": traj.attrs, "metrics": traj.metrics}
    for pop in traj.populations:
        for step in traj.steps(pop).tolist():
            out[f"{pop}@{step}"] = traj.agents(pop, step=step)
    for name in traj.env_names:
        for step in traj.env_steps().tolist():
            out[f"env {name}@{step}"] = traj.env(name, step)
    out["perf"] = traj.perf
    return out


@pytest.mark.timeout(120)
def test_a_flipped_bit_in_the_data_a_reader_serves_is_refused_in_one_line(wolfsheep, tmp_path):
    data = wolfsheep.read_bytes()
    spans = [s for s in data_spans(str(wolfsheep)) if not s[0].startswith("perf")]
    assert {name.split("/")[-1] for name, _, _ in spans} >= {"checksums", "step", "uid", "energy", "grass"}
    rng = np.random.default_rng(1)
    for trial in range(40):
        name, first, used = spans[int(rng.integers(len(spans)))]
        at = first + int(rng.integers(used))  # a byte of `name` that a reader serves
        path = tmp_path / f"flip{trial}.h5"
        path.write_bytes(flip_bit(data, at, int(rng.integers(8))))
        with pytest.raises(OutputError) as caught:
            _values(path)
        assert name and "\n" not in str(caught.value), str(caught.value)
        assert "damaged" in str(caught.value) or "not increasing" in str(caught.value), str(caught.value)


@pytest.mark.timeout(120)
def test_a_flipped_bit_anywhere_in_a_trajectory_is_an_error_or_changes_nothing(wolfsheep, tmp_path):
    data = wolfsheep.read_bytes()
    want = _values(wolfsheep)
    rng = np.random.default_rng(2)
    outcomes = {"refused": 0, "unchanged": 0, "perf dropped": 0}
    for trial in range(40):
        at = int(rng.integers(len(data)))
        path = tmp_path / f"flip{trial}.h5"
        path.write_bytes(flip_bit(data, at, int(rng.integers(8))))
        try:
            got = _values(path)
        except OutputError as e:
            assert "\n" not in str(e)
            outcomes["refused"] += 1
            continue
        if got["perf"] == {} and want["perf"]:  # figures of the machine: dropped when they do not read back
            outcomes["perf dropped"] += 1
            got["perf"] = want["perf"]
        else:
            outcomes["unchanged"] += 1
        assert same_values(got, want), f"byte {at} of {len(data)}: a flipped bit read as data"


def test_the_checksums_are_crc32_of_the_bytes_as_the_format_says(wolfsheep):
    """A reader with plain h5py and zlib checks a file the way the reference page says."""
    with h5py.File(wolfsheep, "r") as f:
        assert f.attrs["format_version"] == FORMAT_VERSION >= 2
        m = f["metrics"]
        names = sorted(set(m) - {"step", "checksums"})
        for t in range(len(m["step"])):
            row = m["step"][t].tobytes() + b"".join(m[n][t].tobytes() for n in names)
            assert zlib.crc32(row) == m["checksums"][t]
        env = f["env"]
        layers = sorted(set(env) - {"step", "checksums"})
        for k in range(len(env["step"])):
            step = zlib.crc32(env["step"][k].tobytes())  # each field's checksum starts from its frame's step
            assert [zlib.crc32(env[n][k].tobytes(), step) for n in layers] == env["checksums"][k].tolist()


def test_read_frames_checks_every_frame(wolfsheep, tmp_path):
    pytest.importorskip("xarray")
    path = tmp_path / "r.h5"
    path.write_bytes(wolfsheep.read_bytes())
    read_frames(path, "sheep")
    with h5py.File(path, "r+") as f:
        f["agents/sheep/energy"][1] += 1.0
    with pytest.raises(OutputError, match=r"agents 'sheep' at step 0: field 'energy' fails its checksum"):
        read_frames(path, "sheep")


def test_a_resume_into_a_file_whose_kept_rows_fail_their_checksum_is_refused_and_cuts_nothing(tmp_path, capsys):
    path, ck = tmp_path / "o.h5", tmp_path / "ck"
    run = ["run", "randomwalk", "--agents", "30", "--steps", "8", "--every", "2", "--quiet",
           "--checkpoint-every", "4", "--checkpoint-dir", str(ck)]
    assert main([*run, "--out", str(path)]) == 0
    with h5py.File(path, "r+") as f:
        column = next(n for n in f["metrics"] if n not in ("step", "checksums"))
        f[f"metrics/{column}"][2] += 1
    before = h5_datasets(str(path))
    capsys.readouterr()
    assert main([*run, "--resume", str(ck / "step-00000004"), "--out", str(path)]) == 1
    err = capsys.readouterr().err
    assert "/metrics at step 2 fails its checksum" in err and "write the resumed run to a new file" in err, err
    assert len(err.strip().splitlines()) == 1, err
    assert_same_bits(h5_datasets(str(path)), before, "the refused resume's file")


def _as_version_1(path) -> None:
    """``path`` rewritten as agentsim 0.3 wrote it: no checksums, variable-length strings."""
    with h5py.File(path, "r+") as f:
        for group in ("metrics", "perf", "env", *(f"agents/{p}" for p in f["agents"])):
            if "checksums" in f[group]:
                del f[group]["checksums"]
        f.attrs["format_version"] = 1
        for key in ("format", "model", "params", "versions"):
            f.attrs[key] = f.attrs[key].decode()


def test_a_file_of_format_version_1_reads_and_resumes_without_checksums(tmp_path):
    whole, path, ck = tmp_path / "whole.h5", tmp_path / "o.h5", tmp_path / "ck"
    run = ["run", "wolfsheep", "--agents", "40", "--steps", "6", "--every", "2", "--quiet",
           "--checkpoint-every", "2", "--checkpoint-dir", str(ck)]
    assert main([*run, "--out", str(whole)]) == 0
    path.write_bytes(whole.read_bytes())
    _as_version_1(path)
    _as_version_1(whole)
    old = _values(path)
    assert old["attrs"]["format_version"] == 1 and same_values(old["metrics"], _values(whole)["metrics"])
    assert main([*run, "--resume", str(ck / "step-00000004"), "--out", str(path)]) == 0
    resumed = _values(path)
    assert resumed["attrs"]["format_version"] == 1
    with h5py.File(path, "r") as f:
        assert "checksums" not in f["metrics"] and "checksums" not in f["agents/sheep"]
    for key in old:
        if key not in ("attrs", "perf"):
            assert same_values(resumed[key], old[key]), key


def test_an_int_metric_that_turns_float_keeps_every_row_checked(tmp_path):
    path = tmp_path / "p.h5"
    with TrajectoryWriter(path, model="demo", params={}, seed=1, steps=600, compression=None) as w:
        for step in range(600):
            w.write_metrics(step, {"share": step if step < 300 else step / 7, "n": step})
            w.write_agents(step, "a", {"uid": torch.arange(3), "x": torch.full((3,), float(step))})
    traj = read_trajectory(path)
    assert traj.metrics["share"].dtype == np.float64 and traj.metrics["share"][299] == 299.0
    with h5py.File(path, "r+") as f:
        f["metrics/share"][10] = 10.5
    with pytest.raises(OutputError, match="at step 10 fails its checksum"):
        read_trajectory(path)


def test_a_name_the_checksums_take_is_refused_with_the_reason(tmp_path):
    from agentsim.errors import ConfigError

    with TrajectoryWriter(tmp_path / "n.h5", model="demo", params={}, seed=1, steps=1) as w:
        with pytest.raises(ConfigError, match="'checksums' is reserved"):
            w.write_metrics(0, {"checksums": 1})
        with pytest.raises(ConfigError, match="'checksums' are reserved"):
            w.write_env(0, {"checksums": torch.zeros(2)})
        with pytest.raises(ConfigError, match="field name 'checksums' is reserved"):
            w.write_agents(0, "a", {"uid": torch.arange(2), "checksums": torch.zeros(2)})


def test_inspect_verifies_every_frame_and_names_the_one_that_fails(wolfsheep, tmp_path, capsys):
    assert main(["inspect", str(wolfsheep)]) == 0
    assert "every checksum verified (5 metric rows, 9 frames)" in capsys.readouterr().out
    path = tmp_path / "r.h5"
    path.write_bytes(wolfsheep.read_bytes())
    with h5py.File(path, "r+") as f:
        f["env/grass"][2, 3, 4] = ~f["env/grass"][2, 3, 4]
    assert main(["inspect", str(path)]) == 1
    err = capsys.readouterr().err.strip()
    assert err.endswith("is damaged: env at step 4: field 'grass' fails its checksum (its bytes changed after they "
                        "were written)") and "\n" not in err, err


def test_offsets_that_do_not_index_the_rows_of_a_completed_file_are_damage(wolfsheep, tmp_path):
    """A flipped high bit of the last offset read the same rows (slices stop at the end): refused."""
    path = tmp_path / "r.h5"
    path.write_bytes(wolfsheep.read_bytes())
    with h5py.File(path, "r+") as f:
        f["agents/wolf/offsets"][-1] += 1 << 40
    with pytest.raises(OutputError, match="the offsets of /agents/wolf do not index its rows"):
        read_trajectory(path)
