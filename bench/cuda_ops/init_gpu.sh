#!/usr/bin/env bash
# init_gpu.sh BIN [STEPS=40]: does the drafter step's time, energy or loss depend on how the
# bench draws its random embedding and lm_head? $bin/bench-drafter (normal, as the PyTorch
# reference draws them) against $bin/base/bench-drafter (uniform), interleaved, and the PyTorch
# reference once, STEPS timed steps each at 3072/512.
bin=${1:-build-gpu}
steps=${2:-40}
log=${OUT:-.}/init.log
source "$(dirname "$0")/gpu_run.sh"
run normal_1 150 "$bin/bench-drafter" 5 s3072_a512 8 $steps
run uniform_1 150 "$bin/base/bench-drafter" 5 s3072_a512 8 $steps
run torch 240 python3 bench/drafter/torch_drafter_bench.py --steps $steps \
  --cases s3072_a512
run normal_2 150 "$bin/bench-drafter" 5 s3072_a512 8 $steps
run uniform_2 150 "$bin/base/bench-drafter" 5 s3072_a512 8 $steps
grep -E "^===|^rc |ms/step|energy|FAILED" "$log"
