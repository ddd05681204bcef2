"""ctx.group_totals (agentsim.core.groups): integer sums per group over every rank, against a brute-force
reference, on 1-4 processes and any split of the agents; and a model that reads its place-mates only
through them, the same bits on 1-4 processes with both partitioners and accepted by the check mode."""

from __future__ import annotations

import itertools
import os

import pytest
import torch

from agentsim import Box, ConfigError, ContractError, Model, Param, Simulation
from agentsim._native import kernels as cpu_kernels
from agentsim.core.comm import LocalComm
from agentsim.core.groups import GroupSums
from agentsim.runner.invariance import check_model
from agentsim.runner.launch import run_ranks

N, GROUPS = 400, 37


def population(seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Every agent's group (some groups huge, some single), who contributes, and what: ``[N]``, ``[m]``, ``[m, 2]``."""
    g = torch.Generator().manual_seed(seed)
    group = (torch.randint(0, GROUPS, (N,), generator=g) ** 2 // GROUPS) * 1000 + 5  # sparse, skewed ids
    rows = torch.nonzero(torch.rand(N, generator=g) < 0.3).reshape(-1)
    values = torch.randint(-3, 9, (rows.shape[0], 2), generator=g)
    return group, rows, values


def brute_force(group: torch.Tensor, rows: torch.Tensor, values: torch.Tensor,
                mine: torch.Tensor) -> dict[int, list[int]]:
    """Group id to its total over all contributors, for the groups of the agents ``mine`` that got one
    (``group`` ``[N]``, or ``[N, k]``: each agent's contribution reaches each of its groups >= 0)."""
    totals: dict[int, list[int]] = {}
    for r, v in zip(rows.tolist(), values.tolist(), strict=True):
        for k in group[r].reshape(-1).tolist():
            if k >= 0:
                old = totals.get(k, [0, 0])
                totals[k] = [old[0] + v[0], old[1] + v[1]]
    held = set(group[mine].reshape(-1).tolist())
    return {k: v for k, v in sorted(totals.items()) if k in held}


def scattered_share(comm, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """This rank's share of the ``N`` agents (uid * 7919 % W): each agent's owner ``[N]``, this rank's
    agents ``[n]``, each agent's row here ``[N]`` (-1 elsewhere), and which of ``rows`` are here."""
    owner = torch.arange(N) * 7919 % comm.world_size
    mine = torch.nonzero(owner == comm.rank).reshape(-1)
    local_row = torch.full((N,), -1, dtype=torch.int64)
    local_row[mine] = torch.arange(mine.shape[0])
    return owner, mine, local_row, owner.index_select(0, rows) == comm.rank


def sums_on_a_rank(comm, seed: int) -> list[tuple[dict[int, list[int]], dict[int, list[int]]]]:
    """This rank's agents are a scattered share (uid * 7919 % W): totals, twice (the cut is cached), vs brute force."""
    group, rows, values = population(seed)
    _, mine, local_row, here = scattered_share(comm, rows)
    sums = GroupSums(comm)
    field = group.index_select(0, mine)
    out = []
    for _ in range(2):
        groups, totals = sums.totals("a.group", field, local_row.index_select(0, rows[here]), values[here])
        got = dict(zip(groups.tolist(), totals.tolist(), strict=True))
        out.append((got, brute_force(group, rows, values, mine)))
    field.add_(0)  # an in-place write: the cut is found again
    groups, totals = sums.totals("a.group", field, local_row.index_select(0, rows[here]), values[here])
    out.append((dict(zip(groups.tolist(), totals.tolist(), strict=True)), brute_force(group, rows, values, mine)))
    # the same sums as a table of every group held here, in the index's numbering (0: no contribution)
    ids = sums.index("a.group", field).ids
    want = brute_force(group, rows, values, mine)
    every = {g: want.get(g, [0, 0]) for g in ids.tolist()}
    for dtype in (torch.int64, torch.int32):  # (twice: the cut cached) rows of either index dtype
        table = sums.table("a.group", field, local_row.index_select(0, rows[here]).to(dtype), values[here])
        assert table.shape == (ids.shape[0] + 1, 2) and table[-1].tolist() == [0, 0]
        out.append((dict(zip(ids.tolist(), table[:-1].tolist(), strict=True)), every))
    column = sums.table("a.group", field, local_row.index_select(0, rows[here]), values[here][:, 1])
    out.append((dict(zip(ids.tolist(), column[:-1].tolist(), strict=True)), {g: v[1] for g, v in every.items()}))
    groups, totals = sums.totals("a.group", field, local_row.index_select(0, rows[here]).to(torch.int32), values[here])
    out.append((dict(zip(groups.tolist(), totals.tolist(), strict=True)), want))
    return out


@pytest.mark.timeout(240)
@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_group_totals_match_brute_force_on_any_number_of_ranks(world_size):
    for rank_results in run_ranks(sums_on_a_rank, world_size, (world_size,), timeout=60.0):
        for got, want in rank_results:
            assert got == want


def tables_where_some_ranks_share_nothing(comm) -> list[tuple[dict[int, int], dict[int, int]]]:
    """Agents uid % 3 on 3 ranks. ``pairs``: groups of two uids (2k, 2k + 1), where rank 2's agents
    are alone (so rank 2 shares no group, ranks 0 and 1 do); ``fives``: uid % 5, shared by every rank;
    ``alone``: a group per agent, shared by none. Tables of several fields at once and alone, and
    each agent's sums, against the brute force."""
    uid = torch.arange(N)
    fields = {"a.pairs": torch.where(uid % 3 == 2, 10_000 + uid, uid // 2), "a.fives": uid % 5, "a.alone": uid}
    values = (uid * 7 % 11 - 3).to(torch.int64)
    mine = torch.nonzero(uid % 3 == comm.rank).reshape(-1)
    rows = torch.arange(mine.shape[0])
    sums = GroupSums(comm)
    out = []
    for names in (["a.pairs", "a.fives"], ["a.pairs"], ["a.alone"], ["a.alone", "a.pairs"]):
        tables = sums.tables({name: (fields[name].index_select(0, mine), rows, values.index_select(0, mine))
                              for name in names})
        for name in names:
            want: dict[int, int] = {}
            for g, v in zip(fields[name].tolist(), values.tolist(), strict=True):
                want[g] = want.get(g, 0) + v
            ids = sums.index(name, fields[name].index_select(0, mine)).ids.tolist()
            out.append((dict(zip(ids, tables[name][:-1].tolist(), strict=True)), {g: want[g] for g in ids}))
    spread = sums.spread({name: (fields[name].index_select(0, mine), rows, values.index_select(0, mine))
                          for name in ("a.pairs", "a.alone")})
    for name, got in spread.items():
        whole = {}
        for g, v in zip(fields[name].tolist(), values.tolist(), strict=True):
            whole[g] = whole.get(g, 0) + v
        want_rows = [whole[g] for g in fields[name].index_select(0, mine).tolist()]
        out.append((dict(enumerate(got.tolist())), dict(enumerate(want_rows))))
    return out


@pytest.mark.timeout(120)
def test_tables_are_the_brute_force_where_some_ranks_or_fields_share_no_group():
    for rank_results in run_ranks(tables_where_some_ranks_share_nothing, 3, timeout=60.0):
        for got, want in rank_results:
            assert got == want


def memberships_on_a_rank(comm, seed: int) -> list[tuple[object, object]]:
    """A field of 3 groups per agent (some -1, some repeated) beside a field of one, read in one
    ``tables`` call by a scattered share of the agents: tables, sizes and member lists vs brute force."""
    group, rows, values = population(seed)
    g = torch.Generator().manual_seed(seed + 100)
    several = torch.randint(0, 50, (N, 3), generator=g) * 3 + 1
    several[torch.rand(N, 3, generator=g) < 0.1] = -1  # no group in that slot
    several[::17, 2] = several[::17, 0]  # the same group twice
    owner, mine, local_row, here = scattered_share(comm, rows)
    sums = GroupSums(comm)
    fields = {"a.group": group.index_select(0, mine), "a.several": several.index_select(0, mine)}
    out: list[tuple[object, object]] = []
    for _ in range(2):  # (twice: the cuts cached)
        tables = sums.tables({name: (field, local_row.index_select(0, rows[here]), values[here])
                              for name, field in fields.items()})
        ids = sums.index("a.several", fields["a.several"]).ids
        want = brute_force(several, rows, values, mine)
        got = tables["a.several"]
        out.append((dict(zip(ids.tolist(), got[:-1].tolist(), strict=True)),
                    {k: want.get(k, [0, 0]) for k in ids.tolist()}))
        out.append((got[-1].tolist(), [0, 0]))
        one = sums.index("a.group", fields["a.group"]).ids
        want = brute_force(group, rows, values, mine)
        out.append((dict(zip(one.tolist(), tables["a.group"][:-1].tolist(), strict=True)),
                    {k: want.get(k, [0, 0]) for k in one.tolist()}))
    mine_rows = local_row.index_select(0, rows[here])
    groups, totals = sums.totals("a.several", fields["a.several"], mine_rows, values[here])
    out.append((dict(zip(groups.tolist(), totals.tolist(), strict=True)), brute_force(several, rows, values, mine)))
    if comm.rank == 0:  # a change on one rank only: every rank finds the groups again
        fields["a.several"][:, 1] = -1
    several[(owner == 0), 1] = -1
    tables = sums.tables({"a.several": (fields["a.several"], mine_rows, values[here])})
    ids = sums.index("a.several", fields["a.several"]).ids
    want = brute_force(several, rows, values, mine)
    out.append((dict(zip(ids.tolist(), tables["a.several"][:-1].tolist(), strict=True)),
                {k: want.get(k, [0, 0]) for k in ids.tolist()}))
    index = sums.index("a.several", fields["a.several"])
    flat = several.reshape(-1)
    out.append((index.size.tolist(), [int((flat == k).sum()) for k in index.ids.tolist()]))
    out.append((list(index.of.shape), [mine.shape[0], 3]))
    members, which = index.members(torch.arange(index.ids.shape[0]))
    listed = sorted(zip(index.ids.index_select(0, which).tolist(), mine.index_select(0, members).tolist()))
    out.append((listed, sorted((k, int(mine[r])) for r in range(mine.shape[0]) for k in several[mine[r]].tolist()
                               if k >= 0)))
    return out


@pytest.mark.timeout(240)
@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_several_groups_per_agent_match_brute_force_on_any_number_of_ranks(world_size):
    for rank_results in run_ranks(memberships_on_a_rank, world_size, (world_size + 10,), timeout=60.0):
        for got, want in rank_results:
            assert got == want


def test_a_field_of_no_groups_per_agent_gives_empty_tables():
    sums = GroupSums(LocalComm())
    none = torch.zeros((5, 0), dtype=torch.int64)
    assert sums.table("a.none", none, torch.tensor([0, 3]), torch.tensor([4, 2])).tolist() == [0]
    index = sums.index("a.none", none)
    assert index.ids.numel() == 0 and list(index.of.shape) == [5, 0] and index.members(index.ids)[0].numel() == 0
    groups, totals = sums.totals("a.none", none, torch.tensor([1]), torch.tensor([[1, 2]]))
    assert groups.numel() == 0 and list(totals.shape) == [0, 2]


def test_one_process_sums_without_communication():
    group, rows, values = population(3)
    groups, totals = GroupSums(LocalComm()).totals("a.group", group, rows, values)
    assert dict(zip(groups.tolist(), totals.tolist(), strict=True)) == brute_force(group, rows, values, torch.arange(N))
    one, flat = GroupSums(LocalComm()).totals("a.group", group, rows, values[:, 0])
    assert flat.shape == one.shape and flat.tolist() == totals[:, 0].tolist()


def test_float_values_and_bad_fields_are_refused():
    sums = GroupSums(LocalComm())
    group = torch.tensor([0, 1, 1])
    with pytest.raises(ConfigError, match="values must be integers .*float"):
        sums.totals("a.group", group, torch.tensor([0, 1]), torch.tensor([0.5, 1.0]))
    with pytest.raises(ConfigError, match="group field .* expected \\[n\\] integers"):
        sums.totals("a.group", group.to(torch.float32), torch.tensor([0]), torch.tensor([1]))
    with pytest.raises(ConfigError, match="expected rows"):
        sums.totals("a.group", group, torch.tensor([0, 1]), torch.tensor([1]))
    with pytest.raises(ConfigError, match=r"expected rows \[m\] int64 or int32 .*got rows torch.float32"):
        sums.table("a.group", group, torch.tensor([0.0, 1.0]), torch.tensor([1, 1]))


# A model of my own, from the docs: villagers in huts; each day a villager with a cold gives it to
# each hut-mate with probability 0.2 per sick hut-mate, and recovers with probability 0.1.
village = Model("village", default_agents=300)


@village.init
def _init(ic):
    n = ic.n_agents
    uid = ic.uids("villager", n)
    hut = (ic.rng.uniform(uid, "hut") * (n // 4)).to(torch.int64)  # huts of about 4, scattered over uids
    sick = ic.rng.uniform(uid, "sick") < 0.1
    ic.add("villager", uid=uid, hut=hut, sick=sick, pos=torch.stack([hut.double(), hut.double()], 1) % 10)
    return Box(size=(10.0, 10.0))


@village.substep(reads=["villager.hut", "villager.sick"], writes=["villager.sick"])
def catch(ctx):
    v = ctx["villager"]
    ill = torch.nonzero(v["sick"]).reshape(-1)
    huts, sick_mates = ctx.group_totals("villager.hut", ill, torch.ones_like(ill))
    per_hut = torch.zeros(int(v["hut"].max()) + 1 if v["hut"].numel() else 0, dtype=torch.int64)
    known = huts < per_hut.shape[0]
    per_hut[huts[known]] = sick_mates[known]
    exposure = per_hut.index_select(0, v["hut"]) - v["sick"].to(torch.int64)
    u = ctx.rng.uniform(v["uid"], draws=2)
    caught = u[:, 0] < 1 - (1 - 0.2) ** exposure.double()
    v["sick"] = torch.where(v["sick"], u[:, 1] >= 0.1, caught)


village.metric(name="sick")(lambda state: state["villager"]["sick"])


@pytest.mark.timeout(300)
@pytest.mark.parametrize("partition", ["data", "spatial"])
def test_a_model_of_place_mates_gives_the_same_bits_on_one_to_four_processes(partition):
    report = check_model(village, agents=300, steps=6, world_sizes=(1, 2, 3, 4), partitions=(partition,))
    assert report.identical, report.summary()


def test_the_check_mode_accepts_group_totals_and_catches_a_local_count():
    Simulation(village, agents=200, seed=1, check=True).run(3)  # no ContractError
    wrong = Model("village_wrong", default_agents=200)
    wrong.init(_init)

    @wrong.substep(reads=["villager.hut", "villager.sick"], writes=["villager.sick"])
    def local_count(ctx):  # counts sick hut-mates among this process's rows only
        v = ctx["villager"]
        per_hut = torch.bincount(v["hut"], weights=v["sick"].double(), minlength=int(v["hut"].max()) + 1)
        v["sick"] = v["sick"] | (per_hut.index_select(0, v["hut"]) >= 2)

    with pytest.raises(ContractError, match="split over two processes"):
        Simulation(wrong, agents=200, seed=1, check=True).run(3)


@pytest.mark.timeout(120)
def test_the_cut_is_reported_in_the_result_the_file_and_the_summary(tmp_path):
    import h5py

    from agentsim import launch
    from agentsim.engine.perf import summarize_groups

    result = launch(village, world_size=2, agents=300, steps=3, seed=1, out=str(tmp_path / "v.h5"))
    share = result.groups["groups/villager.hut/cut_share"]
    assert 0 < share < 1 and result.groups["groups/cut_share"] == share  # scattered huts: some span both ranks
    assert result.groups["groups/villager.hut/ghost_groups_max"] >= 1
    with h5py.File(tmp_path / "v.h5") as f:
        assert f["perf"].attrs["groups/villager.hut/cut_share"] == share
    assert "villager.hut" in summarize_groups(result.groups)
    one = Simulation(village, agents=300, seed=1).run(3)
    assert one.groups["groups/villager.hut/cut_share"] == 0.0
    assert one.metrics["sick"].tolist() == result.metrics["sick"].tolist()


def test_group_index_numbers_places_and_lists_their_members():
    index = GroupSums(LocalComm()).index("a.group", torch.tensor([9, -1, 4, 9, 4, 4]))
    assert index.ids.tolist() == [4, 9] and index.size.tolist() == [3, 2]
    assert index.of.tolist() == [1, 2, 0, 1, 0, 0]  # 2 = G: no group
    rows, which = index.members(torch.tensor([1, 0]))
    assert rows.tolist() == [0, 3, 2, 4, 5] and which.tolist() == [0, 0, 1, 1, 1]
    assert index.local_members(torch.tensor([0])) == 3


@pytest.mark.parametrize("nonzero_share", [0.02, 0.5, 1.0])  # a map of the nonzero groups first, or not
@pytest.mark.parametrize("k", [0, 1, 5])  # k = 0: a field of one group per agent ([n])
def test_each_agents_sum_over_its_groups_is_the_brute_force(k, nonzero_share):
    gen = torch.Generator().manual_seed(k + int(100 * nonzero_share))
    n = 500
    field = torch.randint(-1, 60, (n, k) if k else (n,), generator=gen)  # -1: no group in that slot
    field[:3] = -1  # agents in no group at all
    index = GroupSums(LocalComm()).index("a.groups", field)
    groups = index.ids.shape[0]
    table = torch.randint(1, 1000, (groups + 1,), generator=gen, dtype=torch.int64)
    table[torch.rand(groups + 1, generator=gen) >= nonzero_share] = 0
    table[groups] = 0
    rows = torch.randperm(n, generator=gen)[:300]
    value = {int(i): int(v) for i, v in zip(index.ids, table[:groups], strict=True)}
    expected = [sum(value.get(int(g), 0) for g in (field[r] if k else field[r:r + 1])) for r in rows.tolist()]
    got = index.sums(table, rows.to(torch.int32))
    assert got.dtype == torch.int64 and got.tolist() == expected
    assert index.sums(table, rows, table != 0).tolist() == expected  # the map made once by the caller
    if k:
        with pytest.raises(ValueError, match="expected nonzero = table != 0"):
            index.sums(table, rows, (table != 0)[:-1])
    with pytest.raises(ValueError, match=f"expected a table \\[{groups + 1}\\] int64"):
        index.sums(table.to(torch.int32), rows)


def test_every_negative_id_means_no_group():
    index = GroupSums(LocalComm()).index("a.group", torch.tensor([5, -1, -3, 5, 2, -1]))
    assert index.ids.tolist() == [2, 5] and index.of.tolist() == [1, 2, 2, 1, 0, 2] and index.size.tolist() == [1, 2]
    groups, totals = GroupSums(LocalComm()).totals("a.group", torch.tensor([5, -1, -3, 2]), torch.arange(4),
                                                   torch.ones(4, dtype=torch.int64))
    assert groups.tolist() == [2, 5] and totals.tolist() == [1, 1]


def test_a_field_in_group_order_is_indexed_as_any_other():
    """Households built by uid come in group order: the index that skips the sort is the same."""
    ordered = torch.tensor([-3, -1, -1, 2, 5, 5, 5, 9])
    for field in (ordered, ordered.flip(0)):
        index = GroupSums(LocalComm()).index("a.group", field)
        rows, which = index.members(torch.arange(index.ids.shape[0]))
        assert index.ids.tolist() == [2, 5, 9] and index.size.tolist() == [1, 3, 1]
        assert field[rows].tolist() == index.ids[which].tolist()  # members of each group, group by group
        for k in range(3):
            mine = rows[which == k].tolist()
            assert mine == sorted(mine)  # in row order within a group
        assert all(int(index.ids[index.of[i]]) == int(field[i]) for i in range(8) if field[i] >= 0)
        assert all(int(index.of[i]) == 3 for i in range(8) if field[i] < 0)


def config_error_of(call):
    """The message of the ConfigError ``call()`` raises, or "no error"."""
    try:
        call()
    except ConfigError as e:
        return str(e)
    return "no error"


def sums_of_other_widths(comm):
    """Rank 0 sums two columns, the others one: every rank must raise, none may hang."""
    width = 2 if comm.rank == 0 else 1
    return config_error_of(lambda: GroupSums(comm).totals("a.group", torch.tensor([0, 1, 2]), torch.tensor([0, 1]),
                                                          torch.ones((2, width), dtype=torch.int64)))


@pytest.mark.timeout(120)
def test_values_of_another_width_on_one_rank_stop_every_rank():
    for message in run_ranks(sums_of_other_widths, 2, timeout=30.0):
        assert "same shape" in message


uneven = Model("uneven_shares", default_agents=40)


@uneven.init
def _uneven(ic):
    rank, world = ic.share()
    uid = torch.arange(ic.n_agents)[rank::world]
    extra = {"extra": torch.zeros(uid.shape[0])} if rank == 1 else {}
    ic.add("person", uid=uid, home=uid // 4, **extra)


@uneven.substep(reads=["person.home"])
def _nothing(ctx):
    pass


def build_uneven(comm):
    return config_error_of(lambda: Simulation(uneven, agents=40, seed=1, comm=comm, partition="data"))


@pytest.mark.timeout(120)
def test_shares_with_other_fields_stop_every_rank():
    for message in run_ranks(build_uneven, 2, timeout=30.0):
        assert "built other populations or fields than process 0" in message


# An init that reads a file on every process (here each process's own copy, as on other hosts):
# other contents on one process, or a file missing there, stop every process with an error.
reader = Model("reads_a_table", params={"table": Param("", "a file of numbers, one per line; {rank}: the process")},
               default_agents=40)


@reader.init
def _reader(ic):
    path = ic.params["table"].format(rank=ic.rank)
    with open(path) as f:
        text = f.read()
    ic.declare_input("table", text)
    uid = ic.uids("person", ic.n_agents)
    ic.add("person", uid=uid, weight=torch.full((ic.n_agents,), float(text.split()[0])))


@reader.substep(reads=["person.weight"])
def _read(ctx):
    pass


def build_reader(comm, table):
    try:
        Simulation(reader, agents=40, seed=1, comm=comm, params={"table": table})
    except Exception as e:  # what each process raises
        return f"{type(e).__name__}: {e}"
    return "no error"


@pytest.mark.timeout(120)
def test_inputs_read_otherwise_or_not_at_all_on_one_process_stop_every_process(tmp_path):
    (tmp_path / "same.0").write_text("1\n2\n")
    (tmp_path / "same.1").write_text("1\n2\n")
    (tmp_path / "other.0").write_text("1\n2\n")
    (tmp_path / "other.1").write_text("1\n3\n")  # a later line differs: the agents would not show it
    (tmp_path / "gone.0").write_text("1\n")
    same, other, gone = (str(tmp_path / f"{name}.{{rank}}") for name in ("same", "other", "gone"))
    assert run_ranks(build_reader, 2, (same,), timeout=30.0) == ["no error", "no error"]
    for message in run_ranks(build_reader, 2, (other,), timeout=30.0):
        assert message.startswith("ConfigError: model 'reads_a_table': process 1 read other inputs than process 0")
        assert "table" in message
    got = run_ranks(build_reader, 2, (gone,), timeout=30.0)  # within the timeout: nobody waits for process 1
    assert got[0] == "ConfigError: model 'reads_a_table': its init failed on process 1 (its error is in that " \
                     "process's output); process 0 stops too"
    assert got[1].startswith("FileNotFoundError: ") and "gone.1" in got[1]  # its own error


# Another model of my own, from the how-to (docs/howto/synthetic-population.md): colds in households
# of a synthetic population, each process building only its localities (ic.share()); a 4 x 4 grid of
# localities, so that strips split it on 4 processes.
shared_colds = Model("shared_colds", default_agents=6000)


@shared_colds.init
def _colds(ic):
    from agentsim import Grid
    from agentsim.population import locality_grid, partition_localities, synthesize

    rank, world_size = ic.share()
    grid = locality_grid(ic.n_agents, ic.seed, people_per_locality=400)
    mine = torch.nonzero(partition_localities(grid, world_size) == rank).flatten()
    pop = synthesize(ic.n_agents, seed=ic.seed, people_per_locality=400, localities=mine)
    ic.add("person", uid=pop.uid, household=pop.household, cell=pop.locality.long(),
           sick=ic.rng.uniform(pop.uid, "sick") < 0.05)
    return Grid(grid.shape, periodic=False)


@shared_colds.substep(reads=["person.household", "person.sick"], writes=["person.sick"])
def _catch(ctx):
    people = ctx["person"]
    ill = torch.nonzero(people["sick"]).flatten()
    sick_mates = ctx.group_table("person.household", ill, torch.ones_like(ill))  # per household, over processes
    exposure = sick_mates[ctx.group_index("person.household").of] - people["sick"].long()
    u = ctx.rng.uniform(people["uid"], draws=2)
    people["sick"] = torch.where(people["sick"], u[:, 1] >= 0.1, u[:, 0] < 1 - 0.8 ** exposure.double())


shared_colds.metric(name="sick")(lambda state: state["person"]["sick"])


@pytest.mark.timeout(300)
@pytest.mark.parametrize("partition", ["data", "spatial"])
def test_a_model_built_by_shares_gives_the_same_bits_on_one_to_four_processes(partition):
    report = check_model(shared_colds, agents=6000, steps=5, world_sizes=(1, 2, 3, 4), partitions=(partition,))
    assert report.identical, report.summary()
    assert report.partitions == (partition,)
    Simulation(shared_colds, agents=3000, seed=1, check=True).run(2)  # the check mode emulates group_table too


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize(("n", "top", "none"), [(1000, 900, False), (1000, 100_000, True), (200_000, 3_000_000, True),
                                                (200_000, 150_000, False), (70_000, 1_000_000, False)])
def test_numbering_by_counting_windows_is_the_numbering_by_sorting(dtype, n, top, none):
    from agentsim.core import groups

    g = torch.Generator().manual_seed(n + top)
    field = torch.randint(top // 3, top + 1, (n,), generator=g)  # ids far from 0, as on a later process
    if none:
        field[torch.rand(n, generator=g) < 0.3] = -1
    field = field.to(dtype)
    want_ids, want_of = groups._number_by_sorting(field)
    assert torch.equal(want_ids, torch.unique(field[field >= 0].long()))
    top = int(field.max())
    lo = int(field[field >= 0].min())  # the windows and the bitmap start at the smallest id (or at 0)
    for start in {0, lo}:
        ids, of = groups._number_by_counting(field, start, top)  # windows of torch ops
        assert torch.equal(ids, want_ids) and torch.equal(of, want_of)
        numbered = cpu_kernels.number_ids(field, start, top)  # a bitmap in the compiled kernel
        if numbered is not None or os.environ.get("AGENTSIM_REQUIRE_KERNELS") == "1":
            assert numbered is not None and torch.equal(numbered[0], want_ids) and torch.equal(numbered[1], want_of)
            with pytest.raises(IndexError, match="outside"):
                cpu_kernels.number_ids(field, start, top - 1)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("span_per_agent", [10, 100, 1000])
def test_number_counts_ids_in_a_range_of_up_to_128_per_agent_and_sorts_sparser_ones(dtype, span_per_agent,
                                                                                    monkeypatch):
    from agentsim.core import groups

    n = 100_000
    g = torch.Generator().manual_seed(span_per_agent)
    field = torch.randint(0, span_per_agent * n, (n,), generator=g) + 5_000_000  # a later process's ids
    field[torch.rand(n, generator=g) < 0.2] = -1
    field = field.to(dtype)
    want_ids, want_of = groups._number_by_sorting(field)
    sorted_ = []
    monkeypatch.setattr(groups, "_number_by_sorting", lambda f: sorted_.append(f) or (want_ids, want_of))
    ids, of = groups._number(field)
    assert torch.equal(ids, want_ids) and torch.equal(of, want_of)
    kernel = cpu_kernels.number_ids(field[:1], 0, int(field.max())) is not None
    # a bitmap up to 128 ids an agent (with the kernel), counting windows up to 16, else a sort
    assert bool(sorted_) == (span_per_agent > (100 if kernel else 10))
    two = field.view(-1, 2)  # [n, k] fields are numbered as their memberships
    ids2, of2 = groups._number(two)
    assert torch.equal(ids2, want_ids) and torch.equal(of2, want_of.view(-1, 2))


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_smallest_id_skips_the_agents_in_no_group(dtype):
    from agentsim.core import groups

    g = torch.Generator().manual_seed(1)
    for n in (1, 50, 10_000):
        field = torch.randint(-3, 2**30, (n,), generator=g).to(dtype)
        field[0] = 2**30 + 5  # at least one id
        assert groups._smallest_id(field, int(field.max())) == int(field[field >= 0].min())


@pytest.mark.parametrize("seed", range(6))
def test_id_ranges_cover_every_id_and_inside_is_the_brute_force(seed):
    from agentsim.core import groups

    g = torch.Generator().manual_seed(seed)
    ids = torch.unique(torch.randint(0, 300, (int(torch.randint(0, 120, (1,), generator=g)),), generator=g))
    runs = [[ids[0].item(), ids[0].item()]] if ids.numel() else []
    for x in ids[1:].tolist():
        if x == runs[-1][1] + 1:
            runs[-1][1] = x
        else:
            runs.append([x, x])
    for most in (1, 2, 3, 7, len(runs), 4096):
        ranges = groups._id_ranges(ids, max(most, 1))
        lo, hi = ranges["lo"].tolist(), ranges["hi"].tolist()
        assert len(lo) <= max(most, 1) and all(a <= b for a, b in zip(lo, hi, strict=True))
        assert all(any(a <= x <= b for a, b in zip(lo, hi, strict=True)) for x in ids.tolist())  # a cover
        if len(runs) <= most:  # nothing to join: the runs themselves
            assert [list(r) for r in zip(lo, hi, strict=True)] == runs
        else:  # joined across the narrowest gaps: the widest gaps stay uncovered
            gaps = sorted((b[0] - a[1] for a, b in itertools.pairwise(runs)), reverse=True)
            kept = sorted(b - a for a, b in zip(hi, lo[1:], strict=False))[::-1]
            assert kept == gaps[:len(kept)]
    # which ids lie in some range of an unordered, overlapping set, against a loop
    lo = torch.randint(0, 300, (15,), generator=g)
    hi = lo + torch.randint(0, 40, (15,), generator=g)
    probe = torch.randint(-5, 360, (500,), generator=g)
    want = [any(a <= x <= b for a, b in zip(lo.tolist(), hi.tolist(), strict=True)) for x in probe.tolist()]
    assert groups._inside(probe, {"lo": lo, "hi": hi}).tolist() == want
    assert not groups._inside(probe, {"lo": lo[:0], "hi": hi[:0]}).any()


def figures_on_a_rank(comm, blocks: bool, most: int) -> tuple[dict[str, int], dict[str, int], bool]:
    """The cut's figures of 3000 agents in groups (ids by block of agents, or scattered) on ranks that
    hold blocks of agents, with at most ``most`` id ranges per rank; the figures and totals by brute force."""
    from agentsim.core import groups

    groups._MAX_RANGES = most  # (a fresh process per rank)
    n = 3000
    uid = torch.arange(n)
    group = uid // 7 * 3 + 11 if blocks else (uid * 7919) % 401 * 5
    owner = uid * comm.world_size // n  # blocks of agents: groups at a block's edge are cut
    mine = torch.nonzero(owner == comm.rank).reshape(-1)
    sums = GroupSums(comm)
    field = group.index_select(0, mine)
    table = sums.table("a.group", field, torch.arange(mine.shape[0]), torch.ones(mine.shape[0], dtype=torch.int64))
    index = sums.index("a.group", field)
    sizes_ok = torch.equal(table[:-1].to(torch.int32), index.size)  # every member counted once, wherever it is
    held = set(field.tolist())
    per_rank = {}
    for u in range(n):
        per_rank.setdefault(int(group[u]), {}).setdefault(int(owner[u]), 0)
        per_rank[int(group[u])][int(owner[u])] += 1
    cut = {k for k, ranks in per_rank.items() if len(ranks) > 1}
    here = {"members": mine.shape[0], "cut_members": sum(1 for u in mine.tolist() if int(group[u]) in cut),
            "cut_groups": len(cut & held)}
    everywhere = {"pairs": sum(sum(r.values()) * (sum(r.values()) - 1) // 2 for r in per_rank.values()),
                  "crossing_pairs": sum((sum(r.values()) ** 2 - sum(m * m for m in r.values())) // 2
                                        for r in per_rank.values())}
    return sums.figures["a.group"], {**here, **everywhere}, sizes_ok


@pytest.mark.timeout(240)
@pytest.mark.parametrize(("world_size", "blocks", "most"), [(2, True, 4096), (3, True, 2), (4, False, 4096),
                                                            (4, False, 3), (3, True, 1)])
def test_the_cut_found_through_id_ranges_is_the_brute_force_one(world_size, blocks, most):
    got = run_ranks(figures_on_a_rank, world_size, (blocks, most), timeout=60.0)
    for figures, want, sizes_ok in got:
        assert sizes_ok
        assert {k: figures[k] for k in ("members", "cut_members", "cut_groups")} == \
            {k: want[k] for k in ("members", "cut_members", "cut_groups")}
    for key in ("pairs", "crossing_pairs"):  # each group counted on one rank
        assert sum(figures[key] for figures, _, _ in got) == got[0][1][key]


def index_after_a_table_on_a_rank(comm) -> tuple[bool, bool, bool, list[int]]:
    """``ctx.group_index`` after a ``ctx.group_table`` of the same field in one substep call: no exchange
    where the substep may not write the field, an exchange where it may, an error after an
    undeclared write; and the sizes over both ranks either way."""
    from agentsim.core.context import Context
    from agentsim.core.params import Params
    from agentsim.core.random import CounterRNG
    from agentsim.core.state import FieldSpec, Population, State
    from agentsim.core.substep import Substep
    from agentsim.errors import FieldAccessError

    home = torch.tensor([4, 4, 1, 7]) + comm.rank * 3  # homes 4 and 7 are on both ranks
    pop = Population("person", {"uid": FieldSpec(torch.int64), "home": FieldSpec(torch.int64)},
                     {"uid": torch.arange(4) + 4 * comm.rank, "home": home})
    groups, state = GroupSums(comm), State({"person": pop}, {})

    def context(writes: list[str]) -> Context:
        step = Substep(lambda ctx: None, name="mix", reads=["person.home"], writes=writes)
        return Context(step, state, step=1, params=Params({}), rng=CounterRNG(0).at(1, "mix"), space=None,
                       device=torch.device("cpu"), neighbors=None, groups=groups)

    def table_then_index(ctx: Context) -> tuple[int, list[int]]:
        ctx.group_table("person.home", torch.tensor([0]), torch.ones(1, dtype=torch.int64))
        calls = comm.stats.calls
        size = ctx.group_index("person.home").size.tolist()
        return comm.stats.calls - calls, size

    quiet, sizes = table_then_index(context([]))
    exchanged, same_sizes = table_then_index(context(["person.home"]))  # the substep may move people
    reader = context([])
    reader.group_table("person.home", torch.tensor([0]), torch.ones(1, dtype=torch.int64))
    pop["home"].add_(0)  # written in place by a substep that does not declare it
    try:
        reader.group_index("person.home")
        caught = False
    except FieldAccessError as e:
        caught = "writes=" in str(e)
    return quiet == 0, exchanged > 0 and same_sizes == sizes, caught, sizes


@pytest.mark.timeout(120)
def test_an_index_after_a_table_in_one_substep_call_needs_no_exchange():
    (quiet0, exchanged0, caught0, sizes0), (quiet1, exchanged1, caught1, sizes1) = run_ranks(
        index_after_a_table_on_a_rank, 2, (), timeout=60.0)
    assert quiet0 and quiet1 and exchanged0 and exchanged1 and caught0 and caught1
    assert sizes0 == [1, 3, 3] and sizes1 == [3, 3, 1]  # homes 1, 4, 7 on rank 0; 4, 7, 10 on rank 1


def tables_on_a_rank(comm) -> tuple[bool, int, str]:
    """Two fields' tables at once against one table at a time (another GroupSums), the collectives
    the second ``tables`` needs, and the error when one rank's values of the second field are wider."""
    group, rows, values = population(comm.world_size)
    owner = torch.arange(N) * 7919 % comm.world_size
    mine = torch.nonzero(owner == comm.rank).reshape(-1)
    local_row = torch.full((N,), -1, dtype=torch.int64)
    local_row[mine] = torch.arange(mine.shape[0])
    here = owner.index_select(0, rows) == comm.rank
    contributors, contribution = local_row.index_select(0, rows[here]), values[here]
    home, block = group.index_select(0, mine), (mine // 50).to(torch.int32)  # a field of another dtype
    requests = {"a.home": (home, contributors, contribution),
                "a.block": (block, contributors.to(torch.int32), contribution[:, 0])}
    together = GroupSums(comm)
    got = together.tables(requests)
    alone = GroupSums(comm)
    same = all(torch.equal(got[name], alone.table(name, *request)) for name, request in requests.items())
    calls = comm.stats.calls
    again = together.tables(requests)
    same = same and all(torch.equal(again[name], got[name]) for name in requests)
    collectives = comm.stats.calls - calls
    wider = contribution if comm.rank == 0 else contribution[:, 0]
    message = config_error_of(lambda: together.tables({"a.home": requests["a.home"],
                                                      "a.block": (block, contributors, wider)}))
    return same, collectives, message


@pytest.mark.timeout(120)
@pytest.mark.parametrize("world_size", [2, 3])
def test_several_tables_at_once_are_the_tables_one_at_a_time(world_size):
    for same, collectives, message in run_ranks(tables_on_a_rank, world_size, timeout=60.0):
        assert same
        assert collectives == 2  # one check that both fields are current, one all-to-all for both
        assert "'a.block'" in message and "same shape" in message


def each_agents_sum(group: torch.Tensor, rows: torch.Tensor, values: torch.Tensor) -> list[int]:
    """Brute force: each agent's sum over its groups (``[N]`` or ``[N, k]``, < 0 none) of every
    contribution to each group (``values`` ``[m]``, repeated rows add again)."""
    totals: dict[int, int] = {}
    for r, v in zip(rows.tolist(), values.tolist(), strict=True):
        for g in group[r].reshape(-1).tolist():
            if g >= 0:
                totals[g] = totals.get(g, 0) + v
    return [sum(totals.get(g, 0) for g in group[i].reshape(-1).tolist() if g >= 0) for i in range(group.shape[0])]


def small_groups(seed: int, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``N`` agents in ``k`` small groups each (``[N]`` for k = 0; some slots empty, some groups held
    twice by one agent, ids sparse), contributors (some repeated) and their values (some negative)."""
    g = torch.Generator().manual_seed(seed)
    field = torch.randint(0, N, (N, k) if k else (N,), generator=g) * 1_000_003 + 11
    field[torch.rand(field.shape, generator=g) < 0.1] = -1
    if k > 1:
        field[::13, 1] = field[::13, 0]  # the same group twice
    rows = torch.randint(0, N, (N // 3,), generator=g)
    rows[-5:] = rows[:5]  # repeated contributors
    return field, rows, torch.randint(-50, 1000, (rows.shape[0],), generator=g)


@pytest.mark.parametrize("k", [0, 1, 4])
def test_sums_over_each_agents_groups_pushed_or_tabled_are_the_brute_force(k, monkeypatch):
    field, rows, values = small_groups(k, k)
    want = each_agents_sum(field, rows, values)
    sums = GroupSums(LocalComm())
    index = sums.index("a.clubs", field)
    got = sums.spread({"a.clubs": (field, rows.to(torch.int32), values)})["a.clubs"]
    assert got.dtype == torch.int64 and got.tolist() == want
    only = torch.arange(N) % 3 == 1  # some agents' sums only: 0 for the others
    wanted = [w if i % 3 == 1 else 0 for i, w in enumerate(want)]
    assert sums.spread({"a.clubs": (field, rows, values)}, only)["a.clubs"].tolist() == wanted
    if cpu_kernels._kernels() is not None:  # pushed along co-member lists: their rows are the group-mates
        pushed = index.push(rows, values)
        assert pushed is not None and pushed.tolist() == want  # (the push itself, not the tables)
        indptr, indices = index.co_members
        for i in (0, 1, 13, N - 1):
            mates = [j for g in field[i].reshape(-1).tolist() if g >= 0
                     for j in range(N) for h in field[j].reshape(-1).tolist() if h == g]
            for g in field[i].reshape(-1).tolist():
                if g >= 0:
                    mates.remove(i)  # the membership itself
            assert sorted(indices[indptr[i]:indptr[i + 1]].tolist()) == sorted(mates)
    monkeypatch.setattr(cpu_kernels, "co_members", lambda *args: None)  # no lists: the table is read instead
    tabled = GroupSums(LocalComm())
    assert tabled.spread({"a.clubs": (field, rows, values)})["a.clubs"].tolist() == want
    assert tabled.index("a.clubs", field).push(rows, values) is None
    assert tabled.spread({"a.clubs": (field, rows, values)}, only)["a.clubs"].tolist() == wanted


@pytest.mark.parametrize("shape", [(0,), (0, 3)])
def test_sums_over_groups_of_no_agents_are_empty(shape):
    field, none = torch.zeros(shape, dtype=torch.int64), torch.zeros(0, dtype=torch.int64)
    got = GroupSums(LocalComm()).spread({"a.clubs": (field, none, none)})["a.clubs"]
    assert got.dtype == torch.int64 and got.shape == (0,)


def test_large_groups_are_tabled_and_give_the_same_sums():
    g = torch.Generator().manual_seed(7)
    field = torch.randint(0, 3, (N, 2), generator=g)  # 3 groups of ~270 memberships: m (m - 1) lists
    rows, values = torch.arange(0, N, 5), torch.arange(0, N, 5) % 7
    sums = GroupSums(LocalComm())
    got = sums.spread({"a.big": (field, rows, values)})["a.big"]
    assert sums.index("a.big", field).co_members is None
    assert got.tolist() == each_agents_sum(field, rows, values)


def test_sums_over_groups_refuse_values_of_several_columns_floats_and_a_wrong_mask():
    field, rows, values = small_groups(3, 2)
    with pytest.raises(ConfigError, match=r"expected values \[m\]"):
        GroupSums(LocalComm()).spread({"a.clubs": (field, rows, values.reshape(-1, 1))})
    with pytest.raises(ConfigError, match="values must be integers"):
        GroupSums(LocalComm()).spread({"a.clubs": (field, rows, values.double())})
    with pytest.raises(ConfigError, match=f"expected only = None or \\[{N}\\] bool"):
        GroupSums(LocalComm()).spread({"a.clubs": (field, rows, values)}, torch.ones(N - 1, dtype=torch.bool))


def test_the_push_kernel_names_a_row_outside_the_lists_and_checks_shapes():
    indptr, indices = torch.tensor([0, 1, 2]), torch.tensor([1, 0], dtype=torch.int32)
    out, scratch, once, none = torch.zeros(2, dtype=torch.int64), torch.zeros(2, dtype=torch.int64), \
        torch.ones(2, dtype=torch.int64), torch.zeros(0, dtype=torch.int64)

    def push(old_nodes, old_values, nodes, values, ptr=indptr):
        return cpu_kernels.push_changes(ptr, indices, old_nodes, old_values, nodes, values, once, scratch, out)

    with pytest.raises(ValueError, match="expected values one per node and indptr \\[3\\]"):
        push(none, none, torch.tensor([0, 1]), torch.tensor([1]))
    with pytest.raises(ValueError, match="scratch \\[2\\] or \\[0\\]"):
        cpu_kernels.push_changes(indptr, indices, none, none, none, none, once, torch.zeros(3, dtype=torch.int64), out)
    with pytest.raises(ValueError, match="expected values one per node and indptr \\[3\\]"):
        push(none, none, torch.tensor([0]), torch.tensor([1]), indptr[:2])
    if cpu_kernels._kernels() is None:
        pytest.skip("no kernel library")
    with pytest.raises(IndexError, match="node id 2 out of range"):
        push(none, none, torch.tensor([0, 2]), torch.tensor([1, 1]))
    with pytest.raises(IndexError, match="node id -1 out of range"):
        push(torch.tensor([-1]), torch.tensor([1]), none, none)
    assert out.tolist() == [0, 0] and scratch.tolist() == [0, 0]  # nothing added
    assert cpu_kernels.push_changes(indptr, indices, none, none, torch.tensor([1, 0]), torch.tensor([1, 1]), once,
                                    none, out) is None  # (not increasing, and no scratch: nothing done)
    assert out.tolist() == [0, 0]
    assert push(none, none, torch.tensor([0, 1, 0]), torch.tensor([5, 0, 2 ** 62]))  # (not increasing: scratch)
    assert out.tolist() == [5 + 2 ** 62, 5 + 2 ** 62] and scratch.tolist() == [0, 0]
    assert push(torch.tensor([0, 1, 0]), torch.tensor([5, 0, 2 ** 62]), torch.tensor([1]), torch.tensor([3]))
    assert out.tolist() == [3, 3]  # (merged: both increasing)
    assert push(torch.tensor([1]), torch.tensor([3]), torch.tensor([0, 1]), torch.tensor([2 ** 63 - 1, 3]))
    assert out.tolist() == [2 ** 63 - 1 + 3 - 2 ** 64, 2 ** 63 - 1 + 3 - 2 ** 64]  # (wrapping, as torch's adds)


@pytest.mark.parametrize("k", [0, 1, 4])
def test_pushes_kept_up_to_date_over_many_calls_are_the_brute_force(k):
    """Day after day the contributors and values change (some stay, some leave, some come, repeats and
    unsorted rows included): each call's sums are a push from zeros, though only changes are pushed."""
    if cpu_kernels._kernels() is None:
        pytest.skip("no kernel library")
    field, _, _ = small_groups(20 + k, k)
    g = torch.Generator().manual_seed(k)
    index = GroupSums(LocalComm()).index("a.clubs", field)
    values = torch.randint(-5, 20, (N,), generator=g)
    for call in range(12):
        if call % 4 == 3:  # unsorted, repeated rows
            rows = torch.randint(0, N, (N // 4,), generator=g)
        else:  # sorted rows found by nonzero, a drifting set
            rows = torch.nonzero(torch.rand(N, generator=g) < 0.05 * (call % 4 + 1)).reshape(-1)
        if call % 2:
            values[torch.rand(N, generator=g) < 0.3] += 1  # some values change
        given_rows, given_values = rows.to(torch.int32) if call % 3 == 0 else rows.clone(), values.index_select(0, rows)
        got = index.push(given_rows, given_values)
        assert got is not None and got.tolist() == each_agents_sum(field, rows, values.index_select(0, rows)), call
        got[:] = 7  # (the caller's tensors: changing them changes nothing kept)
        given_rows.fill_(0)
        given_values.fill_(123)
    only = torch.arange(N) % 2 == 0
    want = each_agents_sum(field, rows, values.index_select(0, rows))
    assert index.push(rows, values.index_select(0, rows), only).tolist() == [w if i % 2 == 0 else 0
                                                                             for i, w in enumerate(want)]
    with pytest.raises(IndexError, match=f"node id {N} out of range"):
        index.push(torch.tensor([0, N]), torch.tensor([1, 1]))
    with pytest.raises(ValueError, match="expected rows and values \\[m\\] int32 or int64 of one length"):
        index.push(torch.tensor([0, 1]), torch.tensor([0.9, 1.7]))  # (never truncated)
    with pytest.raises(ValueError, match="expected rows and values \\[m\\] int32 or int64 of one length"):
        index.push(torch.tensor([0, 1]), torch.tensor([1]))
    with pytest.raises(ValueError, match=f"expected only = None or \\[{N}\\] bool"):
        index.push(rows, values.index_select(0, rows), torch.tensor([True]))
    assert index.push(rows, values.index_select(0, rows)).tolist() == want  # the errors changed nothing kept


def spread_on_a_rank(comm, seed: int) -> list[tuple[list[int], list[int]]]:
    """A scattered share of agents in small groups (``[N, 3]``) and in one group each (``[N]``): each
    agent's sums over its groups in one call, twice, vs brute force."""
    several, rows, values = small_groups(seed, 3)
    single = population(seed)[0]
    _, mine, local_row, here = scattered_share(comm, rows)
    sums = GroupSums(comm)
    fields = {"a.several": several.index_select(0, mine), "a.single": single.index_select(0, mine)}
    out = []
    for only in (None, mine % 3 == 1):  # every agent, then some (0 for the others)
        got = sums.spread({name: (field, local_row.index_select(0, rows[here]), values[here])
                           for name, field in fields.items()}, only)
        for name, whole in (("a.several", several), ("a.single", single)):
            want = each_agents_sum(whole, rows, values)
            out.append((got[name].tolist(), [want[i] if only is None or i % 3 == 1 else 0 for i in mine.tolist()]))
        # weighted: the float64 bits of 0.0 + float(several) * 0.3 + float(single) * -1e-3, in that order
        total = sums.weighted({name: (field, local_row.index_select(0, rows[here]), values[here])
                               for name, field in fields.items()}, {"a.single": -1e-3, "a.several": 0.3}, only)
        whole_total = (0.0 + torch.tensor(each_agents_sum(several, rows, values), dtype=torch.float64) * 0.3
                       + torch.tensor(each_agents_sum(single, rows, values), dtype=torch.float64) * -1e-3)
        picked = whole_total.index_select(0, mine)
        if only is not None:
            picked = torch.where(only, picked, 0.0)
        out.append((total.view(torch.int64).tolist(), picked.view(torch.int64).tolist()))
    return out


@pytest.mark.timeout(240)
@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_sums_over_each_agents_groups_match_brute_force_on_any_number_of_ranks(world_size):
    for rank_results in run_ranks(spread_on_a_rank, world_size, (world_size + 20,), timeout=60.0):
        for got, want in rank_results:
            assert got == want


clubs = Model("clubs", default_agents=300)


@clubs.init
def _clubs_init(ic):
    uid = ic.uids("person", ic.n_agents)
    club = (ic.rng.uniform(uid, "clubs", draws=3) * (ic.n_agents // 2)).to(torch.int64)  # about 2 a club
    ic.add("person", uid=uid, club=club, sick=ic.rng.uniform(uid, "sick") < 0.05, pos=torch.zeros(ic.n_agents, 2))
    return Box(size=(1.0, 1.0))


@clubs.substep(reads=["person.club", "person.sick"], writes=["person.sick"])
def _clubs_catch(ctx):
    people = ctx["person"]
    ill = torch.nonzero(people["sick"]).reshape(-1)
    healthy = ~people["sick"]
    mates = ctx.group_sums({"person.club": (ill, torch.ones_like(ill))}, only=healthy)["person.club"]
    u = ctx.rng.uniform(people["uid"], draws=2)
    people["sick"] = torch.where(healthy, u[:, 0] < 1 - 0.7 ** mates.double(), u[:, 1] >= 0.2)


clubs.metric(name="sick")(lambda state: state["person"]["sick"])


def test_the_check_mode_accepts_sums_over_groups():
    """The check mode splits each call over two simulated processes and exchanges the sums: the
    same run, and the model spreads."""
    checked = Simulation(clubs, agents=300, seed=2, check=True).run(8).metrics["sick"]
    plain = Simulation(clubs, agents=300, seed=2).run(8).metrics["sick"]
    assert checked.tolist() == plain.tolist() and max(plain.tolist()) > plain.tolist()[0]


@pytest.mark.parametrize("pushed", [True, False])
def test_weighted_sums_are_the_float_formula_of_the_brute_force_sums(pushed, monkeypatch):
    if not pushed:  # the tables, and the torch ops for the total
        monkeypatch.setattr(cpu_kernels, "co_members", lambda *args: None)
        monkeypatch.setattr(cpu_kernels, "scaled_total", lambda *args: None)
    several, rows, values = small_groups(31, 3)
    fields = {"a.several": several, "a.pairs": small_groups(32, 1)[0], "a.single": small_groups(33, 0)[0]}
    sums = GroupSums(LocalComm())
    # (a negative first weight: 0.0 + 0 * w is 0.0, not -0.0, for those who meet no one)
    weights = {"a.several": -(2.0**-24) * 0.192 / 20, "a.pairs": 0.1, "a.single": 1.0 / 3.0}

    def formula(values):  # in the order of the fields (three terms: the order changes the bits)
        total = torch.zeros(N, dtype=torch.float64)
        for name, field in fields.items():
            total = total + torch.tensor(each_agents_sum(field, rows, values), dtype=torch.float64) * weights[name]
        return total

    only = torch.arange(N) % 4 != 0
    for call in range(3):  # (pushed: the kept sums, changing from call to call)
        got = sums.weighted({name: (field, rows, values) for name, field in fields.items()}, weights,
                            None if call == 0 else only)
        assert got.dtype == torch.float64
        expected = formula(values) if call == 0 else torch.where(only, formula(values), 0.0)
        assert torch.equal(got.view(torch.int64), expected.view(torch.int64)), call
        for name, field in fields.items():  # pushed: every field's kept sums are read
            assert (sums.index(name, field).co_members is not None) == pushed
        values = values * 7 + 1
    single = fields["a.single"]
    with pytest.raises(ConfigError, match="expected one weight per field"):
        sums.weighted({"a.single": (single, rows, values)}, {"a.several": 1.0})
    with pytest.raises(ConfigError, match="weights must be finite"):
        sums.weighted({"a.single": (single, rows, values)}, {"a.single": float("inf")})
    with pytest.raises(ConfigError, match="values must be integers"):
        sums.weighted({"a.single": (single, rows, values.double())}, {"a.single": 1.0})


def test_the_check_mode_accepts_weighted_sums_over_groups():
    model = Model("weighted_clubs", default_agents=300)
    model.init(_clubs_init)

    @model.substep(reads=["person.club", "person.sick"], writes=["person.sick"])
    def catch(ctx):
        people = ctx["person"]
        ill = torch.nonzero(people["sick"]).reshape(-1)
        healthy = ~people["sick"]
        force = ctx.weighted_group_sums({"person.club": (ill, torch.ones_like(ill))}, {"person.club": 0.4},
                                        only=healthy)
        u = ctx.rng.uniform(people["uid"], draws=2)
        people["sick"] = torch.where(healthy, u[:, 0] < 1 - torch.exp(-force), u[:, 1] >= 0.2)

    model.metric(name="sick")(lambda state: state["person"]["sick"])
    checked = Simulation(model, agents=300, seed=2, check=True).run(8).metrics["sick"]
    plain = Simulation(model, agents=300, seed=2).run(8).metrics["sick"]
    assert checked.tolist() == plain.tolist() and max(plain.tolist()) > plain.tolist()[0]


@pytest.mark.parametrize("kernel", [True, False])
def test_keeping_some_entries_is_a_masked_fill(kernel, monkeypatch):
    if not kernel:
        monkeypatch.setattr(cpu_kernels, "_kernels", lambda: None)  # the torch ops
    g = torch.Generator().manual_seed(4)
    for n in (0, 1, 37, 1000):
        x = torch.randint(-2**62, 2**62, (n,), generator=g)
        only = torch.rand(n, generator=g) < 0.4
        assert torch.equal(cpu_kernels.keep_only(x.clone(), only), x.masked_fill(~only, 0))
        out = torch.full((n,), 5, dtype=torch.int64)  # from another tensor
        assert torch.equal(cpu_kernels.keep_only(out, only, x), x.masked_fill(~only, 0))


@pytest.mark.parametrize("k", [0, 3])
def test_member_lists_by_counting_are_those_of_a_stable_sort(k, monkeypatch):
    field, _, _ = small_groups(k + 50, k)
    counted = GroupSums(LocalComm()).index("a.clubs", field)
    monkeypatch.setattr(cpu_kernels, "group_members", lambda *args: None)  # the torch sort
    sorted_ = GroupSums(LocalComm()).index("a.clubs", field)
    assert torch.equal(counted.start, sorted_.start) and torch.equal(counted.order, sorted_.order)
    assert counted.order.dtype == sorted_.order.dtype == torch.int32


def spread_over_days_on_a_rank(comm, seed: int, big_here: bool) -> tuple[bool, list[tuple[list[int], list[int]]]]:
    """Day after day (contributors drifting, values changing; some days unsorted int32 rows with
    repeats; one field replaced on day 3) each agent's sums over its groups and their weighted total
    on a scattered share, vs brute force. ``big_here``: rank 0's agents of even uid share one more
    group, held there alone and too large for co-member lists, so rank 0 reads tables where the
    others push (one all-to-all for both). Returns whether this rank pushed."""
    several, single = small_groups(seed, 3)[0], small_groups(seed + 1, 0)[0]
    owner = torch.arange(N) * 7919 % comm.world_size
    if big_here:
        several[(owner == 0) & (torch.arange(N) % 2 == 0), 2] = 424_242
    g = torch.Generator().manual_seed(seed)
    values = torch.randint(-5, 20, (N,), generator=g)
    sums, out = GroupSums(comm), []
    assert sums.spread({}) == {}  # (no fields: nothing to do, on any number of ranks)
    mine = scattered_share(comm, torch.zeros(0, dtype=torch.int64))[1]
    fields = {"a.several": several.index_select(0, mine), "a.single": single.index_select(0, mine)}  # kept: pushes
    for day in range(6):
        if day == 3:  # a new field (its groups found again, its pushes from zeros)
            single = torch.where(torch.arange(N) % 5 == 0, single.roll(1), single)
            fields["a.single"] = single.index_select(0, mine)
        if day % 3 == 2:  # unsorted, repeated contributors
            rows = torch.randint(0, N, (N // 4,), generator=g)
        else:
            rows = torch.nonzero(torch.rand(N, generator=g) < 0.1 * (day % 3 + 1)).reshape(-1)
        values[torch.rand(N, generator=g) < 0.3] += 1
        _, mine, local_row, here = scattered_share(comm, rows)
        given = local_row.index_select(0, rows[here])
        requests = {name: (field, given.to(torch.int32) if day % 3 == 2 else given,
                           values.index_select(0, rows[here])) for name, field in fields.items()}
        only = None if day % 2 == 0 else mine % 3 == 1
        got = sums.spread(requests, only)
        total = sums.weighted(requests, {"a.several": 0.3, "a.single": -1e-3}, only)
        whole = {name: torch.tensor(each_agents_sum(field, rows, values.index_select(0, rows)))
                 for name, field in (("a.several", several), ("a.single", single))}
        keep = torch.ones(mine.shape[0], dtype=torch.bool) if only is None else only
        for name in fields:
            out.append((got[name].tolist(), torch.where(keep, whole[name].index_select(0, mine), 0).tolist()))
        formula = (0.0 + whole["a.several"].double() * 0.3 + whole["a.single"].double() * -1e-3).index_select(0, mine)
        out.append((total.view(torch.int64).tolist(), torch.where(keep, formula, 0.0).view(torch.int64).tolist()))
        if day == 0:
            first = sums._cuts["a.several"]
    assert sums._cuts["a.single"].pushing is not None or cpu_kernels._kernels() is None
    assert sums._cuts["a.several"] is first  # (one cut, index and push state over the days)
    return sums._cuts["a.several"].pushing is not None, out


@pytest.mark.timeout(240)
@pytest.mark.parametrize(("world_size", "big_here"), [(2, False), (3, False), (4, False), (3, True)])
def test_sums_pushed_on_several_ranks_stay_the_brute_force_day_after_day(world_size, big_here):
    """On several ranks the groups held by one rank alone are pushed (changes only, from the second
    call on) and the cut groups' totals exchanged and added: the brute force's integers every day,
    also where one rank reads tables instead (its groups too large for co-member lists)."""
    results = run_ranks(spread_over_days_on_a_rank, world_size, (world_size + 40, big_here), timeout=60.0)
    if cpu_kernels._kernels() is not None:
        assert [pushed for pushed, _ in results] == [not big_here or rank > 0 for rank in range(world_size)]
    for _, days in results:
        for got, want in days:
            assert got == want
