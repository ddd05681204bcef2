"""Figures of trajectory and study files: ``agentsim plot FILE.h5 [--out FILE.png] [--metrics A,B]``.

:func:`plot_file` picks the figure for what the file holds:

- a study file (:mod:`agentsim.study.store`): per scalar metric (``n_<population>`` included),
  the median and 10-90 % band over the replicates of every parameter combination (vector
  metrics are not drawn);
- an epidemic (metrics ``S``, ``I``, ``R``): the compartments as fractions of the population;
- predator-prey (``n_sheep``, ``n_wolf``): the population sizes, the grass, and the last grass layer;
- boids (``polarization``): polarization over time and the last recorded positions and headings;
- Schelling (``segregation``): segregation and happy share over time, and the last grid;
- anything else, or the metrics chosen with ``metrics=``: every metric over the steps, a scalar
  as a curve, a vector metric (``[T, K]``) as a heat map over time (x: step, y: entry, or bin
  with the edges as tick labels for a histogram).

A figure of metrics holds :data:`PAGE` panels per page; with more metrics it is drawn on several
pages, ``FILE-1.png``, ``FILE-2.png``, ... instead of ``FILE.png`` (:func:`plot_pages` returns
them all).

:func:`animate_file` (``agentsim animate FILE.h5 --out FILE.gif|mp4``) draws every recorded
frame of a spatial model: boids or walkers (positions), Schelling (the grid), wolf-sheep (the
grass layer, with the animal counts in the title); a GIF needs nothing more (Pillow comes with matplotlib), an MP4
needs ffmpeg on the PATH.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from typing import Any

import h5py
import numpy as np

from agentsim.errors import ConfigError, OutputError, did_you_mean

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
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = os.fspath(path)
    selected = _selection(metrics)
    if not os.path.isfile(path) or not h5py.is_hdf5(path):
        raise OutputError(f"cannot plot '{path}': not an HDF5 file")
    try:
        f = h5py.File(path, "r")
    except OSError as e:  # truncated, locked by a writer, ...: as `agentsim inspect` says it
        from agentsim.io.hdf5 import _why

        raise OutputError(f"cannot plot '{path}': {_why(e)}") from e
    with f:
        study = f.attrs.get("format") == "agentsim-study"
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
        fig = _model_figure(traj, plt)
        if fig is not None:
            return [fig]
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


def _model_figure(traj: Any, plt: Any) -> Any:
    """The figure of a known model's trajectory (see the module docstring), or None."""
    m = traj.metrics
    steps = m.get("step", np.arange(len(next(iter(m.values()), []))))
    params = traj.attrs.get("params", {}) if isinstance(traj.attrs.get("params"), dict) else {}
    title = _title(traj)
    if {"S", "I", "R"} <= set(m):
        fig, ax = plt.subplots(figsize=(7, 4.2))
        n = m["S"] + m["I"] + m["R"]
        for key, color, name in (("S", "tab:blue", "susceptible"), ("I", "tab:red", "infectious"),
                                 ("R", "tab:green", "recovered")):
            ax.plot(steps, m[key] / n, color=color, label=name)
        ax.set_xlabel("day")
        ax.set_ylabel("fraction of the population")
        ax.set_ylim(0, 1)
        ax.legend(frameon=False)
        ax.set_title(f"{title}: {int(n[0]):,} people")
    elif {"n_sheep", "n_wolf"} <= set(m):
        fig, (ax, ax2) = plt.subplots(1, 2, figsize=(11, 4.2), gridspec_kw={"width_ratios": [3, 2]})
        ax.plot(steps, m["n_sheep"], color="tab:olive", label="sheep")
        ax.plot(steps, m["n_wolf"], color="tab:gray", label="wolves")
        if "grass" in m:
            ax.plot(steps, m["grass"] / 4, color="tab:green", alpha=0.6, label="grown grass cells / 4")
        ax.set_xlabel("step")
        ax.set_ylabel("count")
        ax.legend(frameon=False)
        ax.set_title(title)
        _grass_panel(traj, ax2, plt)
    elif "polarization" in m:
        fig, (ax, ax2) = plt.subplots(1, 2, figsize=(11, 4.6))
        ax.plot(steps, m["polarization"], color="tab:purple")
        ax.set_ylim(0, 1.02)
        ax.set_xlabel("step")
        ax.set_ylabel("polarization |mean heading| (1: all aligned)")
        ax.set_title(title)
        _boids_panel(traj, ax2)
    elif "segregation" in m:
        fig, (ax, ax2) = plt.subplots(1, 2, figsize=(11, 4.6))
        n = m.get("n_resident", np.ones_like(m["segregation"]))
        ax.plot(steps, m["segregation"], color="tab:brown", label="segregation (mean similar-neighbor share)")
        if "happy" in m:
            ax.plot(steps, m["happy"] / n, color="tab:cyan", label="happy residents (share)")
        ax.set_ylim(0, 1.02)
        ax.set_xlabel("step")
        ax.set_ylabel("share")
        ax.legend(frameon=False, loc="lower right")
        ax.set_title(title)
        _schelling_panel(traj, ax2, params, int(n[0]))
    else:
        return None
    fig.tight_layout()
    return fig


