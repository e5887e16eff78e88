# skip_gpu.sh: the block backward's dead-warpgroup skip (DFLASH_CUDA_ATTN_SKIP) on the H200:
# parity, the kernel alone and the 3072/512 step against base/ (the binaries before the change)
# and PyTorch. Usage: bash bench/cuda_ops/skip_gpu.sh BIN BUDGET_S
bin=$1; budget=$2; log=$OUT/skip.log
source bench/cuda_ops/gpu_run.sh
S=DFLASH_CUDA_ATTN_SKIP
D="bench-drafter 5 s3072_a512 8 40"
run par_attn 40 "$P" attn
run par_attn_noskip 40 $S=0 "$P" attn
run par_attn_split1 40 DFLASH_CUDA_ATTN_SPLIT=1 "$P" attn
run parity 90 "$P"
run tparity 60 "$bin/bench-target_parity"
for r in 1 2; do
  run ops_base$r 40 "$BASE" 0 attn
  run ops_new$r 40 "$B" 0 attn
  run ops_noskip$r 40 $S=0 "$B" 0 attn
done
run step_new1 50 $bin/$D
run step_base1 50 $bin/base/$D
run torch 120 python3 bench/drafter/torch_drafter_bench.py --peak-tflops 800 --steps 40 \
  --cases s3072_a512
run step_new2 50 $bin/$D
run step_base2 50 $bin/base/$D
k=_Z11k_wgb_fusedILi128ELb1ELb1ELb1EEv8bwd_args8wgb_maps
for v in new base; do
  f=$bin/bench-cuda_ops; [ $v = base ] && f=$BASE
  cuobjdump -sass -fun $k $f > $OUT/$v.sass 2>&1; xz -f $OUT/$v.sass
done
