"""Sphinx configuration of agentsim's documentation.

Build (from the repository root, with ``pip install -e ".[docs]"``)::

    python -m sphinx -W --keep-going -b html docs docs/_build/html

Tutorials and how-to guides are MyST notebooks (Markdown with ``{code-cell}`` blocks) that
myst-nb executes during the build: a cell that raises fails the build, so they cannot rot.
The API reference is generated from the package's ``__all__`` lists (``_ext/api_pages.py``),
the command-line reference from the argument parser (sphinx-argparse), and the benchmarks page
from ``benchmarks/results/*.json`` (``_ext/benchmarks_page.py``).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "_ext"))

import agentsim  # noqa: E402

project = "agentsim"
author = "the agentsim developers"
copyright = "2026, the agentsim developers"
release = agentsim.__version__
version = ".".join(release.split(".")[:2])

extensions = [
    "myst_nb",
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.napoleon",
    "sphinxarg.ext",
    "api_pages",
    "benchmarks_page",
]

exclude_patterns = ["_build", "**.ipynb_checkpoints", "README.md"]
source_suffix = {".md": "myst-nb", ".rst": "restructuredtext"}
root_doc = "index"

# MyST
# No math extension: formulas are written in Unicode, so pages read the same offline (MathJax would
# load from a CDN); docs/check_reference.py refuses a page that loads a script from the network.
myst_enable_extensions = ["colon_fence", "deflist", "fieldlist"]
myst_heading_anchors = 3

# Notebooks: executed at every build from scratch (cached between builds in the output folder), a
# failing cell fails the build; one torch thread per kernel keeps runs comparable on small machines.
nb_execution_mode = os.environ.get("AGENTSIM_DOCS_EXECUTE", "cache")
nb_execution_timeout = 900
nb_execution_raise_on_error = True
nb_execution_show_tb = True
nb_execution_in_temp = True
nb_merge_streams = True
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TQDM_DISABLE", "1")  # `!agentsim ...` cells run under a terminal: no progress bars

# autodoc: Google-style docstrings (napoleon); type hints shown in the description
autodoc_default_options = {"members": True, "show-inheritance": False, "member-order": "bysource"}
autodoc_typehints = "description"
autodoc_typehints_description_target = "documented"
autodoc_class_signature = "separated"
autosummary_generate = False
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False

html_theme = "furo"
html_title = f"agentsim {release}"
suppress_warnings = ["mystnb.unknown_mime_type"]
napoleon_use_ivar = True  # "Attributes:" sections as fields, not a second description of each property
myst_ref_domains = ["std", "py"]  # Markdown links resolve to pages and Python objects only
