"""Study: a grid times replicates on a process pool into one study file; each run equals a solo
run; bands equal np.quantile; failures are retried (worker deaths always, exceptions when asked)
and recorded; a study whose driver is killed resumes and runs nothing twice."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import agentsim as asim
from agentsim.cli.main import main
from agentsim.io.locks import LockedError
from agentsim.study import Study, StudyError, read_study, study_status

TESTS = str(Path(__file__).resolve().parent)


def solo(model, params, seed, agents, steps):
    sim = asim.Simulation(asim.get_model(model).configure(params=params), agents=agents, seed=seed)
    return sim.run(steps).metrics


@pytest.mark.timeout(300)
def test_a_2x4_sweep_runs_every_run_like_a_solo_run_and_writes_bands(tmp_path):
    study = Study("sir", {"beta": [0.03, 0.06]}, replicates=4, seed=11, agents=400, steps=15)
    out = tmp_path / "study.h5"
    result = study.run(out, workers=2)
    assert (result.executed, result.skipped, result.failed) == (8, 0, [])
    data = read_study(out)
    assert data.completed and sorted(data.runs) == [r.run_id for r in study.runs]
    assert len({r.seed for r in study.runs}) == 8
    for run in study.runs:
        want = solo("sir", run.params, run.seed, 400, 15)
        got = data.runs[run.run_id]["metrics"]
        assert set(got) == set(want) - {"seconds"}
        for k in got:
            assert np.array_equal(got[k], want[k]), (run.run_id, k)
    assert list(data.summary["run_id"]) == [r.run_id for r in study.runs]
    assert np.array_equal(data.summary["beta"], [0.03] * 4 + [0.06] * 4)
    for k, run in enumerate(study.runs):
        infected = data.runs[run.run_id]["metrics"]["I"]
        assert data.summary["peak_I"][k] == infected.max()
        assert data.summary["peak_step_I"][k] == int(np.argmax(infected))
        assert data.summary["final_R"][k] == data.runs[run.run_id]["metrics"]["R"][-1]
    for c, beta in enumerate([0.03, 0.06]):
        band = data.bands[f"c{c:04d}"]
        assert band["params"] == {"beta": beta} and band["runs"] == 4
        series = np.stack([data.runs[f"c{c:04d}-r{r:04d}"]["metrics"]["I"] for r in range(4)]).astype(float)
        assert np.array_equal(band["I"], np.quantile(series, [0.1, 0.5, 0.9], axis=0))
    assert study_status(out) == {"path": str(out), "total": 8, "done": 8, "failed": 0, "remaining": 0,
                                 "completed": True}


@pytest.mark.timeout(300)
def test_a_run_whose_worker_dies_twice_is_retried_and_recorded(tmp_path):
    counter = tmp_path / "attempts.txt"
    study = Study("study_models:flaky", scenarios=[{"fail_times": 2, "how": "die", "counter": str(counter)}],
                  seeds=[5], agents=20, steps=3)
    events = tmp_path / "events.jsonl"
    result = study.run(tmp_path / "s.h5", workers=1, log_json=str(events))
    assert result.executed == 1 and result.retries == 2 and not result.failed
    data = read_study(tmp_path / "s.h5")
    run = data.runs["c0000-r0000"]
    assert run["attempts"] == 3 and counter.read_text().split() == ["1", "2", "3"]
    want = solo("study_models:flaky", study.runs[0].params, 5, 20, 3)
    assert np.array_equal(run["metrics"]["total_size"], want["total_size"])
    kinds = [json.loads(line)["event"] for line in events.read_text().splitlines()]
    assert kinds == ["start", "retry", "retry", "done", "end"]


@pytest.mark.timeout(300)
def test_exceptions_are_retried_only_when_asked_and_failures_keep_their_traceback(tmp_path):
    def scenario(name):
        return {"fail_times": 2, "how": "raise", "counter": str(tmp_path / f"{name}.txt")}

    study = Study("study_models:flaky", scenarios=[scenario("a"), {"rate": 0.2}], seeds=[1], agents=10, steps=2)
    with pytest.raises(StudyError, match=r"1 of 2 runs failed \(c0000-r0000\).*under /failures"):
        study.run(tmp_path / "s.h5", workers=2)
    data = read_study(tmp_path / "s.h5")
    assert sorted(data.runs) == ["c0001-r0000"] and not data.completed
    failure = data.failures["c0000-r0000"]
    assert failure["attempts"] == 1 and failure["kind"] == "exception"
    assert "RuntimeError: deliberate failure of attempt 1" in failure["error"]
    assert "Traceback" in failure["traceback"] and "deliberate failure" in failure["traceback"]
    assert study_status(tmp_path / "s.h5")["failed"] == 1
    # errors="off": no raise; retry_exceptions: the third attempt succeeds.
    retried = Study("study_models:flaky", scenarios=[scenario("b")], seeds=[1], agents=10, steps=2)
    result = retried.run(tmp_path / "r.h5", workers=1, retry_exceptions=True, errors="off")
    assert result.retries == 2 and read_study(tmp_path / "r.h5").runs["c0000-r0000"]["attempts"] == 3


DRIVER = """
import sys
sys.path.insert(0, sys.argv[4])
from agentsim.study import Study
study = Study("study_models:flaky", {"rate": [0.1, 0.2, 0.3, 0.4], "log": [sys.argv[3]], "sleep": [0.15]},
              replicates=3, seed=2, agents=20, steps=4)
