"""The native kernels' sources, bindings and builds (agentsim/_native: sources.py, bindings.py, build.py):
the header against the bindings table, the generated constants against Python's, the library built
at install found and used (or refused when stale), the first-use build, and no library at all.

With AGENTSIM_REQUIRE_KERNELS=1 (CI) the tests that need a compiler fail instead of skipping."""

from __future__ import annotations

import ctypes
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from agentsim._native import bindings, rng, sources
from agentsim._native import build as native
from agentsim._native import kernels as cpu_kernels

ROOT = Path(__file__).resolve().parents[1]
REQUIRED = os.environ.get("AGENTSIM_REQUIRE_KERNELS") == "1"


def _strip_comments(text: str) -> str:
    return re.sub(r"/\*.*?\*/", " ", text, flags=re.S)


def _header() -> str:
    return _strip_comments((sources.SOURCE_DIR / sources.HEADER).read_text())


_C_TYPES = {"int64_t": ctypes.c_int64, "uint64_t": ctypes.c_uint64, "double": ctypes.c_double}


def _ctype(declared: str) -> type | None:
    """The ctypes type the bindings use for a C type (every pointer: c_void_p; ``const char *``: c_char_p)."""
    declared = " ".join(declared.replace("*", " * ").split())
    if declared == "void":
        return None
    if declared == "const char *":
        return ctypes.c_char_p
    if "*" in declared:
        return ctypes.c_void_p
    return _C_TYPES[declared]


def _prototypes() -> dict[str, tuple[type | None, list[tuple[str, type | None]]]]:
    """name -> (result type, [(argument name, type)]) of every function the header declares."""
    found = {}
    for m in re.finditer(r"([A-Za-z_][\w\s\*]*?)\b(agentsim_\w+)\s*\(([^)]*)\)\s*;", _header()):
        result, name, args = m.groups()
        parsed = []
        if args.strip() != "void":
            for arg in args.split(","):
                typ, arg_name = re.fullmatch(r"\s*(.*?[\s\*])(\w+)\s*", arg).groups()
                parsed.append((arg_name, _ctype(typ)))
        assert name not in found, f"{name} declared twice"
        found[name] = (_ctype(result), parsed)
    return found


def test_the_header_declares_what_the_bindings_table_binds():
    declared = _prototypes()
    assert sorted(declared) == sorted(bindings.FUNCTIONS)
    for name, signature in bindings.FUNCTIONS.items():
        result, args = declared[name]
        assert result == signature.result, name
        assert args == list(signature.args), name


def test_each_function_is_defined_in_the_source_its_entry_names():
    texts = {name: _strip_comments((sources.SOURCE_DIR / name).read_text()) for name in sources.SOURCES}
    for name, signature in bindings.FUNCTIONS.items():
        assert signature.source in texts, f"{name}: {signature.source} is not among {sources.SOURCES}"
        where = [file for file, text in texts.items() if re.search(rf"\b{name}\b", text)]
        assert where == [signature.source], f"{name} appears in {where}, the table says {signature.source}"


def test_the_radius_search_struct_is_the_headers():
    body = re.search(r"typedef struct agentsim_radius_search \{(.*?)\} agentsim_radius_search;", _header(), re.S)
    assert body is not None
    fields = []
    for decl in body.group(1).split(";"):
        if not decl.strip():
            continue
        typ, names = re.fullmatch(r"\s*((?:const\s+)?\w+)\s+(.*?)\s*", decl, re.S).groups()
        for item in names.split(","):
            m = re.fullmatch(r"\s*(\*?)\s*(\w+)(?:\[(\d+)\])?\s*", item)
            pointer, field, count = m.groups()
            ctype = ctypes.c_void_p if pointer or typ.endswith("void") else _C_TYPES[typ.replace("const ", "")]
            fields.append((field, ctype * int(count) if count else ctype))
    got = [(name, typ) for name, typ in bindings.RadiusSearch._fields_]
    assert [f for f, _ in got] == [f for f, _ in fields]
    for (name, want), (_, have) in zip(fields, got):
        assert ctypes.sizeof(want) == ctypes.sizeof(have) and getattr(want, "_type_", want) == getattr(
            have, "_type_", have), name


