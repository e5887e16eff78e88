#!/usr/bin/env bash
# attn_bwd_gpu.sh: one device call's worth of checks and timings for the fused block-attention
# backward (ops_cuda_attn_bwd.cu) against the mma.sync pair. Usage on the GPU machine:
#   bench/cuda_ops/attn_bwd_gpu.sh BIN_DIR [BUDGET_S]
# BIN_DIR holds bench-cuda_parity, bench-cuda_ops and devlibs/. Steps run in priority order and
# are skipped once BUDGET_S (default 180) seconds have passed. Full log: $OUT/attn_bwd.log (or
# ./attn_bwd.log); a summary (parity verdicts, sanitizer, attention and step rows) comes last.
set -uo pipefail
bin=${1:?BIN_DIR}
budget=${2:-180}
log=${OUT:-.}/attn_bwd.log
: >"$log"
export LD_LIBRARY_PATH="$bin/devlibs:${LD_LIBRARY_PATH:-}:/usr/local/cuda/lib64"
export OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-Haswell}
t0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader | tee -a "$log"
run() { # name timeout env-assignments... cmd...
  local name=$1 to=$2; shift 2
  if [ $(($(date +%s) - t0 + to)) -gt "$budget" ]; then
    echo "=== $name: skipped (budget)" >>"$log"
    return
  fi
  echo "=== $name: $*" >>"$log"
  timeout "$to" env "$@" >>"$log" 2>&1
  echo "rc $? ($(($(date +%s) - t0)) s)" >>"$log"
}
P="$bin/bench-cuda_parity"
B="$bin/bench-cuda_ops"
run parity_fused32_split1 25 DFLASH_CUDA_ATTN=fused DFLASH_CUDA_ATTN_SPLIT=1 "$P" attn
run parity_fused64_split1 25 DFLASH_CUDA_ATTN=fused DFLASH_CUDA_ATTN_FUSED_ROWS=64 \
  DFLASH_CUDA_ATTN_SPLIT=1 "$P" attn
run ops_mma 25 DFLASH_CUDA_ATTN=mma "$B" 0 attn
run ops_fused32 25 DFLASH_CUDA_ATTN=fused DFLASH_CUDA_ATTN_FUSED_ROWS=32 "$B" 0 attn
run ops_fused64 25 DFLASH_CUDA_ATTN=fused DFLASH_CUDA_ATTN_FUSED_ROWS=64 "$B" 0 attn
run parity_fused_all 60 DFLASH_CUDA_ATTN=fused "$P"
run parity_mma_split1 20 DFLASH_CUDA_ATTN=mma DFLASH_CUDA_ATTN_SPLIT=1 "$P" attn
run ops_fused32_s40 20 DFLASH_CUDA_ATTN=fused DFLASH_CUDA_ATTN_SPLIT=40 "$B" 0 attn
run ops_fused32_s160 20 DFLASH_CUDA_ATTN=fused DFLASH_CUDA_ATTN_SPLIT=160 "$B" 0 attn
run step_fused 60 DFLASH_CUDA_ATTN=fused "$B" 5
if command -v compute-sanitizer >/dev/null; then
  run memcheck_fused_split1 40 DFLASH_CUDA_ATTN=fused DFLASH_CUDA_ATTN_SPLIT=1 \
    compute-sanitizer --tool memcheck "$P" attn
fi
run step_mma 60 DFLASH_CUDA_ATTN=mma "$B" 5
grep -E "^=== |FAIL|checks failed|failed|train step:|ERROR SUMMARY|^rc |^attention_block|dflash_train_step|^peak|gemm" "$log"
