#!/usr/bin/env bash
# An older commit's tree beside this one, for A/B benchmarks in the same run (same machine, same
# moment): bash benchmarks/ab_tree.sh COMMIT   ->   benchmarks/ab/ (git-ignored)
#
# Run a script with the older tree's agentsim, models and data (its kernels build at first use):
#   AB_ROOT=$PWD/benchmarks/ab PYTHONPATH=$PWD/benchmarks/ab:$PWD/benchmarks/ab/site \
#       python benchmarks/ab/benchmarks/bench_covid_scale.py ...
# On the device host: bash benchmarks/gpu_machine.sh covid-ab [ROUNDS], with the run tool's
# carry=["benchmarks/ab"].
set -euo pipefail
cd "$(dirname "$0")/.."
commit=${1:?usage: bash benchmarks/ab_tree.sh COMMIT}
rm -rf benchmarks/ab
mkdir -p benchmarks/ab/site
git archive "$commit" | tar -x -C benchmarks/ab
git rev-parse --short "$commit" > benchmarks/ab/COMMIT
cat > benchmarks/ab/site/sitecustomize.py <<'PY'
"""A/B runs: the older tree's agentsim with its models and data (an editable install maps those to its own)."""
import os

root = os.environ.get("AB_ROOT")
if root:
    import agentsim
    import agentsim.data
    import agentsim.models

    assert os.path.dirname(agentsim.__file__) == os.path.join(root, "agentsim"), agentsim.__file__
    agentsim.models.__path__[:] = [os.path.join(root, "models")]
    agentsim.data.__path__[:] = [os.path.join(root, "data")]
PY
echo "benchmarks/ab: $(cat benchmarks/ab/COMMIT)"
