"""Random draws that gradients can pass: Bernoulli and categorical draws, hard or relaxed, from the
counter-based RNG's uniforms, so that a relaxed run and a hard run see the same noise.

A substep draws its uniforms as usual (``u = ctx.rng.uniform(uid, "infect")``) and hands them
here with the probabilities. ``mode`` says what gradients see:

- ``"hard"``: the draw itself, ``1`` where ``u < p`` (no gradient through it);
- ``"straight_through"``: the hard draw in the forward pass, the gradient of ``p`` in the
  backward pass (``x + p - p.detach()``);
- ``"gumbel"``: the binary-concrete (Gumbel-softmax) relaxation with temperature ``tau``,
  ``sigmoid((logit p - logit u) / tau)``; it tends to the hard draw as ``tau -> 0`` and
  crosses 1/2 exactly where the hard draw switches;
- ``"gumbel_hard"``: the hard draw forward, the Gumbel-softmax gradient backward (what
  GradABM uses);
- ``"score"``: the hard draw; its log-probability ``x log p + (1 - x) log(1 - p)`` carries the
  gradient, for the score-function estimator (sum it over the run, see
  :mod:`agentsim.calibrate.estimators`).

Every mode returns ``(x, logp)``: the draw ``[n]`` and its log-probability ``[n]`` (with a gradient
in every mode, so a run can report both). Which of these estimators is biased, and by how
much, is measured in ``tests/test_estimators.py`` and stated in the README.

Examples:
    >>> import torch
    >>> p, u = torch.tensor([0.2, 0.7]), torch.tensor([0.5, 0.5])
    >>> bernoulli(p, u)[0]
    tensor([0., 1.])
    >>> x, _ = bernoulli(p, u, "gumbel", tau=0.01)
    >>> x.round()
    tensor([0., 1.])
"""

from __future__ import annotations

import torch
from torch import Tensor

from agentsim.errors import ConfigError

__all__ = ["MODES", "bernoulli", "categorical", "check_mode"]

MODES = ("hard", "straight_through", "gumbel", "gumbel_hard", "score")

_TINY = 1e-12


def check_mode(mode: object, tau: float = 1.0) -> str:
    """``mode`` if it is one of :data:`MODES` and ``tau > 0``, else a ConfigError."""
    if mode not in MODES:
        raise ConfigError(f"relax: expected one of {', '.join(MODES)} (got {mode!r})")
    if not isinstance(tau, (int, float)) or isinstance(tau, bool) or not tau > 0:
        raise ConfigError(f"tau: expected a temperature > 0 (got {tau!r})")
    return str(mode)


def bernoulli(p: Tensor, u: Tensor, mode: str = "hard", tau: float = 1.0,
              log_prob: bool = True) -> tuple[Tensor, Tensor | None]:
    """Bernoulli draws with probability ``p`` ``[n]`` from uniforms ``u`` ``[n]`` in [0, 1).

    Returns:
        ``(x, logp)``: ``x`` ``[n]`` in the dtype of ``p`` (0/1 in the forward pass except in
        ``"gumbel"`` mode, where it lies in (0, 1)) and the log-probability ``[n]`` of the hard draw
        (None without ``log_prob``: two logarithms per draw saved).
    """
    check_mode(mode, tau)
    u = u.to(p.dtype)
    hard = (u < p).to(p.dtype)
    pc = p.clamp(_TINY, 1 - _TINY)
    logp = hard * torch.log(pc) + (1 - hard) * torch.log1p(-pc) if log_prob else None
    if mode in ("hard", "score"):
        return hard, logp
    if mode == "straight_through":
        return hard + (p - p.detach()), logp
    uc = u.clamp(_TINY, 1 - _TINY)
    relaxed = torch.sigmoid((torch.logit(pc) - torch.logit(uc)) / tau)
    if mode == "gumbel":
        return relaxed, logp
    return hard + (relaxed - relaxed.detach()), logp


def categorical(logits: Tensor, u: Tensor, mode: str = "hard", tau: float = 1.0) -> tuple[Tensor, Tensor]:
    """Categorical draws (Gumbel-max) from ``logits`` ``[n, K]`` with uniforms ``u`` ``[n, K]``.

    Returns:
        ``(onehot, logp)``: ``[n, K]`` one-hot draws (soft in ``"gumbel"`` mode) in the dtype of
        ``logits``, and ``[n]`` the log-probability of the hard draw. ``"straight_through"``
        passes the softmax's gradient; ``"gumbel"`` / ``"gumbel_hard"`` the Gumbel-softmax's.
    """
    check_mode(mode, tau)
    if logits.dim() != 2 or u.shape != logits.shape:
        raise ConfigError(f"categorical: expected logits [n, K] and uniforms of the same shape "
                          f"(got {list(logits.shape)} and {list(u.shape)})")
    gumbel = -torch.log(-torch.log(u.to(logits.dtype).clamp(_TINY, 1 - _TINY)))
    index = torch.argmax(logits + gumbel, dim=1)
    hard = torch.nn.functional.one_hot(index, logits.shape[1]).to(logits.dtype)
    logp = torch.log_softmax(logits, dim=1).gather(1, index.unsqueeze(1)).squeeze(1)
    if mode in ("hard", "score"):
        return hard, logp
    if mode == "straight_through":
        soft = torch.softmax(logits, dim=1)
        return hard + (soft - soft.detach()), logp
    relaxed = torch.softmax((logits + gumbel) / tau, dim=1)
    if mode == "gumbel":
        return relaxed, logp
    return hard + (relaxed - relaxed.detach()), logp
