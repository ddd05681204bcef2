"""Spillover: people decide each day whether to avoid exposure to an epidemic in an animal reservoir.

Two populations on one contact network. ``host`` animals (a reservoir, as birds for West Nile
virus) run the SIR epidemic of :mod:`agentsim.models.sir` among themselves on an Erdős–Rényi
network. Every ``person`` meets ``contacts`` random hosts. People are dead-end hosts: they catch
the disease from infectious animals but pass it to nobody. Each day:

1. ``protect`` (a policy): each person observes whether they are still susceptible, how many of
   their host contacts are infectious (and the fraction), and the day within the episode; and
   chooses ``protect`` (1: avoid exposure today) or not (0);
2. ``host_infect``, ``host_recover``: the reservoir's SIR day;
3. ``spill``: an unprotected susceptible person with ``k`` infectious host contacts falls ill
   with probability ``1 - (1 - spill_beta)**k``.

A person's reward for the day is ``-(protection_cost * protect + illness_cost * ill today)``.
Because people infect nobody, one person's choice changes nobody else's risk: each person's best
response is also the best policy for the population, a threshold on the day's risk
``1 - (1 - spill_beta)**k`` against ``protection_cost / illness_cost`` (with the defaults: protect
from two infectious contacts on, not for one). The hand-written rule :func:`protect_if_exposed`
(protect whenever a contact is infectious) over-protects; random choices waste protection.

Partitioners: ``data`` (the default for training); ``spatial`` is refused (two populations share
the network's nodes: hosts are nodes ``0 .. H - 1``, people ``H .. H + P - 1``).
"""

from __future__ import annotations

import torch

from agentsim import Context, Graph, InitContext, MetricsContext, Model, Param, erdos_renyi
from agentsim.core.random import mix64_int, stream_id

from .sir import I, R, S, infection_table

OBSERVATIONS = 5
ILL = 1  # a person's status: 0 susceptible, 1 ill (for the rest of the episode)

model = Model(
    "spillover",
    params={
        "host_fraction": Param(0.5, "fraction of the agents that are reservoir hosts", gt=0, lt=1),
        "beta": Param(0.05, "host-to-host daily transmission probability per contact", ge=0, le=1),
        "gamma": Param(0.1, "daily recovery probability of a host", gt=0, le=1),
        "mean_degree": Param(10.0, "mean number of host-host contacts", ge=0),
        "initial_prevalence": Param(0.01, "fraction of hosts infected at day 0", ge=0, le=1),
        "contacts": Param(5, "hosts each person meets", ge=1),
        "spill_beta": Param(0.05, "daily probability that one infectious host contact makes a person ill", ge=0,
                            le=1),
        "protection_cost": Param(1.5, "cost of one day of protection", ge=0),
        "illness_cost": Param(20.0, "cost of falling ill", ge=0),
        "horizon": Param(40, "days of an episode (the policy observes the day over this)", ge=1),
    },
    description="People decide daily whether to avoid exposure to an epidemic in an animal reservoir",
    default_agents=10_000,
)


def _infectious_contacts(ctx: Context, of: str) -> torch.Tensor:
    """``[n]`` infectious hosts among the network contacts of each local agent of ``of``."""
    graph: Graph = ctx.space
    hosts = ctx.neighbors("host")
    return graph.count_neighbors_in(hosts["uid"][hosts["status"] == I], at=ctx[of]["uid"])


@model.policy("person", action="protect", observations=OBSERVATIONS, actions=2, reads=["person.status"],
              neighbors={"host": ["status"]}, reach="graph")
def protect(ctx: Context) -> torch.Tensor:
    """Avoid exposure today or not, from own status, infectious host contacts and the day."""
    people = ctx["person"]
    k = _infectious_contacts(ctx, "person").to(torch.float32)
    susceptible = (people["status"] == 0).to(torch.float32)
    day = torch.full_like(k, (ctx.step - 1) / ctx.params["horizon"])
    return torch.stack([susceptible, k / ctx.params["contacts"], (k > 0).to(torch.float32), k / 5, day], -1)


@model.substep(reads=["host.status"], writes=["host.status", "host.infected_day"], neighbors={"host": ["status"]},
               reach="graph")
def host_infect(ctx: Context) -> None:
    """Hosts: S -> I with probability 1 - (1 - beta)**k, k = infectious host contacts."""
    hosts = ctx["host"]
    k = _infectious_contacts(ctx, "host")
    uid, status = hosts["uid"], hosts["status"]
    cand = torch.nonzero((status == S) & (k > 0)).squeeze(1)
    k_cand = k.index_select(0, cand)
    escape = infection_table(ctx.params["beta"], int(k_cand.max()) if k_cand.numel() else 0, ctx.device)
    new = cand[ctx.rng.uniform(uid.index_select(0, cand)) >= escape.index_select(0, k_cand)]
    hosts["status"] = status.index_fill(0, new, I)
    hosts["infected_day"] = hosts["infected_day"].index_fill(0, new, ctx.step)


