#!/usr/bin/env bash
# bench/scaling/multi_gpu.sh: one target GPU feeding data-parallel drafter GPUs (issue 7), with the
# real daemons: dflash-target on GPU 0, drafters on GPUs 1..N in one `--group` over NCCL.
#
#   1. one drafter alone (GPU 1) trains STEPS steps: samples/s of one drafter;
#   2. N drafters (GPUs 1..N, one each) in one group (--group-size N: no step of fewer ranks)
#      train STEPS group steps: samples/s of the group, the scaling efficiency
#      (group / (N x one)), the target GPU's busy fraction (nvidia-smi utilization of the
#      target's board, found by its PCI bus id, sampled every 0.5 s and kept only between the
#      group's first and last metrics records: not the ranks' start-up) and the broker's mix TV
#      distance; then the group's ranks must end at the same step with the same state hash.
# GPUs are counted as CUDA counts them (the driver, honouring CUDA_VISIBLE_DEVICES; ordinals in
# CUDA_DEVICE_ORDER, PCI_BUS_ID unless set), not as nvidia-smi lists them. NCCL takes one GPU
# per rank (two ranks on one GPU are refused): with COMM=nccl, DRAFTERS above the visible GPUs
# less the target's is refused (exit 2). On 2 GPUs the group is thus a single rank (world 1:
# nothing is all-reduced between GPUs; said at the start). COMM=shm spreads the ranks over
# GPUs 1..N-1 (several on one GPU when DRAFTERS is larger), or puts them all on GPU 0 on a
# one-GPU machine, as a functional check.
# Also on a machine with >= 2 GPUs: test_pool_cuda times the cross-GPU slot hand-off (GPU 0's
# arena imported on GPU 1, copied over NVLink peer access) in GB/s, when BIN_DIR has it.
#
# Usage (GPU machine with >= 2 GPUs, repository root): bench/scaling/multi_gpu.sh BIN_DIR [MODEL_DIR]
#   BIN_DIR as for bench/pipeline/real_model.sh (gathered by scripts/gpu-carry); MODEL_DIR
#   (default /tmp/dflash-qwen3-8b) is made by bench/target/make_checkpoint.py when missing.
#   Environment: DRAFTERS (visible GPUs - 1), STEPS (30), SEQS (400), BACKEND (cuda), COMM
#   (nccl, or shm), DRAFT_LAYERS (5), ANCHORS (512), LEN_MIN / LEN_MAX (64 / 3072);
#   NCCL_NVLS_ENABLE is 0 unless set. A cpu dry run of the logic: BACKEND=host COMM=shm
#   DRAFTERS=2 with a small dflash-mkmodel target, DRAFT_LAYERS=1 ANCHORS=8. Logs go to $OUT
#   (or ./scaling-logs).
set -uo pipefail
bin=$(cd "${1:?usage: bench/scaling/multi_gpu.sh BIN_DIR [MODEL_DIR]}" && pwd)
model=${2:-/tmp/dflash-qwen3-8b}
backend=${BACKEND:-cuda}
comm=${COMM:-nccl}
steps=${STEPS:-30}
out=${OUT:-scaling-logs}
mkdir -p "$out"
here=$(cd "$(dirname "$0")" && pwd)
source "$here/../pipeline/lib.sh"
export CUDA_DEVICE_ORDER=${CUDA_DEVICE_ORDER:-PCI_BUS_ID} NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}

# The GPUs CUDA sees, one line each: "ORDINAL PCI_BUS_ID" (the driver's count, which honours
# CUDA_VISIBLE_DEVICES and lists what CUDA can use, not nvidia-smi's every board and MIG line).
cuda_gpus() {
  python3 - <<'PY'
import ctypes, sys
try:
    cu = ctypes.CDLL("libcuda.so.1")
except OSError as e:
    sys.exit("multi_gpu: cannot load the CUDA driver (libcuda.so.1): %s" % e)
rc = cu.cuInit(0)
if rc == 100:  # CUDA_ERROR_NO_DEVICE
    sys.exit(0)
if rc != 0:
    sys.exit("multi_gpu: cuInit failed (CUDA driver error %d)" % rc)
n = ctypes.c_int(0)
cu.cuDeviceGetCount(ctypes.byref(n))
for i in range(n.value):
    dev, bus = ctypes.c_int(0), ctypes.create_string_buffer(32)
    if cu.cuDeviceGet(ctypes.byref(dev), i) or cu.cuDeviceGetPCIBusId(bus, 32, dev):
        sys.exit("multi_gpu: cannot read CUDA device %d's PCI bus id" % i)
    print(i, bus.value.decode())
PY
}

gpus=0
if [ "$backend" = cuda ]; then
  gpu_list=$(cuda_gpus) || exit 1
  gpus=$(echo "$gpu_list" | grep -c .)
  echo "CUDA sees $gpus GPU(s) (CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES-unset}): $(echo "$gpu_list" | paste -sd ";")"
  [ "$gpus" -ge 1 ] || { echo "multi_gpu: no CUDA device visible" >&2; exit 77; }
