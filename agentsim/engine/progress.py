"""Progress bars: tqdm on a terminal, nothing when stderr is not one (logs stay clean)."""

from __future__ import annotations

import sys
from typing import Any

__all__ = ["progress_bar"]


def progress_bar(total: int, enabled: bool, unit: str) -> Any:
    """A tqdm bar of ``total`` ``unit``s, or None when disabled, empty or stderr is not a terminal."""
    if not enabled or total < 1 or not sys.stderr.isatty():
        return None
    from tqdm import tqdm

    return tqdm(total=total, unit=unit, leave=False)
