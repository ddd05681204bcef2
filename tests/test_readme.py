"""The README's "Writing a model" example runs as written, uses no deprecated API, is the model of
examples/custom_model.py, and gives the same bits on 2 ranks with either partitioner."""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import h5py
import pytest
from equivalence import assert_same_bits, h5_datasets

import agentsim as asim

ROOT = Path(__file__).resolve().parents[1]


def readme_example() -> str:
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Writing a model"):]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_the_readme_model_runs_as_written(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        namespace: dict = {"__name__": "readme"}
        exec(compile(readme_example(), "README.md", "exec"), namespace)
    result = namespace["result"]
    assert result.metrics["step"].tolist() == list(range(11))
    assert abs(result.metrics["msd"][-1] - 2 * 0.5**2 * 10) < 0.5  # 2 sigma^2 t
    assert "move" in capsys.readouterr().out
    with h5py.File(tmp_path / "walk.h5") as f:
        assert f.attrs["completed"] and f["metrics"]["msd"][-1] == result.metrics["msd"][-1]


def test_the_readme_model_is_the_custom_model_example():
    example = (ROOT / "examples" / "custom_model.py").read_text()
    code = [line.split("#")[0].rstrip() for line in readme_example().splitlines()]
    defining = [line for line in code[:code.index("result = asim.run(walk, agents=1000, steps=10, seed=1, "
                                                  'params={"sigma": 0.5}, out="walk.h5")')] if line.strip()]
    body = [line.split("#")[0].rstrip() for line in example.splitlines()]
    missing = [line for line in defining if line not in body and not line.startswith("def msd(state)")]
    assert not missing, missing


@pytest.mark.timeout(120)
@pytest.mark.parametrize("partition", ["data", "spatial"])
def test_the_readme_model_gives_the_same_bits_on_2_ranks(tmp_path, monkeypatch, partition):
    monkeypatch.syspath_prepend(str(ROOT / "examples"))  # the workers import custom_model:walk
    from custom_model import walk

    one, two = str(tmp_path / "one.h5"), str(tmp_path / "two.h5")
    ref = asim.run(walk, agents=600, steps=8, seed=3, params={"sigma": 2.0}, out=one, every=4)
    got = asim.run(walk, agents=600, steps=8, seed=3, params={"sigma": 2.0}, out=two, every=4, nprocs=2,
                   partition=partition)
    assert got.world_size == 2 and got.state is None
    assert_same_bits(ref.metrics, got.metrics, "metrics")
    assert_same_bits(h5_datasets(one), h5_datasets(two), "file")
    assert "move" in got.plan() and "ms/step" in got.plan()




def test_the_readme_links_point_at_files_that_exist():
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", (ROOT / "README.md").read_text())
    local = [link for link in links if "://" not in link]
    assert len(local) >= 20 and all((ROOT / link).is_file() for link in local), \
        [link for link in local if not (ROOT / link).is_file()]
