"""Read a graph from a two-column edge-list file (CSV or whitespace separated)."""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator

import numpy as np
import torch

from agentsim.errors import ConfigError, OutputError
from agentsim.space.graph.network import Graph, build_csr, check_int

__all__ = ["from_edge_list_csv"]


def _data_lines(path: str, skip: int) -> Iterator[tuple[int, str]]:
    """``(line number, text)`` of the data lines after the first ``skip`` lines."""
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if lineno <= skip:
                continue
            text = line.split("#", 1)[0].strip()
            if text:
                yield lineno, text


def _has_non_ascii(path: str) -> bool:
    """Whether the file has a byte >= 0x80 (read in blocks)."""
    with open(path, "rb") as f:
        while block := f.read(1 << 24):
            if int(np.frombuffer(block, dtype=np.uint8).max()) >= 0x80:
                return True
    return False


def _ascii_data_lines(path: str, skip: int) -> Iterator[str]:
    """The data lines after the first ``skip``, comments taken out, for ``np.loadtxt``, up to the
    first that has a character outside ASCII (numpy's reader misreads some, as numbers or worse;
    node ids are ASCII digits): there a ValueError, and the caller names the line.
    """
    for _, text in _data_lines(path, skip):
        if not text.isascii():
            raise ValueError("a character outside ASCII")
        yield text


def _split(text: str, delimiter: str | None) -> list[str]:
    return [s.strip() for s in text.split(delimiter)]


def _parse_row(text: str, delimiter: str | None) -> tuple[int, int] | None:
    if not text.isascii():  # (int() reads other scripts' digits too)
        return None
    fields = _split(text, delimiter)
    if len(fields) != 2:
        return None
    try:
        return int(fields[0]), int(fields[1])
    except ValueError:
        return None


def _bad_line(path: str, skip: int, delimiter: str | None) -> tuple[int, str] | None:
    for lineno, text in _data_lines(path, skip):
        if _parse_row(text, delimiter) is None:
            return lineno, text
    return None


def _line_of_row(path: str, skip: int, row: int) -> tuple[int, str]:
    for i, item in enumerate(_data_lines(path, skip)):
        if i == row:
            return item
    raise AssertionError("row beyond the data lines")  # pragma: no cover


def _check_loops_and_repeats(name: str, skip: int, src: np.ndarray, dst: np.ndarray, n_nodes: int) -> None:
    """Raise a ConfigError naming the first self-loop, or the first line that repeats an earlier
    edge (the same ``source,target``; the reverse direction is allowed).
    """
    loops = np.flatnonzero(src == dst)
    if loops.size:
        lineno, text = _line_of_row(name, skip, int(loops[0]))
        raise ConfigError(f"Edge list {name!r}, line {lineno}: a self-loop ({text!r}); a node is not its own "
                          "contact: remove the line")
    key = src * n_nodes + dst
    order = np.argsort(key, kind="stable")
    repeat = order[1:][key[order[1:]] == key[order[:-1]]]  # rows whose edge an earlier row has
    if repeat.size:
        row = int(repeat.min())
        earlier = int(np.flatnonzero(key == key[row])[0])
        lineno, text = _line_of_row(name, skip, row)
        line0, _ = _line_of_row(name, skip, earlier)
        raise ConfigError(f"Edge list {name!r}, line {lineno}: the edge {text!r} repeats line {line0}; "
                          "remove the repeat")


