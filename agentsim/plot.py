"""Figures of trajectory and study files: ``agentsim plot FILE.h5 [--out FILE.png] [--metrics A,B]``.

:func:`plot_file` picks the figure for what the file holds:

- a study file (:mod:`agentsim.study.store`): per scalar metric (``n_<population>`` included),
  the median and 10-90 % band over the replicates of every parameter combination (vector
  metrics are not drawn);
- a trajectory whose metrics declare how they are drawn (the ``display`` attribute that the
  model's declarations put in the file: ``@model.metric(label=..., color=..., panel=...,
  share_of=..., limits=..., unit=...)``, :class:`~agentsim.core.metrics.Display`): one panel
  per declared ``panel`` (a metric without one: a panel of its own) holding the metrics that
  name it, in the file's order, with their labels and colors; a metric with ``share_of`` is
  drawn divided by the sum of those metrics; the y range is its ``limits`` (``[0, 1]`` for
  shares); a vector metric is a heat map of its own. Metrics without a declaration are left out
  (choose them with ``metrics=``). When agents or environment layers were recorded, a last panel
  shows the space at the last recorded frame: agents with positions (a ``pos`` field ``[n, 2]``,
  arrows for a ``heading`` field), a grid of cells colored by the agents' ``group`` (a
  population with ``cell`` and ``group`` fields), or else the first recorded 2-D environment
  layer;
- any other trajectory (no declarations: older files), or the metrics chosen with
  ``metrics=``: every metric over the steps, a scalar as a curve, a vector metric (``[T, K]``)
  as a heat map over time (x: step, y: entry, or bin with the edges as tick labels for a
  histogram).

A figure of metrics holds :data:`PAGE` panels per page; with more metrics it is drawn on several
pages, ``FILE-1.png``, ``FILE-2.png``, ... instead of ``FILE.png`` (:func:`plot_pages` returns
them all).

:func:`animate_file` (``agentsim animate FILE.h5 --out FILE.gif|mp4``) draws every recorded
frame of the space as the last panel above does: positions, the grid of cells, or the first
2-D environment layer (with the population counts in the title); a GIF needs nothing more
(Pillow comes with matplotlib), an MP4 needs ffmpeg on the PATH.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from typing import Any

import h5py
import numpy as np

from agentsim.core.metrics import Display
from agentsim.errors import ConfigError, OutputError, did_you_mean
from agentsim.io.live import open_to_read

__all__ = ["PAGE", "animate_file", "plot_file", "plot_pages"]

PAGE = 6  # panels per page of a figure of metrics (3 columns)


def plot_file(path: str | os.PathLike[str], out: str | os.PathLike[str] | None = None,
              metrics: str | Sequence[str] | None = None) -> str:
    """Draw the figure for the trajectory or study file ``path`` into ``out`` (default: the file's
    name with ``.png``); returns the path written: ``out``, or, for a figure of more than
    :data:`PAGE` metrics, its first page ``OUT-1.png`` (:func:`plot_pages` returns every page).

    Args:
        path: A trajectory or study file.
        out: The image to write (PNG, or any format matplotlib writes by its suffix).
        metrics: The metrics to draw (a list, or names separated by commas, ``"I,R"``), in this
            order; default: every scalar metric of a study, or the file's own figure of a
            trajectory.

    Raises:
        OutputError: Not a trajectory or study file, or one with nothing to draw yet.
        ConfigError: An unknown metric name (the message lists the valid ones).
    """
    return plot_pages(path, out, metrics)[0]


def plot_pages(path: str | os.PathLike[str], out: str | os.PathLike[str] | None = None,
               metrics: str | Sequence[str] | None = None) -> list[str]:
    """:func:`plot_file`, returning every page written: ``[out]``, or ``OUT-1.png``, ``OUT-2.png``,
    ... when the figure has more than :data:`PAGE` metrics.
    """
    from agentsim.io.figures import pyplot

    plt = pyplot()

    path = os.fspath(path)
    selected = _selection(metrics)
    if not os.path.isfile(path) or not h5py.is_hdf5(path):
        raise OutputError(f"cannot plot '{path}': not an HDF5 file")
    try:
        f = open_to_read(path)
    except OSError as e:  # truncated, locked by a writer, ...: as `agentsim inspect` says it
        from agentsim.io.hdf5 import _why

        raise OutputError(f"cannot plot '{path}': {_why(e)}") from e
    from agentsim.io.hdf5 import attr_value

    with f:
        study = attr_value(f.attrs.get("format")) == "agentsim-study"
    out = os.fspath(out) if out is not None else os.path.splitext(path)[0] + ".png"
    figs = _study_figures(path, plt, selected) if study else _trajectory_figures(path, plt, selected)
    stem, ext = os.path.splitext(out)
    paths = [out] if len(figs) == 1 else [f"{stem}-{i}{ext}" for i in range(1, len(figs) + 1)]
    try:
        for fig, page in zip(figs, paths, strict=True):
            fig.savefig(page, dpi=120)
    finally:
        for fig in figs:
            plt.close(fig)
    return paths


def _selection(metrics: str | Sequence[str] | None) -> list[str] | None:
    """The metric names asked for (None: the default figure)."""
    if metrics is None:
        return None
    names = metrics.split(",") if isinstance(metrics, str) else list(metrics)
    if any(not isinstance(n, str) for n in names):
        raise ConfigError(f"plot metrics: expected metric names (got {metrics!r})")
    chosen = list(dict.fromkeys(n.strip() for n in names if n.strip()))
    if not chosen:
        raise ConfigError(f"plot metrics: expected at least one metric name, e.g. 'I,R' (got {metrics!r})")
    return chosen


def _check_selection(selected: list[str], valid: list[str], path: str, vectors: Sequence[str] = ()) -> None:
    for name in selected:
        if name in vectors:
            raise ConfigError(f"plot: '{name}' is a vector metric; a study figure draws scalar metrics only "
                              f"(valid: {', '.join(valid)})")
        if name not in valid:
            raise ConfigError(f"plot: unknown metric '{name}' in '{path}' (valid: {', '.join(valid) or 'none'})."
                              + did_you_mean(name, valid))


def _pages(names: list[str]) -> list[list[str]]:
    return [names[i:i + PAGE] for i in range(0, len(names), PAGE)]


def _grid(plt: Any, n: int, width: float, height: float) -> tuple[Any, list[Any]]:
    """A figure of ``n`` panels in rows of up to 3 (the unused ones hidden), and the panels."""
    cols = min(3, n)
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(width * cols, height * rows), squeeze=False)
    flat = list(axes.ravel())
    for ax in flat[n:]:
        ax.set_axis_off()
    return fig, flat[:n]


def _page_title(title: str, page: int, pages: int) -> str:
    return title if pages == 1 else f"{title} (page {page} of {pages})"


def _paged(plt: Any, metrics: list[str], width: float, height: float, title: str,
           draw: Callable[[Any, Any, str], None], first: Callable[[Any], None] | None = None) -> list[Any]:
    """One figure per page of :data:`PAGE` metrics: ``draw(fig, ax, metric)`` fills each panel,
    ``first(ax)`` finishes a page's first panel (a legend); the pages are titled ``title``.
    """
    pages = _pages(metrics)
    figs = []
    for number, page in enumerate(pages, 1):
        fig, axes = _grid(plt, len(page), width, height)
        figs.append(fig)
        for ax, metric in zip(axes, page, strict=True):
            draw(fig, ax, metric)
        if first is not None:
            first(axes[0])
        fig.suptitle(_page_title(title, number, len(pages)))
        fig.tight_layout()
    return figs


def _study_figures(path: str, plt: Any, selected: list[str] | None) -> list[Any]:
    from agentsim.study import read_study

    data = read_study(path)
    if not data.bands:
        raise OutputError(f"cannot plot '{path}': the study has no finished runs with bands yet")
    first = next(iter(data.bands.values()))
    names = [m for m in first if m not in ("params", "runs", "step")]
    scalars = [m for m in names if np.ndim(first[m]) == 2]  # [Q, T]; a vector metric's bands are [Q, T, K]
    valid = [m for m in scalars if not m.startswith("n_")] + [m for m in scalars if m.startswith("n_")]
    if selected is not None:
        _check_selection(selected, valid, path, vectors=[m for m in names if m not in scalars])
    metrics = selected or valid
    if not metrics:
        raise OutputError(f"cannot plot '{path}': the study has no scalar metrics")
    colors = plt.cm.viridis(np.linspace(0.1, 0.85, len(data.bands)))
    q = [float(x) for x in data.quantiles]
    title = (f"{data.spec['model']} study: median and {q[0]:.0%}-{q[-1]:.0%} band over replicates "
             f"({len(data.runs)} runs, {data.spec['agents']:,} agents each)")

    def draw(fig: Any, ax: Any, metric: str) -> None:
        for band, color in zip(data.bands.values(), colors, strict=True):
            steps = band["step"][len(q) // 2]
            low, mid, high = band[metric][0], band[metric][len(q) // 2], band[metric][-1]
            label = ", ".join(f"{k} = {v:g}" if isinstance(v, float) else f"{k} = {v}"
                              for k, v in band["params"].items()) or "all runs"
            ax.fill_between(steps, low, high, color=color, alpha=0.22, linewidth=0)
            ax.plot(steps, mid, color=color, label=f"{label} ({band['runs']} runs)")
        ax.set_xlabel("step")
        ax.set_ylabel(f"{metric} (per run)")
        ax.set_title(metric)

    return _paged(plt, metrics, 5.2, 4.0, title, draw, first=lambda ax: ax.legend(frameon=False, fontsize=8))


def _trajectory_figures(path: str, plt: Any, selected: list[str] | None) -> list[Any]:
    from agentsim.io.hdf5 import read_trajectory

    traj = read_trajectory(path)
    names = [k for k in traj.metrics if k != "step"]
    if selected is not None:
        _check_selection(selected, names, path)
    else:
        figs = _declared_figures(traj, plt, path)
        if figs:
            return figs
    metrics = selected or names
    if not metrics:
        raise OutputError(f"cannot plot '{path}': the trajectory has no metrics")
    m = traj.metrics
    steps = m.get("step", np.arange(len(m[metrics[0]])))

    def draw(fig: Any, ax: Any, key: str) -> None:
        if np.ndim(m[key]) == 2:
            _heatmap(fig, ax, steps, m[key], traj.edges.get(key), key)
        else:
            ax.plot(steps, m[key])
            ax.set_xlabel("step")
            ax.set_title(key)

    return _paged(plt, metrics, 4.6, 3.8, _title(traj), draw)


def _title(traj: Any) -> str:
    done = "" if traj.attrs.get("completed") else " (incomplete run)"
    return f"{traj.attrs.get('model', '?')}, seed {traj.attrs.get('seed')}{done}"


def _heatmap(fig: Any, ax: Any, steps: np.ndarray, series: np.ndarray, edges: np.ndarray | None, name: str) -> None:
    """A vector metric ``[T, K]`` over time: x the step, y the entry (or the bin, with its edges as
    tick labels), the color the value (NaN blank).
    """
    data = np.asarray(series, dtype=np.float64)
    t, k = data.shape
    x = np.asarray(steps, dtype=np.float64) if len(steps) == t else np.arange(t, dtype=np.float64)
    if t > 1:
        mid = (x[1:] + x[:-1]) / 2
        xb = np.concatenate([[x[0] - (mid[0] - x[0])], mid, [x[-1] + (x[-1] - mid[-1])]])
    else:
        xb = np.asarray([x[0] - 0.5, x[0] + 0.5]) if t else np.asarray([0.0, 1.0])
    mesh = ax.pcolormesh(xb, np.arange(k + 1), np.ma.masked_invalid(data.T), shading="flat", cmap="viridis")
    fig.colorbar(mesh, ax=ax)
    stride = max(1, math.ceil((k + 1) / 10))
    if edges is not None and len(edges) == k + 1:
        ticks = list(range(0, k + 1, stride))
        ax.set_yticks(ticks)
        ax.set_yticklabels([f"{float(edges[i]):g}" for i in ticks])
        ax.set_ylabel("bin edges")
    else:
        ticks = list(range(0, k, stride))
        ax.set_yticks([i + 0.5 for i in ticks])
        ax.set_yticklabels([str(i) for i in ticks])
        ax.set_ylabel("entry")
    ax.set_xlabel("step")
    ax.set_title(name)


def _declared_display(traj: Any, path: str) -> dict[str, Display]:
    """The file's metric declarations (of metrics it holds), checked."""
    out: dict[str, Display] = {}
    for name, entries in traj.display.items():
        if name not in traj.metrics:
            continue
        try:
            out[name] = Display.from_dict(f"metric '{name}'", entries)
        except ConfigError as e:
            raise OutputError(f"cannot plot '{path}': the display attribute of /metrics/{name}: {e}") from None
    return out


