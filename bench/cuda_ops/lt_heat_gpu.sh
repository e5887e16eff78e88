#!/usr/bin/env bash
# lt_heat_gpu.sh: which cuBLASLt picks make the 3072/512 drafter step fastest: the heuristic's
# first (no tuning), the start-up tuning as it is (8 candidates, each timed right after the
# previous), or the tuning with the board heated first and two passes (DFLASH_LT_TUNE_HEAT=1)?
# One device call: the three interleaved, the PyTorch reference between the two rounds.
# Usage (GPU machine, repository root): bench/cuda_ops/lt_heat_gpu.sh BIN_DIR [BUDGET_S]
set -uo pipefail
bin=${1:?usage: lt_heat_gpu.sh BIN_DIR [BUDGET_S]}
budget=${2:-580}
log=${OUT:-.}/lt_heat.log
[ -f "$bin/devlibs/libopenblas.so.0.xz" ] && xz -d -f "$bin/devlibs/libopenblas.so.0.xz"
source "$(dirname "$0")/gpu_run.sh"
D="$bin/bench-drafter"
for r in 1 2; do
  run "first$r" 80 "$D" 5 s3072_a512 1
  run "tuned$r" 80 "$D" 5 s3072_a512 8
  run "heat$r" 100 DFLASH_LT_TUNE_HEAT=1 "$D" 5 s3072_a512 8
  [ $r = 1 ] && run torch 110 python3 bench/drafter/torch_drafter_bench.py --peak-tflops 800 \
    --cases s3072_a512
done
run parity_heat 100 DFLASH_LT_TUNE=8 DFLASH_LT_TUNE_HEAT=1 "$P"
grep -E "^===|^rc |ms/step|RESULT case|failed" "$log"
