"""Render the recorded benchmark results as Markdown tables and PNG plots.

    python benchmarks/report.py                                  # -> docs/_generated/
    python benchmarks/report.py --results DIR --out FILE.md --images DIR

Reads every ``*.json`` under ``benchmarks/results/`` (subfolders included), groups the files into
suites by name and content, and writes one Markdown file with a section per suite (a table of
what each file recorded, its machine, date and commit, and one plot) plus the plots as PNG files.
Nothing is measured here and nothing is filled in: a field a file does not record is rendered as
"not recorded", and a file that no suite reads is listed at the end with the reason. The
documentation's benchmarks page includes the Markdown (``docs/_ext/benchmarks_page.py`` calls
:func:`write` when the build starts); this module needs matplotlib, not Sphinx.

Suites (by file name; a file whose name matches but lacks the fields its suite reads is listed as
not rendered, with the missing fields):

- ``peers-<suite>*.json`` (``bench_peers.py``): one section per suite, the table the script wrote;
- ``roofline.json`` (``bench_roofline.py``);
- ``models*.json`` (``bench_models.py``) and ``neighbors*.json`` (``bench_neighbors.py``);
- ``scaling*.json`` (``bench_scaling.py``): strong scaling, grouped by model and agents;
- ``ab*.json`` (``bench_ab.py``): new / old ratios per work item;
- ``busy-threads*.json`` (``bench_busy.py``): threads on an idle and on a busy machine;
- ``fixed-cost*.json`` (``bench_fixed_cost.py``): the engine's cost per step of small models;
- ``abm-comparison*.json`` (``bench_abm_comparison.py``): the ABM framework comparison's workloads beside Mesa;
- ``plain-models*.json`` (``bench_plain.py``): three plain user models beside their NumPy versions;
- ``parent_kills.json``, ``writer_kills.json``, ``untrusted_files.json``,
  ``stress_write_failures.json`` (the ``stress_*.py`` scripts).

The output is deterministic: files are read in sorted order, numbers formatted with fixed
precision, and the PNG files carry no time stamp or software version.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
NOT_RECORDED = "not recorded"

#: Work items of ``bench_ab.py`` (its docstring): what each measures.
AB_ITEMS = {
    "sir_seconds": "SIR main job (`agentsim run sir --steps 100`), simulation seconds",
    "sir_init_seconds": "the same run's initialization seconds",
    "boids_w1_ms_per_step": "boids on one process, ms per step",
    "boids_w2_ms_per_step": "boids on 2 ranks, spatial partition, ms per step",
    "randomwalk_ms_per_step": "random walk on one process, ms per step",
    "schelling_ms_per_step": "Schelling on one process, ms per step",
    "circles_ms_per_step": "circles on one process, ms per step",
}

#: Titles of the ``bench_peers.py`` suites.
PEER_TITLES = {
    "sir": "SIR against Starsim",
    "boids": "Boids against Mesa",
    "targets": "Random walk against AgentTorch, and Schelling",
    "memory": "SIR at 100M agents: memory and initialization",
    "sizes": "Agent-updates per second by population size",
    "circles": "Circles (FLAME GPU 2's benchmark)",
}
PEER_ORDER = ["sir", "boids", "targets", "memory", "sizes", "circles"]

STRESS = {
    "parent_kills.json": "Launcher kills (`stress_parent_kills.py`)",
    "writer_kills.json": "Writer kills (`stress_writer_kills.py`)",
    "stress_write_failures.json": "Injected write failures (`stress_write_failures.py`)",
    "untrusted_files.json": "Corrupted and malicious checkpoints (`stress_untrusted_files.py`)",
    "stress_study_full_disk.json": "Studies on a real full disk (`stress_study_full_disk.py`)",
    "stress_trajectory_flips.json": "Flipped bits in trajectories (`stress_trajectory_flips.py`)",
}

#: Fields each suite reads from a file; a file lacking one is listed as not rendered.
REQUIRED = {
    "peers": ["suite", "runs", "table"],
    "ab": ["rounds", "per_round", "median", "median_ratio_new_over_old"],
    "scaling": ["model", "agents", "world_size", "runs", "speedup"],
    "roofline": ["bandwidth", "rows"],
    "models": ["meta", "results"],
    "neighbors": ["median_ms_per_step", "per_round_ms_per_step"],
    "parent_kills.json": ["trials", "rows"],
    "writer_kills.json": ["trials", "rows"],
    "stress_write_failures.json": ["counts", "rows"],
    "untrusted_files.json": ["trials", "outcomes", "by_corruption"],
    "stress_long_runs": ["long_run"],
    "stress_study_full_disk.json": ["counts", "rows"],
    "stress_trajectory_flips.json": ["meta", "counts", "by_place"],
    "gpu": ["device"],
    "covid": ["agents", "days", "rounds", "summary"],
    "covid-scale": ["rows"],
    "covid-ranks": ["rows"],
    "partition": ["rows"],
    "busy-threads": ["usable_cores", "busy_processes", "rounds", "workloads", "seconds", "summary"],
    "fixed-cost": ["rounds", "work", "units", "per_round", "median"],
    "abm-comparison": ["versions", "rounds", "runs_per_round", "workloads", "per_round", "summary"],
    "plain-models": ["rounds", "summary"],
}


@dataclass
class Section:
    """One suite: a heading, Markdown lines and at most one figure."""

    key: str
    title: str
    files: list[str]
    lines: list[str]
    plot: Callable[[Any], None] | None = None
    plot_size: tuple[float, float] = (7.0, 3.6)
    alt: str = ""


@dataclass
class Report:
    """What :func:`render` found: the sections, the files not rendered, the other files."""

    sections: list[Section] = field(default_factory=list)
    not_rendered: list[tuple[str, str]] = field(default_factory=list)
    other_files: list[str] = field(default_factory=list)

    @property
    def suites(self) -> list[str]:
        """The keys of the rendered sections, in page order."""
        return [s.key for s in self.sections]


# --------------------------------------------------------------------------------------------
# formatting and provenance


def _cell(value: Any) -> str:
    text = str(value).replace("|", "\\|").replace("\n", " ")
    return text if text.strip() else " "


def table(header: list[str], rows: list[list[Any]]) -> list[str]:
    """A Markdown (GFM) table."""
    out = ["| " + " | ".join(_cell(h) for h in header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    out += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return [*out, ""]


def num(x: float | None, digits: int = 3) -> str:
    """``x`` with ``digits`` significant digits (no exponent below 1e6), or "-" for None."""
    if x is None:
        return "-"
    if x != 0 and (abs(x) >= 1e6 or abs(x) < 1e-3):
        return f"{x:.{digits - 1}e}"
    return f"{x:#.{digits}g}".rstrip(".") if abs(x) < 10 ** digits else f"{x:,.0f}"


def _short(commit: str) -> str:
    commit = str(commit)
    return commit[:7] if len(commit) >= 7 and all(c in "0123456789abcdef" for c in commit.lower()) else commit


def _meta(d: dict[str, Any]) -> dict[str, Any]:
    meta = d.get("meta")
    return {**d, **meta} if isinstance(meta, dict) else d


def _device_names(d: dict[str, Any]) -> list[str]:
    names: set[str] = set()
    runs = d.get("runs")
    if isinstance(runs, dict):
        for rounds in runs.values():
            for r in rounds if isinstance(rounds, list) else []:
                if isinstance(r, dict) and r.get("device_name") not in (None, "cpu"):
                    names.add(str(r["device_name"]))
    return sorted(names)


def machine(d: dict[str, Any]) -> str:
    """The machine as the file records it (its own fields joined), or "not recorded"."""
    m = _meta(d)
    parts = []
    if m.get("machine"):
        parts.append(str(m["machine"]))
    elif m.get("cpu_count"):
        parts.append(f"{m['cpu_count']} CPUs")
    names = [str(m["device_name"])] if m.get("device_name") not in (None, "cpu") else _device_names(d)
    parts += names
    if m.get("device") and not names:
        parts.append(f"device {m['device']}")
    if m.get("torch"):
        parts.append(f"torch {m['torch']}")
    if m.get("python"):
        parts.append(f"Python {m['python']}")
    threads = m.get("torch_threads", m.get("threads", m.get("threads_per_rank")))
    if isinstance(threads, int):
        parts.append(f"{threads} torch thread{'s' if threads != 1 else ''}" + (" per rank" if "threads_per_rank" in m
                                                                              else ""))
    return ", ".join(parts) if parts else NOT_RECORDED


def date(d: dict[str, Any]) -> str:
    """The date the file records, or "not recorded"."""
    m = _meta(d)
    if m.get("date"):
        return str(m["date"])
    if m.get("time"):
        return str(m["time"])[:10]
    return NOT_RECORDED


def commit(d: dict[str, Any]) -> str:
    """The commit the file records (old -> new for an A/B), or "not recorded"."""
    m = _meta(d)
    commits = m.get("commits")
    if isinstance(commits, dict) and commits.get("old") and commits.get("new"):
        return f"{_short(commits['old'])} -> {_short(commits['new'])}"
    for key in ("commit", "git_commit"):
        if m.get(key):
            return _short(m[key])
    return NOT_RECORDED


def provenance(files: list[tuple[str, dict[str, Any]]]) -> list[str]:
    """The table of each file's machine, date and commit."""
    return table(["file", "machine", "date", "commit"],
                 [[f"`{rel}`", machine(d), date(d), commit(d)] for rel, d in files])


