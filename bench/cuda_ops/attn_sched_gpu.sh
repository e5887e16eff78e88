#!/usr/bin/env bash
# attn_sched_gpu.sh: one device call's worth of checks and timings for the block-attention
# backward's schedule (k_wgb_fused with pieces sorted heaviest first, DFLASH_CUDA_ATTN_FUSED_PIECES
# unset or =sorted, against =blocks, the grid order it replaced; ops_cuda_attn_wgbwd.cu).
# Usage on the GPU machine: bench/cuda_ops/attn_sched_gpu.sh BIN_DIR [BUDGET_S] [STEPS]
# BIN_DIR holds bench-cuda_parity, bench-cuda_ops, devlibs/ and COMMIT. STEPS (default
# "parity ops ncu memcheck") lists the groups to run, in order: parity (attention checks with
# SPLIT=1, every tile split into pieces, for each schedule and kernel, and with the defaults),
# ops (`bench-cuda_ops 0 attn`, three anchor distributions, per variant), ncu (one
# launch of the default kernel, gpu_run.sh's ncu_one: details in the log, report and
# per-SASS-instruction csv under $OUT), memcheck (sorted, SPLIT=1), memcheck_default,
# parity_all (the whole parity run), step (`bench-cuda_ops 5 attn`: a 5-layer drafter step),
# sass (the kernel's SASS). ops and step also run BIN_DIR/base/bench-cuda_ops when it is there
# (the binary to compare with; ops also BIN_DIR/prev/bench-cuda_ops, an intermediate version).
# DFLASH_CUDA_ATTN_TMA=0 and =1 runs (parity, ops): the visits' cp.async loads instead of the
# tensor copies, and copies per column; DFLASH_CUDA_ATTN_LIST_ROUND=3 (parity): visit lists built
# in rounds of 3 blocks. A step whose timeout would end past BUDGET_S (default 240) is
# skipped. Full log: $OUT/attn_sched.log; a summary comes last.
set -uo pipefail
bin=${1:?BIN_DIR}
budget=${2:-240}
steps=${3:-parity ops ncu memcheck}
out=${OUT:-.}
log=$out/attn_sched.log
. "$(dirname "$0")/gpu_run.sh"
PREV="$bin/prev/bench-cuda_ops" # optional: an intermediate version, timed in ops
S1="DFLASH_CUDA_ATTN_SPLIT=1"
SO="DFLASH_CUDA_ATTN_FUSED_PIECES=sorted"
BL="DFLASH_CUDA_ATTN_FUSED_PIECES=blocks"
for step in $steps; do
  case $step in
  parity)
    run parity_sorted_split1 30 $SO $S1 "$P" attn
    run parity_blocks_split1 30 $BL $S1 "$P" attn
    run parity_hits_split1 30 DFLASH_CUDA_ATTN_FUSED_PIECES=hits $S1 "$P" attn
    run parity_seq_split1 30 DFLASH_CUDA_ATTN_BWD=wgmma_seq $S1 "$P" attn
    run parity_mma_split1 30 DFLASH_CUDA_ATTN_BWD=mma $S1 "$P" attn
    run parity_notma_split1 30 DFLASH_CUDA_ATTN_TMA=0 $S1 "$P" attn
    run parity_tma1_split1 30 DFLASH_CUDA_ATTN_TMA=1 $S1 "$P" attn
    run parity_round3 30 DFLASH_CUDA_ATTN_LIST_ROUND=3 "$P" attn
    run parity_hits_round3 30 DFLASH_CUDA_ATTN_FUSED_PIECES=hits DFLASH_CUDA_ATTN_LIST_ROUND=3 \
      "$P" attn
    run parity_default 30 "$P" attn
    ;;
  ops)
    for i in 1 2; do
      [ -x "$BASE" ] && run ops_base 30 "$BASE" 0 attn
      run ops_sorted 30 $SO "$B" 0 attn
      run ops_blocks 30 $BL "$B" 0 attn
    done
    run ops_sorted_split128 30 $SO DFLASH_CUDA_ATTN_SPLIT=128 "$B" 0 attn
    run ops_sorted_split40 30 $SO DFLASH_CUDA_ATTN_SPLIT=40 "$B" 0 attn
    run ops_seq 30 DFLASH_CUDA_ATTN_BWD=wgmma_seq "$B" 0 attn
    run ops_notma 30 DFLASH_CUDA_ATTN_TMA=0 "$B" 0 attn
    run ops_tma1 30 DFLASH_CUDA_ATTN_TMA=1 "$B" 0 attn
    [ -x "$PREV" ] && run ops_prev 30 "$PREV" 0 attn
    ;;
  step)
    [ -x "$BASE" ] && run step_base 90 "$BASE" 5 attn
    run step_default 90 "$B" 5 attn
    ;;
  memcheck)
    run memcheck_sorted_split1 60 $SO $S1 compute-sanitizer --tool memcheck "$P" attn
    ;;
  memcheck_default)
    run memcheck_default 60 compute-sanitizer --tool memcheck "$P" attn
    ;;
  parity_all)
    run parity_all 90 "$P"
    ;;
  ncu)
    ncu_one wgb k_wgb_fused 2 "$B" 0 attn
    ;;
  sass)
    cuobjdump --dump-sass --function '_Z11k_wgb_fusedILi128ELb1EEv8bwd_args8wgb_maps' "$B" \
      >"$out/wgb.sass" 2>&1
    ;;
  esac
done
grep -E "^binaries|^=== |FAIL|checks failed|ERROR SUMMARY|^rc |^attention_block|attn_block H(32/8|16/2|8/4) d128.*bwd|H200|Duration|Registers Per|Throughput|Issued|Eligible|Stall|Warp Cycles|dflash_train_step|step loss" "$log"