def _panels(display: dict[str, Display], metrics: dict[str, np.ndarray]) -> list[tuple[str, list[str]]]:
    """The panels, each a title and its metrics, in the order of ``display`` (the file's): the metrics that declare the
    same ``panel`` share it; any other declared metric, and every vector metric (a heat map), has a
    panel of its own titled its label.
    """
    panels: list[tuple[str, list[str]]] = []
    shared: dict[str, list[str]] = {}
    for name, d in display.items():
        if d.panel and np.ndim(metrics[name]) == 1:
            if d.panel not in shared:
                shared[d.panel] = []
                panels.append((d.panel, shared[d.panel]))
            shared[d.panel].append(name)
        else:
            panels.append((d.label or name, [name]))
    return panels


def _declared_figures(traj: Any, plt: Any, path: str) -> list[Any]:
    """The figure of the metrics the file declares (see the module docstring), [] without any."""
    display = _declared_display(traj, path)
    if not display:
        return []
    m = traj.metrics
    steps = m.get("step", np.arange(len(next(iter(m.values()), []))))
    panels = _panels(display, m)
    space = _space_drawing(traj)
    count = len(panels) + (space is not None)
    pages = [list(range(i, min(i + PAGE, count))) for i in range(0, count, PAGE)]
    figs = []
    for number, page in enumerate(pages, 1):
        fig, axes = _grid(plt, len(page), 5.4, 4.2)
        figs.append(fig)
        for ax, index in zip(axes, page, strict=True):
            if index < len(panels):
                title, names = panels[index]
                _declared_panel(fig, ax, steps, m, traj.edges, display, title, names, path)
            else:
                assert space is not None
                space(ax)
        fig.suptitle(_page_title(_title(traj), number, len(pages)))
        fig.tight_layout()
    return figs


