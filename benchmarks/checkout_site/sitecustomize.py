"""Run a checkout's own reference models (used by ``bench_ab.py`` and ``bench_peers.py``).

The models live in the top-level ``models/`` folder and install as ``agentsim.models``. A checkout
put first on ``PYTHONPATH`` brings its own ``agentsim``, but ``agentsim.models`` is not a folder
inside it, so an editable install of another tree would supply it: an A/B of two commits would
run one tree's models on both engines. With ``AGENTSIM_CHECKOUT_MODELS=<checkout>/models`` set,
this makes ``agentsim.models`` that folder. Python imports ``sitecustomize`` at start-up from
the first folder on ``sys.path`` that has one; the benchmarks put this folder on ``PYTHONPATH``.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from collections.abc import Sequence
from types import ModuleType

_MODELS = os.environ.get("AGENTSIM_CHECKOUT_MODELS")


class _CheckoutModels(importlib.abc.MetaPathFinder):
    def find_spec(self, name: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if name != "agentsim.models" or not _MODELS:
            return None
        return importlib.util.spec_from_file_location(name, os.path.join(_MODELS, "__init__.py"),
                                                      submodule_search_locations=[_MODELS])


if _MODELS:
    sys.meta_path.insert(0, _CheckoutModels())
