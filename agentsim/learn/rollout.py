"""A rollout: what every agent of a policy's population saw, did and got over one episode, keyed by
uid, and the advantages of generalized advantage estimation (GAE).

Collection is rank-local (the sharded buffer): each rank keeps the samples of the agents it held
when they acted and the rewards of the agents it held after each step. An agent that migrates
mid-episode leaves its samples on several ranks, so at the end of the episode every sample and
reward moves to the agent's *training owner*, ``(uid // TILE) % world_size``: each agent's whole
trajectory then sits on one rank, whatever the partitioner did, and which rank trains on which
agents does not depend on where they wandered.

A sample at step ``t`` is the action taken while computing step ``t``; its reward is the agent's
reward after that step (0 if the agent died during it). A trajectory ends where the reward function
flagged the agent done after a step, and at the agent's last sample (death, or the episode's
horizon: episodes are finite, nothing is bootstrapped past it).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from agentsim.core.comm import Comm
from agentsim.core.policy import TILE, Step

__all__ = ["Rollout", "gae", "owner_of", "to_owners"]


def owner_of(uid: Tensor, world_size: int) -> Tensor:
    """``[n]`` int64 training owner of each uid: tiles of :data:`~agentsim.core.policy.TILE` uids, dealt
    out in turn.
    """
    return torch.div(uid, TILE, rounding_mode="floor") % world_size


@dataclass
class Rollout:
    """One episode's samples of this rank's agents, sorted by (uid, step).

    Attributes:
        uid, step: ``[m]`` int64.
        obs: ``[m, d]`` float32; action ``[m]`` int64 or ``[m, D]`` float32; logp, value ``[m]`` float32.
        reward: ``[m]`` float32 (0 where the agent died during the step).
        done: ``[m]`` bool: the agent's trajectory ends with this sample (flagged done by the reward
            function, or the last sample of its uid).
    """

    uid: Tensor
    step: Tensor
    obs: Tensor
    action: Tensor
    logp: Tensor
    value: Tensor
    reward: Tensor
    done: Tensor

    @property
    def n(self) -> int:
        """Number of samples."""
        return int(self.uid.shape[0])

    @staticmethod
    def gather(steps: list[Step], rewards: list[tuple[int, Tensor, Tensor, Tensor]], comm: Comm,
               like: Step) -> Rollout:
        """Bring every sample and reward to its training owner and join them (a collective).

        Args:
            steps: What this rank's actor recorded (one :class:`~agentsim.core.policy.Step` per step).
            rewards: ``(step, uid [k], reward [k], done [k] bool)`` of this rank's agents after each
                step.
            like: An empty step of the right dtypes and shapes (for ranks that recorded nothing).
        """
        fields = _concat([{"uid": s.uid, "step": torch.full_like(s.uid, s.step), "obs": s.obs,
                           "action": s.action, "logp": s.logp, "value": s.value} for s in steps],
                         {"uid": like.uid, "step": like.uid, "obs": like.obs, "action": like.action,
                          "logp": like.logp, "value": like.value})
        paid = _concat([{"uid": uid, "step": torch.full_like(uid, t), "reward": r.to(torch.float32),
                         "done": d.to(torch.int8)} for t, uid, r, d in rewards],
                       {"uid": like.uid, "step": like.uid, "reward": like.logp, "done": like.uid.to(torch.int8)})
        fields = to_owners(fields, comm)
        paid = to_owners(paid, comm)
        horizon = int(max([int(fields["step"].max()) if fields["uid"].numel() else 0, 0])) + 2
        key = fields["uid"] * horizon + fields["step"]
        order = torch.argsort(key)
        fields = {k: v[order] for k, v in fields.items()}
        key = key[order]
        paid_key = paid["uid"] * horizon + paid["step"]
        paid_order = torch.argsort(paid_key)
        paid_key, paid_reward, paid_done = paid_key[paid_order], paid["reward"][paid_order], paid["done"][paid_order]
        at = torch.searchsorted(paid_key, key).clamp(max=max(paid_key.numel() - 1, 0))
        found = (paid_key.index_select(0, at) == key) if paid_key.numel() else torch.zeros_like(key, dtype=torch.bool)
        reward = torch.where(found, paid_reward.index_select(0, at) if paid_key.numel() else key.float(), 0.0)
        flagged = found & (paid_done.index_select(0, at) != 0) if paid_key.numel() else found
        nxt = torch.ones_like(key, dtype=torch.bool)  # the last sample of each uid
        if key.numel() > 1:
            nxt[:-1] = key[1:] != key[:-1] + 1
        nxt |= flagged
        return Rollout(fields["uid"], fields["step"], fields["obs"], fields["action"], fields["logp"],
                       fields["value"], reward.to(torch.float32), nxt)


def _concat(parts: list[dict[str, Tensor]], like: dict[str, Tensor]) -> dict[str, Tensor]:
    if not parts:
        return {k: v[:0] for k, v in like.items()}
    return {k: torch.cat([p[k] for p in parts]) for k in parts[0]}


def to_owners(fields: dict[str, Tensor], comm: Comm) -> dict[str, Tensor]:
    """Rows (``fields["uid"]`` ``[m]`` and columns of ``m`` rows) stay on their training owner or
    travel to it (one exchange, a collective).
    """
    if comm.world_size == 1:
        return fields
    owner = owner_of(fields["uid"], comm.world_size)
    away = owner != comm.rank
    rows = torch.nonzero(away).squeeze(1)
    got = comm.exchange_rows(fields, owner[rows], rows)
    kept = {k: v[~away] for k, v in fields.items()}
    return {k: torch.cat([kept[k], got[k]]) for k in fields}


def gae(rollout: Rollout, gamma: float, lam: float) -> tuple[Tensor, Tensor]:
    """Advantages and returns ``[m]`` float32 (GAE(gamma, lambda)) of a rollout sorted by (uid, step):
    ``delta_t = r_t + gamma V_{t+1} (1 - done_t) - V_t``, ``A_t = delta_t + gamma lambda (1 - done_t)
    A_{t+1}``, computed one step at a time from the last, in float64.
    """
    value = rollout.value.to(torch.float64)
    reward = rollout.reward.to(torch.float64)
    alive = ~rollout.done
    nxt = torch.arange(1, rollout.n + 1, device=value.device).clamp(max=max(rollout.n - 1, 0))
    next_value = torch.where(alive, value.index_select(0, nxt) if rollout.n else value, 0.0)
    delta = reward + gamma * next_value - value
    adv = torch.zeros_like(value)
    if rollout.n:
        for t in range(int(rollout.step.max()), int(rollout.step.min()) - 1, -1):
            rows = torch.nonzero(rollout.step == t).squeeze(1)
            follow = torch.where(alive.index_select(0, rows), adv.index_select(0, nxt.index_select(0, rows)), 0.0)
            adv.index_copy_(0, rows, delta.index_select(0, rows) + gamma * lam * follow)
    return adv.to(torch.float32), (adv + value).to(torch.float32)
