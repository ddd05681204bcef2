"""The model layer: parameters, agent state, substeps, contexts, random draws, ops, metrics,
env layers, policies and the Model itself. Imports only :mod:`agentsim.errors` and
:mod:`agentsim._native`.
"""
