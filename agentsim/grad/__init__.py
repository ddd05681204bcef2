"""Gradients through runs: differentiable collectives, relaxed random draws, and the
backward pass through a rollout. Above :mod:`agentsim.core`, below the engine.
"""