# --------------------------------------------------------------------------------------------
# plots (matplotlib's object API with the Agg canvas: no pyplot state, no display)


def _bars(ax: Any, bars: list[tuple[str, list[float]]], unit: str, log: bool | None = None) -> None:
    """Horizontal bars at the median of each entry's values, with every value as a dot."""
    labels = [b[0] for b in bars]
    medians = [statistics.median(b[1]) for b in bars]
    y = list(range(len(bars)))[::-1]
    ax.barh(y, medians, color="#4c78a8", height=0.6)
    for yi, (_, values) in zip(y, bars, strict=True):
        ax.plot(values, [yi] * len(values), "o", color="black", markersize=3)
    ax.set_yticks(y, labels, fontsize=8)
    if log is None:
        positive = [v for v in medians if v > 0]
        log = bool(positive) and max(positive) / min(positive) > 30
    if log:
        ax.set_xscale("log")
        ax.get_xaxis().set_minor_formatter("")
    ax.set_xlabel(unit)
    ax.grid(axis="x", alpha=0.3)


def _save(section: Section, out: io.BytesIO) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=section.plot_size, dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    assert section.plot is not None
    section.plot(ax)
    fig.tight_layout()
    fig.savefig(out, format="png", metadata={"Software": None})


# --------------------------------------------------------------------------------------------
# suites


def _median(values: list[float]) -> float:
    return statistics.median(values)


def _peer_side_values(runs: list[Any], suite: str) -> list[float]:
    key = "run_seconds" if suite == "sir" else "seconds_per_step"
    return [float(r[key]) for r in runs if isinstance(r, dict) and r.get(key) is not None]


def peers_section(suite: str, files: list[tuple[str, dict[str, Any]]]) -> Section:
    """A ``bench_peers.py`` suite: each file's table, and the medians of its rounds side by side."""
    lines = provenance(files)
    for rel, d in files:
        rows = d["table"]
        width = max((len(r) for r in rows), default=0)
        if width == 3:
            header = ["model, agents", "agent-updates/s (ms per step)", "peak RSS (whole process)"]
        elif width == 5:
            header = ["work", "peer", "agentsim", "ratio", "target"]
        else:
            header = [f"column {i + 1}" for i in range(width)]
        lines += [f"`{rel}` (rounds: {d.get('rounds', NOT_RECORDED)}; agentsim's device: "
                  f"{d.get('device', NOT_RECORDED)}):", ""]
        lines += table(header, [[*r, *[""] * (width - len(r))] for r in rows])
    section = Section(f"peers-{suite}", PEER_TITLES.get(suite, f"bench_peers.py suite `{suite}`"),
                      [rel for rel, _ in files], lines)

    if suite == "sizes":
        def plot(ax: Any) -> None:
            from matplotlib.lines import Line2D

            styles = ["-o", "--s", ":^", "-.v"]
            names = sorted({key.rsplit("_", 1)[0] for _, d in files for key in d["runs"]})
            for i, (_, d) in enumerate(files):
                models: dict[str, list[tuple[int, float]]] = {}
                for key, rounds in sorted(d["runs"].items()):
                    good = [r for r in rounds if isinstance(r, dict) and r.get("seconds_per_step")]
                    if good:
                        agents = int(good[0]["agents"])
                        rate = agents / _median([float(r["seconds_per_step"]) for r in good])
                        models.setdefault(key.rsplit("_", 1)[0], []).append((agents, rate))
                for model, points in sorted(models.items()):
                    points.sort()
                    ax.plot([p[0] for p in points], [p[1] for p in points], styles[i % len(styles)],
                            color=f"C{names.index(model)}", markersize=4)
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_xlabel("agents")
            ax.set_ylabel("agent-updates/s")
            ax.grid(alpha=0.3)
            handles = [Line2D([], [], color=f"C{j}", label=m) for j, m in enumerate(names)]
            handles += [Line2D([], [], color="black", linestyle=styles[i % len(styles)][:-1],
                               marker=styles[i % len(styles)][-1], markersize=4, label=rel)
                        for i, (rel, _) in enumerate(files)]
            ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
        section.plot, section.plot_size = plot, (8.5, 4.2)
        section.alt = "agent-updates per second against the number of agents, per model and file"
        return section

    if suite == "memory":
        def plot(ax: Any) -> None:
            bars = []
            for rel, d in files:
                bare = [float(b) for b in d["runs"].get("bare", []) if isinstance(b, (int, float))]
                for r in d["runs"].get("sir", []):
                    agents = float(r["agents"])
                    bars.append((f"peak RSS, whole process ({rel})", [r["peak_rss_bytes"] / agents]))
                    if bare:
                        bars.append((f"peak RSS above a bare process ({rel})",
                                     [(r["peak_rss_bytes"] - _median(bare)) / agents]))
                    if r.get("peak_gpu_bytes"):
                        bars.append((f"GPU allocator peak ({rel})", [r["peak_gpu_bytes"] / agents]))
            _bars(ax, bars, "bytes per agent", log=False)
        section.plot, section.plot_size = plot, (8.0, 3.0)
        section.alt = "bytes per agent at 100M agents, per file"
        return section

    def plot(ax: Any) -> None:
        bars = []
        for rel, d in files:
            for side, rounds in d["runs"].items():
                values = _peer_side_values(rounds, suite)
                if values:
                    bars.append((f"{side} ({rel})", [v if suite == "sir" else v * 1000 for v in values]))
        _bars(ax, bars, "seconds per run (100 days)" if suite == "sir" else "ms per step")
    section.plot = plot
    section.plot_size = (8.0, 1.0 + 0.45 * sum(len(d["runs"]) for _, d in files))
    section.alt = "median seconds of each side, one bar per side and file, dots for each round"
    return section


def partition_section(files: list[tuple[str, dict[str, Any]]]) -> Section:
    """``bench_partition.py``: the localities split over processes by rcb and by METIS."""
    lines = provenance(files)
    for rel, d in files:
        lines += [f"`{rel}`:", ""]
        lines += table(["people", "processes", "method", "contacts cut", "work contacts cut", "imbalance", "seconds"],
                       [[f"{int(r['agents']):,}", r["world_size"], r["method"],
                         f"{100 * r['contacts_cut']['all']:.2f}%", f"{100 * r['contacts_cut']['work']:.2f}%",
                         num(r["imbalance"]), num(r["seconds"])] for r in d["rows"]])

    def plot(ax: Any) -> None:
        bars = [(f"W={r['world_size']} {r['method']}", [100 * r["contacts_cut"]["all"]]) for _, d in files
                for r in d["rows"]]
        _bars(ax, bars, "contacts cut (%)")
    n = sum(len(d["rows"]) for _, d in files)
    return Section("partition", "Localities over processes: rcb and METIS (`bench_partition.py`)",
                   [rel for rel, _ in files], lines, plot, (7.0, 1.0 + 0.3 * n),
                   "share of contacts between people on two processes, by partition method")

def roofline_section(files: list[tuple[str, dict[str, Any]]]) -> Section:
    """``bench_roofline.py``: each model's step against its bytes at the measured bandwidth."""
    lines = provenance(files)
    for rel, d in files:
        bw = d["bandwidth"]
        parts = []
        for name, label in (("default_threads", f"{bw.get('threads', NOT_RECORDED)} threads"),
                            ("one_thread", "one thread")):
            if isinstance(bw.get(name), dict):
                parts.append(f"{label}: " + ", ".join(f"{k} {v / 1e9:.1f} GB/s" for k, v in sorted(bw[name].items())))
        lines += [f"`{rel}`: streaming bandwidth measured with torch, " + "; ".join(parts) + ".", ""]
        lines += table(["model", "agents", "B/agent/step (lower bound)", "bound per step", "measured per step",
                        "fraction of bound"],
                       [[r["model"], f"{r['agents']:,}", num(r["bytes_per_agent"], 2),
                         f"{r['bound_seconds'] * 1000:.1f} ms", f"{r['seconds_per_step'] * 1000:.1f} ms",
                         f"{r['fraction_of_bound'] * 100:.1f}%"] for r in d["rows"]])

    def plot(ax: Any) -> None:
        labels, measured, bound = [], [], []
        for rel, d in files:
            for r in d["rows"]:
                labels.append(f"{r['model']} {r['agents']:,}" + (f" ({rel})" if len(files) > 1 else ""))
                measured.append(r["seconds_per_step"] * 1000)
                bound.append(r["bound_seconds"] * 1000)
        x = list(range(len(labels)))
        ax.bar([i - 0.2 for i in x], measured, 0.4, label="measured per step", color="#4c78a8")
        ax.bar([i + 0.2 for i in x], bound, 0.4, label="bandwidth bound per step", color="#f58518")
        ax.set_xticks(x, labels, fontsize=8)
        ax.set_yscale("log")
        ax.set_ylabel("ms per step")
        ax.legend(fontsize=8)
        ax.grid(axis="y", alpha=0.3)
    return Section("roofline", "Roofline: steps against memory bandwidth (`bench_roofline.py`)",
                   [rel for rel, _ in files], lines, plot,
                   alt="measured ms per step and the bandwidth bound per model, log scale")