def test_the_generated_rng_constants_header_is_the_python_constants():
    committed = (sources.SOURCE_DIR / rng.CONSTANTS_HEADER).read_text()
    assert committed == rng.constants_header(), (
        "src/rng_constants.h differs from rng.constants_header(): regenerate it (see that function)")
    # and the header holds the constants themselves, exactly
    values = {name: [float.fromhex(v) for v in re.findall(r"-?0x[0-9a-f.]+p[-+]?\d+", block)] for name, block in
              re.findall(r"AGENTSIM_(\w+)\[AGENTSIM_\w+_LEN\] = \{(.*?)\}", committed, re.S)}
    assert values == {"LOG_Q": list(rng.LOG_Q), "COS_C": list(rng.COS_C), "SIN_C": list(rng.SIN_C)}
    assert f"AGENTSIM_LN2_LO {rng.LN2_LO.hex()}" in committed


@pytest.fixture(scope="module")
def library():
    lib = native.library()  # raises where AGENTSIM_REQUIRE_KERNELS=1 and there is none
    if lib is None:
        pytest.skip("no native kernel library here (no C compiler)")
    return lib


def test_a_call_with_the_wrong_number_of_arguments_is_refused(library):
    push = library["agentsim_push_count"]
    with pytest.raises(TypeError, match=r"agentsim_push_count\(indptr, indices, n_nodes, nodes, m, counts\) "
                                        r"takes 6 arguments, got 5"):
        push(0, 0, 0, 0, 0)
    with pytest.raises(TypeError, match="takes 2 arguments, got 3"):
        library["agentsim_is_iota"](0, 0, 0)
    with pytest.raises(KeyError, match="no native function 'agentsim_nope'"):
        library["agentsim_nope"]
    x = torch.arange(5)
    assert library["agentsim_is_iota"](x.data_ptr(), 5) == 1


def test_the_library_in_use_is_stamped_with_the_installed_sources(library):
    info = sources.parse_build_info(library.build_info())
    assert info["origin"] in ("install", "cache") and info["sources"] == sources.source_digest()
    status = native.library_status()
    assert status.active and status.path == str(library.path)
    if REQUIRED and os.environ.get("AGENTSIM_KERNELS") != "cache":
        # CI installs with a compiler: the library built at install is the one in use
        assert status.state == "installed", status


def _run(code: str, tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, "AGENTSIM_KERNEL_DIR": str(tmp_path / "cache"), **env}
    for name in ("AGENTSIM_REQUIRE_KERNELS", "AGENTSIM_KERNEL_LIBRARY", "AGENTSIM_KERNELS"):
        if name not in env:
            full.pop(name, None)
    return subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=full, capture_output=True, text=True,
                          timeout=600)


_STATUS = ("import warnings; warnings.simplefilter('error')\n"  # a warning would fail the child
           "import torch\n"
           "from agentsim._native import build, kernels\n"
           "from agentsim.space.graph import erdos_renyi\n"
           "g = erdos_renyi(3000, 4.0, seed=2)\n"
           "c = g.count_neighbors_in(torch.arange(0, 3000, 7))\n"
           "torch.save(c, 'counts.pt')\n"
           "s = build.library_status(); print(s.state); print(s.path); print(s.detail)\n")


def _compiler_or_skip() -> list[str]:
    """The C compiler's command (``CC``, else ``cc``); skipped without one (failed where required)."""
    command = shlex.split(os.environ.get("CC", "")) or ["cc"]
    if shutil.which(command[0]) is None and not REQUIRED:
        pytest.skip("no C compiler here")
    return command


def test_the_library_built_at_install_is_found_and_used(tmp_path):
    _compiler_or_skip()
    done = subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--build-lib", str(tmp_path / "lib"),
                           "--build-temp", str(tmp_path / "tmp")], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "AGENTSIM_REQUIRE_KERNELS": "1"}, timeout=600)
    assert done.returncode == 0, done.stderr
    built = list((tmp_path / "lib" / "agentsim" / "_native").glob(sources.LIBRARY_FILE))
    assert len(built) == 1, built
    # no compiler at run time: only the library built at install can give the kernels
    out = _run(_STATUS, tmp_path, AGENTSIM_KERNEL_LIBRARY=str(built[0]), CC=str(tmp_path / "no-such-cc"))
    assert out.returncode == 0, out.stderr
    state, path, detail = out.stdout.splitlines()
    assert (state, path) == ("installed", str(built[0])) and "origin=install" in detail
    want = _torch_counts()
    assert torch.equal(torch.load(tmp_path / "counts.pt"), want)


