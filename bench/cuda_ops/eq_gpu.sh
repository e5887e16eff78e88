#!/usr/bin/env bash
# eq_gpu.sh: one device call for the block backward's visit with dQ before dK
# (DFLASH_CUDA_ATTN_ABLATE=4) against the default: parity, memcheck, the op alone, the step.
# Usage on the GPU machine: bench/cuda_ops/eq_gpu.sh BIN_DIR. Log: $OUT/eq.log.
set -uo pipefail
bin=${1:?BIN_DIR}
log=${OUT:-.}/eq.log
. "$(dirname "$0")/gpu_run.sh"
AB=DFLASH_CUDA_ATTN_ABLATE
run par_eq 30 $AB=4 "$P" attn
run par_eq_split1 30 $AB=4 DFLASH_CUDA_ATTN_SPLIT=1 "$P" attn
run parity_eq 90 $AB=4 "$P"
run memcheck_eq 90 $AB=4 compute-sanitizer --tool memcheck "$P" attn
for r in 1 2 3; do
  run ops_default_$r 30 "$B" 0 attn
  run ops_eq_$r 30 $AB=4 "$B" 0 attn
done
D="$bin/bench-drafter 5 s3072_a512 8 40"
for r in 1 2; do
  run step_eq_$r 60 $AB=4 $D
  run step_default_$r 60 $D
done
echo "=== summary" >>"$log"
grep -E "^=== |checks failed|ERROR SUMMARY|block_bwd .*step|ms/step|energy:|attention_block_bwd +10" \
  "$log" | grep -v "^=== summary" >>"$log"
