"""Static undirected contact networks in CSR form, and generators for them.

Modules: :mod:`.network` (the :class:`Graph` and its CSR construction),
:mod:`.generators` (Erdős–Rényi, Watts–Strogatz, layered contacts) and
:mod:`.edgelist` (a two-column edge-list reader).

A :class:`Graph` stores an undirected simple graph as a symmetric adjacency in
compressed sparse row (CSR) form: the neighbors of node ``u`` are
``indices[indptr[u]:indptr[u + 1]]``, sorted ascending. Every undirected edge
``{u, v}`` appears twice, as ``v`` in the row of ``u`` and ``u`` in the row of
``v``; there are no self-loops and no duplicate edges. An optional ``layer``
tensor, aligned with ``indices``, gives each directed entry a small integer
layer id (household, workplace, ...), the same in both directions.

Generators (all vectorized; no Python loop over nodes, households or
workplaces) draw every random number from :class:`agentsim.core.random.CounterRNG`
at ``step = 0`` with ids ``arange(...)`` of the edges or nodes being drawn, so a
graph is a pure function of its arguments and seed:

* :func:`erdos_renyi`: ``m = round(n * mean_degree / 2)`` uniform endpoint pairs;
* :func:`watts_strogatz`: a ring lattice whose edges are rewired with
  probability ``p``;
* :func:`layered_contacts`: households (cliques), workplaces (random graphs
  inside random groups) and a community layer (Erdős–Rényi);
* :func:`from_edge_list_csv`: read a two-column edge list.

Construction (:meth:`Graph.from_edges`) packs each directed pair into one int64
key with bit fields ``(u, v, layer)`` and sorts the keys with NumPy (whose
integer sort is several times faster than ``torch.sort`` on CPU); duplicates are
then adjacent and the first copy holds the smallest layer id. Graphs too large
for that key (``n_nodes > 2**30``) fall back to ``numpy.lexsort``. Construction runs on the CPU; the
result is moved to the device of the input.

Examples:
    >>> import torch
    >>> g = Graph.from_edges(torch.tensor([0, 1, 1, 2]), torch.tensor([1, 0, 2, 2]), n_nodes=4)
    >>> g.indptr.tolist(), g.indices.tolist()
    ([0, 1, 3, 4, 4], [1, 0, 2, 1])
    >>> g.n_edges, g.degree().tolist()
    (2, [1, 2, 1, 0])
    >>> g.neighbor_sum(torch.tensor([1.0, 10.0, 100.0, 1000.0])).tolist()
    [10.0, 101.0, 10.0, 0.0]
    >>> ring = watts_strogatz(6, k=2, p=0.0, seed=0)
    >>> ring.indices.tolist()
    [1, 5, 0, 2, 1, 3, 2, 4, 3, 5, 0, 4]
    >>> er = erdos_renyi(1000, mean_degree=4.0, seed=1)
    >>> 3.9 < er.degree().double().mean().item() <= 4.0
    True
"""

from __future__ import annotations

from agentsim.space.graph.edgelist import from_edge_list_csv
from agentsim.space.graph.generators import LAYERED_NAMES, erdos_renyi, layered_contacts, watts_strogatz
from agentsim.space.graph.network import Graph

__all__ = ["LAYERED_NAMES", "Graph", "erdos_renyi", "from_edge_list_csv", "layered_contacts", "watts_strogatz"]
