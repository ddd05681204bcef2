"""Gradients of a long rollout in bounded memory: checkpoints of the state, one step's graph at a time.

A differentiable run (``Simulation(grad=...)``) that keeps the autograd graph of every step
holds every step's intermediate tensors until ``backward`` (about 84 MiB per step for the
flu model at 1M agents). :func:`rollout_gradients` gives the same gradients holding only:

- a copy of the state every ``checkpoint_every`` steps (``T / K`` copies), taken in a first
  pass without autograd history, which also gives every step's observation and so the
  loss and ``g_t = d loss / d y_t`` for each observation ``y_t``;
- then, segment by segment from the last, the segment's ``K`` states recomputed without
  history from its checkpoint, and, step by step from its end, one step re-run with
  autograd from the state before it: the gradient of ``<g_t, y_t> + <a_t, x_t>`` (``x_t``
  the step's float fields, ``a_t`` their adjoint from the step after) with respect to the
  parameters (added up) and to the fields before the step (``a_{t-1}``).

Peak memory: ``T / K + K`` copies of the state and one step's graph; with ``K`` near
``sqrt(T)`` that is ``2 sqrt(T)`` copies (20 for 100 steps). Each step runs three times
(twice with ``K = 1``). Every re-run reproduces its step bit for bit (the counter-based RNG
keys each draw by uid and step; the rows come out in the same order, which is checked). On
several ranks every rank runs the same passes, with the same collectives in the same order.

Not with ``shuffle_rows`` (its permutation is drawn from torch's global generator), neighbor
snapshots (``sync_every > 1``), or a spatial partitioner that moves its borders
(``balance_every > 0``): their state is not all in the checkpoint.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from agentsim.core.state import UID, State
from agentsim.errors import ConfigError, SimulationError
from agentsim.grad.autograd import reach_exchanges, sum_gradients

if TYPE_CHECKING:
    from agentsim.engine.simulation import SavedState, Simulation

__all__ = ["rollout_gradients"]

Observe = Callable[["Simulation"], Tensor]
Loss = Callable[[Tensor], Tensor]


def _check(sim: Simulation, steps: object, checkpoint_every: object) -> tuple[int, int]:
    if not sim.differentiable:
        raise ConfigError("rollout_gradients: the simulation is not differentiable; build it with "
                          "Simulation(..., grad=True or a list of float parameters)")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ConfigError(f"steps: expected an int >= 1 (got {steps!r})")
    every = max(1, round(math.sqrt(steps))) if checkpoint_every is None else checkpoint_every
    if isinstance(every, bool) or not isinstance(every, int) or every < 1:
        raise ConfigError(f"checkpoint_every: expected an int >= 1 or None (got {checkpoint_every!r})")
    if sim.shuffle_rows:
        raise ConfigError("rollout_gradients: shuffle_rows draws from torch's global generator, so a re-run step "
                          "would differ; build the simulation with shuffle_rows=False")
    if sim.snapshots is not None:
        raise ConfigError("rollout_gradients: neighbor snapshots (sync_every > 1) are not in the state checkpoint; "
                          "use sync_every=1")
    if getattr(sim.partition, "balance_every", 0):
        raise ConfigError("rollout_gradients: a spatial partitioner that moves its borders (balance_every > 0) "
                          "would re-run steps on other borders; use balance_every=0")
    return steps, min(every, steps)


def _restore(sim: Simulation, saved: SavedState, leaves: list[Tensor] | None = None) -> None:
    """Load ``saved`` into ``sim``. With ``leaves``: every float field and env tensor becomes a
    fresh leaf that requires a gradient (appended to ``leaves``), the state holding a copy of it
    (so that a substep may write it in place).
    """
    sim.load_state(saved)
    if leaves is None:
        return
    for pop in sim.state.populations.values():
        for k, v in pop.fields().items():
            if v.is_floating_point():
                leaves.append(v.requires_grad_())
                pop[k] = v.clone()
    for k, v in sim.state.env.items():
        if v.is_floating_point():
            leaves.append(v.requires_grad_())
            sim.state.env[k] = v.clone()


def _float_tensors(state: State) -> list[Tensor]:
    """The float fields and env tensors of ``state``, in the order :func:`_restore` makes leaves."""
    out = [v for pop in state.populations.values() for v in pop.fields().values() if v.is_floating_point()]
    return out + [v for v in state.env.values() if v.is_floating_point()]


def _same_rows(a: State, b: State, step: int) -> None:
    for name, pop in a.populations.items():
        if not torch.equal(pop[UID], b.populations[name][UID]):
            raise SimulationError(f"rollout_gradients: re-running step {step} gave other rows of '{name}' than the "
                                  "first run (a substep that is not a function of the state, the step and the seed?)")


def rollout_gradients(sim: Simulation, steps: int, observe: Observe, loss: Loss,
                      checkpoint_every: int | None = None) -> tuple[Tensor, dict[str, Tensor]]:
    """Run ``steps`` steps and return ``(loss, d loss / d parameters)`` in bounded memory.

    Args:
        sim: A differentiable simulation (``grad=``); it ends at its state after the steps
            (without autograd history).
        steps: Steps to run (>= 1).
        observe: ``observe(sim) -> Tensor`` after every step: a float tensor of the same shape
            each step, computed from the state with autograd (e.g. a metric summed over ranks
            with :func:`~agentsim.grad.autograd.sum_over_ranks`), the same on every rank.
        loss: ``loss(y) -> scalar`` of the observations stacked ``[steps, ...]`` (the same on
            every rank).
        checkpoint_every: Steps between state checkpoints (default: ``round(sqrt(steps))``,
            the fewest copies in all; ``1``: a copy per step, each step run twice).

    Returns:
        The loss (0-dim float64, detached) and each of ``sim.grad_params``' gradient (0-dim
        float64, added over ranks), as :meth:`Simulation.parameter_gradients` gives for the
        graph of the whole run.
    """
    steps, every = _check(sim, steps, checkpoint_every)
    names = list(sim.grad_params)
    params = [sim.grad_params[n] for n in names]
    start = sim.state.step
    # Pass 1: no history; a checkpoint at the start of every segment, every observation.
    checkpoints: dict[int, SavedState] = {}
    observed = []
    with sim.without_history():
        for t in range(steps):
            if t % every == 0:
                checkpoints[t] = sim.save_state()
            sim.step()
            observed.append(observe(sim).detach())
        final = sim.save_state()
    y = torch.stack(observed).requires_grad_()
    value = loss(y)
    (g_y,) = torch.autograd.grad(value, y)
    totals = [torch.zeros((), dtype=torch.float64) for _ in params]
    adjoint: list[Tensor] | None = None  # d loss / d float tensors of the state after step t (rows of it)
    after = final
    for seg in sorted(checkpoints, reverse=True):
        # Re-run the segment without history, keeping the state before each of its steps.
        before = {seg: checkpoints[seg]}
        stop = min(seg + every, steps)
        with sim.without_history():
            _restore(sim, checkpoints[seg])
            for t in range(seg + 1, stop):
                sim.step()
                before[t] = sim.save_state()
        for t in range(stop - 1, seg - 1, -1):  # step t + 1 of the run, from the state after step t
            leaves: list[Tensor] = []
            _restore(sim, before[t], leaves)
            sim.step()
            _same_rows(sim.state, after.state, start + t + 1)
            term = (g_y[t] * observe(sim)).sum()
            if adjoint is not None:
                for a, x in zip(adjoint, _float_tensors(sim.state), strict=True):
                    if x.requires_grad:
                        term = term + (a * x).sum()
            term = reach_exchanges(term, sim.partition.grad_links)
            got = torch.autograd.grad(term, params + leaves, allow_unused=True)
            for k in range(len(params)):
                if got[k] is not None:
                    totals[k] = totals[k] + got[k]
            adjoint = [g if g is not None else torch.zeros_like(x) for g, x in zip(got[len(params):], leaves,
                                                                                 strict=True)]
            after = before[t]
    _restore(sim, final)  # and the figures of the first pass only
    return value.detach(), dict(zip(names, sum_gradients(totals, sim.comm), strict=True))
