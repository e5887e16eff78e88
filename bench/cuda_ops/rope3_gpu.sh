#!/usr/bin/env bash
# rope3_gpu.sh: the head norm + RoPE kernels with fewer instructions per element (means by the
# exact 1 / d instead of divisions, the rotation's sign in the sine, unrolled group sums) against
# the binaries before them ($bin/base): parity of everything, memcheck of the ops group, the
# 3072/512 drafter step interleaved twice with the PyTorch reference between the rounds, ncu of
# the new kernels.
# Usage (GPU machine, repository root): bench/cuda_ops/rope3_gpu.sh BIN_DIR [BUDGET_S]
set -uo pipefail
bin=${1:?usage: rope3_gpu.sh BIN_DIR [BUDGET_S]}
budget=${2:-540}
log=${OUT:-.}/rope3.log
source "$(dirname "$0")/gpu_run.sh"
D="$bin/bench-drafter"
run parity 120 "$P"
run memcheck_ops 120 compute-sanitizer --tool memcheck "$P" ops
for r in 1 2; do
  run "step_new$r" 80 "$D" 5 s3072_a512 8
  run "step_base$r" 80 "$bin/base/bench-drafter" 5 s3072_a512 8
  [ $r = 1 ] && run torch 110 python3 bench/drafter/torch_drafter_bench.py \
    --cases s3072_a512
done
run ncu_rope 120 ncu --clock-control none -k "regex:k_head_norm_rope" -s 8 -c 4 \
  --section SpeedOfLight --section Occupancy --section WarpStateStats \
  --section MemoryWorkloadAnalysis -f -o "$out/rope" "$D" 1 s3072_a512 0
[ -f "$out/rope.ncu-rep" ] && ncu --import "$out/rope.ncu-rep" --page details >>"$log" 2>&1
grep -E "^===|^rc |ms/step|RESULT|checks failed|FAIL|ERROR SUMMARY|head_norm_rope|Duration" \
  "$log" | grep -v "PASS"
