"""User models from anywhere: ``module:ATTR`` imported from the working directory as ``python -m``
does, ``path/to/file.py:ATTR``, and worker processes (``nprocs=2``) that find the same model, also
a Model object whose first substep is defined in another module, and a script's ``__main__``."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import agentsim as asim
from agentsim.core.catalog import get_model
from agentsim.runner.launch import model_ref

# The substep and init live in one module, the model in another (as when a model reuses a library
# of substeps): worker processes must find the model by its own module, not its first substep's.
STEPS = """
import torch
import agentsim as asim


def move(ctx):
    w = ctx["walker"]
    w["x"] = w["x"] + ctx.params["rate"] * 2 * ctx.rng.uniform(w["uid"], "step", dtype=torch.float64)


def init(ic):
    uid = ic.uids("walker", ic.n_agents)
    ic.add("walker", uid=uid, x=torch.zeros(ic.n_agents, dtype=torch.float64))
    return asim.Box((10.0, 10.0))
"""
MODEL = """
import agentsim as asim
from {steps} import init, move

MODEL = asim.Model("{name}", params={{"rate": asim.Param(0.5, "growth per step", ge=0.0)}}, init=init,
                   substeps=[asim.Substep(move, writes=["walker.x"])])


@MODEL.metric(reduce="mean")
def x(state):
    return state["walker"]["x"]
