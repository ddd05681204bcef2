"""k nearest in a Box (:func:`agentsim.nearest`): against a brute force over every pair, with ties,
a halo, another population, periodic and bounded boxes in 2-D and 3-D; a model that reads its nearest
neighbours is identical on 1-3 processes with both partitioners."""

from __future__ import annotations

import pytest
import torch

import agentsim as asim
from agentsim.core import portable
from agentsim.errors import ConfigError, FieldAccessError
from agentsim.runner.invariance import check_model
from agentsim.space.ordered import nearest


def brute_force(box: asim.Box, pos_t: torch.Tensor, pos_s: torch.Tensor, uid_s: torch.Tensor, k: int,
                within: float, same: bool) -> tuple[list[list[int]], list[list[float]]]:
    """Each target's k nearest sources by (squared distance, uid), every pair tried."""
    rows, dists = [], []
    for t in range(pos_t.shape[0]):
        d = box.displacement(pos_t[t].expand_as(pos_s), pos_s)
        d2 = (d[:, 0] * d[:, 0]).clone()
        for axis in range(1, d.shape[1]):
            d2 += d[:, axis] * d[:, axis]
        near = [(float(d2[s]), int(uid_s[s]), s) for s in range(pos_s.shape[0])
                if float(d2[s]) <= within * within and not (same and s == t)]
        near.sort()
        rows.append([s for _, _, s in near[:k]] + [-1] * (k - len(near[:k])))
        dists.append([float(portable.sqrt(torch.tensor([q], dtype=pos_s.dtype))) for q, _, _ in near[:k]]
                     + [float("inf")] * (k - len(near[:k])))
    return rows, dists


@pytest.mark.parametrize("periodic", [True, False])
@pytest.mark.parametrize("ndim", [2, 3])
@pytest.mark.parametrize("k", [1, 3])
def test_nearest_in_a_box_matches_every_pair(periodic: bool, ndim: int, k: int) -> None:
    gen = torch.Generator().manual_seed(ndim * 10 + k)
    box = asim.Box((12.0,) * ndim, periodic=periodic)
    lattice = torch.randint(0, 12, (150, ndim), generator=gen).to(torch.float32)  # many equal distances
    pos = torch.cat([lattice, torch.rand(150, ndim, generator=gen) * 12.0])
    uid = torch.randperm(1000, generator=gen)[:300]
    got = nearest(box, {"pos": pos, "uid": uid}, k=k, within=2.5)
    rows, dists = brute_force(box, pos, pos, uid, k, 2.5, same=True)
    assert got.index.tolist() == rows
    assert got.distance.tolist() == dists
    assert got.found.tolist() == [[r >= 0 for r in row] for row in rows]


class Halo(dict):
    """A mapping with ``n_local``, as ``ctx.neighbors(pop)`` is: the first rows are the targets."""

    n_local = 40


def test_nearest_in_a_box_with_a_halo_and_another_population() -> None:
    gen = torch.Generator().manual_seed(3)
    box = asim.Box((10.0, 10.0), periodic=True)
    pos = torch.rand(100, 2, generator=gen, dtype=torch.float64) * 10
    uid = torch.arange(100) * 7 % 101
    got = nearest(box, Halo(pos=pos, uid=uid), k=2, within=2.0)
    rows, _ = brute_force(box, pos[:40], pos, uid, 2, 2.0, same=True)
    assert got.index.tolist() == rows and got.index.shape == (40, 2)
    food = {"pos": torch.rand(30, 2, generator=gen, dtype=torch.float64) * 10, "uid": torch.arange(30)}
    other = nearest(box, Halo(pos=pos, uid=uid), k=2, within=3.0, sources=food)
    rows, dists = brute_force(box, pos[:40], food["pos"], food["uid"], 2, 3.0, same=False)
    assert other.index.tolist() == rows and other.distance.tolist() == dists
    assert other.take(food["uid"], fill=-1).tolist() == [[int(food["uid"][r]) if r >= 0 else -1 for r in row]
                                                          for row in rows]


def test_nearest_in_a_box_refuses_what_does_not_apply() -> None:
    box = asim.Box((10.0, 10.0))
    agents = {"pos": torch.rand(5, 2) * 10, "uid": torch.arange(5)}
    with pytest.raises(ConfigError, match="in a Box the k nearest are taken in every direction"):
        nearest(box, agents, direction="ahead", within=1.0)
    with pytest.raises(ConfigError, match="within to be a distance > 0"):
        nearest(box, agents, within=0.0)
    with pytest.raises(ConfigError, match="have no field 'pos'"):
        nearest(box, {"x": torch.zeros(3), "uid": torch.arange(3)}, within=1.0)
    with pytest.raises(FieldAccessError, match="declares reach 1"):
        nearest(box.with_query_limit(1.0, "substep 'a' declares reach 1"), agents, within=2.0)
    empty = nearest(box, {"pos": torch.zeros(0, 2), "uid": torch.zeros(0, dtype=torch.int64)}, k=2, within=1.0)
    assert empty.index.shape == (0, 2)


@pytest.mark.long
@pytest.mark.timeout(300)
def test_a_model_that_reads_its_nearest_neighbours_is_identical_on_one_to_three_processes() -> None:
    report = check_model("line_models:nearest_pairs", agents=300, steps=8)
    assert report.identical, report.summary()
