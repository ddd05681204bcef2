"""Where models come from: the built-in reference models by name, or any ``module:ATTR``.

Examples:
    >>> sorted(BUILTIN)
    ['boids', 'circles', 'flu', 'randomwalk', 'schelling', 'sir', 'spillover', 'wolfsheep']
    >>> get_model("sir").name
    'sir'
"""

from __future__ import annotations

import importlib

from .errors import ConfigError, did_you_mean
from .model import Model

BUILTIN: dict[str, str] = {
    "sir": "agentsim.models.sir:MODEL",
    "boids": "agentsim.models.boids:MODEL",
    "schelling": "agentsim.models.schelling:MODEL",
    "wolfsheep": "agentsim.models.wolfsheep:MODEL",
    "randomwalk": "agentsim.models.randomwalk:MODEL",
    "spillover": "agentsim.models.spillover:MODEL",
    "flu": "agentsim.models.flu:MODEL",
    "circles": "agentsim.models.circles:MODEL",
}


def get_model(name: str) -> Model:
    """A built-in model by name, or ``"package.module:ATTR"`` for a user model."""
    target = BUILTIN.get(name)
    if target is None:
        if ":" not in name:
            raise ConfigError(f"unknown model '{name}' (valid: {', '.join(BUILTIN)}; "
                              "or 'package.module:ATTR' for your own)." + did_you_mean(name, BUILTIN))
        target = name
    module_name, _, attr = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        raise ConfigError(f"cannot import model module '{module_name}': {e}") from None
    model = getattr(module, attr, None)
    if not isinstance(model, Model):
        raise ConfigError(f"'{target}' is not an agentsim Model (got {type(model).__name__})")
    return model
