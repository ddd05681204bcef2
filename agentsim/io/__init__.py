"""Input and output: HDF5 trajectories (:mod:`.hdf5`) and what a run records (:mod:`.recording`)."""
