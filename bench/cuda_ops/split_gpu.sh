#!/usr/bin/env bash
# split_gpu.sh: the matrices' masters stored split (master_split.h; AdamW 26 bytes per element
# instead of 28) against the binaries before it ($bin/base): parity of everything, memcheck of
# the optimizer group, the data-parallel test (state broadcast and hash over the split masters),
# the 3072/512 drafter step interleaved twice with the PyTorch reference between the rounds, ncu
# of one split AdamW launch.
# Usage (GPU machine, repository root): bench/cuda_ops/split_gpu.sh BIN_DIR [BUDGET_S]
set -uo pipefail
bin=${1:?usage: split_gpu.sh BIN_DIR [BUDGET_S]}
budget=${2:-540}
log=${OUT:-.}/split.log
[ -f "$bin/devlibs/libopenblas.so.0.xz" ] && xz -d -f "$bin/devlibs/libopenblas.so.0.xz"
source "$(dirname "$0")/gpu_run.sh"
D="$bin/bench-drafter"
run parity 120 "$P"
run memcheck_optim 120 compute-sanitizer --tool memcheck "$P" optim
[ -x "$bin/test_dp_nccl" ] && run dp 120 "$bin/test_dp_nccl"
for r in 1 2; do
  run "step_new$r" 80 "$D" 5 s3072_a512 8
  run "step_base$r" 80 "$bin/base/bench-drafter" 5 s3072_a512 8
  [ $r = 1 ] && run torch 110 python3 bench/drafter/torch_drafter_bench.py --peak-tflops 800 \
    --cases s3072_a512
done
ncu_one adamw "k_adamw_split" 3 "$D" 1 s3072_a512 0
grep -E "^===|^rc |ms/step|RESULT|checks failed|FAIL|ERROR SUMMARY|adamw |Duration|round trip|\
DRAM Throughput|bit-identical" "$log" | grep -v "PASS"
