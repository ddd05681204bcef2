"""Trajectory files as pandas and xarray objects: :func:`read_metrics` and :func:`read_frames`.

Both read a file written by a run (the ``agentsim-trajectory`` format of :mod:`agentsim.io.hdf5`)
through :func:`~agentsim.io.hdf5.read_trajectory`, so a file that did not complete is read up to
its last readable row, as there. pandas and xarray are imported only when these functions are
called; they come with ``pip install "agentsim[analysis]"``.
"""

from __future__ import annotations

import itertools
import json
import os
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from agentsim.errors import ConfigError, OutputError, did_you_mean
from agentsim.io.checksums import CHECKSUMS
from agentsim.io.hdf5 import CHECKSUMS_SINCE, Trajectory, check_frames, read_trajectory
from agentsim.io.live import open_to_read

if TYPE_CHECKING:
    import pandas  # optional (the analysis extra): mypy ignores a missing pandas or xarray (pyproject.toml)
    import xarray

__all__ = ["read_frames", "read_metrics"]

_INSTALL = 'pip install "agentsim[analysis]"'


def _require(module: str, function: str) -> Any:
    """Import ``module`` (pandas or xarray), or raise an ImportError that says how to install it."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise ImportError(
            f"agentsim.io.{function} needs {module}, which is not installed: {_INSTALL} "
            f"(or pip install {module})"
        ) from e


def _file_attrs(traj: Trajectory) -> dict[str, Any]:
    """The root attributes of ``traj`` as plain Python values: ``params``, ``versions`` and
    ``space`` as the JSON strings of the file, ``completed`` as 0 or 1 (netCDF has no bool).
    """
    out: dict[str, Any] = {}
    for key, value in traj.attrs.items():
        if isinstance(value, (dict, list)):
            value = json.dumps(value, sort_keys=True)
        elif isinstance(value, (bool, np.bool_)):
            value = int(value)
        elif isinstance(value, np.generic):
            value = value.item()
        out[key] = value
    return out


def read_metrics(path: str | os.PathLike[str]) -> pandas.DataFrame:
    """The metrics of a trajectory file as a pandas DataFrame, one row per recorded step.

    The index is ``step`` (int64, the run's steps from 0). A scalar metric is one column with
    the dtype of its dataset (int64 for counts such as ``n_<population>``, float64 otherwise). A
    vector metric ``[T, K]`` (a histogram included) becomes K flat columns ``name[0]`` ...
    ``name[K-1]``, so every column is a plain series (``df["I"]``, ``df["wealth_hist[3]"]``)
    and ``df.filter(like="wealth_hist[")`` selects one metric's columns. A metric written
    as a nested name (``infected/young``) keeps that name.

    ``df.attrs`` holds what the rows do not:

    - ``"vector_columns"``: vector metric name to the list of its column names;
    - ``"edges"``: histogram metric name to its bin edges, a list of K + 1 floats (``-inf`` /
      ``inf`` for open-ended bins; bin k is ``[edges[k], edges[k + 1])``, the last closed);
    - ``"display"``: metric name to how the model declared it is drawn (a dict);
    - the file's root attributes: ``model``, ``seed``, ``steps``, ``steps_completed``,
      ``world_size``, ``completed`` (bool), ``params`` and ``versions`` (dicts), ...

    Args:
        path: A trajectory file written by a run (``agentsim run ... --out FILE.h5``).

    Returns:
        A DataFrame ``[T rows, columns]``.

    Raises:
        ImportError: pandas is not installed (``pip install "agentsim[analysis]"``).
        OutputError: The file is missing, not a trajectory or damaged.

    Examples:
        >>> import agentsim as asim, tempfile, os
        >>> out = os.path.join(tempfile.mkdtemp(), "sir.h5")
        >>> _ = asim.run("sir", agents=1000, steps=5, seed=1, out=out)
        >>> df = read_metrics(out)
        >>> df.index.name, list(df.columns), len(df)
        ('step', ['I', 'R', 'S', 'n_person'], 6)
    """
    pd = _require("pandas", "read_metrics")
    traj = read_trajectory(path)
    metrics = dict(traj.metrics)
    steps = metrics.pop("step", np.zeros(0, dtype=np.int64))
    columns: dict[str, np.ndarray] = {}
    vector_columns: dict[str, list[str]] = {}
    for name, values in metrics.items():
        if values.ndim == 1:
            columns[name] = values
            continue
        names = [f"{name}[{k}]" for k in range(values.shape[1])]
        vector_columns[name] = names
        for k, column in enumerate(names):
            columns[column] = values[:, k]
    index = pd.Index(np.asarray(steps, dtype=np.int64), name="step")
    df = pd.DataFrame(columns, index=index)
    df.attrs.update(traj.attrs)
    df.attrs["vector_columns"] = vector_columns
    df.attrs["edges"] = {name: [float(e) for e in edges] for name, edges in traj.edges.items()}
    df.attrs["display"] = dict(traj.display)
    return cast("pandas.DataFrame", df)


def _promoted(xr: Any, dtype: np.dtype) -> tuple[np.dtype, Any]:
    """The dtype and fill value xarray gives ``dtype`` when a reindex adds missing entries."""
    probe = xr.DataArray(np.zeros(1, dtype=dtype), dims="x", coords={"x": [0]}).reindex(x=[0, 1])
    return probe.dtype, probe.values[1]


def read_frames(path: str | os.PathLike[str], population: str | None = None) -> xarray.Dataset:
    """The recorded frames of one population as an xarray Dataset.

    A run records agent frames at step 0, every ``every`` steps and at the last step (see
    ``agentsim run --every``); births and deaths change which agents a frame holds, so the
    frames are laid on a common grid:

    - coordinates ``step`` (int64 ``[S]``, the recorded steps) and ``uid`` (int64 ``[U]``,
      the sorted union of the uids of every frame);
    - ``present``: bool ``(step, uid)``, True where that agent exists at that frame;
    - one variable per recorded field (``uid`` itself is the coordinate), dims ``(step, uid)``
      for a scalar field and ``(step, uid, <field>_dim_1, ...)`` for a field of shape
      ``[n, D, ...]`` (e.g. ``pos`` of a 2-D box: ``(step, uid, pos_dim_1)`` of size 2). Where
      an agent is absent the value is missing, as xarray fills a reindex: float fields keep
      their dtype with NaN; integer and bool fields become float64 with NaN (their values are
      exact in float64 up to 2**53; select ``present`` rows and ``astype`` back if needed);
    - environment layers recorded on frames, one variable ``env_<name>`` each, with dims
      ``(env_step, env_<name>_dim_0, ...)`` (e.g. a grid layer ``[H, W]``), and the coordinate
      ``env_step`` (the steps of the env frames); absent when the run recorded no layer;
    - ``attrs``: the file's root attributes (``model``, ``seed``, ``steps``,
      ``steps_completed``, ``world_size``, ``format``, ``format_version``), ``params``,
      ``versions`` and ``space`` as the JSON strings of the file, ``completed`` as 0 or 1
      (so that ``to_netcdf`` can write them), and ``population``.

    The arrays are held in memory: ``S x U`` entries per field (a population that turns over
    fast has many more uids than agents at any one step).

    Args:
        path: A trajectory file written by a run.
        population: The population to read; None for the file's only population.

    Returns:
        The Dataset described above.

    Raises:
        ImportError: xarray (or pandas) is not installed (``pip install "agentsim[analysis]"``).
        ConfigError: ``population`` is None and the file holds several populations (or none),
            or names a population the file does not hold; the message lists the valid names.
        OutputError: The file is missing, not a trajectory or damaged.

    Examples:
        >>> import agentsim as asim, tempfile, os
        >>> out = os.path.join(tempfile.mkdtemp(), "walk.h5")
        >>> _ = asim.run("randomwalk", agents=50, steps=4, seed=1, out=out, every=2)
        >>> ds = read_frames(out)
        >>> dict(ds["pos"].sizes)
        {'step': 3, 'uid': 50, 'pos_dim_1': 2}
    """
    xr = _require("xarray", "read_frames")
    traj = read_trajectory(path)
    pops = traj.populations
    if population is None:
        if len(pops) != 1:
            raise ConfigError(
                f"read_frames('{traj.path}'): the file holds {len(pops)} populations "
                f"({', '.join(pops) or 'none'}); name one with population=..."
            )
        population = pops[0]
    elif population not in pops:
        raise ConfigError(
            f"read_frames('{traj.path}'): unknown population '{population}' (valid: {', '.join(pops) or 'none'})."
            + did_you_mean(population, pops)
        )
    steps = traj.steps(population)
    fields = [f for f in traj.fields(population) if f != "uid"]
    n_frames = len(steps)
    env_steps = traj.env_steps()
    try:
        with open_to_read(traj.path) as f:
            g = f["agents"][population]
            offsets = np.asarray(g["offsets"][: n_frames + 1], dtype=np.int64)
            rows = int(offsets[-1]) if n_frames else 0
            uid_rows = np.asarray(g["uid"][:rows], dtype=np.int64)
            values = {name: np.asarray(g[name][:rows]) for name in fields}
            env = {name: np.asarray(f["env"][name][: len(env_steps)]) for name in traj.env_names}
            checked = traj.attrs.get("format_version", 1) >= CHECKSUMS_SINCE
            checks = g[CHECKSUMS][:n_frames] if checked else None
            env_checks = f["env"][CHECKSUMS][: len(env_steps)] if checked and env else None
    except (KeyError, OSError) as e:
        raise OutputError(f"'{traj.path}' is damaged: cannot read the frames of '{population}' ({e})") from e
    if checks is not None:  # every frame against its checksums
        columns = {"uid": uid_rows, **values}
        check_frames(steps, checks, list(columns), ({n: v[lo:hi] for n, v in columns.items()}
                                                    for lo, hi in itertools.pairwise(offsets)),
                     f"'{traj.path}' is damaged: agents '{population}'")
    if env_checks is not None:
        check_frames(env_steps, env_checks, list(env),
                     ({n: v[k] for n, v in env.items()} for k in range(len(env_steps))),
                     f"'{traj.path}' is damaged: env")

    uids = np.unique(uid_rows)
    frame_of_row = np.repeat(np.arange(n_frames), np.diff(offsets))
    column_of_row = np.searchsorted(uids, uid_rows)
    present = np.zeros((n_frames, len(uids)), dtype=bool)
    present[frame_of_row, column_of_row] = True

    data_vars: dict[str, Any] = {"present": (("step", "uid"), present)}
    for name, rows_of_field in values.items():
        dtype, fill = _promoted(xr, rows_of_field.dtype)
        grid = np.full((n_frames, len(uids), *rows_of_field.shape[1:]), fill, dtype=dtype)
        grid[frame_of_row, column_of_row] = rows_of_field
        extra = tuple(f"{name}_dim_{k}" for k in range(1, rows_of_field.ndim))
        data_vars[name] = (("step", "uid", *extra), grid)
    for name, layer in env.items():
        dims = ("env_step", *(f"env_{name}_dim_{k}" for k in range(layer.ndim - 1)))
        data_vars[f"env_{name}"] = (dims, layer)
    coords: dict[str, Any] = {"step": np.asarray(steps, dtype=np.int64), "uid": uids}
    if env:
        coords["env_step"] = np.asarray(env_steps, dtype=np.int64)
    attrs = _file_attrs(traj)
    attrs["population"] = population
    return cast("xarray.Dataset", xr.Dataset(data_vars, coords=coords, attrs=attrs))
