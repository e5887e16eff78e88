#!/usr/bin/env bash
# attn_sw_gpu.sh: one device call's worth of checks and timings for the block-attention
# backward's ping-pong kernel with 128-byte-swizzled Q, dO tiles (k_wgb_fused PP with SW,
# DFLASH_CUDA_ATTN_PP=2, the default) against the unswizzled PP (=1) and the PIPE kernel (=0).
# Usage on the GPU machine: bench/cuda_ops/attn_sw_gpu.sh BIN_DIR [BUDGET_S] [STEPS]
# BIN_DIR holds bench-cuda_parity, bench-cuda_ops, devlibs/ and COMMIT, optionally
# base/bench-cuda_ops (main's binary, timed in the same run). STEPS (default "parity ops") lists
# the groups to run, in order: parity1 (the default, SPLIT=1 and default), parity (every variant
# and fallback), parity2 / ops2 / memcheck2 / ncu2 (the PP variants 2-5 of run 2), ops1
# (`bench-cuda_ops 0 attn`: base once, default twice, PP=1 once), ops (base and default twice
# each, PP=1 once), memcheck (default and SPLIT=1), step
# (`bench-cuda_ops 5 attn`, base and new), ncu (one launch of the default kernel and one of
# PP=1: details in the log, per-SASS-instruction counters in $OUT/wgb_*_sass.csv).
# A step whose timeout would end past BUDGET_S (default 240) is skipped. Full log:
# $OUT/attn_sw.log; a summary comes last.
set -uo pipefail
bin=${1:?BIN_DIR}
budget=${2:-240}
steps=${3:-parity ops}
out=${OUT:-.}
log=$out/attn_sw.log
. "$(dirname "$0")/gpu_run.sh"
S1="DFLASH_CUDA_ATTN_SPLIT=1"
for step in $steps; do
  case $step in
  parity1)
    run par_default_split1 30 $S1 "$P" attn
    run par_default 30 "$P" attn
    ;;
  parity)
    run par_default_split1 30 $S1 "$P" attn
    run par_pp1_split1 30 DFLASH_CUDA_ATTN_PP=1 $S1 "$P" attn
    run par_pp0_split1 30 DFLASH_CUDA_ATTN_PP=0 $S1 "$P" attn
    run par_seq_split1 30 DFLASH_CUDA_ATTN_BWD=wgmma_seq $S1 "$P" attn
    run par_mma_split1 30 DFLASH_CUDA_ATTN_BWD=mma $S1 "$P" attn
    run par_notma_split1 30 DFLASH_CUDA_ATTN_TMA=0 $S1 "$P" attn
    run par_tma1_split1 30 DFLASH_CUDA_ATTN_TMA=1 $S1 "$P" attn
    run par_hits_round3 30 DFLASH_CUDA_ATTN_FUSED_PIECES=hits DFLASH_CUDA_ATTN_LIST_ROUND=3 \
      "$P" attn
    run par_blocks_split1 30 DFLASH_CUDA_ATTN_FUSED_PIECES=blocks $S1 "$P" attn
    run par_pp1_default 30 DFLASH_CUDA_ATTN_PP=1 "$P" attn
    run par_pp0_default 30 DFLASH_CUDA_ATTN_PP=0 "$P" attn
    run par_default 30 "$P" attn
    ;;
  parity2)
    for v in 2 3 4 5; do
      run par_pp${v}_split1 30 DFLASH_CUDA_ATTN_PP=$v $S1 "$P" attn
      run par_pp${v}_default 30 DFLASH_CUDA_ATTN_PP=$v "$P" attn
    done
    run par_mma_split1 30 DFLASH_CUDA_ATTN_BWD=mma $S1 "$P" attn
    ;;
  ops2)
    for i in 1 2; do
      [ -x "$BASE" ] && run ops_base 30 "$BASE" 0 attn
      for v in 2 3 4 5; do
        run ops_pp$v 30 DFLASH_CUDA_ATTN_PP=$v "$B" 0 attn
      done
    done
    ;;
  memcheck2)
    for v in 3 4 5; do
      run memcheck_pp${v}_split1 60 DFLASH_CUDA_ATTN_PP=$v $S1 compute-sanitizer --tool memcheck \
        "$P" attn
    done
    ;;
  ncu2)
    (export DFLASH_CUDA_ATTN_PP=5; ncu_one wgb_pp5 k_wgb_fused 2 "$B" 0 attn)
    (export DFLASH_CUDA_ATTN_PP=4; ncu_one wgb_pp4 k_wgb_fused 2 "$B" 0 attn)
    ;;
  ops1)
    [ -x "$BASE" ] && run ops_base 30 "$BASE" 0 attn
    run ops_default 30 "$B" 0 attn
    run ops_pp1 30 DFLASH_CUDA_ATTN_PP=1 "$B" 0 attn
    run ops_default 30 "$B" 0 attn
    ;;
  ops)
    for i in 1 2; do
      [ -x "$BASE" ] && run ops_base 30 "$BASE" 0 attn
      run ops_default 30 "$B" 0 attn
    done
    run ops_pp1 30 DFLASH_CUDA_ATTN_PP=1 "$B" 0 attn
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
    ncu_one wgb_sw k_wgb_fused 2 "$B" 0 attn
    (export DFLASH_CUDA_ATTN_PP=1; ncu_one wgb_pp1 k_wgb_fused 2 "$B" 0 attn)
    ;;
  esac
done
grep -E "^binaries|^=== |FAIL|checks failed|ERROR SUMMARY|^rc |^attention_block|attn_block H(32/8|16/2|8/4) d128.*bwd|H200|Duration|Issued|Eligible|Warp Cycles|L2 Cache Throughput|Max Bandwidth|Compute \(SM\)|dflash_train_step|step loss" "$log"
