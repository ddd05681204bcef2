"""Config files from elsewhere are bounded (issue 58): YAML aliases, deep nesting, NUL characters and
oversized files are refused with one line, before anything expands, recurses or reaches a path.
"""

from __future__ import annotations

import resource

import pytest

from agentsim.cli.main import main
from agentsim.errors import ConfigError
from agentsim.io.config import MAX_BYTES, load_config

yaml = pytest.importorskip("yaml")

BOMB = "\n".join(["a: &a [x, x, x, x, x, x, x, x, x, x]"]
                 + [f"{chr(98 + i)}: &{chr(98 + i)} [" + ", ".join([f"*{chr(97 + i)}"] * 10) + "]" for i in range(6)]
                 + ["model: randomwalk", "params: {huge: *g}"])


@pytest.mark.parametrize(("name", "text", "message"), [
    ("bomb.yaml", BOMB, "aliases (*name) are not allowed in config files"),
    ("deep.yaml", "model: randomwalk\nparams: " + "[" * 5000 + "]" * 5000, "nested more than 16 levels deep"),
    ("deep.toml", 'model = "randomwalk"\nx = ' + "[" * 5000 + "]" * 5000, "nested more than 16 levels deep"),
    ("nul.yaml", 'model: randomwalk\nout: "run\\0.h5"', "'out' holds a NUL character"),
    ("nul.toml", 'model = "randomwalk"\nout = "run\\u0000.h5"', "'out' holds a NUL character"),
    ("big.toml", 'model = "randomwalk"\n' + "#" * MAX_BYTES, f"larger than {MAX_BYTES:,} bytes"),
])
def test_a_hostile_config_file_is_refused_with_one_line(tmp_path, capsys, name, text, message):
    path = tmp_path / name
    path.write_text(text)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(ConfigError, match="config file|malformed") as refused:
        load_config(path)
    assert message in str(refused.value) and len(str(refused.value)) < 400
    assert main(["run", "--config", str(path), "--steps", "1", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.splitlines()) == 1 and len(err) < 400, err[:400]
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss < 200_000  # KiB: nothing expanded


def test_plain_configs_with_nesting_and_strings_still_load(tmp_path):
    path = tmp_path / "ok.yaml"
    path.write_text("model: sir\nagents: 1000\nparams: {beta: 0.1}\nrecord: [person.status]\nout: run.h5\n")
    assert load_config(path) == {"model": "sir", "agents": 1000, "params": {"beta": 0.1},
                                 "record": ["person.status"], "out": "run.h5"}
