"""Every docstring example in agentsim/ and models/ (installed as agentsim.models) runs and prints what it shows."""

import doctest
import importlib
import pkgutil
from pathlib import Path

import agentsim.models
import pytest

import agentsim

ROOT = Path(__file__).resolve().parents[1]


def module_names():
    for pkg in (agentsim, agentsim.models):  # agentsim.models is mapped from models/, not under agentsim/
        yield pkg.__name__
        for info in pkgutil.walk_packages(pkg.__path__, prefix=pkg.__name__ + "."):
            if info.name.endswith("__main__"):
                continue
            yield info.name


@pytest.mark.parametrize("name", sorted(module_names()))
def test_docstring_examples(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0, f"{result.failed} doctest failures in {name}"
