#!/usr/bin/env bash
# fwd2_gpu.sh: one device call's worth of checks and timings for the block-attention forward's
# producer kernels (k_wg_block_tma, ops_cuda_attn_wgmma.cu) against the cp.async kernel
# (k_wg_block) and the binary of the commit before. Usage on the GPU machine:
#   bench/cuda_ops/fwd2_gpu.sh BIN_DIR [BUDGET_S] [STEPS] [VARIANTS]
# BIN_DIR holds bench-cuda_parity, bench-cuda_ops, devlibs/, COMMIT and optionally
# base/bench-cuda_ops. STEPS (default "parity ops sass") in order: parity (attention checks with
# the default, each of VARIANTS (DFLASH_CUDA_ATTN_BLOCK names, default "wgt3x64 wgt3x64s5n"),
# wgcp, mma, and the default with DFLASH_CUDA_ATTN_BLOCK_ORDER=head), ops (`bench-cuda_ops 0
# attn`: base and default twice, interleaved, then each variant, wgcp and ORDER=head once), sass
# (the block kernels' SASS under $OUT), memcheck (the attention parity under compute-sanitizer),
# step (`bench-cuda_ops 5 attn`, base then default), parity_all (the whole parity run), ncu (one
# launch of the default kernel). A step whose timeout would end past BUDGET_S (default 240) is
# skipped. Log: $OUT/fwd2.log; a summary comes last.
set -uo pipefail
bin=${1:?BIN_DIR}
budget=${2:-240}
steps=${3:-parity ops sass}
variants=${4:-wgt3x64 wgt3x64s5n}
out=${OUT:-.}
log=$out/fwd2.log
. "$(dirname "$0")/gpu_run.sh"
V=DFLASH_CUDA_ATTN_BLOCK
for step in $steps; do
  case $step in
  parity)
    run parity_default 40 "$P" attn
    for k in $variants wgcp mma; do run "parity_$k" 40 "$V=$k" "$P" attn; done
    run parity_order_head 40 DFLASH_CUDA_ATTN_BLOCK_ORDER=head "$P" attn
    ;;
  ops)
    for i in 1 2; do
      [ -x "$BASE" ] && run ops_base 40 "$BASE" 0 attn
      run ops_default 40 "$B" 0 attn
    done
    for k in $variants wgcp; do run "ops_$k" 40 "$V=$k" "$B" 0 attn; done
    run ops_order_head 40 DFLASH_CUDA_ATTN_BLOCK_ORDER=head "$B" 0 attn
    ;;
  sass)
    cuobjdump --dump-sass "$B" 2>/dev/null | awk '/Function : .*k_wg_block/{p=1} \
      /Function : /&&!/k_wg_block/{p=0} p' >"$out/wg_block.sass"
    ;;
  memcheck)
    run memcheck_default 90 compute-sanitizer --tool memcheck "$P" attn
    ;;
  step)
    [ -x "$BASE" ] && run step_base 100 "$BASE" 5 attn
    run step_default 100 "$B" 5 attn
    ;;
  parity_all)
    run parity_all 90 "$P"
    ;;
  ncu)
    ncu_one wgf k_wg_block 1 "$B" 0 attn
    ;;
  esac
done
grep -E "^binaries|^=== |FAIL|checks failed|ERROR SUMMARY|^rc |^attention_(block_fwd|causal)|\
H200|Duration|Registers Per|Throughput|Issued|Eligible|Warp Cycles|dflash_train_step|^step loss" \
  "$log" | grep -v "^rc 0 " | sed -E 's/^=== ([^:]*):.*/=== \1/; s/  +/ /g'
