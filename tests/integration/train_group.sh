#!/usr/bin/env bash
# train_group: scripts/train --drafters 2, a data-parallel group of two dflash-drafter processes
# (cpu backend, shm collective) training one drafter, as a node of several GPUs runs it.
#   1. a run of 4 steps of --accumulate 4: each drafter trains 2 slots of every step (the
#      group's step is still 4 slots: 4 group steps of 4 batches in the broker's log, none of
#      fewer: the drafters wait for each other before the first); both drafters' logs, the
#      metrics of every step from step 1, the final checkpoint at step 4, the newest of the two
#      drafters' checkpoint directories (whichever process the broker made rank 0 writes them);
#   2. Ctrl-C: both drafters stop (exit 130, the final checkpoint named), and the same command
#      resumes the group from it to its --steps;
#   3. --init-from that run's directory warm-starts a new run from the newest of its
#      checkpoints, wherever it lies;
#   4. a scripts/train killed by SIGKILL leaves its daemons holding --out: the next run says so
#      and prints the command that stops them in order (and removes their runtime directory);
#      once it has run, the run resumes;
#   5. a run with fewer --drafters than the one whose newest checkpoint lies in ranks/K (K past
#      them: no drafter would resume from it) is refused with the move that fixes it; after the
#      move, drafter 0 resumes from it.
#   6. another number of drafters keeps the step: a run of --drafters 2 --accumulate 4 stopped
#      at step 2 (2 slots a drafter) resumes with --drafters 1 at 4 slots a step (the drafter
#      says so; steps 3 and 4 each train 4 batches), without a word about --accumulate;
#      `dflash-drafter show` gives its step and its share over 3 drafters (the nearest, 1 each,
#      and why); resumed with --drafters 2 --accumulate 8 (the flag ignored, said) each drafter
#      trains 2 slots a step, the new one, which has no checkpoint, given its share by the script.
#   train_group.sh BUILD_DIR SOURCE_ROOT [BACKEND] (host, the default; scripts/gpu-check runs it
#   with cuda: both drafters and the target on one GPU, the group over shm)
set -euo pipefail
BUILD=$1
ROOT=$2
BACKEND=${3:-host}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/dflash-test-train-group.XXXXXX")
BG=""
trap 'if [ -n "$BG" ]; then kill -TERM -- "-$BG" 2>/dev/null; fi; wait
    [ -n "${KEEP:-}" ] || rm -rf "$WORK"' EXIT
fail() {
    echo "FAIL: $1" >&2
    [ -z "${2:-}" ] || tail -n 30 "$2" >&2
    exit 1
}
wait_for() {
    for _ in $(seq 600); do grep -qE -- "$2" "$1" 2>/dev/null && return 0; sleep 0.1; done
    fail "no line matching '$2' in $1 after 60 s" "$1"
}

"$BUILD/tools/dflash-mkmodel" --family qwen3 --layers 8 --seed 1 --out "$WORK/target" \
    >"$WORK/mkmodel.log" 2>&1
python3 - "$WORK/data.jsonl" <<'EOF'
import json, sys
with open(sys.argv[1], "w") as f:
    for s in range(48):
        ids = [(s * 7 + k * 13) % 500 for k in range(40)]
        f.write(json.dumps({"input_ids": ids, "loss_mask": [0] * 8 + [1] * 32}) + "\n")
EOF
TRAIN=(--model "$WORK/target" --data "$WORK/data.jsonl" --build "$BUILD" --backend "$BACKEND"
    --draft-layers 1 --features 3 --block-size 4 --anchors 8 --max-seqs 2 --token-budget 64
    --buckets 64 --accumulate 4 --drafters 2)
train() { bash "$ROOT/scripts/train" "${TRAIN[@]}" "$@"; }

# 1. four steps of 4 slots, 2 by each drafter
R=$WORK/run
train --out "$R" --steps 4 --checkpoint-every 2 >"$WORK/run.log" 2>&1 ||
    fail "the group run failed" "$WORK/run.log"
