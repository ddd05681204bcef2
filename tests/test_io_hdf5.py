"""HDF5 trajectories: write/read round trips, file layout read with plain h5py, errors."""

from __future__ import annotations

import json
import os
import zlib

import h5py
import numpy as np
import pytest
import torch

from agentsim.errors import ConfigError, OutputError
from agentsim.io.hdf5 import FORMAT, FORMAT_VERSION, TrajectoryWriter, read_trajectory

PARAMS = {"beta": 0.25, "n_init": 10, "label": "x", "flags": [1, 2]}


def sheep_frame(step: int) -> dict[str, torch.Tensor]:
    """A population with births and deaths: uids alive at ``step`` in a shuffled row order."""
    g = torch.Generator().manual_seed(100 + step)
    uid = torch.arange(2 * step, 10 + 3 * step)  # oldest die, newborns appear
    uid = uid[torch.randperm(len(uid), generator=g)]
    return {
        "uid": uid,
        "pos": torch.stack([uid * 0.5, uid * -1.25 + step], dim=1).float(),  # [n, 2], a function of (uid, step)
        "energy": uid * 10 + step,  # int64
        "alive": uid % 3 != 0,  # bool
    }


def wolves_frame(step: int) -> dict[str, torch.Tensor]:
    n = {0: 3, 2: 0, 4: 2}[step]  # size 0 at step 2
    uid = torch.tensor([40, 7, 19][:n], dtype=torch.int32)
    return {"uid": uid, "hunger": uid.double() / 4 + step}


def write_run(path, perf_scale: float = 1.0, steps: int = 4) -> None:
    with TrajectoryWriter(path, model="predprey", params=PARAMS, seed=42, steps=steps) as w:
        for step in range(steps + 1):
            frame = sheep_frame(step)
            w.write_metrics(step, {
                "n_sheep": len(frame["uid"]),  # int
                "mean_energy": frame["energy"].double().mean(),  # 0-d tensor -> float64
                "n_alive": frame["alive"].sum(),  # 0-d int tensor -> int64
                "infected/young": np.int32(step),  # nested name
            })
            if step > 0:
                w.write_perf(step, {"step_seconds": 0.01 * step * perf_scale,
                                    "substep_seconds/move": 0.001 * perf_scale})
            w.write_agents(step, "sheep", frame)
            if step % 2 == 0:
                w.write_agents(step, "wolves", wolves_frame(step))
            if step in (0, steps):
                w.write_env(step, {"grass": torch.arange(20.0).reshape(4, 5) + step, "season": torch.tensor(step)})
        w.close(completed=True)


@pytest.fixture
def run_file(tmp_path):
    path = tmp_path / "run.h5"
    write_run(path)
    return path


def test_round_trip(run_file):
    traj = read_trajectory(run_file)
    a = traj.attrs
    assert a["format"] == FORMAT and a["format_version"] == FORMAT_VERSION
    assert (a["model"], a["seed"], a["steps"], a["steps_completed"], a["world_size"], a["completed"]) == (
        "predprey", 42, 4, 4, 1, True)
    assert a["params"] == PARAMS
    assert set(a["versions"]) == {"agentsim", "torch", "numpy", "h5py", "python"}

    assert sorted(traj.metrics) == ["infected/young", "mean_energy", "n_alive", "n_sheep", "step"]
    assert traj.metrics["step"].tolist() == [0, 1, 2, 3, 4]
    assert traj.metrics["n_sheep"].dtype == np.int64 and traj.metrics["n_alive"].dtype == np.int64
    assert traj.metrics["mean_energy"].dtype == np.float64
    for step in range(5):
        frame = sheep_frame(step)
        assert traj.metrics["n_sheep"][step] == len(frame["uid"])
        assert traj.metrics["mean_energy"][step] == frame["energy"].double().mean().item()
    assert traj.metrics["infected/young"].tolist() == [0, 1, 2, 3, 4]

    assert traj.perf["step"].tolist() == [1, 2, 3, 4]
    np.testing.assert_allclose(traj.perf["step_seconds"], [0.01, 0.02, 0.03, 0.04])
    assert traj.perf["substep_seconds/move"].shape == (4,)

    assert traj.populations == ["sheep", "wolves"]
    assert traj.fields("sheep") == ["uid", "pos", "energy", "alive"]
    assert traj.steps("sheep").tolist() == [0, 1, 2, 3, 4]
    assert traj.steps("wolves").tolist() == [0, 2, 4]
    for step in range(5):
        frame = sheep_frame(step)
        order = torch.argsort(frame["uid"])
        got = traj.agents("sheep", step=step)
        assert set(got) == {"uid", "pos", "energy", "alive"}
        for name, value in frame.items():
            assert got[name].dtype == value.numpy().dtype
            np.testing.assert_array_equal(got[name], value[order].numpy())
    last = traj.agents("sheep", "pos")  # step=None: the last frame
    assert set(last) == {"uid", "pos"}
    np.testing.assert_array_equal(last["uid"], np.arange(8, 22))

    assert traj.agents("wolves", step=2)["uid"].shape == (0,)
    wolves = traj.agents("wolves", ["hunger"], step=0, as_tensor=True)
    assert torch.equal(wolves["uid"], torch.tensor([7, 19, 40]))
    assert wolves["uid"].dtype == torch.int64  # uid stored as int64 whatever it was written as
    assert torch.equal(wolves["hunger"], torch.tensor([7, 19, 40]).double() / 4)

    assert traj.env_names == ["grass", "season"] and traj.env_steps().tolist() == [0, 4]
    np.testing.assert_array_equal(traj.env("grass"), np.arange(20.0).reshape(4, 5) + 4)
    assert traj.env("season", step=0).shape == () and int(traj.env("season", step=0)) == 0
    assert torch.equal(traj.env("grass", 0, as_tensor=True), torch.arange(20.0).reshape(4, 5))


