#!/usr/bin/env bash
# own_gpu.sh BIN [BUDGET_S=560]: the block backward's own keys in their own kernel
# (ops_cuda_attn_own.cu) on the GPU, against DFLASH_CUDA_ATTN_OWN=0 (the fused kernel visits
# them, as before) in the same call: attention parity with it on, off and under the fallback
# kernels; the block backward alone (bench-cuda_ops, step anchors), interleaved twice; all the
# parity checks; each kernel's time under ncu; the 3072/512 step on, off, on around the PyTorch reference; memcheck last.
# About 6 minutes on an H200 (bench/cuda_ops/NOTES.md, "The own keys in a kernel of their own").
bin=${1:-build-gpu}
budget=${2:-560}
log=${OUT:-.}/own.log
source "$(dirname "$0")/gpu_run.sh"
off=DFLASH_CUDA_ATTN_OWN=0
run par_own 60 "$P" attn
run par_off 60 $off "$P" attn
run par_mma 60 DFLASH_CUDA_ATTN_BWD=mma "$P" attn
run par_seq 60 DFLASH_CUDA_ATTN_BWD=wgmma_seq "$P" attn
for i in 1 2; do
  run attn_on$i 40 "$B" 0 attn
  run attn_off$i 40 $off "$B" 0 attn
done
K="regex:k_bwd_own|k_own_spans|k_wgb_fused|k_bwd_rowD|k_bwd_dq_out"
run ncu_on 90 ncu --clock-control none -k "$K" -c 4 --section SpeedOfLight "$B" 0 attn
run ncu_off 90 $off ncu --clock-control none -k "$K" -c 3 --section SpeedOfLight "$B" 0 attn
run parity 120 "$P"
D="$bin/bench-drafter 5 s3072_a512 8 40"
run step_on1 150 $D
run torch 240 python3 bench/drafter/torch_drafter_bench.py --peak-tflops 800 --steps 40 \
  --cases s3072_a512
run step_off 150 $off $D
run step_on2 150 $D
run memcheck 150 compute-sanitizer --tool memcheck "$P" attn
grep -E "^===|^rc |ms/step|attention_block_bwd|FAIL|failed|ERROR SUMMARY|energy:|^  k_|Duration" \
  "$log"
