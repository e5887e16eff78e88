#!/usr/bin/env bash
# learn_gpu.sh BIN [BUDGET_S=500]: does cuda training learn? bench-cuda_parity learn (cuda
# beside a cpu twin at D 512 with the bench's block and head shapes, then cuda alone at the
# bench's size; LEARN=0 leaves it out), bench-drafter's 40-step curve at 768/256 with fresh
# random tables and, where carried, $bin/base/bench-drafter's (the repeated tables before
# 3ed4ca7: its loss stops at ln 37.1 = 3.61), and the PyTorch reference's curve; then the
# 3072/512 step and its energy against PyTorch's.
bin=${1:?usage: learn_gpu.sh BIN [BUDGET_S]}
budget=${2:-500}
log=${OUT:-.}/learn.log
source "$(dirname "$0")/gpu_run.sh"
T="python3 bench/drafter/torch_drafter_bench.py --steps 40"
[ "${LEARN:-1}" = 0 ] || run learn 300 "$P" learn
run fresh_768 120 "$bin/bench-drafter" 5 s768_a256 0 40
[ -x "$bin/base/bench-drafter" ] && run repeated_768 120 "$bin/base/bench-drafter" 5 s768_a256 0 40
run torch_768 200 $T --cases s768_a256
run fresh_3072 150 "$bin/bench-drafter" 5 s3072_a512 8 40
run torch_3072 240 $T --cases s3072_a512
grep -E "^===|^rc |learn D|last loss|ms/step|energy|curve|last step|FAIL|checks failed" "$log" |
  cut -c1-400
