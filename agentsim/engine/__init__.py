"""The engine: one :class:`~agentsim.engine.simulation.Simulation` that runs a model's substeps
step by step on one process or, with a partitioner from :mod:`agentsim.distributed`, on many.
"""

from agentsim.engine.simulation import RunResult, Simulation

__all__ = ["RunResult", "Simulation"]
