"""Sphinx extension placeholder: replaced by the benchmarks page generator."""

from __future__ import annotations

from typing import Any


def setup(app: Any) -> dict[str, Any]:
    """Nothing yet."""
    return {"parallel_read_safe": True}
