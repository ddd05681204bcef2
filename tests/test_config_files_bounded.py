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


VALID = {
    "yaml": "model: sir\nagents: 1000\nsteps: 20\nseed: 3\nparams: {beta: 0.1, gamma: 0.05}\n"
            "record: [person.status]\nevery: 5\nout: run.h5\ncheckpoint_every: 10\n",
    "toml": 'model = "sir"\nagents = 1000\nsteps = 20\nseed = 3\nrecord = ["person.status"]\nevery = 5\n'
            'out = "run.h5"\n[params]\nbeta = 0.1\ngamma = 0.05\n',
    "yml": '{"model": "sir", "agents": 1000, "steps": 20, "seed": 3, "params": {"beta": 0.1, "gamma": 0.05}, '
            '"record": ["person.status"], "every": 5, "out": "run.h5"}',
}
_SPECIAL = [b"&a", b"*a", b"!!python/object:os.system", b"\x00", b"[", b"{", b"]]", b"\n  - ", b": ", b"\"",
            b"1e400", b"-1", b"nan", b"\xff\xfe", b"<<: *a", b"~", b"'", b"\t", b"9" * 30]


def _mutate(data: bytes, rng) -> bytes:
    """One random edit: a flipped bit, a deleted, repeated or inserted run of bytes, or a cut."""
    at = int(rng.integers(len(data) + 1))
    kind = int(rng.integers(5))
    if kind == 0 and data:
        at = min(at, len(data) - 1)
        return data[:at] + bytes([data[at] ^ (1 << int(rng.integers(8)))]) + data[at + 1:]
    if kind == 1:
        return data[:at] + data[at + int(rng.integers(1, 8)):]
    if kind == 2:
        return data[:at] + _SPECIAL[int(rng.integers(len(_SPECIAL)))] + data[at:]
    if kind == 3:
        span = data[at:at + int(rng.integers(1, 16))]
        return data[:at] + span * int(rng.integers(2, 50)) + data[at:]
    return data[:at]


def test_mutated_config_files_load_or_give_one_line_never_a_traceback(tmp_path):
    """600 random edits of valid YAML, TOML and JSON (as YAML) configs go through the loader and the run's
    checks (`agentsim run --config`, without running): each loads into a checked run, or is
    refused with a one-line AgentsimError; no other exception, no growth in memory."""
    from agentsim.cli.main import build_parser, run_spec
    from agentsim.errors import AgentsimError

    rng = __import__("numpy").random.default_rng(0)
    outcomes = {"checked": 0, "refused": 0}
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    for trial in range(600):
        suffix = list(VALID)[trial % 3]
        data = VALID[suffix].encode()
        for _ in range(int(rng.integers(1, 4))):
            data = _mutate(data, rng)
        path = tmp_path / f"c{trial}.{suffix}"
        path.write_bytes(data)
        try:
            run_spec(build_parser().parse_args(["run", "--config", str(path)]), load_config(path))
            outcomes["checked"] += 1
        except AgentsimError as e:
            text = str(e)
            assert "\n" not in text and len(text) < 600, (data, text[:600])
            outcomes["refused"] += 1
    assert outcomes["refused"] >= 100 and outcomes["checked"] >= 20, outcomes
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss < 200_000  # KiB