def _torch_counts() -> torch.Tensor:
    from agentsim.space.graph import erdos_renyi

    old = os.environ.get("AGENTSIM_KERNELS")
    os.environ["AGENTSIM_KERNELS"] = "0"
    try:
        return erdos_renyi(3000, 4.0, seed=2).count_neighbors_in(torch.arange(0, 3000, 7))
    finally:
        if old is None:
            del os.environ["AGENTSIM_KERNELS"]
        else:
            os.environ["AGENTSIM_KERNELS"] = old


@pytest.mark.long
def test_a_stale_installed_library_is_refused_and_the_kernels_built_on_first_use(tmp_path):
    compiler = _compiler_or_skip()
    stale = tmp_path / "stale.so"
    files = [str(sources.SOURCE_DIR / name) for name in sources.SOURCES]
    done = subprocess.run([*compiler, "-O0", "-std=c99", "-fPIC", "-shared", f"-I{sources.SOURCE_DIR}",
                           '-DAGENTSIM_BUILD_INFO="origin=install;sources=0123456789abcdef;cpu=portable"', *files,
                           "-o", str(stale), "-lm"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    out = _run(_STATUS, tmp_path, AGENTSIM_KERNEL_LIBRARY=str(stale))
    assert out.returncode == 0, out.stderr
    state, path, detail = out.stdout.splitlines()
    assert state == "cache" and path.startswith(str(tmp_path / "cache"))
    assert "was built from other sources (sources=0123456789abcdef" in detail
    assert torch.equal(torch.load(tmp_path / "counts.pt"), _torch_counts())


def test_without_a_library_or_a_compiler_one_warning_or_with_require_an_error(tmp_path):
    code = ("import warnings, torch\n"
            "from agentsim._native import build\n"
            "from agentsim.core import metrics\n"
            "from agentsim.core.random import CounterRNG\n"
            "with warnings.catch_warnings(record=True) as w:\n"
            "    warnings.simplefilter('always')\n"
            "    metrics._exact_sum(torch.linspace(-3, 3, 1001)); CounterRNG(1).normal(torch.arange(9), 0, 's')\n"
            "print(len([x for x in w if 'native CPU kernel library' in str(x.message)]))\n"
            "print(build.library_status().state)\n")
    no_cc = {"AGENTSIM_KERNELS": "cache", "CC": str(tmp_path / "no-such-cc")}
    out = _run(code, tmp_path, **no_cc)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["1", "unavailable"]
    out = _run(code, tmp_path, **no_cc, AGENTSIM_REQUIRE_KERNELS="1")
    assert out.returncode != 0
    assert "AGENTSIM_REQUIRE_KERNELS=1 requires the kernels" in out.stderr and "CC=" in out.stderr


def test_switched_off_the_status_says_so(monkeypatch):
    monkeypatch.setenv("AGENTSIM_KERNELS", "0")
    status = native.library_status()
    assert (status.state, status.active) == ("disabled", False) and "AGENTSIM_KERNELS=0" in status.detail
    assert cpu_kernels.is_iota(torch.arange(4)) is None
    assert rng.kernel() is None


def test_agentsim_info_reports_the_kernels(tmp_path):
    from agentsim.cli.info import collect, format_info

    facts = collect()
    assert set(facts["kernels"]) == {"state", "active", "path", "detail", "rng"}
    assert "native kernels: " + facts["kernels"]["state"] in format_info(facts)
    out = _run("from agentsim.cli.main import main; raise SystemExit(main(['info', '--require-kernels']))",
               tmp_path, AGENTSIM_KERNELS="0")
    assert out.returncode == 1 and "native CPU kernels are required but disabled" in out.stderr
