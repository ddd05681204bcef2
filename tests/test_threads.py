"""torch's threads where users run (agentsim.threads): the cap by usable cores and cgroup quota,
AGENTSIM_THREADS, and the governor that runs fewer threads while other processes keep cores busy,
without changing a result.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

import agentsim as asim
from agentsim import threads
from agentsim.errors import ConfigError
from agentsim.threads import CpuSample, ThreadGovernor, busy_threads, other_load, quota_cores

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize(("cores", "others", "cap", "expected"), [
    (2, 0.0, 2, 2), (2, 0.2, 2, 2), (2, 0.3, 2, 1), (2, 0.67, 2, 1), (2, 1.0, 2, 1), (2, 2.0, 2, 1),
    (16, 3.5, 16, 12), (16, 0.0, 8, 8), (1, 0.0, 4, 1), (4, 10.0, 4, 1),
])
def test_busy_threads_leaves_the_busy_cores(cores: int, others: float, cap: int, expected: int) -> None:
    assert busy_threads(cores, others, cap) == expected


def test_other_load_is_the_machines_busy_time_less_this_process() -> None:
    before = CpuSample(busy=10.0, own=1.0, wall=100.0)
    after = CpuSample(busy=11.5, own=1.5, wall=101.0)  # 1.5 core-seconds busy in 1 s, 0.5 of them ours
    assert other_load(before, after) == pytest.approx(1.0)
    assert other_load(after, after) == 0.0
    assert other_load(before, CpuSample(busy=10.2, own=1.5, wall=101.0)) == 0.0  # never negative


@pytest.mark.skipif(not os.path.exists("/proc/stat"), reason="reads /proc/stat (Linux)")
def test_a_sample_of_this_machine_counts_this_process() -> None:
    before = CpuSample.take()
    end = time.perf_counter() + 0.2
    while time.perf_counter() < end:  # busy for 0.2 s: the machine's busy time grows by at least ours
        pass
    after = CpuSample.take()
    assert before is not None and after is not None
    assert after.own - before.own > 0.1
    assert after.busy - before.busy >= (after.own - before.own) - 0.05  # /proc/stat counts 10 ms ticks


@pytest.mark.parametrize(("files", "expected"), [
    ({"cpu.max": "max 100000\n"}, None),
    ({"cpu.max": "150000 100000\n"}, 1.5),
    ({"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, None),
    ({"cpu/cpu.cfs_quota_us": "200000\n", "cpu/cpu.cfs_period_us": "100000\n"}, 2.0),
    ({"cpu.max": "garbage\n"}, None),
    ({}, None),
])
def test_quota_cores_reads_cgroup_v1_and_v2(tmp_path: Path, files: dict[str, str], expected: float | None) -> None:
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert quota_cores(str(tmp_path)) == expected


def test_usable_cores_are_within_the_affinity_mask() -> None:
    assert 1 <= threads.usable_cores() <= len(os.sched_getaffinity(0))


@pytest.mark.parametrize("value", ["0", "-2", "two", "1.5"])
def test_a_bad_agentsim_threads_is_refused_naming_the_choices(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("AGENTSIM_THREADS", value)
    with pytest.raises(ConfigError, match=r"AGENTSIM_THREADS: expected 'auto' or a whole number >= 1"):
        threads.configured_threads()


def _python(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if k not in ("AGENTSIM_THREADS", "OMP_NUM_THREADS")}
    return subprocess.run([sys.executable, "-c", code], env={**full, **env}, capture_output=True, text=True,
                          timeout=60, check=False)


def test_agentsim_threads_fixes_torchs_threads_at_import() -> None:
    done = _python("import agentsim, torch; print(torch.get_num_threads())", AGENTSIM_THREADS="1")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "1"


@pytest.mark.long
def test_a_bad_agentsim_threads_is_warned_at_import_and_refused_by_a_run_and_the_command() -> None:
    expected = "AGENTSIM_THREADS: expected 'auto' or a whole number >= 1 (got 'many')"
    code = ("import warnings\nwith warnings.catch_warnings(record=True) as seen:\n    warnings.simplefilter('always')\n"
            "    import agentsim\nprint(seen[0].message)\n"
            "try:\n    agentsim.Simulation(agentsim.get_model('randomwalk'), agents=10)\n"
            "except agentsim.ConfigError as e:\n    print('refused:', e)\n")
    done = _python(code, AGENTSIM_THREADS="many")
    assert done.returncode == 0, done.stderr
    warned, refused = done.stdout.strip().splitlines()
    assert expected in warned and refused == f"refused: {expected}"
    command = subprocess.run([sys.executable, "-m", "agentsim", "run", "randomwalk", "--agents", "10", "--steps", "1"],
                             env={**os.environ, "AGENTSIM_THREADS": "many"}, capture_output=True, text=True,
                             timeout=60, check=False)
    assert command.returncode == 2
    assert f"agentsim: error: {expected}" in command.stderr and "Traceback" not in command.stderr


class FakeMachine:
    """CPU samples in which the other processes keep ``others`` cores busy; time passes a second a sample."""

    def __init__(self) -> None:
        self.others = 0.0
        self.busy = 0.0
        self.wall = time.monotonic() - 1000.0  # every tick is due

    def __call__(self) -> CpuSample:
        self.busy += self.others
        self.wall += 1.0
        return CpuSample(busy=self.busy, own=0.0, wall=self.wall)


@pytest.fixture
def two_threads() -> object:
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def test_the_governor_follows_the_load_and_the_users_own_setting(two_threads: object,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AGENTSIM_THREADS", raising=False)
    machine = FakeMachine()
    governor = ThreadGovernor(cores=2, sample=machine)
    assert governor.active and governor.cap == 2
    assert governor.tick() == 2
    machine.others = 1.0
    assert governor.tick() == 1 and torch.get_num_threads() == 1
    machine.others = 0.0
    assert governor.tick() == 2 and torch.get_num_threads() == 2
    machine.others = 1.0
    governor.tick()
    governor.restore()  # after a run: the cap again
    assert torch.get_num_threads() == 2
    torch.set_num_threads(1)  # the user's own choice becomes the cap
    machine.others = 0.0
    assert governor.tick() == 1 and governor.cap == 1
    assert governor.summary() == ("threads: 2 for 2 steps, 1 for 3 steps (cap 1, 2 usable cores; other processes "
                                  "kept up to 1.0 cores busy)")


def test_the_governor_starts_from_the_threads_running_at_its_start(two_threads: object,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A run's initialization happens before the first sample: it runs with the threads that the
    processes running at the start leave, and the first sample corrects a passing process.
    """
    monkeypatch.delenv("AGENTSIM_THREADS", raising=False)
    machine = FakeMachine()
    governor = ThreadGovernor(cores=2, sample=machine, running=lambda cores: 1.0)
    assert torch.get_num_threads() == 1 and governor.shed and governor.most_others == 1.0
    assert governor.tick() == 2  # the sample: nothing else ran
    torch.set_num_threads(2)
    unknown = ThreadGovernor(cores=2, sample=machine, running=lambda cores: None)
    assert torch.get_num_threads() == 2 and not unknown.shed


