#!/usr/bin/env bash
# lt_enum_gpu.sh: does timing cuBLASLt configurations beyond the heuristic's eight (lt_enum.h,
# DFLASH_LT_ENUM=1) make the 3072/512 drafter step faster? One device call: the whole parity
# bench-drafter at 3072/512 without and with the enumeration, the PyTorch reference of the same
# case, the two bench-drafter runs again, then the whole parity with the enumerated picks.
# Usage (GPU machine, repository root): bench/cuda_ops/lt_enum_gpu.sh BIN_DIR [BUDGET_S]
set -uo pipefail
bin=${1:?usage: lt_enum_gpu.sh BIN_DIR [BUDGET_S]}
budget=${2:-580}
log=${OUT:-.}/lt_enum.log
[ -f "$bin/devlibs/libopenblas.so.0.xz" ] && xz -d -f "$bin/devlibs/libopenblas.so.0.xz"
source "$(dirname "$0")/gpu_run.sh"
D="$bin/bench-drafter"
run base1 90 "$D" 5 s3072_a512 8
run enum1 200 DFLASH_LT_ENUM=1 "$D" 5 s3072_a512 8
run torch 150 python3 bench/drafter/torch_drafter_bench.py --peak-tflops 800 --cases s3072_a512
run base2 90 "$D" 5 s3072_a512 8
run enum2 200 DFLASH_LT_ENUM=1 "$D" 5 s3072_a512 8
run parity_enum 100 DFLASH_LT_TUNE=8 DFLASH_LT_ENUM=1 "$P"
grep -E "^===|^rc |ms/step|ratio|RESULT case|failed" "$log"