study.run(sys.argv[1], workers=2, resume=sys.argv[2] == "1")
"""


@pytest.mark.timeout(300)
def _children(pid: int) -> list[int]:
    """The pids whose parent is ``pid`` (Linux's /proc; none elsewhere)."""
    out = []
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    stat = f.read()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(entry))
    return out


@pytest.mark.long
def test_a_study_whose_driver_is_killed_resumes_and_runs_nothing_twice(tmp_path):
    # The runs log their seed at init; a slow step keeps the study going long enough to be killed.
    out, log = tmp_path / "study.h5", tmp_path / "log.txt"
    done_before: set[str] = set()
    kills: list[tuple[set[str], int]] = []  # what was done at each kill, and how many executions had started
    for kill in range(2):
        proc = subprocess.Popen([sys.executable, "-c", DRIVER, str(out), "1" if kill else "0", str(log), TESTS])
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.2)
            try:
                if study_status(out)["done"] >= len(done_before) + 3:
                    break
            except asim.OutputError:  # not created yet, or busy
                continue
        assert proc.poll() is None
        assert len(read_study(out).runs) >= len(done_before) + 3  # read while the driver writes it
        workers = _children(proc.pid)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        gone = time.monotonic() + 15  # the killed driver's pool workers exit too: no orphans
        while time.monotonic() < gone and any(os.path.exists(f"/proc/{w}") for w in workers):
            time.sleep(0.2)
        assert not [w for w in workers if os.path.exists(f"/proc/{w}")]
        data = read_study(out)  # readable after every kill
        assert set(data.runs) >= done_before
        done_before = set(data.runs)
        assert 0 < len(done_before) < 12
        kills.append((done_before, len(log.read_text().split())))
    study = Study("study_models:flaky", {"rate": [0.1, 0.2, 0.3, 0.4], "log": [str(log)], "sleep": [0.15]},
                  replicates=3, seed=2, agents=20, steps=4)
    result = study.run(out, workers=2, resume=True)
    assert result.skipped == len(done_before) and result.executed == 12 - len(done_before)
    data = read_study(out)
    assert data.completed and sorted(data.runs) == [r.run_id for r in study.runs]
    assert not (tmp_path / "study.h5.damaged").exists()  # a killed driver's file is copied, not rebuilt
    executions = log.read_text().split()
    seeds = {r.run_id: str(r.seed) for r in study.runs}
    for done, started in kills:  # no run finished before a kill started again after it
        assert not {seeds[k] for k in done} & set(executions[started:])
    for run in study.runs:
        want = solo("study_models:flaky", run.params, run.seed, 20, 4)
        assert np.array_equal(data.runs[run.run_id]["metrics"]["total_size"], want["total_size"])


