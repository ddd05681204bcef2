"""Population studies: many runs of one model over a parameter grid (or scenarios) times seeds.

- :func:`sweep` (one process, sequential, records in memory) for small studies;
- :class:`Study` for studies of hundreds of runs: a process pool (or, not built yet, Ray)
  runs them; each finished run goes into one HDF5 study file at once (flushed), so a study
  killed at any moment resumes with ``resume=True`` and runs only what is missing; failed
  runs are retried (worker deaths always, Python exceptions when asked) and recorded with
  their tracebacks; the file ends with a per-run summary and quantile bands per parameter
  combination. See :mod:`agentsim.study.study` and :mod:`agentsim.study.store`.
"""

from agentsim.study.store import StudyFile, read_study, study_status
from agentsim.study.study import Study, StudyError, StudyResult
from agentsim.study.sweep import grid, run_one, sweep

__all__ = ["Study", "StudyError", "StudyFile", "StudyResult", "grid", "read_study", "run_one", "study_status", "sweep"]
