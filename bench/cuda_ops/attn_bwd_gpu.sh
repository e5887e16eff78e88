#!/usr/bin/env bash
# attn_bwd_gpu.sh: one device call's worth of checks and timings for the fused block-attention
# backward (ops_cuda_attn_bwd.cu) against the mma.sync pair. Usage on the GPU machine:
#   bench/cuda_ops/attn_bwd_gpu.sh BIN_DIR [BUDGET_S]
# BIN_DIR holds bench-cuda_parity, bench-cuda_ops and devlibs/. Steps run in priority order and
# are skipped once BUDGET_S (default 185) seconds have passed. Full log: $OUT/attn_bwd.log (or
# ./attn_bwd.log); a summary (parity verdicts, sanitizer, attention and step rows) comes last.
set -uo pipefail
bin=${1:?BIN_DIR}
budget=${2:-185}
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
F="DFLASH_CUDA_ATTN=fused"
run parity_fused64x32_split1 25 $F DFLASH_CUDA_ATTN_SPLIT=1 "$P" attn
run parity_fused128x32_split1 25 $F DFLASH_CUDA_ATTN_FUSED=128x32 DFLASH_CUDA_ATTN_SPLIT=1 "$P" attn
run ops_mma 25 DFLASH_CUDA_ATTN=mma "$B" 0 attn
for s in 64x32 64x64 128x32 128x64; do
  run ops_fused$s 25 $F DFLASH_CUDA_ATTN_FUSED=$s "$B" 0 attn
done
if command -v ncu >/dev/null; then
  ncu_k() { # name env... : per-kernel time and limiters of the block backward kernels
    local name=$1; shift
    run "$name" 40 "$@" ncu -k "regex:k_bwd_|k_mma_dq|k_mma_dkdv" -c 3 --section SpeedOfLight \
      --section Occupancy --section WarpStateStats --section MemoryWorkloadAnalysis "$B" 0 attn
  }
  ncu_k ncu_mma DFLASH_CUDA_ATTN=mma
  ncu_k ncu_fused64x32 $F
fi
run parity_fused_all 60 $F "$P"
run step_fused 60 $F "$B" 5
run step_mma 60 DFLASH_CUDA_ATTN=mma "$B" 5
run parity_fused64x64_split1 20 $F DFLASH_CUDA_ATTN_FUSED=64x64 DFLASH_CUDA_ATTN_SPLIT=1 "$P" attn
run parity_fused128x64_split1 20 $F DFLASH_CUDA_ATTN_FUSED=128x64 DFLASH_CUDA_ATTN_SPLIT=1 "$P" attn
run parity_mma_split1 20 DFLASH_CUDA_ATTN=mma DFLASH_CUDA_ATTN_SPLIT=1 "$P" attn
if command -v compute-sanitizer >/dev/null; then
  run memcheck_fused_split1 40 $F DFLASH_CUDA_ATTN_SPLIT=1 compute-sanitizer --tool memcheck "$P" attn
fi
grep -E "^=== |FAIL|checks failed|failed|ERROR SUMMARY|^rc |^attention_block|dflash_train_step|k_bwd_|k_mma_d|Duration|Registers Per|Achieved Occ" "$log"