grep -q "^train: queue, target and 2 drafters started (logs in $R); training 4 steps of 4 \
slots each (2 by each drafter)" "$WORK/run.log" || fail "the start line" "$WORK/run.log"
for log in drafter drafter-1; do
    grep -q "gradient accumulation: 2 slots (batches) a step" "$R/$log.log" &&
        grep -q "group train epoch [0-9]*: rank [01] of 2 in sync at step 0" "$R/$log.log" &&
        grep -q "group train: final state at step 4 has hash" "$R/$log.log" ||
        fail "$log.log: not a rank of the group of 2 from step 0 to 4" "$R/$log.log"
done
# every group step trained both drafters' slots (a group its first drafter started alone
# trained steps of 2)
[ "$(grep -c "group train: step [0-9]* done: 4 batches trained" "$R/queue.log")" = 4 ] &&
    ! grep -q "group train: step [0-9]* done: [123] batches trained" "$R/queue.log" ||
    fail "not 4 group steps of 4 batches" "$R/queue.log"
[ "$(grep -o '"step":[0-9]*' "$R/metrics/metrics.jsonl" | tr '\n' ' ')" = \
    '"step":1 "step":2 "step":3 "step":4 ' ] || fail "metrics of steps 1-4" "$R/metrics/metrics.jsonl"
ckpt=$(sed -n 's/^train: done; checkpoint \([^ ]*\) .*/\1/p' "$WORK/run.log")
newest=$( (ls -d "$R"/checkpoints/step-* "$R"/ranks/1/checkpoints/step-* 2>/dev/null || true) |
    awk -F/ '{ print $NF "\t" $0 }' | sort | tail -n 1 | cut -f 2)
[ -n "$ckpt" ] && [ "$ckpt" = "$newest" ] && [ "$(basename "$ckpt")" = step-000000004 ] &&
    [ -f "$ckpt/model.safetensors" ] ||
    fail "final checkpoint '$ckpt', newest '$newest'" "$WORK/run.log"
echo "ok: --drafters 2: 4 group steps of 4 batches (2 a drafter), metrics from step 1, final \
checkpoint $ckpt"
# the same command on the finished run: the drafter holding the checkpoint ends at once, and the
# other (no checkpoint of its own: step 0), held for it by the broker, is told the group's
# newest committed checkpoint is at its --max-steps and ends too (it waited out the broker's
# 2-minute hold, was refused the rewind and the run failed)
t0=$SECONDS
train --out "$R" --steps 4 --checkpoint-every 2 >"$WORK/again.log" 2>&1 ||
    fail "the same command on the finished run failed" "$WORK/again.log"
grep -q "^train: done; checkpoint $ckpt " "$WORK/again.log" &&
    [ $((SECONDS - t0)) -lt 100 ] || fail "the finished run again: not done at once with \
$ckpt ($((SECONDS - t0)) s)" "$WORK/again.log"
grep -q "group train: its newest committed checkpoint is at step 4, where our run stops" \
    "$R/drafter.log" "$R/drafter-1.log" ||
    fail "no drafter told the run ends at the group's checkpoint" "$R/drafter.log"
echo "ok: the same command on the finished group run is done at once ($((SECONDS - t0)) s)"

# 2. Ctrl-C stops both drafters in order; the same command resumes the group
S=$WORK/stop
STOP=(--out "$S" --steps 300 --checkpoint-every 20)
setsid env --default-signal=INT bash "$ROOT/scripts/train" "${TRAIN[@]}" "${STOP[@]}" \
    >"$WORK/s1.log" 2>&1 &
BG=$!
wait_for "$WORK/s1.log" "checkpoint .*step-0*20 written"
kill -INT "$BG"
rc=0
wait "$BG" || rc=$?
BG=""
[ "$rc" = 130 ] && grep -q "^train: interrupted (SIGINT) at step [0-9]* of 300; final \
checkpoint: $S/.*step-" "$WORK/s1.log" || fail "Ctrl-C: exit $rc (want 130)" "$WORK/s1.log"
grep -q "reported the final checkpoint" "$S/drafter.log" "$S/drafter-1.log" ||
    fail "no drafter reported its final checkpoint" "$S/drafter.log"
