#!/usr/bin/env bash
# bench/pipeline/real_model.sh: the real daemons on the GPU with a Qwen3-8B-shaped target
# (issue 6, "bench/pipeline on the GPU"): dflash-queue, dflash-target (cuda, capture of layers
# [1, 9, 17, 25, 33] into CUDA-IPC slots) and dflash-drafter (cuda, the 5-layer DFlash drafter,
# 512 anchors) through the broker. One GPU: target and drafter share it.
#
# Phases, one run:
#   1. target alone: the drafter is not started; the target fills all SLOTS slots (the broker's
#      max_depth) as fast as it can: batches/s and tokens/s from the broker's status.
#   2. drafter alone: the target is stopped (SIGSTOP; its slots stay mapped and ready) and the
#      drafter trains on the SLOTS ready batches: steps/s from the drafter's metrics.
#   3. end to end: the target continues (SIGCONT) and both run together for E2E_STEPS steps.
# Then the drafter exits at its --max-steps, the broker drains, and the logs' "host waits for the
# whole compute stream" lines are printed for both hot loops: each count must be 0 inside steps
# and fills (checkpoints outside steps wait by design), and so must the drafter's failed slot
# copies, or the script exits 1, as it does when the drain fails or a daemon exits with an
# error.
#
# Usage (GPU machine, repository root): bench/pipeline/real_model.sh BIN_DIR [MODEL_DIR]
#   BIN_DIR holds dflash-queue, dflash-target, dflash-drafter, dflash-ctl, dflash-data and
#   devlibs/; MODEL_DIR (default /tmp/dflash-qwen3-8b) is made by bench/target/make_checkpoint.py
#   when it has no config.json. SLOTS (16), E2E_STEPS (40), SEQS (400), BACKEND (cuda),
#   DRAFTER_DEVICE (0; 1 on a two-GPU machine puts the drafter on GPU 1, the slots cross over
#   NVLink), DRAFT_LAYERS (5), ANCHORS (512), LEN_MIN / LEN_MAX (64 / 3072: sequence lengths, log-uniform;
#   equal values give uniform lengths, so the three phases compare like with like) and BUCKETS
#   (512,1024,2048,3072; only buckets the data fills) in the environment (a cpu dry run:
#   BACKEND=host with a small dflash-mkmodel target and DRAFT_LAYERS=1 ANCHORS=8).
#   Logs and metrics go to $OUT (or ./pipeline-logs).
set -uo pipefail
bin=$(cd "${1:?usage: bench/pipeline/real_model.sh BIN_DIR [MODEL_DIR]}" && pwd)
slots=${SLOTS:-16}
e2e_steps=${E2E_STEPS:-40}
out=${OUT:-pipeline-logs}
mkdir -p "$out"
rm -rf "$out/metrics" # the drafter appends to metrics.jsonl
here=$(cd "$(dirname "$0")" && pwd)
source "$here/lib.sh"
pipe_setup "${2:-/tmp/dflash-qwen3-8b}" "${BACKEND:-cuda}" "$out"
pipe_queue --min-ready 0 --max-depth "$slots"

# ---- 1. target alone
pipe_target --slots "$slots" --epochs 100
t_first=""
for _ in $(seq 4800); do # up to 240 s: checkpoint load and warm-up of every bucket shape first
  proc_alive $tpid || pipe_die "dflash-target exited"
  read -r n tok < <(pipe_bsum produced produced_tokens 2>/dev/null || echo "0 0")
  if [ -z "$t_first" ] && [ "${n:-0}" -ge 1 ]; then
    t_first=$(date +%s.%N) n_first=$n tok_first=$tok # batch and token counts of one reply
  fi
  [ "${n:-0}" -ge "$slots" ] && break
  sleep 0.05
done
t_full=$(date +%s.%N)
read -r n_full tok_full < <(pipe_bsum produced produced_tokens)
[ "$n_full" -ge "$slots" ] || pipe_die "the target filled only $n_full of $slots slots"
proc_signal STOP "$tpid" || pipe_die "dflash-target exited"

