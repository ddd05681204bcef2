"""Sugarscape (models/sugarscape.py): rule M against a one-agent-at-a-time loop, the invariants of
rules M, G_alpha and R, the exact Gini, row order, and the same bits on 1-4 processes with either
partitioner (every spatial layout, and load balancing).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from agentsim.models.sugarscape import DIRECTIONS, MODEL, WEALTH_CAP, gini, gini_of_counts, landscape
from equivalence import STEPS, WORLD_SIZES, Case, check_figures, check_same_as_reference, reference_runs, run_cases
from equivalence import run_on_subgroups as run_partition_on_subgroups

from agentsim import Simulation
from agentsim.core.comm import LocalComm
from agentsim.core.random import CounterRNG
from agentsim.runner.launch import run_ranks

SMALL = {"density": 0.3, "vision_max": 4}  # 14 x 14 cells for 60 agents: crowded, many contests


def by_uid(sim: Simulation) -> dict[str, np.ndarray]:
    agents = sim.state["agent"]
    order = torch.argsort(agents["uid"])
    return {k: agents[k][order].numpy().copy() for k in agents.keys()}


def env(sim: Simulation, name: str) -> np.ndarray:
    return sim.state.env[name].reshape(-1).numpy().copy()


# --------------------------------------------------------------------------- rule M
def brute_force_moves(agents: dict[str, np.ndarray], sugar: np.ndarray, side: int, seed: int, step: int,
                      vision_max: int) -> tuple[np.ndarray, dict[str, int]]:
    """Rule M one agent at a time (Python loops): the cells after one step, and counts of how
    often the rule's tie-breaks decided."""
    rng = CounterRNG(seed)
    uid = torch.from_numpy(agents["uid"])
    direction_keys = rng.bits(uid, step, "direction", draws=4).numpy()
    contest_keys = rng.bits(uid, step, "contest").numpy()
    occupied = set(agents["cell"].tolist())
    seen = {"distance ties": 0, "direction ties": 0, "contests": 0}
    targets = []
    for i in range(len(uid)):
        r, c = divmod(int(agents["cell"][i]), side)
        best = (sugar[agents["cell"][i]], 0, -1)  # (sugar, distance, key): the own cell first
        target = int(agents["cell"][i])
        for d in range(1, int(agents["vision"][i]) + 1):
            for k, (dr, dc) in enumerate(DIRECTIONS):
                cell = ((r + dr * d) % side) * side + (c + dc * d) % side
                if cell in occupied:
                    continue
                s, key = int(sugar[cell]), int(direction_keys[i, k])
                if s == best[0] and d > best[1]:
                    seen["distance ties"] += 1
                if s == best[0] and d == best[1]:
                    seen["direction ties"] += 1
                if s > best[0] or (s == best[0] and (d < best[1] or (d == best[1] and key < best[2]))):
                    best, target = (s, d, key), cell
        targets.append(target)
    cells = agents["cell"].copy()
    for t in set(targets):
        claimants = [i for i in range(len(uid)) if targets[i] == t]
        seen["contests"] += len(claimants) > 1
        winner = min(claimants, key=lambda i: int(contest_keys[i]))
        cells[winner] = t
    assert vision_max >= int(agents["vision"].max())
    return cells, seen


def test_movement_matches_a_one_agent_at_a_time_loop():
    model = MODEL.configure(params=SMALL, substeps=["look", "move", "harvest", "regrow"])
    sim = Simulation(model, agents=60, seed=5)
    side = sim.space.shape[0]
    assert side == 14
    seen_total = {"distance ties": 0, "direction ties": 0, "contests": 0}
    for _ in range(4):
        before = by_uid(sim)
        expected, seen = brute_force_moves(before, env(sim, "sugar"), side, 5, sim.state.step + 1, 4)
        sim.step()
        after = by_uid(sim)
        assert np.array_equal(after["uid"], before["uid"])
        assert np.array_equal(after["cell"], expected)
        seen_total = {k: seen_total[k] + seen[k] for k in seen}
    assert all(v > 0 for v in seen_total.values()), seen_total  # every rule of the choice was exercised


def test_at_most_one_agent_per_cell_every_step():
    sim = Simulation(MODEL.configure(params={"max_age_min": 5, "max_age_max": 20}), agents=300, seed=2)
    born = 0
    for _ in range(40):
        sim.step()
        cells = sim.state["agent"]["cell"]
        assert torch.unique(cells).numel() == cells.numel() == 300, sim.state.step
        born = int(sim.state["agent"]["uid"].max()) + 1 - 300
    assert born > 100  # many newborns were placed (deaths by age every few steps)


