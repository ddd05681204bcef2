"""Native CPU kernels: C sources compiled once, bound by one table, with torch as the reference.

Nothing here imports the rest of agentsim; the layers above call these kernels through
:mod:`agentsim.core.ops` and the spaces, which fall back to torch where a kernel is not built.
"""
