"""Counter-based random numbers keyed by (seed, id, step, stream).

Every draw is a pure function of the run seed, an integer id (an agent's ``uid``,
a grid cell index, an edge index, ...), the step number, a named stream and a draw
index. Nothing depends on the order of agents in memory or on how they are split
across ranks, so a run gives the same numbers on one process or many.

The generator is the SplitMix64 finalizer (Steele, Lea & Flood 2014) evaluated in
int64 arithmetic: wrapping ``+`` and ``*`` give the same bits as uint64, and a
logical right shift is an arithmetic shift followed by a mask. An id is hashed
once into a key, ``key = mix(id * golden + mix(seed, stream))``; each draw is
``mix(key ^ mix(step, draw))``.

Examples:
    >>> import torch
    >>> rng = CounterRNG(seed=7)
    >>> uid = torch.arange(5)
    >>> u = rng.uniform(uid, step=3, stream="move")
    >>> bool(torch.equal(u[2:4], rng.uniform(uid[2:4], step=3, stream="move")))
    True
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Sequence

import torch
from torch import Tensor

from agentsim._native.rng import MAX_DRAWS, as_int64, box_muller, kernel

_MASK64 = (1 << 64) - 1


GOLDEN = as_int64(0x9E3779B97F4A7C15)
_M1 = as_int64(0xBF58476D1CE4E5B9)
_M2 = as_int64(0x94D049BB133111EB)


def _shr(z: Tensor, k: int) -> Tensor:
    """Logical right shift of int64 bits by ``k``."""
    return (z >> k) & ((1 << (64 - k)) - 1)


def mix64(z: Tensor) -> Tensor:
    """SplitMix64 finalizer on an int64 tensor (elementwise, any shape); ``z`` is not modified.

    Written with in-place ops on one work tensor: the hash is memory bound, and a new
    tensor per operation made it about 2.7x slower.
    """
    z = z.clone()
    t = torch.empty_like(z)
    for shift, mult in ((30, _M1), (27, _M2)):
        torch.bitwise_right_shift(z, shift, out=t)
        t.bitwise_and_((1 << (64 - shift)) - 1)
        z.bitwise_xor_(t).mul_(mult)
    torch.bitwise_right_shift(z, 31, out=t)
    t.bitwise_and_((1 << 33) - 1)
    return z.bitwise_xor_(t)


def mix64_int(z: int) -> int:
    """SplitMix64 finalizer on a Python int; returns the int64 with those bits."""
    z &= _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return as_int64(z ^ (z >> 31))


def _draw_salt(step: int, index: int) -> int:
    """Hash of (step, raw draw index) that is xor-ed into an id's key: draw = ``mix(key ^ salt)``."""
    return mix64_int((step << 20) ^ index)


def stream_id(stream: int | str) -> int:
    """Map a stream name or number to an int. Names hash with CRC-32 (stable across runs)."""
    if isinstance(stream, str):
        return zlib.crc32(stream.encode("utf-8"))
    if isinstance(stream, int) and not isinstance(stream, bool):
        return stream
    raise TypeError(f"stream must be an int or a str (got {type(stream).__name__})")


