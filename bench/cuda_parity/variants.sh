#!/usr/bin/env bash
# variants.sh: bench-cuda_parity's attention checks under the kernels the default run does not
# reach on a Hopper GPU, each the one that runs elsewhere: the mma.sync fused block backward
# (k_bwd_fused: GPUs without sm_90a), the cp.async block forward (k_wg_block: drivers without
# the tensor-map encoder) and the mma.sync block forward with two 16-row tiles per warp (2x32:
# the mma.sync kernels' m-tile loop). A mutation audit (bench/cuda_parity/mutants.py) found a
# wrong kernel in each passing the default run.
# Usage: bench/cuda_parity/variants.sh BENCH_CUDA_PARITY; exit 0 when every run passed, else the
# last failing run's exit code (77: no GPU, as bench-cuda_parity).
set -uo pipefail
bin=${1:?usage: variants.sh BENCH_CUDA_PARITY}
rc=0
for v in DFLASH_CUDA_ATTN_BWD=mma DFLASH_CUDA_ATTN_BLOCK=wgcp DFLASH_CUDA_ATTN_BLOCK=2x32; do
  echo "== bench-cuda_parity attn with $v =="
  env "$v" "$bin" attn
  r=$?
  [ "$r" -eq 0 ] || rc=$r
done
exit "$rc"