def test_the_cli_runs_a_sweep_and_tells_its_status(tmp_path, capsys):
    out = str(tmp_path / "s.h5")
    assert main(["sweep", "sir", "--grid", "beta=0.02,0.05", "--seeds", "1,2", "--agents", "200", "--steps", "5",
                 "--out", out, "--workers", "2", "--quiet"]) == 0
    data = read_study(out)
    assert sorted(data.runs) == ["c0000-r0000", "c0000-r0001", "c0001-r0000", "c0001-r0001"]
    assert data.runs["c0001-r0001"]["params"] == {"beta": 0.05} and data.runs["c0001-r0001"]["seed"] == 2
    capsys.readouterr()
    assert main(["study", "status", out]) == 0
    assert "4 runs: 4 done, 0 failed, 0 remaining; completed" in capsys.readouterr().out
    assert main(["study", "status", str(tmp_path)]) == 0  # a directory: every study file in it
    assert f"{out}: 4 runs: 4 done" in capsys.readouterr().out
    assert main(["study", "status", str(tmp_path / "none")]) == 1
    assert "no such file" in capsys.readouterr().err
    assert main(["sweep", "sir", "--grid", "beta=0.02", "--seeds", "1", "--out", out, "--quiet"]) == 1
    assert "exists: pass resume" in capsys.readouterr().err
    assert main(["sweep", "sir", "--grid", "beta=0.03", "--seeds", "1", "--out", out, "--resume", "--quiet"]) == 2
    assert "holds another study (it differs in: agents, combos, seeds, steps)" in capsys.readouterr().err
    assert main(["sweep", "sir", "--grid", "betta=0.03", "--seeds", "1", "--out", out, "--quiet"]) == 2
    assert "unknown parameter 'betta'" in capsys.readouterr().err
    assert main(["sweep", "sir", "--seeds", "1", "--out", out, "--overwrite", "--executor", "dask", "--quiet"]) == 2
    assert "executor: expected one of local, ray (got 'dask')" in capsys.readouterr().err


@pytest.mark.long
@pytest.mark.ray
@pytest.mark.timeout(300)
def test_the_ray_executor_writes_the_same_study_file_and_retries_a_dead_worker(tmp_path):
    pytest.importorskip("ray")
    counter = tmp_path / "attempts.txt"
    scenarios = [{"rate": 0.1}, {"rate": 0.3}, {"fail_times": 1, "how": "die", "counter": str(counter)}]
    study = Study("study_models:flaky", scenarios=scenarios, replicates=2, seed=4, agents=30, steps=5)
    local = study.run(tmp_path / "local.h5", workers=2)
    counter.unlink()
    ray_result = study.run(tmp_path / "ray.h5", workers=2, executor="ray")
    assert local.executed == ray_result.executed == 6
    assert ray_result.retries == 1  # Ray: only the run whose worker died is charged
    a, b = read_study(tmp_path / "local.h5"), read_study(tmp_path / "ray.h5")
    assert sorted(a.runs) == sorted(b.runs) and a.completed and b.completed
    for k in a.runs:
        for m in a.runs[k]["metrics"]:
            assert np.array_equal(a.runs[k]["metrics"][m], b.runs[k]["metrics"][m]), (k, m)
    for col in a.summary:
        assert np.array_equal(a.summary[col], b.summary[col]), col
    for c in a.bands:
        for m in a.bands[c]:
            if m not in ("params", "runs"):
                assert np.array_equal(a.bands[c][m], b.bands[c][m])


@pytest.mark.long
@pytest.mark.timeout(300)
def test_runs_on_several_processes_each_give_the_one_process_study(tmp_path):
    one = Study("boids", {"cohere": [0.03, 0.06]}, seeds=[3], agents=300, steps=6)
    two = Study("boids", {"cohere": [0.03, 0.06]}, seeds=[3], agents=300, steps=6,
                options={"nprocs": 2, "partition": "spatial", "layout": "strips"})
    one.run(tmp_path / "one.h5", workers=1)
    two.run(tmp_path / "two.h5", workers=2)
    a, b = read_study(tmp_path / "one.h5"), read_study(tmp_path / "two.h5")
    assert sorted(a.runs) == sorted(b.runs) == ["c0000-r0000", "c0001-r0000"]
    for k in a.runs:
        for m in a.runs[k]["metrics"]:
            assert np.array_equal(a.runs[k]["metrics"][m], b.runs[k]["metrics"][m]), (k, m)


@pytest.mark.timeout(240)
def test_a_second_driver_cannot_replace_the_file_of_a_running_study(tmp_path):
    out, log = tmp_path / "study.h5", tmp_path / "log.txt"
    proc = subprocess.Popen([sys.executable, "-c", DRIVER, str(out), "0", str(log), TESTS])
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not out.exists():
            time.sleep(0.1)
        assert proc.poll() is None and out.exists()
        other = Study("sir", {"beta": [0.03]}, replicates=1, agents=50, steps=2)
        with pytest.raises(LockedError, match=rf"study file .*study.h5.* pid {proc.pid}"):
            other.run(out, workers=1, overwrite=True)
    finally:
        proc.kill()
        proc.wait()
    assert read_study(out).spec["model"] == "study_models:flaky"  # the running study's file, not replaced
