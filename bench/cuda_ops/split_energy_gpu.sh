#!/usr/bin/env bash
# split_energy_gpu.sh: joules per call of the block backward with shorter pieces
# (DFLASH_CUDA_ATTN_SPLIT: pieces of 2 N blocks; default N 80) and kv heads in groups
# (DFLASH_CUDA_ATTN_HEAD_GROUP, branch headgroup's binaries in hg/): `BENCH_ENERGY_S=1.5
# bench-cuda_ops 0 attn`; then the 3072/512 step with the configuration of the fewest joules
# against the default, twice, interleaved.
# Usage on the GPU machine: bench/cuda_ops/split_energy_gpu.sh BIN_DIR. Log:
# $OUT/split_energy.log. BUDGET=S: steps whose timeout would end past S seconds are skipped.
set -uo pipefail
bin=${1:?BIN_DIR}
log=${OUT:-.}/split_energy.log
budget=${BUDGET:-}
. "$(dirname "$0")/gpu_run.sh"
H="$bin/hg/bench-cuda_ops"
configs=("" "DFLASH_CUDA_ATTN_SPLIT=32 DFLASH_CUDA_ATTN_HEAD_GROUP=2"
  "DFLASH_CUDA_ATTN_SPLIT=16 DFLASH_CUDA_ATTN_HEAD_GROUP=1" "DFLASH_CUDA_ATTN_HEAD_GROUP=2")
best="" bestj=9
for i in "${!configs[@]}"; do
  c=${configs[$i]}
  # shellcheck disable=SC2086 # the configuration's assignments
  run "cfg$i ${c:-default}" 25 BENCH_ENERGY_S=1.5 $c "$H" 0 attn
  j=$(awk '/=== cfg'"$i"' /{f=1} f && /attention_block_bwd .*\(step\)/{print $(NF-1); exit}' "$log")
  echo "cfg$i ${c:-default}: $j J" >>"$log"
  if [ -n "$j" ] && awk -v a="$j" -v b="$bestj" 'BEGIN{exit !(a < b)}'; then best=$c bestj=$j; fi
done
echo "=== least joules: ${best:-default} ($bestj J)" >>"$log"
D="$bin/hg/bench-drafter 5 s3072_a512 8 40"
if [ -n "$best" ]; then
  for r in 1 2; do
    # shellcheck disable=SC2086
    run "step_best_$r" 30 $best $D
    run "step_default_$r" 30 $D
  done
fi
echo "=== summary" >>"$log"
grep -E "^=== |^cfg|attention_block_bwd .*step|ms/step|energy:|attention_block_bwd +10" "$log" |
  grep -v "^=== summary" >>"$log"
