"""Agent state: populations as structs of ``[n, ...]`` tensors, plus environment fields.

A :class:`State` holds one :class:`Population` per agent type (``"wolf"``,
``"sheep"``, ...) and an ``env`` dict of environment tensors (grid layers such as
grass, global scalars). A population is a dict of tensors keyed by field name,
all with the same first dimension ``n``, each with a declared dtype and trailing
shape (:class:`FieldSpec`), and always an int64 ``uid`` column that identifies an
agent for the whole run.

Nothing here depends on row order: uids, not row positions, identify agents, and
new uids are assigned from the sorted parent uids (:meth:`Population.spawn`), so a
population split over several ranks gets the same uids as on one.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

import torch
from torch import Tensor

from agentsim.core.ops import flatnonzero, take_rows
from agentsim.errors import ConfigError, FieldAccessError, did_you_mean

UID = "uid"


@dataclass(frozen=True)
class FieldSpec:
    """Declared dtype and per-agent shape of a field (``shape=()`` for a scalar per agent)."""

    dtype: torch.dtype
    shape: tuple[int, ...] = ()


def converted(what: str, value: Tensor, dtype: torch.dtype) -> Tensor:
    """``value`` in the field's ``dtype``, where that loses nothing a model would not expect: from
    bool, from a narrower type of the same kind, from an integer into a float. A float into an
    integer field, or a wider float or integer into a narrower one (float64 into float32: the
    value would be rounded without a word), raises a FieldAccessError that says how to convert.
    """
    if value.dtype == dtype:
        return value
    got, want = value.dtype, dtype
    if got.is_floating_point and not want.is_floating_point:
        raise FieldAccessError(f"{what}: expected dtype {want} (got {got}); convert explicitly "
                               "(e.g. with .round().to(...))")
    if torch.bool not in (got, want) and got.is_floating_point == want.is_floating_point:
        bits = (lambda t: torch.finfo(t).bits) if got.is_floating_point else (lambda t: torch.iinfo(t).bits)
        if bits(got) > bits(want):
            raise FieldAccessError(
                f"{what}: expected dtype {want} (got {got}); writing it would round or wrap the values without a "
                f"word. Convert explicitly (.to({want})) or give the field the wider dtype in init")
    return value.to(dtype)


class Population:
    """Agents of one type: a struct of tensors ``[n, *spec.shape]`` keyed by field.

    Args:
        name: Population name (``"sheep"``).
        specs: Field name to :class:`FieldSpec`; ``uid`` is added (int64) if absent.
        fields: Initial tensors; must hold every declared field and ``uid``.
        next_uid: The first uid that births will use (default ``max(uid) + 1``).
    """

    def __init__(
        self,
        name: str,
        specs: Mapping[str, FieldSpec],
        fields: Mapping[str, Tensor],
        next_uid: int | None = None,
    ) -> None:
        self.name = name
        self.specs = dict(specs)
        self.specs.setdefault(UID, FieldSpec(torch.int64))
        missing = set(self.specs) - set(fields)
        extra = set(fields) - set(self.specs)
        if missing or extra:
            raise ConfigError(
                f"population '{name}': expected fields {sorted(self.specs)} "
                f"(missing {sorted(missing)}, undeclared {sorted(extra)})"
            )
        n = fields[UID].shape[0]
        self._fields: dict[str, Tensor] = {}
        for key in self.specs:
            self._fields[key] = self._checked(key, fields[key], n)
        uid = self._fields[UID]
        if next_uid is None:
            next_uid = int(uid.max()) + 1 if n else 0
        self.next_uid = next_uid

    def _checked(self, key: str, value: Tensor, n: int) -> Tensor:
        spec = self.specs[key]
        if not isinstance(value, Tensor):
            raise FieldAccessError(f"{self.name}.{key}: expected a tensor (got {type(value).__name__})")
        expected = (n, *spec.shape)
        if tuple(value.shape) != expected:
            raise FieldAccessError(
                f"{self.name}.{key}: expected shape {list(expected)} (got {list(value.shape)})"
            )
        return converted(f"{self.name}.{key}", value, spec.dtype)

    @property
    def n(self) -> int:
        """Number of agents (rows)."""
        return self._fields[UID].shape[0]

    def __len__(self) -> int:
        return self.n

    def __contains__(self, key: object) -> bool:
        return key in self._fields

    def __iter__(self) -> Iterator[str]:
        return iter(self._fields)

    def keys(self) -> list[str]:
        """The field names, ``uid`` included."""
        return list(self._fields)

    def __getitem__(self, key: str) -> Tensor:
        try:
            return self._fields[key]
        except KeyError:
            raise FieldAccessError(
                f"population '{self.name}' has no field '{key}' (fields: {sorted(self._fields)})."
                + did_you_mean(key, self._fields)
            ) from None

    def __setitem__(self, key: str, value: Tensor) -> None:
        if key not in self.specs:
            raise FieldAccessError(
                f"population '{self.name}' has no field '{key}' (fields: {sorted(self.specs)})."
                + did_you_mean(key, self.specs)
            )
        if key == UID:
            raise FieldAccessError("uid is assigned by the engine and cannot be written")
        self._fields[key] = self._checked(key, value, self.n)

    def fields(self) -> dict[str, Tensor]:
        """A shallow copy of the field dict."""
        return dict(self._fields)

    def select(self, names: Iterable[str]) -> dict[str, Tensor]:
        """``uid`` first, then the named fields (what a halo or a neighbor snapshot carries)."""
        return {UID: self[UID], **{k: self[k] for k in names if k != UID}}

    def keep(self, index_or_mask: Tensor) -> None:
        """Keep only the rows selected by a bool mask ``[n]`` or an index tensor (deaths)."""
        self._fields = self._rows(index_or_mask)

    def _rows(self, index_or_mask: Tensor) -> dict[str, Tensor]:
        """Every field's rows selected by a bool mask ``[n]`` or an index tensor (int64 index
        rows gathered by :func:`~agentsim.core.ops.take_rows`).
        """
        if isinstance(index_or_mask, Tensor) and index_or_mask.dtype == torch.bool and index_or_mask.dim() == 1:
            index_or_mask = flatnonzero(index_or_mask)  # (once, not a nonzero per field)
        if isinstance(index_or_mask, Tensor) and index_or_mask.dtype == torch.int64:
            return {k: take_rows(v, index_or_mask.to(v.device)) for k, v in self._fields.items()}
        return {k: v[index_or_mask] for k, v in self._fields.items()}

    def spawn(self, parent_uid: Tensor, fields: Mapping[str, Tensor], uid_offset: int | Tensor = 0,
              n_born_total: int | None = None) -> Tensor:
        """Append children, one per entry of ``parent_uid``; return their new uids.

        A child's uid is ``next_uid + uid_offset + k`` where ``k`` is the rank of its
        parent's uid among the sorted parents, so uids do not depend on row order.
        Distributed runs pass, per parent (``[m]`` int64), the number of smaller parent
        uids on other ranks as ``uid_offset`` and the global birth count as ``n_born_total``.

        Args:
            parent_uid: ``[m]`` int64, distinct uids of the parents.
            fields: Every declared field except ``uid``, each ``[m, ...]``.
        """
        m = parent_uid.shape[0]
        want = set(self.specs) - {UID}
        if set(fields) != want:
            raise FieldAccessError(
                f"spawn into '{self.name}': expected fields {sorted(want)} (got {sorted(fields)})"
            )
        order = torch.argsort(parent_uid, stable=True)
        rank = torch.empty_like(order)
        rank[order] = torch.arange(m, device=order.device)
        uid = self.next_uid + uid_offset + rank
        new = {UID: uid.to(torch.int64)}
        for k in want:
            new[k] = self._checked(k, fields[k], m)
        self._fields = {k: torch.cat([self._fields[k], new[k]]) for k in self._fields}
        self.next_uid += m if n_born_total is None else n_born_total
        return new[UID]

    def extend(self, fields: Mapping[str, Tensor], keep: Tensor | None = None) -> None:
        """Append rows that already have uids (agents arriving from another rank); every field needed.

        Args:
            fields: Every declared field, ``uid`` included, each ``[m, ...]``.
            keep: Optional ``[k]`` int64 rows to keep first (agents that stay), in one copy
                instead of :meth:`keep` then :meth:`extend`.
        """
        if set(fields) != set(self.specs):
            raise FieldAccessError(f"extend '{self.name}': expected fields {sorted(self.specs)} (got {sorted(fields)})")
        m = fields[UID].shape[0]
        new = {k: self._checked(k, fields[k].to(self._fields[k].device), m) for k in self._fields}
        if keep is not None and torch.is_grad_enabled() and any(v.requires_grad for v in self._fields.values()):
            self._fields = self._rows(keep.to(self._fields[UID].device))  # a differentiable run: no out= buffers
            keep = None
        if keep is None:
            self._fields = {k: torch.cat([v, new[k]]) for k, v in self._fields.items()}
            return
        keep = keep.to(self._fields[UID].device)
        k_rows = keep.shape[0]
        out: dict[str, Tensor] = {}
        for key, v in self._fields.items():  # the kept rows go straight into the result: one pass
            buf = v.new_empty((k_rows + m, *v.shape[1:]))
            take_rows(v, keep, out=buf[:k_rows])
            buf[k_rows:] = new[key]
            out[key] = buf
        self._fields = out

    def replace(self, fields: Mapping[str, Tensor]) -> None:
        """Replace every field at once, with a new number of rows (``uid`` included; each
        ``[m, ...]``): how a partitioner swaps in the population after agents left and came.
        """
        if set(fields) != set(self.specs):
            raise FieldAccessError(f"replace '{self.name}': expected fields {sorted(self.specs)} "
                                   f"(got {sorted(fields)})")
        m = fields[UID].shape[0]
        self._fields = {k: self._checked(k, fields[k], m) for k in self._fields}

    def permute(self, perm: Tensor) -> None:
        """Reorder rows (used by tests and partitioners; results never depend on row order)."""
        self._fields = self._rows(perm)

    def to(self, device: torch.device | str) -> Population:
        """Move every field to ``device`` (in place; returns the population)."""
        self._fields = {k: v.to(device) for k, v in self._fields.items()}
        return self

    def clone(self) -> Population:
        """A deep copy (every field cloned)."""
        out = Population.__new__(Population)
        out.name, out.specs, out.next_uid = self.name, dict(self.specs), self.next_uid
        out._fields = {k: v.clone() for k, v in self._fields.items()}
        return out

    def __repr__(self) -> str:
        cols = ", ".join(f"{k}:{str(s.dtype).removeprefix('torch.')}{list(s.shape) or ''}"
                         for k, s in self.specs.items())
        return f"Population('{self.name}', n={self.n}, fields=[{cols}])"


class State:
    """The whole simulation state: populations, environment tensors and the step counter.

    Args:
        populations: Population name to :class:`Population`.
        env: Environment name to tensor (grid layers ``[H, W]``, scalars ``[]``).
        step: Number of completed steps.
    """

    def __init__(self, populations: Mapping[str, Population], env: Mapping[str, Tensor] | None = None,
                 step: int = 0) -> None:
        self.populations = dict(populations)
        self.env = dict(env or {})
        self.step = step

    def __getitem__(self, name: str) -> Population:
        try:
            return self.populations[name]
        except KeyError:
            raise ConfigError(
                f"unknown population '{name}' (populations: {sorted(self.populations)})."
                + did_you_mean(name, self.populations)
            ) from None

    def to(self, device: torch.device | str) -> State:
        """Move every population and env tensor to ``device`` (in place; returns the state)."""
        for p in self.populations.values():
            p.to(device)
        self.env = {k: v.to(device) for k, v in self.env.items()}
        return self

    def clone(self) -> State:
        """A deep copy (every tensor cloned)."""
        return State({k: p.clone() for k, p in self.populations.items()},
                     {k: v.clone() for k, v in self.env.items()}, self.step)

    def __repr__(self) -> str:
        pops = ", ".join(f"{k}={p.n}" for k, p in self.populations.items())
        return f"State(step={self.step}, {pops}, env={sorted(self.env)})"
