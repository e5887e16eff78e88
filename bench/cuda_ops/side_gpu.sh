#!/usr/bin/env bash
# side_gpu.sh: one device call's worth of checks and timings for the optimizer on the side
# stream (DFLASH_CUDA_SIDE_STREAM=1, ops.h side_begin): AdamW layer by layer on a low-priority
# stream while the next step's forward runs. Usage on the GPU machine:
#   bench/cuda_ops/side_gpu.sh BIN_DIR [BUDGET_S] [STEPS]
# BIN_DIR holds bench-cuda_parity, bench-drafter, devlibs/ and COMMIT. STEPS (default "parity
# ab torch") in order: parity (the whole parity run, side stream on: its queued training steps
# against the cpu's), ab (`bench-drafter 5 s3072_a512 8` with the side stream off, on, off, on:
# one binary, same run), torch (the PyTorch reference of bench/drafter for the same case). A
# step whose timeout would end past BUDGET_S (default 540) is skipped. Log: $OUT/side.log; a
# summary comes last.
set -uo pipefail
bin=${1:?BIN_DIR}
budget=${2:-540}
steps=${3:-parity ab torch}
out=${OUT:-.}
log=$out/side.log
[ -f "$bin/devlibs/libopenblas.so.0.xz" ] && xz -d -f "$bin/devlibs/libopenblas.so.0.xz"
. "$(dirname "$0")/gpu_run.sh"
for step in $steps; do
  case $step in
  parity) run parity 170 "$P" ;;
  ab)
    for i in 1 2; do
      run "off$i" 100 DFLASH_CUDA_SIDE_STREAM=0 "$bin/bench-drafter" 5 s3072_a512 8
      run "on$i" 100 DFLASH_CUDA_SIDE_STREAM=1 "$bin/bench-drafter" 5 s3072_a512 8
    done
    ;;
  torch) run torch 120 python3 bench/drafter/torch_drafter_bench.py --cases s3072_a512 ;;
  esac
done
grep -E "^binaries|^=== |^rc |optimizer side|train steps|checks failed|FAIL|ms/step|RESULT" \
  "$log" | head -80
