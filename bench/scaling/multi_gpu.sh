#!/usr/bin/env bash
# bench/scaling/multi_gpu.sh: one target GPU feeding data-parallel drafter GPUs (issue 7), with the
# real daemons: dflash-target on GPU 0, drafters on GPUs 1..N in one `--group` over NCCL.
#
#   1. one drafter alone (GPU 1) trains STEPS steps: samples/s of one drafter;
#   2. N drafters (GPUs 1..N) in one group train STEPS group steps: samples/s of the group, the
#      scaling efficiency (group / (N x one)), the target GPU's busy fraction (nvidia-smi
#      utilization of GPU 0 sampled every 0.5 s during the group phase) and the broker's mix TV
#      distance; then the group's ranks must end at the same step with the same state hash.
# Also on a machine with >= 2 GPUs: test_pool_cuda times the cross-GPU slot hand-off (GPU 0's
# arena imported on GPU 1, copied over NVLink peer access) in GB/s, when BIN_DIR has it.
#
# Usage (GPU machine with >= 2 GPUs, repository root): bench/scaling/multi_gpu.sh BIN_DIR [MODEL_DIR]
#   BIN_DIR as for bench/pipeline/real_model.sh (gathered by scripts/gpu-carry); MODEL_DIR
#   (default /tmp/dflash-qwen3-8b) is made by bench/target/make_checkpoint.py when missing.
#   Environment: DRAFTERS (visible GPUs - 1), STEPS (30), SEQS (400), BACKEND (cuda), COMM
#   (nccl; shm also runs a group on one GPU: every rank on GPU 0, as a functional check), DRAFT_LAYERS
#   (5), ANCHORS (512), LEN_MIN / LEN_MAX (64 / 3072). A cpu dry run of the
#   logic: BACKEND=host COMM=shm DRAFTERS=2 with a small dflash-mkmodel target, DRAFT_LAYERS=1
#   ANCHORS=8. Logs go to $OUT (or ./scaling-logs).
set -uo pipefail
bin=$(cd "${1:?usage: bench/scaling/multi_gpu.sh BIN_DIR [MODEL_DIR]}" && pwd)
model=${2:-/tmp/dflash-qwen3-8b}
backend=${BACKEND:-cuda}
comm=${COMM:-nccl}
steps=${STEPS:-30}
gpus=$(nvidia-smi -L 2>/dev/null | wc -l)
drafters=${DRAFTERS:-$((gpus > 1 ? gpus - 1 : 1))}
out=${OUT:-scaling-logs}
mkdir -p "$out"
here=$(cd "$(dirname "$0")" && pwd)
source "$here/../pipeline/lib.sh"
if [ "$backend" = cuda ] && [ "$gpus" -lt 2 ] && [ "$comm" = nccl ]; then
  echo "multi_gpu: NCCL needs a GPU per rank (nvidia-smi lists $gpus; COMM=shm runs every rank on GPU 0)" >&2
  exit 77
fi
gpu_of() { [ "$gpus" -gt 1 ] && echo $(( $1 % gpus )) || echo 0; } # rank r on GPU r (GPU 0 alone: all)
pipe_setup "$model" "$backend" "$out"
pipe_queue --min-ready 0 --max-depth $((4 * drafters + 4))
pipe_target --device 0 --slots $((4 * drafters + 4)) --epochs 100

drafter() { # drafter NAME DEVICE STEPS [ARGS...]: one dflash-drafter in the background
  local name=$1 dev=$2 n=$3
  shift 3
  "$bin/dflash-drafter" --runtime-dir "$run" --name "$name" --model "$model" "${SLOT_ARGS[@]}" \
    --device "$dev" --draft-layers "${DRAFT_LAYERS:-5}" --block-size 16 --anchors "${ANCHORS:-512}" \
    --max-steps "$n" --metrics-dir "$out/metrics-$name" --progress-ms 10000 "$@" \
    > "$out/$name.log" 2>&1 &
  pids+=($!)
}

