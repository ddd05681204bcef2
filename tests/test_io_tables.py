"""agentsim.io.read_metrics (pandas) and read_frames (xarray), checked value by value against h5py."""

from __future__ import annotations

import json
import math
import sys

import h5py
import numpy as np
import pytest
import torch

import agentsim as asim
from agentsim.errors import ConfigError
from agentsim.io import read_frames, read_metrics

pd = pytest.importorskip("pandas")
xr = pytest.importorskip("xarray")

# A small model with every kind of field and metric: a bool field, an int field, a float
# field [n, 2], births and deaths (so the uids of the frames change), a vector metric [n, 3]
# and a histogram metric.
churn = asim.Model("churn", params={"p_die": asim.Param(0.2, "death probability per step", ge=0.0, le=1.0)})


@churn.substep(writes=["cell.pos", "cell.age", "cell.old"], births=["cell"], deaths=["cell"])
def live(ctx: asim.Context) -> None:
    c = ctx["cell"]
    c["pos"] = c["pos"] + ctx.rng.normal(c["uid"], draws=2)
    c["age"] = c["age"] + 1
    c["old"] = c["age"] >= 2
    dies = ctx.rng.bernoulli(c["uid"], "die", p=ctx.params["p_die"])
    parents = ctx.rng.bernoulli(c["uid"], "birth", p=0.25)
    ctx.spawn("cell", c["uid"][parents], {"pos": c["pos"][parents], "age": torch.zeros_like(c["age"][parents]),
                                          "old": torch.zeros_like(c["old"][parents])})
    ctx.kill("cell", dies)


@churn.init
def init(ic: asim.InitContext) -> asim.Box:
    uid = ic.uids("cell", ic.n_agents)
    pos = ic.rng.uniform(uid, "pos", draws=2) * 10
    ic.add("cell", uid=uid, pos=pos, age=torch.zeros_like(uid), old=torch.zeros(len(uid), dtype=torch.bool))
    return asim.Box((10.0, 10.0), periodic=False)


@churn.metric()
def by_age(state) -> torch.Tensor:
    """Agents of age 0, 1 and >= 2: a vector metric [3]."""
    age = state["cell"]["age"]
    return torch.stack([age == 0, age == 1, age >= 2], dim=1).long()


@churn.metric(hist=[0.0, 2.0, 5.0, math.inf])
def x_hist(state) -> torch.Tensor:
    return state["cell"]["pos"][:, 0].double()


@churn.metric(reduce="mean")
def mean_age(state) -> torch.Tensor:
    return state["cell"]["age"].double()


@pytest.fixture(scope="module")
def churn_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("tables") / "churn.h5"
    asim.run(churn, agents=40, steps=7, seed=3, out=path, every=2)
    return str(path)


@pytest.fixture(scope="module")
def wolfsheep_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("tables") / "ws.h5"
    asim.run("wolfsheep", agents=120, steps=6, seed=2, out=path, every=3)
    return str(path)


def _frames_by_h5py(path: str, population: str) -> tuple[np.ndarray, list[dict[str, np.ndarray]]]:
    """Brute force: each frame's rows as plain h5py reads them."""
    with h5py.File(path, "r") as f:
        g = f["agents"][population]
        steps, offsets = g["step"][...], g["offsets"][...]
        fields = [k for k in g.keys() if k not in ("step", "offsets", "checksums")]
        frames = [{name: g[name][offsets[k]:offsets[k + 1]] for name in fields} for k in range(len(steps))]
    return steps, frames


def _check_frames(path: str, population: str, ds) -> None:
    steps, frames = _frames_by_h5py(path, population)
    assert ds["step"].values.tolist() == steps.tolist()
    union = sorted(set().union(*(set(fr["uid"].tolist()) for fr in frames)))
    assert ds["uid"].values.tolist() == union
    assert ds["present"].dtype == bool
    for k, frame in enumerate(frames):
        rows = {int(u): i for i, u in enumerate(frame["uid"])}
        for j, uid in enumerate(union):
            here = uid in rows
            assert bool(ds["present"].values[k, j]) == here
            for name, values in frame.items():
                if name == "uid":
                    continue
                got = ds[name].values[k, j]
                if here:
                    want = values[rows[uid]]
                    assert np.array_equal(np.asarray(got), np.asarray(want, dtype=got.dtype))
                    assert np.array_equal(np.asarray(got).astype(values.dtype), want)  # exact round trip
                else:
                    assert np.isnan(got).all()
    for name, values in frames[0].items():
        if name == "uid":
            continue
        var = ds[name]
        assert var.dims[:2] == ("step", "uid")
        assert var.shape[2:] == values.shape[1:]
        assert var.dims[2:] == tuple(f"{name}_dim_{i}" for i in range(1, values.ndim))
        # floats keep their dtype; ints and bools become float64 as xarray's reindex does
        assert var.dtype == (values.dtype if values.dtype.kind == "f" else np.float64)