"""
# The agentsim command with neither the working directory nor PYTHONPATH on sys.path (-I), as the
# installed `agentsim` script runs.
CLI = [sys.executable, "-I", "-c", "import sys; from agentsim.cli.main import main; sys.exit(main(sys.argv[1:]))"]


def write_model(where: Path, module: str, steps: str = "steps_lib", name: str = "walkers") -> None:
    where.mkdir(parents=True, exist_ok=True)
    (where / f"{steps}.py").write_text(textwrap.dedent(STEPS))
    (where / f"{module}.py").write_text(textwrap.dedent(MODEL.format(steps=steps, name=name)))


def run_in(directory: Path, argv: list[str]) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run(argv, cwd=directory, capture_output=True, text=True, timeout=240, env=env)


@pytest.mark.long
@pytest.mark.timeout(300)
def test_the_command_imports_a_model_from_the_working_directory_and_so_do_its_workers(tmp_path):
    write_model(tmp_path, "mymod")
    write_model(tmp_path / "lib", "filemod", steps="file_steps")
    for ref in ("mymod:MODEL", "lib/filemod.py:MODEL"):  # this process resolves it, then each worker
        out = tmp_path / f"{ref.split(':')[0].replace('/', '_')}.h5"
        proc = run_in(tmp_path, [*CLI, "run", ref, "--agents", "60", "--steps", "3", "--quiet", "--nprocs", "2",
                                 "--set", "rate=0.25", "--out", str(out)])
        assert proc.returncode == 0, (ref, proc.stderr)
        assert out.stat().st_size > 0


@pytest.mark.long
@pytest.mark.timeout(300)
def test_a_script_runs_its_module_level_model_on_two_processes_and_a_guarded_one_is_told_where_to_put_it(tmp_path):
    write_model(tmp_path, "unused")
    body = textwrap.dedent(MODEL.format(steps="steps_lib", name="script"))
    (tmp_path / "script.py").write_text(body + textwrap.dedent("""
        if __name__ == "__main__":
            two = asim.run(MODEL, agents=60, steps=3, nprocs=2, params={"rate": 0.3}).metrics["x"]
            one = asim.run(MODEL, agents=60, steps=3, params={"rate": 0.3}).metrics["x"]
            print("same" if (two == one).all() else f"differ: {two} {one}")
    """))
    guarded = "if __name__ == '__main__':\n" + textwrap.indent(body, "    ")
    (tmp_path / "guarded.py").write_text(guarded + "    asim.run(MODEL, agents=60, steps=3, nprocs=2)\n")
    proc = run_in(tmp_path, [sys.executable, "script.py"])
    assert proc.returncode == 0 and proc.stdout.strip() == "same", proc.stderr
    proc = run_in(tmp_path, [sys.executable, "guarded.py"])
    assert proc.returncode != 0
    assert "has no attribute 'MODEL'" in proc.stderr and "must be defined at module level in the script, outside " \
        "`if __name__ == \"__main__\":`" in proc.stderr, proc.stderr
    proc = run_in(tmp_path, [sys.executable, "-c", body + "asim.run(MODEL, agents=60, steps=3, nprocs=2)"])
    assert proc.returncode != 0 and "ConfigError: model 'script' is defined in an interactive session" in proc.stderr
    (tmp_path / "unguarded.py").write_text(body + "asim.run(MODEL, agents=60, steps=3, nprocs=2)\n")
    proc = run_in(tmp_path, [sys.executable, "unguarded.py"])
    assert proc.returncode != 0
    assert "a run on 2 processes is started at the module level of the script (" in proc.stderr, proc.stderr
    assert "unguarded.py:" in proc.stderr and "put the run under `if __name__ == \"__main__\":`" in proc.stderr
    assert "rank 0" not in proc.stderr  # refused before any worker started
    study = "asim.Study('study_script.py:MODEL', {'rate': [0.3]}, replicates=2, agents=60, steps=3)"
    (tmp_path / "study_script.py").write_text(body + study + ".run('s.h5', workers=2)\n")
    proc = run_in(tmp_path, [sys.executable, "study_script.py"])
    assert proc.returncode != 0 and "a study on a process pool is started at the module level of the script (" \
        in proc.stderr and "study_script.py:" in proc.stderr, proc.stderr
    assert not (tmp_path / "s.h5").exists()
    proc = subprocess.run([sys.executable, "-"], input=body + "asim.run(MODEL, agents=60, steps=3, nprocs=2)",
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "ConfigError: model 'script' is defined in an interactive session" in proc.stderr


@pytest.mark.timeout(300)
def test_a_model_object_is_found_by_its_own_module_not_its_first_substeps(tmp_path, monkeypatch):
    write_model(tmp_path, "um_model", steps="um_steps", name="um")
    monkeypatch.syspath_prepend(str(tmp_path))
    import um_model  # type: ignore[import-not-found]

    model = um_model.MODEL.configure(params={"rate": 0.3})
    assert model.substeps[0].fn.__module__ == "um_steps"
    assert model_ref(model) == ("um_model:MODEL", {"rate": 0.3}, ["move"])
    two = asim.run(model, agents=60, steps=3, nprocs=2).metrics["x"]
    one = asim.run(model, agents=60, steps=3).metrics["x"]
    assert (two == one).all()


def test_a_file_reference_is_absolute_for_the_workers_and_loads_its_file_once(tmp_path, monkeypatch):
    write_model(tmp_path / "deep", "um_file", steps="um_file_steps", name="um_file")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    model = get_model("deep/um_file.py:MODEL")
    assert get_model(str(tmp_path / "deep" / "um_file.py") + ":MODEL") is model  # one module, not two
    assert str(tmp_path / "deep") in sys.path  # so that its own imports (um_file_steps) work
    where = str(tmp_path / "deep" / "um_file.py")
    assert model_ref("deep/um_file.py:MODEL") == (f"{where}:MODEL", None, None)
    assert model_ref(model.configure(params={"rate": 0.1}))[0] == f"{where}:MODEL"


def test_module_references_put_the_working_directory_first_on_sys_path(tmp_path, monkeypatch):
    write_model(tmp_path, "um_cwd", steps="um_cwd_steps", name="um_cwd")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    assert get_model("um_cwd:MODEL").name == "um_cwd"
    assert sys.path[0] == str(tmp_path)


@pytest.mark.parametrize(("ref", "message"), [
    ("nowhere_module_xyz:MODEL", "cannot import model module 'nowhere_module_xyz': No module named "
                                 "'nowhere_module_xyz' (looked in the working directory DIR and sys.path"),
    ("needs_dep:MODEL", "cannot import model module 'needs_dep': it imports 'not_installed_dep_xyz', which is not "
                        "installed"),
    ("um_attr:MODLE", "module 'um_attr' (DIR/um_attr.py) has no attribute 'MODLE' (Models there: MODEL). Perhaps "
                      "you meant 'MODEL'?"),
    ("none.py:MODEL", "cannot read model file 'none.py': no such file"),
    ("2bad.py:MODEL", "model file '2bad.py': its name must be a Python module name (got '2bad'"),
    ("os.py:MODEL", "model file 'os.py': the module name 'os' is taken by"),
    ("um_attr.py", "unknown model 'um_attr.py' (a file names its model: 'um_attr.py:ATTR')"),
    ("um_attr:", "model 'um_attr:': expected 'package.module:ATTR' or 'path/to/file.py:ATTR' (got an empty "
                 "attribute)"),
])
def test_bad_references_say_what_was_expected(ref, message, tmp_path, monkeypatch):
    write_model(tmp_path, "um_attr", steps="um_attr_steps", name="um_attr")
    (tmp_path / "needs_dep.py").write_text("import not_installed_dep_xyz\n")
    for name in ("2bad.py", "os.py"):
        (tmp_path / name).write_text("")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    with pytest.raises(asim.ConfigError) as err:
        get_model(ref)
    assert message.replace("DIR", str(tmp_path)) in str(err.value)


def test_a_model_no_module_holds_cannot_go_to_workers_and_says_how_to_fix_it():
    def make() -> asim.Model:
        inner = asim.Model("inner")

        @inner.substep(writes=["a.x"])
        def step(ctx):
            pass

        return inner

    with pytest.raises(asim.ConfigError, match=r"model 'inner': cannot find it to import on the worker processes "
                                               r"\(no imported module holds it at module level\); define it at "
                                               r"module level and pass 'package.module:ATTR'"):
        model_ref(make())
