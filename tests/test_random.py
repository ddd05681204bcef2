"""Counter-based RNG: known answer, order independence, statistical quality."""

import math

import pytest
import torch
from scipy import stats

from agentsim.core.random import GOLDEN, CounterRNG, mix64, mix64_int

MASK = (1 << 64) - 1


def test_splitmix64_known_answer():
    # SplitMix64 seeded with 0: the first output is mix(0 + golden gamma).
    assert mix64_int(GOLDEN) & MASK == 0xE220A8397B1DCDAF
    assert int(mix64(torch.tensor([GOLDEN]))[0]) & MASK == 0xE220A8397B1DCDAF


def test_tensor_and_int_mix_agree():
    z = torch.tensor([0, 1, -1, 123456789, -(1 << 63), (1 << 63) - 1], dtype=torch.int64)
    assert [int(v) for v in mix64(z)] == [mix64_int(int(v)) for v in z]


@pytest.mark.parametrize("method", ["uniform", "normal", "bits"])
def test_invariant_under_permutation_and_slicing(method):
    rng = CounterRNG(42)
    uid = torch.arange(10_000) * 7 + 3
    full = getattr(rng, method)(uid, 5, "s")
    perm = torch.randperm(uid.numel(), generator=torch.Generator().manual_seed(0))
    assert torch.equal(getattr(rng, method)(uid[perm], 5, "s"), full[perm])
    assert torch.equal(getattr(rng, method)(uid[100:200], 5, "s"), full[100:200])


def test_draws_match_single_draws():
    rng = CounterRNG(1)
    uid = torch.arange(100)
    many = rng.uniform(uid, 3, "x", draws=4)
    for d in range(4):
        assert torch.equal(many[:, d], rng.uniform(uid, 3, "x", draw=d))


def test_streams_steps_seeds_differ():
    uid = torch.arange(1000)
    a = CounterRNG(1).uniform(uid, 0, "a")
    assert not torch.equal(a, CounterRNG(1).uniform(uid, 0, "b"))
    assert not torch.equal(a, CounterRNG(1).uniform(uid, 1, "a"))
    assert not torch.equal(a, CounterRNG(2).uniform(uid, 0, "a"))
    assert torch.equal(a, CounterRNG(1).uniform(uid, 0, "a"))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_uniform_moments_and_chi_square(dtype):
    n = 200_000
    u = CounterRNG(7).uniform(torch.arange(n), 11, "q", dtype=dtype).double()
    assert u.min() >= 0 and u.max() < 1
    assert abs(u.mean().item() - 0.5) < 5 * math.sqrt(1 / 12 / n)
    assert abs(u.var().item() - 1 / 12) < 0.002
    counts = torch.histc(u, bins=100, min=0, max=1).numpy()
    assert stats.chisquare(counts).pvalue > 1e-4


def test_uniform_bits_are_independent_across_ids():
    # Lag-1 correlation between consecutive uids (what a weak hash would fail).
    u = CounterRNG(3).uniform(torch.arange(200_000), 0, "c")
    r = torch.corrcoef(torch.stack([u[:-1], u[1:]]))[0, 1].item()
    assert abs(r) < 0.01


def test_normal_moments_and_ks():
    z = CounterRNG(9).normal(torch.arange(100_000), 2, "n")
    assert abs(z.mean().item()) < 0.02
    assert abs(z.std().item() - 1) < 0.02
    assert stats.kstest(z.numpy(), "norm").pvalue > 1e-4


def test_integers_range_and_uniformity():
    k = CounterRNG(5).integers(torch.arange(80_000), 0, "i", 8)
    assert k.min() == 0 and k.max() == 7
    counts = torch.bincount(k, minlength=8).numpy()
    assert stats.chisquare(counts).pvalue > 1e-4
    high = torch.tensor([1, 2, 3] * 10)
    k2 = CounterRNG(5).integers(torch.arange(30), 0, "i", high)
    assert bool((k2 < high).all()) and bool((k2 >= 0).all())


