"""What both partitioners keep of the halos: the rows of the current substep and the step's figures."""

from __future__ import annotations

from collections.abc import Mapping

from torch import Tensor

from ..substep import Substep
from .comm import row_counts

__all__ = ["HaloBook"]


class HaloBook:
    """Halo rows by population for the substep being run, and the halo figures of the step.

    Attributes:
        halo_rows, halo_bytes: Halo rows and bytes this rank received during the current step.
    """

    def __init__(self) -> None:
        self._halo: dict[str, dict[str, Tensor]] = {}
        self.halo_rows = 0
        self.halo_bytes = 0

    def keep_halo(self, population: str, rows: dict[str, Tensor]) -> None:
        """Keep the received ``rows`` of ``population`` for the substep and count them."""
        n, nbytes = row_counts(rows)
        self.halo_rows += n
        self.halo_bytes += nbytes
        self._halo[population] = rows

    def drop_halos(self) -> None:
        self._halo = {}

    def start_step(self) -> None:
        self.halo_rows = self.halo_bytes = 0

    def halo(self, population: str, substep: Substep) -> Mapping[str, Tensor] | None:
        """The other ranks' rows of ``population`` (uid and declared neighbor fields), or None."""
        return self._halo.get(population)
