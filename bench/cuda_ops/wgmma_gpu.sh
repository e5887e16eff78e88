#!/usr/bin/env bash
# wgmma_gpu.sh: one device call's worth of checks and timings for the wgmma causal forward
# (ops_cuda_attn_wgmma.cu). Usage on the GPU machine: bench/cuda_ops/wgmma_gpu.sh BIN_DIR
# BIN_DIR holds bench-cuda_parity, bench-cuda_ops and devlibs/. Parity (attention checks) for
# every causal kernel, the mma.sync one (4x32) included; the attention timings of each (some
# twice); memcheck of a few; the whole parity run once. Everything goes to $OUT/wgmma_gpu.log (or
# ./wgmma_gpu.log); a summary is printed last.
set -uo pipefail
bin=${1:?BIN_DIR}
log=${OUT:-.}/wgmma_gpu.log
. "$(dirname "$0")/gpu_run.sh"
# wgmma: the default kernel; the rest by name (4x32: the mma.sync kernel). WG_SHAPES, WG_AGAIN
# (timed twice), WG_SAN (memcheck) override the lists.
shapes=${WG_SHAPES:-wgmma wg3x64r5 wg3x64m wg3x64p wg3x64 4x32}
for s in $shapes; do
  run "parity_$s" 40 DFLASH_CUDA_ATTN_CAUSAL=$s "$bin/bench-cuda_parity" attn
done
for s in $shapes ${WG_AGAIN:-wgmma wg3x64r 4x32}; do
  run "ops_$s" 40 DFLASH_CUDA_ATTN_CAUSAL=$s "$bin/bench-cuda_ops" 0 attn
done
if command -v compute-sanitizer >/dev/null; then
  for s in ${WG_SAN:-wgmma wg3x64m}; do
    [ "$SECONDS" -lt 150 ] && run "memcheck_$s" 60 DFLASH_CUDA_ATTN_CAUSAL=$s \
      compute-sanitizer --tool memcheck "$bin/bench-cuda_parity" attn
  done
fi
[ "$SECONDS" -lt 170 ] && run parity_all 60 "$bin/bench-cuda_parity"
echo "elapsed ${SECONDS}s"
grep -E "^=== |FAIL|T2200|checks failed|ERROR SUMMARY|^rc |^attention_causal|^peak:|train step" \
  "$log" | grep -v "^rc 0 " | sed -E 's/^=== ([^:]*):.*/=== \1/; s/  +/ /g'
