"""Trajectory and study files from elsewhere are read only inside themselves (issue 58): external
storage, external links, virtual datasets, sizes a file does not store and kinds of data agentsim
never writes are refused with one line, by the readers and the commands, without reading another
file, hanging on a FIFO or allocating what the file declares.
"""

from __future__ import annotations

import os
import subprocess
import sys

import h5py
import numpy as np
import pytest
from equivalence import flip_bit, same_values

from agentsim.cli.main import main
from agentsim.errors import OutputError
from agentsim.io.hdf5 import read_trajectory
from agentsim.study.store import read_study, study_status

SECRET = b"AWS_SECRET_KEY=do-not-show-me-0123456789abcdef"


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """A small trajectory and a small study, both complete."""
    folder = tmp_path_factory.mktemp("made")
    traj, study = folder / "run.h5", folder / "study.h5"
    assert main(["run", "randomwalk", "--agents", "40", "--steps", "4", "--every", "2", "--quiet",
                 "--out", str(traj)]) == 0
    assert main(["sweep", "randomwalk", "--agents", "40", "--steps", "3", "--seeds", "1,2", "--quiet",
                 "--out", str(study)]) == 0
    return traj, study


def _replace(f: h5py.File, name: str, **create) -> None:
    """``name`` replaced by a dataset made with ``create``."""
    del f[name]
    f.create_dataset(name, **create)


