#!/usr/bin/env bash
# attn_sw_gpu.sh: one device call's worth of checks and timings for the block-attention
# backward's default kernel (k_wgb_fused, ping-pong, 128-byte-swizzled Q and dO tiles, split
# pieces ended by bulk reductions) against the unswizzled ping-pong (DFLASH_CUDA_ATTN_PP=1), the
# atomics end (DFLASH_CUDA_ATTN_SPLIT_OUT=atomics) and a base binary.
# Usage on the GPU machine: bench/cuda_ops/attn_sw_gpu.sh BIN_DIR [BUDGET_S] [STEPS]
# BIN_DIR holds bench-cuda_parity, bench-cuda_ops, devlibs/ and COMMIT, optionally
# base/bench-cuda_ops (e.g. the commit before, timed in the same run). STEPS (default "parity
# ops") lists the groups to run, in order: parity (attention checks per variant and fallback),
# parity_all (every check of bench-cuda_parity), ops (`bench-cuda_ops 0 attn`: base and default twice each,
# atomics twice, PP=1 once), memcheck (default with SPLIT=1 and default, atomics with SPLIT=1),
# step (`bench-cuda_ops 5 attn`, base and new), ncu (one launch of the default kernel: details in
# the log, per-SASS-instruction counters in $OUT/wgb_sw_sass.csv), sass (local-memory
# instructions of the default kernel, by cuobjdump). A step whose timeout would end past
# BUDGET_S (default 240) is skipped. Full log: $OUT/attn_sw.log; a summary comes last.
set -uo pipefail
bin=${1:?BIN_DIR}
budget=${2:-240}
steps=${3:-parity ops}
out=${OUT:-.}
log=$out/attn_sw.log
. "$(dirname "$0")/gpu_run.sh"
S1="DFLASH_CUDA_ATTN_SPLIT=1"
AT="DFLASH_CUDA_ATTN_SPLIT_OUT=atomics"
for step in $steps; do
  case $step in
  parity)
    run par_default_split1 30 $S1 "$P" attn
    run par_atomics_split1 30 $AT $S1 "$P" attn
    run par_pp1_split1 30 DFLASH_CUDA_ATTN_PP=1 $S1 "$P" attn
    run par_pp0_split1 30 DFLASH_CUDA_ATTN_PP=0 $S1 "$P" attn
    bwd_fallback_parity
    run par_pp1_default 30 DFLASH_CUDA_ATTN_PP=1 "$P" attn
    run par_pp0_default 30 DFLASH_CUDA_ATTN_PP=0 "$P" attn
    run par_default 30 "$P" attn
    ;;
  parity_all)
    run parity_all 120 "$P"
    ;;
  ops)
    for i in 1 2; do
      [ -x "$BASE" ] && run ops_base 30 "$BASE" 0 attn
      run ops_default 30 "$B" 0 attn
      run ops_atomics 30 $AT "$B" 0 attn
    done
    run ops_pp1 30 DFLASH_CUDA_ATTN_PP=1 "$B" 0 attn
    ;;
  memcheck)
    run memcheck_split1 60 $S1 compute-sanitizer --tool memcheck "$P" attn
    run memcheck_default 60 compute-sanitizer --tool memcheck "$P" attn
    run memcheck_atomics_split1 60 $AT $S1 compute-sanitizer --tool memcheck "$P" attn
    ;;
  step)
    [ -x "$BASE" ] && run step_base 90 "$BASE" 5 attn
    run step_default 90 "$B" 5 attn
    ;;
  ncu)
    ncu_one wgb_sw k_wgb_fused 2 "$B" 0 attn
    ;;
  sass)
    echo "=== sass: local-memory instructions per k_wgb_fused instance" >>"$log"
    cuobjdump -sass -fun '_Z11k_wgb_fusedILi128ELb1ELb1ELb1EEv8bwd_args8wgb_maps' "$B" \
      >"$out/wgb_sw.sass" 2>>"$log"
    echo "LDL/STL in the default kernel: $(grep -cE 'LDL|STL' "$out/wgb_sw.sass")" >>"$log"
    grep -nE 'LDL|STL' "$out/wgb_sw.sass" >>"$log"
    ;;
  esac
done
grep -E "^binaries|^=== |FAIL|checks failed|ERROR SUMMARY|^rc |^attention_block_bwd|H200|\
Duration|Issued|Eligible|Warp Cycles|L2 Cache Throughput|Compute \(SM\)|dflash_train_step|\
step loss|LDL/STL" "$log"