stopped=$(sed -n 's/^train: interrupted (SIGINT) at step \([0-9]*\) of 300.*/\1/p' "$WORK/s1.log")
[ "$stopped" -lt 300 ] || fail "the run ended before the Ctrl-C: make it longer" "$WORK/s1.log"
train "${STOP[@]}" >"$WORK/s2.log" 2>&1 || fail "the resumed group run failed" "$WORK/s2.log"
grep -q "resumed exactly from $S/.*step-0*$stopped at step $stopped" "$S/drafter.log" \
    "$S/drafter-1.log" || fail "no drafter resumed from step $stopped" "$S/drafter.log"
grep -q "^train: done; checkpoint $S/.*step-000000300 " "$WORK/s2.log" ||
    fail "the resumed run did not end at step 300" "$WORK/s2.log"
! grep -q "trained twice\|already trained" "$S/queue.log" || fail "a batch trained twice" \
    "$S/queue.log"
echo "ok: Ctrl-C stops the group at step $stopped (exit 130), the same command resumes it to 300"

# 3. --init-from the group's run directory: its newest checkpoint, wherever it lies
train --out "$WORK/warm" --steps 2 --init-from "$S" >"$WORK/warm.log" 2>&1 ||
    fail "the --init-from run failed" "$WORK/warm.log"
src=$( (ls -d "$S"/checkpoints/step-000000300 "$S"/ranks/1/checkpoints/step-000000300 \
    2>/dev/null || true) | head -n 1)
grep -q "warm start: weights from $src" "$WORK/warm/drafter.log" "$WORK/warm/drafter-1.log" ||
    fail "not warm-started from $(dirname "$src")" \
    "$WORK/warm/drafter.log"
echo "ok: --init-from the group's run starts from its newest checkpoint ($src)"

# 4. SIGKILL of the script: its daemons hold --out; the next run names them and the command
K=$WORK/killed
setsid bash "$ROOT/scripts/train" "${TRAIN[@]}" --out "$K" --steps 300 --checkpoint-every 20 \
    >"$WORK/k1.log" 2>&1 &
BG=$!
wait_for "$WORK/k1.log" "checkpoint .*step-0*20 written"
kill -KILL "$BG"
wait "$BG" 2>/dev/null || true
BG=""
rc=0
train --out "$K" --steps 300 --checkpoint-every 20 >"$WORK/k2.log" 2>&1 || rc=$?
cmd=$(sed -n 's/^  \(kill -TERM .*\)$/\1/p' "$WORK/k2.log")
[ "$rc" = 1 ] && grep -q "^train: $K is held by the daemons of a scripts/train that is gone" \
    "$WORK/k2.log" && [ -n "$cmd" ] || fail "a run after the SIGKILL: exit $rc (want 1)" \
    "$WORK/k2.log"
bash -c "$cmd" 2>/dev/null || true
flock -w 60 "$K/train.lock" true || fail "the printed command did not free $K" "$WORK/k2.log"
rd=$(sed -n "s/^train: the broker's runtime directory is \([^:]*\): .*/\1/p" "$WORK/k1.log")
[ -n "$rd" ] && [ ! -e "$rd" ] || fail "the printed command left the runtime directory '$rd'" \
    "$WORK/k2.log"
train --out "$K" --steps 300 --checkpoint-every 20 >"$WORK/k3.log" 2>&1 ||
    fail "the run after the printed command failed" "$WORK/k3.log"
grep -q "^train: done; checkpoint $K/.*step-000000300 " "$WORK/k3.log" ||
    fail "the run after the printed command did not end at step 300" "$WORK/k3.log"
echo "ok: after a SIGKILL of scripts/train the next run names its daemons and the command that \
stops them; after it the run resumes to its end"

