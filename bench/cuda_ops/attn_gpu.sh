#!/usr/bin/env bash
# attn_gpu.sh: one device call's worth of attention checks and timings (issue 6, mma.sync
# kernels). Usage on the GPU machine: bench/cuda_ops/attn_gpu.sh BIN_DIR
# BIN_DIR holds bench-cuda_parity, bench-cuda_ops and devlibs/. Full logs go to $OUT (or .);
# the summary (parity verdicts, attention rows, per-config) is printed last.
set -uo pipefail
bin=${1:?BIN_DIR}
out=${OUT:-.}
export LD_LIBRARY_PATH="$bin/devlibs:${LD_LIBRARY_PATH:-}:/usr/local/cuda/lib64"
export OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-Haswell}
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader
summ() { # name log
  echo "== $1"
  grep -E "attn|attention|FAIL|checks failed|train step:|peak|ERROR SUMMARY|rc " "$2" | grep -v "^op " | tail -40
}
run() { # name timeout env... cmd...
  local name=$1 to=$2; shift 2
  timeout "$to" env "$@" >"$out/$name.log" 2>&1
  echo "rc $?" >>"$out/$name.log"
}
run parity_mma 70 "$bin/bench-cuda_parity"
run ops_mma 40 "$bin/bench-cuda_ops" 0 attn
run ops_mma_w4 25 DFLASH_CUDA_ATTN_WARPS=4 "$bin/bench-cuda_ops" 0 attn
run ops_wmma 25 DFLASH_CUDA_ATTN=tc_wmma "$bin/bench-cuda_ops" 0 attn
if command -v compute-sanitizer >/dev/null; then
  run memcheck 30 compute-sanitizer --tool memcheck "$bin/bench-cuda_parity" attn
fi
run parity_wmma_attn 20 DFLASH_CUDA_ATTN=tc_wmma "$bin/bench-cuda_parity" attn
for f in parity_mma ops_mma ops_mma_w4 ops_wmma memcheck parity_wmma_attn; do
  [ -f "$out/$f.log" ] && summ "$f" "$out/$f.log"
done
