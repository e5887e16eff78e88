#!/usr/bin/env bash
# attn_pp_gpu.sh: one device call's worth of checks and timings for the block-attention
# backward's warpgroup ping-pong (k_wgb_fused with PP, ops_cuda_attn_wgbwd.cu) against the
# PIPE kernel it grew from (DFLASH_CUDA_ATTN_PP=0); the variants PP=2 (turns) and PP=3 (dQ at
# the start of the next visit) of runs 1-2 were removed after them.
# Usage on the GPU machine: bench/cuda_ops/attn_pp_gpu.sh BIN_DIR [BUDGET_S] [STEPS]
# BIN_DIR holds bench-cuda_parity, bench-cuda_ops, devlibs/ and COMMIT, optionally
# base/bench-cuda_ops (the commit before, timed in the same run). STEPS (default "parity ops")
# lists the groups to run, in order: parity (attention checks per variant and fallback), ops
# (`bench-cuda_ops 0 attn` per variant, base twice), memcheck (default and SPLIT=1),
# step (`bench-cuda_ops 5 attn`, base and new), ncu (one launch of the default
# kernel: details in the log, per-SASS-instruction counters in $OUT/wgb_sass.csv).
# A step whose timeout would end past BUDGET_S (default 240) is skipped. Full log:
# $OUT/attn_pp.log; a summary comes last.
set -uo pipefail
bin=${1:?BIN_DIR}
budget=${2:-240}
steps=${3:-parity ops}
out=${OUT:-.}
log=$out/attn_pp.log
. "$(dirname "$0")/gpu_run.sh"
S1="DFLASH_CUDA_ATTN_SPLIT=1"
for step in $steps; do
  case $step in
  parity)
    run par_pp1_split1 30 DFLASH_CUDA_ATTN_PP=1 $S1 "$P" attn
    run par_pp0_split1 30 DFLASH_CUDA_ATTN_PP=0 $S1 "$P" attn
    bwd_fallback_parity
    run par_pp0_default 30 DFLASH_CUDA_ATTN_PP=0 "$P" attn
    run par_default 30 "$P" attn
    ;;
  ops)
    for i in 1 2; do
      [ -x "$BASE" ] && run ops_base 30 "$BASE" 0 attn
      run ops_default 30 "$B" 0 attn
    done
    run ops_pp0 30 DFLASH_CUDA_ATTN_PP=0 "$B" 0 attn
    ;;
  memcheck)
    run memcheck_default 60 compute-sanitizer --tool memcheck "$P" attn
    run memcheck_split1 60 $S1 compute-sanitizer --tool memcheck "$P" attn
    ;;
  step)
    [ -x "$BASE" ] && run step_base 90 "$BASE" 5 attn
    run step_default 90 "$B" 5 attn
    ;;
  ncu)
    ncu_one wgb k_wgb_fused 2 "$B" 0 attn
    ;;
  esac
done
grep -E "^binaries|^=== |FAIL|checks failed|ERROR SUMMARY|^rc |^attention_block|attn_block H(32/8|16/2|8/4) d128.*bwd|H200|Duration|Issued|Eligible|Stall|Warp Cycles|dflash_train_step|step loss" "$log"
