"""Multi-rank runs: the same model and the same results on several processes.

Running
-------
From Python, :func:`agentsim.launch` starts ``world_size`` local processes (one torch thread
each, gloo on CPU), runs the model and returns rank 0's metrics; rank 0 writes the
one HDF5 file::

    import agentsim
    result = agentsim.launch("sir", world_size=4, agents=100_000, steps=100, seed=1, out="sir.h5")
    result = agentsim.launch("boids", world_size=4, partition="spatial", layout="rcb", balance_every=10)

From the command line, either let agentsim start the processes, or start them with
``torchrun`` (agentsim sees ``WORLD_SIZE > 1`` in the environment and joins the group
torchrun describes)::

    agentsim run sir --nprocs 4 --partition data --agents 100000 --out sir.h5
    agentsim run boids --nprocs 4 --partition spatial --layout rcb --balance-every 10 --out boids.h5
    torchrun --nproc_per_node 4 -m agentsim run boids --partition spatial --layout blocks --out boids.h5
    agentsim bench --scaling boids --agents 100000 --steps 20 --out scaling.json

Options: ``--timeout SECONDS`` (default 60): how long a collective waits for the
other ranks before failing, so a dead or stuck rank never hangs the run. If a
worker raises or dies, :func:`agentsim.launch` stops the others and raises an
:class:`~agentsim.errors.AgentsimError` naming the rank, with its traceback or exit
code (:func:`~agentsim.runner.launch.run_ranks` does the same for any function
``fn(comm, ...)``). Under torchrun, torchrun stops and (with ``--max-restarts``) restarts all
workers; the process group is built under a per-attempt store prefix
(``TORCHELASTIC_RESTART_COUNT``) so a restart does not read the failed attempt's keys.
A restarted worker given ``--checkpoint-every`` resumes from the newest complete checkpoint in
``--checkpoint-dir`` by itself (without checkpoints it starts again from step 0). For your own driver
code, the building blocks are :func:`~agentsim.distributed.process_group.process_group`
and the one engine with a partitioner::

    with process_group() as comm:
        result = Simulation(model, agents, seed, comm=comm, partition="spatial").run(100)

The engine and the partitioners meet in one protocol: :mod:`agentsim.distributed.partition`.

Partitioners
------------
- ``partition="data"`` (:class:`DataPartition`, :mod:`agentsim.distributed.data`): agents split by uid blocks, env
  replicated, every halo holds every other rank's agents. Simple; traffic and memory
  grow with the total number of agents.
- ``partition="spatial"`` (:class:`SpatialPartition`, :mod:`agentsim.distributed.spatial`):
  each rank owns a region -- strips, ``px x py`` blocks or recursive coordinate
  bisection (``layout=``) of a continuous Box or of a Grid's cells; contiguous uid
  blocks of a Graph's nodes. Halos hold only the declared fields of the agents within
  the substep's ``reach`` of the region (length, ``moore:R``; none for ``cell``; the
  ghost nodes for ``graph``; everyone for ``global``), sent point to point with
  ``all_to_all_single``. Agents that leave a region migrate, with all their fields,
  after each substep that writes their position (``pos`` / ``cell``) or adds agents.
  Env layers are whole on every rank (see the contract below). ``balance_every=K`` moves the
  borders (from a global position histogram) when max/mean agents per rank exceeds
  ``balance_threshold`` (default 1.1). For a model whose first substep is declared
  ``agentwise=True`` and reads neighbors within a length (boids), migration, the next
  step's halo and the step's figures travel in ONE exchange per step, posted without
  waiting; the next step runs that substep with the rank's own agents while it travels,
  then again for the agents near a border or an arrival
  (:mod:`agentsim.distributed.overlap`; ``overlap=False`` turns it off).

What is exact
-------------
With either partitioner, results are bitwise identical for any number of ranks,
including 1, and for every layout and rebalancing schedule: metrics, and the file's
``/agents``, ``/env`` and ``/metrics``, births, deaths and migration included
(tests/test_distributed.py, tests/test_distributed_spatial.py: every built-in model on
1-4 ranks). That holds because every rank sees, through ``ctx.neighbors``, every agent
that can affect its own agents exactly as one process would: the data partitioner
sends everything; the spatial partitioner sends every agent within the declared reach
(plus a small margin: extra agents out of range never change a result, since pair
lists are in canonical (cell, uid) order and sums over in-range pairs only). Every
random draw is keyed by uid or cell, models never depend on row order, new uids are
assigned from the global ranking of the parents' uids, and metric sums are exact int64
(fixed point for floats). ``/perf`` (timings, bytes, agents per rank) and the
``world_size`` attribute differ, by design.

Contract for model authors (true of the built-in models; :mod:`agentsim.engine.contract` checks it
with ``check=True``, and ``agentsim check`` compares runs on 1, 2 and 3 processes): read other
agents only through ``ctx.neighbors``, and declare a ``reach`` that covers every such read, or
through integer sums over groups (``ctx.group_totals``, ``ctx.group_index``:
:mod:`agentsim.core.groups`), which need no reach and no halo;
call ``ctx.spawn`` / ``ctx.kill`` / ``ctx.flag`` / ``ctx.group_totals`` / ``ctx.group_index``
unconditionally (with empty inputs when nothing happens), since each is a collective step on
some rank; within a substep, read
neighbor fields before writing the same field (halo rows hold the values from the start of
the substep). Env layers are whole on every rank with either partitioner: after a substep
that writes them and runs on agents, every rank's changes are applied on every rank with the
layer's declared combine (``"set"``, ``"add"``, ``"min"``, ``"max"``; :mod:`agentsim.core.env`), so
a substep reads env at any cell, whatever its reach; ranks that ``"set"`` one cell to different
values stop the step with an error that says what to declare. For the spatial partitioner
also: an agent's position is the field ``pos`` (Box) or ``cell`` (Grid), or its uid is its node
(Graph). On one process all of this is the identity.

Not exact / not covered
-----------------------
- A 3D Box is split in x and y only (halos are still exact, just wider than needed).
- Graph models: a population's uid must be its node id; nodes never move (no rebalancing).
- ``sync_every`` > 1 with the spatial partitioner (refused with a ConfigError: its halos
  follow current positions).

``sync_every``
--------------
The neighbor refresh period in steps. ``sync_every=1`` (the default) refreshes halos
before every neighbor substep: exact. ``sync_every=K > 1`` (data partitioner, or one
process) exchanges halos only every K steps; in between, every value read through
``ctx.neighbors`` comes from the last refresh, by a rule that one process applies too
(:mod:`agentsim.distributed.snapshot`), so the result is still the same on any number of ranks --
stale by design, not by partition.

Performance figures
-------------------
:attr:`RunResult.perf <agentsim.engine.simulation.RunResult.perf>` (and the file's ``/perf``, written by
rank 0; :mod:`agentsim.engine.perf`): per step, bytes sent, seconds in collectives, halo rows and
bytes, max/mean agents per rank (before and after balancing), step time (slowest rank and
mean), migrations; a CLI run prints a summary. For a model that sums over groups, the cut of each
group field (``RunResult.groups``, the attributes of ``/perf``).
:mod:`agentsim.runner.bench` (``agentsim bench --scaling``, ``benchmarks/bench_scaling.py``)
measures speedup, parallel efficiency and the communication share of W=2 against W=1.

Models of places
----------------
A model whose agents meet in places (households, schools, workplaces) reads its place-mates
through ``ctx.group_totals`` (integer sums per place over every rank; only places with members
on several ranks travel) and needs no halo. Its ``init`` may build only each rank's share of the
agents (``ic.share()``): with ``partition="data"`` they stay where they were built, so a share by
geography (whole localities: :func:`agentsim.population.partition_localities`) is the partition.
The covid model runs this way; the run summary gives the share of memberships cut.

Not built yet
-------------
- rebalancing from measured step times (borders move by agent counts only; step times
  are recorded);
- graph partitions better than contiguous uid blocks (no edge-cut minimization).
"""

from __future__ import annotations

from agentsim.distributed.comm import CommStats, TorchComm
from agentsim.distributed.data import DataPartition
from agentsim.distributed.partition import PARTITIONS
from agentsim.distributed.partitioners import make_partition
from agentsim.distributed.process_group import from_env, process_group, shutdown
from agentsim.distributed.spatial import LAYOUTS, SpatialPartition

__all__ = [
    "LAYOUTS",
    "PARTITIONS",
    "CommStats",
    "DataPartition",
    "SpatialPartition",
    "TorchComm",
    "from_env",
    "make_partition",
    "process_group",
    "shutdown",
]
