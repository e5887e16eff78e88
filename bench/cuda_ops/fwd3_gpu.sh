#!/usr/bin/env bash
# fwd3_gpu.sh: one device call's worth of checks and timings for the block-attention forward's
# Q-by-tensor-copy and persistent producer kernels (k_wg_block_tma, ops_cuda_attn_wgmma.cu)
# against the binary of the commit before. Usage on the GPU machine:
#   bench/cuda_ops/fwd3_gpu.sh BIN_DIR [BUDGET_S] [STEPS] [NEW] [OTHERS]
# BIN_DIR holds bench-cuda_parity, bench-cuda_ops, devlibs/, COMMIT and optionally
# base/bench-cuda_ops (timed in the same run).
# NEW (default wgt3x64p) is the DFLASH_CUDA_ATTN_BLOCK name under test. STEPS (default "parity
# ops memcheck step ncu") in order: parity (the attention checks with the default, NEW, NEW on
# 3 and on 1 CTA (DFLASH_CUDA_ATTN_BLOCK_CTAS: many items per CTA, and the work counter's reset
# between launches), NEW by head, each of OTHERS (default "wgt3x64q wgt3x64s5q wgt3x64")), ops
# (`bench-cuda_ops 0 attn`: base, default and NEW twice, interleaved, then OTHERS once), memcheck
# (the attention parity under compute-sanitizer with NEW on 3 CTAs), step (`bench-cuda_ops 5
# attn`, base then NEW), ncu (one launch of NEW). A step whose timeout would end past BUDGET_S
# (default 165) is skipped. Log: $OUT/fwd3.log; a summary comes last.
set -uo pipefail
bin=${1:?BIN_DIR}
budget=${2:-165}
steps=${3:-parity ops memcheck step ncu}
new=${4:-wgt3x64p}
others=${5-wgt3x64q wgt3x64s5q wgt3x64}
pt=${PARITY_TIMEOUT:-30} # seconds per parity run (about 1 on the H200)
out=${OUT:-.}
log=$out/fwd3.log
. "$(dirname "$0")/gpu_run.sh"
V=DFLASH_CUDA_ATTN_BLOCK
N=DFLASH_CUDA_ATTN_BLOCK_CTAS
# a variant whose parity run timed out (a hang) is left out of the later steps
hung=" "
check() { tail -n 1 "$log" | grep -qE "^rc (124|137) " && hung="$hung$1 "; }
live() { case "$hung" in *" $1 "*) return 1 ;; esac; }
for step in $steps; do
  case $step in
  parity)
    run parity_default "$pt" "$P" attn
    run "parity_$new" "$pt" "$V=$new" "$P" attn
    check "$new"
    if live "$new"; then
      run "parity_${new}_3ctas" "$pt" "$V=$new" "$N=3" "$P" attn
      run "parity_${new}_1cta" "$pt" "$V=$new" "$N=1" "$P" attn
      run "parity_${new}_head" "$pt" "$V=$new" DFLASH_CUDA_ATTN_BLOCK_ORDER=head "$P" attn
    fi
    for k in $others; do
      run "parity_$k" "$pt" "$V=$k" "$P" attn
      check "$k"
    done
    ;;
  ops)
    for i in 1 2; do
      [ -x "$BASE" ] && run ops_base 30 "$BASE" 0 attn
      run ops_default 30 "$B" 0 attn
      live "$new" && run "ops_$new" 30 "$V=$new" "$B" 0 attn
    done
    for k in $others; do
      live "$k" && run "ops_$k" 30 "$V=$k" "$B" 0 attn
    done
    ;;
  memcheck)
    live "$new" &&
      run "memcheck_$new" 60 "$V=$new" "$N=3" compute-sanitizer --tool memcheck "$P" attn
    ;;
  step)
    [ -x "$BASE" ] && run step_base 45 "$BASE" 5 attn
    live "$new" && run "step_$new" 45 "$V=$new" "$B" 5 attn
    ;;
  ncu)
    live "$new" && (export "$V=$new"; ncu_one "$new" k_wg_block 1 "$B" 0 attn)
    ;;
  esac
done
grep -E "^binaries|^=== |FAIL|checks failed|ERROR SUMMARY|^rc |^attention_block_fwd|\
H200|Duration|Registers Per|Throughput|Issued|Eligible|Warp Cycles|dflash_train_step|^step loss" \
  "$log" | grep -v "^rc 0 " | sed -E 's/^=== ([^:]*):.*/=== \1/; s/  +/ /g'