def test_layout_readable_with_plain_h5py(run_file):
    with h5py.File(run_file, "r") as f:
        assert f.attrs["format"].decode() == FORMAT  # (a fixed-length UTF-8 string: bytes in h5py)
        assert bool(f.attrs["completed"]) is True
        assert json.loads(f.attrs["params"]) == PARAMS
        g = f["agents/sheep"]
        steps, offsets, uid = g["step"][...], g["offsets"][...], g["uid"][...]
        assert offsets[0] == 0 and offsets[-1] == len(uid) == g["pos"].shape[0]
        assert len(offsets) == len(steps) + 1
        for k in range(len(steps)):
            rows = uid[offsets[k]:offsets[k + 1]]
            assert len(rows) == len(sheep_frame(int(steps[k]))["uid"])
            assert np.all(np.diff(rows) > 0), "rows of a frame are sorted by uid"
            # every field is permuted with uid
            np.testing.assert_array_equal(g["energy"][offsets[k]:offsets[k + 1]], rows * 10 + steps[k])
            # each field of each frame has a CRC-32 of the frame's step and the field's rows, in the order
            # of the sorted field names
            fields = sorted(set(g) - {"step", "offsets", "checksums"})
            start = zlib.crc32(steps[k].tobytes())
            for j, name in enumerate(fields):
                assert zlib.crc32(g[name][offsets[k]:offsets[k + 1]].tobytes(), start) == g["checksums"][k, j]
        assert g["pos"].dtype == np.float32 and g["pos"].shape[1:] == (2,)
        assert g["alive"].dtype == np.bool_
        for name in ("uid", "pos", "energy"):
            ds = g[name]
            assert ds.maxshape[0] is None and ds.chunks[0] >= 1 and ds.compression == "gzip"
        assert f["agents/sheep/uid"].chunks == (8192,)  # ~64 KiB of int64 rows
        assert f["metrics/step"][...].tolist() == [0, 1, 2, 3, 4]
        assert f["env/grass"].shape == (2, 4, 5)
        assert f["perf/substep_seconds/move"].shape == (4,)


def _datasets(f: h5py.File, root: str) -> dict[str, np.ndarray]:
    out = {}
    f[root].visititems(lambda name, obj: out.__setitem__(name, obj[...]) if isinstance(obj, h5py.Dataset) else None)
    return out


def test_identical_runs_are_bitwise_equal_outside_perf(tmp_path):
    write_run(tmp_path / "a.h5")
    write_run(tmp_path / "b.h5", perf_scale=3.0)  # a slower machine
    with h5py.File(tmp_path / "a.h5", "r") as fa, h5py.File(tmp_path / "b.h5", "r") as fb:
        for root in ("agents", "metrics", "env"):
            da, db = _datasets(fa, root), _datasets(fb, root)
            assert sorted(da) == sorted(db) and da
            for name in da:
                assert da[name].dtype == db[name].dtype and da[name].shape == db[name].shape, name
                assert da[name].tobytes() == db[name].tobytes(), f"/{root}/{name} differs"
        for key in ("model", "params", "seed", "steps", "steps_completed", "world_size", "completed"):
            assert fa.attrs[key] == fb.attrs[key]
        assert not np.array_equal(fa["perf/step_seconds"][...], fb["perf/step_seconds"][...])


