"""Figures of trajectory and study files: ``agentsim plot FILE.h5 [--out FILE.png]``.

:func:`plot_file` picks the figure for what the file holds:

- a study file (:mod:`agentsim.study.store`): per metric, the median and 10-90 % band over the
  replicates of every parameter combination;
- an epidemic (metrics ``S``, ``I``, ``R``): the compartments as fractions of the population;
- predator-prey (``n_sheep``, ``n_wolf``): the population sizes, the grass, and the last grass layer;
- boids (``polarization``): polarization over time and the last recorded positions and headings;
- Schelling (``segregation``): segregation and happy share over time, and the last grid;
- anything else: every metric over the steps.

:func:`animate_file` (``agentsim animate FILE.h5 --out FILE.gif|mp4``) draws every recorded
frame of a spatial model: boids or walkers (positions), Schelling (the grid), wolf-sheep (the
grass layer, with the animal counts in the title); a GIF needs nothing more (Pillow comes with matplotlib), an MP4
needs ffmpeg on the PATH.
"""

from __future__ import annotations

import math
import os
from typing import Any

import h5py
import numpy as np

from .errors import OutputError

__all__ = ["animate_file", "plot_file"]


def plot_file(path: str | os.PathLike[str], out: str | os.PathLike[str] | None = None) -> str:
    """Draw the figure for the trajectory or study file ``path`` into ``out`` (default: the file's
    name with ``.png``); returns the path written.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = os.fspath(path)
    if not os.path.isfile(path) or not h5py.is_hdf5(path):
        raise OutputError(f"cannot plot '{path}': not an HDF5 file")
    with h5py.File(path, "r") as f:
        study = f.attrs.get("format") == "agentsim-study"
    out = os.fspath(out) if out is not None else os.path.splitext(path)[0] + ".png"
    fig = _study_figure(path, plt) if study else _trajectory_figure(path, plt)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def _study_figure(path: str, plt: Any) -> Any:
    from .study import read_study

    data = read_study(path)
    if not data.bands:
        raise OutputError(f"cannot plot '{path}': the study has no finished runs with bands yet")
    first = next(iter(data.bands.values()))
    metrics = [m for m in first if m not in ("params", "runs", "step") and not m.startswith("n_")][:4] or \
        [m for m in first if m not in ("params", "runs", "step")][:4]
    fig, axes = plt.subplots(1, len(metrics), figsize=(5.2 * len(metrics), 4), squeeze=False)
    colors = plt.cm.viridis(np.linspace(0.1, 0.85, len(data.bands)))
    q = [float(x) for x in data.quantiles]
    for ax, metric in zip(axes[0], metrics, strict=True):
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
    axes[0][0].legend(frameon=False, fontsize=8)
    fig.suptitle(f"{data.spec['model']} study: median and {q[0]:.0%}-{q[-1]:.0%} band over replicates "
                 f"({len(data.runs)} runs, {data.spec['agents']:,} agents each)")
    fig.tight_layout()
    return fig


def _trajectory_figure(path: str, plt: Any) -> Any:
    from .io.hdf5 import read_trajectory

    traj = read_trajectory(path)
    m = traj.metrics
    steps = m.get("step", np.arange(len(next(iter(m.values()), []))))
    model = traj.attrs.get("model", "?")
    params = traj.attrs.get("params", {}) if isinstance(traj.attrs.get("params"), dict) else {}
    done = "" if traj.attrs.get("completed") else " (incomplete run)"
    title = f"{model}, seed {traj.attrs.get('seed')}{done}"
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
        keys = [k for k in m if k != "step"][:6]
        fig, axes = plt.subplots(1, len(keys), figsize=(4.2 * len(keys), 3.8), squeeze=False)
        for ax, key in zip(axes[0], keys, strict=True):
            ax.plot(steps, m[key])
            ax.set_xlabel("step")
            ax.set_title(key)
        fig.suptitle(title)
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

    from .io.hdf5 import read_trajectory

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
