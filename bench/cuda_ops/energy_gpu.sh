#!/usr/bin/env bash
# energy_gpu.sh BIN [STEPS=40]: the drafter step's time and energy (bench-drafter's energy
# line) against the PyTorch reference's in the same call, STEPS timed steps each (NVML's counter
# is coarse over the default 10), 3072/512 (ours twice around PyTorch) and 768/256, with the
# board's clock and power sampled every 100 ms into $OUT/power.csv (the board of CUDA device 0
# alone, each row labelled: gpu_run.sh's sample_board); first, where it was carried,
# bench-cuda_ops's rows with their joules per call (BENCH_ENERGY_S: each op alone for 1.5 s).
bin=${1:-build-gpu}
steps=${2:-40}
log=${OUT:-.}/energy.log
source "$(dirname "$0")/gpu_run.sh"
sample_board "${OUT:-.}/power.csv" 100 timestamp,clocks.sm,power.draw
[ -x "$B" ] && run ops_energy 200 BENCH_ENERGY_S=1.5 "$B" 0
T="python3 bench/drafter/torch_drafter_bench.py --steps $steps"
run ours_3072_1 150 "$bin/bench-drafter" 5 s3072_a512 8 $steps
run torch_3072 240 $T --cases s3072_a512
run ours_3072_2 150 "$bin/bench-drafter" 5 s3072_a512 8 $steps
run ours_768 150 "$bin/bench-drafter" 5 s768_a256 8 $steps
run torch_768 240 $T --cases s768_a256
stop_board
grep -E "^===|^rc |ms/step|energy|FAILED|J/call|^linear|^attention|^lm_head|^peak" "$log"