def models_section(files: list[tuple[str, dict[str, Any]]]) -> Section:
    """``bench_models.py``: steps/s and agent-updates/s per model and size."""
    lines = provenance(files)
    for rel, d in files:
        m = d["meta"]
        lines += [f"`{rel}` (device {m.get('device', NOT_RECORDED)}; median of each row's repeats):", ""]
        lines += table(["model", "agents", "ms per step", "steps/s", "agent-updates/s", "x randomwalk",
                        "substeps (ms)", "init"],
                       [[r["model"], f"{r['agents']:,}", f"{r['median_step_s'] * 1000:.2f}", num(r["steps_per_s"]),
                         num(r["agent_updates_per_s"]), num(r.get("cost_vs_randomwalk"), 2),
                         ", ".join(f"{k} {v:.2f}" for k, v in r.get("substep_ms", {}).items()) or "-",
                         f"{r['init_s']:.3f} s" if "init_s" in r else "-"] for r in d["results"]])

    def plot(ax: Any) -> None:
        bars = []
        for rel, d in files:
            for r in d["results"]:
                values = [float(r["agents"]) / s for s in r.get("all_step_s", [r["median_step_s"]])]
                bars.append((f"{r['model']} {r['agents']:,}" + (f" ({rel})" if len(files) > 1 else ""), values))
        _bars(ax, bars, "agent-updates/s (median of repeats; dots: each repeat)", log=True)
    rows = sum(len(d["results"]) for _, d in files)
    return Section("models", "Models, one process (`bench_models.py`)", [rel for rel, _ in files], lines, plot,
                   (7.0, 1.0 + 0.4 * rows), alt="agent-updates per second per model and size")


def neighbors_section(files: list[tuple[str, dict[str, Any]]]) -> Section:
    """``bench_neighbors.py``: a boids on ``neighbor_reduce`` against the reference and hand-tuned ones."""
    lines = provenance(files)
    for rel, d in files:
        med = d["median_ms_per_step"]
        lines += [f"`{rel}` (rounds: {d.get('rounds', NOT_RECORDED)}; timed steps per run: "
                  f"{d.get('steps', NOT_RECORDED)}; torch threads: {d.get('torch_threads', NOT_RECORDED)}): ms per "
                  "step, medians of the rounds, and medians of the per-round ratios:", ""]
        rows = []
        for agents in sorted(med, key=int):
            diff = d.get("max_abs_heading_diff_vs_model", {}).get(agents, {})
            rows.append([f"{int(agents):,}", *(num(med[agents].get(v)) for v in ("user", "model", "handtuned")),
                         num(d.get("median_ratio_user_over_model", {}).get(agents)),
                         num(d.get("median_ratio_model_over_handtuned", {}).get(agents)),
                         num(diff.get("user")) if diff else NOT_RECORDED])
        lines += table(["agents", "user", "model", "handtuned", "user / model", "model / handtuned",
                        "max heading difference, user vs model"], rows)

    def plot(ax: Any) -> None:
        bars = []
        for rel, d in files:
            for agents in sorted(d["per_round_ms_per_step"], key=int):
                base = _median(d["per_round_ms_per_step"][agents]["model"])
                for variant, values in d["per_round_ms_per_step"][agents].items():
                    bars.append((f"{variant}, {int(agents):,} agents" + (f" ({rel})" if len(files) > 1 else ""),
                                 [v / base for v in values]))
        _bars(ax, bars, "ms per step / median of model at the same size (dots: each round)", log=False)
        ax.axvline(1.0, color="grey", linewidth=0.8)
    rows = sum(len(v) for _, d in files for v in d["per_round_ms_per_step"].values())
    return Section("neighbors", "`neighbor_reduce` against hand-written plumbing (`bench_neighbors.py`)",
                   [rel for rel, _ in files], lines, plot, (7.0, 1.0 + 0.4 * rows),
                   alt="step time of each boids variant relative to the reference model")


def scaling_section(files: list[tuple[str, dict[str, Any]]]) -> Section:
    """``bench_scaling.py``: speedup of W ranks over one, against the ceilings measured beside it."""
    lines = provenance(files)
    rows = []
    groups: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for _, d in sorted(files, key=lambda f: (f[1]["model"], f[1]["agents"], f[1]["world_size"])):
        groups.setdefault((d["model"], d["agents"]), []).append(d)
        w = d["world_size"]
        one, many = d["runs"].get("1", {}), d["runs"].get(str(w), {})
        rows.append([d["model"], f"{d['agents']:,}", w, d.get("repeats", NOT_RECORDED),
                     f"{one['seconds_per_step'] * 1000:.1f}" if one else "-",
                     f"{many['seconds_per_step'] * 1000:.1f}" if many else "-",
                     f"{d['speedup']:.2f}", f"{d['efficiency'] * 100:.0f}%" if "efficiency" in d else "-",
                     f"{many['comm_share'] * 100:.0f}%" if "comm_share" in many else "-",
                     num(d.get("ceiling_speedup")), num(d.get("lockstep_speedup")),
                     num(d.get("partition_overhead")),
                     f"{many['halo_bytes_per_step'] / 1e3:,.1f}" if "halo_bytes_per_step" in many else "-"])
    lines += ["W = world size (processes, one torch thread each). Speedup: W=1 over W ms per step, each W's own "
              "round. Ceiling: W independent processes of N/W agents at once, no partitioner; in step: the same "
              "held together by a barrier after every step. Partitioned / independent: the partitioned run's "
              "time over the independent processes'.", ""]
    lines += table(["model", "agents", "W", "rounds", "W=1 ms/step", "W ms/step", "speedup", "efficiency",
                    "communication share", "ceiling (independent)", "ceiling in step", "partitioned / independent",
                    "halo kB/step"], rows)

    def plot(ax: Any) -> None:
        for i, ((model, agents), ds) in enumerate(sorted(groups.items())):
            ws = [1] + [d["world_size"] for d in ds]
            ax.plot(ws, [1.0] + [d["speedup"] for d in ds], "-o", color=f"C{i}", label=f"{model} {agents:,}")
            if all("ceiling_speedup" in d for d in ds):
                ax.plot(ws, [1.0] + [d["ceiling_speedup"] for d in ds], ":", color=f"C{i}")
        ticks = sorted({d["world_size"] for _, d in files} | {1})
        ax.plot(ticks, ticks, color="grey", linewidth=0.8, label="ideal")
        ax.set_xscale("log", base=2)
        ax.set_xticks(ticks)
        ax.get_xaxis().set_major_formatter("{x:.0f}")
        ax.get_xaxis().set_minor_formatter("")
        ax.set_xlabel("processes (W)")
        ax.set_ylabel("speedup over W=1 (dotted: ceiling)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    return Section("scaling", "Strong scaling with the spatial partitioner (`bench_scaling.py`)",
                   [rel for rel, _ in files], lines, plot, (7.0, 4.0),
                   alt="speedup against the number of processes per model and size, with the ceilings")


def _ab_ratios(d: dict[str, Any], item: str) -> list[float]:
    old, new = d["per_round"].get("old", {}).get(item), d["per_round"].get("new", {}).get(item)
    if not old or not new or len(old) != len(new):
        return []
    return [n / o for o, n in zip(old, new, strict=True) if o]


