#!/usr/bin/env bash
# attn_wgb_gpu.sh: one device call's worth of checks and timings for the wgmma block-attention
# backward (k_wgb_fused, ops_cuda_attn_wgbwd.cu; DFLASH_CUDA_ATTN_BWD=wgmma) against the mma.sync
# fused kernel (k_bwd_fused; DFLASH_CUDA_ATTN_BWD=mma), same binary. Usage on the GPU machine:
#   bench/cuda_ops/attn_wgb_gpu.sh BIN_DIR [BUDGET_S]
# BIN_DIR holds bench-cuda_parity, bench-cuda_ops, devlibs/ and COMMIT (the commit they were
# built from). Steps run in priority order and are skipped once BUDGET_S (default 200) seconds
# would be passed by a step's timeout. Full log: $OUT/attn_wgb.log (or ./attn_wgb.log); a
# summary (parity verdicts and errors, sanitizer, attention rows) comes last.
set -uo pipefail
bin=${1:?BIN_DIR}
budget=${2:-200}
log=${OUT:-.}/attn_wgb.log
. "$(dirname "$0")/gpu_run.sh"
S1="DFLASH_CUDA_ATTN_SPLIT=1"
WG="DFLASH_CUDA_ATTN_BWD=wgmma"
WS="DFLASH_CUDA_ATTN_BWD=wgmma_seq"
MM="DFLASH_CUDA_ATTN_BWD=mma"
HITS="DFLASH_CUDA_ATTN_FUSED_PIECES=hits"
# parity first (SPLIT=1: every key tile seen by more than one block is split: pieces, dk/dv
# atomics, tickets), then timings of the kernels twice, interleaved; the unset
# DFLASH_CUDA_ATTN_BWD is the default (wgmma, pieces by block ranges)
run parity_wg_split1 25 $WG $S1 "$P" attn
run parity_wg 25 $WG "$P" attn
run parity_wg_hits_split1 25 $WG $HITS $S1 "$P" attn
run parity_ws_split1 25 $WS $S1 "$P" attn
run ops_wg 25 $WG "$B" 0 attn
run ops_mma 25 $MM "$B" 0 attn
run ops_ws 25 $WS "$B" 0 attn
run ops_wg_split40 25 $WG DFLASH_CUDA_ATTN_SPLIT=40 "$B" 0 attn
run ops_wg_split160 25 $WG DFLASH_CUDA_ATTN_SPLIT=160 "$B" 0 attn
run ops_wg_again 25 $WG "$B" 0 attn
run ops_mma_again 25 $MM "$B" 0 attn
if command -v compute-sanitizer >/dev/null; then
  run memcheck_wg_split1 50 $WG $S1 compute-sanitizer --tool memcheck "$P" attn
fi
run parity_all_default 60 "$P"
run step_default 70 "$B" 5
grep -E "^binaries|^=== |FAIL|checks failed|failed|ERROR SUMMARY|^rc |^attention_block|attn_block H(32/8|16/2|8/4) d128.*bwd|H200|block backward|dflash_train_step|k_wgb_fused|Duration|Registers Per|Throughput|Issued|Eligible" "$log"
