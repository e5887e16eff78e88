#!/usr/bin/env bash
# lt_energy_gpu.sh: do cuBLASLt picks by energy per product (DFLASH_LT_TUNE_ENERGY=1, NVML's
# counter) make the 3072/512 drafter step faster than the start-up tuning by cool time? One device
# call: the two interleaved twice, the PyTorch reference between the rounds, nvidia-smi dmon
# beside.
# Usage (GPU machine, repository root): bench/cuda_ops/lt_energy_gpu.sh BIN_DIR [BUDGET_S]
set -uo pipefail
bin=${1:?usage: lt_energy_gpu.sh BIN_DIR [BUDGET_S]}
budget=${2:-450}
log=${OUT:-.}/lt_energy.log
[ -f "$bin/devlibs/libopenblas.so.0.xz" ] && xz -d -f "$bin/devlibs/libopenblas.so.0.xz"
source "$(dirname "$0")/gpu_run.sh"
D="$bin/bench-drafter"
nvidia-smi dmon -s pc -d 1 >"${OUT:-.}/dmon.log" 2>&1 &
dmon=$!
for r in 1 2; do
  run "tuned$r" 80 "$D" 5 s3072_a512 8
  run "energy$r" 140 DFLASH_LT_TUNE_ENERGY=1 "$D" 5 s3072_a512 8
  [ $r = 1 ] && run torch 110 python3 bench/drafter/torch_drafter_bench.py --peak-tflops 800 \
    --cases s3072_a512
done
kill $dmon
grep -E "^===|^rc |ms/step|RESULT case|failed|nvml" "$log"
