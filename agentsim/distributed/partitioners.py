"""Choosing a partitioner: by name (``"data"``, ``"spatial"``) with its options, checked before
any process starts (:func:`make_partition`, :func:`check_run_partition`).
"""

from __future__ import annotations

from typing import Any

from agentsim.distributed.data import DataPartition
from agentsim.distributed.partition import PARTITIONS, SPATIAL_OPTIONS, IdentityPartition, Partitioner
from agentsim.distributed.snapshot import check_sync_every
from agentsim.distributed.spatial import SpatialPartition
from agentsim.errors import ConfigError, did_you_mean

__all__ = ["check_partition", "check_run_partition", "check_sync_every_for", "make_partition"]


def check_partition(name: object) -> str:
    """Validate a partitioner name (``"data"`` or ``"spatial"``)."""
    if not isinstance(name, str) or name not in PARTITIONS:
        hint = did_you_mean(name, PARTITIONS) if isinstance(name, str) else ""
        raise ConfigError(f"unknown partition {name!r} (valid: {', '.join(PARTITIONS)})." + hint)
    return name


def make_partition(partition: str | Partitioner | None = None, world_size: int = 1,
                   **options: Any) -> Partitioner:
    """A partitioner from a name, or an instance (returned as is).

    Args:
        partition: ``"data"``, ``"spatial"``, a partitioner, or None: the identity on one rank,
            ``"data"`` on several.
        world_size: The number of ranks.
        options: For ``"spatial"``: ``layout``, ``balance_every``, ``balance_threshold``, ``bins``,
            ``overlap`` (None values are dropped).
    """
    for key in options:
        if key not in SPATIAL_OPTIONS:
            raise ConfigError(f"unexpected option {key!r} (partition options: {', '.join(SPATIAL_OPTIONS)})."
                              + did_you_mean(key, [*SPATIAL_OPTIONS, "sort_every", "sync_every", "check_nan",
                                                   "check_inf", "shuffle_rows", "params", "comm", "device"]))
    options = {k: v for k, v in options.items() if v is not None}
    if partition is not None and not isinstance(partition, str):
        if options:
            raise ConfigError(f"partition options ({', '.join(sorted(options))}) go to the partitioner's "
                              "constructor when it is given as an instance")
        return partition
    if partition is None and world_size == 1:
        if options:
            raise ConfigError(f"partition options ({', '.join(sorted(options))}) need partition='spatial'")
        return IdentityPartition()
    name = check_partition(partition or "data")
    if name == "spatial":
        return SpatialPartition(**options)
    if options:
        raise ConfigError(f"partition 'data' takes no options (got {', '.join(sorted(options))}); "
                          "layout and balancing belong to partition 'spatial'")
    return DataPartition()


def check_run_partition(partition: str | None, sync_every: object = 1,
                        **options: Any) -> tuple[str, dict[str, Any], int]:
    """Check a multi-rank run's partitioner name, options and ``sync_every`` before any process
    starts; returns them (name, the options given, sync_every).
    """
    name = check_partition(partition or "data")
    given = {k: v for k, v in options.items() if v is not None}
    return name, given, check_sync_every_for(make_partition(name, 2, **given), sync_every)


def check_sync_every_for(partition: Partitioner, sync_every: object) -> int:
    """Validate ``sync_every`` for ``partition``: K > 1 needs one process or the data partitioner."""
    k = check_sync_every(sync_every)
    if k > 1 and partition.name == "spatial":
        raise ConfigError(
            f"sync_every={k} needs partition 'data' (or one process): the spatial partitioner sends only "
            "the agents within reach of current positions, so a snapshot would miss agents that move into "
            "reach (valid with 'spatial': 1)")
    return k