# --------------------------------------------------------------------------- harvest, G_alpha, R
def test_harvest_conserves_sugar_and_empties_the_agents_cells():
    sim = Simulation(MODEL.configure(substeps=["look", "move", "harvest"]), agents=400, seed=3)
    collected = 0
    for _ in range(5):
        total = env(sim, "sugar").sum() + by_uid(sim)["sugar"].sum()
        held = by_uid(sim)["sugar"].sum()
        sim.step()
        agents = by_uid(sim)
        assert env(sim, "sugar").sum() + agents["sugar"].sum() == total
        assert (env(sim, "sugar")[agents["cell"]] == 0).all()
        collected += agents["sugar"].sum() - held
    assert collected > 0


def test_harvest_inside_the_full_step():
    """The full step: grid + agents' sugar after harvest = before; then metabolism, deaths, births, growback."""
    sim = Simulation(MODEL, agents=400, seed=4)
    p = sim.params
    for _ in range(5):
        before, grid = by_uid(sim), env(sim, "sugar")
        sim.step()
        after = by_uid(sim)
        survived = np.isin(before["uid"], after["uid"])
        # Survivors: the sugar of the cell they moved to, less their metabolism.
        old = {u: i for i, u in enumerate(before["uid"])}
        for j, u in enumerate(after["uid"]):
            if u in old:
                i = old[u]
                assert after["sugar"][j] == before["sugar"][i] + grid[after["cell"][j]] - before["metabolism"][i]
            else:
                assert p["endowment_min"] <= after["sugar"][j] <= p["endowment_max"] and after["age"][j] == 0
        assert (~survived).sum() == (~np.isin(after["uid"], before["uid"])).sum()  # one newborn per death


@pytest.mark.parametrize("alpha", [1, 2])
def test_regrowth_adds_alpha_up_to_capacity(alpha):
    sim = Simulation(MODEL.configure(params={"alpha": alpha}), agents=400, seed=1)
    capacity = env(sim, "capacity")
    assert np.array_equal(capacity, landscape(50).reshape(-1).numpy()) and capacity.max() == 4
    assert np.array_equal(env(sim, "sugar"), capacity)  # the landscape starts at capacity
    for _ in range(20):
        sim.step()
        sugar = env(sim, "sugar")
        assert (sugar >= 0).all() and (sugar <= capacity).all()
        agents = by_uid(sim)
        assert (sugar[agents["cell"][agents["age"] > 0]] <= alpha).all()  # harvested, then regrown once
    regrow = Simulation(MODEL.configure(params={"alpha": alpha}, substeps=["regrow"]), agents=400, seed=1)
    regrow.state.env["sugar"].zero_()
    for t in range(1, 4):
        regrow.step()
        assert np.array_equal(env(regrow, "sugar"), np.minimum(t * alpha, capacity))


def test_replacement_keeps_the_population_constant():
    sim = Simulation(MODEL, agents=400, seed=6)
    m = sim.run(110).metrics
    assert (m["n_agent"] == 400).all()
    agents = by_uid(sim)
    assert agents["uid"].max() >= 400 + 100  # starvation and old age (max_age <= 100) replaced many
    assert (agents["age"] <= agents["max_age"]).all() and (agents["sugar"] >= 0).all()
    assert agents["age"].max() < 110  # nobody outlived max_age


def test_attributes_are_in_the_books_ranges():
    sim = Simulation(MODEL, agents=400, seed=8)
    assert sim.space.shape == (50, 50)
    a = by_uid(sim)
    for name, low, high in (("vision", 1, 6), ("metabolism", 1, 4), ("sugar", 5, 25), ("max_age", 60, 100)):
        assert a[name].min() == low and a[name].max() == high, name
    assert np.unique(a["cell"]).size == 400
    assert Simulation(MODEL, agents=1600, seed=8).space.shape == (100, 100)  # the side grows with agents


# --------------------------------------------------------------------------- the Gini
def numpy_gini(x: np.ndarray) -> float:
    x = x.astype(np.float64)
    return float(np.abs(x[:, None] - x[None, :]).sum() / (2 * len(x) * x.sum()))


def test_gini_of_counts_is_the_pairwise_gini():
    g = np.random.default_rng(0)
    for _ in range(20):
        x = g.integers(0, 60, size=int(g.integers(2, 300)))
        assert gini_of_counts(np.bincount(x)) == pytest.approx(numpy_gini(x), rel=1e-13, abs=1e-15)
    assert np.isnan(gini_of_counts([])) and np.isnan(gini_of_counts([5]))


