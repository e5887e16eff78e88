#!/usr/bin/env bash
# split_energy_gpu.sh: joules per call of the block backward with shorter pieces
# (DFLASH_CUDA_ATTN_SPLIT: pieces of 2 N blocks; default N 80) and kv heads in groups
# (DFLASH_CUDA_ATTN_HEAD_GROUP, bf7ad20's binary in abl/): `BENCH_ENERGY_S=1.5 bench-cuda_ops 0
# attn`. Usage on the GPU machine: bench/cuda_ops/split_energy_gpu.sh BIN_DIR. Log:
# $OUT/split_energy.log.
set -uo pipefail
bin=${1:?BIN_DIR}
log=${OUT:-.}/split_energy.log
. "$(dirname "$0")/gpu_run.sh"
E=BENCH_ENERGY_S=1.5
A="$bin/abl/bench-cuda_ops"
S=DFLASH_CUDA_ATTN_SPLIT
G=DFLASH_CUDA_ATTN_HEAD_GROUP
run g8_a 60 $E "$A" 0 attn
run s32_g8 60 $E $S=32 "$A" 0 attn
run s32_g2 60 $E $S=32 $G=2 "$A" 0 attn
run s32_g1 60 $E $S=32 $G=1 "$A" 0 attn
run s16_g2 60 $E $S=16 $G=2 "$A" 0 attn
run s16_g1 60 $E $S=16 $G=1 "$A" 0 attn
run g2 60 $E $G=2 "$A" 0 attn
run g8_b 60 $E "$A" 0 attn
echo "=== summary" >>"$log"
grep -E "^=== |attention_block_bwd .*step" "$log" | grep -v "^=== summary" >>"$log"
