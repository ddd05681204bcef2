"""Input and output: HDF5 trajectories (:mod:`.hdf5`) and what a run records (:mod:`.recording`).

Reading a trajectory file written by a run:

- :func:`read_trajectory` returns a :class:`Trajectory`: metrics as numpy arrays, agent and
  environment frames one at a time (numpy or torch); needs only h5py.
- :func:`read_metrics` returns the metrics as a pandas DataFrame indexed by step.
- :func:`read_frames` returns one population's recorded frames as an xarray Dataset
  (dims ``step`` and ``uid``).

The last two need pandas and xarray: ``pip install "agentsim[analysis]"``.
"""

from agentsim.io.hdf5 import Trajectory, read_trajectory
from agentsim.io.tables import read_frames, read_metrics

__all__ = ["Trajectory", "read_frames", "read_metrics", "read_trajectory"]