def _external(secret):
    return {"shape": (len(SECRET) // 8,), "dtype": np.int64, "external": [(str(secret), 0, len(SECRET) // 8 * 8)]}


def _crafted(kind, f, tmp_path, name):
    if kind == "external storage":
        secret = tmp_path / "secret.txt"
        secret.write_bytes(SECRET)
        _replace(f, name, **_external(secret))
    elif kind == "external storage on a FIFO":
        fifo = tmp_path / "pipe"
        os.mkfifo(fifo)
        _replace(f, name, shape=(4,), dtype=np.int64, external=[(str(fifo), 0, 32)])
    elif kind == "external link":
        other = tmp_path / "other.h5"
        with h5py.File(other, "w") as o:
            o[name] = np.frombuffer(SECRET[:40], dtype=np.int64)
        del f[name]
        f[name] = h5py.ExternalLink(str(other), name)
    elif kind == "virtual dataset":
        other = tmp_path / "other.h5"
        with h5py.File(other, "w") as o:
            o["x"] = np.frombuffer(SECRET[:40], dtype=np.int64)
        layout = h5py.VirtualLayout(shape=(5,), dtype=np.int64)
        layout[:] = h5py.VirtualSource(str(other), "x", shape=(5,))
        del f[name]
        f.create_virtual_dataset(name, layout)
    elif kind == "declared size":
        _replace(f, name, shape=(1,), maxshape=(None,), chunks=(1024,), dtype=np.int64)
        f[name].resize(2**41, axis=0)  # 16 TiB declared, nothing stored
    elif kind == "compound dtype":
        _replace(f, name, data=np.zeros(3, dtype=[("a", np.int64), ("b", np.float64)]))


KINDS = ["external storage", "external storage on a FIFO", "external link", "virtual dataset", "declared size",
         "compound dtype"]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", KINDS)
def test_a_crafted_trajectory_is_refused_by_every_reader_and_command(made, tmp_path, capsys, kind):
    path = tmp_path / "run.h5"
    path.write_bytes(made[0].read_bytes())
    with h5py.File(path, "r+") as f:
        _crafted(kind, f, tmp_path, "metrics/step" if kind == "external link" else "metrics/n_walkers"
                 if "metrics/n_walkers" in f else f"metrics/{next(k for k in f['metrics'] if k != 'step')}")
    with pytest.raises(OutputError, match="agentsim reads only what a file holds itself"):
        read_trajectory(path)
    for command in (["inspect", str(path)], ["plot", str(path), "--out", str(tmp_path / "p.png")]):
        assert main(command) == 1
        captured = capsys.readouterr()
        assert SECRET.decode()[:20] not in captured.out + captured.err
        assert "reads only what a file holds itself" in captured.err and "Traceback" not in captured.err
    assert not (tmp_path / "p.png").exists()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", KINDS)
def test_a_crafted_study_file_is_refused_by_read_status_and_resume(made, tmp_path, capsys, kind):
    path = tmp_path / "study.h5"
    path.write_bytes(made[1].read_bytes())
    with h5py.File(path, "r+") as f:
        run = next(iter(f["runs"]))
        _crafted(kind, f, tmp_path, f"runs/{run}/{next(iter(f['runs'][run]))}")
    for read in (read_study, study_status):
        with pytest.raises(OutputError, match="agentsim reads only what a file holds itself"):
            read(path)
    assert main(["sweep", "randomwalk", "--agents", "40", "--steps", "3", "--seeds", "1,2", "--quiet",
                 "--resume", "--out", str(path)]) == 1
    err = capsys.readouterr().err
    assert "reads only what a file holds itself" in err and "Traceback" not in err


@pytest.mark.timeout(60)
def test_a_fifo_given_as_a_file_to_read_is_refused_at_once(tmp_path):
    fifo = tmp_path / "run.h5"
    os.mkfifo(fifo)
    for read in (read_trajectory, read_study, study_status):
        with pytest.raises(OutputError, match="it is a FIFO"):
            read(fifo)
    proc = subprocess.run([sys.executable, "-m", "agentsim", "inspect", str(fifo)], capture_output=True, text=True,
                          timeout=50)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr


def test_the_files_agentsim_writes_pass_the_check(made):
    read_trajectory(made[0])
    assert len(read_study(made[1]).runs) == 2


def _study_values(path) -> list:
    data = read_study(path)
    return [data.completed, sorted(data.runs), [v for r in data.runs.values() for v in r["metrics"].values()],
            data.summary, data.bands]


def test_a_flipped_bit_in_a_study_file_is_an_error_or_changes_nothing(made, tmp_path):
    """Every dataset has a checksum and the metadata is HDF5's checksummed v110 format: a bit
    flipped anywhere in the file is refused in one line or lands where nothing is read."""
    _, study = made
    want = _study_values(study)
    data = study.read_bytes()
    rng = np.random.default_rng(0)
    outcomes = {"refused": 0, "unchanged": 0}
    for trial in range(40):
        at = int(rng.integers(len(data)))
        path = tmp_path / f"flip{trial}.h5"
        path.write_bytes(flip_bit(data, at, int(rng.integers(8))))
        try:
            got = _study_values(path)
        except OutputError as e:
            assert "\n" not in str(e)
            outcomes["refused"] += 1
            continue
        assert same_values(got, want), f"byte {at} of {len(data)}: a flipped bit read as data"
        outcomes["unchanged"] += 1
    assert outcomes["refused"] >= 10, outcomes


def test_a_run_whose_series_fails_its_checksum_runs_again_on_resume(made, tmp_path, capsys):
    _, study = made
    path = tmp_path / "s.h5"
    path.write_bytes(study.read_bytes())
    with h5py.File(path, "r") as f:
        at = f["runs/c0000-r0001/step"].id.get_chunk_info(0).byte_offset
    data = bytearray(path.read_bytes())
    data[at] ^= 0x04
    path.write_bytes(bytes(data))
    with pytest.raises(OutputError, match="damaged .a block fails its checksum"):
        read_study(path)
    assert main(["sweep", "randomwalk", "--agents", "40", "--steps", "3", "--seeds", "1,2", "--quiet",
                 "--out", str(path), "--resume"]) == 0
    assert "rebuilt it with the 1 complete runs that read back" in capsys.readouterr().err
    assert same_values(_study_values(path), _study_values(study))
