#!/usr/bin/env bash
# seeds_gpu.sh: do bench-drafter and the PyTorch reference learn alike? Each run trains the
# 3072/512 drafter on one batch with anchors re-drawn every step and prints its loss per step
# (bench-drafter's curve line); one draw says little, since the curves' ends spread from run to
# run. So: bench-drafter under BENCH_SEED 0-3 and the reference under --seed 0-2, STEPS steps
# each (default 60, at most 64), interleaved, then a table of each run's loss at steps 20, 30,
# 40, 50, 60 and the first step under 1.0 and 0.3.
# Usage (GPU machine, repository root): bench/drafter/seeds_gpu.sh BIN_DIR [STEPS]
# (BIN_DIR: bench-drafter and devlibs/, as scripts/gpu-carry leaves them). Log: $OUT/seeds.log.
set -uo pipefail
bin=${1:?usage: seeds_gpu.sh BIN_DIR [STEPS]}
steps=${2:-60}
log=${OUT:-.}/seeds.log
source "$(dirname "$0")/../cuda_ops/gpu_run.sh"
T="python3 bench/drafter/torch_drafter_bench.py --steps $steps"
T="$T --cases s3072_a512"
for s in 0 1 2 3; do
  run "ours_seed$s" 90 BENCH_SEED=$s "$bin/bench-drafter" 5 s3072_a512 8 "$steps"
  [ $s -lt 3 ] && run "torch_seed$s" 150 $T --seed $s
done
python3 - "$log" <<'PY' | tee -a "$log"
import re, sys
name, rows = None, []
for line in open(sys.argv[1]):
    m = re.match(r"=== (\S+):", line)
    if m:
        name = m.group(1)
    elif line.startswith("curve") and name:
        loss = [float(t.split("/")[0]) for t in line.split(":", 1)[1].split()]
        rows.append((name, loss))
        name = None
first = lambda l, x: next((i + 1 for i, v in enumerate(l) if v < x), "-")
at = lambda l, i: f"{l[i - 1]:.3f}" if len(l) >= i else "-"
print("run            loss@20  loss@30  loss@40  loss@50  loss@60  first<1.0  first<0.3")
for n, l in rows:
    print(f"{n:14s} " + " ".join(f"{at(l, i):>8s}" for i in (20, 30, 40, 50, 60)) +
          f" {first(l, 1.0)!s:>10s} {first(l, 0.3)!s:>10s}")
PY
