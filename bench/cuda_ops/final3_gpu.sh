#!/usr/bin/env bash
# final3_gpu.sh: the block backward's dQ-before-dK visit (4b58c96) on the H200 in one call:
# parity of everything, of the target forward and of the block backward's fallbacks, memcheck
# of the attention (default and PIPE), the block backward alone against $bin/base's, the
# 3072/512 step interleaved with the base's and around the PyTorch reference, 768/256 against
# PyTorch, and the main job (`DEMO_BACKEND=cuda scripts/demo`).
# Usage (GPU machine, repository root): bench/cuda_ops/final3_gpu.sh BIN_DIR (bench-cuda_parity,
# bench-cuda_ops, bench-drafter, bench-target_parity, the dflash-* daemons and tools, devlibs/,
# COMMIT, base/bench-cuda_ops and base/bench-drafter). Log: $OUT/final3.log.
set -uo pipefail
bin=${1:?usage: final3_gpu.sh BIN_DIR}
log=${OUT:-.}/final3.log
source "$(dirname "$0")/gpu_run.sh"
D="$bin/bench-drafter 5"
T="python3 bench/drafter/torch_drafter_bench.py --steps 40"
run parity 90 "$P"
run target_parity 60 "$bin/bench-target_parity"
bwd_fallback_parity
run par_pp0 30 DFLASH_CUDA_ATTN_PP=0 "$P" attn
run memcheck 90 compute-sanitizer --tool memcheck "$P" attn
run memcheck_pp0 90 DFLASH_CUDA_ATTN_PP=0 compute-sanitizer --tool memcheck "$P" attn
for r in 1 2; do
  run ops_new$r 30 "$B" 0 attn
  run ops_base$r 30 "$BASE" 0 attn
done
run s1 60 $D s3072_a512 8 40
run b1 60 "$bin/base/bench-drafter" 5 s3072_a512 8 40
run torch 130 $T --cases s3072_a512
run s2 60 $D s3072_a512 8 40
run b2 60 "$bin/base/bench-drafter" 5 s3072_a512 8 40
run o768 45 $D s768_a256 8 40
run t768 110 $T --cases s768_a256
demo_build=$(mktemp -d) # the layout scripts/demo expects of a build directory
mkdir -p "$demo_build"/services/{queue,target,drafter} "$demo_build/tools"
for s in queue target drafter; do ln -s "$PWD/$bin/dflash-$s" "$demo_build/services/$s/"; done
for t in ctl mkmodel gen data; do ln -s "$PWD/$bin/dflash-$t" "$demo_build/tools/"; done
run demo 120 DEMO_BACKEND=cuda scripts/demo --build "$demo_build" --no-build --clean
echo "=== summary" >>"$log"
grep -E "^=== |^rc |checks failed|ERROR SUMMARY|ok|block_bwd .*step|ms/step|energy:|\
attention_block_bwd +10|loss .* -> |tau" "$log" | grep -v "^=== summary" >>"$log"
