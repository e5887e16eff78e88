#!/usr/bin/env bash
# attn_pp3_gpu.sh: one device call's worth of checks and timings for the block-attention
# backward's PP3 (k_wgb_fused with 3 stages of Q, dO, D, lse and pieces' ends that wait for the
# dQ reductions' reads alone; ops_cuda_attn_wgbwd.cu; DFLASH_CUDA_ATTN_PP=3) against the default
# (PP with 2 stages), PP3 with the ends waiting for the adds (DFLASH_CUDA_ATTN_END=full) and
# main's binary.
# Usage on the GPU machine: bench/cuda_ops/attn_pp3_gpu.sh BIN_DIR [BUDGET_S] [STEPS]
# BIN_DIR holds bench-cuda_parity, bench-cuda_ops, devlibs/ and COMMIT, optionally
# base/bench-cuda_ops (main's binary, timed in the same run). STEPS (default "parity ops") lists
# the groups to run, in order: parity (attention checks of PP3, its END=full, the default and
# PP=0, each with SPLIT=1 and default, and the fallbacks), memcheck (PP3 with SPLIT=1 and
# default), ops (`bench-cuda_ops 0 attn`: base, default and PP3 twice each, interleaved, END=full
# once), step (`bench-cuda_ops 5 attn`: base, default, PP3), sass (local-memory instructions of
# PP3's kernel). A step whose timeout would end past BUDGET_S (default 240) is skipped. Full log:
# $OUT/attn_pp3.log; a summary comes last (with k_wgb_fused's notes: PP3 says when it cannot run).
set -uo pipefail
bin=${1:?BIN_DIR}
budget=${2:-240}
steps=${3:-parity ops}
out=${OUT:-.}
log=$out/attn_pp3.log
xzb="$bin/devlibs/libopenblas.so.0.xz" # carried compressed (scripts/gpu-carry's note)
[ -f "$xzb" ] && [ ! -f "${xzb%.xz}" ] && xz -dk "$xzb"
. "$(dirname "$0")/gpu_run.sh"
S1="DFLASH_CUDA_ATTN_SPLIT=1"
P3="DFLASH_CUDA_ATTN_PP=3"
for step in $steps; do
  case $step in
  parity)
    run par_pp3_split1 30 $P3 $S1 "$P" attn
    run par_pp3 30 $P3 "$P" attn
    run par_pp3_end_full_split1 30 $P3 DFLASH_CUDA_ATTN_END=full $S1 "$P" attn
    run par_default_split1 30 $S1 "$P" attn
    run par_default 30 "$P" attn
    run par_pp0_split1 30 DFLASH_CUDA_ATTN_PP=0 $S1 "$P" attn
    bwd_fallback_parity
    ;;
  memcheck)
    run memcheck_pp3_split1 60 $P3 $S1 compute-sanitizer --tool memcheck "$P" attn
    run memcheck_pp3 60 $P3 compute-sanitizer --tool memcheck "$P" attn
    ;;
  ops)
    for i in 1 2; do
      [ -x "$BASE" ] && run ops_base 30 "$BASE" 0 attn
      run ops_default 30 "$B" 0 attn
      run ops_pp3 30 $P3 "$B" 0 attn
    done
    run ops_pp3_end_full 30 $P3 DFLASH_CUDA_ATTN_END=full "$B" 0 attn
    ;;
  step)
    [ -x "$BASE" ] && run step_base 90 "$BASE" 5 attn
    run step_default 90 "$B" 5 attn
    run step_pp3 90 $P3 "$B" 5 attn
    ;;
  sass)
    echo "=== sass: local-memory instructions of PP3's kernel" >>"$log"
    cuobjdump -sass -fun '_Z11k_wgb_fusedILi128ELb1ELb1ELb1ELi3EEv8bwd_args8wgb_maps' "$B" \
      >"$out/wgb_pp3.sass" 2>>"$log"
    echo "LDL/STL in PP3: $(grep -cE 'LDL|STL' "$out/wgb_pp3.sass")" >>"$log"
    ;;
  esac
done
keep="^binaries|^=== |FAIL|checks failed|ERROR SUMMARY|^rc |^attention_block_bwd|H200"
grep -E "$keep|dflash_train_step|step loss|LDL/STL|k_wgb_fused" "$log"
