"""The ``agentsim`` command.

::

    agentsim run MODEL [--agents N] [--steps T] [--seed S] [--set name=value ...]
                       [--config FILE] [--device cpu|cuda] [--out FILE.h5]
                       [--record FIELDS] [--every K] [--quiet]
                       [--nprocs W] [--partition data|spatial] [--layout strips|blocks|rcb]
                       [--balance-every K] [--balance-threshold X] [--sync-every K] [--timeout SECONDS]
    torchrun --nproc_per_node W -m agentsim run MODEL [--partition spatial --layout rcb] ...
    agentsim bench --scaling MODEL --agents N [--steps T] [--layout L] [--repeats R] [--out FILE.json]
    agentsim models

With ``--nprocs W`` (W > 1) or under torchrun (``WORLD_SIZE`` > 1), the run is split
over W processes (see :mod:`agentsim.distributed`); rank 0 writes the one output file,
bitwise equal to the one-process file except for ``/perf`` and the ``world_size`` attribute.
A multi-rank run ends its summary with per-step communication figures (bytes sent,
seconds in collectives, halo size, max/mean agents per rank, step time), also in ``/perf``.

``agentsim bench --scaling`` runs the model with the spatial partitioner on 1 and 2
processes (one torch thread each) and prints speedup, parallel efficiency, the share of
step time spent in collectives and the halo bytes per step (see
:mod:`agentsim.distributed.bench`).

Exit status: 0 on success, 2 for a configuration error (unknown model or parameter,
bad value, malformed config file), 1 for any other error (unwritable output, a
simulation error flag).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from .errors import AgentsimError, ConfigError


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="agentsim", description="PyTorch-native agent-based simulation")
    sub = p.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run a model and write an HDF5 trajectory")
    run.add_argument("model", nargs="?", help="model name (see `agentsim models`) or module:ATTR")
    run.add_argument("--agents", type=int, help="number of agents at step 0")
    run.add_argument("--steps", type=int, help="number of steps (default 100)")
    run.add_argument("--seed", type=int, help="run seed (default 0)")
    run.add_argument("--set", dest="sets", action="append", default=[], metavar="NAME=VALUE",
                     help="set a model parameter (repeatable)")
    run.add_argument("--config", help="TOML or YAML run configuration")
    run.add_argument("--device", help="cpu (default), cuda or cuda:N")
    run.add_argument("--out", help="HDF5 output path (default: no file)")
    run.add_argument("--record", help="comma-separated fields to record: pop, pop.field, field, env.name")
    run.add_argument("--every", type=int, help="also record agents every K steps")
    run.add_argument("--quiet", action="store_true", help="no progress bar and no summary")
    run.add_argument("--nprocs", type=int, help="number of local processes (default 1; torchrun sets its own)")
    run.add_argument("--partition", help="how agents are split over processes: data (default) or spatial")
    run.add_argument("--layout", help="spatial partition regions: strips (default), blocks or rcb")
    run.add_argument("--balance-every", dest="balance_every", type=int,
                     help="spatial: check the load every K steps and move region borders (default 0: never)")
    run.add_argument("--balance-threshold", dest="balance_threshold", type=float,
                     help="spatial: rebalance when max/mean agents per rank exceeds this (default 1.1)")
    run.add_argument("--sync-every", dest="sync_every", type=int,
                     help="refresh neighbor reads every K steps (default 1: exact; K > 1: stale reads, "
                          "same result on any number of processes; partition data only)")
    run.add_argument("--timeout", type=float, help="seconds a rank waits for the others before failing (default 60)")
    sub.add_parser("models", help="list the models with their parameters and defaults")
    bench = sub.add_parser("bench", help="benchmarks: --scaling MODEL (1 vs 2 processes, spatial partition)")
    bench.add_argument("--scaling", metavar="MODEL", required=True, help="model to run on 1 and 2 processes")
    bench.add_argument("--agents", type=int, help="number of agents (default: the model's)")
    bench.add_argument("--steps", type=int, default=20, help="timed steps (default 20)")
    bench.add_argument("--warmup", type=int, default=2, help="untimed steps first (default 2)")
    bench.add_argument("--seed", type=int, default=0)
    bench.add_argument("--layout", default="strips", help="strips (default), blocks or rcb")
    bench.add_argument("--nprocs", type=int, default=2, help="the parallel world size (default 2)")
    bench.add_argument("--repeats", type=int, default=3,
                       help="rounds of (1 process, W processes), medians reported (default 3)")
    bench.add_argument("--out", help="write the figures as JSON to this path")
    return p


def _parse_sets(items: Sequence[str]) -> dict[str, str]:
    out = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise ConfigError(f"--set: expected NAME=VALUE (got {item!r})")
        out[name.strip()] = value.strip()
    return out


def cmd_models() -> int:
    """``agentsim models``: every built-in model with its substeps and parameters."""
    from .catalog import BUILTIN, get_model

    for name in BUILTIN:
        m = get_model(name)
        print(f"{name}: {m.description}")
        print(f"  substeps: {', '.join(s.name for s in m.substeps)}; default agents: {m.default_agents}")
        print(m.param_table.table())
        print()
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    """``agentsim run``: one process, ``--nprocs`` local processes, or one rank under torchrun."""
    from .catalog import get_model
    from .config import load_config
    from .engine import Simulation

    cfg = load_config(args.config) if args.config else {}
    model_name = args.model or cfg.get("model")
    if not model_name:
        raise ConfigError("no model given: `agentsim run MODEL` or model = ... in --config")
    params = dict(cfg.get("params", {}))
    params.update(_parse_sets(args.sets))
    model = get_model(model_name).configure(params=params, substeps=cfg.get("substeps"))

    def pick(key: str, default: Any) -> Any:
        value = getattr(args, key)
        return value if value is not None else cfg.get(key, default)

    agents = pick("agents", model.default_agents)
    steps = pick("steps", 100)
    seed = pick("seed", 0)
    every = pick("every", None)
    out = pick("out", None)
    record = args.record.split(",") if args.record else cfg.get("record")
    nprocs, partition, timeout, sync_every, options = _distributed_options(args, pick)
    device = pick("device", "cpu")
    t0 = t_built = time.perf_counter()
    quiet = args.quiet
    if nprocs > 1:
        from .distributed.launch import launch

        result = launch(model, nprocs, agents=agents, steps=steps, seed=seed, out=out, record=record,
                        every=every, partition=partition, timeout=timeout, device=device, sync_every=sync_every,
                        **options)
    elif world_size_from_env() > 1:  # under torchrun: this process is one rank
        from .distributed.process_group import process_group

        with process_group(timeout=timeout, device=device) as comm:
            sim = Simulation(model, agents=agents, seed=seed, device=device, comm=comm, partition=partition,
                             sync_every=sync_every, **options)
            result = sim.run(steps, out=out, record=record, every=every, progress=not quiet and comm.rank == 0)
            quiet = quiet or comm.rank != 0
        nprocs = comm.world_size
    else:
        sim = Simulation(model, agents=agents, seed=seed, device=device, sync_every=sync_every)
        t_built = time.perf_counter()
        result = sim.run(steps, out=out, record=record, every=every, progress=not args.quiet)
        device = str(sim.device)
    # One process: the initialization; several: process start-up, initialization and recording.
    t_init = t_built - t0 if nprocs == 1 else time.perf_counter() - t0 - result.seconds
    if not quiet:
        last = {k: v[-1] for k, v in result.metrics.items()}
        rate = steps / result.seconds if result.seconds > 0 else float("inf")
        ranks = f", {nprocs} processes ({partition} partition)" if nprocs > 1 else ""
        print(f"{model.name}: {agents} agents, {steps} steps, seed {seed}, device {device}{ranks}")
        print(f"init {t_init:.2f} s; simulation {result.seconds:.2f} s ({rate:.1f} steps/s, "
              f"{rate * agents:.3g} agent-updates/s)")
        print("final: " + ", ".join(f"{k}={_fmt(v)}" for k, v in last.items()))
        print(model.plan(result.timings))
        if nprocs > 1 and result.perf:
            from .perf import summarize_perf

            print(summarize_perf(result.perf))
        if out:
            print(f"wrote {out}")
    return 0


def _distributed_options(args: argparse.Namespace,
                         pick: Callable[[str, Any], Any]) -> tuple[int, str, float, int, dict[str, Any]]:
    """--nprocs, --partition, --timeout, --sync-every and the spatial options, checked (before any
    process starts).
    """
    from .distributed.process_group import DEFAULT_TIMEOUT, check_timeout
    from .partition import check_run_partition

    nprocs = pick("nprocs", 1)
    if isinstance(nprocs, bool) or not isinstance(nprocs, int) or nprocs < 1:
        raise ConfigError(f"--nprocs: expected an int >= 1 (got {nprocs!r})")
    if nprocs > 1 and world_size_from_env() > 1:
        raise ConfigError(f"--nprocs {nprocs} under torchrun (WORLD_SIZE={world_size_from_env()}): "
                          "let torchrun start the processes and drop --nprocs")
    partition, options, sync_every = check_run_partition(
        pick("partition", "data"), pick("sync_every", 1),
        **{k: pick(k, None) for k in ("layout", "balance_every", "balance_threshold")})
    return nprocs, partition, check_timeout(pick("timeout", DEFAULT_TIMEOUT)), sync_every, options


def cmd_bench(args: argparse.Namespace) -> int:
    """``agentsim bench --scaling``: see :mod:`agentsim.distributed.bench`."""
    from .distributed.bench import format_scaling, scaling

    figures = scaling(args.scaling, agents=args.agents, steps=args.steps, warmup=args.warmup, seed=args.seed,
                      layout=args.layout, world_size=args.nprocs, repeats=args.repeats, out=args.out)
    print(format_scaling(figures))
    if args.out:
        print(f"wrote {args.out}")
    return 0


def world_size_from_env() -> int:
    """``WORLD_SIZE`` of torchrun's environment (1 when unset)."""
    from .distributed.process_group import world_size_from_env as ws

    return ws()


def _fmt(v: object) -> str:
    return f"{v:.6g}" if isinstance(v, float) else str(v)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``agentsim`` command; returns its exit status (see the module docstring)."""
    args = _parser().parse_args(argv)
    try:
        if args.command == "models":
            return cmd_models()
        if args.command == "bench":
            return cmd_bench(args)
        return cmd_run(args)
    except ConfigError as e:
        print(f"agentsim: error: {e}", file=sys.stderr)
        return 2
    except AgentsimError as e:
        print(f"agentsim: error: {e}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # output piped into e.g. `head`: stop quietly
        sys.stderr.close()
        return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