def ab_section(files: list[tuple[str, dict[str, Any]]]) -> Section:
    """``bench_ab.py``: per work item, old and new medians and the new / old ratios of the rounds."""
    lines = provenance(files)
    rows = []
    for rel, d in files:
        for item, ratio in d["median_ratio_new_over_old"].items():
            unit = " ms" if item.endswith("_ms_per_step") else " s" if item.endswith("_seconds") else ""
            per_round = _ab_ratios(d, item)
            rows.append([f"`{rel}`", f"`{item}`", f"{num(d['median']['old'].get(item))}{unit}",
                         f"{num(d['median']['new'].get(item))}{unit}", f"{ratio:.3f}",
                         f"{min(per_round):.3f}-{max(per_round):.3f}" if per_round else "-", d["rounds"],
                         {True: "yes", False: "no"}.get(d.get("same_final_sir"), NOT_RECORDED)
                         if item.startswith("sir") else ""])
    lines += table(["file", "work item", "old (median)", "new (median)", "new / old: median of rounds",
                    "new / old: range of rounds", "rounds", "same final SIR counts"], rows)
    lines += ["Work items (`bench_ab.py`): " + "; ".join(f"`{k}`: {v}" for k, v in AB_ITEMS.items())
              + ". The population of each item is a flag of the command, not recorded in the file.", ""]

    def plot(ax: Any) -> None:
        labels, y = [], 0
        entries = [(rel, d, item) for rel, d in files for item in d["median_ratio_new_over_old"]]
        for rel, d, item in reversed(entries):
            per_round = _ab_ratios(d, item)
            ax.plot(per_round, [y] * len(per_round), "o", color="grey", markersize=3)
            ax.plot([d["median_ratio_new_over_old"][item]], [y], "D", color="#4c78a8", markersize=5)
            labels.append(f"{rel.removesuffix('.json')}: {item}")
            y += 1
        ax.axvline(1.0, color="black", linewidth=0.8)
        ax.set_yticks(range(len(labels)), labels, fontsize=7)
        ax.set_xscale("log")
        ax.set_xticks([0.25, 0.5, 0.75, 1.0, 1.5, 2.0])
        ax.get_xaxis().set_major_formatter("{x:g}")
        ax.get_xaxis().set_minor_formatter("")
        ax.set_xlabel("new / old (diamond: median of rounds; dots: each round); below 1: new faster")
        ax.grid(axis="x", alpha=0.3)
    n = sum(len(d["median_ratio_new_over_old"]) for _, d in files)
    return Section("ab", "A/B: one checkout against another (`bench_ab.py`)", [rel for rel, _ in files], lines, plot,
                   (8.0, 1.0 + 0.22 * n), alt="new over old ratio per work item and file, log scale")


def _counts_table(d: dict[str, Any], keys: list[str]) -> list[str]:
    return table(["field", "value"], [[k, d[k]] for k in keys if k in d])


def _stacked_outcomes(ax: Any, by: dict[str, dict[str, int]], outcomes: list[str]) -> None:
    """One horizontal bar of trials per key of ``by`` (top to bottom), stacked by outcome."""
    keys = list(by)
    y = list(range(len(keys)))[::-1]
    left = [0] * len(keys)
    for i, o in enumerate(outcomes):
        values = [by[k].get(o, 0) for k in keys]
        ax.barh(y, values, left=left, color=f"C{i}", label=o)
        left = [a + b for a, b in zip(left, values, strict=True)]
    ax.set_yticks(y, keys, fontsize=8)
    ax.set_xlabel("trials")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))


def _outcome_points(ax: Any, rows: list[dict[str, Any]], flag: str, labels: tuple[str, str],
                    x: Callable[[dict[str, Any]], float], y: Callable[[dict[str, Any]], float],
                    markersize: float) -> None:
    """One point per trial at ``(x(row), y(row))``, blue where ``row[flag]`` holds and red where not
    (``labels``: the two legend entries), with a grid and a legend.
    """
    for ok, color, label in ((True, "#4c78a8", labels[0]), (False, "#e45756", labels[1])):
        sel = [r for r in rows if bool(r.get(flag)) == ok]
        if sel:
            ax.plot([x(r) for r in sel], [y(r) for r in sel], "o", color=color, markersize=markersize, label=label)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)


def parent_kills_section(rel: str, d: dict[str, Any]) -> Section:
    """``stress_parent_kills.py``: the launcher SIGKILLed, its workers gone, the resume identical."""
    lines = provenance([(rel, d)])
    lines += _counts_table(d, ["trials", "steps", "checkpoint_every", "grace_seconds",
                               "run_seconds_after_first_checkpoint", "killed_while_running", "no_orphans",
                               "max_worker_survival_s", "resumed_exit_0", "steps_completed_equals_total", "identical",
                               "ok", "seconds"])

    def plot(ax: Any) -> None:
        rows = d["rows"]
        x = list(range(len(rows)))
        ax.bar(x, [r.get("workers_outlived_parent_s", 0.0) for r in rows],
               color=["#4c78a8" if r.get("ok") else "#e45756" for r in rows])
        if "grace_seconds" in d:
            ax.axhline(d["grace_seconds"], color="black", linewidth=0.8, linestyle="--", label="grace (pass limit)")
            ax.legend(fontsize=8)
        ax.set_xlabel("trial (red: failed)")
        ax.set_ylabel("s the workers outlived the launcher")
        ax.grid(axis="y", alpha=0.3)
    return Section("parent_kills", STRESS["parent_kills.json"], [rel], lines, plot, (7.0, 3.0),
                   alt="seconds each killed launcher's workers outlived it, per trial, against the grace limit")


def writer_kills_section(rel: str, d: dict[str, Any]) -> Section:
    """``stress_writer_kills.py``: a writing run SIGKILLed; the file readable, the resume identical."""
    lines = provenance([(rel, d)])
    rows = d["rows"]
    lines += _counts_table(d, ["trials", "steps", "checkpoint_every", "run_seconds", "readable",
                               "identical_after_resume"])
    lines += [f"Killed after the run had finished: {sum(bool(r.get('finished_before_kill')) for r in rows)} of "
              f"{len(rows)} trials.", ""]

    def plot(ax: Any) -> None:
        _outcome_points(ax, rows, "identical", ("identical after resume", "not identical"),
                        lambda r: r["kill_after"], lambda r: r.get("steps_in_file", 0), 3)
        ax.set_xlabel("kill after (s)")
        ax.set_ylabel("steps in the killed file")
    return Section("writer_kills", STRESS["writer_kills.json"], [rel], lines, plot, (7.0, 3.0),
                   alt="steps in the file at each kill against the kill time")


def write_failures_section(rel: str, d: dict[str, Any]) -> Section:
    """``stress_write_failures.py``: an injected write failure, per target and process count."""
    lines = provenance([(rel, d)])
    lines += table(["count", "trials"], [[k, v] for k, v in d["counts"].items()])
    groups: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for r in d["rows"]:
        groups.setdefault((str(r.get("kind")), int(r.get("nprocs", 0))), []).append(r)
    lines += table(["failure in", "processes", "trials", "failure hit", "ok"],
                   [[k, n, len(rs), sum(bool(r.get("hit")) for r in rs), sum(bool(r.get("ok")) for r in rs)]
                    for (k, n), rs in sorted(groups.items())])

    def plot(ax: Any) -> None:
        keys = sorted(groups)
        labels = [f"{k}, {n} proc." for k, n in keys]
        hit = [sum(bool(r.get("hit")) and bool(r.get("ok")) for r in groups[k]) for k in keys]
        unhit = [sum(not r.get("hit") and bool(r.get("ok")) for r in groups[k]) for k in keys]
        bad = [sum(not r.get("ok") for r in groups[k]) for k in keys]
        y = list(range(len(keys)))[::-1]
        ax.barh(y, hit, color="#4c78a8", label="failure hit, refused cleanly")
        ax.barh(y, unhit, left=hit, color="#9ecae9", label="failure past the last write, run finished")
        ax.barh(y, bad, left=[a + b for a, b in zip(hit, unhit, strict=True)], color="#e45756", label="not ok")
        ax.set_yticks(y, labels, fontsize=8)
        ax.set_xlabel("trials")
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return Section("stress_write_failures", STRESS["stress_write_failures.json"], [rel], lines, plot, (8.5, 3.2),
                   alt="trials per failure target and process count, by outcome")


def study_full_disk_section(rel: str, d: dict[str, Any]) -> Section:
    """``stress_study_full_disk.py``: a study on a tmpfs of each size; one line, a resume identical."""
    lines = provenance([(rel, d)])
    meta = d.get("meta", {})
    if meta.get("command"):
        lines += [f"Each trial: `{meta['command']}` on a tmpfs of the size shown (the finished file: "
                  f"{meta.get('whole_file_bytes', 'not recorded')} bytes), then `--resume` on a large one.", ""]
    lines += table(["count", "trials"], [[k, v] for k, v in d["counts"].items()])
    rows = d["rows"]

    def plot(ax: Any) -> None:
        _outcome_points(ax, rows, "ok", ("ok", "not ok"), lambda r: r["size"] / 1024, lambda r: r["rc"], 4)
        ax.set_xlabel("disk size (KiB)")
        ax.set_ylabel("exit status")
    return Section("study_full_disk", STRESS["stress_study_full_disk.json"], [rel], lines, plot, (7.0, 3.0),
                   alt="exit status of the study at each disk size, by outcome")