def test_read_metrics_equals_h5py(churn_file):
    df = read_metrics(churn_file)
    with h5py.File(churn_file, "r") as f:
        m = f["metrics"]
        assert df.index.name == "step"
        assert df.index.tolist() == m["step"][...].tolist()
        assert df.index.dtype == np.int64
        scalars = [k for k in m if k not in ("step", "checksums") and m[k].ndim == 1]
        vectors = [k for k in m if m[k].ndim == 2]
        assert sorted(vectors) == ["by_age", "x_hist"]
        expected_columns = set(scalars) | {f"{k}[{i}]" for k in vectors for i in range(m[k].shape[1])}
        assert set(df.columns) == expected_columns
        for name in scalars:
            assert df[name].dtype == m[name].dtype
            assert np.array_equal(df[name].to_numpy(), m[name][...])
        for name in vectors:
            values = m[name][...]
            assert df.attrs["vector_columns"][name] == [f"{name}[{i}]" for i in range(values.shape[1])]
            for i in range(values.shape[1]):
                assert np.array_equal(df[f"{name}[{i}]"].to_numpy(), values[:, i])
        assert df.attrs["edges"] == {"x_hist": m["x_hist"].attrs["edges"].tolist()}
        assert df.attrs["edges"]["x_hist"][-1] == math.inf
        assert df.attrs["model"] == f.attrs["model"].decode() == "churn"
        assert df.attrs["seed"] == 3
        assert df.attrs["params"] == json.loads(f.attrs["params"])
        assert df.attrs["completed"] is True
    # the counts of the vector metric add up to the population, row by row
    assert (df.filter(like="by_age[").sum(axis=1) == df["n_cell"]).all()


def test_read_metrics_builtin_histogram(tmp_path):
    path = tmp_path / "sg.h5"
    asim.run("sugarscape", agents=60, steps=2, seed=1, out=path)
    df = read_metrics(path)
    with h5py.File(path, "r") as f:
        hist = f["metrics/wealth_hist"][...]
        assert df.attrs["edges"]["wealth_hist"] == f["metrics/wealth_hist"].attrs["edges"].tolist()
        assert np.array_equal(df[df.attrs["vector_columns"]["wealth_hist"]].to_numpy(), hist)
        assert np.array_equal(df["gini"].to_numpy(), f["metrics/gini"][...])


def test_read_frames_equals_h5py(churn_file):
    ds = read_frames(churn_file)
    _check_frames(churn_file, "cell", ds)
    assert ds["pos"].dims == ("step", "uid", "pos_dim_1")
    # births and deaths: agents come and go between frames
    present = ds["present"].values
    assert not present.all() and len(ds["uid"]) > present.sum(axis=1).max()
    with h5py.File(churn_file, "r") as f:
        assert ds.attrs["model"] == "churn" and ds.attrs["seed"] == 3 and ds.attrs["population"] == "cell"
        assert ds.attrs["params"] == f.attrs["params"].decode()
        assert ds.attrs["completed"] == 1
    # the frames' agent counts are the metric n_cell at the frame steps
    n = read_metrics(churn_file)["n_cell"]
    assert ds["present"].sum("uid").values.tolist() == n.loc[ds["step"].values].tolist()


def test_read_frames_two_populations_and_env(wolfsheep_file):
    with pytest.raises(ConfigError, match="2 populations .*sheep, wolf"):
        read_frames(wolfsheep_file)
    with pytest.raises(ConfigError, match="unknown population 'sheeep'.*sheep"):
        read_frames(wolfsheep_file, population="sheeep")
    for population in ("sheep", "wolf"):
        ds = read_frames(wolfsheep_file, population=population)
        _check_frames(wolfsheep_file, population, ds)
        with h5py.File(wolfsheep_file, "r") as f:
            env = f["env"]
            assert ds["env_step"].values.tolist() == env["step"][...].tolist()
            for name in ("grass", "countdown"):
                var = ds[f"env_{name}"]
                assert var.dims == ("env_step", f"env_{name}_dim_0", f"env_{name}_dim_1")
                assert var.dtype == env[name].dtype
                assert np.array_equal(var.values, env[name][...])


def test_read_frames_without_env(tmp_path):
    path = tmp_path / "walk.h5"
    asim.run("randomwalk", agents=30, steps=3, seed=1, out=path, record=["walker"])
    ds = read_frames(path)
    assert "env_step" not in ds.coords
    _check_frames(str(path), "walker", ds)


@pytest.mark.parametrize("module, function", [("pandas", read_metrics), ("xarray", read_frames)])
def test_missing_package_says_how_to_install(monkeypatch, churn_file, module, function):
    monkeypatch.setitem(sys.modules, module, None)  # import of a None entry raises ImportError
    with pytest.raises(ImportError, match=r"needs " + module + r'.*pip install "agentsim\[analysis\]"'):
        function(churn_file)
