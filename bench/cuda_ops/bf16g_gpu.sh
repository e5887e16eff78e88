#!/usr/bin/env bash
# bf16g_gpu.sh: one device call for the bf16 weight gradients (branch bf16grad): the whole parity
# run, the optimizer checks (the new kernels) under compute-sanitizer memcheck, the data-parallel
# test (nccl world 1, shm world 2 on one GPU) and `bench-drafter 5 s3072_a512 8` of main (base/)
# and of the branch, interleaved base new base new, with op profiles. Steps are skipped once the elapsed time plus their timeout passes BUDGET_S.
# Usage (repository root on the GPU machine): bench/cuda_ops/bf16g_gpu.sh BIN [BUDGET_S], BIN
# holding bench-cuda_parity, bench-drafter, test_dp_nccl, devlibs/ (libopenblas may be .xz),
# COMMIT and base/bench-drafter. Log: $OUT/bf16g.log; a summary comes last.
set -uo pipefail
bin=${1:?BIN}
budget=${2:-215}
out=${OUT:-.}
log=$out/bf16g.log
[ -f "$bin/devlibs/libopenblas.so.0.xz" ] && xz -d -f "$bin/devlibs/libopenblas.so.0.xz"
. "$(dirname "$0")/gpu_run.sh"
export NCCL_NVLS_ENABLE=0
run parity 75 "$P"
run memcheck_optim 45 compute-sanitizer --tool memcheck "$P" optim
run drafter_base_1 55 "$bin/base/bench-drafter" 5 s3072_a512 8
run drafter_new_1 55 "$bin/bench-drafter" 5 s3072_a512 8
run dp_nccl 50 "$bin/test_dp_nccl"
run drafter_base_2 55 "$bin/base/bench-drafter" 5 s3072_a512 8
run drafter_new_2 55 "$bin/bench-drafter" 5 s3072_a512 8
grep -E "^binaries|^=== |FAIL|checks failed|^rc |train step|ms/step|^   (adamw|sumsq|linear_bwd) |\
nccl world|shm|synced|passed|failed|ERROR SUMMARY|tuned with" "$log" | grep -v "^rc 0 " | sed -E 's/  +/ /g'