def trajectory_flips_section(rel: str, d: dict[str, Any]) -> Section:
    """``stress_trajectory_flips.py``: one flipped bit per copy of a trajectory; what the readers served."""
    lines = provenance([(rel, d)])
    meta = d["meta"]
    lines += [f"The file: `{meta.get('command')}` ({meta.get('file_bytes')} bytes, of which "
              f"{meta.get('data_bytes')} are rows a reader serves). Each trial flips one bit of a copy, in a byte "
              "of those rows or anywhere in the file, and reads everything a user can read from it "
              f"(a worker killed after {meta.get('timeout_s')} s on one file counts as a hang).", ""]
    outcomes = list(d["counts"])
    lines += table(["bit flipped", *outcomes], [[place, *(counts.get(o, 0) for o in outcomes)]
                                               for place, counts in d["by_place"].items()]
                   + [["all", *(d["counts"][o] for o in outcomes)]])

    def plot(ax: Any) -> None:
        _stacked_outcomes(ax, {f"bit flipped {place}": counts for place, counts in d["by_place"].items()}, outcomes)
    return Section("trajectory_flips", STRESS["stress_trajectory_flips.json"], [rel], lines, plot, (8.0, 2.4),
                   alt="trials by where the bit was flipped, stacked by what the readers did")


def untrusted_section(rel: str, d: dict[str, Any]) -> Section:
    """``stress_untrusted_files.py``: corrupted checkpoints refused, or the uninterrupted result."""
    lines = provenance([(rel, d)])
    summary = {k: d[k] for k in ("trials", "seed", "subprocess", "seconds", "payload_ran") if k in d}
    summary["failures"] = len(d.get("failures", []))
    summary["distinct error messages"] = len(d.get("messages", {}))
    if d.get("command"):
        summary["command"] = f"`{d['command']}`"
    lines += table(["field", "value"], [[k, v] for k, v in summary.items()])
    by: dict[str, dict[str, int]] = {}
    for key, n in d["by_corruption"].items():
        what, _, outcome = key.partition(" -> ")
        by.setdefault(what, {})[outcome] = n
    outcomes = sorted({o for v in by.values() for o in v})
    lines += table(["checkpoint, corruption", *outcomes], [[k, *(v.get(o, 0) for o in outcomes)]
                                                           for k, v in sorted(by.items())])

    def plot(ax: Any) -> None:
        _stacked_outcomes(ax, {k: by[k] for k in sorted(by)}, outcomes)
    return Section("untrusted_files", STRESS["untrusted_files.json"], [rel], lines, plot, (8.0, 3.6),
                   alt="trials per checkpoint kind and corruption, by outcome")


def long_runs_section(files: list[tuple[str, dict[str, Any]]]) -> Section:
    """``stress_long_runs.py``: resident memory over a long run writing a file, and network timeouts."""
    lines = provenance(files)
    lines += table(["file", "steps", "agents", "every", "steps/s", "RSS first (MiB)", "RSS last (MiB)",
                    "growth (bytes/step)", "of which metric columns"],
                   [[f"`{rel}`", r["steps"], r["agents"], r["every"], num(r.get("steps_per_second"), 4),
                     num(r["rss_first"] / 2**20, 4), num(r["rss_last"] / 2**20, 4),
                     num(r["growth_bytes_per_step"]), r.get("metric_bytes_per_step", "not recorded")]
                    for rel, d in files for r in [d["long_run"]]])
    net = [(rel, name, v) for rel, d in files for name, v in sorted(d.get("network", {}).items())
           if isinstance(v, dict) and "median_seconds" in v]
    if net:
        lines += table(["file", "unreachable peer", "trials", "median (s)", "max (s)"],
                       [[f"`{rel}`", name, v.get("trials"), num(v["median_seconds"]), num(v.get("max_seconds"))]
                        for rel, name, v in net])

    def plot(ax: Any) -> None:
        for rel, d in files:
            samples = d["long_run"].get("samples", [])
            ax.plot([s["step"] for s in samples], [s["rss"] / 2**20 for s in samples], "o-", markersize=3,
                    label=rel.removesuffix(".json"))
        ax.set_xlabel("step")
        ax.set_ylabel("resident memory (MiB)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    return Section("stress_long_runs", "Long runs: memory with `--out`, and unreachable peers "
                   "(`stress_long_runs.py`)", [rel for rel, _ in files], lines, plot, (7.0, 3.0),
                   alt="resident memory against step, one line per file")


# --------------------------------------------------------------------------------------------
# grouping


def gpu_section(files: list[tuple[str, dict[str, Any]]]) -> Section:
    """``bench_gpu.py``: step times, CPU = GPU bits, the largest runs and PPO on one GPU."""
    lines = provenance(files)
    for rel, d in files:
        lines += [f"`{rel}` ({d.get('gpu', NOT_RECORDED)}, torch {d.get('torch', NOT_RECORDED)}):", ""]
        steps = d.get("steps", []) + d.get("largest", [])
        if steps:
            rows = [[r["model"], f"{int(r['agents']):,}", r.get("fused_mode", "auto"),
                     "fused" if r.get("path") == "fused" else "torch ops", num(r["seconds_per_step"] * 1e3),
                     num(r.get("bytes_per_agent")), num(r.get("init_seconds"))]
                    for r in steps if "error" not in r]
            rows += [[" ".join(r.get("args", [])), "", "", "", r["error"], "", ""] for r in steps if "error" in r]
            lines += table(["model", "agents", "AGENTSIM_FUSED", "neighbor path", "ms per step (median)",
                            "peak GPU bytes per agent", "init s"], rows)
        if d.get("bits"):
            lines += table(["model", "agents", "steps", "CPU vs GPU", "GPU run to run"],
                           [[r.get("model", ""), f"{int(r.get('agents', 0)):,}", r.get("steps", ""),
                             r.get("cpu_vs_gpu", r.get("error", "")), r.get("gpu_run_to_run", "")]
                            for r in d["bits"]])
        if d.get("ppo"):
            ppo = d["ppo"]
            lines += [f"PPO on spillover: {ppo.get('error') or num(ppo.get('agent_steps_per_s')) + ' agent-steps/s'}"
                      f" ({ppo.get('people', ' '.join(ppo.get('args', [])))} people).", ""]
    def plot(ax: Any) -> None:
        bars = []
        for _rel, d in files:
            for r in d.get("steps", []):
                if "error" not in r:
                    path = "fused" if r.get("path") == "fused" else "torch ops"
                    bars.append((f"{r['model']} {int(r['agents']):,} ({path})", [r["seconds_per_step"] * 1e3]))
        _bars(ax, bars, "ms per step (median of the steps)")
    n_bars = sum(1 for _, d in files for r in d.get("steps", []) if "error" not in r)
    return Section("gpu", "One GPU (`bench_gpu.py`)", [rel for rel, _ in files], lines, plot,
                   (7.0, 1.0 + 0.4 * max(n_bars, 1)), "GPU milliseconds per step by model, size and neighbor path")


