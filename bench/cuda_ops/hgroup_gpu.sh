#!/usr/bin/env bash
# hgroup_gpu.sh: the block backward's sorted schedule with kv heads G at a time
# (DFLASH_CUDA_ATTN_HEAD_GROUP), in k_bwd_plan's heaviest-first order (default) or every item
# per head group in turn (DFLASH_CUDA_ATTN_HEAD_ORDER=groups), and work indices taken ahead
# (DFLASH_CUDA_ATTN_PREFETCH=1). In one call: the attention's parity under each setting and
# memcheck of one; the block backward alone at the step's anchors per setting, twice; the
# 3072/512 step per setting interleaved twice, around the PyTorch reference.
# Usage on the GPU machine: bench/cuda_ops/hgroup_gpu.sh BIN_DIR. Log: $OUT/hgroup.log.
set -uo pipefail
bin=${1:?BIN_DIR}
log=${OUT:-.}/hgroup.log
budget=${BUDGET:-570}
. "$(dirname "$0")/gpu_run.sh"
G=DFLASH_CUDA_ATTN_HEAD_GROUP F=DFLASH_CUDA_ATTN_PREFETCH=1
configs=("" "$G=4" "$G=2" "$G=1" "$G=2 DFLASH_CUDA_ATTN_HEAD_ORDER=groups" "$F" "$G=2 $F")
for c in "${configs[@]:1}"; do
  # shellcheck disable=SC2086 # the configuration's assignments
  run "par ${c}" 30 $c "$P" attn
done
run par_g2_split1 30 $G=2 $F DFLASH_CUDA_ATTN_SPLIT=1 "$P" attn
run memcheck_g2f 90 $G=2 $F compute-sanitizer --tool memcheck "$P" attn
for r in 1 2; do
  for c in "${configs[@]}"; do
    # shellcheck disable=SC2086
    run "t$r ${c:-default}" 20 $c "$B" 0 attn
  done
done
D="$bin/bench-drafter 5 s3072_a512 8 40"
T="python3 bench/drafter/torch_drafter_bench.py --peak-tflops 800 --steps 40"
steps=("" "$G=2" "$G=2 $F" "$G=4")
for r in 1 2; do
  for c in "${steps[@]}"; do
    # shellcheck disable=SC2086
    run "step$r ${c:-default}" 30 $c $D
  done
  [ $r = 1 ] && run torch 110 $T --cases s3072_a512
done
echo "=== summary" >>"$log"
grep -E "^=== |checks failed|ERROR SUMMARY|attention_block_bwd .*step|ms/step|energy:|\
attention_block_bwd +10" "$log" | grep -v "^=== summary" >>"$log"
