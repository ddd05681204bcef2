"""Run configuration files (TOML, or YAML when PyYAML is installed).

A config file composes a model by substep name and sets its parameters and run
options. Every key is checked; a misspelled key is an error that names it. The keys are
fields of :class:`~agentsim.engine.spec.RunSpec` (``agentsim run`` builds one from the file
and its flags, the flags first).

Example ``sir.toml``::

    model = "sir"
    agents = 100000
    steps = 150
    seed = 1
    substeps = ["infect", "recover"]   # optional: order and choice of substeps
    record = ["person.status"]         # optional
    every = 10                         # optional
    out = "sir.h5"                     # optional
    nprocs = 2                         # optional: processes, as --nprocs (and partition,
    partition = "data"                 #   layout, balance_every, balance_threshold,
    sync_every = 1                     #   sync_every, timeout as their flags; bins, overlap)

    [params]
    beta = 0.04
"""

from __future__ import annotations

import os
import sys
from typing import Any

from agentsim.errors import ConfigError, OutputError, did_you_mean

KEYS = ("model", "agents", "steps", "seed", "device", "substeps", "params", "record", "every", "out",
        # multi-rank options (checked where they are used, as the command-line flags are)
        "nprocs", "partition", "layout", "balance_every", "balance_threshold", "bins", "overlap", "sync_every",
        "timeout",
        # checkpoints (as --checkpoint-every, --checkpoint-dir, --keep, --checkpoint-async, --max-restarts)
        "checkpoint_every", "checkpoint_dir", "keep", "checkpoint_async", "max_restarts",
        # the check mode (as --check)
        "check",
        # how this invocation runs (as --resume DIR; writing on into `out`; a progress bar): every
        # field of RunSpec.to_dict() is a key, so a spec saved as a file loads back
        "resume", "append", "progress")


MAX_BYTES = 1 << 20  # a config file's largest size (they hold a few dozen keys)
MAX_DEPTH = 16  # the deepest nesting of tables and lists in a config file


def _yaml_loader() -> Any:
    """PyYAML's safe loader without aliases (``*name``: a few hundred bytes of them expand to
    gigabytes) and with at most :data:`MAX_DEPTH` levels of nesting.
    """
    import yaml

    class Loader(yaml.SafeLoader):
        depth = 0

        def compose_node(self, parent: Any, index: Any) -> Any:
            if self.check_event(yaml.AliasEvent):
                mark = self.peek_event().start_mark
                raise yaml.YAMLError(f"aliases (*name) are not allowed in config files (line {mark.line + 1})")
            self.depth += 1
            try:
                if self.depth > MAX_DEPTH:
                    raise yaml.YAMLError(f"nested more than {MAX_DEPTH} levels deep")
                return super().compose_node(parent, index)
            finally:
                self.depth -= 1

    return Loader


def _check_plain(path: str, data: Any, where: str = "", depth: int = 0) -> None:
    """Nesting of at most :data:`MAX_DEPTH` levels and no NUL in any string (no path holds one)."""
    if depth > MAX_DEPTH:
        raise ConfigError(f"config file '{path}': nested more than {MAX_DEPTH} levels deep")
    if isinstance(data, str) and "\0" in data:
        raise ConfigError(f"config file '{path}': {where or 'a value'} holds a NUL character")
    items = data.items() if isinstance(data, dict) else enumerate(data) if isinstance(data, list) else ()
    for key, value in items:
        if isinstance(key, str) and "\0" in key:
            raise ConfigError(f"config file '{path}': a key holds a NUL character")
        _check_plain(path, value, f"'{key}'" if not where else f"{where}[{key!r:.40}]", depth + 1)


def _yaml_problem(e: Exception) -> str:
    """PyYAML's error in one line: the problem and where (its message quotes the lines around)."""
    if getattr(e, "reason", None) is not None:  # a ReaderError: a byte the YAML reader refuses
        return f"{e.reason} (byte {getattr(e, 'position', '?')})"  # type: ignore[attr-defined]
    problem = getattr(e, "problem", None) or getattr(e, "context", None) or str(e) or type(e).__name__
    mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
    where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
    return " ".join(str(problem).split())[:200] + where


def load_config(path: str | os.PathLike) -> dict[str, Any]:
    """Read and check a config file; returns a dict with keys from :data:`KEYS`.

    Raises:
        ConfigError: A malformed or oversized file (over :data:`MAX_BYTES`, nested deeper than
            :data:`MAX_DEPTH`, YAML aliases, NUL characters), an unknown key or a value of the
            wrong kind.
        OutputError: The file cannot be read.
    """
    path = os.fspath(path)
    suffix = os.path.splitext(path)[1].lower()
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_BYTES + 1)
    except OSError as e:
        raise OutputError(f"cannot read config file '{path}': {e.strerror}") from None
    if len(raw) > MAX_BYTES:
        raise ConfigError(f"config file '{path}': larger than {MAX_BYTES:,} bytes (a config holds a few keys)")
    if suffix == ".toml":
        if sys.version_info >= (3, 11):
            import tomllib
        else:  # pragma: no cover
            import tomli as tomllib
        try:
            data = tomllib.loads(raw.decode("utf-8"))
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
            raise ConfigError(f"malformed TOML in '{path}': {e}") from None
        except RecursionError:
            raise ConfigError(f"config file '{path}': nested more than {MAX_DEPTH} levels deep") from None
    elif suffix in (".yaml", ".yml"):
        try:
            import yaml
        except ImportError:
            raise ConfigError("YAML config files need PyYAML: pip install 'agentsim[yaml]' "
                              "(or use a .toml file)") from None
        try:
            loader = _yaml_loader()(raw)  # a SafeLoader: plain data only
            try:
                data = loader.get_single_data()
            finally:
                loader.dispose()
        except yaml.YAMLError as e:
            raise ConfigError(f"malformed YAML in '{path}': {_yaml_problem(e)}") from None
        except RecursionError:
            raise ConfigError(f"config file '{path}': nested more than {MAX_DEPTH} levels deep") from None
    else:
        raise ConfigError(f"config file '{path}': expected a .toml, .yaml or .yml file (got '{suffix or 'no suffix'}')")
    _check_plain(path, data)
    if not isinstance(data, dict):
        raise ConfigError(f"config file '{path}': expected a table of keys (got {type(data).__name__})")
    for key in data:
        if key not in KEYS:
            raise ConfigError(f"config file '{path}': unknown key '{key}' (valid: {', '.join(KEYS)})."
                              + did_you_mean(str(key), KEYS))
    data = {k: v for k, v in data.items() if v is not None}  # a YAML null (RunSpec.to_dict's None): not given
    if "params" in data and not isinstance(data["params"], dict):
        raise ConfigError(f"config file '{path}': 'params' must be a table of name = value")
    if "substeps" in data and not (isinstance(data["substeps"], list)
                                   and all(isinstance(s, str) for s in data["substeps"])):
        raise ConfigError(f"config file '{path}': 'substeps' must be a list of substep names")
    if "record" in data and isinstance(data["record"], str):
        data["record"] = [r for r in data["record"].split(",") if r.strip()]
    return data
