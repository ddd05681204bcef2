"""Running a model: :func:`~agentsim.runner.api.run` in one call, worker processes
(:mod:`agentsim.runner.launch`), scaling benchmarks and the invariance check.
"""
