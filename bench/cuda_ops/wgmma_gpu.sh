#!/usr/bin/env bash
# wgmma_gpu.sh: one device call's worth of checks and timings for the wgmma causal forward
# (ops_cuda_attn_wgmma.cu). Usage on the GPU machine: bench/cuda_ops/wgmma_gpu.sh BIN_DIR
# BIN_DIR holds bench-cuda_parity, bench-cuda_ops and devlibs/. Parity (attention checks) for
# every causal shape, the mma.sync one (4x32) included; the attention timings of each; memcheck of
# the default and of the pipelined shape. Everything goes to $OUT/wgmma_gpu.log (or
# ./wgmma_gpu.log); a summary is printed last.
set -uo pipefail
bin=${1:?BIN_DIR}
log=${OUT:-.}/wgmma_gpu.log
: >"$log"
export LD_LIBRARY_PATH="$bin/devlibs:${LD_LIBRARY_PATH:-}:/usr/local/cuda/lib64"
export OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-Haswell}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader | tee -a "$log"
run() { # name timeout env-assignments... cmd...
  local name=$1 to=$2; shift 2
  echo "=== $name: $*" >>"$log"
  timeout "$to" env "$@" >>"$log" 2>&1
  echo "rc $?" >>"$log"
}
shapes=${WG_SHAPES:-"wgmma wg2x64 wg3x64 wg2x128p wg3x64p 4x32"} # wgmma: the default shape
for s in $shapes; do
  run "parity_$s" 30 DFLASH_CUDA_ATTN_CAUSAL=$s "$bin/bench-cuda_parity" attn
done
for s in $shapes; do
  run "ops_$s" 40 DFLASH_CUDA_ATTN_CAUSAL=$s "$bin/bench-cuda_ops" 0 attn
done
run ops_wgmma_again 40 "$bin/bench-cuda_ops" 0 attn
if command -v compute-sanitizer >/dev/null; then
  run memcheck_wgmma 60 compute-sanitizer --tool memcheck "$bin/bench-cuda_parity" attn
  [ "$SECONDS" -lt 150 ] && run memcheck_wg2x128p 60 DFLASH_CUDA_ATTN_CAUSAL=wg2x128p \
    compute-sanitizer --tool memcheck "$bin/bench-cuda_parity" attn
fi
echo "elapsed ${SECONDS}s"
grep -E "^=== |attn_causal|checks failed|ERROR SUMMARY|^rc |^attention_causal|^linear_fwd" "$log" |
  grep -v "^rc 0$"