def from_edge_list_csv(path: str | os.PathLike[str], n_nodes: int | None = None, directed: bool = False) -> Graph:
    """Read a graph from a two-column edge list.

    Format: one edge ``source,target`` per line (comma- or whitespace-separated,
    decided by the first data line), integer node ids; an optional header line
    (a first line whose fields are not integers, e.g. ``source,target``) is
    skipped, as are blank lines and ``#`` comments. A self-loop (``u,u``) and a
    line that repeats an earlier one are errors: in a contact network they are
    almost always a mistake in the file, and silently dropping them would change
    the degrees a user believes the file has.

    Args:
        path: The file.
        n_nodes: Number of nodes; default ``max id + 1``.
        directed: If False (default) each line is an undirected edge, given in
            one or both directions. If True the lines are arcs of a directed
            graph that must be symmetric (every ``(u, v)`` has its ``(v, u)``),
            and an asymmetric file is an error; :class:`Graph` holds undirected
            graphs only, so this is a check, not a different result.

    Returns:
        The :class:`Graph` (CPU).

    Raises:
        OutputError: The file is missing or unreadable.
        ConfigError: A malformed line (a missing column, a non-integer or NaN id), a
            negative id, an id ``>= n_nodes``, a self-loop, a repeated edge, or an
            asymmetric file with ``directed=True`` (the message names the line).
    """
    name = os.fspath(path)
    if n_nodes is not None:
        n_nodes = check_int("n_nodes", n_nodes, 1)
    if not os.path.isfile(name):
        raise OutputError(f"Cannot read edge list {name!r}: no such file")
    try:
        first = next(_data_lines(name, 0), None)
        skip = 0
        delimiter: str | None = None
        if first is not None:
            delimiter = "," if "," in first[1] else None
            if _parse_row(first[1], delimiter) is None and not any(
                s.lstrip("+-").isdigit() for s in _split(first[1], delimiter)
            ):
                skip = first[0]  # a header: no field is an integer
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "input contained no data"
            try:
                if _has_non_ascii(name):  # (only comments and a header may have such characters)
                    arr = np.loadtxt(_ascii_data_lines(name, skip), delimiter=delimiter, comments=None,
                                     dtype=np.int64, ndmin=2)
                else:
                    arr = np.loadtxt(name, delimiter=delimiter, comments="#", dtype=np.int64, ndmin=2,
                                     skiprows=skip, encoding="utf-8")
            except ValueError:
                arr = None
        if arr is None or (arr.size and arr.shape[1] != 2):
            bad = _bad_line(name, skip, delimiter)
            if bad is None:  # pragma: no cover - loadtxt and the scan disagree
                raise ConfigError(f"Malformed edge list {name!r}: expected two integer columns")
            raise ConfigError(
                f"Malformed edge list {name!r}, line {bad[0]}: expected two integer columns "
                f"'source{delimiter or ' '}target' (got {bad[1]!r})"
            )
    except (OSError, UnicodeDecodeError) as exc:
        raise OutputError(f"Cannot read edge list {name!r}: {exc}") from exc
    arr = arr.reshape(-1, 2)
    src, dst = arr[:, 0], arr[:, 1]
    if arr.size:
        neg = np.flatnonzero((src < 0) | (dst < 0))
        if neg.size:
            lineno, text = _line_of_row(name, skip, int(neg[0]))
            raise ConfigError(f"Edge list {name!r}, line {lineno}: expected node ids >= 0 (got {text!r})")
    if n_nodes is None:
        if arr.size == 0:
            raise ConfigError(f"Edge list {name!r} has no edges: pass n_nodes to build an empty graph")
        n_nodes = int(arr.max()) + 1
    elif arr.size:
        big = np.flatnonzero((src >= n_nodes) | (dst >= n_nodes))
        if big.size:
            lineno, text = _line_of_row(name, skip, int(big[0]))
            raise ConfigError(
                f"Edge list {name!r}, line {lineno}: expected node ids < n_nodes = {n_nodes} (got {text!r})"
            )
    if arr.size:
        _check_loops_and_repeats(name, skip, src, dst, n_nodes)
    if directed and arr.size:
        arcs = src[src != dst] * n_nodes + dst[src != dst]
        rev = dst * n_nodes + src
        missing = np.flatnonzero((src != dst) & ~np.isin(rev, arcs))
        if missing.size:
            lineno, text = _line_of_row(name, skip, int(missing[0]))
            raise ConfigError(
                f"Edge list {name!r}, line {lineno}: directed=True needs a symmetric edge list, "
                f"but the reverse of {text!r} is missing (pass directed=False to symmetrize)"
            )
    return build_csr(torch.from_numpy(np.ascontiguousarray(arr.T)), n_nodes, None, ())

