"""The ``agentsim`` command line (:mod:`agentsim.cli.main`)."""
