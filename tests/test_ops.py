"""agentsim.core.ops against Python-loop references; order independence of the exact sums."""

from __future__ import annotations

import importlib
import math
import sys

import numpy as np
import pytest
import torch

from agentsim.core import ops
from agentsim.errors import ConfigError

DIM_SIZE = 7  # targets 5 and 6 get no rows below: empty segments


@pytest.fixture(autouse=True)
def _native_backend():
    ops.set_backend("native")
    yield
    ops.set_backend("native")


def make_pairs(dtype: torch.dtype, trailing: tuple[int, ...], index_dtype: torch.dtype = torch.int64, n: int = 200,
               seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    index = torch.randint(0, 5, (n,), generator=g).to(index_dtype)
    if dtype.is_floating_point:
        src = torch.randn((n, *trailing), generator=g, dtype=torch.float64).to(dtype)
    else:
        src = torch.randint(-1000, 1000, (n, *trailing), generator=g).to(dtype)
    return src, index


def loop_reduce(src: torch.Tensor, index: torch.Tensor, dim_size: int, reduce: str, fill=0) -> np.ndarray:
    """The reference: one Python step per pair, in pair order."""
    s, idx = src.numpy(), index.numpy()
    out = np.full((dim_size, *s.shape[1:]), fill, dtype=s.dtype)
    seen = np.zeros(dim_size, dtype=bool)
    count = np.zeros(dim_size, dtype=np.int64)
    for k in range(len(idx)):
        t = idx[k]
        count[t] += 1
        if reduce in ("sum", "mean"):
            out[t] = (out[t] if seen[t] else np.zeros_like(out[t])) + s[k]
        elif reduce == "max":
            out[t] = s[k] if not seen[t] else np.maximum(out[t], s[k])
        elif reduce == "min":
            out[t] = s[k] if not seen[t] else np.minimum(out[t], s[k])
        seen[t] = True
    if reduce in ("sum", "mean"):
        out[~seen] = 0
    if reduce == "mean":
        c = np.maximum(count, 1).reshape(-1, *([1] * (s.ndim - 1)))
        out = out / c if np.issubdtype(s.dtype, np.floating) else out // c
    return out


CASES = [
    pytest.param(dtype, trailing, index_dtype, id=f"{str(dtype)[6:]}-{len(trailing) + 1}d-{str(index_dtype)[6:]}")
    for dtype in (torch.float64, torch.int64)
    for trailing in ((), (3,))
    for index_dtype in (torch.int64, torch.int32)
]


@pytest.mark.parametrize("dtype, trailing, index_dtype", CASES)
def test_scatter_sum_matches_sequential_loop_bitwise(dtype, trailing, index_dtype):
    src, index = make_pairs(dtype, trailing, index_dtype)
    out = ops.scatter_sum(src, index, DIM_SIZE)
    assert out.dtype == dtype and out.shape == (DIM_SIZE, *trailing)
    # index_add_ on CPU adds in pair order: the same bits as the loop, not just close.
    np.testing.assert_array_equal(out.numpy(), loop_reduce(src, index, DIM_SIZE, "sum"))
    assert (out[5:] == 0).all()


@pytest.mark.parametrize("dtype, trailing, index_dtype", CASES)
def test_scatter_mean_matches_loop(dtype, trailing, index_dtype):
    src, index = make_pairs(dtype, trailing, index_dtype)
    out = ops.scatter_mean(src, index, DIM_SIZE)
    assert out.dtype == dtype
    np.testing.assert_array_equal(out.numpy(), loop_reduce(src, index, DIM_SIZE, "mean"))
    assert (out[5:] == 0).all()


@pytest.mark.parametrize("reduce", ["max", "min"])
@pytest.mark.parametrize("dtype, trailing, index_dtype", CASES)
def test_scatter_max_min_match_loop(dtype, trailing, index_dtype, reduce):
    src, index = make_pairs(dtype, trailing, index_dtype)
    fn = ops.scatter_max if reduce == "max" else ops.scatter_min
    if dtype.is_floating_point:
        fill = -math.inf if reduce == "max" else math.inf
    else:
        fill = torch.iinfo(dtype).min if reduce == "max" else torch.iinfo(dtype).max
    out = fn(src, index, DIM_SIZE)
    assert out.dtype == dtype
    np.testing.assert_array_equal(out.numpy(), loop_reduce(src, index, DIM_SIZE, reduce, fill))
    assert (out[5:] == fill).all()
    custom = fn(src, index, DIM_SIZE, fill=-7)
    assert (custom[5:] == -7).all()
    np.testing.assert_array_equal(custom[:5].numpy(), out[:5].numpy())


@pytest.mark.parametrize("dtype, trailing, index_dtype", CASES)
def test_segment_sum_matches_sequential_loop_bitwise(dtype, trailing, index_dtype):
    g = torch.Generator().manual_seed(1)
    lengths = torch.tensor([3, 0, 5, 1, 0, 0, 40, 2])
    indptr = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)]).to(index_dtype)
    n = int(lengths.sum())
    if dtype.is_floating_point:
        src = torch.randn((n, *trailing), generator=g, dtype=dtype) * 1e3
    else:
        src = torch.randint(-(2**40), 2**40, (n, *trailing), generator=g, dtype=dtype)
    out = ops.segment_sum(src, indptr)
    assert out.dtype == dtype and out.shape == (len(lengths), *trailing)
    s = src.numpy()
    for seg in range(len(lengths)):
        acc = np.zeros(s.shape[1:], dtype=s.dtype)
        for k in range(int(indptr[seg]), int(indptr[seg + 1])):
            acc = acc + s[k]
        np.testing.assert_array_equal(out[seg].numpy(), acc)