# ---- 1. one drafter
drafter solo "$(gpu_of 1)" "$steps"
wait "${pids[-1]}" || pipe_die "the solo drafter failed"

# ---- 2. the group
gpids=()
for r in $(seq 1 "$drafters"); do
  drafter "rank$r" "$(gpu_of "$r")" "$steps" --group g --comm "$comm"
  gpids+=("${pids[-1]}")
done
util="$out/gpu0_util.csv"
if [ "$backend" = cuda ]; then
  nvidia-smi -i 0 --query-gpu=utilization.gpu --format=csv,noheader,nounits -lms 500 > "$util" &
  pids+=($!)
  smi=$!
fi
for p in "${gpids[@]}"; do wait "$p" || pipe_die "a group drafter failed"; done
[ -n "${smi:-}" ] && kill "$smi" 2>/dev/null
tv=$(pipe_status | python3 -c "import json,sys; print(json.load(sys.stdin)['tv_distance'])")
pipe_ctl drain > /dev/null || pipe_die "dflash-ctl drain failed"
pipe_stop_target

python3 - "$out" "$drafters" "$util" "$tv" <<'EOF'
import json, os, sys
out, n, util, tv = sys.argv[1], int(sys.argv[2]), sys.argv[3], float(sys.argv[4])
def rate(name):
    """samples/s over the steady part of a drafter's metrics (records from step 4 on)."""
    recs = sorted((json.loads(l) for l in open(os.path.join(out, "metrics-" + name, "metrics.jsonl"))
                   if l.strip()), key=lambda r: r["step"])
    rs = [r for r in recs if r["step"] >= 4]
    if len(rs) < 3: return float("nan")
    dt = rs[-1]["time"] - rs[0]["time"]
    seqs = sum(r["samples_per_s"] * r.get("perf/step_s", 0) for r in rs[1:])
    return seqs / dt if dt > 0 else float("nan")
one = rate("solo")
group = rate("rank1") * n  # every rank trains its own batch of each group step
print("RESULT drafters=1 samples_per_s=%.2f" % one)
print("RESULT drafters=%d samples_per_s=%.2f scaling_efficiency=%.1f%%" % (n, group, 100 * group / (n * one)))
if os.path.exists(util) and os.path.getsize(util):
    v = [float(x) for x in open(util).read().split() if x.strip()]
    print("RESULT target_gpu_busy=%.1f%% (nvidia-smi utilization of GPU 0, %d samples)" % (sum(v) / len(v), len(v)))
print("RESULT mix_tv_distance=%.4f" % tv)
EOF
grep -h "final state at step\|training:" "$out"/rank*.log | sed 's/.*\(INFO\|WARN\) *//' |
  tail -n $((2 * drafters))
# the group's ranks end at the same step with the same state (each logs its final hash)
finals=$(for f in "$out"/rank*.log; do
  grep -o "final state at step [0-9]* has hash [0-9a-f]*" "$f" | tail -n 1; done)
[ "$(echo "$finals" | grep -c .)" = "$drafters" ] ||
  pipe_die "not every rank logged its final state ($(echo "$finals" | grep -c .) of $drafters)"
[ "$(echo "$finals" | sort -u | wc -l)" = 1 ] ||
  pipe_die "the ranks end apart: $(echo "$finals" | tr '\n' ';')"
echo "ranks agree: $(echo "$finals" | head -n 1)"
if [ "$backend" = cuda ] && [ -x "$bin/test_pool_cuda" ]; then
  echo "== cross-GPU slot hand-off (GPU 0 arena, importers on GPU 0 and GPU 1)"
  "$bin/test_pool_cuda" 64 200 > "$out/pool_cuda.log" 2>&1 || pipe_die "test_pool_cuda failed"
  tail -n 12 "$out/pool_cuda.log"
fi
