#!/usr/bin/env bash
# free_gpu.sh BIN [STEPS=40]: what each op costs the drafter step at 3072/512 (bench-drafter's
# BENCH_FREE: the same STEPS steps again with an op set left out, the optimizer left out in every
# set so that all sets run the same weights), twice around the PyTorch reference for the ratio
# (bench/RESULTS.md, "what each op costs the step"; about 4 minutes on an H200).
bin=${1:-build-gpu}
steps=${2:-40}
log=${OUT:-.}/free.log
source "$(dirname "$0")/gpu_run.sh"
S="optimizer;optimizer,attention;optimizer,attention_block_bwd;optimizer,attention_block_fwd"
S="$S;optimizer,memory;optimizer,swiglu_fwd,swiglu_bwd"
S="$S;optimizer,rmsnorm_fwd,rmsnorm_bwd,head_norm_rope_fwd,head_norm_rope_bwd;nonproducts"
S="$S;optimizer,lm_head_xent;optimizer"
run free1 200 BENCH_FREE="$S" "$bin/bench-drafter" 5 s3072_a512 8 "$steps"
run torch 240 python3 bench/drafter/torch_drafter_bench.py --steps "$steps" \
  --cases s3072_a512
run free2 200 BENCH_FREE="$S" "$bin/bench-drafter" 5 s3072_a512 8 "$steps"
grep -E "^===|^rc |ms/step|free=|energy:|FAIL" "$log"
