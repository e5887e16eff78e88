#!/usr/bin/env bash
# emb_gpu.sh BIN: the embedding gather in 16-byte words: parity (everything and the target),
# memcheck of the ops group, then bench-drafter at 3072/512 against $BIN/base's, once each.
bin=${1:-build-gpu}
log=${OUT:-.}/emb.log
source "$(dirname "$0")/gpu_run.sh"
run parity 60 "$P"
run target_parity 90 "$bin/bench-target_parity"
run memcheck_ops 90 compute-sanitizer --tool memcheck "$P" ops
run step_new 80 "$bin/bench-drafter" 5 s3072_a512 8
run step_base 80 "$bin/base/bench-drafter" 5 s3072_a512 8
