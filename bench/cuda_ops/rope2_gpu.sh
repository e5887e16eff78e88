#!/usr/bin/env bash
# rope2_gpu.sh: the drafter's head norm + RoPE kernels with two head rows loaded per warp before
# either is computed (forward: a warp per token, no block barrier) and the softmax pass of
# k_xent_rows8, against the kernels before them (DFLASH_ROPE_V1=1 DFLASH_XENT_V1=1): parity of
# the ops and loss groups and of everything, memcheck of the ops group, the 3072/512 drafter step
# interleaved twice with the PyTorch reference between the rounds, ncu of the new kernels.
# Usage (GPU machine, repository root): bench/cuda_ops/rope2_gpu.sh BIN_DIR [BUDGET_S]
set -uo pipefail
bin=${1:?usage: rope2_gpu.sh BIN_DIR [BUDGET_S]}
budget=${2:-540}
log=${OUT:-.}/rope2.log
[ -f "$bin/devlibs/libopenblas.so.0.xz" ] && xz -d -f "$bin/devlibs/libopenblas.so.0.xz"
source "$(dirname "$0")/gpu_run.sh"
D="$bin/bench-drafter"
old="DFLASH_ROPE_V1=1 DFLASH_XENT_V1=1"
run parity 120 "$P"
run memcheck_ops 120 compute-sanitizer --tool memcheck "$P" ops
for r in 1 2; do
  run "step_new$r" 80 "$D" 5 s3072_a512 8
  run "step_old$r" 80 $old "$D" 5 s3072_a512 8
  [ $r = 1 ] && run torch 110 python3 bench/drafter/torch_drafter_bench.py --peak-tflops 800 \
    --cases s3072_a512
done
run ncu_rope 120 ncu --clock-control none -k "regex:k_head_norm_rope" -s 8 -c 4 \
  --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
  --section MemoryWorkloadAnalysis -f -o "$out/rope" "$D" 1 s3072_a512 0
[ -f "$out/rope.ncu-rep" ] && ncu --import "$out/rope.ncu-rep" --page details >>"$log" 2>&1
grep -E "^===|^rc |ms/step|RESULT|checks failed|FAIL|ERROR SUMMARY|head_norm_rope|lm_head_xent" \
  "$log" | grep -v "PASS"
