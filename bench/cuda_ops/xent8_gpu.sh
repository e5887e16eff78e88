#!/usr/bin/env bash
# xent8_gpu.sh: the loss's softmax pass with fewer instructions per element and four 16-byte loads
# in flight per thread (k_xent_rows8) against the first 16-byte kernel (DFLASH_XENT_V1=1): parity
# and memcheck of the loss group, bench-cuda_ops' lm_head_xent and the 3072/512 drafter step
# interleaved twice, ncu of both softmax kernels and of the step's memory-bound kernels (norms,
# RoPE, SwiGLU) at the drafter's shapes.
# Usage (GPU machine, repository root): bench/cuda_ops/xent8_gpu.sh BIN_DIR [BUDGET_S]
set -uo pipefail
bin=${1:?usage: xent8_gpu.sh BIN_DIR [BUDGET_S]}
budget=${2:-540}
log=${OUT:-.}/xent8.log
[ -f "$bin/devlibs/libopenblas.so.0.xz" ] && xz -d -f "$bin/devlibs/libopenblas.so.0.xz"
source "$(dirname "$0")/gpu_run.sh"
D="$bin/bench-drafter"
run parity_loss 60 "$P" loss
run memcheck_loss 120 compute-sanitizer --tool memcheck "$P" loss
for r in 1 2; do
  run "ops_new$r" 60 "$B" 0 xent
  run "ops_v1_$r" 60 DFLASH_XENT_V1=1 "$B" 0 xent
done
for r in 1 2; do
  run "step_new$r" 80 "$D" 5 s3072_a512 8
  run "step_v1_$r" 80 DFLASH_XENT_V1=1 "$D" 5 s3072_a512 8
done
ncu_one xent_new k_xent_rows8 0 "$B" 0 xent
ncu_one xent_v1 k_xent_rows 0 env DFLASH_XENT_V1=1 "$B" 0 xent
run ncu_small 150 ncu --clock-control none \
  -k "regex:k_head_norm_rope|k_rmsnorm|k_swiglu|k_adamw|k_sumsq|k_embedding" -s 40 -c 24 \
  --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
  --section MemoryWorkloadAnalysis -f -o "$out/small" "$D" 1 s3072_a512 0
[ -f "$out/small.ncu-rep" ] && ncu --import "$out/small.ncu-rep" --page details >>"$log" 2>&1
grep -E "^===|^rc |ms/step|RESULT case|failed|passed|ERROR SUMMARY|lm_head_xent" "$log"