def test_completed_false_when_left_by_exception(tmp_path):
    path = tmp_path / "crash.h5"
    with pytest.raises(RuntimeError, match="boom"):
        with TrajectoryWriter(path, model="m", params={}, seed=0, steps=10) as w:
            for step in range(3):
                w.write_metrics(step, {"n": step})
            assert w.steps_completed == 2  # updated as the run goes
            raise RuntimeError("boom")
    assert w.closed
    traj = read_trajectory(path)
    assert traj.attrs["completed"] is False
    assert traj.attrs["steps_completed"] == 2 and traj.attrs["steps"] == 10
    assert traj.metrics["n"].tolist() == [0, 1, 2]


def test_close_is_final(tmp_path):
    path = tmp_path / "done.h5"
    with TrajectoryWriter(path, model="m", params={}, seed=0, steps=1) as w:
        w.write_metrics(0, {"n": 1})
        w.flush()
        w.close(completed=True)
        w.close(completed=False)  # a second close does nothing
    assert read_trajectory(path).attrs["completed"] is True
    with pytest.raises(OutputError, match="is closed"):
        w.write_metrics(1, {"n": 2})


def test_unwritable_paths_are_output_errors(tmp_path):
    missing = tmp_path / "no_such_dir" / "run.h5"
    with pytest.raises(OutputError,
                       match=r"cannot create trajectory file '.*run\.h5': directory '.*no_such_dir' does not exist"):
        TrajectoryWriter(missing, model="m", params={}, seed=0, steps=1)
    assert not missing.parent.exists()
    with pytest.raises(OutputError, match="it is a directory"):
        TrajectoryWriter(tmp_path, model="m", params={}, seed=0, steps=1)
    existing = tmp_path / "old.h5"
    existing.write_bytes(b"keep me")
    with pytest.raises(OutputError, match=r"the file exists \(pass overwrite=True"):
        TrajectoryWriter(existing, model="m", params={}, seed=0, steps=1, overwrite=False)
    assert existing.read_bytes() == b"keep me"


def test_reading_non_trajectories_is_output_error(tmp_path):
    with pytest.raises(OutputError, match="no such file"):
        read_trajectory(tmp_path / "missing.h5")
    text = tmp_path / "notes.txt"
    text.write_text("hello")
    with pytest.raises(OutputError, match="not an HDF5 file"):
        read_trajectory(text)
    other = tmp_path / "other.h5"
    with h5py.File(other, "w") as f:
        f["x"] = np.arange(3)
    with pytest.raises(OutputError, match=r"is not an agentsim trajectory \(root attribute 'format' is None"):
        read_trajectory(other)
    newer = tmp_path / "newer.h5"
    with h5py.File(newer, "w") as f:
        f.attrs["format"], f.attrs["format_version"] = FORMAT, FORMAT_VERSION + 1
    newest = f"format_version {FORMAT_VERSION + 1}; this agentsim reads versions <= {FORMAT_VERSION}"
    with pytest.raises(OutputError, match=newest):
        read_trajectory(newer)


