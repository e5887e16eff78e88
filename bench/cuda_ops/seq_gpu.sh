#!/usr/bin/env bash
# seq_gpu.sh BIN: the drafter step's products by their place in the step (DFLASH_PROF_SEQ),
# default rows and DFLASH_LAST_LAYER_ROWS=all, with the board's clock and power sampled every
# 50 ms beside each run (the board of CUDA device 0 alone: gpu_run.sh's sample_board).
bin=${1:-build-gpu}
log=${OUT:-.}/seq.log
source "$(dirname "$0")/gpu_run.sh"
sampled() {
  local name=$1; shift
  sample_board "${OUT:-.}/power_$name.csv" 50 timestamp,clocks.sm,power.draw,temperature.gpu
  run "$name" 150 "$@"
  stop_board
}
sampled seq_default DFLASH_PROF_SEQ=1 "$bin/bench-drafter" 5 s3072_a512 8
sampled seq_allrows DFLASH_PROF_SEQ=1 DFLASH_LAST_LAYER_ROWS=all "$bin/bench-drafter" 5 s3072_a512 8