def covid_section(files: list[tuple[str, dict[str, Any]]]) -> Section:
    """``bench_covid.py``: agentsim's covid model beside Covasim's hybrid population, seed by seed."""
    lines = provenance(files)
    keys = [("seconds_per_day", "s per day"), ("init_seconds", "init s"), ("first_day_seconds", "first day s"),
            ("peak_rss_mib", "peak RSS MiB"),
            ("final_size", "ever infected"), ("peak_infectious", "peak infectious"), ("peak_day", "peak day"),
            ("deaths", "deaths"), ("peak_severe", "peak severe")]
    for rel, d in files:
        params = d.get("agentsim_params")
        where = d.get("covasim_location") or "its default ages and household sizes"
        tables = d.get("covasim_tables") or {}
        if params is not None and tables:  # the tables' files were temporary: say what they held
            params = {k: v for k, v in params.items() if k not in ("age_pyramid", "household_sizes")}
        drawn = (f" agentsim's people drawn from Covasim's age distribution and its households of "
                 f"Poisson({tables['household_poisson_mean']}) persons, empty households skipped." if tables else "")
        if params is not None and params.get("contact_groups"):
            drawn += (f" agentsim's school, work and community contacts fixed, as Covasim's are: "
                      f"{params['contact_groups']} contact groups of {params.get('contacts_per_group')} other "
                      f"person(s) per person and layer.")
        if d.get("covasim_dynamic"):
            drawn += " Covasim's school, work and community contacts redrawn every day (`--covasim-dynamic`)."
        if d.get("no_superspreading"):
            drawn += " Everyone equally infectious on both sides (`--no-superspreading`)."
        setting = (f" agentsim's population parameters {params}; Covasim without waning immunity, location: {where}."
                   f"{drawn}" if params is not None else " Covasim's `cum_infections` counts reinfections too.")
        lines += [f"`{rel}`: {int(d['agents']):,} people, {d['days']} days, {len(d['rounds'])} seeds, one thread "
                  f"each; medians (min - max).{setting}", ""]
        rows = []
        for side in ("covasim", "agentsim"):
            got = d["summary"].get(side) or {}
            rows.append([side, *(f"{num(got[k]['median'])} ({num(got[k]['min'])} - {num(got[k]['max'])})"
                                 if k in got else NOT_RECORDED for k, _ in keys)])
        lines += table(["", *(label for _, label in keys)], rows)
        if d["summary"].get("speedup_all_days_median") is not None:  # the first day timed apart
            why = (" (agentsim draws and indexes its fixed contact groups then, Covasim makes its contacts in its "
                   "init)" if (params or {}).get("contact_groups") else "")
            lines += [f"Seconds per day over the days after the first; the first day apart{why}.",
                      f"Covasim's seconds per day over agentsim's, median of the seeds: "
                      f"{num(d['summary'].get('speedup_per_day_median'))} after the first day, "
                      f"{num(d['summary']['speedup_all_days_median'])} over every day.", ""]
        else:
            lines += ["Seconds per day over every day (the first day included).",
                      f"Covasim's seconds per day over agentsim's, median of the seeds: "
                      f"{num(d['summary'].get('speedup_per_day_median'))}.", ""]

    def plot(ax: Any) -> None:
        bars = []
        for _rel, d in files:
            for side in ("covasim", "agentsim"):
                values = [r[side]["seconds_per_day"] * 1e3 for r in d["rounds"] if "error" not in r[side]]
                after = " (after day 1)" if d["summary"].get("speedup_all_days_median") is not None else ""
                bars.append((f"{side}, {int(d['agents']):,} people{after}", values))
        _bars(ax, bars, "ms per simulated day (dots: each seed)", log=True)
    return Section("covid", "Covid on a synthetic population beside Covasim (`bench_covid.py`)",
                   [rel for rel, _ in files], lines, plot, (7.0, 1.0 + 0.4 * 2 * len(files)),
                   "milliseconds per simulated day, agentsim and Covasim")


def _count(x: float) -> str:
    """A number of people (a median of two may end in .5)."""
    return f"{x:,.0f}" if x == int(x) else f"{x:,.1f}"


def _daily(d: dict[str, Any], side: str, key: str) -> list[list[float]]:
    """Each seed's numbers after each day (``key``, e.g. ``infectious_by_day``) on one side of a covid file."""
    return [r[side][key] for r in d["rounds"] if key in r[side]]


def covid_curves_section(files: list[tuple[str, dict[str, Any]]]) -> Section:
    """The epidemic curves of ``bench_covid.py``'s files that recorded them: both sides, day by day."""
    lines = provenance(files)
    lines += ["The number of infectious people (asymptomatic, symptomatic and severe) and of severe ones "
              "(agentsim's H; Covasim's `n_severe`, critical cases included) after each day: medians over the "
              "seeds (min - max). The plot shows the infectious per 1,000 people, the band the range over the seeds.",
              ""]
    for rel, d in files:
        n_days = min(len(c) for side in ("covasim", "agentsim") for c in _daily(d, side, "infectious_by_day"))
        days = [day for day in (10, 20, 30, 40, 50, 60, 70, 80, 90, 100, 120, 150) if day < n_days]
        rows = []
        for side in ("covasim", "agentsim"):
            for key, label in (("infectious_by_day", "infectious"), ("severe_by_day", "severe")):
                at = [[c[day] for c in _daily(d, side, key)] for day in days]  # per day: each seed's number
                rows.append([f"{side} {label}",
                             *(f"{_count(statistics.median(x))} ({_count(min(x))} - {_count(max(x))})" for x in at)])
        seeds = {side: len(_daily(d, side, "infectious_by_day")) for side in ("covasim", "agentsim")}
        counted = (f"{seeds['covasim']} seeds" if seeds["covasim"] == seeds["agentsim"] == len(d["rounds"]) else
                   f"the curves of {seeds['covasim']} (Covasim) and {seeds['agentsim']} (agentsim) of "
                   f"{len(d['rounds'])} seeds")
        lines += [f"`{rel}`: {int(d['agents']):,} people, {counted}"
                  f"{', Covasim contacts redrawn daily' if d.get('covasim_dynamic') else ''}.", ""]
        lines += table(["after day", *(str(day) for day in days)], rows)

    def plot(ax: Any) -> None:
        styles = ["-", "--", ":", "-."]
        for j, (rel, d) in enumerate(files):
            per = 1000.0 / int(d["agents"])
            for side, color in (("covasim", "#e45756"), ("agentsim", "#4c78a8")):
                seeds = _daily(d, side, "infectious_by_day")
                n_days = min(len(c) for c in seeds)
                x = list(range(n_days))
                ax.plot(x, [statistics.median(c[t] for c in seeds) * per for t in x], styles[j % len(styles)],
                        color=color, label=f"{side}, {Path(rel).stem}", linewidth=1.2)
                ax.fill_between(x, [min(c[t] for c in seeds) * per for t in x],
                                [max(c[t] for c in seeds) * per for t in x], color=color, alpha=0.2, linewidth=0)
        ax.set_xlabel("day")
        ax.set_ylabel("infectious per 1,000 people")
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
    return Section("covid-curves", "Covid epidemic curves beside Covasim (`bench_covid.py`)",
                   [rel for rel, _ in files], lines, plot, (7.0, 3.6),
                   "infectious per 1,000 people by day, agentsim and Covasim, median and range over the seeds")


def covid_scale_section(files: list[tuple[str, dict[str, Any]]]) -> Section:
    """The covid model and its synthetic population at 1M to 100M people on one process."""
    lines = provenance(files)
    for rel, d in files:
        lines += [f"`{rel}`: {d.get('note', '')}", ""]
        lines += table(["people", "init s", "s per day", "days", "torch threads", "peak RSS bytes per person"],
                       [[f"{int(r['agents']):,}", num(r["init_seconds"]), num(r["seconds_per_day"]), r["days"],
                         r.get("threads", r.get("threads_per_rank", NOT_RECORDED)), num(r["peak_rss_bytes_per_agent"])]
                        for r in d["rows"]])
        for r in d.get("population_only", []):
            lines += [f"{r['what']}, {int(r['agents']):,} people: {num(r['seconds'])} s, peak RSS "
                      f"{num(r['peak_rss_bytes'] / 2**30)} GiB, {num(r['bytes_per_person_columns'])} bytes a person "
                      "in its columns.", ""]

    def plot(ax: Any) -> None:
        bars = [(f"{int(r['agents']):,} people", [r["seconds_per_day"]]) for _, d in files for r in d["rows"]]
        _bars(ax, bars, "seconds per simulated day", log=True)
    n = sum(len(d["rows"]) for _, d in files)
    return Section("covid-scale", "Covid at scale on one process", [rel for rel, _ in files], lines, plot,
                   (7.0, 1.0 + 0.4 * n), "seconds per simulated day of the covid model by population size")


