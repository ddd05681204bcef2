"""Property-based tests (hypothesis) of the parsers a user's input goes through: config files,
run options, model parameters (typed values and --set strings) and edge-list CSVs. Every input
is either accepted with the value it spells or refused with a ConfigError (an OutputError for a
file that cannot be read): never another exception."""

from __future__ import annotations

import math
import os
import tempfile
from pathlib import Path

import numpy as np
import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import agentsim as asim  # noqa: E402
from agentsim.distributed.process_group import check_timeout  # noqa: E402
from agentsim.engine.simulation import check_agents, check_seed, check_steps  # noqa: E402
from agentsim.errors import ConfigError, OutputError  # noqa: E402
from agentsim.io.checkpoint import check_keep  # noqa: E402
from agentsim.io.config import KEYS, load_config  # noqa: E402
from agentsim.io.recording import check_every  # noqa: E402

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

scalars = st.one_of(st.integers(-10**6, 10**6), st.floats(allow_nan=True, allow_infinity=True), st.booleans(),
                    st.text(max_size=12))
toml_scalars = st.one_of(st.integers(-10**6, 10**6), st.floats(allow_nan=False, allow_infinity=False),
                         st.booleans(), st.text(alphabet=st.characters(codec="utf-8", exclude_categories=["Cs", "Cc"]),
                                                max_size=12))


def toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    raise TypeError(v)


def write_toml(d: dict) -> str:
    lines = [f"{k} = {toml_value(v)}" for k, v in d.items() if not isinstance(v, dict)]
    for k, v in d.items():
        if isinstance(v, dict):
            lines.append(f"[{k}]")
            lines += [f"{kk} = {toml_value(vv)}" for kk, vv in v.items()]
    return "\n".join(lines) + "\n"


keys = st.one_of(st.sampled_from(KEYS), st.from_regex(r"[a-z_]{1,10}", fullmatch=True))
configs = st.dictionaries(keys, st.one_of(toml_scalars, st.lists(toml_scalars, max_size=3),
                                          st.dictionaries(st.from_regex(r"[a-z_]{1,8}", fullmatch=True), toml_scalars,
                                                          max_size=3)), max_size=6)


@SETTINGS
@given(configs)
def test_a_config_file_is_read_as_written_or_refused_with_a_config_error(config):
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "run.toml"
        path.write_text(write_toml(config))
        valid = (set(config) <= set(KEYS) and isinstance(config.get("params", {}), dict)
                 and (not isinstance(config.get("substeps"), (str, int, float, bool, dict)) or "substeps" not in config)
                 and all(isinstance(s, str) for s in config.get("substeps", [])))
        try:
            got = load_config(path)
        except ConfigError:
            assert not valid
            return
        assert valid
        want = dict(config)
        if isinstance(want.get("record"), str):
            want["record"] = [r for r in want["record"].split(",") if r.strip()]
        assert got == want


@SETTINGS
@given(st.binary(max_size=200), st.sampled_from([".toml", ".yaml", ".json", ""]))
def test_any_bytes_as_a_config_file_are_read_or_refused_cleanly(data, suffix):
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "run" + suffix)
        with open(path, "wb") as f:
            f.write(data)
        try:
            assert isinstance(load_config(path), dict)
        except ConfigError:
            pass


@SETTINGS
@given(scalars)
def test_run_options_are_an_exact_number_or_a_config_error(value):
    is_int = isinstance(value, int) and not isinstance(value, bool)
    for check, ok in [(check_agents, is_int and value >= 1), (check_steps, is_int and value >= 0),
                      (check_seed, is_int and 0 <= value < 2**63), (check_every, is_int and value >= 1),
                      (check_keep, is_int and value >= 1)]:
        try:
            got = check(value)
        except ConfigError:
            assert not ok, (check.__name__, value)
            continue
        assert ok and got == value, (check.__name__, value)
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    try:
        got = check_timeout(value)
    except ConfigError:
        assert not (number and value > 0)
    else:
        assert number and value > 0 and got == float(value)


MODELS = {name: asim.get_model(name) for name in ("sir", "boids", "schelling", "randomwalk")}
PARAMS = [(m, p) for m, model in MODELS.items() for p in model.param_table]


def _spec(model: str, name: str):
    return MODELS[model].param_table[name]


@SETTINGS
@given(st.sampled_from(PARAMS), st.one_of(scalars, st.text(alphabet="0123456789.-+eEinfa ", max_size=8),
                                          st.sampled_from(["nan", "inf", "-inf", "1e400", " 3 ", "", "0x10", "1_000",
                                                           float("nan"), float("inf"), 10**30, -0.0])))
def test_a_parameter_is_accepted_within_its_declaration_or_refused(param, value):
    model, name = param
    spec = _spec(model, name)
    try:
        got = MODELS[model].configure(params={name: value}).params[name]
    except ConfigError:
        return
    assert isinstance(got, spec.type) and not (isinstance(got, bool) and spec.type is not bool)
    if spec.type is float:
        assert not math.isnan(got)
    if spec.type in (int, float):
        assert spec.ge is None or got >= spec.ge
        assert spec.gt is None or got > spec.gt
        assert spec.le is None or got <= spec.le
        assert spec.lt is None or got < spec.lt
    if spec.choices is not None:
        assert got in spec.choices
    if isinstance(value, str) and spec.type in (int, float):
        assert got == spec.type(value.strip()) or got == spec.type(value)


@SETTINGS
@given(st.lists(st.tuples(st.integers(-2, 12), st.integers(-2, 12)), max_size=25), st.sampled_from([",", " ", "\t"]),
       st.booleans())
def test_an_edge_list_gives_the_graph_it_lists_or_names_its_bad_line(pairs, sep, header):
    n = 10
    text = ("source" + sep + "target\n" if header else "") + "".join(f"{u}{sep}{v}\n" for u, v in pairs)
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "edges.csv"
        path.write_text(text)
        bad = (any(u < 0 or v < 0 or u >= n or v >= n or u == v for u, v in pairs)
               or len(set(pairs)) < len(pairs))
        try:
            graph = asim.from_edge_list_csv(path, n_nodes=n)
        except ConfigError as e:
            assert bad, str(e)
            assert "line " in str(e)
            return
        assert not bad
        want = sorted({(u, v) for u, v in pairs} | {(v, u) for u, v in pairs})
        indptr, indices = graph.indptr.numpy(), graph.indices.numpy()
        got = sorted((int(u), int(indices[k])) for u in range(n) for k in range(indptr[u], indptr[u + 1]))
        assert got == want


@SETTINGS
@given(st.text(max_size=80))
def test_any_text_as_an_edge_list_is_read_or_refused_cleanly(text):
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "edges.csv"
        path.write_bytes(text.encode("utf-8", errors="replace"))
        try:
            graph = asim.from_edge_list_csv(path, n_nodes=50)
        except (ConfigError, OutputError):
            return
        assert graph.n_nodes == 50 and np.all(np.diff(graph.indptr.numpy()) >= 0)