def test_gini_metric_equals_a_brute_force_gini_of_the_final_wealth():
    sim = Simulation(MODEL, agents=400, seed=9)
    m = sim.run(60).metrics
    wealth = by_uid(sim)["sugar"]
    assert m["gini"][-1] == pytest.approx(numpy_gini(wealth), rel=1e-13)
    assert 0.2 < m["gini"][-1] < 0.7 and m["gini"][0] < m["gini"][-1]  # inequality grows from the start
    assert m["wealth"][-1] == wealth.sum() and m["over_cap"][-1] == 0
    hist = m["wealth_hist"][-1]
    assert hist.shape == (WEALTH_CAP + 1,) and hist.sum() == 400
    assert np.array_equal(hist, np.bincount(wealth, minlength=WEALTH_CAP + 1))
    assert np.isnan(gini({"wealth_hist": hist, "over_cap": 1}))  # an agent above the cap: wealth unknown


# --------------------------------------------------------------------------- order and processes
def test_shuffled_rows_give_the_same_bits():
    params = {"max_age_min": 5, "max_age_max": 30}
    a = Simulation(MODEL.configure(params=params), agents=400, seed=12)
    b = Simulation(MODEL.configure(params=params), agents=400, seed=12, shuffle_rows=True)
    ra, rb = a.run(25), b.run(25)
    for k in ra.metrics:
        assert np.array_equal(ra.metrics[k], rb.metrics[k], equal_nan=True), k
    fa, fb = by_uid(a), by_uid(b)
    for k in fa:
        assert np.array_equal(fa[k], fb[k]), k
    for name in ("sugar", "capacity"):
        assert np.array_equal(env(a, name), env(b, name))
    assert fa["uid"].max() >= 400  # replacements happened


AGED = {"max_age_min": 3, "max_age_max": 8}  # deaths by age (and so replacements) within the 15 steps
PARTITIONS = {
    "data": [Case("data", "sugarscape", 300), Case("data-aged", "sugarscape", 200, AGED)],
    "spatial": [Case("strips", "sugarscape", 300, AGED, {"layout": "strips"}),
                Case("blocks", "sugarscape", 300, options={"layout": "blocks"}),
                Case("rcb", "sugarscape", 300, AGED, {"layout": "rcb"}),
                Case("balanced", "sugarscape", 300, AGED, {"layout": "blocks", "balance_every": 2,
                                                           "balance_threshold": 1.05})],
}


def both_partitions(comm, out_dir: str):
    """On a 4-rank job: every case of each partitioner on 2, 3 and 4 ranks (equivalence.py)."""
    return {part: run_partition_on_subgroups(comm, cases, part, f"{out_dir}/{part}")
            for part, cases in PARTITIONS.items()}


@pytest.fixture(scope="module")
def sugarscape_reference(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("sugarscape_reference"))
    return {part: reference_runs(cases, out) for part, cases in PARTITIONS.items()}


@pytest.mark.timeout(60)
def test_one_rank_with_either_partition_is_the_one_process_run(sugarscape_reference, tmp_path):
    for part, cases in PARTITIONS.items():
        got = run_cases(LocalComm(), cases, part, str(tmp_path))
        for case in cases:
            check_same_as_reference(sugarscape_reference[part][case.key], got[case.key], f"{part} {case.key} W=1")
    aged = sugarscape_reference["data"]["data-aged"]
    assert aged["agents"]["agent"]["uid"].max() >= 200 and (aged["metrics"]["n_agent"] == 200).all()


@pytest.mark.long
@pytest.mark.timeout(120)
def test_same_bits_on_2_3_4_ranks_with_either_partition(sugarscape_reference, tmp_path):
    for part in PARTITIONS:
        (tmp_path / part).mkdir()
    got = run_ranks(both_partitions, 4, (str(tmp_path),), timeout=100.0)[0]
    for part, cases in PARTITIONS.items():
        for w in WORLD_SIZES:
            for case in cases:
                result = got[part][w][case.key]
                check_same_as_reference(sugarscape_reference[part][case.key], result, f"{part} {case.key} W={w}")
                check_figures(result["perf"], f"{part} {case.key} W={w}")
            if part == "spatial":
                assert sum(p["migrated"] for p in got[part][w]["blocks"]["perf"]) > 0, w
                assert any(p["rebalanced"] for p in got[part][w]["balanced"]["perf"]), w
    assert len(got["data"][2]["data"]["perf"]) == STEPS
