"""Policies: agents whose actions come from a network shared by their population.

A model declares a policy with :meth:`Model.policy <agentsim.core.model.Model.policy>` on an
observation function; the declaration is an ordinary substep (it runs in definition order,
on every partitioner) that

1. calls the observation function: ``[n, observations]`` float32 for the population's
   agents (own fields, and neighbor aggregates through ``ctx.neighbors``);
2. asks the run's :class:`Actor` for an action per agent, and writes it to the action field
   (int64 ``[n]`` for ``actions=K`` discrete choices, float32 ``[n, D]`` for ``action_dim=D``
   continuous ones).

Which actor runs is the run's choice (``Simulation(..., policies={name: actor})``): uniform
random actions by default (:class:`RandomActor`), a rule (:class:`RuleActor`), or a network
(:class:`NetworkActor`, what training uses). Actions never depend on rank or row order: a
network is evaluated in fixed zero-padded tiles of rows sorted by uid (the bits of a row do
not depend on the other rows of its tile, see DISTRIBUTED_NOTES), and every action is drawn
with the counter-based generator keyed by (seed, uid, step, policy name). No autograd history
is kept while acting. The network runs on one thread (:func:`one_thread`): with more threads,
torch's CPU kernels split some reductions differently (a 64 -> 1 linear layer gave other bits on
2 threads than on 1), and training must not depend on how many threads a process has.

Examples:
    >>> import torch
    >>> net = PolicyNet(observations=3, actions=2, hidden=(8,))
    >>> actor = NetworkActor(net)
    >>> from agentsim.core.random import CounterRNG
    >>> uid = torch.arange(5)
    >>> a = actor.act(uid, torch.zeros(5, 3), CounterRNG(1).at(1, "decide"))
    >>> a.dtype, a.shape, bool(torch.equal(a, actor.act(uid, torch.zeros(5, 3), CounterRNG(1).at(1, "decide"))))
    (torch.int64, torch.Size([5]), True)
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import Tensor, nn

from agentsim.core.random import StepRNG
from agentsim.errors import ConfigError

__all__ = ["TILE", "Actor", "NetworkActor", "PolicyNet", "PolicySpec", "RandomActor", "RuleActor", "Step",
           "evaluate_tiled", "one_thread"]

TILE = 256  # rows per tile: a multiple of 64, so elementwise ops never take a scalar tail


@dataclass(frozen=True)
class PolicySpec:
    """A declared policy.

    Attributes:
        name: The policy (and its substep, and its random stream).
        population: Whose agents act.
        action: The field the action is written to.
        observations: Features per agent the observation function returns.
        actions: Number of discrete actions (0: continuous).
        action_dim: Dimension of a continuous action (0: discrete).
        observe: ``observe(ctx) -> [n, observations]`` float32.
    """

    name: str
    population: str
    action: str
    observations: int
    actions: int
    action_dim: int
    observe: Callable[[Any], Tensor]

    @property
    def discrete(self) -> bool:
        """Whether the actions are discrete choices."""
        return self.actions > 0


@dataclass
class Step:
    """What a network actor did for the agents of one substep call (for training).

    Attributes:
        step: The step.
        uid: ``[n]`` int64.
        obs: ``[n, observations]`` float32.
        action: ``[n]`` int64 or ``[n, D]`` float32.
        logp: ``[n]`` float32 log-probability of the action.
        value: ``[n]`` float32 value estimate.
    """

    step: int
    uid: Tensor
    obs: Tensor
    action: Tensor
    logp: Tensor
    value: Tensor


class Actor(Protocol):
    """Chooses the actions of a policy's agents."""

    def act(self, uid: Tensor, obs: Tensor, rng: StepRNG) -> Tensor:
        """Actions for the agents ``uid`` ``[n]`` with observations ``obs`` ``[n, d]``; ``rng`` is
        bound to the step with the policy's name as stream.
        """
        ...


class PolicyNet(nn.Module):
    """A shared actor-critic MLP: observations ``[n, d]`` -> (logits ``[n, K]`` or mean ``[n, D]``,
    value ``[n]``). Orthogonal init (gain sqrt(2) in hidden layers, 0.01 on the policy head, 1 on
    the value head), tanh activations; a continuous policy has a learned log std per dimension.

    Args:
        observations: Input features.
        actions: Discrete actions (or 0).
        action_dim: Continuous action dimension (or 0).
        hidden: Hidden layer widths (shared by the actor and the critic trunks, separate weights).
    """

    def __init__(self, observations: int, actions: int = 0, action_dim: int = 0,
                 hidden: Sequence[int] = (64, 64)) -> None:
        super().__init__()
        if (actions > 0) == (action_dim > 0):
            raise ConfigError(f"PolicyNet: give actions=K (discrete) or action_dim=D (continuous) "
                              f"(got actions={actions}, action_dim={action_dim})")
        self.actions, self.action_dim = actions, action_dim
        self.actor = _mlp(observations, hidden, actions or action_dim, 0.01)
        self.critic = _mlp(observations, hidden, 1, 1.0)
        self.log_std = nn.Parameter(torch.zeros(action_dim)) if action_dim else None

    def forward(self, obs: Tensor) -> tuple[Tensor, Tensor]:
        """(logits or mean, value ``[n]``)."""
        return self.actor(obs), self.critic(obs).squeeze(-1)


def _mlp(n_in: int, hidden: Sequence[int], n_out: int, gain_out: float) -> nn.Sequential:
    layers: list[nn.Module] = []
    for width in hidden:
        layers += [_init(nn.Linear(n_in, width), math.sqrt(2)), nn.Tanh()]
        n_in = width
    layers.append(_init(nn.Linear(n_in, n_out), gain_out))
    return nn.Sequential(*layers)


