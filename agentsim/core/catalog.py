"""Where models come from: the built-in reference models by name, or a user model as
``module:ATTR`` or ``path/to/file.py:ATTR``.

A user module is imported as ``python -m`` would import it: the current working directory goes
first on ``sys.path`` (unless it is already there), so ``agentsim run mymod:MODEL`` finds
``./mymod.py`` without ``PYTHONPATH=.``. A file is loaded as a module named after its stem, with
its directory put first on ``sys.path`` so that its own imports work. Both stay on ``sys.path``,
as they would under ``python -m``; worker processes started with the ``spawn`` method get a copy
of it (and the same working directory).

Examples:
    >>> sorted(BUILTIN)
    ['boids', 'circles', 'covid', 'flu', 'randomwalk', 'schelling', 'sir', 'spillover', 'sugarscape', 'wolfsheep']
    >>> get_model("sir").name
    'sir'
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from types import ModuleType

from agentsim.core.model import Model
from agentsim.errors import ConfigError, did_you_mean

__all__ = ["BUILTIN", "get_model", "is_file_reference", "module_reference"]

BUILTIN: dict[str, str] = {
    "sir": "agentsim.models.sir:MODEL",
    "boids": "agentsim.models.boids:MODEL",
    "schelling": "agentsim.models.schelling:MODEL",
    "wolfsheep": "agentsim.models.wolfsheep:MODEL",
    "randomwalk": "agentsim.models.randomwalk:MODEL",
    "spillover": "agentsim.models.spillover:MODEL",
    "flu": "agentsim.models.flu:MODEL",
    "circles": "agentsim.models.circles:MODEL",
    "sugarscape": "agentsim.models.sugarscape:MODEL",
    "covid": "agentsim.models.covid:MODEL",
}

# Modules this process loaded from a file (module name -> absolute path): a reference to a model
# in one names the file, so that a worker process loads the same file.
_FILES: dict[str, str] = {}


def get_model(name: str) -> Model:
    """A built-in model by name, or a user model: ``"package.module:ATTR"`` (imported with the
    working directory first on ``sys.path``, as ``python -m`` does) or ``"path/to/file.py:ATTR"``
    (the file loaded as a module named after its stem, its directory first on ``sys.path``).

    Raises:
        ConfigError: an unknown name, a module or file that cannot be found, a missing attribute,
            or an attribute that is not a :class:`~agentsim.core.model.Model`.
    """
    target = BUILTIN.get(name)
    if target is None:
        if not isinstance(name, str) or ":" not in name:
            hint = f" (a file names its model: '{name}:ATTR')" if str(name).endswith(".py") else ""
            raise ConfigError(f"unknown model '{name}'{hint} (valid: {', '.join(BUILTIN)}; or "
                              "'package.module:ATTR' or 'path/to/file.py:ATTR' for your own)."
                              + did_you_mean(str(name), BUILTIN))
        target = name
    where, _, attr = target.rpartition(":")  # rpartition: a file path may hold ':' itself
    if not where or not attr:
        raise ConfigError(f"model '{name}': expected 'package.module:ATTR' or 'path/to/file.py:ATTR' "
                          f"(got an empty {'module' if not where else 'attribute'})")
    module = _load_file(where) if is_file_reference(where) else _import(where, user=target is name)
    if not hasattr(module, attr):
        models = sorted(k for k, v in vars(module).items() if isinstance(v, Model))
        origin = getattr(module, "__file__", None)
        raise ConfigError(f"module '{module.__name__}'{f' ({origin})' if origin else ''} has no attribute "
                          f"'{attr}' (Models there: {', '.join(models) or 'none'})." + did_you_mean(attr, models)
                          + _main_hint(module))
    model = getattr(module, attr)
    if not isinstance(model, Model):
        raise ConfigError(f"'{target}' is not an agentsim Model (got {type(model).__name__})")
    return model


def is_file_reference(where: str) -> bool:
    """Whether the part before ``:ATTR`` names a file (ends with ``.py`` or holds a path separator)."""
    return where.endswith(".py") or "/" in where or os.sep in where


def module_reference(module: ModuleType, attr: str) -> str:
    """The reference :func:`get_model` resolves to ``module.attr`` in another process: the file
    for a module loaded from a file by :func:`get_model`, else ``module:ATTR``.
    """
    path = _FILES.get(module.__name__)
    if path is not None and getattr(module, "__file__", None) == path:
        return f"{path}:{attr}"
    return f"{module.__name__}:{attr}"


def _put_first_on_path(directory: str) -> None:
    """Put ``directory`` first on ``sys.path`` unless it is there already ('' stands for the cwd)."""
    there = {os.path.abspath(p or os.curdir) for p in sys.path}
    if os.path.abspath(directory) not in there:
        sys.path.insert(0, directory)


def _import(module_name: str, user: bool) -> ModuleType:
    """Import ``module_name``; a user's (not a built-in model's) with the working directory on ``sys.path``."""
    if user:
        _put_first_on_path(os.getcwd())
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        missing = e.name or ""
        if missing and module_name != missing and not module_name.startswith(missing + "."):
            raise ConfigError(f"cannot import model module '{module_name}': it imports '{missing}', which is not "
                              f"installed ({e})") from None
        raise ConfigError(f"cannot import model module '{module_name}': {e} (looked in the working directory "
                          f"{os.getcwd()} and sys.path; a file is named 'path/to/file.py:ATTR')") from None


def _load_file(path: str) -> ModuleType:
    """Load ``path`` as a module named after its stem (once: a second call gives the same module)."""
    full = os.path.abspath(path)
    if not os.path.isfile(full):
        why = "a directory" if os.path.isdir(full) else "no such file"
        raise ConfigError(f"cannot read model file '{path}': {why} (expected 'path/to/file.py:ATTR', the path "
                          f"relative to the working directory {os.getcwd()})")
    name = os.path.splitext(os.path.basename(full))[0]
    if not name.isidentifier():
        raise ConfigError(f"model file '{path}': its name must be a Python module name (got '{name}'; "
                          "letters, digits and '_', not starting with a digit)")
    loaded = sys.modules.get(name)
    if loaded is not None:
        there = getattr(loaded, "__file__", None)
        if there is not None and os.path.exists(there) and os.path.samefile(there, full):
            _FILES.setdefault(name, there)
            return loaded
        raise ConfigError(f"model file '{path}': the module name '{name}' is taken by "
                          f"{there or 'a built-in module'}; rename the file")
    _put_first_on_path(os.path.dirname(full))
    spec = importlib.util.spec_from_file_location(name, full)
    if spec is None or spec.loader is None:
        raise ConfigError(f"cannot load model file '{path}' as a Python module (expected a .py file)")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # before running it, as import does (dataclasses, pickling look it up)
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    _FILES[name] = full
    return module


def _main_hint(module: ModuleType) -> str:
    """For a script's model that a worker process cannot find: where it must be defined."""
    if module.__name__ not in ("__main__", "__mp_main__"):
        return ""
    return (" A model used by worker processes (nprocs > 1) must be defined at module level in the script, "
            "outside `if __name__ == \"__main__\":`, which workers do not run")
