"""Synthetic populations for epidemic models: people with ages in households, schools,
workplaces and community venues on a grid of localities (see :mod:`.synthetic`), drawn from
tables of public census-style figures (:mod:`.tables`), the same on any number of ranks.
"""

from agentsim.population.synthetic import (
    LAYERS,
    PARTITION_METHODS,
    Localities,
    Memberships,
    SyntheticPopulation,
    edge_cut,
    locality_grid,
    partition_localities,
    synthesize,
)
from agentsim.population.tables import AgePyramid, HouseholdSizes, PopulationTables

__all__ = ["LAYERS", "PARTITION_METHODS",
           "AgePyramid", "HouseholdSizes", "Localities", "Memberships", "PopulationTables",
           "SyntheticPopulation", "edge_cut", "locality_grid", "partition_localities", "synthesize"]
