"""Multi-rank runs: the same model and the same results on several processes.

Running
-------
From Python, :func:`agentsim.launch` starts ``world_size`` local processes (one torch thread
each, gloo on CPU), runs the model and returns rank 0's metrics; rank 0 writes the
one HDF5 file::

    import agentsim
    result = agentsim.launch("sir", world_size=4, agents=100_000, steps=100, seed=1, out="sir.h5")

From the command line, either let agentsim start the processes, or start them with
``torchrun`` (agentsim sees ``WORLD_SIZE > 1`` in the environment and joins the group
torchrun describes)::

    agentsim run sir --nprocs 4 --partition data --agents 100000 --out sir.h5
    torchrun --nproc_per_node 4 -m agentsim run sir --partition data --agents 100000 --out sir.h5

Options: ``--timeout SECONDS`` (default 60): how long a collective waits for the
other ranks before failing, so a dead or stuck rank never hangs the run. If a
worker raises or dies, :func:`agentsim.launch` stops the others and raises an
:class:`~agentsim.errors.AgentsimError` naming the rank, with its traceback or exit
code (:func:`~agentsim.distributed.launch.run_ranks` does the same for any function
``fn(comm, ...)``). Under torchrun, torchrun stops and (with ``--max-restarts``) restarts all
workers; the process group is built under a per-attempt store prefix
(``TORCHELASTIC_RESTART_COUNT``) so a restart does not read the failed attempt's keys.
A restarted run starts again from step 0 (no checkpoints yet). For your own driver
code, :func:`~agentsim.distributed.process_group.process_group` and
:class:`~agentsim.distributed.simulation.DistributedSimulation` are the building blocks.

What is exact
-------------
With the data partitioner (``partition="data"``, the only one built) results are
bitwise identical for any number of ranks, including 1: metrics, and the file's
``/agents``, ``/env`` and ``/metrics``, births and deaths included. That holds
because every rank sees, through ``ctx.neighbors``, every agent exactly as one
process would (each rank receives the declared neighbor fields of all other ranks'
agents before each substep that declares ``neighbors``), every random draw is keyed
by uid or cell, models never depend on row order, new uids are assigned from the
global ranking of the parents' uids, and metric sums are exact int64 (fixed point for
floats). ``/perf`` (timings) and the ``world_size`` attribute differ, by design.

Contract for model authors (true of the built-in models): read other agents only
through ``ctx.neighbors``; call ``ctx.spawn`` / ``ctx.kill`` / ``ctx.flag``
unconditionally (with empty inputs when nothing happens), since each is a collective
step on some rank; within a substep, read neighbor fields before writing the same
field (halo rows hold the values from the start of the substep).

``sync_every``
--------------
The halo refresh period in steps. Only ``sync_every=1`` (refresh before every
neighbor substep: exact) is supported; other values raise ConfigError. A stale halo
(refreshing every K steps) would make results depend on the number of ranks, and a
one-process run could not reproduce them: see :mod:`agentsim.distributed.partition`.

Cost of the data partitioner
----------------------------
Every rank holds the full initial state during ``init`` and the full environment,
and receives every agent's neighbor fields before each neighbor substep: memory
and traffic grow with the total number of agents, not with a rank's share. It
divides the per-agent compute of substeps without neighbors by W; neighbor substeps
still scan all agents on every rank.

Not built yet
-------------
- the spatial partitioner (``partition="spatial"``: agents owned by region, halos
  of agents within reach of a region's border, migration of agents that cross a
  border, env layers split by region with halo cells);
- load balancing (moving region borders as agents cluster);
- checkpoints and resume after a torchrun restart;
- stale halos (``sync_every > 1``).
"""

from __future__ import annotations

from .comm import CommStats, TorchComm
from .launch import LaunchResult, run_ranks  # launch(): agentsim.launch (this name is the module)
from .partition import PARTITIONS, DataPartition, make_partition
from .process_group import from_env, process_group, shutdown
from .simulation import DistributedSimulation

__all__ = [
    "PARTITIONS",
    "CommStats",
    "DataPartition",
    "DistributedSimulation",
    "LaunchResult",
    "TorchComm",
    "from_env",
    "make_partition",
    "process_group",
    "run_ranks",
    "shutdown",
]
