"""Environment layers as distributed state: how writes from several processes combine.

Every process holds every environment tensor (``state.env``) whole, and the engine keeps the
copies identical: after a substep that writes env layers and runs on agents (it declares a
field of some population), each process finds the cells its own run changed and every
process applies every process's changes with the layer's declared *combine*:

- ``"set"`` (the default): a changed cell takes the value it was changed to. Processes that
  change the same cell must change it to the same value (compared bit for bit); otherwise the
  step stops with an error that names the substep, the layer and the cell, and says what to
  declare instead. Right for "each agent writes its own cell" (harvest a patch, mark a cell)
  and for updates every process computes alike from ``ctx.neighbors`` (wolf-sheep's grazing).
- ``"add"``: the changes add up. An integer layer is written as usual and ``new = old + sum over
  processes (new_p - old)`` (integer addition is exact and order-free): counts, visits. A float
  layer changes only through :meth:`ctx.deposit(layer, cells, amounts)
  <agentsim.core.context.Context.deposit>`: each amount is rounded to a multiple of ``2**-24``
  (:data:`DEPOSIT_FRAC_BITS`) and the amounts are summed per cell exactly, in int64, over the
  agents and the processes; after the substep every cell becomes ``old + sum`` (one rounding to
  the layer's dtype), the same bits on any number of processes. Right for consuming and
  depositing continuous quantities (food eaten, pheromone laid). The substep reads the layer as
  it was before its deposits.
- ``"min"`` / ``"max"``: the elementwise minimum / maximum of the changed values and the old
  one; a process that raises a cell under ``"min"`` (lowers it under ``"max"``) is an error.

A substep that touches no population (``grass_regrow``: env in, env out) computes the same
thing on every process from the same copies and is not merged. On one process all of this is
the identity: the substep's writes are the result.

Declare it on the substep: ``@model.substep(writes=["env.pheromone"], combine={"env.pheromone":
"add"})``.

Examples:
    >>> import torch
    >>> old = torch.tensor([5, 5, 5, 5])
    >>> cells, values = torch.tensor([0, 2, 2]), torch.tensor([1, 6, 7])   # two processes changed cell 2
    >>> merged, conflict = merge_layer(old, cells, values, "add")
    >>> merged.tolist(), conflict
    ([1, 5, 8, 5], None)
    >>> merge_layer(old, cells, values, "set")[1]
    2
"""

from __future__ import annotations

import torch
from torch import Tensor

from agentsim.core.substep import COMBINES
from agentsim.errors import ConfigError

__all__ = ["COMBINES", "DEPOSIT_FRAC_BITS", "DEPOSIT_LIMIT", "add_deposits", "changed_cells", "check_combine_dtype",
           "deposit_layer", "merge_layer", "raised_cells"]

#: Fractional bits of a float layer's deposits: each amount is a multiple of ``2**-24`` (about 6e-8).
DEPOSIT_FRAC_BITS = 24
#: The largest magnitude of one deposit, about 1e9 (a cell's sum must stay below ``2**38``, about 2.7e11).
DEPOSIT_LIMIT = 2.0 ** 30


def deposit_layer(dtype: torch.dtype, combine: str) -> bool:
    """Whether a layer of ``dtype`` with ``combine`` changes through deposits (a float layer that adds)."""
    return combine == "add" and dtype.is_floating_point


def add_deposits(layer: Tensor, total: Tensor) -> Tensor:
    """``layer`` plus the deposits ``total`` (``[layer.numel()]`` int64 in multiples of
    ``2**-DEPOSIT_FRAC_BITS``): computed in float64, rounded once to the layer's dtype.
    """
    added = layer.reshape(-1).to(torch.float64) + total.to(torch.float64) * 2.0 ** -DEPOSIT_FRAC_BITS
    return added.to(layer.dtype).reshape(layer.shape)


def check_combine_dtype(substep: str, name: str, combine: str, dtype: torch.dtype) -> None:
    """Refuse a combine that cannot be exact for a layer of ``dtype`` (``"add"`` on bools or complex)."""
    if combine == "add" and (dtype.is_complex or dtype == torch.bool):
        raise ConfigError(
            f"substep '{substep}': combine 'add' for env.{name} needs an integer or a float layer (got {dtype}): "
            "count in an integer layer, or keep the default 'set'")


def _bits(t: Tensor) -> Tensor:
    """The values of ``t`` as integers of the same width (so -0.0 != 0.0 and NaN == the same NaN)."""
    if t.dtype == torch.bool:
        return t
    if t.dtype.is_floating_point:
        width = {2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]
        return t.detach().contiguous().view(width)
    return t


def changed_cells(old: Tensor, new: Tensor) -> Tensor:
    """``[m]`` int64 flat indices of the cells whose bits differ between ``old`` and ``new``
    (same shape and dtype).
    """
    return torch.nonzero(_bits(old.reshape(-1)) != _bits(new.reshape(-1))).reshape(-1)


def raised_cells(old: Tensor, new: Tensor, cells: Tensor, combine: str) -> Tensor:
    """``[m]`` bool over the changed ``cells``: True where the change breaks a ``"min"`` (raised) or
    ``"max"`` (lowered) combine; all False for the others.
    """
    if combine not in ("min", "max"):
        return torch.zeros(cells.shape, dtype=torch.bool, device=cells.device)
    o, n = old.reshape(-1)[cells], new.reshape(-1)[cells]
    return n > o if combine == "min" else n < o


def merge_layer(old: Tensor, cells: Tensor, values: Tensor, combine: str) -> tuple[Tensor, int | None]:
    """Apply every process's changes to a layer.

    Args:
        old: The layer before the substep, any shape (the same on every process).
        cells: ``[m]`` int64 flat indices changed by some process (a cell may repeat: one row
            per process that changed it), in any order.
        values: ``[m]`` the values they were changed to.
        combine: One of :data:`COMBINES`.

    Returns:
        ``(merged, conflict)``: the new layer (``old``'s shape and dtype; the same whatever the
        order of the rows), and, for ``"set"``, the first cell changed to two different values
        (None if there is none).
    """
    flat = old.reshape(-1)
    conflict = None
    if combine == "set":
        if cells.numel() > 1:
            order = torch.argsort(cells, stable=True)
            c, v = cells[order], _bits(values[order])
            clash = (c[1:] == c[:-1]) & (v[1:] != v[:-1])
            if bool(clash.any()):
                conflict = int(c[1:][clash].min())
        merged = flat.clone()
        merged[cells] = values.to(flat.dtype)
    elif combine == "add":
        merged = flat.clone().index_add_(0, cells, values.to(flat.dtype) - flat[cells])
    else:
        merged = flat.clone().scatter_reduce_(0, cells, values.to(flat.dtype), "amin" if combine == "min" else "amax",
                                              include_self=True)
    return merged.reshape(old.shape), conflict
