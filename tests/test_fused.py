"""The fused radius-neighbor kernel (agentsim.space.fused) against the torch path, bit for bit.

On this CPU-only machine the Triton kernels run in Triton's interpreter (TRITON_INTERPRET=1,
AGENTSIM_FUSED=always): the same kernel source the GPU compiles, with NumPy's IEEE float32
arithmetic. The torch path is the reference. Sizes are small: the interpreter runs the kernel
one block at a time in Python.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from agentsim import Box, Simulation, get_model, neighbor_reduce
from agentsim.core import portable
from agentsim.space import fused
from agentsim.space.fused.radius import kernel_source
from agentsim.space.fused.rule import FieldSpec, Untranslatable, translate

triton = pytest.importorskip("triton", reason="the fused kernels need Triton (the gpu extra)")
pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="Triton's interpreter on a CPU-only machine; "
                                "with a GPU the kernels are compiled and tests/test_cli.py compares GPU and CPU runs")


@pytest.fixture
def interpreted(monkeypatch):
    """Kernels through Triton's interpreter on the CPU; the env var is read at each call."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setenv("AGENTSIM_FUSED", "always")


def _bits(t: torch.Tensor) -> np.ndarray:
    a = t.detach().contiguous().numpy()
    return a.view(np.int32) if a.dtype == np.float32 else a


def _same(a: dict, b: dict) -> None:
    assert sorted(a) == sorted(b)
    for k in a:
        assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape, k
        assert np.array_equal(_bits(a[k]), _bits(b[k])), f"message {k!r} differs"


def boids_rule(pair):
    close = (pair.dist2 < 1.0).unsqueeze(1)
    return {"cohere": pair.delta, "separate": pair.delta * close, "match": pair.source["heading"], "n": True}


def circles_rule(pair):
    sep = pair.dist
    in_range = (sep < 2.0) & (sep > 0)
    k_over_sep = torch.where(in_range, portable.sin(sep / 2.0 * (3.141 * -2)) * 0.05 / sep, 0.0)
    return {"force": pair.delta * k_over_sep.unsqueeze(1), "n": in_range}


def mixed_rule(pair):
    """Integer and bool fields, a target field, a column of delta, casts and a logical not."""
    older = pair.source["age"] > pair.target["age"]
    return {"older": older, "ages": pair.source["age"] * 2 + 1, "sick": pair.source["sick"],
            "x": pair.delta[:, 0] * pair.source["sick"].float(), "quiet": ~pair.source["sick"]}