def _init(layer: nn.Linear, gain: float) -> nn.Linear:
    nn.init.orthogonal_(layer.weight, gain)
    nn.init.zeros_(layer.bias)
    return layer


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """Run the block with one torch intra-op thread (restored after): network bits that do not
    depend on the thread count (see the module docstring). About 7 us per use.
    """
    threads = torch.get_num_threads()
    if threads == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def evaluate_tiled(net: nn.Module, obs: Tensor, tile: int = TILE) -> tuple[Tensor, Tensor]:
    """``net(obs)`` row by row independent of the batch: rows go through the network in tiles of
    ``tile`` rows, the last one zero-padded, so a row's output has the same bits however many
    rows there are and wherever it sits (``obs`` ``[n, d]``).
    """
    n = obs.shape[0]
    n_pad = -(-max(n, 1) // tile) * tile
    padded = obs.new_zeros((n_pad, *obs.shape[1:]))
    padded[:n] = obs
    heads, values = [], []
    for start in range(0, n_pad, tile):
        head, value = net(padded[start:start + tile])
        heads.append(head)
        values.append(value)
    return torch.cat(heads)[:n], torch.cat(values)[:n]


def sample(head: Tensor, log_std: Tensor | None, uid: Tensor, rng: StepRNG) -> tuple[Tensor, Tensor]:
    """Actions and their log-probabilities from a policy head: inverse-CDF sampling of the
    categorical (discrete) or ``mean + std * normal`` (continuous), with draws keyed by uid.
    """
    if log_std is None:
        logp_all = torch.log_softmax(head.to(torch.float64), -1)
        cdf = torch.cumsum(logp_all.exp(), -1)
        u = rng.uniform(uid).unsqueeze(-1) * cdf[:, -1:]
        action = (cdf <= u).sum(-1).clamp(max=head.shape[-1] - 1)
        return action, logp_all.gather(-1, action.unsqueeze(-1)).squeeze(-1).to(torch.float32)
    noise = rng.normal(uid, draws=head.shape[-1], dtype=head.dtype)
    action = head + log_std.exp() * noise
    return action, gaussian_logp(action, head, log_std)


def gaussian_logp(action: Tensor, mean: Tensor, log_std: Tensor) -> Tensor:
    """Log density ``[n]`` of a diagonal Gaussian."""
    z = (action - mean) * torch.exp(-log_std)
    return (-0.5 * z * z - log_std - 0.5 * math.log(2 * math.pi)).sum(-1)


class NetworkActor:
    """Acts with a :class:`PolicyNet` (see the module docstring); with ``record``, keeps every
    call's :class:`Step` in :attr:`steps` (what a rollout collects).

    Args:
        net: The network (in eval mode while acting).
        record: Keep what was done, for training.
        tile: Rows per evaluation tile.
    """

    def __init__(self, net: PolicyNet, record: bool = False, tile: int = TILE) -> None:
        self.net = net
        self.record = record
        self.tile = tile
        self.steps: list[Step] = []

    def act(self, uid: Tensor, obs: Tensor, rng: StepRNG) -> Tensor:
        """Sample actions (see the module docstring)."""
        order = torch.argsort(uid)
        uid_s, obs_s = uid[order], obs[order]
        with torch.no_grad(), one_thread():
            head, value = evaluate_tiled(self.net, obs_s, self.tile)
            action_s, logp_s = sample(head, self.net.log_std, uid_s, rng)
        if self.record:
            self.steps.append(Step(rng.step, uid_s, obs_s, action_s, logp_s, value))
        action = torch.empty_like(action_s)
        action[order] = action_s
        return action


class RandomActor:
    """Uniform random actions (discrete) or standard normal ones (continuous), keyed by uid."""

    def __init__(self, spec: PolicySpec) -> None:
        self.spec = spec

    def act(self, uid: Tensor, obs: Tensor, rng: StepRNG) -> Tensor:
        """Random actions."""
        if self.spec.discrete:
            return rng.integers(uid, high=self.spec.actions)
        return rng.normal(uid, draws=self.spec.action_dim, dtype=torch.float32)


class RuleActor:
    """Actions from a rule ``rule(obs) -> actions`` (a hand-written policy)."""

    def __init__(self, rule: Callable[[Tensor], Tensor]) -> None:
        self.rule = rule

    def act(self, uid: Tensor, obs: Tensor, rng: StepRNG) -> Tensor:
        """The rule's actions."""
        return self.rule(obs)


def resolve_actors(specs: Mapping[str, PolicySpec], given: Mapping[str, Any] | None) -> dict[str, Actor]:
    """An actor per declared policy: the given one (an actor, a :class:`PolicyNet`, a rule
    ``obs -> actions``, or ``"random"``), random for the others.
    """
    given = dict(given or {})
    for name in given:
        if name not in specs:
            raise ConfigError(f"policies: the model has no policy {name!r} (policies: {', '.join(specs) or 'none'})")
    out: dict[str, Actor] = {}
    for name, spec in specs.items():
        actor = given.get(name, "random")
        if isinstance(actor, str) and actor == "random":
            out[name] = RandomActor(spec)
        elif isinstance(actor, PolicyNet):
            out[name] = NetworkActor(actor)
        elif hasattr(actor, "act"):
            out[name] = actor
        elif callable(actor):
            out[name] = RuleActor(actor)
        else:
            raise ConfigError(f"policies[{name!r}]: expected an actor, a rule obs -> actions, or 'random' "
                              f"(got {actor!r})")
    return out
