"""Check a built documentation site: every public name of agentsim has a reference entry.

Usage (after ``python -m sphinx -b html docs docs/_build/html``)::

    python docs/check_reference.py docs/_build/html

Reads the site's ``objects.inv`` and requires an entry for every name in the ``__all__`` of each
module of ``_ext/api_pages.PUBLIC_MODULES`` (at that module or at the module that documents the
same object first), and that every agentsim module with an ``__all__`` that is a package's public
face (a package ``__init__`` or a module the reference lists) is listed; and that no page loads a
script or a stylesheet from the network (the site reads the same offline). Exits 1 naming what is
missing.
"""

from __future__ import annotations

import importlib
import pkgutil
import re
import sys
from pathlib import Path

from sphinx.util.inventory import InventoryFile

sys.path.insert(0, str(Path(__file__).resolve().parent / "_ext"))

from api_pages import PUBLIC_MODULES, public_names


def documented_names(site: Path) -> set[str]:
    """Every Python object name in the site's inventory."""
    with open(site / "objects.inv", "rb") as f:
        inventory = InventoryFile.load(f, "", lambda base, uri: uri)
    return {name for kind, entries in inventory.items() if kind.startswith("py:") for name in entries}


def public_packages() -> list[str]:
    """Every agentsim package (an ``__init__``) that declares an ``__all__``."""
    import agentsim

    found = ["agentsim"]
    for info in pkgutil.walk_packages(agentsim.__path__, "agentsim."):
        if info.ispkg and not info.name.startswith(("agentsim._", "agentsim.models")):
            if hasattr(importlib.import_module(info.name), "__all__"):
                found.append(info.name)
    return found


def missing(site: Path) -> list[str]:
    """The public names without a reference entry, and packages missing from PUBLIC_MODULES."""
    names = documented_names(site)
    problems = [f"package {p} has an __all__ but is not in docs/_ext/api_pages.PUBLIC_MODULES"
                for p in public_packages() if p not in PUBLIC_MODULES]
    first: dict[int, str] = {}
    for module_name in PUBLIC_MODULES:
        module = importlib.import_module(module_name)
        for name in public_names(module):
            obj = getattr(module, name)
            full = f"{module_name}.{name}"
            home = first.setdefault(id(obj), full)
            if full not in names and home not in names:
                problems.append(f"{full}: no reference entry")
    return problems


_REMOTE = re.compile(r"<(?:script|link)\b[^>]*\b(?:src|href)=\"((?:https?:)?//[^\"]+\.(?:js|css)[^\"]*)\"")


def remote_assets(site: Path) -> list[str]:
    """``page: url`` for every script or stylesheet a page of the site loads from the network."""
    return [f"{page.relative_to(site)}: loads {url} from the network (the site must read offline)"
            for page in sorted(site.rglob("*.html")) for url in _REMOTE.findall(page.read_text(errors="replace"))]


def main(argv: list[str]) -> int:
    """Check the site at ``argv[0]``; print what is missing."""
    if len(argv) != 1:
        print(__doc__)
        return 2
    problems = missing(Path(argv[0])) + remote_assets(Path(argv[0]))
    for p in problems:
        print(p)
    total = sum(len(public_names(importlib.import_module(m))) for m in PUBLIC_MODULES)
    print(f"check_reference: {total} public names in {len(PUBLIC_MODULES)} modules, "
          f"{len(problems)} problem{'s' if len(problems) != 1 else ''}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
