#!/usr/bin/env bash
# The issue-16 measurements on a machine with a CUDA GPU and many cores, from the repository root:
#
#   bash benchmarks/gpu_machine.sh gpu       # issue 31: CUDA tests (CPU = GPU bits), then every GPU figure of
#                                            # bench_gpu.py into benchmarks/results/<gpu>/gpu.json (< 8 min on an H100)
#   bash benchmarks/gpu_machine.sh cuda      # CUDA tests; boids, targets, SIR and circles suites on the GPU
#   bash benchmarks/gpu_machine.sh release   # 0.3: kernels built at install (-Werror), CUDA tests, layer/kernel/
#                                            # neighbor tests, neighbor_reduce boids benchmark on the CPU
#   bash benchmarks/gpu_machine.sh profile   # torch's profiler over boids 10k and circles 1M steps on the GPU
#   bash benchmarks/gpu_machine.sh sizes     # agent-updates/s at 10k..10M and SIR 100M memory, on the GPU
#   bash benchmarks/gpu_machine.sh scaling 1000000    # CPU strong scaling, boids and SIR (or $MODELS), W = 2, 4, 8
#   bash benchmarks/gpu_machine.sh scaling 10000000   # the same at 10M agents
#   bash benchmarks/gpu_machine.sh covid [R] # issue 32: covid strong scaling at 10M people over 120 days, one
#                                            # thread per process: W = 1 and 8 in R (default 3) alternating
#                                            # rounds, each W = 8 run followed by the host's ceiling (8
#                                            # independent processes of 1.25M people); about 80 s a round
#   bash benchmarks/gpu_machine.sh covid-sizes # the same at W = 16, 2, 4, once (about 1.5 min)
#   bash benchmarks/gpu_machine.sh covid-ab [R] # covid 10M, 120 days: W = 1 and 8 with this tree and W = 8
#                                            # with an older one (benchmarks/ab, made by ab_tree.sh and
#                                            # carried to the device), in R (default 3) alternating
#                                            # rounds; about 110 s a round
#   bash benchmarks/gpu_machine.sh covid-us  # the US (330M people) on 16 processes over 120 days (about 6.5 min)
#
# Results go to benchmarks/results/ (peers-*-cuda.json/md, scaling-*.json) and, where $OUT is set
# (the device tool's output folder), into one tar file there too. The peers run on the CPU only and are not installed on such a machine:
# the suites run agentsim's side alone (--agentsim-only); their figures are set beside the peers'
# measured on the 2-core host in benchmarks/LOG.md.
set -uo pipefail
export PYTHONUNBUFFERED=1
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
RESULTS=benchmarks/results
mkdir -p "$RESULTS"
save() { if [ -n "${OUT:-}" ]; then tar -cf "$OUT/$1.tar" "${@:2}"; fi; }

facts() {
    $PY -c "import agentsim.models" 2>/dev/null || $PY -m pip install -q --no-deps --no-build-isolation -e . >/dev/null
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null
    $PY -c "import os, torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'cores', os.cpu_count())"
    lscpu 2>/dev/null | grep -E "^(Model name|Socket|Core|Thread|NUMA node\(s\)|L3)" | tr -s " "
}

case "${1:-}" in
release)
    # A fresh machine with another compiler, CPU and Python: the install must build the C kernels
    # with warnings as errors and agentsim must load them (else this fails, as CI does).
    export AGENTSIM_REQUIRE_KERNELS=1 AGENTSIM_KERNELS_WERROR=1
    $PY -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -5
    facts
    $PY -m agentsim info --require-kernels | grep -iE "kernel|cuda|torch"
    $PY -m pytest -q -p no:cacheprovider -o addopts="" -m cuda tests/ 2>&1 | tail -8
    $PY -m pytest -q -p no:cacheprovider -o addopts="" tests/test_architecture.py tests/test_native_build.py \
        tests/test_cpu_kernels.py tests/test_neighbors.py tests/test_baselines.py 2>&1 | tail -4
    $PY benchmarks/bench_neighbors.py --rounds 5 --agents 10000 200000 --out "$RESULTS/neighbors-device.json" | tail -8
    save release "$RESULTS"/neighbors-device.json
    ;;
gpu)
    facts
    gpu=$($PY -c "import torch; print(torch.cuda.get_device_name().split()[1].lower())")
    mkdir -p "$RESULTS/$gpu"
    timeout 170 $PY -m pytest -q -p no:cacheprovider -o addopts="" -m cuda tests/ 2>&1 | tail -25
    timeout 400 $PY benchmarks/bench_gpu.py --parts steps bits ppo largest --out "$RESULTS/$gpu/gpu.json"
    if [ -n "${OUT:-}" ]; then cp "$RESULTS/$gpu/gpu.json" "$OUT/"; fi
    ;;
cuda)
    facts
    $PY -m pytest -q -p no:cacheprovider -o addopts="" -m cuda tests/ 2>&1 | tail -15
    for suite in boids targets sir circles; do
        $PY benchmarks/bench_peers.py "$suite" --device cuda --agentsim-only --rounds 3 --tag=-cuda | tail -4
    done
    save cuda "$RESULTS"/peers-*-cuda.*
    ;;