fi
drafters=${DRAFTERS:-$((gpus > 1 ? gpus - 1 : 1))}
if [ "$backend" = cuda ] && [ "$comm" = nccl ]; then
  if [ "$gpus" -lt 2 ]; then
    echo "multi_gpu: NCCL needs a GPU per rank besides the target's, CUDA sees $gpus (COMM=shm runs every rank on GPU 0)" >&2
    exit 77
  fi
  if [ "$drafters" -gt $((gpus - 1)) ]; then
    echo "multi_gpu: COMM=nccl takes one GPU per rank besides the target's GPU 0: $gpus visible GPUs take at most $((gpus - 1)) ranks, not DRAFTERS=$drafters (NCCL refuses two ranks on one GPU); give DRAFTERS=$((gpus - 1)) or fewer, or COMM=shm (ranks then share GPUs)" >&2
    exit 2
  fi
  [ "$drafters" -gt 1 ] ||
    echo "multi_gpu: note: the group has 1 rank (world 1) on $gpus GPUs: nothing is all-reduced between GPUs; a group of 2 nccl ranks needs 3 GPUs (COMM=shm DRAFTERS=2 puts two ranks on GPU 1)"
fi
# rank r's GPU (r >= 1; the solo drafter is rank 1's): GPUs 1..gpus-1 in turn, or GPU 0 alone
gpu_of() { [ "$gpus" -gt 1 ] && echo $(( 1 + ($1 - 1) % (gpus - 1) )) || echo 0; }
# nvidia-smi -i's form of a CUDA PCI bus id (0000:1b:00.0 -> 00000000:1B:00.0)
smi_bus() { local d b f; IFS=':' read -r d b f <<< "$1"; printf '%08X:%s:%s' "$((16#$d))" "${b^^}" "${f^^}"; }
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
  pipe_own $!
}

# ---- 1. one drafter
drafter solo "$(gpu_of 1)" "$steps"
wait "${pids[-1]}" || pipe_die "the solo drafter failed"

# ---- 2. the group
gpids=()
for r in $(seq 1 "$drafters"); do
  drafter "rank$r" "$(gpu_of "$r")" "$steps" --group g --group-size "$drafters" --comm "$comm"
  gpids+=("${pids[-1]}")
done
util="$out/target_gpu_util.csv"
tbus=
if [ "$backend" = cuda ]; then
  # the target's board: the bus id its pool logged (its device 0 as it sees it), else ours
  tbus=$(grep -o "cuda pool on device 0: PCI bus id [0-9A-Fa-f:.]*" "$out/target.log" |
    head -n 1 | awk '{print $NF}')
  [ -n "$tbus" ] || tbus=$(echo "$gpu_list" | awk '$1 == 0 {print $2}')
  echo "target GPU: PCI bus id $tbus"
  nvidia-smi -i "$(smi_bus "$tbus")" --query-gpu=timestamp,utilization.gpu \
    --format=csv,noheader,nounits -lms 500 > "$util" &
  smi=$!
  pipe_own $smi
fi
for p in "${gpids[@]}"; do wait "$p" || pipe_die "a group drafter failed"; done
[ -z "${smi:-}" ] || proc_signal TERM "$smi" || true
pipe_copies_ok "$out/solo.log" "$out"/rank*.log
tv=$(pipe_status | python3 -c "import json,sys; print(json.load(sys.stdin)['tv_distance'])")
pipe_ctl drain > /dev/null || pipe_die "dflash-ctl drain failed"
pipe_stop_target

python3 - "$out" "$drafters" "$util" "$tv" "$tbus" <<'EOF'
import datetime, json, os, sys
out, n, util, tv, tbus = sys.argv[1], int(sys.argv[2]), sys.argv[3], float(sys.argv[4]), sys.argv[5]
def records(name):
    return sorted((json.loads(l) for l in open(os.path.join(out, "metrics-" + name, "metrics.jsonl"))
                   if l.strip()), key=lambda r: r["step"])
def rate(name):
    """samples/s over the steady part of a drafter's metrics (records from step 4 on)."""
    rs = [r for r in records(name) if r["step"] >= 4]
    if len(rs) < 3: return float("nan")
    dt = rs[-1]["time"] - rs[0]["time"]
    seqs = sum(r["samples_per_s"] * r.get("perf/step_s", 0) for r in rs[1:])
    return seqs / dt if dt > 0 else float("nan")
one = rate("solo")
group = rate("rank1") * n  # every rank trains its own batch of each group step
print("RESULT drafters=1 samples_per_s=%.2f" % one)
print("RESULT drafters=%d samples_per_s=%.2f scaling_efficiency=%.1f%%" % (n, group, 100 * group / (n * one)))
if os.path.exists(util) and os.path.getsize(util):
    # only while every rank trained: from the last rank's first metrics record to the first
    # rank's last (nvidia-smi's timestamps are local time, as datetime reads them)
    ranks = [records("rank%d" % r) for r in range(1, n + 1)]
    t0, t1 = max(rs[0]["time"] for rs in ranks), min(rs[-1]["time"] for rs in ranks)
    v = []
    for line in open(util):
        f = [x.strip() for x in line.split(",")]
        try:
            t = datetime.datetime.strptime(f[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
            if t0 <= t <= t1: v.append(float(f[1]))
        except (ValueError, IndexError):
            pass
    if v:
        print("RESULT target_gpu_busy=%.1f%% (nvidia-smi utilization of the target's GPU %s, %d samples over the group's %.0f s of training)"
              % (sum(v) / len(v), tbus, len(v), t1 - t0))
    else:
        print("RESULT target_gpu_busy=n/a (no sample between the group's first and last step)")
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
