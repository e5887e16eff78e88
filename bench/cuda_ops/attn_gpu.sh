#!/usr/bin/env bash
# attn_gpu.sh: one device call's worth of attention checks and timings (issue 6, mma.sync
# kernels). Usage on the GPU machine: bench/cuda_ops/attn_gpu.sh BIN_DIR [LAYERS]
# BIN_DIR holds bench-cuda_parity, bench-cuda_ops and devlibs/; LAYERS (default 5, 0 skips)
# sizes the whole-step timings (default kernels and tc_wmma). Full logs go to $OUT (or .); the
# summary (parity verdicts, sanitizer results, attention rows per configuration) is printed last.
set -uo pipefail
bin=${1:?BIN_DIR}
layers=${2:-5}
out=${OUT:-.}
export LD_LIBRARY_PATH="$bin/devlibs:${LD_LIBRARY_PATH:-}:/usr/local/cuda/lib64"
export OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-Haswell}
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader
logs=()
run() { # name timeout env-assignments... cmd...
  local name=$1 to=$2; shift 2
  timeout "$to" env "$@" >"$out/$name.log" 2>&1
  echo "rc $?" >>"$out/$name.log"
  logs+=("$name")
}
san() { # name timeout tool env... (attention checks only)
  local name=$1 to=$2 tool=$3; shift 3
  command -v compute-sanitizer >/dev/null || return 0
  run "$name" "$to" "$@" compute-sanitizer --tool "$tool" "$bin/bench-cuda_parity" attn
}
run parity 90 "$bin/bench-cuda_parity"
run parity_split1 30 DFLASH_CUDA_ATTN_SPLIT=1 "$bin/bench-cuda_parity" attn
run parity_mma_dq 30 DFLASH_CUDA_ATTN=mma_dq "$bin/bench-cuda_parity" attn
san memcheck 40 memcheck
san memcheck_split1 40 memcheck DFLASH_CUDA_ATTN_SPLIT=1
run ops_mma 30 "$bin/bench-cuda_ops" 0 attn
run ops_mma_w4 30 DFLASH_CUDA_ATTN_WARPS=4 "$bin/bench-cuda_ops" 0 attn
run ops_mma_split20 30 DFLASH_CUDA_ATTN_SPLIT=20 "$bin/bench-cuda_ops" 0 attn
run ops_mma_split80 30 DFLASH_CUDA_ATTN_SPLIT=80 "$bin/bench-cuda_ops" 0 attn
run ops_mma_dq 30 DFLASH_CUDA_ATTN=mma_dq "$bin/bench-cuda_ops" 0 attn
run ops_wmma 30 DFLASH_CUDA_ATTN=tc_wmma "$bin/bench-cuda_ops" 0 attn
if [ "$layers" -gt 0 ]; then
  run step_mma 90 "$bin/bench-cuda_ops" "$layers"
  run step_wmma 90 DFLASH_CUDA_ATTN=tc_wmma "$bin/bench-cuda_ops" "$layers"
fi
san racecheck 45 racecheck
for f in "${logs[@]}"; do
  echo "== $f"
  case $f in
    parity*|memcheck*|racecheck*)
      grep -E "FAIL|checks failed|train step:|ERROR SUMMARY|RACECHECK SUMMARY|^rc " "$out/$f.log" | tail -12 ;;
    *) grep -E "attention|dflash_train_step|xent|^rc |memory" "$out/$f.log" | tail -12 ;;
  esac
done
