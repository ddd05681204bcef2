"""agentsim next to its peers on the same work, in alternating rounds.

    python benchmarks/bench_peers.py install            # Starsim, Mesa (and AgentTorch if it installs)
    python benchmarks/bench_peers.py sir --rounds 3     # SIR 1M x 100 days: Starsim vs agentsim
    python benchmarks/bench_peers.py boids --rounds 3   # boids 10k per step: Mesa vs agentsim
    python benchmarks/bench_peers.py targets            # random walk 10M (AgentTorch vs agentsim), Schelling 1M
    python benchmarks/bench_peers.py sizes              # agent-updates/s at 10k..10M with peak memory
    python benchmarks/bench_peers.py memory --rounds 1  # SIR 100M: init seconds, peak B/agent
    python benchmarks/bench_peers.py circles            # FLAME GPU 2's circles, 1M points, per step
    python benchmarks/bench_peers.py targets --device cuda --agentsim-only   # agentsim's side on a GPU

``install`` makes one virtual environment per peer under ``benchmarks/peers/venvs/`` (ignored by
git; never the package's environment): Starsim 3.7.2 with this Python, Mesa 3.5.1 with a Python
>= 3.12 (it requires one; found on PATH or given with ``--python312``), AgentTorch 0.6.0 with
torch pinned to the installed version (recorded as not installed if pip fails). Each suite runs,
per round, every side in a fresh process, in alternating order (peer first in even rounds), and
writes ``benchmarks/results/peers-<suite>.json`` (every round, medians, versions, machine, date)
and a Markdown table ``benchmarks/results/peers-<suite>.md``. agentsim runs from this checkout
with torch's default threads; peak memory is the process's peak RSS (``ru_maxrss``), and on a GPU
also the peak of torch's allocator (``torch.cuda.max_memory_allocated``). ``--device cuda`` runs
agentsim's side on the GPU (the peers run on the CPU: none of them runs these models on a GPU);
``--agentsim-only`` runs agentsim's side alone (a machine without the peers' venvs, such as a lent GPU
machine with no network). The circles suite has no peer to run here: FLAME GPU 2 is CUDA C++ and its
figure (about 2.1 ms per step for 1M points on an H100 PCIe) is the published one, quoted, not measured.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
VENVS = HERE / "peers" / "venvs"
PEERS = {  # name: (pip requirement, needs Python >= 3.12)
    "starsim": ("starsim==3.7.2", False),
    "mesa": ("mesa==3.5.1 networkx", True),  # mesa imports networkx without requiring it
    "agenttorch": ("agent-torch==0.6.0", False),
}


# ---------------------------------------------------------------- agentsim's side (in a fresh process)
AGENTSIM_RUN = r"""
import json, resource, statistics, sys, time
import torch
import agentsim
model, n, steps, params, device = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), json.loads(sys.argv[4]), sys.argv[5]
cuda = device.startswith("cuda")
t0 = time.perf_counter()
sim = agentsim.Simulation(agentsim.get_model(model), agents=n, seed=1, params=params, device=device)
if cuda:
    torch.cuda.synchronize()
t1 = time.perf_counter()
times = []
if model == "sir":
    res = sim.run(steps)
    run = float(res.seconds)
    final = {k: float(v[-1]) for k, v in res.metrics.items() if k != "step"}
else:
    # Per step of one run (its metrics once per step, as a run computes them): the median of the
    # steps' own seconds (Simulation.step_seconds). A loop of run(1) would also time each run's
    # metrics of its starting state, a second metrics pass per step.
    sim.run(1)  # warm-up
    res = sim.run(steps)
    times = list(sim.step_seconds)[-steps:]
    run = float(res.seconds)
    final = {}
