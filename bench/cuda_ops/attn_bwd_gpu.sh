#!/usr/bin/env bash
# attn_bwd_gpu.sh: one device call's worth of checks and timings for the fused block-attention
# backward (ops_cuda_attn_bwd.cu) against the mma.sync pair. Usage on the GPU machine:
#   bench/cuda_ops/attn_bwd_gpu.sh BIN_DIR [BUDGET_S]
# BIN_DIR holds bench-cuda_parity, bench-cuda_ops and devlibs/. Steps run in priority order and
# are skipped once BUDGET_S (default 185) seconds have passed. Full log: $OUT/attn_bwd.log (or
# ./attn_bwd.log); a summary (parity verdicts, sanitizer, attention and step rows) comes last.
set -uo pipefail
bin=${1:?BIN_DIR}
budget=${2:-185}
log=${OUT:-.}/attn_bwd.log
. "$(dirname "$0")/gpu_run.sh"
S1="DFLASH_CUDA_ATTN_SPLIT=1"
V="DFLASH_CUDA_ATTN_FUSED"
# parity of the fused default (128x64, pieces by hits; the run of 2026-12-01 had staged dq as
# its default, bulk became the default after it) and each variant, every
# dk/dv tile seen by more than one block split (SPLIT=1: pieces, atomics, tickets)
run parity_default_split1 25 $S1 "$P" attn
run parity_blocks_split1 25 $S1 DFLASH_CUDA_ATTN_FUSED_PIECES=blocks "$P" attn
run parity_128x32_split1 25 $S1 $V=128x32 "$P" attn
run parity_64x64_split1 25 $S1 $V=64x64 "$P" attn
run parity_direct_split1 25 $S1 DFLASH_CUDA_ATTN_FUSED_DQ=direct "$P" attn
run parity_bulk_split1 25 $S1 DFLASH_CUDA_ATTN_FUSED_DQ=bulk "$P" attn
run ops_mma 25 DFLASH_CUDA_ATTN=mma "$B" 0 attn
run ops_default 25 "$B" 0 attn
run ops_blocks 25 DFLASH_CUDA_ATTN_FUSED_PIECES=blocks "$B" 0 attn
run ops_128x32 25 $V=128x32 "$B" 0 attn
run ops_64x64 25 $V=64x64 "$B" 0 attn
run ops_64x32 25 $V=64x32 "$B" 0 attn
run ops_direct 25 DFLASH_CUDA_ATTN_FUSED_DQ=direct "$B" 0 attn
run ops_bulk 25 DFLASH_CUDA_ATTN_FUSED_DQ=bulk "$B" 0 attn
run ops_bulk_blocks 25 DFLASH_CUDA_ATTN_FUSED_DQ=bulk DFLASH_CUDA_ATTN_FUSED_PIECES=blocks "$B" 0 attn
run ops_bulk_128x32 25 DFLASH_CUDA_ATTN_FUSED_DQ=bulk $V=128x32 "$B" 0 attn
run ops_split40 25 DFLASH_CUDA_ATTN_SPLIT=40 "$B" 0 attn
run ops_split160 25 DFLASH_CUDA_ATTN_SPLIT=160 "$B" 0 attn
run ops_blocks_split40 25 DFLASH_CUDA_ATTN_FUSED_PIECES=blocks DFLASH_CUDA_ATTN_SPLIT=40 "$B" 0 attn
run ops_default_again 25 "$B" 0 attn
run ops_mma_again 25 DFLASH_CUDA_ATTN=mma "$B" 0 attn
if command -v ncu >/dev/null; then
  run ncu_default 40 ncu -k "regex:k_bwd_" -c 3 --section SpeedOfLight --section Occupancy \
    --section MemoryWorkloadAnalysis --section SchedulerStats "$B" 0 attn
fi
run parity_all_default 60 "$P"
run step_default 60 "$B" 5
run step_mma 60 DFLASH_CUDA_ATTN=mma "$B" 5
if command -v compute-sanitizer >/dev/null; then
  run memcheck_default_split1 40 $S1 compute-sanitizer --tool memcheck "$P" attn
  run racecheck_default_split1 40 $S1 compute-sanitizer --tool racecheck "$P" attn
fi
grep -E "^=== |FAIL|checks failed|failed|ERROR SUMMARY|RACECHECK SUMMARY|^rc |^attention_block|dflash_train_step|k_bwd_|k_mma_d|Duration|Registers Per|Achieved Occ" "$log"