def test_segment_sum_int_wraps_like_index_add():
    src = torch.tensor([2**31 - 1, 5, -3], dtype=torch.int32)
    out = ops.segment_sum(src, torch.tensor([0, 2, 3]))
    ref = ops.scatter_sum(src, torch.tensor([0, 0, 1]), 2)
    assert out.dtype == torch.int32
    assert torch.equal(out, ref)


def test_bool_src_sums_to_counts():
    flags = torch.tensor([True, False, True, True])
    index = torch.tensor([0, 0, 1, 1])
    assert ops.scatter_sum(flags, index, 3).tolist() == [1, 2, 0]
    assert ops.segment_sum(flags, torch.tensor([0, 2, 4])).tolist() == [1, 2]


def test_bad_inputs_are_config_errors():
    src = torch.ones(4)
    with pytest.raises(ConfigError, match=r"index: expected an int32 or int64 tensor \[n\] \(got torch.float32"):
        ops.scatter_sum(src, torch.zeros(4), 2)
    with pytest.raises(ConfigError, match="index: expected 4 entries, one per row of src \\(got 3\\)"):
        ops.scatter_max(src, torch.zeros(3, dtype=torch.int64), 2)
    with pytest.raises(ConfigError, match="dim_size: expected an int >= 0"):
        ops.scatter_mean(src, torch.zeros(4, dtype=torch.int64), -1)
    with pytest.raises(ConfigError, match=r"frac_bits: expected an int in \[0, 62\] \(got 63\)"):
        ops.to_fixed(src, 63)


# --------------------------------------------------------------------------- exact sums
def test_fixed_point_round_trip():
    g = torch.Generator().manual_seed(2)
    x = torch.randn(1000, generator=g, dtype=torch.float64) * 1e4
    fixed = ops.to_fixed(x)
    assert fixed.dtype == torch.int64
    back = ops.from_fixed(fixed)
    assert (back - x).abs().max() <= 2.0**-33
    assert torch.equal(ops.to_fixed(back), fixed)
    assert ops.from_fixed(fixed, dtype=torch.float32).dtype == torch.float32
    assert ops.to_fixed(torch.tensor([0.75]), frac_bits=2).tolist() == [3]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_exact_sum_is_bitwise_order_independent(dtype):
    g = torch.Generator().manual_seed(3)
    x = (torch.randn(5000, generator=g, dtype=torch.float64) * 100).to(dtype)
    ref = ops.exact_sum(x)
    assert ref.dtype == dtype and ref.dim() == 0
    assert abs(float(ref) - math.fsum(x.double().tolist())) <= 5000 * 2.0**-33 + 1e-4 * (dtype == torch.float32)
    for _ in range(5):
        perm = torch.randperm(len(x), generator=g)
        assert torch.equal(ops.exact_sum(x[perm]), ref)
    # Any split (e.g. over ranks) of the fixed-point partial sums adds up to the same bits.
    parts = [ops.to_fixed(chunk).sum() for chunk in x.split(777)]
    assert torch.equal(ops.from_fixed(sum(parts), dtype=dtype), ref)


