#!/usr/bin/env bash
# abl_energy_gpu.sh: joules per call of the block backward's parts: `BENCH_ENERGY_S=1.5
# bench-cuda_ops 0 attn` for the base (7aafd82), the new visit (dQ ahead of dK) and bf7ad20's
# ablation kernels (DFLASH_CUDA_ATTN_ABLATE 1: S^T on one k16 step of 8, 2: no dQ, 3: dQ not
# reduced; results wrong, timing and energy only), twice, interleaved.
# Usage on the GPU machine: bench/cuda_ops/abl_energy_gpu.sh BIN_DIR (bench-cuda_ops of the new
# code, base/bench-cuda_ops, abl/bench-cuda_ops, devlibs/). Log: $OUT/abl_energy.log.
set -uo pipefail
bin=${1:?BIN_DIR}
log=${OUT:-.}/abl_energy.log
. "$(dirname "$0")/gpu_run.sh"
E=BENCH_ENERGY_S=1.5
A="$bin/abl/bench-cuda_ops"
for r in 1 2; do
  run base_$r 60 $E "$BASE" 0 attn
  run new_$r 60 $E "$B" 0 attn
  for x in 1 2 3; do run abl${x}_$r 60 $E DFLASH_CUDA_ATTN_ABLATE=$x "$A" 0 attn; done
done
echo "=== summary" >>"$log"
grep -E "^=== |attention_block_(bwd|fwd) " "$log" | grep -v "^=== summary" >>"$log"