profile)
    facts
    $PY benchmarks/profile_step.py boids --agents 10000 --steps 20 --device cuda --rows 12 2>&1 | grep -v USDT
    $PY benchmarks/profile_step.py circles --agents 1000000 --steps 3 --device cuda --rows 12 2>&1 | grep -v USDT
    $PY benchmarks/bench_peers.py circles --device cuda --agentsim-only --rounds 3 --tag=-cuda | tail -3
    save profile "$RESULTS"/peers-circles-cuda.*
    ;;
sizes)
    facts
    $PY benchmarks/bench_peers.py sizes --device cuda --agentsim-only --rounds 1 --tag=-cuda | tail -24
    $PY benchmarks/bench_peers.py memory --device cuda --agentsim-only --rounds 1 --tag=-cuda | tail -4
    save sizes "$RESULTS"/peers-sizes-cuda.* "$RESULTS"/peers-memory-cuda.*
    ;;
scaling)
    facts
    # One torch thread per rank; W=1 and the ceilings (W independent processes, free and in
    # lockstep) are measured in the same rounds (agentsim.distributed.bench).
    agents=${2:-1000000}
    steps=$([ "$agents" -gt 1000000 ] && echo 2 || echo 5)
    for model in ${MODELS:-boids sir}; do
        for w in 2 4 8; do
            $PY benchmarks/bench_scaling.py $model --agents "$agents" --steps "$steps" --warmup 1 --nprocs "$w" \
                --repeats 1 --out "$RESULTS/scaling-$model-$agents-w$w.json" | head -6
            # appended one by one: a run cut off at its time limit keeps what was measured
            if [ -n "${OUT:-}" ]; then tar -rf "$OUT/scaling.tar" "$RESULTS/scaling-$model-$agents-w$w.json"; fi
        done
    done
    ;;
covid)
    facts
    # Each configuration in fresh processes; the JSON is rewritten after each run (a cut-off run keeps the
    # rest) and rank 0 prints its pace every 10 days. 10M people over the whole epidemic (120 days): W = 1
    # and 8 in alternating rounds (1 8, 8 1, 1 8, ...: the target, as a ratio of medians), with the ceiling.
    rounds=${2:-3}
    timeout $((100 * rounds + 30)) $PY benchmarks/bench_covid_scale.py --agents 10000000 --ranks 1 8 \
        --rounds "$rounds" --ceiling --days 120 --progress --out "$RESULTS/covid-ranks-10m-rounds.json"
    if [ -n "${OUT:-}" ]; then cp "$RESULTS/covid-ranks-10m-rounds.json" "$OUT/"; fi
    ;;
covid-sizes)
    facts
    timeout 150 $PY benchmarks/bench_covid_scale.py --agents 10000000 --ranks 16 2 4 --days 120 --progress \
        --out "$RESULTS/covid-ranks-10m.json"
    if [ -n "${OUT:-}" ]; then cp "$RESULTS/covid-ranks-10m.json" "$OUT/"; fi
    ;;
covid-ab)
    facts
    [ -d benchmarks/ab ] || { echo "no benchmarks/ab: make it with benchmarks/ab_tree.sh COMMIT and carry it" >&2; exit 2; }
    rounds=${2:-3}
    ab="--agents ${AB_AGENTS:-10000000} --days ${AB_DAYS:-120}"
    old() { AB_ROOT=$PWD/benchmarks/ab PYTHONPATH=$PWD/benchmarks/ab:$PWD/benchmarks/ab/site \
        $PY benchmarks/ab/benchmarks/bench_covid_scale.py $ab --note "older tree $(cat benchmarks/ab/COMMIT)" "$@"; }
    new() { $PY benchmarks/bench_covid_scale.py $ab "$@"; }
    AB_ROOT=$PWD/benchmarks/ab PYTHONPATH=$PWD/benchmarks/ab:$PWD/benchmarks/ab/site $PY -c \
        "import agentsim.models.covid as c; print('older tree:', c.__file__)" || exit 2
    for r in $(seq 0 $((rounds - 1))); do  # rounds: new 1 8, old 8 | old 8, new 8 1 | ...
        if [ $((r % 2)) -eq 0 ]; then
            new --ranks 1 8 --out "$RESULTS/covid-ranks-ab-new-r$r.json" | grep -E "people (W|[0-9])"
            old --ranks 8 --out "$RESULTS/covid-ranks-ab-old-r$r.json" | grep -E "people (W|[0-9])"
        else
            old --ranks 8 --out "$RESULTS/covid-ranks-ab-old-r$r.json" | grep -E "people (W|[0-9])"
            new --ranks 8 1 --out "$RESULTS/covid-ranks-ab-new-r$r.json" | grep -E "people (W|[0-9])"
        fi
        if [ -n "${OUT:-}" ]; then cp "$RESULTS"/covid-ranks-ab-*.json "$OUT/"; fi
    done
    ;;
covid-us)
    facts
    timeout 480 $PY benchmarks/bench_covid_scale.py --agents 330000000 --ranks 16 --days 120 --progress \
        --out "$RESULTS/covid-us.json"
    if [ -n "${OUT:-}" ]; then cp "$RESULTS/covid-us.json" "$OUT/"; fi
    ;;
*)
    echo "usage: bash benchmarks/gpu_machine.sh cuda | profile | sizes | scaling [AGENTS] | covid [ROUNDS] | covid-sizes | covid-ab [ROUNDS] | covid-us" >&2
    exit 2
    ;;
esac
