"""The 1-D space (:class:`agentsim.Line`) and its ordered queries (:func:`agentsim.nearest`),
against a brute-force reference over every pair."""

from __future__ import annotations

import pytest
import torch

import agentsim as asim
from agentsim.errors import ConfigError, FieldAccessError
from agentsim.space.ordered import nearest


def brute_nearest(line: asim.Line, x: torch.Tensor, uid: torch.Tensor, n_t: int, k: int, direction: str,
                  within: float) -> tuple[list[list[int]], list[list[float]]]:
    """Every source of every target, ranked by the documented rule."""
    L = line.length
    rows, dists = [], []
    for t in range(n_t):
        ranked = []
        for s in range(x.shape[0]):
            if s == t:
                continue
            xt, xs = float(x[t]), float(x[s])
            ahead, behind = xs - xt, xt - xs
            if line.periodic:
                ahead = ahead + L if ahead <= 0 else ahead
                behind = behind + L if behind <= 0 else behind
            u = int(uid[s])
            if direction == "ahead" and 0 < ahead <= within:
                ranked.append((ahead, 0, u, s))
            elif direction == "behind" and 0 < behind <= within:
                ranked.append((behind, 0, -u, s))
            elif direction == "either":
                if xs == xt:
                    ranked.append((0.0, 0, u, s))
                elif 0 < behind <= within:
                    ranked.append((behind, 1, -u, s))
                elif 0 < ahead <= within:
                    ranked.append((ahead, 2, u, s))
        ranked.sort()
        got = ranked[:k] + [(None, 0, 0, -1)] * (k - len(ranked[:k]))
        rows.append([g[3] for g in got])
        dists.append([g[0] for g in got])
    return rows, dists


@pytest.mark.parametrize("cells", [True, False])
@pytest.mark.parametrize("periodic", [True, False])
@pytest.mark.parametrize("layout", ["sorted", "turned", "shuffled"])
def test_nearest_matches_every_pair(cells: bool, periodic: bool, layout: str) -> None:
    gen = torch.Generator().manual_seed(7 + 2 * cells + periodic)
    L = 40
    line = asim.Line(L if cells else float(L), periodic=periodic, cells=cells)
    for trial in range(6):
        n = int(torch.randint(1, 30, (1,), generator=gen))
        # many shared positions: cells, or continuous on a grid of 1/8 (exact distances)
        x = torch.randint(0, L, (n,), generator=gen)
        if not cells:
            x = x.to(torch.float64) + torch.randint(0, 8, (n,), generator=gen) / 8.0
        uid = torch.randperm(1000, generator=gen)[:n]
        order = torch.argsort(uid, stable=True)
        order = order[torch.argsort(x[order], stable=True)]
        if layout == "turned":
            order = torch.roll(order, int(torch.randint(0, n, (1,), generator=gen)))
        elif layout == "shuffled":
            order = torch.randperm(n, generator=gen)
        x, uid = x[order], uid[order]
        for direction in ("ahead", "behind", "either"):
            within = 7.0 if cells is False else 7
            for k in (1, 3):
                got = nearest(line, {"x": x, "uid": uid}, k=k, direction=direction, within=within)
                rows, dists = brute_nearest(line, x, uid, n, k, direction, within)
                assert got.index.tolist() == rows, (trial, direction, k)
                fill = torch.iinfo(torch.int64).max if cells else float("inf")
                assert got.distance.tolist() == [[fill if d is None else d for d in r] for r in dists]


@pytest.mark.parametrize("direction", ["ahead", "behind", "either"])
def test_nearest_with_a_halo_and_another_population(direction: str) -> None:
    """Targets are the first n_local rows; sources every row (a halo), or another population."""
    gen = torch.Generator().manual_seed(3)
    line = asim.Line(50, cells=True)
    x = torch.randint(0, 50, (40,), generator=gen)
    uid = torch.randperm(40, generator=gen)

    class View(dict):
        n_local = 25

    got = nearest(line, View(x=x, uid=uid), k=2, direction=direction, within=6)
    rows, _ = brute_nearest(line, x, uid, 25, 2, direction, 6)
    assert got.index.tolist() == rows
    # another population: every one of its rows a source, none of them the target
    other = {"x": torch.randint(0, 50, (30,), generator=gen), "uid": torch.arange(100, 130)}
    got = nearest(line, {"x": x[:25], "uid": uid[:25]}, k=2, direction=direction, within=6, sources=other)
    want = []
    for t in range(25):  # the target alone, then the other population: its rows shift by one
        ranked = brute_nearest(line, torch.cat([x[t:t + 1], other["x"]]), torch.cat([uid[t:t + 1], other["uid"]]),
                               1, 2, direction, 6)[0][0]
        want.append([r - 1 if r >= 0 else -1 for r in ranked])
    assert got.index.tolist() == want


