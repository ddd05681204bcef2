"""Episodes: a model run for ``horizon`` steps with an actor for its policy, the rewards of every
step, and returns summed exactly over ranks (what training collects and what evaluation reports).

Examples:
    >>> from agentsim.models.spillover import MODEL, protect_if_exposed
    >>> returns = evaluate(MODEL, protect_if_exposed, agents=300, seeds=[1, 2], horizon=10)
    >>> len(returns), all(r <= 0 for r in returns)  # rewards are costs
    (2, True)
    >>> returns == evaluate(MODEL, protect_if_exposed, agents=300, seeds=[1, 2], horizon=10)
    True
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch
from torch import Tensor

from agentsim.core import ops
from agentsim.core.comm import Comm, LocalComm
from agentsim.core.model import Model
from agentsim.core.policy import Actor, PolicySpec
from agentsim.engine.simulation import Simulation, check_agents, check_seed, check_steps
from agentsim.errors import ConfigError
from agentsim.learn.rollout import to_owners

__all__ = ["EpisodeRewards", "evaluate", "exact_sums", "policy_spec", "run_episode"]

FRAC_BITS = 24  # fixed-point bits of the exact sums (advantage statistics, returns)

EpisodeRewards = list[tuple[int, Tensor, Tensor, Tensor]]
"""Per step: (step, uid ``[n]`` int64, reward ``[n]``, done ``[n]`` bool) of this rank's agents of the
policy's population."""


def exact_sums(comm: Comm, values: Iterable[Tensor], counts: Iterable[int] = ()) -> list[float]:
    """Sums over every rank of each tensor in ``values`` (fixed point with 24 fractional bits, so
    the result has the same bits on any number of ranks), then of each integer in ``counts``.
    """
    values, counts = list(values), list(counts)
    # Stacked on the CPU, whatever the values' device (the comm moves the sums to its own).
    parts = [ops.to_fixed(v, FRAC_BITS).sum().cpu() for v in values] + [torch.tensor(c) for c in counts]
    if not parts:
        return []
    total = comm.sum_int64(torch.stack(parts).to(torch.int64)).tolist()
    n = len(values)
    return [v * 2.0**-FRAC_BITS if k < n else float(v) for k, v in enumerate(total)]


def policy_spec(model: Model, name: str | None) -> PolicySpec:
    """The model's policy ``name`` (default: its only one), or a ConfigError naming the choices."""
    policies = model.policies
    if not policies:
        raise ConfigError(f"model '{model.name}' declares no policy (see @model.policy)")
    if name is None:
        if len(policies) > 1:
            raise ConfigError(f"model '{model.name}' has several policies ({', '.join(policies)}): name one")
        return next(iter(policies.values()))
    if name not in policies:
        raise ConfigError(f"model '{model.name}' has no policy {name!r} (policies: {', '.join(policies)})")
    return policies[name]


def reward_of(model: Model, spec: PolicySpec) -> Any:
    """The model's reward function for the policy's population (a ConfigError if none)."""
    rewards = model.rewards
    if spec.population not in rewards:
        raise ConfigError(f"model '{model.name}' has no reward for '{spec.population}': declare one "
                          f"with @model.reward({spec.population!r})")
    return rewards[spec.population]


def run_episode(model: Model, spec: PolicySpec, actor: Actor | Any, agents: int, seed: int, horizon: int, *,
                comm: Comm | None = None, device: str | torch.device = "cpu", partition: str | None = None,
                **partition_options: Any) -> EpisodeRewards:
    """Run ``horizon`` steps of ``model`` with ``actor`` for policy ``spec`` (on this rank's share of
    the agents); return the rewards of every step.
    """
    reward_fn = reward_of(model, spec)
    sim = Simulation(model, agents, seed, device, comm=comm, partition=partition, policies={spec.name: actor},
                     **partition_options)
    pop = spec.population
    rewards: EpisodeRewards = []
    for _ in range(horizon):
        sim.step()
        view = sim.view()
        reward, done = split_reward(reward_fn(view), view[pop].n, pop)
        rewards.append((sim.state.step, view[pop]["uid"], reward, done))
    return rewards


def split_reward(value: Any, n: int, population: str) -> tuple[Tensor, Tensor]:
    """A reward function's result as (reward ``[n]`` float, done ``[n]`` bool), or a ConfigError
    that says what was expected.
    """
    if isinstance(value, tuple):
        if len(value) != 2:
            raise ConfigError(f"reward of '{population}': expected a tensor or a (reward, done) pair "
                              f"(got a tuple of {len(value)})")
        reward, done = torch.as_tensor(value[0]), torch.as_tensor(value[1])
        if done.dtype != torch.bool:
            raise ConfigError(f"reward of '{population}': done must be a bool tensor (got {done.dtype})")
        if tuple(done.shape) != (n,):
            raise ConfigError(f"reward of '{population}': expected [{n}] done flags (got {list(done.shape)})")
    else:
        reward = torch.as_tensor(value)
        done = torch.zeros(reward.shape[:1], dtype=torch.bool, device=reward.device)
    if tuple(reward.shape) != (n,) or reward.is_complex():
        raise ConfigError(f"reward of '{population}': expected [{n}] real values "
                          f"(got {list(reward.shape)} {reward.dtype})")
    return reward if reward.is_floating_point() else reward.to(torch.float32), done


def mean_return(rewards: EpisodeRewards, comm: Comm) -> tuple[float, int]:
    """(summed reward over all steps, agents and ranks, divided by the number of agents that were
    rewarded at least once; that number), exact on any number of ranks.
    """
    paid = {"uid": torch.cat([u for _, u, _, _ in rewards]) if rewards else torch.zeros(0, dtype=torch.int64),
            "reward": torch.cat([r.to(torch.float64) for _, _, r, _ in rewards]) if rewards
            else torch.zeros(0, dtype=torch.float64)}
    paid = to_owners(paid, comm)  # an agent that migrated is counted once, by its owner
    total, n = exact_sums(comm, [paid["reward"]], [torch.unique(paid["uid"]).numel()])
    return total / max(n, 1), int(n)


def evaluate(model: Model, actor: Actor | Any = "random", *, agents: int | None = None, seeds: Iterable[int] = (0,),
             horizon: int = 40, policy: str | None = None, params: Mapping[str, Any] | None = None,
             comm: Comm | None = None, device: str = "cpu", partition: str | None = None,
             **partition_options: Any) -> list[float]:
    """The mean return per agent of one episode per seed, with ``actor`` choosing the policy's
    actions: a trained :class:`~agentsim.core.policy.PolicyNet`, an actor, a rule ``obs -> actions``, or
    ``"random"``. On several ranks (``comm``) every rank gets the same list.
    """
    model = model.configure(params=params) if params else model
    spec = policy_spec(model, policy)
    agents = check_agents(model.default_agents if agents is None else agents)
    horizon = check_steps(horizon)
    comm = comm if comm is not None else LocalComm()
    returns = []
    for seed in seeds:
        rewards = run_episode(model, spec, actor, agents, check_seed(seed), horizon, comm=comm, device=device,
                              partition=partition, **partition_options)
        returns.append(mean_return(rewards, comm)[0])
    return returns