def _declared_panel(fig: Any, ax: Any, steps: np.ndarray, m: dict[str, np.ndarray], edges: dict[str, np.ndarray],
                    display: dict[str, Display], title: str, names: list[str], path: str) -> None:
    """One panel of declared metrics: curves (shares divided by their denominators), labels,
    colors, y label and limits as declared; a vector metric as a heat map.
    """
    first = display[names[0]]
    if np.ndim(m[names[0]]) == 2:
        _heatmap(fig, ax, steps, m[names[0]], edges.get(names[0]), title)
        if first.unit:
            ax.set_ylabel(first.unit)
        return
    for name in names:
        d = display[name]
        values = np.asarray(m[name], dtype=np.float64)
        if d.share_of:
            missing = [k for k in d.share_of if k not in m]
            if missing:
                raise OutputError(f"cannot plot '{path}': metric '{name}' is drawn as a share of "
                                  f"{' + '.join(d.share_of)}, but the file has no metric {missing[0]!r}")
            total = sum(np.asarray(m[k], dtype=np.float64) for k in d.share_of)
            with np.errstate(divide="ignore", invalid="ignore"):
                values = np.where(total != 0, values / total, np.nan)
        ax.plot(steps[:len(values)], values, color=d.color, label=d.label or name)
    declared = [display[n] for n in names]
    units = list(dict.fromkeys(d.unit for d in declared if d.unit))
    if units:
        ax.set_ylabel(", ".join(units))
    elif all(d.share_of for d in declared):
        ax.set_ylabel("share of " + " / ".join(dict.fromkeys(" + ".join(d.share_of) for d in declared)))
    elif len(names) == 1:
        ax.set_ylabel(first.label or names[0])
    limits = next((d.limits for d in declared if d.limits), None)
    if limits is None and all(d.share_of for d in declared):
        limits = (0.0, 1.0)
    if limits is not None:
        ax.set_ylim(*limits)
    ax.set_xlabel("step")
    ax.set_title(title)
    if len(names) > 1:
        ax.legend(frameon=False)