def _agents(n: int, dims: int, side: float, seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {"pos": torch.rand(n, dims, generator=g) * side, "heading": torch.randn(n, 2, generator=g),
            "uid": torch.randperm(n, generator=g) * 3 + 5, "age": torch.randint(0, 90, (n,), generator=g),
            "sick": torch.rand(n, generator=g) < 0.3}


def _both(monkeypatch, *args, **kwargs):
    monkeypatch.setenv("AGENTSIM_FUSED", "never")
    a = neighbor_reduce(*args, **kwargs)
    monkeypatch.setenv("AGENTSIM_FUSED", "always")
    b = neighbor_reduce(*args, **kwargs)
    assert fused.status() == "fused", fused.status()
    return a, b


@pytest.mark.parametrize("periodic, dims, rule, reduce, radius", [
    pytest.param(True, 2, boids_rule, {"n": "count"}, 3.0, marks=pytest.mark.long),
    (False, 3, circles_rule, {"n": "count"}, 2.0),
    pytest.param(True, 3, circles_rule, {"n": "count", "force": "mean"}, 2.0, marks=pytest.mark.long),
    (False, 2, mixed_rule, {"older": "count", "quiet": "count", "ages": "mean"}, 2.5),
])
def test_fused_equals_torch_bit_for_bit(interpreted, monkeypatch, periodic, dims, rule, reduce, radius):
    n = 300 if dims == 2 else 250
    side = (n / (1.0 if dims == 3 else 2.0)) ** (1 / dims)
    agents = _agents(n, dims, side, seed=dims + periodic)
    a, b = _both(monkeypatch, Box((side,) * dims, periodic=periodic), agents, rule, reduce, radius=radius)
    _same(a, b)
    assert int(a["n" if "n" in a else "older"].sum()) > 0  # pairs were found


def test_fused_other_population_and_targets_subset(interpreted, monkeypatch):
    box = Box((12.0, 12.0), periodic=True)
    wolves, sheep = _agents(60, 2, 12.0, seed=1), _agents(200, 2, 12.0, seed=2)

    def rule(pair):
        return {"pull": pair.delta * pair.source["sick"].unsqueeze(1), "n": True}

    a, b = _both(monkeypatch, box, wolves, rule, {"n": "count"}, sources=sheep, radius=2.0, n_targets=40)
    _same(a, b)
    assert a["pull"].shape == (40, 2)


def test_fused_single_message_and_empty_neighborhoods(interpreted, monkeypatch):
    box = Box((50.0, 50.0), periodic=False)
    agents = _agents(40, 2, 50.0, seed=3)  # sparse: most points have no neighbor
    a, b = _both(monkeypatch, box, agents, lambda p: p.source["heading"], "sum", radius=1.5)
    assert a.shape == (40, 2) and np.array_equal(_bits(a), _bits(b))


def test_untranslatable_rules_take_the_torch_path_and_say_why(interpreted, monkeypatch):
    box = Box((10.0, 10.0))
    agents = _agents(50, 2, 10.0, seed=4)
    reference = None
    for rule, why in [(lambda p: torch.sin(p.dist), "sin is not translated"),
                      (lambda p: p.delta.sum(1), "sum is not translated"),
                      (lambda p: p.dist if float(p.dist.sum()) > 0 else p.dist2, "cannot be traced")]:
        out = neighbor_reduce(box, agents, rule, "sum", radius=2.0)
        assert fused.status().startswith("torch:") and why in fused.status(), fused.status()
        monkeypatch.setenv("AGENTSIM_FUSED", "never")
        reference = neighbor_reduce(box, agents, rule, "sum", radius=2.0)
        monkeypatch.setenv("AGENTSIM_FUSED", "always")
        assert np.array_equal(_bits(out), _bits(reference))
    out = neighbor_reduce(box, agents, lambda p: p.dist, "max", radius=2.0)
    assert "reduction 'max'" in fused.status()


def test_float64_positions_keep_the_torch_path(interpreted):
    box = Box((10.0, 10.0))
    agents = {"pos": torch.rand(30, 2, dtype=torch.float64) * 10}
    neighbor_reduce(box, agents, lambda p: p.dist2, "sum", radius=2.0)
    assert "float64" in fused.status()


def test_translation_refuses_what_it_does_not_cover():
    spec = {("source", "w"): FieldSpec("source", "w", torch.float32, 1, False)}

    def fields(side, name):
        return spec[(side, name)]

    tr = translate(lambda p: {"a": p.delta * p.source["w"].unsqueeze(1), "n": True}, 2, fields)
    assert tr.messages["n"] is True and len(tr.messages["a"][0]) == 2
    assert [f.name for f in tr.fields] == ["w"]
    with pytest.raises(Untranslatable, match="exp is not translated.*portable"):
        translate(lambda p: torch.exp(p.dist2), 2, fields)
    with pytest.raises(Untranslatable, match="floordiv is not translated"):
        translate(lambda p: p.source["w"].long() // 2, 2, fields)
    source = kernel_source(tr, 2, {"a": "sum", "n": "count"})
    assert "div_rn" not in source or "PERIODIC" in source
    assert "tl.math.sqrt_rn" not in source  # dist not used


def test_kernel_source_is_cached_as_a_file(interpreted, monkeypatch, tmp_path):
    monkeypatch.setenv("AGENTSIM_KERNEL_DIR", str(tmp_path))
    from agentsim.space.fused import radius
    radius._LOADED.clear()
    radius._TRANSLATIONS.clear()  # (a cached translation holds its compiled kernel)
    neighbor_reduce(Box((8.0, 8.0)), _agents(20, 2, 8.0, seed=5), lambda p: p.dist2 * 3.0, "sum", radius=2.0)
    files = list((tmp_path / "fused").glob("radius_*.py"))
    assert len(files) == 1 and "Do not edit" in files[0].read_text()


def test_bad_mode_is_refused(monkeypatch):
    monkeypatch.setenv("AGENTSIM_FUSED", "sometimes")
    with pytest.raises(ValueError, match="auto, never, always"):
        fused.mode()


@pytest.mark.parametrize("model, agents", [("circles", 150), ("boids", 150)])
def test_model_runs_identical_through_the_kernel(interpreted, monkeypatch, model, agents):
    """A whole run, fused (Triton interpreter) and torch: every metric and field the same bits."""
    monkeypatch.setenv("AGENTSIM_FUSED", "never")
    ref = Simulation(get_model(model), agents=agents, seed=3)
    ref_metrics = ref.run(2).metrics
    monkeypatch.setenv("AGENTSIM_FUSED", "always")
    sim = Simulation(get_model(model), agents=agents, seed=3)
    metrics = sim.run(2).metrics
    assert fused.status() == "fused"
    for k in ref_metrics:
        assert np.array_equal(ref_metrics[k], metrics[k]), k
    for name, pop in ref.state.populations.items():
        for field in pop.keys():
            assert np.array_equal(_bits(pop[field]), _bits(sim.state[name][field])), f"{name}.{field}"


# --------------------------------------------------------------------------- portable math
def test_portable_sqrt_is_correctly_rounded():
    x = torch.rand(100_000, generator=torch.Generator().manual_seed(0)) * 100
    exact = torch.from_numpy(np.sqrt(x.numpy().astype(np.float64)).astype(np.float32))
    assert torch.equal(portable.sqrt(x), exact)
    g = x[:100].clone().requires_grad_(True)
    y = portable.sqrt(g)
    assert torch.equal(y.detach(), exact[:100])
    y.sum().backward()
    assert torch.allclose(g.grad, 0.5 / exact[:100])


@pytest.mark.parametrize("fn, ref", [(portable.sin, np.sin), (portable.cos, np.cos)])
def test_portable_sin_cos_accuracy(fn, ref):
    x = torch.linspace(-3000.0, 3000.0, 400_001)
    got = fn(x).double().numpy()
    want = ref(x.double().numpy())
    assert np.abs(got - want).max() < 4 * np.finfo(np.float32).eps
    assert fn(torch.tensor([0.0])).item() == (0.0 if fn is portable.sin else 1.0)


@pytest.mark.timeout(300)
@pytest.mark.long
@pytest.mark.parametrize("partition", ["data", "spatial"])
def test_fused_on_two_processes_equals_one_process_through_torch(interpreted, monkeypatch, tmp_path, partition):
    """Halo agents reach the kernel as sources (ctx.neighbors(pop)): 2 processes through the kernel
    write the file 1 process writes through the torch ops, bit for bit."""
    from equivalence import assert_same_bits, h5_datasets

    from agentsim import run

    monkeypatch.setenv("AGENTSIM_FUSED", "never")
    run("circles", agents=160, steps=3, out=tmp_path / "one.h5")
    monkeypatch.setenv("AGENTSIM_FUSED", "always")  # inherited by the ranks, as TRITON_INTERPRET is
    monkeypatch.delenv("AGENTSIM_KERNEL_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # where the ranks write the kernel source
    run("circles", agents=160, steps=3, nprocs=2, partition=partition, out=tmp_path / "two.h5")
    assert list((tmp_path / "cache" / "agentsim" / "fused").glob("radius_*.py"))  # the ranks ran the kernel
    assert_same_bits(h5_datasets(str(tmp_path / "one.h5")), h5_datasets(str(tmp_path / "two.h5")), partition)


def test_cached_translation_follows_changed_constants_and_fields(interpreted, monkeypatch):
    """A rule is translated once per set of baked-in values: a changed parameter or field dtype
    gives a new kernel, never the stale one."""
    box = Box((10.0, 10.0))
    agents = _agents(60, 2, 10.0, seed=6)
    p = {"scale": 1.0}

    def rule(pair):
        return {"w": pair.dist2 * p["scale"] + pair.source["age"]}

    for scale, age_dtype in [(1.0, torch.int64), (3.0, torch.int64), (3.0, torch.int32)]:
        p["scale"] = scale
        agents["age"] = agents["age"].to(age_dtype)
        a, b = _both(monkeypatch, box, agents, rule, "sum", radius=2.0)
        _same(a, b)


@pytest.mark.parametrize("side, radius", [(5.0, 2.0), (3.0, 1.0), (7.0, 3.4)])
def test_fused_small_periodic_boxes(interpreted, monkeypatch, side, radius):
    """Boxes of 2 or 3 cells per dim, where several offsets wrap onto one cell (each pair once)."""
    agents = _agents(40, 2, side, seed=7)
    a, b = _both(monkeypatch, Box((side, side), periodic=True), agents, boids_rule, {"n": "count"}, radius=radius)
    _same(a, b)