def test_bad_arguments():
    with pytest.raises(TypeError, match="seed must be an int"):
        CounterRNG(1.5)
    with pytest.raises(ValueError, match="high must be >= 1"):
        CounterRNG(1).integers(torch.arange(3), 0, "x", 0)
    with pytest.raises(ValueError, match="draws needs an int high"):
        CounterRNG(1).integers(torch.arange(3), 0, "x", torch.tensor([2, 3, 4]), draws=2)
    with pytest.raises(TypeError, match="stream must be"):
        CounterRNG(1).uniform(torch.arange(3), 0, 1.5)


# ---------------------------------------------------------------- the compiled kernel (agentsim._native.rng)
@pytest.fixture(scope="module")
def built_kernel():
    from agentsim._native.rng import kernel

    k = kernel()  # with AGENTSIM_REQUIRE_KERNELS=1 (CI) a missing library raises here: fail, not skip
    if k is None:
        pytest.skip("the random-number kernel could not be built here (no C compiler)")
    return k


@pytest.mark.parametrize("n", [4096, 4099, 70_001, 300_000])
@pytest.mark.parametrize(("method", "kwargs"), [
    ("bits", {}), ("bits", {"draw": 3, "draws": 5}),
    ("uniform", {}), ("uniform", {"draws": 2}), ("uniform", {"dtype": torch.float32, "draw": 1, "draws": 3}),
    ("normal", {}), ("normal", {"draw": 2, "draws": 3}), ("normal", {"draws": 2, "dtype": torch.float32}),
    ("normal", {"draws": 2, "dtype": torch.float32, "mean": (0.25, -3.0), "std": 0.7}),
    ("normal", {"draw": 1, "mean": 1e-3}), ("normal", {"draws": 3, "std": 2.5}),
    ("normal", {"paired": True}), ("normal", {"draw": 2, "draws": 3, "paired": True}),
    ("normal", {"draw": 3, "draws": 4, "dtype": torch.float32, "mean": (1.0, 2.0, 3.0, 4.0), "paired": True}),
    ("normal", {"draw": 1, "draws": 2, "std": 0.5, "paired": True}),
    ("integers", {"high": 7}), ("integers", {"high": 1, "draw": 4}), ("integers", {"high": 10**15 + 3, "draws": 2}),
    ("integers", {"high": 2**61 + 1, "draw": 2, "draws": 3}),
])
def test_kernel_gives_the_bits_of_the_torch_ops(built_kernel, torch_ops, n, method, kwargs):
    rng = CounterRNG(-12345)
    ids = torch.arange(n) * 7919 - 10**12  # negative ids too
    fused = getattr(rng, method)(ids, 77, "stream", **kwargs)
    eager = torch_ops(lambda: getattr(rng, method)(ids, 77, "stream", **kwargs), "AGENTSIM_RNG_KERNEL")
    assert fused.dtype == eager.dtype and fused.shape == eager.shape
    assert torch.equal(fused.view(torch.int64 if fused.dtype == torch.float64 else fused.dtype),
                       eager.view(torch.int64 if eager.dtype == torch.float64 else eager.dtype))  # -0.0 too


def test_kernel_takes_any_id_layout(built_kernel):
    rng = CounterRNG(3)
    ids = (torch.arange(20_000) * 5).reshape(100, 200).t()  # non-contiguous, 2-D
    assert torch.equal(rng.normal(ids, 1, "s", draws=2), rng.normal(ids.contiguous(), 1, "s", draws=2))
    assert rng.normal(ids, 1, "s", draws=2).shape == (200, 100, 2)
    assert torch.equal(rng.uniform(ids.to(torch.int32), 1, "s"), rng.uniform(ids, 1, "s"))


def test_box_muller_is_the_textbook_transform_to_a_few_ulp():
    from agentsim._native.rng import box_muller

    g = torch.Generator().manual_seed(0)
    u1 = torch.cat([torch.rand(1_000_000, dtype=torch.float64, generator=g),
                    torch.tensor([0.0, 1 - 2**-53, 0.5, 2**-53], dtype=torch.float64)])
    u2 = torch.cat([torch.rand(1_000_000, dtype=torch.float64, generator=g),
                    torch.tensor([0.0, 0.25, 0.5, 0.75], dtype=torch.float64)])
    r = torch.sqrt(-2.0 * torch.log1p(-u1))
    textbook = torch.stack((r * torch.cos((2.0 * math.pi) * u2), r * torch.sin((2.0 * math.pi) * u2)), dim=-1)
    ours = box_muller(u1, u2)
    assert ours.shape == (u1.numel(), 2) and torch.isfinite(ours).all()
    assert (ours - textbook).abs().max().item() < 1e-14  # values reach 8.6