def test_write_errors_are_config_errors(tmp_path):
    w = TrajectoryWriter(tmp_path / "e.h5", model="m", params={}, seed=0, steps=3, compression=None)
    w.write_metrics(0, {"a": 1, "b": 2.0})
    with pytest.raises(ConfigError, match=r"metrics: expected the names of the first write \['a', 'b'\] "
                                          r"\(missing \['b'\], unexpected \['c'\]\)"):
        w.write_metrics(1, {"a": 1, "c": 2.0})
    with pytest.raises(ConfigError, match="metrics: step 0 is not after the last written step 0"):
        w.write_metrics(0, {"a": 1, "b": 2.0})
    with pytest.raises(ConfigError, match="'step' is reserved"):
        w.write_metrics(1, {"a": 1, "b": 2.0, "step": 1})
    with pytest.raises(ConfigError, match=r"metric 'a': expected a scalar as in the first row \(got a vector of 2 "
                                          r"entries at step 1\)"):
        w.write_metrics(1, {"a": torch.ones(2), "b": 2.0})
    with pytest.raises(ConfigError, match=r"metric 'a': expected a scalar or a vector \[K\] of K >= 1 numbers "
                                          r"\(got an array of float32 and shape \[2, 2\]\)"):
        w.write_metrics(1, {"a": torch.ones(2, 2), "b": 2.0})
    with pytest.raises(ConfigError, match="fields must include 'uid'"):
        w.write_agents(0, "p", {"x": torch.ones(3)})
    with pytest.raises(ConfigError, match=r"field 'x': expected 2 rows like 'uid' \(got shape \[3\]\)"):
        w.write_agents(0, "p", {"uid": torch.arange(2), "x": torch.ones(3)})
    with pytest.raises(ConfigError, match="field name 'offsets' is reserved"):
        w.write_agents(0, "p", {"uid": torch.arange(2), "offsets": torch.ones(2)})
    with pytest.raises(ConfigError, match="population name 'a/b'"):
        w.write_agents(0, "a/b", {"uid": torch.arange(2)})
    w.write_agents(0, "p", {"uid": torch.arange(2), "x": torch.ones(2)})
    with pytest.raises(ConfigError, match=r"field 'x': expected dtype float32 and shape \[n\] as in the first frame "
                                          r"\(got float64 \[2\]\)"):
        w.write_agents(1, "p", {"uid": torch.arange(2), "x": torch.ones(2, dtype=torch.float64)})
    with pytest.raises(ConfigError, match="bfloat16 has no numpy/HDF5 equivalent"):
        w.write_agents(1, "p", {"uid": torch.arange(2), "x": torch.ones(2, dtype=torch.bfloat16)})
    w.write_env(0, {"grid": torch.zeros(2, 2)})
    with pytest.raises(ConfigError, match=r"env 'grid': expected dtype float32 and shape \[2, 2\]"):
        w.write_env(1, {"grid": torch.zeros(3, 2)})
    w.close(completed=False)
    with pytest.raises(ConfigError, match="compression: expected one of 'gzip', 'lzf', None"):
        TrajectoryWriter(tmp_path / "c.h5", model="m", params={}, seed=0, steps=1, compression="zstd")
    with pytest.raises(ConfigError, match="params: cannot be stored as JSON"):
        TrajectoryWriter(tmp_path / "c.h5", model="m", params={"f": object()}, seed=0, steps=1)


def test_int_metric_turns_float_when_a_float_arrives(tmp_path):
    path = tmp_path / "promote.h5"
    with TrajectoryWriter(path, model="m", params={}, seed=0, steps=2, compression="lzf") as w:
        w.write_metrics(0, {"ratio": 0, "n": 5})  # e.g. `x / n if n else 0`
        w.write_metrics(1, {"ratio": 0.5, "n": 6})
        w.write_metrics(2, {"ratio": 2, "n": 7})
    traj = read_trajectory(path)
    assert traj.metrics["ratio"].dtype == np.float64 and traj.metrics["ratio"].tolist() == [0.0, 0.5, 2.0]
    assert traj.metrics["n"].dtype == np.int64 and traj.metrics["n"].tolist() == [5, 6, 7]
    assert traj.attrs["completed"] is True  # a normal exit from the with block completes


def test_reader_errors_name_valid_choices(run_file):
    traj = read_trajectory(run_file)
    with pytest.raises(ConfigError, match=r"unknown population 'sheeps'.*Perhaps you meant 'sheep'\?"):
        traj.agents("sheeps")
    with pytest.raises(ConfigError, match=r"unknown field 'poss' of population 'sheep'.*Perhaps you meant 'pos'\?"):
        traj.agents("sheep", "poss")
    with pytest.raises(ConfigError, match=r"agents 'wolves': step 3 was not recorded \(recorded: 0, 2, 4\)"):
        traj.agents("wolves", step=3)
    with pytest.raises(ConfigError, match="unknown env layer 'gras'"):
        traj.env("gras")


def test_grad_and_non_contiguous_tensors_are_written(tmp_path):
    path = tmp_path / "grad.h5"
    x = torch.randn(4, 3, requires_grad=True)
    with TrajectoryWriter(path, model="m", params={}, seed=0, steps=0) as w:
        w.write_agents(0, "p", {"uid": torch.tensor([3, 1, 2, 0]), "x": x * 2, "t": (x * 2).t().contiguous().t()})
    got = read_trajectory(path).agents("p")
    np.testing.assert_array_equal(got["x"], (x * 2).detach().numpy()[[3, 1, 2, 0]])
    np.testing.assert_array_equal(got["t"], got["x"])