# ----------------------------------------------------------------------------- the space
def _last_frame(traj: Any, population: str) -> tuple[int, dict[str, np.ndarray]] | None:
    if population not in traj.populations or not len(traj.steps(population)):
        return None
    step = int(traj.steps(population)[-1])
    return step, traj.agents(population, step=step)


def _positioned(traj: Any) -> str | None:
    """The first recorded population with positions (a ``pos`` field, 2 per agent), or None."""
    for pop in traj.populations:
        if "pos" in traj.fields(pop) and len(traj.steps(pop)):
            return str(pop)
    return None


def _grouped_cells(traj: Any) -> str | None:
    """The first recorded population on grid cells with a group (``cell`` and ``group`` fields), or None."""
    for pop in traj.populations:
        if {"cell", "group"} <= set(traj.fields(pop)) and len(traj.steps(pop)):
            return str(pop)
    return None


def _grid_layer(traj: Any) -> str | None:
    """The first recorded environment layer that is a grid (2-D, or a square number of cells), or None."""
    if not len(traj.env_steps()):
        return None
    for name in traj.env_names:
        shape = np.shape(traj.env(name, step=int(traj.env_steps()[0])))
        if len(shape) == 2 or (len(shape) == 1 and shape[0] > 0 and math.isqrt(shape[0]) ** 2 == shape[0]):
            return str(name)
    return None