@pytest.mark.parametrize("paired", [False, True])
def test_a_normal_draw_is_the_same_alone_or_among_others(paired):
    rng, ids = CounterRNG(4), torch.arange(1000)
    z = rng.normal(ids, 5, "p", draws=5, paired=paired)
    for d in range(5):
        assert torch.equal(rng.normal(ids, 5, "p", draw=d, paired=paired), z[:, d])
    assert torch.equal(rng.normal(ids, 5, "p", draw=1, draws=3, paired=paired), z[:, 1:4])
    assert torch.equal(rng.at(5).normal(ids, "p", draws=5, paired=paired), z)


def test_paired_normals_use_both_outputs_of_each_transform():
    rng, ids = CounterRNG(4), torch.arange(300_000)
    z = rng.normal(ids, 5, "p", draws=4, paired=True)
    single = rng.normal(ids, 5, "p", draws=2)  # the default stream: draw d from raw draws 2d, 2d+1
    assert torch.equal(z[:, 0], single[:, 0]) and not torch.equal(z[:, 1], single[:, 1])
    u = rng.uniform(ids, 5, "p", draws=4)
    r = torch.sqrt(-2.0 * torch.log1p(-u[:, 2]))
    assert torch.allclose(z[:, 2], r * torch.cos(2 * math.pi * u[:, 3]), rtol=0, atol=1e-13)
    assert torch.allclose(z[:, 3], r * torch.sin(2 * math.pi * u[:, 3]), rtol=0, atol=1e-13)
    # the cosine and sine outputs of one transform (columns 0, 1) are uncorrelated, and so are their
    # squares (they share the radius: a wrong pairing would correlate |z0| and |z1|)
    c = torch.corrcoef(torch.stack([z[:, 0], z[:, 1], z[:, 0] ** 2, z[:, 1] ** 2]))
    assert abs(c[0, 1].item()) < 0.01 and abs(c[2, 3].item()) < 0.01
    assert stats.kstest(z[:, 1].numpy(), "norm").pvalue > 1e-4
    # the product of two independent standard normals has variance 1
    assert abs((z[:, 0] * z[:, 1]).var().item() - 1) < 0.02


def test_normal_moments_and_kolmogorov_smirnov():
    z = CounterRNG(11).normal(torch.arange(400_000), 2, "z")
    assert abs(z.mean().item()) < 5 / math.sqrt(z.numel())
    assert abs(z.var().item() - 1) < 0.01
    assert stats.kstest(z.numpy(), "norm").pvalue > 1e-4


def test_without_a_compiler_the_eager_path_runs_with_a_warning(tmp_path):
    import subprocess
    import sys

    code = ("import torch, warnings; from agentsim.core.random import CounterRNG\n"
            "from agentsim._native import rng as rng_kernel\n"
            "with warnings.catch_warnings(record=True) as w:\n"
            "    warnings.simplefilter('always')\n"
            "    z = CounterRNG(1).normal(torch.arange(5000), 3, 's')\n"
            "print(rng_kernel.kernel_status()); print(len(w), w[0].message if w else '')\n"
            "torch.save(z, 'z.pt')")
    # AGENTSIM_KERNELS=cache: as an install without the install-time library
    env = {**__import__("os").environ, "CC": str(tmp_path / "no-such-cc"), "AGENTSIM_KERNEL_DIR": str(tmp_path / "k"),
           "AGENTSIM_KERNELS": "cache"}
    for name in ("AGENTSIM_RNG_KERNEL", "AGENTSIM_REQUIRE_KERNELS"):
        env.pop(name, None)
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "eager: the native CPU kernel library could not be built (no C compiler: CC=" in out.stdout
    assert "1 agentsim:" in out.stdout
    assert torch.equal(torch.load(tmp_path / "z.pt"), CounterRNG(1).normal(torch.arange(5000), 3, "s"))


