#!/usr/bin/env bash
# timed_gpu.sh: why the profiled drafter steps (synchronous, an event pair around every op) take
# ~1.5 ms less per step than the timed ones (queued as the daemon queues them): the 3072/512
# step timed queued, synchronous (DFLASH_BENCH_TIMED=sync) and queued with the events
# (DFLASH_BENCH_TIMED=events), interleaved twice, one binary.
# Usage (GPU machine, repository root): bench/cuda_ops/timed_gpu.sh BIN_DIR [BUDGET_S]
set -uo pipefail
bin=${1:?usage: timed_gpu.sh BIN_DIR [BUDGET_S]}
budget=${2:-500}
log=${OUT:-.}/timed.log
[ -f "$bin/devlibs/libopenblas.so.0.xz" ] && xz -d -f "$bin/devlibs/libopenblas.so.0.xz"
source "$(dirname "$0")/gpu_run.sh"
D="$bin/bench-drafter"
for r in 1 2; do
  run "queued$r" 80 "$D" 5 s3072_a512 8
  run "sync$r" 80 DFLASH_BENCH_TIMED=sync "$D" 5 s3072_a512 8
  run "events$r" 80 DFLASH_BENCH_TIMED=events "$D" 5 s3072_a512 8
done
grep -E "^===|^rc |ms/step|host per|op profile" "$log"