def test_metric_rows_are_written_in_batches(tmp_path, monkeypatch):
    from agentsim.io import hdf5

    monkeypatch.setattr(hdf5, "_BUFFER_ROWS", 4)
    path = tmp_path / "batches.h5"
    with TrajectoryWriter(path, model="m", params={}, seed=0, steps=10) as w:
        for step in range(10):
            # an int series that turns float after the first batch reached the file
            w.write_metrics(step, {"ratio": step if step < 6 else step / 4, "n": step})
            w.write_perf(step, {"seconds": 0.5})
            if step == 4:
                assert w._file["metrics/step"].shape == (4,)  # one batch written, one row buffered
                assert w._file.attrs["steps_completed"] == 3
        w.flush()
        assert w._file["metrics/step"].shape == (10,) and w._file.attrs["steps_completed"] == 9
    traj = read_trajectory(path)
    assert traj.metrics["step"].tolist() == list(range(10))
    assert traj.metrics["ratio"].dtype == np.float64
    assert traj.metrics["ratio"].tolist() == [0, 1, 2, 3, 4, 5, 1.5, 1.75, 2.0, 2.25]
    assert traj.metrics["n"].dtype == np.int64 and traj.metrics["n"].tolist() == list(range(10))
    assert traj.perf["seconds"].tolist() == [0.5] * 10


def test_file_appears_at_its_path_on_the_first_flush_and_stale_temporaries_go(tmp_path):
    import subprocess
    import sys

    path = tmp_path / "run.h5"
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale = tmp_path / f".run.h5.creating{int(dead.stdout)}"  # left by a writer killed before its first flush
    stale.write_bytes(b"partial")
    path.write_bytes(b"an older run")  # replaced only once the new file is flushed
    w = TrajectoryWriter(path, model="m", params={}, seed=0, steps=2)
    assert not stale.exists()
    assert path.read_bytes() == b"an older run"
    w.write_metrics(0, {"n": 1})
    w.write_agents(0, "a", {"uid": torch.arange(3)})
    w.flush()
    assert read_trajectory(path).metrics["n"].tolist() == [1]
    assert [p.name for p in tmp_path.iterdir()] == ["run.h5"]
    w.close(completed=True)

    # a writer closed without a flush (an exception in the first step) still leaves its file
    other = tmp_path / "other.h5"
    with pytest.raises(RuntimeError), TrajectoryWriter(other, model="m", params={}, seed=0, steps=2) as w2:
        w2.write_metrics(0, {"n": 1})
        raise RuntimeError("model failed")
    traj = read_trajectory(other)
    assert traj.attrs["completed"] is False and traj.metrics["n"].tolist() == [1]


def _write_vectors(w: TrajectoryWriter, steps: range) -> None:
    for step in steps:
        w.write_metrics(step, {
            "n": step,
            "hist": np.asarray([step, 2 * step, 3], dtype=np.int64),  # int64 [T, 3] with edges
            "share": torch.tensor([0.25 * step, 1.0 - 0.25 * step]),  # a 1-D tensor: float64 [T, 2]
            "one": [float(step)],  # a list of one entry: a vector [T, 1], not a scalar
            "grows": np.asarray([step, step]) if step < 3 else np.asarray([step / 2, step]),  # int, then float
        }, edges={"hist": [-np.inf, 0.0, 1.0, np.inf]})


def test_vector_metrics_are_t_by_k_datasets_with_their_edges(tmp_path, monkeypatch):
    from agentsim.io import hdf5

    monkeypatch.setattr(hdf5, "_BUFFER_ROWS", 2)  # several batches, one of them promoting 'grows' to float
    path = tmp_path / "vec.h5"
    with TrajectoryWriter(path, model="m", params={}, seed=0, steps=5, compression=None) as w:
        _write_vectors(w, range(6))
    traj = read_trajectory(path)
    m = traj.metrics
    assert m["hist"].dtype == np.int64 and m["hist"].tolist() == [[s, 2 * s, 3] for s in range(6)]
    assert m["share"].dtype == np.float64 and m["share"].shape == (6, 2) and m["one"].shape == (6, 1)
    assert m["grows"].dtype == np.float64 and m["grows"][:, 1].tolist() == list(range(6))
    assert m["grows"][:, 0].tolist() == [0, 1, 2, 1.5, 2.0, 2.5]
    assert list(traj.edges) == ["hist"] and traj.edges["hist"].tolist() == [-np.inf, 0.0, 1.0, np.inf]
    with h5py.File(path, "r") as f:  # plain h5py: resizable along T like the scalar series
        assert f["metrics/hist"].maxshape == (None, 3) and f["metrics/n"].maxshape == (None,)
        assert f["metrics/hist"].attrs["edges"].tolist() == [-np.inf, 0.0, 1.0, np.inf]


