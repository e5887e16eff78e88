# swiglu_gpu.sh: the SwiGLU epilogue (linear_swiglu_fwd, ops_cuda_wg_gemm.cu) on the GPU: parity,
# the probe's fused-against-pass timing, and the drafter step with and without it beside PyTorch.
# Carry build-gpu (scripts/gpu-carry) and build-probe (wg_gemm_probe, its header's command).
bin=build-gpu; log=$OUT/r.log; budget=520
source bench/cuda_ops/gpu_run.sh
T="python3 bench/drafter/torch_drafter_bench.py --peak-tflops 800 --steps 40"
run parity 130 "$P"
run tparity 90 $bin/bench-target_parity
run swiglu 60 build-probe/wg_gemm_probe 1.2 swiglu
run fused1 70 $bin/bench-drafter 5 s3072_a512 8 40
run base1 70 DFLASH_CUDA_WG_GEMM=0 $bin/bench-drafter 5 s3072_a512 8 40
run torch 150 $T --cases s3072_a512
run fused2 70 $bin/bench-drafter 5 s3072_a512 8 40
run base2 70 DFLASH_CUDA_WG_GEMM=0 $bin/bench-drafter 5 s3072_a512 8 40