def test_exact_sum_dim_and_ints():
    g = torch.Generator().manual_seed(4)
    x = torch.randn(300, 4, generator=g, dtype=torch.float64)
    by_col = ops.exact_sum(x, dim=0)
    assert by_col.shape == (4,)
    for c in range(4):
        assert torch.equal(by_col[c], ops.exact_sum(x[:, c]))
    ints = torch.randint(-10, 10, (50,), generator=g, dtype=torch.int32)
    total = ops.exact_sum(ints)
    assert total.dtype == torch.int64 and int(total) == sum(ints.tolist())
    assert int(ops.exact_sum(torch.tensor([True, True, False]))) == 2


@pytest.mark.parametrize("trailing", [(), (3,)])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_scatter_sum_exact_is_bitwise_order_independent(dtype, trailing):
    src, index = make_pairs(dtype, trailing, n=3000, seed=5)
    src = src * 50
    ref = ops.scatter_sum_exact(src, index, DIM_SIZE)
    assert ref.dtype == dtype and ref.shape == (DIM_SIZE, *trailing)
    g = torch.Generator().manual_seed(6)
    for _ in range(5):
        perm = torch.randperm(len(index), generator=g)
        assert torch.equal(ops.scatter_sum_exact(src[perm], index[perm].int(), DIM_SIZE), ref)
    # Each target equals the exact sum of its own rows, and the plain sum to rounding.
    for t in range(DIM_SIZE):
        assert torch.equal(ref[t], ops.exact_sum(src[index == t], dim=0))
    tol = 3000 * 2.0**-33 if dtype == torch.float64 else 1e-3
    torch.testing.assert_close(ref.double(), ops.scatter_sum(src.double(), index, DIM_SIZE), atol=tol, rtol=0)


def test_scatter_sum_exact_int_input():
    src, index = make_pairs(torch.int32, (), n=100)
    out = ops.scatter_sum_exact(src, index, DIM_SIZE)
    assert out.dtype == torch.int64
    np.testing.assert_array_equal(out.numpy(), loop_reduce(src.long(), index, DIM_SIZE, "sum"))


def test_documented_fact_plain_float_sum_depends_on_pair_order():
    # float32: 2**24 + 1 rounds back to 2**24, so the order of the three terms decides
    # whether the 1 survives. Plain scatter_sum shows it; the fixed-point sum does not.
    big = float(2**24)
    index = torch.zeros(3, dtype=torch.int64)
    a = torch.tensor([big, 1.0, -big])
    b = torch.tensor([big, -big, 1.0])
    assert ops.scatter_sum(a, index, 1).item() == 0.0
    assert ops.scatter_sum(b, index, 1).item() == 1.0
    assert ops.scatter_sum_exact(a, index, 1).item() == 1.0
    assert ops.scatter_sum_exact(b, index, 1).item() == 1.0


# --------------------------------------------------------------------------- backends
def test_unknown_backend_lists_choices():
    with pytest.raises(ConfigError, match=r"unknown scatter backend 'torchscatter' \(valid: native, torch_scatter\)\. "
                                          r"Perhaps you meant 'torch_scatter'\?"):
        ops.set_backend("torchscatter")
    assert ops.get_backend() == "native"


def test_missing_torch_scatter_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch_scatter", None)  # makes `import torch_scatter` fail
    with pytest.raises(ConfigError, match=r"pip install agentsim\[scatter\]"):
        ops.set_backend("torch_scatter")
    assert ops.get_backend() == "native"