# 5. the newest checkpoint in ranks/1 and one drafter: refused, the printed move, then a resume
mkdir -p "$R/ranks/1/checkpoints"
for d in "$R"/checkpoints/step-*; do [ ! -e "$d" ] || mv "$d" "$R/ranks/1/checkpoints/"; done
rc=0
train --out "$R" --steps 4 --drafters 1 >"$WORK/f1.log" 2>&1 || rc=$?
cmd=$(sed -n 's/^  \(mkdir -p .* && mv .*\)$/\1/p' "$WORK/f1.log")
[ "$rc" = 2 ] && grep -q "^train: the newest checkpoint of $R, $R/ranks/1/checkpoints/\
step-000000004, is drafter 1's .*with --drafters 1 no drafter resumes from it" "$WORK/f1.log" &&
    [ -n "$cmd" ] || fail "--drafters 1 with the newest checkpoint in ranks/1: exit $rc (want 2)" \
    "$WORK/f1.log"
bash -c "$cmd" || fail "the printed move failed: $cmd" "$WORK/f1.log"
train --out "$R" --steps 4 --drafters 1 >"$WORK/f2.log" 2>&1 ||
    fail "the run after the printed move failed" "$WORK/f2.log"
grep -q "resumed exactly from $R/checkpoints/step-000000004 at step 4" "$R/drafter.log" ||
    fail "drafter 0 did not resume from the moved checkpoint" "$R/drafter.log"
echo "ok: a newest checkpoint no drafter of the run reads is refused with the move; after it, \
drafter 0 resumes from it"

# 6. the step keeps its 4 slots when the run resumes with another number of drafters
P=$WORK/rescale
rc=0
train --out "$P" --steps 6 --extra-drafter "--max-steps 2" >"$WORK/p1.log" 2>&1 || rc=$?
[ "$rc" = 1 ] && grep -q "stopped at step 2 of 6" "$WORK/p1.log" ||
    fail "a group run stopped at step 2: exit $rc (want 1)" "$WORK/p1.log"
mkdir -p "$P/checkpoints" # the group's rank 0 may have been drafter 1 (see 5.)
for d in "$P"/ranks/1/checkpoints/step-*; do [ ! -e "$d" ] || mv "$d" "$P/checkpoints/"; done
rc=0
train --out "$P" --steps 6 --drafters 1 --extra-drafter "--max-steps 4" >"$WORK/p2.log" 2>&1 ||
    rc=$?
[ "$rc" = 1 ] && grep -q "stopped at step 4 of 6" "$WORK/p2.log" ||
    fail "the run resumed with --drafters 1: exit $rc (want 1, stopped at step 4)" "$WORK/p2.log"
grep -q "^train: queue, target and drafter started (logs in $P); resuming, training to step 6 \
with 4 slots a step$" "$WORK/p2.log" || fail "the start line" "$WORK/p2.log"
grep -q "resuming $P/checkpoints/step-000000002 with 1 drafter: its step stays 4 slots, now 1 \
drafter x 4 (it was 2 x 2)" "$P/drafter.log" ||
    fail "--drafters 1 did not keep the step of 4 slots" "$P/drafter.log"
! grep -q "accumulate .* ignored" "$P/drafter.log" "$WORK/p2.log" ||
    fail "--accumulate 4, the step kept, was said to be ignored" "$P/drafter.log"
for s in 3 4; do
    grep -q "\"step\":$s,.*\"train/batches\":4[,}]" "$P/metrics/metrics.jsonl" ||
        fail "step $s did not train 4 batches" "$P/metrics/metrics.jsonl"
done
echo "ok: a --drafters 2 run of 4 slots a step resumed with --drafters 1 trains 4 slots a step"
# dflash-drafter show: the newest checkpoint of a checkpoint directory, its step and share
SHOW=$("$BUILD/services/drafter/dflash-drafter" show "$P/checkpoints" --drafters 2) ||
    fail "dflash-drafter show failed: $SHOW"