@pytest.mark.parametrize("cells", [True, False])
@pytest.mark.parametrize("periodic", [True, False])
def test_fewer_agents_than_asked_for(cells: bool, periodic: bool) -> None:
    """One, two or three agents at distinct positions in order (the ring walk) with k = 4."""
    line = asim.Line(50 if cells else 50.0, periodic=periodic, cells=cells)
    for n in (1, 2, 3):
        x = torch.tensor([3, 10, 14][:n]) if cells else torch.tensor([3.0, 10.0, 14.0][:n])
        uid = torch.arange(n)
        for direction in ("ahead", "behind", "either"):
            got = nearest(line, {"x": x, "uid": uid}, k=4, direction=direction, within=20)
            rows, dists = brute_nearest(line, x, uid, n, 4, direction, 20)
            fill = torch.iinfo(torch.int64).max if cells else float("inf")
            assert got.index.tolist() == rows, (n, direction)
            assert got.distance.tolist() == [[fill if d is None else d for d in r] for r in dists], (n, direction)
            assert got.found.tolist() == [[r >= 0 for r in row] for row in rows]


def test_take_and_fill() -> None:
    line = asim.Line(10.0)
    cars = {"x": torch.tensor([1.0, 2.5, 9.0]), "uid": torch.tensor([5, 6, 7]), "v": torch.tensor([[1.0, 2.0],
                                                                                                     [3.0, 4.0],
                                                                                                     [5.0, 6.0]])}
    near = nearest(line, cars, direction="ahead", within=2.0, fill=-1.0)
    assert near.index.tolist() == [[1], [-1], [0]]
    assert near.distance.tolist() == [[1.5], [-1.0], [2.0]]
    assert near.take(cars["v"], fill=0.0).tolist() == [[[3.0, 4.0]], [[0.0, 0.0]], [[1.0, 2.0]]]


def test_line_positions() -> None:
    ring = asim.Line(10, cells=True)
    assert ring.wrap(torch.tensor([-1, 10, 23])).tolist() == [9, 0, 3]
    assert asim.Line(10, periodic=False, cells=True).wrap(torch.tensor([-1, 10])).tolist() == [0, 9]
    assert ring.ahead(torch.tensor([3, 3, 3]), torch.tensor([5, 1, 3])).tolist() == [2, 8, 10]
    cont = asim.Line(2.0)
    assert cont.wrap(torch.tensor([-1e-20, 2.5])).tolist() == [0.0, 0.5]  # never L itself
    assert cont.outside(torch.tensor([0.0, 2.0, float("nan")])).tolist() == [False, True, True]
    assert asim.Line(2.0, periodic=False).outside(torch.tensor([2.0])).tolist() == [False]
    assert ring.layer_shape == (10,) and cont.layer_shape is None
    assert ring.region_coords(torch.tensor([4])).tolist() == [[4.0, 0.0]]


@pytest.mark.parametrize("bad, match", [
    (dict(length=2.5, cells=True), "int length"),
    (dict(length=0), "positive finite"),
    (dict(length=float("inf")), "positive finite"),
    (dict(length=5, cells=1), "cells"),
])
def test_line_refuses_bad_arguments(bad: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        asim.Line(**bad)


def test_nearest_refuses_bad_queries() -> None:
    ring = asim.Line(10, cells=True)
    cars = {"x": torch.tensor([1, 4]), "uid": torch.tensor([0, 1])}
    with pytest.raises(ConfigError, match="valid: ahead, behind, either"):
        nearest(ring, cars, direction="forward", within=2)
    with pytest.raises(ConfigError, match="below 5"):
        nearest(ring, cars, direction="either", within=5)
    with pytest.raises(ConfigError, match="below 10"):
        nearest(ring, cars, within=10)
    with pytest.raises(ConfigError, match="k to be an int"):
        nearest(ring, cars, k=0, within=2)
    with pytest.raises(ConfigError, match="integer cells"):
        nearest(ring, {"x": torch.tensor([1.0]), "uid": torch.tensor([0])}, within=2)
    with pytest.raises(ConfigError, match="expected a Line or a Box"):
        nearest(asim.Grid((3, 3)), cars, within=2)
    with pytest.raises(FieldAccessError, match="declares reach"):
        nearest(ring.with_query_limit(2, "substep 'drive' declares reach 2"), cars, within=3)


@pytest.mark.parametrize("cells", [True, False])
def test_wrap_and_move_give_the_bits_of_remainder(cells: bool) -> None:
    """The fast path (positions on the ring or one turn off it) against torch.remainder everywhere."""
    gen = torch.Generator().manual_seed(5)
    for length in ((1000, 7) if cells else (10.0, 0.3, 1e6)):
        line = asim.Line(length, cells=cells)
        for spread in (1, 2, 10):  # on the ring, at most one turn off it, farther
            if cells:
                x = torch.randint(-length * (spread - 1), length * spread, (5000,), generator=gen)
                dx = torch.randint(-3, 4, (5000,), generator=gen)
            else:
                x = (torch.rand(5000, generator=gen, dtype=torch.float64) * 3 - 1) * length * spread / 2
                x = torch.cat([x, torch.tensor([-1e-300, -0.0, length, 2 * length - 1e-9, -length])])
                dx = torch.zeros_like(x)
            for got, of in ((line.wrap(x), x), (line.move(x, dx), x + dx)):
                want = torch.remainder(of, length)
                if not cells:
                    want = torch.where(want >= length, torch.zeros_like(want), want)
                assert torch.equal(got.view(torch.int64), want.view(torch.int64)), (length, spread)
            before = x.clone()
            line.wrap(x)
            assert torch.equal(x, before)  # wrap leaves its input alone
