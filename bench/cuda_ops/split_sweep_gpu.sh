#!/usr/bin/env bash
# split_sweep_gpu.sh: the block backward's sorted schedule with shorter pieces
# (DFLASH_CUDA_ATTN_SPLIT=N: pieces of about 2 N blocks; default N 80) and kv heads G at a time
# (DFLASH_CUDA_ATTN_HEAD_GROUP), so that the CTAs running together share fewer query rows' Q, dO
# and dqacc in L2. In one call: parity of the attention under the new settings; the block
# backward alone at the step's anchors per configuration (`bench-cuda_ops 0 attn`, twice); its
# joules per call for some (`BENCH_ENERGY_S=1.5`); ncu of the default and one candidate; then the
# 3072/512 step, default and two candidates interleaved twice, around the PyTorch reference.
# Usage on the GPU machine: bench/cuda_ops/split_sweep_gpu.sh BIN_DIR [CAND1] [CAND2]
# (CAND: assignments in quotes, e.g. "DFLASH_CUDA_ATTN_SPLIT=16"). Log: $OUT/split_sweep.log.
set -uo pipefail
bin=${1:?BIN_DIR}
c1=${2:-DFLASH_CUDA_ATTN_SPLIT=16}
c2=${3:-DFLASH_CUDA_ATTN_SPLIT=24 DFLASH_CUDA_ATTN_HEAD_GROUP=2}
log=${OUT:-.}/split_sweep.log
budget=${BUDGET:-570}
. "$(dirname "$0")/gpu_run.sh"
S=DFLASH_CUDA_ATTN_SPLIT G=DFLASH_CUDA_ATTN_HEAD_GROUP
run par_g2 30 $G=2 "$P" attn
run par_g1_s8 30 $G=1 $S=8 "$P" attn
run par_s16 30 $S=16 "$P" attn
configs=("" "$S=40" "$S=24" "$S=16" "$S=8" "$G=2" "$S=40 $G=2" "$S=24 $G=2" "$S=16 $G=2"
  "$S=16 $G=1")
for r in 1 2; do
  for i in "${!configs[@]}"; do
    c=${configs[$i]}
    # shellcheck disable=SC2086 # the configuration's assignments
    run "t$r cfg$i ${c:-default}" 20 $c "$B" 0 attn
  done
done
for c in "" "$S=24" "$S=16" "$S=16 $G=2" "$S=24 $G=2"; do
  # shellcheck disable=SC2086
  run "energy ${c:-default}" 25 BENCH_ENERGY_S=1.5 $c "$B" 0 attn
done
ncu_one wgb_default 'k_wgb_fused' 0 "$B" 0 attn
# shellcheck disable=SC2086
ncu_one wgb_c1 'k_wgb_fused' 0 env $c1 "$B" 0 attn
D="$bin/bench-drafter 5 s3072_a512 8 40"
T="python3 bench/drafter/torch_drafter_bench.py --peak-tflops 800 --steps 40"
for r in 1 2; do
  run "step_default_$r" 30 $D
  # shellcheck disable=SC2086
  run "step_c1_$r ($c1)" 30 $c1 $D
  # shellcheck disable=SC2086
  run "step_c2_$r ($c2)" 30 $c2 $D
  [ $r = 1 ] && run torch 110 $T --cases s3072_a512
done
echo "=== summary" >>"$log"
grep -E "^=== |checks failed|ERROR SUMMARY|attention_block_bwd .*step|ms/step|energy:|\
attention_block_bwd +10|Duration|DRAM Throughput|L2 Hit|loss .* -> " "$log" |
  grep -v "^=== summary" >>"$log"
