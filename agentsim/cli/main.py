"""The ``agentsim`` command.

::

    agentsim run MODEL [--agents N] [--steps T] [--seed S] [--set name=value ...]
                       [--config FILE] [--device cpu|cuda] [--out FILE.h5]
                       [--record FIELDS] [--every K] [--quiet]
                       [--nprocs W] [--partition data|spatial] [--layout strips|blocks|rcb]
                       [--balance-every K] [--balance-threshold X] [--sync-every K] [--timeout SECONDS]
                       [--checkpoint-every K] [--checkpoint-dir DIR] [--keep N] [--checkpoint-async] [--resume DIR]
                       [--max-restarts N]
    torchrun --nproc_per_node W -m agentsim run MODEL [--partition spatial --layout rcb] ...
    agentsim bench --scaling MODEL --agents N [--steps T] [--layout L] [--repeats R] [--out FILE.json]
    agentsim train MODEL [--agents N] [--updates U] [--horizon H] [--seed S] [--set name=value ...]
                         [--nprocs W | torchrun] [--partition data|spatial] [--precision fp32|bf16]
                         [--compress none|fp16|bf16|powersgd] [--lr X] [--epochs E] [--minibatches M]
                         [--hidden 64,64] [--policy NAME] [--checkpoint-dir DIR] [--checkpoint-every K]
                         [--keep N] [--resume] [--out train.h5] [--plot curve.png] [--quiet]
    agentsim models
    agentsim info [--json]
    agentsim inspect PATH
    agentsim sweep MODEL --grid NAME=V1,V2 ... (--seeds 1,2,3 | --replicates R [--study-seed S])
                   [--agents N] [--steps T] --out STUDY.h5 [--workers N] [--resume | --overwrite]
                   [--executor local|ray [--address A [--connect-timeout S]] [--cpus-per-run C]
                   [--gpus-per-run G]]
                   [--retries N] [--retry-exceptions] [--errors off|slow|fast] [--log-json FILE] [--quiet]
    agentsim study status STUDY.h5|DIR
    agentsim plot FILE.h5 [--out FILE.png] [--metrics A,B]
    agentsim animate FILE.h5 --out FILE.gif|mp4 [--fps N]


With ``--nprocs W`` (W > 1) or under torchrun (``WORLD_SIZE`` > 1), the run is split
over W processes (see :mod:`agentsim.distributed`); rank 0 writes the one output file,
bitwise equal to the one-process file except for ``/perf`` and the ``world_size`` attribute.
A multi-rank run ends its summary with per-step communication figures (bytes sent,
seconds in collectives, halo size, max/mean agents per rank, step time), also in ``/perf``.

``agentsim bench --scaling`` runs the model with the spatial partitioner on 1 and 2
processes (one torch thread each) and prints speedup, parallel efficiency, the share of
step time spent in collectives and the halo bytes per step (see
:mod:`agentsim.runner.bench`).

``agentsim train`` trains the model's policy with PPO (:mod:`agentsim.learn`): one line per
update (mean return, losses, entropy, KL, clip fraction, agent-steps/s, seconds in the gradient
all-reduce); the same log in ``--out`` (HDF5, one ``/metrics`` row per update), the learning
curve in ``--plot``, checkpoints in ``--checkpoint-dir`` (rank 0, atomic), ``--resume`` from the
newest. The same seed gives the same parameters on any number of processes.

``agentsim inspect PATH`` checks and summarizes a trajectory file (model, seed, steps completed,
whether the run completed, populations and frames, the last metrics row) or a checkpoint (a
checkpoint directory, or a directory of them: the newest complete one, every checksum verified).

``agentsim info`` prints versions, cores and threads, native bf16, CUDA devices, the distributed
backends and optional packages, with advice when something is missing (``--json``: machine-readable).

Exit status: 0 on success, 2 for a configuration error (unknown model or parameter,
bad value, malformed config file, a ``--resume`` of a checkpoint saved by another run), 1 for
any other error (unwritable output, an output file or checkpoint directory that another running
process writes, a simulation error flag).

A run holds locks on its ``--out`` and checkpoint directory (:mod:`agentsim.io.locks`), taken before
``--resume DIR`` is resolved to the newest complete checkpoint there, once: every process loads
that one. The workers of ``--nprocs`` die with the command (:mod:`agentsim.runner.lifeline`).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

from agentsim.engine.stops import Terminated, exit_status, graceful_stops, requested, signal_name, terminate_on_sigterm
from agentsim.errors import AgentsimError, ConfigError, RunStopped, memory_text, out_of_memory
from agentsim.runner.invariance import CHECK_STEPS
from agentsim.threads import configured_threads


def build_parser() -> argparse.ArgumentParser:
    """The ``agentsim`` command's argument parser, every subcommand included (the documentation's
    command-line reference is generated from it).
    """
    p = argparse.ArgumentParser(prog="agentsim", description="PyTorch-native agent-based simulation")
    sub = p.add_subparsers(dest="command", required=True)
    _run_parser(sub)
    check = sub.add_parser("check", help="run a model at a small size on 1, 2 and 3 processes with each partitioner "
                                         "(rows shuffled, resumed) and say whether the bits are the same")
    check.add_argument("model", help="model name, module:ATTR or file.py:ATTR")
    check.add_argument("--agents", type=int, default=1000, help="number of agents (default 1000)")
    check.add_argument("--steps", type=int, default=CHECK_STEPS,
                       help=f"number of steps (default {CHECK_STEPS}: motion that builds up over steps, such as "
                            "agents speeding up from rest, has built up)")
    check.add_argument("--seed", type=int, default=1, help="run seed (default 1)")
    check.add_argument("--set", dest="sets", action="append", default=[], metavar="NAME=VALUE",
                       help="set a model parameter (repeatable)")
    check.add_argument("--world-sizes", dest="world_sizes", default="1,2,3",
                       help="comma-separated process counts, 1 first, at most 4 (default 1,2,3)")
    check.add_argument("--partition", dest="partitions", action="append", choices=["data", "spatial"],
                       help="partitioner to compare (repeatable; default: each that applies)")
    check.add_argument("--no-resume", dest="resume", action="store_false",
                       help="do not resume a checkpoint on 2 processes")
    check.add_argument("--timeout", type=float, default=60.0,
                       help="seconds a process waits for the others before failing (default 60)")
    sub.add_parser("models", help="list the models with their parameters and defaults")
    _study_parsers(sub)
    plot = sub.add_parser("plot", help="draw the figure for a trajectory or study file")
    plot.add_argument("file")
    plot.add_argument("--out", help="PNG path (default: the file's name with .png)")
    plot.add_argument("--metrics", help="comma-separated metrics to draw, e.g. I,R (default: every metric of a "
                      "study; the model's figure of a trajectory); over 6, pages FILE-1.png, FILE-2.png, ...")
    animate = sub.add_parser("animate", help="animate the recorded frames of a spatial model's trajectory")
    animate.add_argument("file")
    animate.add_argument("--out", required=True, help="FILE.gif (or .mp4 with ffmpeg)")
    animate.add_argument("--fps", type=int, default=8, help="frames per second (default 8)")
    inspect = sub.add_parser("inspect", help="check and summarize a trajectory file or a checkpoint")
    inspect.add_argument("path", help="an HDF5 trajectory, a checkpoint directory, or a directory of checkpoints")
    info = sub.add_parser("info", help="versions, cores, bf16, CUDA devices, backends, and advice")
    info.add_argument("--json", action="store_true", help="print the facts as JSON")
    info.add_argument("--require-kernels", action="store_true",
                      help="exit with status 1 unless the native CPU kernels are active (CI)")
    _train_parser(sub)
    _calibrate_parser(sub)
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


def _run_parser(sub: Any) -> None:
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
    run.add_argument("--checkpoint-every", dest="checkpoint_every", type=int, metavar="K",
                     help="save a checkpoint after every K-th step (into --checkpoint-dir)")
    run.add_argument("--checkpoint-dir", dest="checkpoint_dir", metavar="DIR",
                     help="where checkpoints go (default: checkpoints)")
    run.add_argument("--keep", type=int, metavar="N", help="keep the newest N checkpoints (default: all)")
    run.add_argument("--checkpoint-async", dest="checkpoint_async", action="store_true", default=None,
                     help="write checkpoints in the background while the next steps run (the state is copied "
                          "first)")
    run.add_argument("--max-restarts", dest="max_restarts", type=int, metavar="N",
                     help="with --nprocs: when a process fails, restart all from the newest checkpoint, "
                          "up to N times (under torchrun, use its --max-restarts)")
    run.add_argument("--resume", metavar="DIR",
                     help="continue from the newest complete checkpoint in DIR (on any number of processes); "
                          "--steps stays the run's total; --agents, --seed, --set, --sync-every, --record and "
                          "--every must be those of the run that saved it")
    run.add_argument("--check", nargs="?", const=True, default=None, type=_check_steps, metavar="K",
                     help="check mode: check every substep call against the contract (row order, reach, "
                          "sums over one process's agents, env combines, env indices, uids); several times slower. "
                          "--check K checks every K-th step only (a sampled check of a long run)")


def _check_steps(text: str) -> int:
    """``--check K``: K, the steps between checked steps (an int >= 1)."""
    try:
        k = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of steps K >= 1 (got {text!r}; a bare --check, which "
                                         "checks every step, goes after the model: agentsim run MODEL --check)"
                                         ) from None
    if k < 1:
        raise argparse.ArgumentTypeError(f"expected a number of steps K >= 1 (got {k})")
    return k


def _train_parser(sub: Any) -> None:
    from agentsim.learn.hooks import COMPRESSIONS
    from agentsim.learn.ppo import PRECISIONS

    train = sub.add_parser("train", help="train a model's policy with PPO (one process, --nprocs W, or torchrun)")
    train.add_argument("model", help="model name with a policy (e.g. spillover) or module:ATTR")
    train.add_argument("--agents", type=int, help="agents per episode (default: the model's)")
    train.add_argument("--updates", type=int, default=50, help="PPO updates (default 50)")
    train.add_argument("--horizon", type=int, help="steps per episode (default 40)")
    train.add_argument("--seed", type=int, default=0, help="training seed (default 0)")
    train.add_argument("--set", dest="sets", action="append", default=[], metavar="NAME=VALUE",
                       help="override a model parameter (repeatable)")
    train.add_argument("--policy", help="which policy (default: the model's only one)")
    train.add_argument("--nprocs", type=int, default=1, help="local processes (default 1; torchrun sets its own)")
    train.add_argument("--partition", help="how episodes split agents over processes: data (default) or spatial")
    train.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    train.add_argument("--precision", choices=PRECISIONS, help="fp32 (default) or bf16 (autocast; needs native bf16)")
    train.add_argument("--compress", choices=COMPRESSIONS, help="gradient compression hook (default none)")
    train.add_argument("--lr", type=float, help="Adam learning rate (default 1e-3, annealed to 0)")
    train.add_argument("--epochs", type=int, help="passes per update (default 4)")
    train.add_argument("--minibatches", type=int, help="minibatches per epoch (default 4)")
    train.add_argument("--hidden", help="hidden layer widths, comma-separated (default 64,64)")
    train.add_argument("--checkpoint-dir", dest="checkpoint_dir", help="write checkpoints here (rank 0, atomic)")
    train.add_argument("--checkpoint-every", dest="checkpoint_every", type=int, default=1,
                       help="updates between checkpoints (default 1)")
    train.add_argument("--keep", type=int, default=3, help="checkpoints kept (default 3)")
    train.add_argument("--resume", action="store_true", help="continue from the newest checkpoint in --checkpoint-dir")
    train.add_argument("--out", help="training log, HDF5 (one /metrics row per update)")
    train.add_argument("--plot", help="learning curve image (PNG, SVG or PDF)")
    train.add_argument("--quiet", action="store_true", help="no per-update lines and no summary")
    train.add_argument("--timeout", type=float, help="seconds a rank waits for the others before failing (default 60)")


def _calibrate_parser(sub: Any) -> None:
    cal = sub.add_parser("calibrate", help="fit model parameters to an observed time series")
    cal.add_argument("model", help="model name (e.g. flu), module:ATTR or path/to/file.py:ATTR")
    cal.add_argument("--data", required=True, help="CSV file ('#' lines are comments)")
    cal.add_argument("--column", required=True, help="the observed column (e.g. in_bed)")
    cal.add_argument("--time-column", dest="time_column", default="day", help="the time column (default day)")
    cal.add_argument("--metric", required=True,
                     help="the model's metric compared with the column as runs report it (a sum, or a mean metric's "
                          "mean; per replicate with --replicates), or a derived metric (e.g. I)")
    cal.add_argument("--fit", required=True, help="float parameters to fit, comma-separated (e.g. beta,gamma)")
    cal.add_argument("--loss", default="sse", help="sse (default), poisson or negbin")
    cal.add_argument("--method", default="nelder-mead", help="nelder-mead (default), spsa or adam")
    cal.add_argument("--seeds", type=int, default=1, help="runs per evaluation, seeds 0..K-1 (default 1)")
    cal.add_argument("--agents", type=int, help="agents per run (default: the model's)")
    cal.add_argument("--set", dest="sets", action="append", default=[], metavar="NAME=VALUE",
                     help="fix a model parameter (repeatable)")
    cal.add_argument("--start", action="append", default=[], metavar="NAME=VALUE", help="starting value (repeatable)")
    cal.add_argument("--bounds", action="append", default=[], metavar="NAME=LOW:HIGH", help="bounds (repeatable)")
    cal.add_argument("--replicates", help="integer field keying replicates inside a run (e.g. school)")
    cal.add_argument("--takeoff", type=float, help="leave out replicates whose series never exceeds this")
    cal.add_argument("--aggregate", default="mean",
                     help="mean (default: loss of the mean series) or each (mean of each replicate's loss)")
    cal.add_argument("--iterations", type=int, help="evaluations (nelder-mead) or iterations (spsa, adam)")
    cal.add_argument("--nprocs", type=int, default=1, help="local processes per run (default 1; same numbers)")
    cal.add_argument("--out", help="write the fit as JSON here")
    cal.add_argument("--plot", help="data against the fitted model's band (PNG, SVG or PDF)")
    cal.add_argument("--quiet", action="store_true", help="no progress lines")


def cmd_calibrate(args: argparse.Namespace) -> int:
    """``agentsim calibrate``: fit, print the result, write fit.json and the figure."""
    from agentsim.calibrate import calibrate, plot_fit, read_series
    from agentsim.calibrate.objective import Objective
    from agentsim.core.catalog import get_model

    model = get_model(args.model)
    data = read_series(args.data, args.column, args.time_column)
    fit_names = [n.strip() for n in args.fit.split(",") if n.strip()]
    if args.seeds < 1:
        raise ConfigError(f"--seeds: expected an int >= 1 (got {args.seeds})")
    start = {k: _number("--start", k, v) for k, v in _parse_sets(args.start).items()}
    bounds = {}
    for name, text in _parse_sets(args.bounds).items():
        low, sep, high = text.partition(":")
        if not sep:
            raise ConfigError(f"--bounds: expected NAME=LOW:HIGH (got {name}={text})")
        bounds[name] = (_number("--bounds", name, low), _number("--bounds", name, high))
    settings = {"agents": args.agents, "seeds": tuple(range(args.seeds)), "params": _parse_sets(args.sets),
                "loss": args.loss, "replicates": args.replicates, "takeoff": args.takeoff, "aggregate": args.aggregate}
    result = calibrate(model, data, fit_names, args.metric, method=args.method, world_size=args.nprocs,
                       start=start, bounds=bounds, iterations=args.iterations, progress=not args.quiet, **settings)
    print(result.summary())
    if args.out:
        result.to_json(args.out)
        print(f"wrote {args.out}")
    if args.plot:
        plot_fit(Objective(model, data, tuple(fit_names), args.metric, **settings), result, args.plot)
        print(f"wrote {args.plot}")
    return 0


def _number(option: str, name: str, text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise ConfigError(f"{option}: expected a number for {name} (got {text!r})") from None


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
    from agentsim.core.catalog import BUILTIN, get_model

    for name in BUILTIN:
        m = get_model(name)
        print(f"{name}: {m.description}")
        print(f"  substeps: {', '.join(s.name for s in m.substeps)}; default agents: {m.default_agents}")
        print(m.param_table.table())
        print()
    return 0


def _study_parsers(sub: Any) -> None:
    sw = sub.add_parser("sweep", help="run a population study (a parameter grid times seeds) into one study file")
    sw.add_argument("model", help="model name or module:ATTR")
    sw.add_argument("--grid", action="append", default=[], metavar="NAME=V1,V2",
                    help="parameter values to sweep (repeatable; the runs are their Cartesian product)")
    sw.add_argument("--seeds", help="comma-separated seeds of the replicates of every combination")
    sw.add_argument("--replicates", type=int, help="instead of --seeds: R replicates with derived seeds")
    sw.add_argument("--study-seed", dest="study_seed", type=int, default=0, help="seed the replicates derive from")
    sw.add_argument("--agents", type=int, help="agents of every run (default: the model's)")
    sw.add_argument("--steps", type=int, default=100, help="steps of every run (default 100)")
    sw.add_argument("--out", required=True, help="the study file (HDF5)")
    sw.add_argument("--workers", type=int, help="worker processes (default: the CPU count)")
    sw.add_argument("--executor", default="local", help="local (a process pool, default) or ray")
    sw.add_argument("--address", help="ray: the address of a running cluster (default: start a local instance)")
    sw.add_argument("--connect-timeout", dest="connect_timeout", type=float, default=15.0,
                    help="ray --address: seconds to wait for the cluster to accept a connection (default 15)")
    sw.add_argument("--cpus-per-run", dest="cpus_per_run", type=float, default=1.0, help="ray: CPUs of one run")
    sw.add_argument("--gpus-per-run", dest="gpus_per_run", type=float, default=0.0, help="ray: GPUs of one run")
    sw.add_argument("--resume", action="store_true", help="continue the study in --out: run only what is missing")
    sw.add_argument("--overwrite", action="store_true", help="replace an existing --out")
    sw.add_argument("--retries", type=int, default=3, help="further attempts of a failed run (default 3)")
    sw.add_argument("--retry-exceptions", dest="retry_exceptions", action="store_true",
                    help="also retry runs that raised (default: only worker deaths)")
    sw.add_argument("--errors", default="slow", help="off, slow (default: go on, fail at the end) or fast (stop)")
    sw.add_argument("--log-json", dest="log_json", metavar="FILE", help="one JSON line per event (- for stdout)")
    sw.add_argument("--quiet", action="store_true", help="no progress bar and no summary")
    st = sub.add_parser("study", help="about a study file: study status FILE")
    st_sub = st.add_subparsers(dest="study_command", required=True)
    status = st_sub.add_parser("status", help="done / failed / remaining runs of a study file (or of each in a dir)")
    status.add_argument("file", help="a study file, or a directory of them")


def cmd_sweep(args: argparse.Namespace) -> int:
    """``agentsim sweep``: a :class:`~agentsim.study.Study` from the command line."""
    from agentsim.core.catalog import get_model
    from agentsim.core.params import convert
    from agentsim.study import Study

    base = get_model(args.model)
    grid: dict[str, list[Any]] = {}
    for item in args.grid:
        name, sep, values = item.partition("=")
        name = name.strip()
        if not sep or not name or not values.strip():
            raise ConfigError(f"--grid: expected NAME=V1,V2,... (got {item!r})")
        if name not in base.param_table:
            from agentsim.errors import did_you_mean

            raise ConfigError(f"--grid: unknown parameter '{name}' of model '{base.name}' (valid: "
                              f"{', '.join(base.param_table)})." + did_you_mean(name, base.param_table))
        typ = base.param_table[name].type
        grid[name] = [convert(name, v.strip(), typ) for v in values.split(",")]
    seeds = None
    if args.seeds is not None:
        try:
            seeds = [int(s) for s in args.seeds.split(",")]
        except ValueError:
            raise ConfigError(f"--seeds: expected comma-separated ints (got {args.seeds!r})") from None
    study = Study(args.model, grid or None, seeds=seeds, replicates=args.replicates, seed=args.study_seed,
                  agents=args.agents, steps=args.steps)
    result = study.run(args.out, workers=args.workers, executor=args.executor, resume=args.resume,
                       overwrite=args.overwrite, retries=args.retries, retry_exceptions=args.retry_exceptions,
                       errors=args.errors, progress=not args.quiet, log_json=args.log_json, address=args.address,
                       cpus_per_run=args.cpus_per_run, gpus_per_run=args.gpus_per_run,
                       connect_timeout=args.connect_timeout)
    if not args.quiet:
        print(f"{base.name}: {len(study.runs)} runs ({len(study.combos)} combinations x "
              f"{len(study.runs) // len(study.combos)} replicates); executed {result.executed}, "
              f"already done {result.skipped}, retried {result.retries}, failed {len(result.failed)}; "
              f"{result.seconds:.1f} s")
        print(f"wrote {result.path}")
    return 0


def cmd_study_status(path: str) -> int:
    """``agentsim study status FILE|DIR`` (a directory: every study file in it)."""
    import glob

    from agentsim.study import study_status

    if os.path.isdir(path):
        statuses = []
        for f in sorted(glob.glob(os.path.join(path, "*.h5"))):
            try:
                statuses.append(study_status(f))
            except AgentsimError:
                continue  # not a study file (a trajectory, ...)
        if not statuses:
            raise ConfigError(f"study status: no study file (*.h5 of format agentsim-study) in '{path}'")
    else:
        statuses = [study_status(path)]
    for s in statuses:
        state = "completed" if s["completed"] else "not completed (running, stopped, or with failed runs)"
        print(f"{s['path']}: {s['total']} runs: {s['done']} done, {s['failed']} failed, {s['remaining']} "
              f"remaining; {state}")
    return 0


def cmd_inspect(path: str) -> int:
    """``agentsim inspect PATH``: a trajectory file's or a checkpoint's summary, after checking it."""
    if os.path.isdir(path):
        from agentsim.io.checkpoint import read_checkpoint

        ck = read_checkpoint(path)  # verifies every checksum
        m = ck.manifest
        print(f"checkpoint {ck.path}: model {m['model']}, step {ck.step}, seed {m.get('seed')}, saved on "
              f"{m.get('world_size')} process(es) ({m.get('partition')} partition), agentsim {m.get('agentsim')}")
        rows: dict[str, int] = {}
        for shard in m["shards"]:
            for name, n in shard["rows"].items():
                rows[name] = rows.get(name, 0) + int(n)
        print("agents: " + ", ".join(f"{name} {n}" for name, n in rows.items()))
        print("params: " + ", ".join(f"{k}={v}" for k, v in m.get("params", {}).items()))
        print("every checksum verified")
        return 0
    from agentsim.io.hdf5 import CHECKSUMS_SINCE, read_trajectory

    traj = read_trajectory(path)
    a = traj.attrs
    state = "completed" if a.get("completed") else "did not complete (killed, failed, or still running)"
    print(f"trajectory {path}: model {a.get('model')}, seed {a.get('seed')}, {a.get('steps_completed')} of "
          f"{a.get('steps')} steps, {state}")
    for name in traj.populations:
        steps = traj.steps(name)
        print(f"agents '{name}': {len(steps)} frames (steps {', '.join(map(str, steps[:8].tolist()))}"
              f"{', ...' if len(steps) > 8 else ''}), fields {', '.join(traj.fields(name))}")
    if traj.env_names:
        print(f"env: {', '.join(traj.env_names)} ({len(traj.env_steps())} frames)")
    if traj.metrics and len(traj.metrics.get("step", [])):
        print("last metrics: " + ", ".join(f"{k}={_fmt(v[-1])}" for k, v in traj.metrics.items()))
    frames = traj.verify()
    if a.get("format_version", 1) >= CHECKSUMS_SINCE:
        print(f"every checksum verified ({len(traj.metrics.get('step', []))} metric rows, {frames} frames)")
    else:
        print(f"no checksums to verify (format version {a.get('format_version')}: agentsim 0.3 or earlier)")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    """``agentsim run``: one process, ``--nprocs`` local processes, or one rank under torchrun."""
    from agentsim.io.config import load_config
    from agentsim.io.locks import hold

    spec = run_spec(args, load_config(args.config) if args.config else {})
    # The locks on --out and the checkpoint directory first (rank 0 under torchrun), then --resume:
    # a killed run that wrote them has stopped by the time the checkpoint to resume is chosen.
    rank0 = world_size_from_env() == 1 or os.environ.get("RANK", "0") == "0"
    with graceful_stops(), hold(spec.out if rank0 else None, spec.checkpoint_dir if rank0 else None):
        try:
            return _run_locked(args, spec)
        except RunStopped as e:  # every rank stopped after the same step: this process says how to go on
            signum = requested() or e.signum  # (the launcher's own signal: its workers got SIGTERM)
            if rank0:
                print(f"agentsim: {_stop_line(e, spec, signum)}", file=sys.stderr)
            return exit_status(signum)


def _stop_line(e: RunStopped, spec: Any, signum: int) -> str:
    """One line on a run stopped by a signal: where it stopped, what the output holds, how to resume."""
    name = signal_name(signum)
    out = f"; '{spec.out}' holds steps 0-{e.step} (not completed)" if spec.out else ""
    if e.checkpoint is None:
        return f"stopped by {name} after step {e.step}{out}; no --checkpoint-dir, so it cannot be resumed"
    argv = list(sys.argv[1:]) if sys.argv[1:2] == ["run"] else ["run", "..."]
    if "--resume" not in argv:
        argv += ["--resume", str(spec.checkpoint_dir)]
    return (f"stopped by {name} after step {e.step}{out}; final checkpoint {e.checkpoint}; resume with: "
            f"agentsim {' '.join(argv)}")


def run_spec(args: argparse.Namespace, cfg: Mapping[str, Any]) -> Any:
    """The :class:`~agentsim.engine.spec.RunSpec` of ``agentsim run``: the flags over the config file's
    keys (its field names), checked; ``steps`` is the run's total (a resumed run does the rest).
    """
    from agentsim.engine.spec import RunSpec

    values = {k: v for k, v in cfg.items() if k != "params"}
    values.update({k: getattr(args, k) for k in RunSpec.fields() if getattr(args, k, None) is not None})
    values["model"] = args.model or cfg.get("model")
    if not values["model"]:
        raise ConfigError("no model given: `agentsim run MODEL` or model = ... in --config")
    values["params"] = {**cfg.get("params", {}), **_parse_sets(args.sets)} or None
    nprocs = values.get("nprocs", 1)
    if isinstance(nprocs, bool) or not isinstance(nprocs, int) or nprocs < 1:
        raise ConfigError(f"--nprocs: expected an int >= 1 (got {nprocs!r})")
    if nprocs > 1 and world_size_from_env() > 1:
        raise ConfigError(f"--nprocs {nprocs} under torchrun (WORLD_SIZE={world_size_from_env()}): "
                          "let torchrun start the processes and drop --nprocs")
    _checkpoint_settings(values)
    spec = RunSpec.from_dict(values)
    if spec.max_restarts and spec.nprocs == 1:
        raise ConfigError("--max-restarts restarts the processes of --nprocs W (W > 1); under torchrun use "
                          "torchrun --max-restarts")
    return spec


def _run_locked(args: argparse.Namespace, spec: Any) -> int:
    """``agentsim run`` once its output is locked: resume, run, report."""
    model, agents, total = spec.resolved_model(), spec.resolved_agents(), spec.steps
    resume, start = _resume_option(spec)
    append = resume is not None and spec.out is not None and os.path.isfile(spec.out)  # write on into its file
    spec = spec.replace(resume=resume, steps=total - start, append=append)
    if resume is not None and spec.nprocs == 1 and world_size_from_env() == 1:
        from agentsim.runner.launch import check_resume  # refused before the model is built

        check_resume(resume, model, agents=agents, seed=spec.seed, sync_every=spec.sync_every, record=spec.record,
                     every=spec.every, append=append)
    if resume is None:  # a state that cannot fit: refused before any process starts
        from agentsim.engine.memory import check_memory
        from agentsim.engine.simulation import resolve_device

        check_memory(model, model.params, agents, resolve_device(spec.device), spec.seed, what=f"--agents {agents}")
    t0 = time.perf_counter()
    result, nprocs, quiet, t_built, spec = _execute(spec, args.quiet, total)
    # One process: the initialization; several: process start-up, initialization and recording.
    t_init = (t_built or t0) - t0 if nprocs == 1 else time.perf_counter() - t0 - result.seconds
    if quiet:
        return 0
    from agentsim.engine.simulation import resolve_device

    last = {k: v[-1] for k, v in result.metrics.items()}
    rate = spec.steps / result.seconds if result.seconds > 0 else float("inf")
    ranks = f", {nprocs} processes ({spec.partition_name} partition)" if nprocs > 1 else ""
    resumed = f" (resumed from {spec.resume} at step {total - spec.steps})" if spec.resume else ""
    device = str(resolve_device(spec.device)) if nprocs == 1 else spec.device
    built = result.agents if result.agents is not None else agents
    asked = f" (--agents {agents})" if built != agents and not spec.resume else ""
    print(f"{model.name}: {built:,} agents{asked}, {total} steps{resumed}, seed {spec.seed}, device {device}{ranks}")
    print(f"init {t_init:.2f} s; simulation {result.seconds:.2f} s ({rate:.1f} steps/s, "
          f"{rate * built:.3g} agent-updates/s)")
    print("final: " + ", ".join(f"{k}={_fmt(v)}" for k, v in last.items()))
    print(model.plan(result.timings))
    if result.threads:
        print(result.threads)
    if nprocs > 1 and result.perf:
        from agentsim.engine.perf import summarize_perf

        print(summarize_perf(result.perf, spec.steps))
    if nprocs > 1 and result.groups:
        from agentsim.engine.perf import summarize_groups

        print(summarize_groups(result.groups))
    if spec.out:
        print(f"wrote {spec.out}")
    return 0


def _execute(spec: Any, quiet: bool, total: int) -> tuple[Any, int, bool, float | None, Any]:
    """Run ``spec`` on ``--nprocs`` processes, as this rank under torchrun, or here; returns the result,
    the number of processes, whether this process stays quiet, when the one-process simulation was
    built, and the spec that ran (under torchrun, with the checkpoint every rank agreed on).
    """
    from agentsim.engine.spec import make_simulation, run_simulation

    if spec.nprocs > 1:
        from agentsim.runner.launch import launch

        return launch(spec), spec.nprocs, quiet, None, spec
    if world_size_from_env() > 1:  # under torchrun: this process is one rank
        from agentsim.distributed.process_group import process_group

        with process_group(timeout=spec.timeout, device=spec.device) as comm:
            if spec.resume is not None:  # every rank the checkpoint rank 0 chose, and its step
                from agentsim.io.checkpoint import agree_checkpoint, checkpoint_step

                resume = str(agree_checkpoint(spec.resume, comm))
                spec = spec.replace(resume=resume, steps=total - checkpoint_step(resume))
            result = run_simulation(spec, make_simulation(spec, comm), progress=not quiet and comm.rank == 0)
        return result, comm.world_size, quiet or comm.rank != 0, None, spec
    sim = make_simulation(spec)
    t_built = time.perf_counter()
    return run_simulation(spec, sim, progress=not quiet), 1, quiet, t_built, spec


def cmd_check(args: argparse.Namespace) -> int:
    """``agentsim check``: exit 0 when every run gives the one-process bits, 1 otherwise."""
    from agentsim.runner.invariance import check_model

    try:
        sizes = tuple(int(w) for w in args.world_sizes.split(","))
    except ValueError:
        raise ConfigError(f"--world-sizes: expected comma-separated ints such as 1,2,3 (got {args.world_sizes!r})") \
            from None
    t0 = time.perf_counter()
    report = check_model(args.model, agents=args.agents, steps=args.steps, seed=args.seed,
                         params=_parse_sets(args.sets) or None, world_sizes=sizes, partitions=args.partitions,
                         resume=args.resume, timeout=args.timeout)
    first, _, rest = report.summary().partition("\n")
    print(f"agentsim check: {first} [{time.perf_counter() - t0:.1f} s]" + (f"\n{rest}" if rest else ""))
    return 0 if report.identical else 1


def _checkpoint_settings(values: dict[str, Any]) -> None:
    """--checkpoint-every/--checkpoint-dir/--keep/--checkpoint-async in ``values``, checked (with the
    flags' names); the directory defaults to ``checkpoints``.
    """
    from agentsim.io.checkpoint import check_keep

    every, directory, keep = values.get("checkpoint_every"), values.get("checkpoint_dir"), values.get("keep")
    asynchronous = values.get("checkpoint_async", False)
    if not isinstance(asynchronous, bool):
        raise ConfigError(f"checkpoint_async: expected true or false (got {asynchronous!r})")
    if asynchronous and every is None:
        raise ConfigError("--checkpoint-async needs --checkpoint-every K (how often to save)")
    if directory is not None and every is None:
        raise ConfigError("--checkpoint-dir needs --checkpoint-every K (how often to save)")
    if keep is not None and every is None:
        raise ConfigError("--keep needs --checkpoint-every K (checkpoints to keep)")
    check_keep(keep, "--keep")
    if every is not None and directory is None:
        values["checkpoint_dir"] = "checkpoints"


def _resume_option(spec: Any) -> tuple[str | None, int]:
    """--resume as ONE checkpoint (the newest complete one in DIR, now), and its step. Every rank
    loads exactly that checkpoint, so one committed later (by a run still writing there) is not used.
    Under torchrun each rank resolves it and rank 0's choice is used by all
    (:func:`agentsim.io.checkpoint.agree_checkpoint`).
    """
    from agentsim.io.checkpoint import checkpoint_step, latest_checkpoint, resolve_checkpoint

    resume, directory = spec.resume, spec.checkpoint_dir
    restarted = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)
    if resume is None and restarted > 0 and directory is not None and latest_checkpoint(directory) is not None:
        resume = directory  # torchrun restarted this worker: go on from the newest checkpoint
    start = 0
    if resume is not None:
        if world_size_from_env() == 1:
            resume = str(resolve_checkpoint(resume))
        start = checkpoint_step(resume)
        if start > spec.steps:
            raise ConfigError(f"--resume: the checkpoint is at step {start}, past --steps {spec.steps} (--steps is "
                              f"the run's total: give at least {start})")
    return resume, start


def cmd_train(args: argparse.Namespace) -> int:
    """``agentsim train``: one process, ``--nprocs`` local processes, or one rank under torchrun."""
    import dataclasses

    from agentsim.core.catalog import get_model
    from agentsim.distributed.process_group import DEFAULT_TIMEOUT, check_timeout
    from agentsim.learn import PPOConfig, Trainer, plot_training, train

    model = get_model(args.model).configure(params=_parse_sets(args.sets))
    changes: dict[str, Any] = {k: getattr(args, k) for k in ("horizon", "precision", "compress", "lr", "epochs",
                                                              "minibatches") if getattr(args, k) is not None}
    if args.hidden:
        try:
            changes["hidden"] = tuple(int(w) for w in args.hidden.split(","))
        except ValueError:
            raise ConfigError(f"--hidden: expected comma-separated widths like 64,64 (got {args.hidden!r})") from None
    config = dataclasses.replace(PPOConfig(), **changes)
    if args.nprocs < 1:
        raise ConfigError(f"--nprocs: expected an int >= 1 (got {args.nprocs})")
    if args.nprocs > 1 and world_size_from_env() > 1:
        raise ConfigError(f"--nprocs {args.nprocs} under torchrun (WORLD_SIZE={world_size_from_env()}): "
                          "let torchrun start the processes and drop --nprocs")
    if args.resume and not args.checkpoint_dir:
        raise ConfigError("--resume needs --checkpoint-dir DIR (where the checkpoints are)")
    timeout = check_timeout(DEFAULT_TIMEOUT if args.timeout is None else args.timeout)
    progress = not args.quiet
    run = {"out": args.out, "checkpoint_dir": args.checkpoint_dir, "checkpoint_every": args.checkpoint_every,
           "keep": args.keep, "resume": args.resume, "progress": progress}
    rank = int(os.environ.get("RANK", "0")) if world_size_from_env() > 1 else 0
    with graceful_stops():
        try:
            if world_size_from_env() > 1:  # under torchrun: this process is one rank
                from agentsim.distributed.process_group import process_group

                with process_group(timeout=timeout, device=args.device) as comm:
                    trainer = Trainer(model, args.policy, args.agents, args.seed, updates=args.updates,
                                      config=config, comm=comm, partition=args.partition, device=args.device)
                    result = trainer.train(**run)
            else:
                result = train(model, args.agents, args.updates, args.seed, world_size=args.nprocs, config=config,
                               policy=args.policy, partition=args.partition, device=args.device, timeout=timeout,
                               **run)
        except RunStopped as e:  # every rank after the same update
            signum = requested() or e.signum  # (the launcher's own signal: its workers got SIGTERM)
            if rank == 0:
                resume = [*sys.argv[1:], *([] if "--resume" in sys.argv else ["--resume"])]
                how = (f"; final checkpoint {e.checkpoint}; resume with: agentsim {' '.join(resume)}"
                       if e.checkpoint else "; no --checkpoint-dir, so it cannot be resumed")
                print(f"agentsim: stopped by {signal_name(signum)} after update {e.step}{how}", file=sys.stderr)
            return exit_status(signum)
    if rank != 0:
        return 0
    if args.plot:
        plot_training(result.history, args.plot, title=f"{model.name}: PPO, {result.world_size} process(es)")
    if not args.quiet:
        from agentsim.learn.trainer import summarize_training

        print(summarize_training(result))
        for path in (args.out, args.plot):
            if path:
                print(f"wrote {path}")
        if result.checkpoints:
            print(f"checkpoint {result.checkpoints[-1]}")
    return 0


def cmd_info(args: argparse.Namespace) -> int:
    """``agentsim info``: see :mod:`agentsim.cli.info`."""
    from agentsim.cli.info import collect, format_info, recommendations

    facts = collect()
    if args.json:
        import json

        print(json.dumps({**facts, "recommendations": recommendations(facts)}, indent=2))
    else:
        print(format_info(facts))
    if args.require_kernels and not facts["kernels"]["active"]:
        print(f"agentsim info: the native CPU kernels are required but {facts['kernels']['state']}: "
              f"{facts['kernels']['detail']}", file=sys.stderr)
        return 1
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    """``agentsim bench --scaling``: see :mod:`agentsim.runner.bench`."""
    from agentsim.runner.bench import format_scaling, scaling

    figures = scaling(args.scaling, agents=args.agents, steps=args.steps, warmup=args.warmup, seed=args.seed,
                      layout=args.layout, world_size=args.nprocs, repeats=args.repeats, out=args.out)
    print(format_scaling(figures))
    if args.out:
        print(f"wrote {args.out}")
    return 0


def world_size_from_env() -> int:
    """``WORLD_SIZE`` of torchrun's environment (1 when unset)."""
    from agentsim.distributed.process_group import world_size_from_env as ws

    return ws()


_SHOWN_ENTRIES = 8  # a vector metric of more entries is summarised on the run's final line


def _fmt(v: object) -> str:
    """A metric's value on the run's final line: a vector of more than a few entries summarised."""
    if isinstance(v, float):
        return f"{v:.6g}"
    size = getattr(v, "size", None)
    if getattr(v, "ndim", 0) == 1 and isinstance(size, int) and size > _SHOWN_ENTRIES:
        import numpy as np

        a = np.asarray(v)
        finite = a[np.isfinite(a)] if a.dtype.kind == "f" else a
        if finite.size == 0:
            return f"[{size} entries, none finite]"
        return (f"[{size} entries: sum {_fmt(finite.sum().item())}, min {_fmt(finite.min().item())}, "
                f"max {_fmt(finite.max().item())}, {int(np.count_nonzero(finite))} nonzero]")
    if getattr(v, "ndim", 0) == 1:
        return "[" + " ".join(_fmt(x.item()) for x in v) + "]"  # type: ignore[attr-defined]
    return str(v)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``agentsim`` command; returns its exit status (see the module docstring)."""
    args = build_parser().parse_args(argv)
    try:
        with terminate_on_sigterm() if args.command not in ("run", "train") else contextlib.nullcontext():
            return _command(args)
    except ConfigError as e:
        print(f"agentsim: error: {e}", file=sys.stderr)
        return 2
    except AgentsimError as e:
        print(f"agentsim: error: {e}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # output piped into e.g. `head`: stop quietly
        sys.stderr.close()
        return 0
    except (MemoryError, RuntimeError) as e:
        if not out_of_memory(e):
            raise
        print(f"agentsim: error: out of memory ({memory_text(str(e))}); use fewer agents, several processes "
              "(--nprocs), or a higher memory limit (ulimit -v, the container's)", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # Ctrl-C outside a run's steps, or a second one: at once
        print(f"agentsim: interrupted (SIGINT); {_interrupted(args)}", file=sys.stderr)
        return exit_status(signal.SIGINT)
    except Terminated:
        print(f"agentsim: stopped by SIGTERM; {_interrupted(args)}", file=sys.stderr)
        return exit_status(signal.SIGTERM)


def _interrupted(args: argparse.Namespace) -> str:
    """What an interrupted command left (one clause)."""
    if args.command in ("run", "train", "sweep"):
        return ("files written so far are kept, not marked completed; resume from the last checkpoint with --resume"
                if args.command != "sweep" else "finished runs are kept in the study file; go on with --resume")
    return "nothing was changed" if args.command in ("inspect", "models", "info", "study", "check") else "stopped"


def _command(args: argparse.Namespace) -> int:
    """Run the command of ``args``."""
    configured_threads()  # a bad AGENTSIM_THREADS stops every command here
    if args.command == "models":
        return cmd_models()
    if args.command == "bench":
        return cmd_bench(args)
    if args.command == "train":
        return cmd_train(args)
    if args.command == "calibrate":
        return cmd_calibrate(args)
    if args.command == "info":
        return cmd_info(args)
    if args.command == "inspect":
        return cmd_inspect(args.path)
    if args.command == "plot":
        from agentsim.plot import plot_pages

        for written in plot_pages(args.file, args.out, args.metrics):
            print(f"wrote {written}")
        return 0
    if args.command == "animate":
        from agentsim.plot import animate_file

        print(f"wrote {animate_file(args.file, args.out, args.fps)}")
        return 0
    if args.command == "sweep":
        return cmd_sweep(args)
    if args.command == "study":
        return cmd_study_status(args.file)
    if args.command == "check":
        return cmd_check(args)
    return cmd_run(args)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