print(json.dumps({"agents": n, "init_seconds": t1 - t0, "run_seconds": run,
                  "seconds_per_step": statistics.median(times) if times else run / steps, "steps": steps,
                  "final": final, "threads": torch.get_num_threads(), "device": device,
                  "device_name": torch.cuda.get_device_name() if cuda else "cpu",
                  "peak_gpu_bytes": torch.cuda.max_memory_allocated() if cuda else 0,
                  "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))
"""


def _json_line(cmd: list[str], env: dict[str, str] | None = None, timeout: float = 3600) -> dict[str, Any]:
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    if done.returncode:
        raise SystemExit(f"bench_peers: {' '.join(cmd[:4])} ... failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def child_json(cmd: list[str], env: dict[str, str] | None = None, timeout: float = 3600) -> dict[str, Any]:
    """The last JSON line a child process prints, with ``wall_seconds_process``; or, where it prints
    none or runs past ``timeout``, ``{"error": ...}`` (its last lines, or the timeout): a suite that
    goes on after one failed figure (an out-of-memory size, say) records why.
    """
    t0 = time.perf_counter()
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    for line in reversed(done.stdout.strip().splitlines()):
        if line.startswith("{"):
            return {**json.loads(line), "wall_seconds_process": time.perf_counter() - t0}
    return {"error": " | ".join((done.stderr or done.stdout).strip().splitlines()[-3:]), "returncode": done.returncode}


def checkout_env(root: Path = ROOT, *more: Path) -> dict[str, str]:
    """The environment of a process that runs the checkout ``root``: its agentsim and its models
    (``checkout_site/sitecustomize.py``) first on ``PYTHONPATH``, then ``more``, then what was there.
    """
    path = [str(root), str(HERE / "checkout_site"), *map(str, more), os.environ.get("PYTHONPATH", "")]
    return {**os.environ, "AGENTSIM_CHECKOUT_MODELS": str(root / "models"),
            "PYTHONPATH": os.pathsep.join(p for p in path if p)}  # no empty entry (it would mean the cwd)


DEVICE = "cpu"  # agentsim's device, set from --device by main()


def agentsim_run(model: str, agents: int, steps: int, params: dict[str, Any] | None = None) -> dict[str, Any]:
    """One agentsim run of ``model`` on :data:`DEVICE` in a fresh process (this checkout first on the path)."""
    env = checkout_env()
    return _json_line([sys.executable, "-W", "ignore", "-c", AGENTSIM_RUN, model, str(agents), str(steps),
                       json.dumps(params or {}), DEVICE], env=env)


def peer_python(peer: str) -> Path:
    return VENVS / peer / "bin" / "python"


def peer_run(peer: str, script: str, *args: Any) -> dict[str, Any]:
    python = peer_python(peer)
    if not python.exists():
        raise SystemExit(f"bench_peers: {peer} is not installed (run: python benchmarks/bench_peers.py install)")
    env = {**os.environ, "STARSIM_INSTALL_FONTS": "0"}
    env.pop("PYTHONPATH", None)
    return _json_line([str(python), str(HERE / "peers" / script), *map(str, args)], env=env)


# ---------------------------------------------------------------- install
def _python312(given: str | None) -> str | None:
    pyenv = sorted(Path.home().glob(".pyenv/versions/3.1[2-9]*/bin/python"), reverse=True)  # pyenv's shims
    for candidate in ([given] if given else []) + ["python3.13", "python3.12", *map(str, pyenv)]:
        path = shutil.which(candidate) or (candidate if Path(candidate).exists() else None)
        if path is None:
            continue
        ok = subprocess.run([path, "-c", "import sys; print(sys.version_info >= (3, 12))"], capture_output=True,
                            text=True)
        if ok.stdout.strip() == "True":
            return path
    return None


def install(python312: str | None) -> dict[str, str]:
    """Create the peers' venvs; returns peer -> version installed or why not."""
    import torch

    status: dict[str, str] = {}
    for peer, (requirement, needs_312) in PEERS.items():
        python = _python312(python312) if needs_312 else sys.executable
        if python is None:
            status[peer] = "not installed: needs Python >= 3.12 (none on PATH; pass --python312)"
            continue
        venv = VENVS / peer
        if not peer_python(peer).exists():
            subprocess.run([python, "-m", "venv", str(venv)], check=True)
        extra = [f"torch=={torch.__version__.split('+')[0]}"] if peer == "agenttorch" else []
        done = subprocess.run([str(peer_python(peer)), "-m", "pip", "install", "-q", *requirement.split(), *extra],
                              capture_output=True, text=True)
        if done.returncode:
            why = [ln for ln in done.stderr.splitlines() if ln.startswith("ERROR")][-1:] or [done.stderr[-300:]]
            status[peer] = f"not installed: {why[0][:300]}"
            continue
        probe = {"starsim": "import starsim; print(starsim.__version__)",
                 "mesa": "import mesa; print(mesa.__version__)",
                 "agenttorch": "import agent_torch, importlib.metadata as m; print(m.version('agent-torch'))"}[peer]
        got = subprocess.run([str(peer_python(peer)), "-c", probe], capture_output=True, text=True,
                             env={**os.environ, "STARSIM_INSTALL_FONTS": "0"})
        status[peer] = got.stdout.strip() if got.returncode == 0 else f"installed, import fails: {got.stderr[-300:]}"
    (VENVS / "status.json").write_text(json.dumps(status, indent=1) + "\n")
    return status


# ---------------------------------------------------------------- suites
NOT_RUN = "not run (--agentsim-only)"


def _peers(args: argparse.Namespace, sides: dict[str, Any]) -> dict[str, Any]:
    """The peers' sides of a suite, or none with ``--agentsim-only``."""
    return {} if args.agentsim_only else sides


def _rounds(rounds: int, sides: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {name: [] for name in sides}
    names = list(sides)
    for r in range(rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            out[name].append(sides[name]())
            print(f"round {r + 1}/{rounds} {name}: {json.dumps(out[name][-1])[:300]}", flush=True)
    return out


def _median(rows: list[dict[str, Any]], key: str) -> float:
    return statistics.median(float(r[key]) for r in rows)


def suite_sir(args: argparse.Namespace) -> tuple[dict[str, Any], list[list[str]]]:
    n = args.agents or 1_000_000
    got = _rounds(args.rounds, {**_peers(args, {"starsim": lambda: peer_run("starsim", "starsim_sir.py", n, 1)}),
                                "agentsim": lambda: agentsim_run("sir", n, 100)})
    a_run, a_mem = _median(got["agentsim"], "run_seconds"), _median(got["agentsim"], "peak_rss_bytes")
    peer = [NOT_RUN, "", "", "", ""]  # run, ratio, init, memory, memory ratio
    if "starsim" in got:
        s_run, s_mem = _median(got["starsim"], "run_seconds"), _median(got["starsim"], "peak_rss_bytes")
        peer = [f"Starsim {got['starsim'][0]['version']}: {s_run:.2f} s", f"{s_run / a_run:.1f}x",
                f"{_median(got['starsim'], 'init_seconds'):.2f} s", f"{s_mem / n:.0f} B", f"{s_mem / a_mem:.1f}x less"]
    rows = [["SIR, 1M, degree 10, 100 days: run", peer[0], f"{a_run:.2f} s", peer[1], ">= 10x"],
            ["SIR init (people + network)", peer[2], f"{_median(got['agentsim'], 'init_seconds'):.2f} s", "", ""],
            ["SIR peak RSS per agent", peer[3], f"{a_mem / n:.0f} B", peer[4], ""]]
    return got, rows


def suite_boids(args: argparse.Namespace) -> tuple[dict[str, Any], list[list[str]]]:
    n = args.agents or 10_000
    got = _rounds(args.rounds, {**_peers(args, {"mesa": lambda: peer_run("mesa", "mesa_boids.py", n, 3, 1)}),
                                "agentsim": lambda: agentsim_run("boids", n, 20, {"separation": 2.0})})
    a = _median(got["agentsim"], "seconds_per_step")
    peer, ratio = NOT_RUN, ""
    if "mesa" in got:
        m = _median(got["mesa"], "seconds_per_step")
        peer, ratio = f"Mesa {got['mesa'][0]['version']}: {m:.2f} s", f"{m / a:.0f}x"
    return got, [[f"boids, {n:,}, Mesa's rules and density: per step", peer, f"{a * 1e3:.2f} ms", ratio, ">= 1000x"]]


def suite_targets(args: argparse.Namespace) -> tuple[dict[str, Any], list[list[str]]]:
    work = {"randomwalk_10M": lambda: agentsim_run("randomwalk", 10_000_000, 5),
            "schelling_1M": lambda: agentsim_run("schelling", 1_000_000, 10)}
    if peer_python("agenttorch").exists() and not args.agentsim_only:  # optional: "AgentTorch if it installs"
        work["agenttorch_walk_10M"] = lambda: peer_run("agenttorch", "agenttorch_walk.py", 10_000_000, 5, 1)
    got = _rounds(args.rounds, work)
    w, s = _median(got["randomwalk_10M"], "seconds_per_step"), _median(got["schelling_1M"], "seconds_per_step")
    peer, ratio = "AgentTorch: not installed (`bench_peers.py install`)", ""
    if "agenttorch_walk_10M" in got:
        at = got["agenttorch_walk_10M"]
        a = _median(at, "seconds_per_step")
        peer = (f"AgentTorch {at[0]['version']}: {a:.3f} s (its memory grows "
                f"{_median(at, 'rss_growth_bytes_per_step') / 2**20:.0f} MiB per step)")
        ratio = f"{a / w:.1f}x"
    return got, [["random walk, 10M, per step", peer, f"{w:.3f} s", ratio, "<= 0.1 s"],
                 ["Schelling, 1M, per step", "", f"{s * 1e3:.1f} ms", "", "<= 50 ms"]]


SIZES_MODELS = ("sir", "boids", "schelling", "randomwalk", "wolfsheep", "circles")


def suite_sizes(args: argparse.Namespace) -> tuple[dict[str, Any], list[list[str]]]:
    got: dict[str, Any] = {}
    rows = []
    for model in args.models or SIZES_MODELS:
        for n in (10_000, 100_000, 1_000_000, 10_000_000):
            if model in ("boids", "wolfsheep", "circles") and n > 1_000_000 and DEVICE == "cpu":
                continue  # minutes per step on this 2-core host
            steps = 20 if n <= 100_000 else 5 if n <= 1_000_000 else 3
            runs = [agentsim_run(model, n, steps) for _ in range(args.rounds)]
            got[f"{model}_{n}"] = runs
            sec = _median(runs, "seconds_per_step")
            gpu = _median(runs, "peak_gpu_bytes")
            rows.append([f"{model}, {n:,}", f"{n / sec:.3g} ({sec * 1e3:.1f} ms/step)",
                         f"{_median(runs, 'peak_rss_bytes') / 2**20:.0f} MiB"
                         + (f" (GPU: {gpu / 2**20:.0f} MiB)" if gpu else "")])
            print(rows[-1], flush=True)
    return got, rows


FLAME_GPU_2_SECONDS = 2.1e-3  # published, H100 PCIe, 1M points, density 1, radius 2
FLAME_GPU_2_CIRCLES = (f"FLAME GPU 2 (published, not run here): about {FLAME_GPU_2_SECONDS * 1e3:.1f} ms on an "
                       "H100 PCIe (1M points, density 1, radius 2)")


def suite_circles(args: argparse.Namespace) -> tuple[dict[str, Any], list[list[str]]]:
    """FLAME GPU 2's 3D circles benchmark (1M points, density 1, radius 2): agentsim's seconds per step."""
    n = args.agents or 1_000_000
    got = _rounds(args.rounds, {"agentsim": lambda: agentsim_run("circles", n, 10)})
    a = _median(got["agentsim"], "seconds_per_step")
    on = got["agentsim"][0]["device_name"]
    return got, [[f"circles 3D, {n:,} points, per step ({on})", FLAME_GPU_2_CIRCLES, f"{a * 1e3:.2f} ms",
                  f"{a / FLAME_GPU_2_SECONDS:.1f}x its time", ""]]


BARE_PROCESS = "import resource, torch, agentsim; print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)"


def suite_memory(args: argparse.Namespace) -> tuple[dict[str, Any], list[list[str]]]:
    """SIR at ``--agents`` (default 100M), 3 days: initialization seconds and peak memory per agent,
    of the whole process and above a process that only imported torch and agentsim.
    """
    n = args.agents or 100_000_000
    env = checkout_env()
    got: dict[str, Any] = {"bare": [], "sir": []}
    for _ in range(args.rounds):
        bare = subprocess.run([sys.executable, "-c", BARE_PROCESS], capture_output=True, text=True, env=env, check=True)
        got["bare"].append(int(bare.stdout.strip()))
        got["sir"].append(agentsim_run("sir", n, 3))
        print(got["sir"][-1], flush=True)
    base = statistics.median(got["bare"])
    peak, init = _median(got["sir"], "peak_rss_bytes"), _median(got["sir"], "init_seconds")
    gpu = _median(got["sir"], "peak_gpu_bytes")
    on_gpu = f"; on the GPU, {gpu / n:.0f} B/agent at the allocator's peak" if gpu else ""
    return got, [[f"SIR memory, {n:,} agents (network of mean degree 10 included), peak", "",
                  f"{peak / n:.0f} B/agent whole process; {(peak - base) / n:.0f} B/agent above a bare "
                  f"torch + agentsim process ({base / 2**20:.0f} MiB){on_gpu}", "", "<= 80 B/agent"],
                 [f"SIR initialization, {n:,} agents (network build)", "", f"{init:.1f} s", "", "<= 30 s"]]


SUITES = {"sir": suite_sir, "boids": suite_boids, "targets": suite_targets, "sizes": suite_sizes,
          "memory": suite_memory, "circles": suite_circles}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("suite", choices=["install", *SUITES])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--agents", type=int, default=None, help="population (default: the suite's)")
    ap.add_argument("--python312", default=None, help="a Python >= 3.12 for Mesa's venv")
    ap.add_argument("--device", default="cpu", help="agentsim's device: cpu (default) or cuda[:N]")
    ap.add_argument("--agentsim-only", action="store_true", help="run agentsim's side alone (no peers)")
    ap.add_argument("--models", nargs="+", choices=SIZES_MODELS, help="the sizes suite's models (default: all)")
    ap.add_argument("--tag", default="", help="appended to the results' file names (e.g. -cuda)")
    args = ap.parse_args(argv)
    global DEVICE
    DEVICE = args.device
    if args.suite == "install":
        for peer, version in install(args.python312).items():
            print(f"{peer}: {version}")
        return 0
    if args.rounds < 1:
        print(f"bench_peers: --rounds >= 1 (got {args.rounds})", file=sys.stderr)
        return 2
    got, rows = SUITES[args.suite](args)
    import torch

    meta = {"suite": args.suite, "rounds": args.rounds, "device": args.device, "date": time.strftime("%Y-%m-%d"),
            "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
            "python": platform.python_version(), "torch": torch.__version__, "torch_threads": torch.get_num_threads(),
            "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                     cwd=ROOT).stdout.strip()}
    header = ["| work | peer | agentsim | ratio | target |", "| --- | --- | --- | --- | --- |"]
    if args.suite == "sizes":
        header = ["| model, agents | agent-updates/s | peak RSS (whole process) |", "| --- | --- | --- |"]
    table = [*header, *("| " + " | ".join(r) + " |" for r in rows)]
    results = ROOT / "benchmarks" / "results"
    results.mkdir(parents=True, exist_ok=True)
    stem = f"peers-{args.suite}{args.tag}"
    (results / f"{stem}.json").write_text(json.dumps({**meta, "runs": got, "table": rows}, indent=1) + "\n")
    (results / f"{stem}.md").write_text("\n".join(table) + "\n")
    print("\n".join(table))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
