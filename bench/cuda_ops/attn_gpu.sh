#!/usr/bin/env bash
# attn_gpu.sh: one device call's worth of attention checks and timings (issue 6, mma.sync
# kernels). Usage on the GPU machine: bench/cuda_ops/attn_gpu.sh BIN_DIR [LAYERS]
# BIN_DIR holds bench-cuda_parity, bench-cuda_ops and devlibs/; LAYERS (default 5, 0 skips)
# sizes the whole-step timing with the default kernels. Everything goes to $OUT/attn_gpu.log (or
# ./attn_gpu.log); a summary (parity verdicts, sanitizer results, attention rows per
# configuration) is printed last.
set -uo pipefail
bin=${1:?BIN_DIR}
layers=${2:-5}
log=${OUT:-.}/attn_gpu.log
. "$(dirname "$0")/gpu_run.sh"
san() { # name timeout tool env... (attention checks only)
  local name=$1 to=$2 tool=$3; shift 3
  command -v compute-sanitizer >/dev/null || return 0
  run "$name" "$to" "$@" compute-sanitizer --tool "$tool" "$bin/bench-cuda_parity" attn
}
run parity 90 "$bin/bench-cuda_parity"
run parity_split1 30 DFLASH_CUDA_ATTN_SPLIT=1 "$bin/bench-cuda_parity" attn
run parity_4x32_2x32 30 DFLASH_CUDA_ATTN_CAUSAL=4x32 DFLASH_CUDA_ATTN_BLOCK=2x32 "$bin/bench-cuda_parity" attn
run parity_4x16 30 DFLASH_CUDA_ATTN_CAUSAL=4x16 "$bin/bench-cuda_parity" attn
run parity_mma_dq 30 DFLASH_CUDA_ATTN=mma_dq "$bin/bench-cuda_parity" attn
run parity_wmma_split1 30 DFLASH_CUDA_ATTN=tc_wmma DFLASH_CUDA_ATTN_SPLIT=1 "$bin/bench-cuda_parity" attn
run parity_simple 40 DFLASH_CUDA_ATTN=simple "$bin/bench-cuda_parity" attn
san memcheck_split1_4x32_2x32 40 memcheck DFLASH_CUDA_ATTN_SPLIT=1 DFLASH_CUDA_ATTN_CAUSAL=4x32 \
  DFLASH_CUDA_ATTN_BLOCK=2x32
run ops_mma 30 "$bin/bench-cuda_ops" 0 attn
run ops_4x16 30 DFLASH_CUDA_ATTN_CAUSAL=4x16 "$bin/bench-cuda_ops" 0 attn
run ops_4x32_2x32 30 DFLASH_CUDA_ATTN_CAUSAL=4x32 DFLASH_CUDA_ATTN_BLOCK=2x32 "$bin/bench-cuda_ops" 0 attn
run ops_split40 30 DFLASH_CUDA_ATTN_SPLIT=40 "$bin/bench-cuda_ops" 0 attn
run ops_split160 30 DFLASH_CUDA_ATTN_SPLIT=160 "$bin/bench-cuda_ops" 0 attn
run ops_mma_dq 30 DFLASH_CUDA_ATTN=mma_dq "$bin/bench-cuda_ops" 0 attn
run ops_wmma 30 DFLASH_CUDA_ATTN=tc_wmma "$bin/bench-cuda_ops" 0 attn
[ "$layers" -gt 0 ] && run step_mma 90 "$bin/bench-cuda_ops" "$layers"
san racecheck_4x32_2x32 40 racecheck DFLASH_CUDA_ATTN_CAUSAL=4x32 DFLASH_CUDA_ATTN_BLOCK=2x32
grep -E "^=== |FAIL|checks failed|train step:|ERROR SUMMARY|RACECHECK SUMMARY|^rc |^attention|dflash_train_step|^peak|memory in use" "$log"