def test_running_others_counts_other_threads_only_where_they_compete(monkeypatch: pytest.MonkeyPatch) -> None:
    readings = iter([(3, 2), (2, 2)])
    monkeypatch.setattr(threads, "_procs_running", lambda: next(readings))
    assert threads.running_others(2, pause=0.0) == 1.0  # the fewer of two readings, less this thread
    monkeypatch.setattr(threads, "_procs_running", lambda: (5, 64))
    assert threads.running_others(2) is None  # 2 of 64 cores: the others may run elsewhere
    monkeypatch.setattr(threads, "_procs_running", lambda: None)
    assert threads.running_others(2) is None
    monkeypatch.undo()
    if os.path.exists("/proc/stat"):
        assert threads._procs_running() is not None


def test_agentsim_threads_stops_the_governor(two_threads: object, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENTSIM_THREADS", "2")
    machine = FakeMachine()
    machine.others = 2.0
    governor = ThreadGovernor(cores=2, sample=machine)
    assert not governor.active
    assert governor.tick() == 2


def test_threads_changed_mid_run_change_no_result(two_threads: object, monkeypatch: pytest.MonkeyPatch) -> None:
    """SIR at 200k people (large enough for torch's parallel operations and the native kernels' split):
    the governor switches between 1 and 2 threads at every step; the metrics and the final state are
    those of a run on one thread.
    """
    monkeypatch.delenv("AGENTSIM_THREADS", raising=False)
    model = asim.get_model("sir")
    machine = FakeMachine()
    switching = asim.Simulation(model, agents=200_000, seed=3)
    switching.threads = ThreadGovernor(cores=2, sample=lambda: (setattr(machine, "others", 1.0 - machine.others),
                                                               machine())[1])
    result = switching.run(12)
    assert set(switching.threads.history) == {1, 2}, switching.threads.history
    assert "threads: 2 for" in result.threads and "1 for" in result.threads
    torch.set_num_threads(1)
    plain = asim.Simulation(model, agents=200_000, seed=3)
    expected = plain.run(12)
    for name, values in expected.metrics.items():
        if not name.startswith(("step_seconds", "substep_seconds")):
            np.testing.assert_array_equal(result.metrics[name], values, err_msg=name)
    assert result.state is not None and expected.state is not None
    for key, t in expected.state["person"].fields().items():
        assert torch.equal(result.state["person"][key], t), key