def _grid_shape(traj: Any, population: str, steps: Sequence[int]) -> tuple[int, int]:
    """``(height, width)`` of the grid of ``population``'s cells: the recorded space's (files from
    0.3 on), else a 2-D environment layer's, else the smallest square that holds every cell of the
    frames ``steps``.
    """
    space = traj.attrs.get("space")
    if isinstance(space, dict) and space.get("kind") == "grid" and len(space.get("shape", ())) == 2:
        return int(space["shape"][0]), int(space["shape"][1])
    layer = _grid_layer(traj)
    if layer is not None:
        height, width = np.shape(_layer_image(traj, layer, int(traj.env_steps()[0])))
        return int(height), int(width)
    top = max((int(traj.agents(population, "cell", step=int(s))["cell"].max(initial=0)) for s in steps), default=0)
    side = max(2, math.isqrt(top) + 1)
    return side, side


def _cells_image(agents: dict[str, np.ndarray], shape: tuple[int, int]) -> np.ndarray:
    """``[height, width]``: each cell's group, NaN where empty (cells in row-major order)."""
    image = np.full(shape[0] * shape[1], np.nan)
    image[agents["cell"].astype(np.int64)] = agents["group"]
    return image.reshape(shape)


def _layer_image(traj: Any, name: str, step: int) -> np.ndarray:
    """Environment layer ``name`` at ``step`` as a 2-D image (a 1-D layer of a square number of cells: square)."""
    layer = np.asarray(traj.env(name, step=step), dtype=float)
    if layer.ndim == 1:
        side = math.isqrt(layer.size)
        layer = layer[: side * side].reshape(side, side)
    return layer


