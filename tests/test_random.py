"""Counter-based RNG: known answer, order independence, statistical quality."""

import math

import pytest
import torch
from scipy import stats

from agentsim.random import GOLDEN, CounterRNG, mix64, mix64_int

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
    with pytest.raises(TypeError, match="stream must be"):
        CounterRNG(1).uniform(torch.arange(3), 0, 1.5)