# ---- 2. drafter alone, then 3. end to end
total=$((slots + e2e_steps))
"$bin/dflash-drafter" --runtime-dir "$run" --name d0 --model "$model" "${SLOT_ARGS[@]}" \
  --device "${DRAFTER_DEVICE:-0}" \
  --draft-layers "${DRAFT_LAYERS:-5}" --block-size 16 --anchors "${ANCHORS:-512}" --max-steps "$total" \
  --metrics-dir "$out/metrics" --progress-ms 10000 > "$out/drafter.log" 2>&1 &
dpid=$!
pipe_own $dpid
for _ in $(seq 1800); do # up to 360 s
  proc_alive $dpid || pipe_die "dflash-drafter exited before consuming the ready slots"
  c=$(pipe_bsum consumed 2>/dev/null || echo 0)
  [ "${c:-0}" -ge "$slots" ] && break
  sleep 0.2
done
sleep 1 # the last ready batch's step runs
proc_signal CONT "$tpid" || true
wait $dpid || pipe_die "dflash-drafter failed"
pipe_ctl drain > /dev/null || pipe_die "dflash-ctl drain failed"
pipe_stop_target

# ---- results
python3 - "$out/metrics/metrics.jsonl" "$slots" "$t_first" "$t_full" "$n_first" "$n_full" \
  "$tok_first" "$tok_full" <<'EOF' || pipe_die "the results could not be computed"
import json, statistics, sys
path, slots = sys.argv[1], int(sys.argv[2])
t_first, t_full = float(sys.argv[3]), float(sys.argv[4])
n_first, n_full, tok_first, tok_full = (float(x) for x in sys.argv[5:9])
recs = [json.loads(l) for l in open(path) if l.strip()]
recs.sort(key=lambda r: r["step"])
def rate(rs):
    """steps/s and tokens/s over consecutive records (time = when each step came back)."""
    dt = rs[-1]["time"] - rs[0]["time"] if len(rs) >= 3 else 0
    if dt <= 0: return float("nan"), float("nan")
    steps = len(rs) - 1
    tok = sum(r["tokens_per_s"] * r.get("perf/step_s", 0) for r in rs[1:])
    return steps / dt, tok / dt
nan = float("nan")
span = t_full - t_first
tgt_b = (n_full - n_first) / span if n_full > n_first and span > 0 else nan  # too fast to see: n/a
tgt_t = (tok_full - tok_first) / span if n_full > n_first and span > 0 else nan
# a step's record is written when it comes back, which the cuda hot loop checks after queuing
# the next step: the last ready batch's step is reported only after the target resumes
alone = [r for r in recs if 3 <= r["step"] <= slots - 1]
e2e = [r for r in recs if r["step"] >= slots + 5]
d_s, d_t = rate(alone)
e_s, e_t = rate(e2e)
print("RESULT side=target_alone batches_per_s=%.2f tokens_per_s=%.0f (%d batches in %.2f s, polled "
      "every 0.05 s plus a status round trip: +-%.0f%%; more SLOTS, a longer window)"
      % (tgt_b, tgt_t, n_full - n_first, span, 100.0 * 0.1 / span if tgt_b == tgt_b else nan))
print("RESULT side=drafter_alone steps_per_s=%.2f tokens_per_s=%.0f (steps 3..%d)" % (d_s, d_t, slots - 1))
print("RESULT side=end_to_end steps_per_s=%.2f tokens_per_s=%.0f (steps %d..%d)" % (e_s, e_t, slots + 5, recs[-1]["step"]))
ideal = 1.0 / (1.0 / tgt_t + 1.0 / d_t) if tgt_t > 0 and d_t > 0 else nan
print("one GPU shared: the best a serial share can do is 1/(1/target + 1/drafter) = %.0f tokens/s; "
      "end to end reaches %.1f%% of it" % (ideal, 100.0 * e_t / ideal))
import os
lo, hi = os.environ.get("LEN_MIN", "64"), os.environ.get("LEN_MAX", "3072")
if lo != hi:
    print("(lengths %s..%s: each phase trains on the mix its window happened to hold, so this share "
          "does not compare like with like; LEN_MIN = LEN_MAX does)" % (lo, hi))
print("loss first %.3f last %.3f" % (recs[0]["loss"], recs[-1]["loss"]))
EOF
pipe_hot_loops "$out/target.log" "$out/drafter.log"
pipe_copies_ok "$out/drafter.log"
