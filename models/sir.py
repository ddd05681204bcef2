"""SIR epidemic on a static contact network; one step is one day.

Each day, synchronously:

1. ``infect``: a susceptible person with ``k`` infectious contacts becomes infected
   with probability ``1 - (1 - beta)**k`` (each contact transmits independently
   with probability ``beta``);
2. ``recover``: a person infected on an earlier day recovers with probability
   ``gamma``, so the infectious period is geometric with mean ``1 / gamma`` days.

``status`` is 0 (S), 1 (I) or 2 (R); ``infected_day`` is the day of infection (-1 if never).
Initially ``round(initial_prevalence * n)`` people (at least one), chosen by a
random key per uid, are infected.

Reference: for a large network with Poisson degrees (Erdős–Rényi), the
discrete-time edge-based compartmental model of Miller, Slim & Volz (2012),
:func:`edge_based_reference`, gives the expected S, I, R curves; its final size
equals the bond-percolation result ``z = 1 - exp(-k T z)`` with transmissibility
``T = 1 - gamma (1 - beta) / (1 - (1 - gamma)(1 - beta))``. The mass-action ODE
with ``R0 = beta k / gamma`` overestimates the final size on a network (0.94 vs
about 0.87 with the defaults) because infected people deplete their own contacts.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from agentsim import (
    ConfigError,
    Context,
    Graph,
    InitContext,
    MetricsContext,
    Model,
    Param,
    erdos_renyi,
    from_edge_list_csv,
    layered_contacts,
    neighbor_reduce,
    watts_strogatz,
)
from agentsim.core import ops
from agentsim.core.params import Params
from agentsim.core.random import mix64_int, stream_id

S, I, R = 0, 1, 2  # noqa: E741  the compartments' names

NETWORKS = ("erdos_renyi", "watts_strogatz", "layered", "csv")

model = Model(
    "sir",
    params={
        "beta": Param(0.03, "per-contact daily transmission probability", ge=0, le=1),
        "gamma": Param(0.1, "daily recovery probability (mean infectious period 1/gamma days)", gt=0, le=1),
        "mean_degree": Param(10.0, "mean number of contacts per person", ge=0),
        "initial_prevalence": Param(0.001, "fraction infected at day 0", ge=0, le=1),
        "network": Param("erdos_renyi", "contact network: " + ", ".join(NETWORKS), choices=NETWORKS),
        "rewire": Param(0.1, "Watts-Strogatz rewiring probability", ge=0, le=1),
        "edges_csv": Param("", "edge-list CSV path when network = csv"),
    },
    description="SIR epidemic on a static contact network (one step = one day)",
    default_agents=10_000,
)


def infection_table(beta: float, max_k: int, device: torch.device) -> torch.Tensor:
    """``q[k] = (1 - beta)**k``: probability of escaping ``k`` infectious contacts (float64)."""
    k = torch.arange(max_k + 1, dtype=torch.float64)  # on the CPU: the same bits whatever the device
    return (torch.exp(k * math.log1p(-beta)) if beta < 1 else (k == 0).to(torch.float64)).to(device)


@model.substep(reads=["person.status"], writes=["person.status", "person.infected_day"],
               neighbors={"person": ["status"]}, reach="graph")
def infect(ctx: Context) -> None:
    """S -> I with probability 1 - (1 - beta)**k, k = number of infectious contacts."""
    people = ctx["person"]
    graph: Graph = ctx.space
    nb = ctx.neighbors("person")
    uid, status = people["uid"], people["status"]
    k = neighbor_reduce(graph, nb, nb["status"] == I, "count")  # int32 [n]: infectious contacts, 4 B a person
    # Draws are keyed by uid, so drawing only for the candidates gives the same numbers.
    cand = ops.flatnonzero((status == S) & (k > 0))
    k_cand = k.index_select(0, cand)
    del k  # the day's largest temporary, freed before the state is written
    escape = infection_table(ctx.params["beta"], int(k_cand.max()) if k_cand.numel() else 0, ctx.device)
    u = ctx.rng.uniform(uid.index_select(0, cand))  # stream "infect"
    new = cand.index_select(0, ops.flatnonzero(u >= escape.index_select(0, k_cand)))
    # In place (declared writes): a new copy of the state every day would leave holes of its
    # size in the heap (at 10M people, 18 B a person of memory held for nothing).
    status.index_fill_(0, new, I)
    people["infected_day"].index_fill_(0, new, ctx.step)


@model.substep(reads=["person.infected_day"], writes=["person.status"])
def recover(ctx: Context) -> None:
    """I -> R with probability gamma, for people infected before today."""
    people = ctx["person"]
    status = people["status"]
    cand = ops.flatnonzero((status == I) & (people["infected_day"] < ctx.step))
    u = ctx.rng.uniform(people["uid"].index_select(0, cand))  # stream "recover"
    status.index_fill_(0, cand.index_select(0, ops.flatnonzero(u < ctx.params["gamma"])), R)  # in place


def lowest(key: torch.Tensor, k: int) -> torch.Tensor:
    """Mask ``[n]`` of the ``k`` smallest keys, ties taken in row order: the first ``k`` of a stable
    argsort, without sorting (a selection: about 1 byte per key more at the peak, not 24).
    """
    n = key.numel()
    if k <= 0 or k >= n:
        return torch.full((n,), k > 0, dtype=torch.bool, device=key.device)
    threshold = torch.kthvalue(key, k).values
    mask = key < threshold
    tied = torch.nonzero(key == threshold).squeeze(1)
    mask[tied[:k - int(mask.sum())]] = True
    return mask


def build_network(params: Params, n: int, seed: int) -> Graph:
    """The contact network the parameters ask for, a pure function of them and the run seed."""
    graph_seed = mix64_int(seed ^ stream_id("network"))
    net = params["network"]
    if net == "erdos_renyi":
        return erdos_renyi(n, params["mean_degree"], seed=graph_seed)
    if net == "watts_strogatz":
        k = max(2, 2 * round(params["mean_degree"] / 2))
        return watts_strogatz(n, k, params["rewire"], seed=graph_seed)
    if net == "layered":
        return layered_contacts(n, seed=graph_seed)
    if not params["edges_csv"]:
        raise ConfigError("network = csv needs edges_csv=PATH (a two-column edge list)")
    return from_edge_list_csv(params["edges_csv"], n_nodes=n)


@model.init
def init(ic: InitContext) -> Graph:
    """The contact network, and ``initial_prevalence`` of the people infected at day 0."""
    n = ic.n_agents
    uid = ic.uids("person", n)
    n_seed = min(n, max(1, round(ic.params["initial_prevalence"] * n))) if ic.params["initial_prevalence"] > 0 else 0
    seeded = lowest(ic.rng.bits(uid, "seed_infections"), n_seed)
    status = torch.full((n,), S, dtype=torch.int8, device=ic.device).masked_fill_(seeded, I)
    infected_day = torch.full((n,), -1, dtype=torch.int32, device=ic.device).masked_fill_(seeded, 0)
    ic.add("person", uid=uid, status=status, infected_day=infected_day)
    del seeded
    # The network last: the seeds' keys and their selection are freed before it is built.
    return build_network(ic.params, n, ic.seed).to(ic.device)


@model.metric(name="S", label="susceptible", color="tab:blue", panel="compartments",
              share_of=["S", "I", "R"], unit="fraction of the population")
def susceptible(state: MetricsContext) -> torch.Tensor:
    """People susceptible."""
    return state["person"]["status"] == S


@model.metric(name="I", label="infectious", color="tab:red", panel="compartments",
              share_of=["S", "I", "R"], unit="fraction of the population")
def infectious(state: MetricsContext) -> torch.Tensor:
    """People infectious."""
    return state["person"]["status"] == I


@model.metric(name="R", label="recovered", color="tab:green", panel="compartments",
              share_of=["S", "I", "R"], unit="fraction of the population")
def recovered(state: MetricsContext) -> torch.Tensor:
    """People recovered."""
    return state["person"]["status"] == R


MODEL = model


def edge_based_reference(beta: float, gamma: float, mean_degree: float, rho: float,
                         steps: int) -> dict[str, np.ndarray]:
    """Expected S, I, R fractions ``[steps + 1]`` for this model on a large Poisson network.

    Discrete-time edge-based compartmental model (Miller, Slim & Volz 2012), with the
    same event order as the model: transmissions from people infectious at the start
    of the day, then recoveries of people infected before today.
    ``theta``: probability that a random edge has not transmitted to its focal node;
    ``phi``: probability that the partner is infectious and has not transmitted.
    """
    psi = lambda x: math.exp(-mean_degree * (1.0 - x))  # noqa: E731  Poisson PGF (= its excess PGF)
    theta, phi = 1.0, rho
    s_list, i_list = [1.0 - rho], [rho]
    phi_s = (1.0 - rho) * psi(theta)
    for _ in range(steps):
        theta_new = theta - beta * phi
        phi_s_new = (1.0 - rho) * psi(theta_new)
        phi = phi * (1.0 - beta) * (1.0 - gamma) + (phi_s - phi_s_new)
        theta, phi_s = theta_new, phi_s_new
        s_new = (1.0 - rho) * psi(theta)
        i_list.append(i_list[-1] * (1.0 - gamma) + (s_list[-1] - s_new))
        s_list.append(s_new)
    s_arr, i_arr = np.asarray(s_list), np.asarray(i_list)
    return {"S": s_arr, "I": i_arr, "R": 1.0 - s_arr - i_arr}