def covid_ranks_section(files: list[tuple[str, dict[str, Any]]]) -> Section:
    """``bench_covid_scale.py`` over processes: strong scaling of the covid model, and the US."""
    lines = provenance(files)

    def speedup(r: dict[str, Any], rows: list[dict[str, Any]]) -> str:
        """Over the file's one-process run of as many people, whichever ran first."""
        if "speedup" in r:
            return num(r["speedup"])
        one = [o for o in rows if o["world_size"] == 1 and o["agents"] == r["agents"]]
        return num(one[0]["seconds_per_day"] / r["seconds_per_day"]) if one and r["world_size"] > 1 else ""

    def processes(r: dict[str, Any]) -> str:
        """``W``, or ``W apart`` for a ceiling run (W independent processes of N/W people)."""
        return f"{r['world_size']} apart" if r.get("independent") else str(r["world_size"])

    for rel, d in files:
        lines += [f"`{rel}`: {d.get('note', '')} ({d.get('cpu_count', '?')} cores)", ""]
        lines += table(["people", "processes", "init s", "s per day", "speedup over 1", "memberships cut",
                        "peak RSS bytes per person (above the processes' baseline)", "ever infected"],
                       [[f"{int(r['agents']):,}", processes(r), num(r["init_seconds"]), num(r["seconds_per_day"]),
                         speedup(r, d["rows"]),
                         f"{100 * r['groups'].get('groups/cut_share', 0.0):.2f}%",
                         f"{num(r['peak_rss_bytes_per_agent'])} ({num(r['peak_rss_above_baseline_bytes_per_agent'])})",
                         f"{int(r['final_size']):,}"] for r in d["rows"]])
        if d.get("rounds", 1) > 1:  # alternating rounds: the medians
            lines += [f"Over {d['rounds']} alternating rounds (every other one in reverse order)"
                      + ("; 'W apart': W independent processes of N/W people at once, the host's ceiling"
                         if d.get("ceiling") else "") + ":", ""]
            lines += table(["people", "processes", "runs", "median s per day", "speedup of the medians",
                            "speedup by round"],
                           [[f"{int(s['agents']):,}", processes(s), s["runs"], num(s["seconds_per_day_median"]),
                             num(s["speedup_of_medians"]) if s["speedup_of_medians"] is not None else "",
                             ", ".join(num(x) for x in s["speedups_by_round"])] for s in d["summary"]])

    def plot(ax: Any) -> None:
        bars = [(f"{int(r['agents']):,} people, {processes(r)} processes", [r["seconds_per_day"]])
                for _, d in files for r in d["rows"]]
        _bars(ax, bars, "seconds per simulated day", log=True)
    n = sum(len(d["rows"]) for _, d in files)
    return Section("covid-ranks", "Covid on several processes (`bench_covid_scale.py`)", [rel for rel, _ in files],
                   lines, plot, (7.0, 1.0 + 0.4 * n), "seconds per simulated day of the covid model by processes")


def busy_threads_section(files: list[tuple[str, dict[str, Any]]]) -> Section:
    """``bench_busy.py``: the default threads against one, fixed and passive threads, idle and busy."""
    lines = provenance(files)
    modes = ("default", "one", "fixed", "passive")
    for rel, d in files:
        lines += [f"`{rel}` ({d['usable_cores']} usable cores; busy: {d['busy_processes']} CPU-bound process(es) "
                  f"beside the run; {d['rounds']} alternating rounds, a fresh process each): seconds for the "
                  "steps, medians, and the ratios of the medians (the last column: of the whole run, building "
                  "the model and its initialization included, where recorded):", ""]
        rows = []
        for w, (model, agents, steps) in d["workloads"].items():
            med = d["summary"][w]["median_seconds"]
            for condition in ("idle", "busy"):
                row = [f"{model} {int(agents):,} x {steps}", condition,
                       *(num(med[condition].get(m)) for m in modes)]
                one, fixed = med[condition].get("one"), med[condition].get("fixed")
                default = med[condition].get("default")
                row.append(num(default / one if default and one else None, 2))
                row.append(num(default / fixed if default and fixed else None, 2))
                whole = d["summary"][w].get("median_whole_seconds", {}).get(condition, {})
                row.append(num(whole["default"] / whole["one"], 2) if whole else "")
                rows.append(row)
        lines += table(["workload", "machine", *modes, "default / one", "default / fixed",
                        "whole run: default / one"], rows)

    def plot(ax: Any) -> None:
        bars = []
        for _, d in files:
            for w, by in d["seconds"].items():
                base = _median(by["busy"]["one"])
                for m in modes:
                    if by["busy"].get(m):
                        bars.append((f"{w} busy, {m}", [v / base for v in by["busy"][m]]))
        _bars(ax, bars, "seconds / median of one thread, busy machine (dots: each round)", log=False)
        ax.axvline(1.0, color="grey", linewidth=0.8)
    n = sum(len(d["seconds"]) for _, d in files) * len(modes)
    return Section("busy-threads", "Threads on a busy machine (`bench_busy.py`)", [rel for rel, _ in files], lines,
                   plot, (7.0, 1.0 + 0.3 * n), alt="step time on a busy machine relative to one thread, by mode")


def fixed_cost_section(files: list[tuple[str, dict[str, Any]]]) -> Section:
    """``bench_fixed_cost.py``: small models' cost per step, this checkout against an older one."""
    lines = provenance(files)
    for rel, d in files:
        old = d.get("old_commit")
        lines += [f"`{rel}` (one process, one thread; {d['rounds']} alternating rounds"
                  + (f"; old: {_short(old)}" if old else "") + "): medians of the rounds" +
                  (", and the median of the per-round ratios new / old:" if old else ":"), ""]
        rows = [[w, f"{d['work'][w][0]:,} agents", d["units"][w], num(d["median"][w].get("new")),
                 num(d["median"][w].get("old")), num(d.get("median_ratio_new_over_old", {}).get(w))]
                for w in d["median"]]
        lines += table(["work", "size", "unit", "new", "old", "new / old"], rows)

    def plot(ax: Any) -> None:
        bars = []
        for _, d in files:
            for w, by in d["per_round"].items():
                if d["units"][w] == "ms per step":
                    bars += [(f"{w} {side}", values) for side, values in by.items()]
        _bars(ax, bars, "ms per step (dots: each round)", log=True)
    n = sum(2 * len(d["per_round"]) for _, d in files)
    return Section("fixed-cost", "The engine's cost per step of small models (`bench_fixed_cost.py`)",
                   [rel for rel, _ in files], lines, plot, (7.0, 1.0 + 0.3 * n),
                   alt="ms per step of small models, this checkout and an older one")


def abm_comparison_section(files: list[tuple[str, dict[str, Any]]]) -> Section:
    """``bench_abm_comparison.py``: the comparison's workloads, Mesa's implementations against agentsim."""
    lines = provenance(files)
    for rel, d in files:
        v = d["versions"]
        lines += [f"`{rel}` (Mesa {v.get('mesa', NOT_RECORDED)}, agentsim {v.get('agentsim', NOT_RECORDED)}; the "
                  f"comparison at {d.get('comparison_commit') or NOT_RECORDED}; one thread; {d['rounds']} alternating "
                  f"rounds of {d['runs_per_round']} runs): medians over every run; a run builds the model and takes "
                  "every step; the end state is the flock's polarization, the share of happy agents, or the sheep "
                  "and wolves:", ""]
        rows = []
        for w, s in d["summary"].items():
            med = s["median"]
            rows.append([w, num(med["mesa"]["run"] * 1e3), num(med["agentsim"]["run"] * 1e3),
                         num(s["mesa_over_agentsim_run"], 3), num(s["mesa_over_agentsim_steps"], 3),
                         num(s.get("agents_jl_published_ratio"), 3), num(s["agentsim_ms_per_step"]),
                         " / ".join(f"{m['end']:.3f}" if not m.get("end2") else f"{m['end']:,.0f}, {m['end2']:,.0f}"
                                    for m in (med["mesa"], med["agentsim"]))])
        lines += table(["workload", "Mesa ms a run", "agentsim ms a run", "Mesa / agentsim (run)",
                        "Mesa / agentsim (steps)", "Agents.jl's published ratio", "agentsim ms a step",
                        "end state Mesa / agentsim"], rows)

    def plot(ax: Any) -> None:
        bars = []
        for _, d in files:
            for w, by in d["per_round"].items():
                base = _median([float(x["run"]) for x in by["agentsim"]])
                bars.append((f"{w} (Mesa / agentsim)", [float(x["run"]) / base for x in by["mesa"]]))
        _bars(ax, bars, "Mesa's seconds a run / agentsim's median (dots: each run)", log=True)
    n = sum(len(d["per_round"]) for _, d in files)
    return Section("abm-comparison", "The ABM framework comparison's workloads beside Mesa (`bench_abm_comparison.py`)",
                   [rel for rel, _ in files], lines, plot, (7.0, 1.0 + 0.4 * n),
                   alt="how many times longer Mesa takes than agentsim, per workload")