def _layer_style(traj: Any, name: str) -> dict[str, Any]:
    """The settings of ``imshow``: a bool layer green on white (0 and 1), any other viridis."""
    first = np.asarray(traj.env(name, step=int(traj.env_steps()[0])))
    return {"cmap": "Greens", "vmin": 0, "vmax": 1} if first.dtype == np.bool_ else {"cmap": "viridis"}


def _space_drawing(traj: Any) -> Callable[[Any], None] | None:
    """A function that draws the last recorded frame of the space into a panel, or None when the
    file recorded nothing spatial (see the module docstring).
    """
    pop = _positioned(traj)
    if pop is not None:
        return lambda ax: _positions_panel(traj, ax, str(pop))
    pop = _grouped_cells(traj)
    if pop is not None:
        return lambda ax: _cells_panel(traj, ax, str(pop))
    layer = _grid_layer(traj)
    if layer is not None:
        return lambda ax: _layer_panel(traj, ax, str(layer))
    return None


def _positions_panel(traj: Any, ax: Any, population: str) -> None:
    frame = _last_frame(traj, population)
    assert frame is not None
    step, agents = frame
    pos = agents["pos"]
    show = np.arange(len(pos)) if len(pos) <= 3000 else np.linspace(0, len(pos) - 1, 3000).astype(int)
    heading = agents.get("heading")
    if heading is not None and np.ndim(heading) == 2:
        h = heading[show]
        ax.quiver(pos[show, 0], pos[show, 1], h[:, 0], h[:, 1], angles="xy", scale=40, width=0.003,
                  color="tab:purple")
        what = "positions and headings"
    else:
        ax.scatter(pos[show, 0], pos[show, 1], s=2, color="tab:purple")
        what = "positions"
    ax.set_aspect("equal")
    ax.set_xlabel("x (length units)")
    ax.set_ylabel("y (length units)")
    shown = f"{len(show):,} of {len(pos):,}" if len(show) < len(pos) else f"{len(pos):,}"
    ax.set_title(f"{what} at step {step} ({shown} {population})")


def _cells_panel(traj: Any, ax: Any, population: str) -> None:
    frame = _last_frame(traj, population)
    assert frame is not None
    step, agents = frame
    from matplotlib.colors import ListedColormap

    ax.imshow(_cells_image(agents, _grid_shape(traj, population, [step])),
              cmap=ListedColormap(["tab:blue", "tab:orange"]), interpolation="nearest")
    ax.set_title(f"{population} at step {step}: group 0 blue, 1 orange, empty white")
    ax.set_xticks([])
    ax.set_yticks([])


def _layer_panel(traj: Any, ax: Any, name: str) -> None:
    step = int(traj.env_steps()[-1])
    style = _layer_style(traj, name)
    image = ax.imshow(_layer_image(traj, name, step), interpolation="nearest", **style)
    if style["cmap"] == "Greens":
        ax.set_title(f"{name} at step {step} (green: true)")
    else:
        ax.figure.colorbar(image, ax=ax)
        ax.set_title(f"{name} at step {step}")
    ax.set_xticks([])
    ax.set_yticks([])


def _counts(traj: Any, step: int) -> str:
    """The population counts ``n_<population>`` at ``step``, as text."""
    m = traj.metrics
    rows = np.flatnonzero(np.asarray(m.get("step", [])) == step)
    if not len(rows):
        return ""
    return ", ".join(f"{name[2:]} {int(m[name][rows[0]])}" for name in m
                     if name.startswith("n_") and np.ndim(m[name]) == 1 and rows[0] < len(m[name]))