[ "$(grep -E "^(checkpoint|step|accumulate|world|step_slots|total_steps|drafter_accumulate) " \
    <<< "$SHOW" | tr '\n' ' ')" = "checkpoint $P/checkpoints/step-000000004 step 4 accumulate 4 \
world 1 step_slots 4 total_steps 6 drafter_accumulate 2 " ] || fail "dflash-drafter show: $SHOW"
# 3 drafters cannot share the step of 4 slots evenly: show says the nearest, 1 each, and why
NOTE=$("$BUILD/services/drafter/dflash-drafter" show "$P/checkpoints" --drafters 3 | grep "^note ")
grep -q "^note resuming $P/checkpoints/step-000000004 with 3 drafters: its step of 4 slots (1 \
drafter x 4) becomes 3 slots, 1 a drafter (3 drafters cannot share it evenly; with 1, 2 or 4 \
drafters it would stay 4)" <<< "$NOTE" || fail "dflash-drafter show --drafters 3: $NOTE"
echo "ok: a step of 4 slots over 3 drafters: the nearest share, 1 each, said with the sizes that \
keep it"
# back to 2 drafters, with a flag that disagrees: drafter 1 has no checkpoint (and would train
# --accumulate 8 / 2 slots a step, which the broker refuses beside drafter 0's 2): the script
# hands it the step's share
train --out "$P" --steps 6 --drafters 2 --accumulate 8 >"$WORK/p4.log" 2>&1 ||
    fail "the run resumed with --drafters 2 failed" "$WORK/p4.log"
grep -q "^train: --accumulate 8 ignored: the resumed run trains 4 slots a step, from its \
checkpoint (2 by each drafter)" "$WORK/p4.log" && grep -q "^train: queue, target and 2 drafters \
started (logs in $P); resuming, training to step 6 with 4 slots a step (2 by each drafter)$" \
    "$WORK/p4.log" || fail "the flag ignored, the start line" "$WORK/p4.log"
grep -q "with 2 drafters: its step stays 4 slots, now 2 drafters x 2 (it was 1 x 4)" \
    "$P/drafter.log" || fail "drafter 0 did not share the step of 4 slots" "$P/drafter.log"
[ "$(grep -c "group train: step [56] done: 4 batches trained" "$P/queue.log")" = 2 ] ||
    fail "steps 5 and 6 were not group steps of 4 batches" "$P/queue.log"
echo "ok: resumed with --drafters 2 (one of them new), the group trains the step of 4 slots, 2 each"
# 7. the data's end: a run of --epochs 1 (48 sequences of 40 tokens, a slot each at
# --token-budget 64: 12 steps of 4) to --steps 1000 stops at step 12, both drafters with it
# (exit 1, the data ran out; no rank left waiting --group-wait-s, 600 s, for a partner that
# heard the end first); the same command again ends as soon (the group of 2 forms at the end
# and hears it), rewinds nothing (the group is created by the drafter holding step 12; one with
# an older model creating it alone would put every batch trained since its step back to do)
# and trains nothing
E=$WORK/end
END=(--out "$E" --steps 1000 --epochs 1 --checkpoint-every 100)
for run in 1 2; do
    started=$SECONDS
    if train "${END[@]}" >"$WORK/end$run.log" 2>&1; then
        fail "a run whose data ran out exited 0" "$WORK/end$run.log"
    fi
    grep -q "^train: the drafter stopped at step 12 of 1000: the data ran out after --epochs 1" \
        "$WORK/end$run.log" || fail "run $run of the data's end: not stopped at step 12" \
        "$WORK/end$run.log"
    # (the defect waited --group-wait-s, 600 s; a run takes ~20 s in Release and several times
    # that under ASan on a loaded 2-core machine: 400 s tells them apart)
    [ $((SECONDS - started)) -lt 400 ] ||
        fail "run $run of the data's end took $((SECONDS - started)) s" "$WORK/end$run.log"
done
[ "$(grep -c "group train: step [0-9]* done: 4 batches trained" "$E/queue.log")" = 12 ] ||
    fail "not 12 group steps of 4 batches over both runs" "$E/queue.log"
grep -q "group train created by drafter[-0-9]* at step 12: 0 batches trained after it back to \
to-do" "$E/queue.log" || fail "the second run's group was not created at step 12" "$E/queue.log"
! grep -qE "group train created by [^ ]* at step ([0-9]|1[01]):" <(sed -n '/at step 12: 0 batches/,$p' \
    "$E/queue.log") || fail "a drafter with an older model created the group" "$E/queue.log"
echo "ok: the data's end stops both drafters at once, and the same command again rewinds nothing"