def _last_frame(traj: Any, population: str) -> tuple[int, dict[str, np.ndarray]] | None:
    if population not in traj.populations or not len(traj.steps(population)):
        return None
    step = int(traj.steps(population)[-1])
    return step, traj.agents(population, step=step)


def _boids_panel(traj: Any, ax: Any) -> None:
    frame = _last_frame(traj, "boid")
    if frame is None or "pos" not in frame[1]:
        ax.set_axis_off()
        ax.set_title("(no recorded positions)")
        return
    step, agents = frame
    pos = agents["pos"]
    show = np.arange(len(pos)) if len(pos) <= 3000 else np.linspace(0, len(pos) - 1, 3000).astype(int)
    if "heading" in agents:
        h = agents["heading"][show]
        ax.quiver(pos[show, 0], pos[show, 1], h[:, 0], h[:, 1], angles="xy", scale=40, width=0.003,
                  color="tab:purple")
    else:
        ax.scatter(pos[show, 0], pos[show, 1], s=2)
    ax.set_aspect("equal")
    ax.set_xlabel("x (length units)")
    ax.set_ylabel("y (length units)")
    shown = f"{len(show):,} of {len(pos):,}" if len(show) < len(pos) else f"{len(pos):,}"
    ax.set_title(f"positions and headings at step {step} ({shown} boids)")


def _schelling_side(params: dict[str, Any], n0: int) -> int:
    """The grid side of a Schelling run of ``n0`` residents (as models/schelling.py sets it)."""
    return max(2, math.ceil(math.sqrt(n0 / float(params.get("density", 0.8)))))


def _schelling_image(agents: dict[str, np.ndarray], side: int) -> np.ndarray:
    """``[side, side]``: each cell's group, NaN where empty."""
    image = np.full(side * side, np.nan)
    image[agents["cell"].astype(np.int64)] = agents["group"]
    return image.reshape(side, side)


def _grass_image(traj: Any, step: int) -> np.ndarray:
    """The grass layer at ``step`` as a square image (1: grown)."""
    grass = np.asarray(traj.env("grass", step=step), dtype=float)
    if grass.ndim == 1:
        side = math.isqrt(grass.size)
        grass = grass[: side * side].reshape(side, side)
    return grass


def _schelling_panel(traj: Any, ax: Any, params: dict[str, Any], n0: int) -> None:
    frame = _last_frame(traj, "resident")
    if frame is None or not {"cell", "group"} <= set(frame[1]):
        ax.set_axis_off()
        ax.set_title("(no recorded residents)")
        return
    step, agents = frame
    from matplotlib.colors import ListedColormap

    ax.imshow(_schelling_image(agents, _schelling_side(params, n0)),
              cmap=ListedColormap(["tab:blue", "tab:orange"]), interpolation="nearest")
    ax.set_title(f"grid at step {step}: group 0 blue, group 1 orange, empty white")
    ax.set_xticks([])
    ax.set_yticks([])