class CounterRNG:
    """Random numbers that are pure functions of (seed, id, step, stream, draw).

    Args:
        seed: The run seed (any Python int).

    All methods take ``ids``, an int64 tensor of shape ``[n]`` (or any shape), and
    return a tensor of the same shape on the same device, or ``[*ids.shape, draws]``
    when ``draws`` is given.
    """

    def __init__(self, seed: int) -> None:
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise TypeError(f"seed must be an int (got {type(seed).__name__})")
        self.seed = seed
        self._salts: dict[tuple[int, int | str], int] = {}  # (seed, stream) -> _stream_salt

    def __repr__(self) -> str:
        return f"CounterRNG(seed={self.seed})"

    def key(self, ids: Tensor, stream: int | str) -> Tensor:
        """Per-id key for ``stream``: int64 tensor shaped like ``ids``."""
        if ids.dtype != torch.int64:
            ids = ids.to(torch.int64)
        return mix64(ids * GOLDEN + self._stream_salt(stream))

    def _stream_salt(self, stream: int | str) -> int:
        """The seed and stream hashed together: an id's key is ``mix(id * golden + salt)`` (kept by
        seed and stream: a run asks for the same few streams every step).
        """
        key = (self.seed, stream)
        salt = self._salts.get(key)
        if salt is None:
            if len(self._salts) >= 4096:  # streams made of numbers may be many: the table stays small
                self._salts.clear()
            salt = self._salts[key] = mix64_int(mix64_int(self.seed) ^ stream_id(stream))
        return salt

    def bits(
        self, ids: Tensor, step: int, stream: int | str, draw: int = 0, draws: int | None = None
    ) -> Tensor:
        """Raw 64 random bits per id as int64.

        Args:
            ids: int64 ids, shape ``[...]``.
            step: The simulation step (int >= 0).
            stream: A name or number that separates independent uses.
            draw: Index of the first draw within (id, step, stream).
            draws: If given, return ``draws`` consecutive draws as a last dimension.
        """
        fused = self._fused("bits", ids, step, stream, range(draw, draw + (draws or 1)), draws)
        if fused is not None:
            return fused
        key = self.key(ids, stream)
        if draws is None:
            return mix64(key ^ _draw_salt(step, draw))
        salts = torch.tensor([_draw_salt(step, draw + d) for d in range(draws)], dtype=torch.int64,
                             device=key.device)
        return mix64(key.unsqueeze(-1) ^ salts)

    def _fused(self, kind: str, ids: Tensor, step: int, stream: int | str, raw: range, draws: int | None,
               *extra: int | list[float] | None) -> Tensor | None:
        """The draws from the compiled kernel (:mod:`agentsim._native.rng`; the same bits as the torch
        ops; used for every CPU call: faster from 16 ids on), or None where it does not apply (not a
        CPU tensor, more than ``MAX_DRAWS`` raw draws per id, kernel unavailable). ``raw``: the raw
        draw indices the kernel hashes (one salt each); ``draws``: the output's last dimension.
        """
        if ids.device.type != "cpu" or ids.requires_grad:
            return None
        k = kernel()
        if k is None:
            return None
        n = 1 if draws is None else draws
        if len(raw) > MAX_DRAWS:
            return None
        salts = [_draw_salt(step, r) for r in raw]
        flat = ids if ids.dim() == 1 and ids.dtype == torch.int64 and ids.is_contiguous() \
            else ids.reshape(-1).to(torch.int64).contiguous()
        shape = tuple(ids.shape) if draws is None else (*ids.shape, n)  # the [n, d] rows, as the caller's shape
        return k.run(kind, flat, GOLDEN, self._stream_salt(stream), salts, n, *extra, shape=shape)

    def uniform(
        self,
        ids: Tensor,
        step: int,
        stream: int | str,
        draw: int = 0,
        draws: int | None = None,
        dtype: torch.dtype = torch.float64,
    ) -> Tensor:
        """Uniform numbers in ``[0, 1)``: 53 random bits for float64, 24 for float32."""
        if dtype in (torch.float64, torch.float32):
            fused = self._fused("uniform64" if dtype == torch.float64 else "uniform32", ids, step, stream,
                                range(draw, draw + (draws or 1)), draws)
            if fused is not None:
                return fused
        b = self.bits(ids, step, stream, draw, draws)
        if dtype == torch.float64:
            return _shr(b, 11).to(torch.float64) * (2.0**-53)
        if dtype == torch.float32:
            return _shr(b, 40).to(torch.float32) * (2.0**-24)
        raise TypeError(f"dtype must be torch.float32 or torch.float64 (got {dtype})")

    def normal(
        self,
        ids: Tensor,
        step: int,
        stream: int | str,
        draw: int = 0,
        draws: int | None = None,
        dtype: torch.dtype = torch.float64,
        mean: float | Sequence[float] | None = None,
        std: float | None = None,
        paired: bool = False,
    ) -> Tensor:
        """Normal numbers (Box-Muller in float64, then ``dtype``). The transform is
        :func:`agentsim._native.rng.box_muller`: correctly rounded operations only, so the compiled
        kernel, torch ops, CPU and CUDA give the same bits.

        Two streams, chosen with ``paired``:

        - ``paired=False`` (the default; the numbers of earlier releases): draw ``d`` is the cosine
          output of the transform of raw draws ``2d, 2d+1``.
        - ``paired=True``: both outputs of each transform are used: draws ``2k`` and ``2k+1`` are
          the cosine and sine outputs of the transform of raw draws ``2k, 2k+1`` (two independent
          normals from two uniforms). Half the hashing and one logarithm and square root per two
          normals: ``draws=2`` is about twice as fast (a 10M-walker step's draws: 114 -> 56 ms).
          Only draw 0 is the same number in both streams.

        Either way draw ``d`` is the same number whether it is drawn alone or among others
        (``draw=1`` equals column 1 of ``draws=2``).

        With ``mean`` or ``std``: ``z * std + mean`` (defaults 1 and 0), each operation rounded in
        ``dtype`` as ``z.mul_(std).add_(mean)`` would be, in the same pass as the draws; ``mean``
        may give one value per draw (a sequence of length ``draws``: a drift per axis).
        """
        if dtype not in (torch.float64, torch.float32):
            raise TypeError(f"dtype must be torch.float32 or torch.float64 (got {dtype})")
        n = 1 if draws is None else draws
        means = list(mean) if isinstance(mean, Sequence) else [mean]
        if any(isinstance(v, Tensor) and v.requires_grad for v in [*means, std]):
            # A differentiable run: the same ops as below on the standard normals, with autograd.
            z = self.normal(ids, step, stream, draw, draws, dtype, paired=paired)
            z = z if draws is not None else z.unsqueeze(-1)
            shifts = [torch.as_tensor(0.0 if m is None else m, dtype=dtype, device=z.device)
                      for m in (means if isinstance(mean, Sequence) else means * n)]
            if len(shifts) != n:
                raise ValueError(f"normal: mean has {len(shifts)} values, expected one per draw ({n})")
            out = z * torch.as_tensor(1.0 if std is None else std, dtype=dtype, device=z.device) + torch.stack(shifts)
            return out.squeeze(-1) if draws is None else out
        affine = mean is not None or std is not None
        shift = [float(m) for m in mean] if isinstance(mean, Sequence) else [float(mean or 0.0)] * n
        if len(shift) != n:
            raise ValueError(f"normal: mean has {len(shift)} values, expected one per draw ({n})")
        scale = 1.0 if std is None else float(std)
        # two raw draws per transform; paired, a call that starts at an odd draw starts at a sine
        # output (first = 1: its transform's cosine is not returned)
        first = draw % 2 if paired else 0
        start = draw - first if paired else 2 * draw
        raw = range(start, start + ((first + n + 1) // 2 * 2 if paired else 2 * n))
        fused = self._fused("normal64" if dtype == torch.float64 else "normal32", ids, step, stream, raw, draws,
                            int(paired), first, *(([scale], shift) if affine else (None, None)))
        if fused is not None:
            return fused
        u = self.uniform(ids, step, stream, raw.start, len(raw), dtype=torch.float64)
        both = box_muller(u[..., 0::2], u[..., 1::2])  # [..., transforms, 2]: cosine, sine
        z = (both.flatten(-2)[..., first:first + n] if paired else both[..., 0]).to(dtype)
        if affine:
            z.mul_(scale).add_(torch.tensor(shift, dtype=dtype, device=z.device))
        return z.squeeze(-1) if draws is None else z

    def integers(
        self, ids: Tensor, step: int, stream: int | str, high: int | Tensor, draw: int = 0,
        draws: int | None = None,
    ) -> Tensor:
        """Integers in ``[0, high)`` (``high`` an int, or an int tensor shaped like ``ids``; with
        ``draws``, ``draws`` consecutive draws as a last dimension, ``high`` an int).

        Uses ``floor(u * high)`` with a 53-bit uniform: the bias is below ``high / 2**53``.
        With an int ``high`` on the CPU the kernel makes the draws and the scaling in one pass.
        """
        if isinstance(high, Tensor):
            if draws is not None:
                raise ValueError("integers: draws needs an int high (got a tensor)")
            u = self.uniform(ids, step, stream, draw)
            out = torch.floor(u * high.to(torch.float64)).to(torch.int64)
            return torch.minimum(out, (high.to(torch.int64) - 1).clamp(min=0))
        if high < 1:
            raise ValueError(f"high must be >= 1 (got {high})")
        if high < 2**62:  # (double)high and high - 1 as the kernel computes them
            fused = self._fused("integers", ids, step, stream, range(draw, draw + (draws or 1)), draws, high)
            if fused is not None:
                return fused
        u = self.uniform(ids, step, stream, draw, draws)
        return torch.floor(u * high).to(torch.int64).clamp(max=high - 1)

    def bernoulli(self, ids: Tensor, step: int, stream: int | str, p: float | Tensor, draw: int = 0) -> Tensor:
        """Boolean draws that are True with probability ``p``."""
        return self.uniform(ids, step, stream, draw) < p

    def choice(self, ids: Tensor, k: int, step: int, stream: int | str) -> Tensor:
        """``k`` of ``ids`` ``[n]`` without replacement, every subset equally likely: the ids with the
        ``k`` smallest random keys (:meth:`bits`), in key order (ties by position), the same as
        ``ids[torch.argsort(bits(ids), stable=True)[:k]]`` without sorting all ``n`` keys.

        Examples:
            >>> rng = CounterRNG(seed=3)
            >>> cells = torch.arange(1000)
            >>> picked = rng.choice(cells, 5, step=0, stream="place")
            >>> bool(torch.equal(picked, cells[torch.argsort(rng.bits(cells, 0, "place"), stable=True)[:5]]))
            True
        """
        if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k <= ids.shape[0]:
            raise ValueError(f"choice: expected k, an int from 0 to {ids.shape[0]} (the ids; got {k!r})")
        keys = self.bits(ids, step, stream)
        if k == 0:
            return ids[:0]
        if 4 * k >= ids.shape[0]:  # a large share: sorting every key costs about as much as selecting
            return ids[torch.argsort(keys, stable=True)[:k]]
        # The keys are uniform over int64: the k smallest lie below a threshold that about k + 8 sqrt(k) of n
        # keys pass; where at least k pass, the k-th smallest of those is the k-th smallest of all.
        rows = _below_quantile(keys, (k + 8 * math.isqrt(k) + 64) / ids.shape[0])
        if rows is not None and rows.numel() >= k:
            keys, ids = keys[rows], ids[rows]
        kth = torch.kthvalue(keys, k).values  # the k-th smallest key: those below it, then ties by position
        rows = torch.nonzero(keys <= kth).reshape(-1)
        if rows.numel() > k:  # ties at the k-th key: the first of them by position
            below = keys[rows] < kth
            tied = rows[~below]
            rows = torch.cat([rows[below], tied[: k - int(below.sum())]]).sort().values
        return ids[rows[torch.argsort(keys[rows], stable=True)]]

    def at(self, step: int, stream: int | str | None = None) -> StepRNG:
        """A view of this generator with the step fixed (what substeps receive); ``stream`` is the
        default stream of its draws (substeps: the substep's name).
        """
        return StepRNG(self, step, stream)


def _below_quantile(keys: Tensor, share: float) -> Tensor | None:
    """``[m]`` the positions (ascending) of the int64 ``keys`` below the ``share`` quantile of the
    int64 range, or None where ``share >= 1``.
    """
    if share >= 1.0:
        return None
    threshold = -(2**63) + int(share * 2.0**64)
    return torch.nonzero(keys < threshold).reshape(-1)


class StepRNG:
    """A :class:`CounterRNG` bound to one step, with a default stream.

    ``rng.uniform(ids)`` draws from the default stream (in a substep, the substep's name;
    in ``init``, ``"init"``); ``rng.uniform(ids, "move")`` from a named one. Two calls with
    the same ids, stream and ``draw`` give the same numbers (that is what makes them
    independent of rank and row order): give each use its own stream or draw index.

    Examples:
        >>> import torch
        >>> rng = CounterRNG(seed=7).at(step=3, stream="move")
        >>> uid = torch.arange(4)
        >>> bool(torch.equal(rng.uniform(uid), CounterRNG(7).uniform(uid, 3, "move")))
        True
    """

    def __init__(self, rng: CounterRNG, step: int, stream: int | str | None = None) -> None:
        self.rng = rng
        self.step = step
        self.stream = stream

    def __repr__(self) -> str:
        return f"StepRNG(seed={self.rng.seed}, step={self.step}, stream={self.stream!r})"

    @property
    def seed(self) -> int:
        """The run seed."""
        return self.rng.seed

    def _stream(self, stream: int | str | None) -> int | str:
        if stream is not None:
            return stream
        if self.stream is None:
            raise ValueError("this generator has no default stream: name one (rng.uniform(ids, 'stream'))")
        return self.stream

    def bits(self, ids: Tensor, stream: int | str | None = None, draw: int = 0, draws: int | None = None) -> Tensor:
        """Raw 64 random bits per id as int64 (see :meth:`CounterRNG.bits`)."""
        return self.rng.bits(ids, self.step, self._stream(stream), draw, draws)

    def uniform(self, ids: Tensor, stream: int | str | None = None, draw: int = 0, draws: int | None = None,
                dtype: torch.dtype = torch.float64) -> Tensor:
        """Uniform numbers in ``[0, 1)`` (see :meth:`CounterRNG.uniform`)."""
        return self.rng.uniform(ids, self.step, self._stream(stream), draw, draws, dtype)

    def normal(self, ids: Tensor, stream: int | str | None = None, draw: int = 0, draws: int | None = None,
               dtype: torch.dtype = torch.float64, mean: float | Sequence[float] | None = None,
               std: float | None = None, paired: bool = False) -> Tensor:
        """Normal numbers, standard or ``z * std + mean``; ``paired=True``: both outputs of each
        Box-Muller transform, about twice as fast (see :meth:`CounterRNG.normal`).
        """
        return self.rng.normal(ids, self.step, self._stream(stream), draw, draws, dtype, mean, std, paired)

    def integers(self, ids: Tensor, stream: int | str | None = None, high: int | Tensor | None = None,
                 draw: int = 0, draws: int | None = None) -> Tensor:
        """Integers in ``[0, high)`` (see :meth:`CounterRNG.integers`)."""
        if high is None:
            raise ValueError("integers: high is required (rng.integers(ids, high=n))")
        return self.rng.integers(ids, self.step, self._stream(stream), high, draw, draws)

    def choice(self, ids: Tensor, k: int, stream: int | str | None = None) -> Tensor:
        """``k`` of ``ids`` without replacement, in random order (see :meth:`CounterRNG.choice`):
        ``ic.rng.choice(torch.arange(n_cells), n, "place")`` puts ``n`` agents on distinct cells.
        """
        return self.rng.choice(ids, k, self.step, self._stream(stream))

    def bernoulli(self, ids: Tensor, stream: int | str | None = None, p: float | Tensor | None = None,
                  draw: int = 0) -> Tensor:
        """Booleans that are True with probability ``p`` (see :meth:`CounterRNG.bernoulli`)."""
        if p is None:
            raise ValueError("bernoulli: p is required (rng.bernoulli(ids, p=0.5))")
        return self.rng.bernoulli(ids, self.step, self._stream(stream), p, draw)
