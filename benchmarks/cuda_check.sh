#!/usr/bin/env bash
# The GPU checks, in one short script for a machine with a CUDA GPU (run from the repository root, the package and
# its dependencies installed, SECURE_FED_DATA pointing at the Mulan data):
#
#   SECURE_FED_DATA=/path/to/datasets bash benchmarks/cuda_check.sh [OUTDIR]
#
# 1. the tests marked `cuda` (tests/engine/test_cuda.py; they skip without a GPU, so CI never runs them);
# 2. benchmarks/executors.py --device cuda: the matmul rates, Bibtex FedALC seconds per round of both executors in
#    fp32 and bf16 (ratios in the same run), and the synthetic scaling table (10, 40, 159, 1000 clients);
# 3. the paper's 300-round Bibtex FedALC run, bf16, vectorised, on the GPU, timed end to end.
# Each step has its own time limit (T_TESTS, T_BENCH, T_RUN seconds) so one hang cannot eat the others' time;
# STEPS picks some of them (default "tests bench run"); logs, the benchmark's JSON and the run's summary land in
# OUTDIR (default: $OUT, else cuda_out).
set -uo pipefail
out=${1:-${OUT:-cuda_out}}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
# cuBLAS reads its workspace setting once, when it first starts in a process: the benchmark's matmul rates run
# before any Experiment could set it (use_deterministic_cuda)
export CUBLAS_WORKSPACE_CONFIG=${CUBLAS_WORKSPACE_CONFIG:-:4096:8}
py=${PYTHON:-python3}

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out/gpu.txt"
$py -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name())" |
    tee -a "$out/gpu.txt"

step() {
    local name=$1 limit=$2
    shift 2
    echo "== $name"
    local t0=$SECONDS
    timeout "$limit" "$@" 2>&1 | tee "$out/$name.log"
    echo "== $name: exit ${PIPESTATUS[0]} after $((SECONDS - t0)) s" | tee -a "$out/summary.txt"
}

steps=" ${STEPS:-tests bench run} "
[[ $steps == *" tests "* ]] && step cuda_tests "${T_TESTS:-150}" $py -m pytest -q -p no:cacheprovider -m cuda -n 4 -rfE tests/engine/test_cuda.py
[[ $steps == *" bench "* ]] && step executors "${T_BENCH:-200}" $py benchmarks/executors.py --device cuda --precisions fp32,bf16 --rounds 3 \
    --json "$out/executors_cuda.json"
run_dir=$(mktemp -d)/bibtex_300
[[ $steps == *" run "* ]] && step bibtex_300 "${T_RUN:-300}" $py -m secure_fed.cli run experiments/configs/bibtex_fedalc.yaml --out "$run_dir" \
    --set training.rounds=300 --set training.precision=bf16 --set training.executor=vectorized --set device=cuda \
    --set output.progress=false
cp "$run_dir/summary.json" "$out/bibtex_300_summary.json" 2>/dev/null
cp "$run_dir/metrics.jsonl" "$out/bibtex_300_metrics.jsonl" 2>/dev/null
cat "$out/summary.txt"