def _digest_of_draws(n: int) -> str:
    import hashlib

    # no other torch op in the child: torch's own OpenMP threads are not fork-safe
    import numpy as np

    ids = torch.from_numpy(np.arange(n, dtype=np.int64))
    return hashlib.sha256(CounterRNG(5).normal(ids, 1, "s").numpy().tobytes()).hexdigest()


def test_kernel_threads_work_in_a_forked_child(built_kernel):
    import hashlib
    import multiprocessing as mp

    want = CounterRNG(5).normal(torch.arange(200_000), 1, "s")  # the parent's thread pool exists now
    with mp.get_context("fork").Pool(1) as pool:
        got = pool.apply_async(_digest_of_draws, (200_000,)).get(timeout=60)
    assert got == hashlib.sha256(want.numpy().tobytes()).hexdigest()


def test_normal_passes_gradients_to_a_mean_and_std_that_require_them():
    # A differentiable run hands rng.normal its parameters as tensors: mean and std must keep their
    # gradients (they were once turned into Python floats), with the values of a run without them.
    rng = CounterRNG(3)
    ids = torch.arange(50)
    mean = (torch.tensor(0.5, dtype=torch.float64, requires_grad=True), torch.tensor(-1.0, dtype=torch.float64))
    std = torch.tensor(2.0, dtype=torch.float64, requires_grad=True)
    z = rng.normal(ids, 1, "walk", draws=2, dtype=torch.float32, mean=mean, std=std, paired=True)
    plain = rng.normal(ids, 1, "walk", draws=2, dtype=torch.float32, mean=(0.5, -1.0), std=2.0, paired=True)
    assert torch.equal(z.detach(), plain)
    z[:, 0].sum().backward()
    standard = rng.normal(ids, 1, "walk", draws=2, dtype=torch.float32, paired=True)
    assert float(mean[0].grad) == 50.0
    assert abs(float(std.grad) - float(standard[:, 0].double().sum())) < 1e-4


def test_choice_is_the_ids_of_the_smallest_keys_in_key_order():
    from agentsim.core.random import CounterRNG

    rng = CounterRNG(11)
    ids = torch.arange(5_000) * 3 + 7  # ids that are not positions
    keys = rng.bits(ids, 2, "place")
    for k in (0, 1, 17, 1_000, 1_249, 1_251, 4_999, 5_000):  # below and above the sorting share
        want = ids[torch.argsort(keys, stable=True)[:k]]
        assert torch.equal(rng.choice(ids, k, 2, "place"), want), k
    assert torch.equal(rng.at(2, "place").choice(ids, 30), ids[torch.argsort(keys, stable=True)[:30]])
    with pytest.raises(ValueError, match="expected k, an int from 0 to 5000"):
        rng.choice(ids, 5_001, 2, "place")


def test_choice_of_few_among_many_selects_below_a_quantile_with_the_same_bits():
    from agentsim.core.random import CounterRNG, _below_quantile

    rng = CounterRNG(5)
    ids = torch.arange(300_000)
    keys = rng.bits(ids, 0, "place")
    for k in (1, 64, 1_000, 40_000, 74_999):
        assert torch.equal(rng.choice(ids, k, 0, "place"), ids[torch.argsort(keys, stable=True)[:k]]), k
        below = _below_quantile(keys, (k + 8 * int(k ** 0.5) + 64) / ids.shape[0])
        assert below is not None and below.numel() >= k  # the quantile's candidates held the k smallest
    assert _below_quantile(keys, 1.0) is None


def test_choice_breaks_ties_of_keys_by_position(monkeypatch):
    from agentsim.core.random import CounterRNG

    rng = CounterRNG(0)
    monkeypatch.setattr(rng, "bits", lambda ids, step, stream: ids % 7)  # many equal keys
    ids = torch.arange(200)
    for k in range(0, 201, 7):
        assert torch.equal(rng.choice(ids, k, 0, "x"), ids[torch.argsort(ids % 7, stable=True)[:k]]), k
