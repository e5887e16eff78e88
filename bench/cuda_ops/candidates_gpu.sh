#!/usr/bin/env bash
# candidates_gpu.sh: the three opt-in speed candidates built without a GPU (2026-12-01) checked
# and timed together, in two device calls of one binary:
#   side  DFLASH_CUDA_SIDE_STREAM=1  AdamW on a low-priority stream under the next forward
#   pp3   DFLASH_CUDA_ATTN_PP=3      the block backward with three stages
#   xent  DFLASH_CUDA_XENT=smem      the loss's softmax reading each logits row once
# Usage on the GPU machine: bench/cuda_ops/candidates_gpu.sh BIN_DIR [BUDGET_S] [STEPS]
# BIN_DIR holds the carried binaries (scripts/gpu-carry), devlibs/ and COMMIT. STEPS:
#   checks  (call 1, at most 570 s) pp3's attention parity and memcheck (attn_pp3_gpu.sh's
#           steps), xent's loss parity and memcheck (xent_gpu.sh's), then the whole parity run
#           with all three on (its queued training steps exercise the side stream)
#   ab      (call 2, ~7 min; a run whose timeout would end past BUDGET_S is skipped)
#           `bench-drafter 5 s3072_a512 8`: all off, all on, side, pp3, xent, all off, all on
#           (one binary, same run), then the PyTorch reference once
# Logs: $OUT/candidates.log (and the two scripts' own); a summary comes last. A candidate whose
# checks fail is not to be timed further; one that is faster in `ab` becomes the default in
# its own commit (its variable's parse and docs/operating.md).
set -uo pipefail
bin=${1:?BIN_DIR}
budget=${2:-580}
steps=${3:-checks}
out=${OUT:-.}
here=$(dirname "$0")
[ -f "$bin/devlibs/libopenblas.so.0.xz" ] && xz -d -f "$bin/devlibs/libopenblas.so.0.xz"
ALL="DFLASH_CUDA_SIDE_STREAM=1 DFLASH_CUDA_ATTN_PP=3 DFLASH_CUDA_XENT=smem"
for step in $steps; do
  case $step in
  checks)
    # each script skips a step whose timeout would end past its budget: 170 + 230 + 170 s
    bash "$here/attn_pp3_gpu.sh" "$bin" 170 "parity memcheck"
    bash "$here/xent_gpu.sh" "$bin" 230 "parity memcheck"
    log=$out/candidates.log
    . "$here/gpu_run.sh"
    # shellcheck disable=SC2086 # ALL is a list of assignments
    run parity_all_on 170 $ALL "$P"
    ;;
  ab)
    log=$out/candidates.log
    . "$here/gpu_run.sh"
    D="$bin/bench-drafter 5 s3072_a512 8"
    # shellcheck disable=SC2086
    {
      run off1 90 DFLASH_CUDA_SIDE_STREAM=0 $D
      run all1 90 $ALL $D
      run side 90 DFLASH_CUDA_SIDE_STREAM=1 $D
      run pp3 90 DFLASH_CUDA_ATTN_PP=3 $D
      run xent 90 DFLASH_CUDA_XENT=smem $D
      run off2 90 DFLASH_CUDA_SIDE_STREAM=0 $D
      run all2 90 $ALL $D
      run torch 120 python3 bench/drafter/torch_drafter_bench.py --cases s3072_a512
    }
    ;;
  esac
done
grep -E "^binaries|^=== |^rc |optimizer side|train steps|checks failed|FAIL|ms/step|RESULT" \
  "$out/candidates.log" | head -80