@model.substep(reads=["host.infected_day"], writes=["host.status"])
def host_recover(ctx: Context) -> None:
    """Hosts: I -> R with probability gamma, for hosts infected before today."""
    hosts = ctx["host"]
    status = hosts["status"]
    cand = torch.nonzero((status == I) & (hosts["infected_day"] < ctx.step)).squeeze(1)
    u = ctx.rng.uniform(hosts["uid"].index_select(0, cand))
    hosts["status"] = status.index_fill(0, cand[u < ctx.params["gamma"]], R)


@model.substep(reads=["person.protect"], writes=["person.status", "person.ill_day"], neighbors={"host": ["status"]},
               reach="graph")
def spill(ctx: Context) -> None:
    """People: an unprotected susceptible falls ill with probability 1 - (1 - spill_beta)**k."""
    people = ctx["person"]
    k = _infectious_contacts(ctx, "person")
    status = people["status"]
    cand = torch.nonzero((status == 0) & (people["protect"] == 0) & (k > 0)).squeeze(1)
    k_cand = k.index_select(0, cand)
    escape = infection_table(ctx.params["spill_beta"], int(k_cand.max()) if k_cand.numel() else 0, ctx.device)
    new = cand[ctx.rng.uniform(people["uid"].index_select(0, cand)) >= escape.index_select(0, k_cand)]
    people["status"] = status.index_fill(0, new, ILL)
    people["ill_day"] = people["ill_day"].index_fill(0, new, ctx.step)


@model.reward("person")
def cost(state: MetricsContext) -> torch.Tensor:
    """Minus the day's cost: protection, and illness for those who fell ill today."""
    people = state["person"]
    paid: torch.Tensor = (state.params["protection_cost"] * people["protect"].to(torch.float32)
                          + state.params["illness_cost"] * (people["ill_day"] == state.step).to(torch.float32))
    return -paid


@model.init
def init(ic: InitContext) -> Graph:
    """Hosts (nodes 0 .. H - 1) on an Erdős–Rényi network, ``initial_prevalence`` of them infected;
    each person (nodes H ..) linked to ``contacts`` random hosts; nobody ill, nobody protected.
    """
    p = ic.params
    n_host = max(1, min(ic.n_agents - 1, round(ic.n_agents * p["host_fraction"])))
    n_person = ic.n_agents - n_host
    hosts = erdos_renyi(n_host, p["mean_degree"], seed=mix64_int(ic.seed ^ stream_id("network")))
    src, dst = hosts.edges()
    person = n_host + ic.uids("person", n_person)
    # The network is built on the CPU (as erdos_renyi builds it), then moved to the run's device.
    linked = person.repeat_interleave(p["contacts"])
    picks = ic.rng.integers(linked, "contacts", n_host).cpu()
    graph = Graph.from_edges(torch.cat([src.to(torch.int64), linked.cpu()]),
                             torch.cat([dst.to(torch.int64), picks]), n_nodes=n_host + n_person).to(ic.device)
    host_uid = ic.uids("host", n_host)
    n_seed = min(n_host, max(1, round(p["initial_prevalence"] * n_host))) if p["initial_prevalence"] > 0 else 0
    seeded = torch.zeros(n_host, dtype=torch.bool, device=ic.device)
    seeded[torch.argsort(ic.rng.bits(host_uid, "seed_infections"), stable=True)[:n_seed]] = True
    ic.add("host", uid=host_uid, status=torch.where(seeded, I, S).to(torch.int8),
           infected_day=torch.where(seeded, 0, -1).to(torch.int32))
    ic.add("person", uid=person, status=torch.zeros(n_person, dtype=torch.int8),
           ill_day=torch.full((n_person,), -1, dtype=torch.int32), protect=torch.zeros(n_person, dtype=torch.int64))
    return graph


@model.metric(name="I_host")
def infectious_hosts(state: MetricsContext) -> torch.Tensor:
    """Hosts infectious."""
    return state["host"]["status"] == I


@model.metric()
def ill(state: MetricsContext) -> torch.Tensor:
    """People ill (since the start of the episode)."""
    return state["person"]["status"] == ILL


@model.metric()
def protecting(state: MetricsContext) -> torch.Tensor:
    """People protecting today."""
    return state["person"]["protect"] == 1


def protect_if_exposed(obs: torch.Tensor) -> torch.Tensor:
    """The hand-written rule: protect while susceptible whenever a host contact is infectious."""
    return ((obs[:, 0] > 0.5) & (obs[:, 2] > 0.5)).to(torch.int64)


MODEL = model
