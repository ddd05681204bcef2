"""Run a model in one call: :func:`run` (one process, or ``nprocs`` local processes)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from agentsim.core.model import Model
from agentsim.engine.simulation import RunResult
from agentsim.engine.spec import RunOptions, RunSpec, make_simulation, run_simulation
from agentsim.errors import ConfigError

if TYPE_CHECKING:
    from typing_extensions import Unpack  # typing.Unpack from Python 3.11

__all__ = ["run"]

# The positional parameters of run after the model, in the order of earlier releases.
_POSITIONAL = ("agents", "steps", "seed")


def run(model: Model | str | RunSpec, *args: Any, **options: Unpack[RunOptions]) -> RunResult:
    """Run ``model`` for ``steps`` steps and return its :class:`~agentsim.engine.simulation.RunResult`.

    ``run(spec)`` runs a :class:`~agentsim.engine.spec.RunSpec`; ``run(model, agents, steps, seed,
    **options)`` builds one from the other fields of :class:`~agentsim.engine.spec.RunSpec` (the
    same result, bit for bit):

    Args:
        model: A :class:`~agentsim.engine.spec.RunSpec` (then no other argument), a
            :class:`~agentsim.core.model.Model` or a model name (``"sir"``, ``"package.module:ATTR"``).
        agents: Agents at step 0 (default: the model's).
        steps, seed: Length of the run (default 100) and its seed (default 0).
        options: ``params`` (overrides, checked: a misspelt name is an error), ``out`` (an HDF5
            trajectory file, see :mod:`agentsim.io.hdf5`), ``record`` and ``every`` (what to record
            and how often, see :meth:`Simulation.run <agentsim.Simulation.run>`), ``device``
            (``"cpu"`` or ``"cuda"``), ``nprocs`` (local processes; > 1: :func:`agentsim.launch`,
            the result is bitwise the same), ``partition`` (with ``nprocs > 1``: ``"data"``, the
            default, or ``"spatial"``) and its options (``layout``, ``balance_every``,
            ``balance_threshold``, ``bins``, ``overlap``), ``progress`` (a progress bar: one process,
            on a terminal), ``check`` (the check mode, :mod:`agentsim.engine.contract`: every substep
            call checked against the contract that makes results the same on any number of
            processes; several times slower; an int K checks every K-th step), and the checkpoint and resume options of
            :class:`~agentsim.engine.spec.RunSpec`.

    Raises:
        ConfigError: A bad or unknown option (with the closest valid name).

    Examples:
        >>> result = run("randomwalk", agents=100, steps=3, seed=1, params={"step_size": 0.5})
        >>> result.metrics["step"].tolist(), result.world_size
        ([0, 1, 2, 3], 1)
        >>> spec = RunSpec("randomwalk", agents=100, steps=3, seed=1, params={"step_size": 0.5})
        >>> bool((run(spec).metrics["msd"] == result.metrics["msd"]).all())
        True
    """
    if len(args) > len(_POSITIONAL):
        raise ConfigError(f"run: expected at most {1 + len(_POSITIONAL)} positional arguments (model, "
                          f"{', '.join(_POSITIONAL)}); got {1 + len(args)}")
    given: dict[str, Any] = dict(options)
    for name, value in zip(_POSITIONAL, args, strict=False):
        if name in given:
            raise ConfigError(f"run: {name} given twice (as a positional and a keyword argument)")
        given[name] = value
    spec = RunSpec.make(model, **given)
    if spec.nprocs > 1:
        from agentsim.runner.launch import launch

        return launch(spec)
    if spec.partition is not None or spec.partition_options():
        raise ConfigError("partition and its options need nprocs > 1 (one process keeps every agent)")
    return run_simulation(spec, make_simulation(spec))