def animate_file(path: str | os.PathLike[str], out: str | os.PathLike[str], fps: int = 8) -> str:
    """Animate the recorded frames of the trajectory ``path`` into ``out`` (``.gif`` or ``.mp4``)."""
    from agentsim.io.figures import pyplot

    plt = pyplot()
    from matplotlib.animation import FFMpegWriter, FuncAnimation, PillowWriter

    from agentsim.io.hdf5 import read_trajectory

    path, out = os.fspath(path), os.fspath(out)
    suffix = os.path.splitext(out)[1].lower()
    if suffix not in (".gif", ".mp4"):
        raise OutputError(f"animate: expected an output ending in .gif or .mp4 (got '{out}')")
    if suffix == ".mp4" and not FFMpegWriter.isAvailable():
        raise OutputError("animate: an .mp4 needs ffmpeg on the PATH; write a .gif instead")
    traj = read_trajectory(path)
    model = traj.attrs.get("model", "?")
    fig, ax = plt.subplots(figsize=(5.5, 5.5))
    positioned, grouped, layer = _positioned(traj), _grouped_cells(traj), _grid_layer(traj)
    if positioned is not None:
        pop = positioned
        steps = traj.steps(pop)
        first = traj.agents(pop, "pos", step=int(steps[0]))["pos"]
        dots = ax.scatter(first[:, 0], first[:, 1], s=3, color="tab:purple")
        allpos = np.concatenate([traj.agents(pop, "pos", step=int(s))["pos"] for s in steps])
        ax.set_xlim(allpos[:, 0].min(), allpos[:, 0].max())
        ax.set_ylim(allpos[:, 1].min(), allpos[:, 1].max())
        ax.set_aspect("equal")
        ax.set_xlabel("x (length units)")
        ax.set_ylabel("y (length units)")

        def draw(k: int) -> Any:
            dots.set_offsets(traj.agents(pop, "pos", step=int(steps[k]))["pos"])
            ax.set_title(f"{model}: {pop} positions, step {int(steps[k])}")
            return (dots,)
    elif grouped is not None:
        pop = grouped
        steps = traj.steps(pop)
        shape = _grid_shape(traj, pop, [int(s) for s in steps])
        from matplotlib.colors import ListedColormap

        def grid(k: int) -> np.ndarray:
            return _cells_image(traj.agents(pop, ["cell", "group"], step=int(steps[k])), shape)
        img = ax.imshow(grid(0), cmap=ListedColormap(["tab:blue", "tab:orange"]), interpolation="nearest")
        ax.set_xticks([])
        ax.set_yticks([])

        def draw(k: int) -> Any:
            img.set_data(grid(k))
            ax.set_title(f"{model}, step {int(steps[k])}: group 0 blue, 1 orange, empty white")
            return (img,)
    elif layer is not None:
        steps = traj.env_steps()
        name = layer

        def image(k: int) -> np.ndarray:
            return _layer_image(traj, name, int(steps[k]))
        img = ax.imshow(image(0), interpolation="nearest", **_layer_style(traj, name))
        ax.set_xticks([])
        ax.set_yticks([])

        def draw(k: int) -> Any:
            img.set_data(image(k))
            counts = _counts(traj, int(steps[k]))
            ax.set_title(f"{model}, step {int(steps[k])}: {name}{'; ' + counts if counts else ''}")
            return (img,)
    else:
        plt.close(fig)
        raise OutputError(f"animate: '{path}' holds no spatial frames (positions, a grid or a 2-D environment "
                          "layer); use agentsim plot")
    if len(steps) < 2:
        plt.close(fig)
        raise OutputError(f"animate: '{path}' has {len(steps)} recorded frame(s); record more with --every K")
    anim = FuncAnimation(fig, draw, frames=len(steps), blit=False)
    anim.save(out, writer=PillowWriter(fps=fps) if suffix == ".gif" else FFMpegWriter(fps=fps), dpi=90)
    plt.close(fig)
    return out
