#!/usr/bin/env bash
# final2_gpu.sh: the session's changes on the H200 in one call (the split masters and the RoPE
# angle table): parity of everything (and of the target forward, where carried), the learning
# runs (bench-cuda_parity learn, added 2026-12-02), memcheck of
# the ops and optimizer groups, the data-parallel test, the main job (`DEMO_BACKEND=cuda
# scripts/demo`, where the daemons are carried), then the 3072/512 drafter step twice with the
# PyTorch reference between, and $bin/base's step after each where a base is carried. (At
# 08d1c5f it also timed the dw-stream option, since removed.)
# Usage (GPU machine, repository root): bench/cuda_ops/final2_gpu.sh BIN_DIR [BUDGET_S]
set -uo pipefail
bin=${1:?usage: final2_gpu.sh BIN_DIR [BUDGET_S]}
budget=${2:-560}
log=${OUT:-.}/final2.log
source "$(dirname "$0")/gpu_run.sh"
D="$bin/bench-drafter"
run parity 60 "$P"
run learn 300 "$P" learn
[ -x "$bin/bench-target_parity" ] && run target_parity 90 "$bin/bench-target_parity"
run memcheck_ops 90 compute-sanitizer --tool memcheck "$P" ops
run memcheck_optim 60 compute-sanitizer --tool memcheck "$P" optim
[ -x "$bin/test_dp_nccl" ] && run dp 60 "$bin/test_dp_nccl"
if [ -x "$bin/dflash-drafter" ]; then # the layout scripts/demo expects of a build directory
  demo_build=$(mktemp -d)
  mkdir -p "$demo_build"/services/{queue,target,drafter} "$demo_build/tools"
  for s in queue target drafter; do ln -s "$PWD/$bin/dflash-$s" "$demo_build/services/$s/"; done
  for t in ctl mkmodel gen data; do ln -s "$PWD/$bin/dflash-$t" "$demo_build/tools/"; done
  run demo 120 DEMO_BACKEND=cuda scripts/demo --build "$demo_build" --no-build --clean
fi
for r in 1 2; do
  run "step_new$r" 80 "$D" 5 s3072_a512 8
  [ -x "$bin/base/bench-drafter" ] && run "step_base$r" 80 "$bin/base/bench-drafter" 5 s3072_a512 8
  [ $r = 1 ] && run torch 110 python3 bench/drafter/torch_drafter_bench.py \
    --cases s3072_a512
done
grep -E "^===|^rc |ms/step|RESULT|checks failed|FAIL|ERROR SUMMARY|round trip|bit-identical|\
loss .* -> |tau|head_norm_rope|linear_bwd|adamw |rope_table" "$log" | grep -v "PASS"