def _grass_panel(traj: Any, ax: Any, plt: Any) -> None:
    if "grass" not in traj.env_names or not len(traj.env_steps()):
        ax.set_axis_off()
        ax.set_title("(no recorded grass layer)")
        return
    step = int(traj.env_steps()[-1])
    ax.imshow(_grass_image(traj, step), cmap="Greens", vmin=0, vmax=1, interpolation="nearest")
    ax.set_title(f"grass at step {step} (green: grown)")
    ax.set_xticks([])
    ax.set_yticks([])


def animate_file(path: str | os.PathLike[str], out: str | os.PathLike[str], fps: int = 8) -> str:
    """Animate the recorded frames of the trajectory ``path`` into ``out`` (``.gif`` or ``.mp4``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.animation import FFMpegWriter, FuncAnimation, PillowWriter

    from agentsim.io.hdf5 import read_trajectory

    path, out = os.fspath(path), os.fspath(out)
    suffix = os.path.splitext(out)[1].lower()
    if suffix not in (".gif", ".mp4"):
        raise OutputError(f"animate: expected an output ending in .gif or .mp4 (got '{out}')")
    if suffix == ".mp4" and not FFMpegWriter.isAvailable():
        raise OutputError("animate: an .mp4 needs ffmpeg on the PATH; write a .gif instead")
    traj = read_trajectory(path)
    params = traj.attrs.get("params", {}) if isinstance(traj.attrs.get("params"), dict) else {}
    model = traj.attrs.get("model", "?")
    fig, ax = plt.subplots(figsize=(5.5, 5.5))
    pops = [p for p in ("boid", "walker") if p in traj.populations and "pos" in traj.fields(p)]
    if pops:
        pop = pops[0]
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
    elif "resident" in traj.populations:
        steps = traj.steps("resident")
        n0 = int(traj.metrics.get("n_resident", [len(traj.agents("resident", "cell", step=int(steps[0]))["uid"])])[0])
        side = _schelling_side(params, n0)
        from matplotlib.colors import ListedColormap

        def grid(k: int) -> np.ndarray:
            return _schelling_image(traj.agents("resident", ["cell", "group"], step=int(steps[k])), side)
        img = ax.imshow(grid(0), cmap=ListedColormap(["tab:blue", "tab:orange"]), interpolation="nearest")
        ax.set_xticks([])
        ax.set_yticks([])

        def draw(k: int) -> Any:
            img.set_data(grid(k))
            ax.set_title(f"{model}, step {int(steps[k])}: group 0 blue, 1 orange, empty white")
            return (img,)
    elif "grass" in traj.env_names:
        steps = traj.env_steps()

        def layer(k: int) -> np.ndarray:
            return _grass_image(traj, int(steps[k]))
        img = ax.imshow(layer(0), cmap="Greens", vmin=0, vmax=1, interpolation="nearest")
        ax.set_xticks([])
        ax.set_yticks([])

        def draw(k: int) -> Any:
            img.set_data(layer(k))
            counts = ", ".join(f"{p} {int(traj.metrics[f'n_{p}'][int(steps[k])])}" for p in ("sheep", "wolf")
                               if f"n_{p}" in traj.metrics and int(steps[k]) < len(traj.metrics[f"n_{p}"]))
            ax.set_title(f"{model}, step {int(steps[k])}: grass (green: grown); {counts}")
            return (img,)
    else:
        plt.close(fig)
        raise OutputError(f"animate: '{path}' holds no spatial frames (positions, a grid or a grass layer); "
                          "use agentsim plot")
    if len(steps) < 2:
        plt.close(fig)
        raise OutputError(f"animate: '{path}' has {len(steps)} recorded frame(s); record more with --every K")
    anim = FuncAnimation(fig, draw, frames=len(steps), blit=False)
    anim.save(out, writer=PillowWriter(fps=fps) if suffix == ".gif" else FFMpegWriter(fps=fps), dpi=90)
    plt.close(fig)
    return out
