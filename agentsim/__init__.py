"""agentsim: PyTorch-native agent-based simulation."""
__version__ = "0.1.0"
