"""``calibrate``: fit a model to a data series on one process or ``world_size`` local processes
(the same numbers on any number).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from agentsim.calibrate.data import Series
from agentsim.calibrate.fit import FitResult, fit
from agentsim.calibrate.objective import Objective
from agentsim.core.comm import Comm, LocalComm
from agentsim.core.model import Model
from agentsim.errors import ConfigError

__all__ = ["calibrate"]


def calibrate(model: Model | str, data: Series, fit_params: Sequence[str], metric: str, *,
              method: str = "nelder-mead", world_size: int = 1, timeout: float | None = None,
              start: Mapping[str, float] | None = None, bounds: Mapping[str, tuple[float, float]] | None = None,
              iterations: int | None = None, progress: bool = False, **objective: Any) -> FitResult:
    """Fit ``fit_params`` of ``model`` so that its ``metric`` matches ``data``.

    ``metric`` is compared as the trajectory reports it (``RunResult.metrics[metric]``: the sum
    of a ``reduce="sum"`` metric, the mean of a ``reduce="mean"`` one, per replicate with
    ``replicates``), and may be a derived metric (see :mod:`~agentsim.calibrate.objective`).

    ``objective`` holds the :class:`~agentsim.calibrate.objective.Objective` settings (``agents``,
    ``seeds``, ``params``, ``loss``, ``replicates``, ``takeoff``, ``aggregate``, ...). With
    ``world_size`` > 1 every run is split over that many local processes (data partitioner);
    each rank runs the same optimizer on the same exact losses, so the fit is the same.

    Examples:
        >>> from agentsim.calibrate import read_series
        >>> data = read_series("data/boarding_school_flu.csv", "in_bed")  # doctest: +SKIP
        >>> calibrate("flu", data, ["beta", "gamma"], "I", agents=763 * 16, params={"schools": 16},
        ...           replicates="school", takeoff=20, aggregate="each")  # doctest: +SKIP
    """
    from agentsim.core.catalog import get_model
    from agentsim.distributed.process_group import DEFAULT_TIMEOUT
    from agentsim.engine.spec import model_ref
    from agentsim.runner.launch import run_ranks

    if isinstance(model, str):
        model = get_model(model)
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ConfigError(f"world_size: expected an int >= 1 (got {world_size!r})")
    settings = {"data": data, "fit": tuple(fit_params), "metric": metric, **objective}
    options = {"method": method, "start": start, "bounds": bounds, "iterations": iterations, "progress": progress}
    Objective(model, **settings)  # bad settings fail here, before any process starts
    if world_size == 1:
        return _fit_rank(LocalComm(), model, settings, options)
    ref = model_ref(model)
    results = run_ranks(_fit_on_rank, world_size, (ref, settings, options),
                        timeout=DEFAULT_TIMEOUT if timeout is None else timeout)
    out: FitResult = results[0]
    return out


def _fit_rank(comm: Comm, model: Model, settings: dict[str, Any], options: dict[str, Any]) -> FitResult:
    objective = Objective(model, comm=comm, **settings)
    return fit(objective, options["method"], start=options["start"], bounds=options["bounds"],
               iterations=options["iterations"], progress=options["progress"] and comm.rank == 0)


def _fit_on_rank(comm: Comm, ref: Any, settings: dict[str, Any], options: dict[str, Any]) -> FitResult | None:
    from agentsim.engine.spec import resolve_model

    result = _fit_rank(comm, resolve_model(ref), settings, options)
    return result if comm.rank == 0 else None
