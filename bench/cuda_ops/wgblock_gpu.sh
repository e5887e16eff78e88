#!/usr/bin/env bash
# wgblock_gpu.sh: one device call's worth of checks and timings for the wgmma block forward
# (k_wg_block in ops_cuda_attn_wgmma.cu) against the mma.sync one it replaces. Usage on the GPU
# machine: bench/cuda_ops/wgblock_gpu.sh BIN_DIR (BIN_DIR holds bench-cuda_parity,
# bench-cuda_ops and devlibs/). Parity (attention checks) with each block forward
# (DFLASH_CUDA_ATTN_BLOCK unset: wgmma; mma: the mma.sync kernel); `bench-cuda_ops 0 attn` with
# each, twice, interleaved; memcheck of the new one; the whole parity run once; while time is
# left, a 5-layer training step with each. Everything goes to $OUT/wgblock_gpu.log (or
# ./wgblock_gpu.log); a summary is printed last.
set -uo pipefail
bin=${1:?BIN_DIR}
log=${OUT:-.}/wgblock_gpu.log
. "$(dirname "$0")/gpu_run.sh"
run parity_wgmma 40 DFLASH_CUDA_ATTN_BLOCK=wgmma "$bin/bench-cuda_parity" attn
run parity_mma 40 DFLASH_CUDA_ATTN_BLOCK=mma "$bin/bench-cuda_parity" attn
for i in 1 2; do
  run ops_wgmma 30 DFLASH_CUDA_ATTN_BLOCK=wgmma "$bin/bench-cuda_ops" 0 attn
  run ops_mma 30 DFLASH_CUDA_ATTN_BLOCK=mma "$bin/bench-cuda_ops" 0 attn
done
if command -v compute-sanitizer >/dev/null && [ "$SECONDS" -lt 100 ]; then
  run memcheck_wgmma 50 DFLASH_CUDA_ATTN_BLOCK=wgmma \
    compute-sanitizer --tool memcheck "$bin/bench-cuda_parity" attn
fi
[ "$SECONDS" -lt 140 ] && run parity_all 35 "$bin/bench-cuda_parity"
# the step bench builds a Qwen3-8B-shaped drafter first (over 20 s: WG_STEP_TO per run)
if [ "$SECONDS" -lt 60 ]; then
  run step_wgmma "${WG_STEP_TO:-75}" DFLASH_CUDA_ATTN_BLOCK=wgmma "$bin/bench-cuda_ops" 5 attn
  run step_mma "${WG_STEP_TO:-75}" DFLASH_CUDA_ATTN_BLOCK=mma "$bin/bench-cuda_ops" 5 attn
fi
echo "elapsed ${SECONDS}s"
grep -E "^=== |FAIL|checks failed|ERROR SUMMARY|^rc |^attention_|^dflash_train|^drafter of|^peak:" \
  "$log" | grep -v "^rc 0 " | sed -E 's/^=== ([^:]*):.*/=== \1/; s/  +/ /g'