def test_backend_env_var_read_at_import(monkeypatch):
    try:
        monkeypatch.setenv(ops.ENV_VAR, "bogus")
        with pytest.raises(ConfigError, match=r"AGENTSIM_SCATTER_BACKEND='bogus': unknown scatter backend 'bogus'"):
            importlib.reload(ops)
        monkeypatch.setenv(ops.ENV_VAR, "native")
        importlib.reload(ops)
        assert ops.get_backend() == "native"
    finally:
        monkeypatch.delenv(ops.ENV_VAR, raising=False)
        importlib.reload(ops)


@pytest.mark.parametrize("name", ["scatter_sum", "scatter_mean", "scatter_max", "scatter_min"])
@pytest.mark.parametrize("dtype, trailing, index_dtype", CASES)
def test_torch_scatter_backend_matches_native(name, dtype, trailing, index_dtype):
    pytest.importorskip("torch_scatter")
    src, index = make_pairs(dtype, trailing, index_dtype)
    fn = getattr(ops, name)
    native = fn(src, index, DIM_SIZE)
    ops.set_backend("torch_scatter")
    assert ops.get_backend() == "torch_scatter"
    other = fn(src, index, DIM_SIZE)
    assert other.dtype == native.dtype
    torch.testing.assert_close(other, native, rtol=1e-12, atol=1e-12)


def test_flatnonzero_matches_torch_nonzero():
    g = torch.Generator().manual_seed(0)
    for n, p in ((0, 0.5), (1, 1.0), (1000, 0.0), (1000, 0.3), (100_000, 0.9)):
        mask = torch.rand(n, generator=g) < p
        got = ops.flatnonzero(mask)
        assert got.dtype == torch.int64 and torch.equal(got, mask.nonzero().squeeze(1))
    assert torch.equal(ops.flatnonzero(torch.ones(10, dtype=torch.bool)[::3]), torch.arange(4))  # strided
    with pytest.raises(ConfigError, match="1D bool"):
        ops.flatnonzero(torch.ones(3))
    with pytest.raises(ConfigError, match="1D bool"):
        ops.flatnonzero(torch.ones(2, 2, dtype=torch.bool))


@pytest.mark.parametrize("make", [
    lambda: torch.rand(50, 2),  # 8-byte rows: gathered as int64
    lambda: torch.randint(0, 9, (50, 2, 2), dtype=torch.int8),  # 4-byte rows
    lambda: torch.rand(50, 3),  # 12-byte rows: index_select
    lambda: torch.rand(50, 4)[:, :2],  # not contiguous: index_select
    lambda: torch.rand(50, 1) > 0.5,
    lambda: torch.arange(50),
    lambda: torch.rand(0, 2),
])
def test_take_rows_equals_index_select(make):
    from agentsim.core.ops import take_rows

    src = make()
    index = torch.randint(0, max(src.shape[0], 1), (70,)) if src.shape[0] else torch.zeros(0, dtype=torch.int64)
    want = src.index_select(0, index)
    got = take_rows(src, index)
    assert got.dtype == want.dtype and got.shape == want.shape and torch.equal(got, want)
    out = torch.empty_like(want)
    assert take_rows(src, index, out=out) is out and torch.equal(out, want)


@pytest.mark.parametrize("threads", [1, 2])
def test_to_float64_in_place_gives_the_bits_of_a_copy(threads):
    g = torch.Generator().manual_seed(4)
    x = torch.cat([torch.randint(-2**62, 2**62, (1_000_003,), generator=g, dtype=torch.int64),
                   torch.tensor([0, 1, -1, 2**53 + 1, -2**63, 2**63 - 1])])  # 2**53 + 1: rounded to even
    want = x.to(torch.float64)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        table = x.clone()
        got = ops.to_float64_(table)
    finally:
        torch.set_num_threads(before)
    assert got.data_ptr() == table.data_ptr() and got.dtype == torch.float64
    assert torch.equal(got.view(torch.int64), want.view(torch.int64))  # the same bits
    square = torch.arange(6.0, dtype=torch.float64).reshape(2, 3)
    assert torch.equal(ops.to_float64_(torch.arange(6).reshape(2, 3)), square)
    with pytest.raises(ValueError, match="expected a contiguous int64 tensor"):
        ops.to_float64_(torch.arange(4, dtype=torch.int32))
    with pytest.raises(ValueError, match="not contiguous"):
        ops.to_float64_(torch.arange(8)[::2])
