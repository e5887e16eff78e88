#!/usr/bin/env bash
# graph_gpu.sh BIN: a step as one CUDA graph (DFLASH_CUDA_GRAPH=1) against the step queued op by
# op: parity with graphs, then bench-drafter at 3072/512 interleaved twice, and PyTorch once.
bin=${1:-build-gpu}
log=${OUT:-.}/graph.log
source "$(dirname "$0")/gpu_run.sh"
run parity_graph 60 DFLASH_CUDA_GRAPH=1 "$P"
run step_off1 150 "$bin/bench-drafter" 5 s3072_a512 8
run step_graph1 150 DFLASH_CUDA_GRAPH=1 "$bin/bench-drafter" 5 s3072_a512 8
run torch 200 python3 bench/drafter/torch_drafter_bench.py --peak-tflops 800 --cases s3072_a512
run step_graph2 150 DFLASH_CUDA_GRAPH=1 "$bin/bench-drafter" 5 s3072_a512 8
run step_off2 150 "$bin/bench-drafter" 5 s3072_a512 8
