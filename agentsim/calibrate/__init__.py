"""Calibration: fit model parameters to an observed time series, and the gradient estimators
that a fit can use (see :mod:`~agentsim.calibrate.estimators`).
"""

from agentsim.calibrate.api import calibrate
from agentsim.calibrate.data import Series, read_series
from agentsim.calibrate.fit import METHODS, FitResult, fit, plot_fit
from agentsim.calibrate.objective import LOSSES, Objective, loss_value

__all__ = ["LOSSES", "METHODS", "FitResult", "Objective", "Series", "calibrate", "fit", "loss_value", "plot_fit",
           "read_series"]