def plain_models_section(files: list[tuple[str, dict[str, Any]]]) -> Section:
    """``bench_plain.py``: user models written as the tutorials teach, beside plain NumPy."""
    lines = provenance(files)
    for rel, d in files:
        lines += [f"`{rel}`: whole runs (set-up and every step) in fresh processes, alternating; NumPy on one "
                  "thread, agentsim on one thread and with its default threads; medians; the last step's summary "
                  "of each side (other random streams: close, not equal):", ""]
        rows = []
        for name, s in d["summary"].items():
            sec, last = s["seconds"], s["last_step"]
            step = s.get("agentsim_one_thread_step_over_numpy")  # files before the step time have none
            rows.append([name, str(s["steps"]), num(sec["numpy"]), num(sec["agentsim-1"]), num(sec["agentsim"]),
                         num(s["agentsim_one_thread_over_numpy"], 3), num(s["agentsim_default_over_numpy"], 3),
                         "-" if step is None else num(step, 3),
                         " / ".join(", ".join(f"{k} {v:,.4g}" for k, v in last[side].items())
                                    for side in ("numpy", "agentsim"))])
        lines += table(["model", "steps", "NumPy s", "agentsim 1 thread s", "agentsim default s",
                        "agentsim 1 thread / NumPy", "agentsim default / NumPy", "a step, 1 thread / NumPy",
                        "last step NumPy / agentsim"], rows)

    def plot(ax: Any) -> None:
        bars = []
        for _, d in files:
            for name in d["summary"]:
                numpy = _median([float(r["seconds"]) for r in d["rounds"] if r["model"] == name and r["side"] == "numpy"
                                 and "seconds" in r])
                for side in ("agentsim-1", "agentsim"):
                    bars.append((f"{name} ({side} / NumPy, {d['commit']})",
                                 [float(r["seconds"]) / numpy for r in d["rounds"]
                                  if r["model"] == name and r["side"] == side and "seconds" in r]))
        _bars(ax, bars, "agentsim's seconds / NumPy's median (dots: each round; 1: as fast)")
    n = sum(2 * len(d["summary"]) for _, d in files)
    return Section("plain-models", "Plain user models beside NumPy (`bench_plain.py`)", [rel for rel, _ in files],
                   lines, plot, (7.0, 1.0 + 0.3 * n), alt="agentsim's time over NumPy's, per model and threads")


def classify(rel: str, d: Any) -> str | None:
    """The suite a results file belongs to (by its name), or None."""
    name = Path(rel).name
    if not isinstance(d, dict):
        return None
    if name.startswith("peers-"):
        return "peers"
    if name.startswith("abm-comparison"):
        return "abm-comparison"
    if name.startswith("plain-models"):
        return "plain-models"
    if name.startswith("ab"):
        return "ab"
    if name.startswith("scaling"):
        return "scaling"
    if name == "roofline.json":
        return "roofline"
    if name.startswith("models"):
        return "models"
    if name.startswith("neighbors"):
        return "neighbors"
    if name.startswith("gpu"):
        return "gpu"
    if name.startswith("partition"):
        return "partition"
    if name.startswith("covid-scale"):
        return "covid-scale"
    if name.startswith(("covid-ranks", "covid-us")):
        return "covid-ranks"
    if name.startswith("covid"):
        return "covid"
    if name.startswith("busy-threads"):
        return "busy-threads"
    if name.startswith("fixed-cost"):
        return "fixed-cost"
    if name in STRESS:
        return name
    if name.startswith("stress_long_runs"):
        return "stress_long_runs"
    return None


def render(results: Path) -> Report:
    """Read every JSON file under ``results`` and build the report's sections (no files written)."""
    report = Report()
    by_suite: dict[str, list[tuple[str, dict[str, Any]]]] = {}
    for path in sorted(p for p in results.rglob("*") if p.is_file()):
        rel = path.relative_to(results).as_posix()
        if path.suffix != ".json":
            report.other_files.append(rel)
            continue
        try:
            d = json.loads(path.read_text())
        except (ValueError, UnicodeDecodeError) as e:
            report.not_rendered.append((rel, f"not valid JSON ({type(e).__name__})"))
            continue
        suite = classify(rel, d)
        if suite is None:
            keys = ", ".join(f"`{k}`" for k in list(d)[:8]) if isinstance(d, dict) else type(d).__name__
            report.not_rendered.append((rel, f"no suite reads this file name (fields: {keys})"))
            continue
        missing = [k for k in REQUIRED[suite] if k not in d]
        if missing:
            report.not_rendered.append((rel, f"looks like `{suite}` but lacks " + ", ".join(f"`{k}`" for k in missing)))
            continue
        by_suite.setdefault(suite, []).append((rel, d))

    peers: dict[str, list[tuple[str, dict[str, Any]]]] = {}
    for rel, d in by_suite.get("peers", []):
        peers.setdefault(str(d["suite"]), []).append((rel, d))
    for suite in sorted(peers, key=lambda s: (PEER_ORDER.index(s) if s in PEER_ORDER else len(PEER_ORDER), s)):
        report.sections.append(peers_section(suite, peers[suite]))
    curves = [(rel, d) for rel, d in by_suite.get("covid", [])  # the files with curves on both sides
              if all(_daily(d, side, "infectious_by_day") and _daily(d, side, "severe_by_day")
                     for side in ("covasim", "agentsim"))]
    if curves:
        by_suite["covid-curves"] = curves
    for key, build in (("gpu", gpu_section), ("covid", covid_section), ("covid-curves", covid_curves_section),
                       ("covid-scale", covid_scale_section), ("covid-ranks", covid_ranks_section),
                       ("partition", partition_section), ("roofline", roofline_section),
                       ("models", models_section), ("neighbors", neighbors_section),
                       ("scaling", scaling_section), ("ab", ab_section), ("busy-threads", busy_threads_section),
                       ("fixed-cost", fixed_cost_section), ("abm-comparison", abm_comparison_section),
                       ("plain-models", plain_models_section), ("stress_long_runs", long_runs_section)):
        if key in by_suite:
            report.sections.append(build(by_suite[key]))
    stress = {"parent_kills.json": parent_kills_section, "writer_kills.json": writer_kills_section,
              "stress_write_failures.json": write_failures_section, "untrusted_files.json": untrusted_section,
              "stress_study_full_disk.json": study_full_disk_section,
              "stress_trajectory_flips.json": trajectory_flips_section}
    for name, build_one in stress.items():
        for rel, d in by_suite.get(name, []):
            report.sections.append(build_one(rel, d))
    return report


def markdown(report: Report, image_dir: str) -> str:
    """The report as Markdown; plots referenced as ``image_dir/<suite>.png``."""
    out = ["<!-- Generated by benchmarks/report.py from benchmarks/results/: do not edit. -->", ""]
    for s in report.sections:
        out += [f"## {s.title}", "", "Files: " + ", ".join(f"`{f}`" for f in s.files) + ".", "", *s.lines]
        if s.plot is not None:
            out += [f"![{s.alt or s.title}]({image_dir}/{s.key}.png)", ""]
    out += ["## Files not rendered", ""]
    if report.not_rendered:
        out += ["JSON files under `benchmarks/results/` that no section above reads:", ""]
        out += table(["file", "why"], [[f"`{rel}`", why] for rel, why in report.not_rendered])
    else:
        out += ["Every JSON file under `benchmarks/results/` is rendered above.", ""]
    if report.other_files:
        out += ["Other files there (logs and the Markdown tables the scripts print), not rendered: "
                + ", ".join(f"`{f}`" for f in report.other_files) + ".", ""]
    return "\n".join(out).rstrip("\n") + "\n"


def _write_if_changed(path: Path, data: bytes) -> bool:
    if path.exists() and path.read_bytes() == data:
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return True


def _fingerprint(results: Path) -> str:
    from importlib.metadata import version

    h = hashlib.sha256(Path(__file__).read_bytes())
    h.update(version("matplotlib").encode())
    for p in sorted(p for p in results.rglob("*") if p.is_file()):
        h.update(p.relative_to(results).as_posix().encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()


def write(results: Path, out_md: Path, images: Path) -> Report | None:
    """Write the Markdown to ``out_md`` and one PNG per section into ``images``.

    Skips all work (returns None) when neither the results nor this module changed since the
    last call that wrote the same outputs; otherwise returns the :class:`Report`. Files whose
    bytes do not change are not rewritten (their times stay, so Sphinx does not re-read the page).
    """
    stamp = images / ".fingerprint"
    fingerprint = _fingerprint(results)
    if out_md.exists() and stamp.exists() and stamp.read_text() == fingerprint:
        return None
    report = render(results)
    images.mkdir(parents=True, exist_ok=True)
    wanted = {f"{s.key}.png" for s in report.sections if s.plot is not None}
    for old in images.glob("*.png"):
        if old.name not in wanted:
            old.unlink()
    for s in report.sections:
        if s.plot is None:
            continue
        buf = io.BytesIO()
        _save(s, buf)
        _write_if_changed(images / f"{s.key}.png", buf.getvalue())
    image_dir = Path(os.path.relpath(images, out_md.parent)).as_posix()
    _write_if_changed(out_md, markdown(report, image_dir).encode())
    stamp.write_text(fingerprint)
    return report


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--results", type=Path, default=HERE / "results")
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "_generated" / "benchmarks-tables.md")
    ap.add_argument("--images", type=Path, default=None, help="default: benchmarks/ next to --out")
    args = ap.parse_args(argv)
    images = args.images or args.out.parent / "benchmarks"
    stamp = images / ".fingerprint"
    if stamp.exists():
        stamp.unlink()  # the command line always renders
    report = write(args.results, args.out, images)
    assert report is not None
    print(f"wrote {args.out} ({len(report.sections)} sections: {', '.join(report.suites)})")
    for rel, why in report.not_rendered:
        print(f"not rendered: {rel}: {why}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