def test_vector_shapes_and_edges_are_checked(tmp_path):
    w = TrajectoryWriter(tmp_path / "e.h5", model="m", params={}, seed=0, steps=3, compression=None)
    w.write_metrics(0, {"v": np.ones(3), "s": 1.0})
    with pytest.raises(ConfigError, match=r"metric 'v': expected a vector of 3 entries as in the first row \(got a "
                                          r"vector of 2 entries at step 1\); a vector metric has the same K"):
        w.write_metrics(1, {"v": np.ones(2), "s": 1.0})
    with pytest.raises(ConfigError, match=r"metric 'v': expected a vector of 3 entries as in the first row \(got a "
                                          r"scalar at step 1\)"):
        w.write_metrics(1, {"v": 1.0, "s": 1.0})
    with pytest.raises(ConfigError, match=r"metric 'v': expected a scalar or a vector \[K\] of K >= 1 numbers "
                                          r"\(got an array of float64 and shape \[0\]\)"):
        w.write_metrics(1, {"v": np.ones(0), "s": 1.0})
    with pytest.raises(ConfigError, match=r"metrics edges of 'v': expected 4 bin edges for a vector metric of this "
                                          r"row \(got 3 for a vector of 3 entries\)"):
        w.write_metrics(1, {"v": np.ones(3), "s": 1.0}, edges={"v": [0, 1, 2]})
    with pytest.raises(ConfigError, match=r"metrics edges of 's': expected K \+ 1 bin edges"):
        w.write_metrics(1, {"v": np.ones(3), "s": 1.0}, edges={"s": [0, 1]})
    w.close(completed=False)


def test_a_continued_file_truncates_and_appends_t_by_k_rows(tmp_path):
    full, part = tmp_path / "full.h5", tmp_path / "part.h5"
    with TrajectoryWriter(full, model="m", params={}, seed=0, steps=5, compression=None) as w:
        _write_vectors(w, range(6))
    with TrajectoryWriter(part, model="m", params={}, seed=0, steps=5, compression=None) as w:
        _write_vectors(w, range(5))  # "killed" after step 4
        w.close(completed=False)
    w = TrajectoryWriter.continue_file(part, model="m", params={}, seed=0, before=3, steps=5)
    with pytest.raises(ConfigError, match=r"metric 'hist': expected a vector of 3 entries as in the first row"):
        w.write_metrics(3, {"n": 3, "hist": np.ones(4, dtype=np.int64), "share": np.ones(2), "one": [1.0],
                            "grows": np.ones(2)})
    _write_vectors(w, range(3, 6))  # rows 3 and 4 dropped, written again, then 5
    w.close(completed=True)
    a, b = read_trajectory(full), read_trajectory(part)
    assert sorted(a.metrics) == sorted(b.metrics)
    for name in a.metrics:
        assert a.metrics[name].tobytes() == b.metrics[name].tobytes() and a.metrics[name].shape == \
            b.metrics[name].shape, name
    assert b.edges["hist"].tolist() == a.edges["hist"].tolist()


@pytest.mark.long
def test_a_long_writer_keeps_its_memory_bounded(tmp_path):
    # HDF5's default caches (1 MiB of chunks per dataset, a metadata cache growing to 32 MiB) made a
    # writer of 25 series grow by about 210 bytes a row, without end; the writer bounds both.
    def rss_kb() -> int:
        with open("/proc/self/status") as f:
            return int(f.read().split("VmRSS:")[1].split()[0])

    if not os.path.exists("/proc/self/status"):
        pytest.skip("reads the resident set size from /proc")
    w = TrajectoryWriter(tmp_path / "long.h5", model="m", params={}, seed=1, steps=10**6, compression=None)
    metrics = {f"m{i}": 1.5 for i in range(10)}
    perf = {f"p{i}": 0.5 for i in range(15)}
    sizes = {}
    for step in range(120_001):
        w.write_metrics(step, metrics)
        if step:
            w.write_perf(step, perf)
        if step % 2000 == 0:
            w.flush()
        if step in (40_000, 120_000):
            sizes[step] = rss_kb()
    w.close(completed=True)
    assert sizes[120_000] - sizes[40_000] < 2048, sizes  # KB; unbounded caches: about 16,000
    assert len(read_trajectory(tmp_path / "long.h5").metrics["step"]) == 120_001
