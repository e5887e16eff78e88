#!/usr/bin/env bash
# sched_gpu.sh: one device call for the block backward's schedule by kv-head groups
# (DFLASH_CUDA_ATTN_HEAD_GROUP) and the ablation kernels (DFLASH_CUDA_ATTN_ABLATE: what S^T,
# dQ and dQ's reduction cost a visit; results wrong, timing only).
# Usage on the GPU machine: bench/cuda_ops/sched_gpu.sh BIN_DIR (bench-cuda_parity,
# bench-cuda_ops, bench-drafter, devlibs/, COMMIT). Log: $OUT/sched.log.
set -uo pipefail
bin=${1:?BIN_DIR}
log=${OUT:-.}/sched.log
. "$(dirname "$0")/gpu_run.sh"
HG=DFLASH_CUDA_ATTN_HEAD_GROUP
AB=DFLASH_CUDA_ATTN_ABLATE
run par_default 30 "$P" attn
for g in 1 2 4; do run par_g$g 30 $HG=$g "$P" attn; done
run parity 90 "$P"
for r in 1 2 3; do
  run ops_default_$r 30 "$B" 0 attn
  for g in 4 2 1; do run ops_g${g}_$r 30 $HG=$g "$B" 0 attn; done
  for x in 1 2 3; do run ops_abl${x}_$r 30 $AB=$x "$B" 0 attn; done
done
mem() { # DRAM and L2 of one launch of the block backward, the step's anchors
  run "ncu_$1" 90 "${@:2}" ncu --clock-control none -k regex:k_wgb_fused -s 1 -c 1 \
    --section SpeedOfLight --section MemoryWorkloadAnalysis "$B" 0 attn
}
mem wgb_g8 env
mem wgb_g1 $HG=1
mem wgb_g2 $HG=2
run ncu_aux 90 ncu --clock-control none -k 'regex:k_bwd_plan|k_bwd_rowD|k_bwd_dq_out' -c 6 \
  --section SpeedOfLight "$B" 0 attn
D="$bin/bench-drafter 5 s3072_a512 8 40"
for r in 1 2; do
  run step_default_$r 60 $D
  for g in 4 2 1; do run step_g${g}_$r 60 $HG=$g $D; done
done
echo "=== summary" >>"$log"
grep -E "^=== |block_bwd .*step|ms/step|energy:|attention_block_bwd +10|Duration|DRAM Through|L2 Hit|Memory Throughput" \
  "$log" | grep -v "^=== summary" >>"$log"
