#!/usr/bin/env bash
# train_script: scripts/train run twice on the same --out, as a user fixing a flag does. The
# first run asks for a token budget the samples do not fit (dflash-data keeps none, the run
# fails); the second, with a budget that fits, must convert the JSONL again and train. It used to
# reuse the shard of the first run (the JSONL was not newer), and failed the same way forever.
# A shard with sequences past the last bucket shows the target's warning that they are left out.
# Then: a run whose data runs out before --steps fails and says why (the drafter's WARN that the
# schedule is not finished among the lines shown); a resumed run asked for more steps fails
# with the drafter's reason and the way to train longer; --init-from warm-starts a new run from
# the finished one's weights. Then a run stopped and started again on one --out (see there): a
# second run on a running --out is refused without touching its logs; a re-run appends to them.
#   train_script.sh BUILD_DIR SOURCE_ROOT
set -euo pipefail
BUILD=$1
ROOT=$2
WORK=$(mktemp -d "${TMPDIR:-/tmp}/dflash-test-train.XXXXXX")
BG="" # a scripts/train started in the background, in its own process group (setsid)
HELD="" # a drafter this test stopped (SIGSTOP): continued on exit, or the script's stop of it
        # would wait for ever (a stopped process keeps a SIGTERM pending)
# (KEEP=1 keeps WORK, for a look after a failure)
trap 'if [ -n "$HELD" ]; then kill -CONT "$HELD" 2>/dev/null; fi
    if [ -n "$BG" ]; then kill -TERM -- "-$BG" 2>/dev/null; fi; wait
    [ -n "${KEEP:-}" ] || rm -rf "$WORK"' EXIT

"$BUILD/tools/dflash-mkmodel" --family qwen3 --layers 8 --seed 1 --out "$WORK/target" \
    >"$WORK/mkmodel.log" 2>&1
python3 - "$WORK/data.jsonl" <<'EOF'
import json, sys
with open(sys.argv[1], "w") as f:
    for s in range(24):
        ids = [(s * 7 + k * 13) % 500 for k in range(40)]
        f.write(json.dumps({"input_ids": ids, "loss_mask": [0] * 8 + [1] * 32}) + "\n")
    # last: one of 80 tokens, over every --token-budget below: left out, and said with its share
    f.write(json.dumps({"input_ids": [k % 500 for k in range(80)], "loss_mask": [1] * 80}) + "\n")
EOF
TRAIN=(--model "$WORK/target" --data "$WORK/data.jsonl" --out "$WORK/run" --build "$BUILD"
    --backend host --steps 2 --draft-layers 1 --features 3 --block-size 4 --anchors 8
    --max-seqs 2 --slots 2 --checkpoint-every 2 --accumulate 2)
train() { bash "$ROOT/scripts/train" "${TRAIN[@]}" "$@"; }
if train --token-budget 32 --buckets 32 >"$WORK/first.log" 2>&1; then
    echo "FAIL: the first run trained on samples longer than its token budget" >&2
    exit 1
fi
# ... and failed where the regression starts: its conversion kept no sample
if ! grep -q "converting" "$WORK/first.log" || ! grep -q "no line kept" "$WORK/first.log"; then
    echo "FAIL: the first run did not fail in its conversion (no line kept):" >&2
    tail -n 20 "$WORK/first.log" >&2
    exit 1
fi
# ... each line "too long: 40 tokens, --max-len is 32": the script has no --max-len, and says so
grep -q "^train: in scripts/train's options: --max-len is --token-budget" "$WORK/first.log" ||
    { echo "FAIL: dflash-data's --max-len not named as --token-budget" >&2; exit 1; }
if ! train --token-budget 64 --buckets 64 >"$WORK/second.log" 2>&1; then
    echo "FAIL: the second run, with a token budget that fits, did not train:" >&2
    tail -n 20 "$WORK/second.log" >&2
    exit 1
fi
grep -q "converting" "$WORK/second.log" || { echo "FAIL: not converted again" >&2; exit 1; }
grep -q "24 sequences" "$WORK/second.log" || { echo "FAIL: sequences missing" >&2; exit 1; }
# --accumulate reaches the drafter: two slots a step, in its log and in each step's metrics
grep -q "training 2 steps of 2 slots each" "$WORK/second.log" &&
    grep -q "gradient accumulation: 2 slots (batches) a step" "$WORK/run/drafter.log" &&
    [ "$(grep -c '"train/batches":2[,}]' "$WORK/run/metrics/metrics.jsonl")" = 2 ] ||
    { echo "FAIL: --accumulate 2 not used:" >&2; cat "$WORK/run/metrics/metrics.jsonl" >&2
      exit 1; }
# the 80-token line is no bad line: counted apart with its share, 80 of 24 x 40 + 80 tokens (it
# was one of "1 bad lines skipped", and the share of the data lost was nowhere)
grep -q "24 sequences, 960 tokens, 1 longer than --max-len 64 left out (7.7% of all tokens), \
0 without an anchor left out (0.0% of all tokens), 0 bad lines skipped" "$WORK/second.log" &&
    grep -q "1 sequences longer than --max-len 64 left out (80 tokens, 7.7% of all tokens" \
        "$WORK/second.log" || { echo "FAIL: the sequence over the budget not counted:" >&2
    grep -E "sequences|bad" "$WORK/second.log" >&2; exit 1; }
# a shard as --data with sequences longer than the last bucket: the target leaves them out and
# warns; the warning reaches the console (it was in target.log alone, and the run said "done")
# (5 of 29: the four 100-token lines and data.jsonl's 80-token one, over the bucket's 64)
python3 - "$WORK/long.jsonl" "$WORK/data.jsonl" <<'EOF2'
import json, sys
with open(sys.argv[1], "w") as f:
    f.write(open(sys.argv[2]).read())
    for s in range(4):
        f.write(json.dumps({"input_ids": [(s + k) % 500 for k in range(100)],
                            "loss_mask": [0] * 8 + [1] * 92}) + "\n")
EOF2
"$BUILD/tools/dflash-data" --in "$WORK/long.jsonl" --out "$WORK/long.shard" --vocab 512 \
    --max-len 128 --buckets 64,128 >"$WORK/long-data.log" 2>&1
train --data "$WORK/long.shard" --out "$WORK/lshard" --token-budget 64 --buckets 64 \
    >"$WORK/lshard.log" 2>&1 ||
    { echo "FAIL: the run on long.shard failed:" >&2; tail -n 20 "$WORK/lshard.log" >&2; exit 1; }
grep -q "dflash-target WARN .*5 of 29 sequences .* left out of training" "$WORK/lshard.log" ||
    { echo "FAIL: the target's warning is not on the console:" >&2; cat "$WORK/lshard.log" >&2
      exit 1; }
# a run whose data runs out before --steps (one epoch of 12 batches, 1000 steps) is no success;
# its bucket bound 128 is cut at its --token-budget 64 (the target refused a bound past it); its
# data is named .JSONL, JSONL too (it was taken for a shard: "bad magic")
cp "$WORK/data.jsonl" "$WORK/upper.JSONL"
if train --token-budget 64 --buckets 128 --out "$WORK/short" --steps 1000 --epochs 1 \
    --data "$WORK/upper.JSONL" >"$WORK/third.log" 2>&1; then
    echo "FAIL: a run that stopped short of --steps exited 0" >&2
    exit 1
fi
grep -q "^train: converting $WORK/upper.JSONL" "$WORK/third.log" &&
    grep -q "^train: buckets 128 -> 64 (cut at --token-budget 64" "$WORK/third.log" &&
    grep -q "the data ran out" "$WORK/third.log" ||
    { echo "FAIL: the short run did not say why:" >&2; tail -n 20 "$WORK/third.log" >&2; exit 1; }
# ... and said so (at its start, or once the drafter ends, here within a second), with the
# --epochs that would do: 24 slots, 2000 needed
grep -q "^train: warning: --epochs 1 of this data make 24 slots (24 an epoch), and 1000 \
steps of 2 slots need 2000: the run will stop at about step 12 (the data runs out); --epochs 84 would do" \
    "$WORK/third.log" ||
    { echo "FAIL: the short run not foretold:" >&2; grep "^train" "$WORK/third.log" >&2; exit 1; }
grep -q "WARN.*the schedule is not finished: training stopped at step [0-9]* of 1000 (lr still" \
    "$WORK/third.log" ||
    { echo "FAIL: no WARN that the schedule is unfinished:" >&2; tail -n 20 "$WORK/third.log" >&2
      exit 1; }
# more steps on the finished run: refused by the drafter, its reason shown with the way out
if train --token-budget 64 --buckets 64 --steps 4 >"$WORK/fourth.log" 2>&1; then
    echo "FAIL: a resumed run trained past its schedule" >&2
    exit 1
fi
grep -q "exited with status 2: .*past the resumed run's schedule of 2 steps" "$WORK/fourth.log" &&
    grep -q -- "--init-from $WORK/run --out NEW_DIR" "$WORK/fourth.log" ||
    { echo "FAIL: the refusal's reason or way out missing:" >&2; cat "$WORK/fourth.log" >&2
      exit 1; }
# (with DFLASH_* options in the environment, as deploy's compose sets them: not passed on, and
# said; DFLASH_HIDDEN failed the run, DFLASH_TOTAL_STEPS gave it a 20000-step schedule. A cuda
# backend switch is no option: kept, unsaid)
if ! DFLASH_HIDDEN=4096 DFLASH_TOTAL_STEPS=20000 DFLASH_CUDA_VEC=1 train --token-budget 64 \
    --buckets 64 --out "$WORK/more" --init-from "$WORK/run" --steps 4 >"$WORK/fifth.log" 2>&1; then
    echo "FAIL: --init-from did not train a new run:" >&2
    tail -n 20 "$WORK/fifth.log" >&2
    exit 1
fi
grep -q "warm start: weights from $WORK/run/checkpoints/step-0*2" "$WORK/more/drafter.log" ||
    { echo "FAIL: the new run did not start from the old weights" >&2; exit 1; }
grep -q "schedule 4 steps, start step 0" "$WORK/more/drafter.log" &&
    grep -q "^train: warning: DFLASH_HIDDEN=4096 DFLASH_TOTAL_STEPS=20000 from the environment \
not passed on" "$WORK/fifth.log" ||
    { echo "FAIL: the environment's DFLASH_* options not dropped and said:" >&2
      grep -E "^train: |schedule" "$WORK/fifth.log" "$WORK/more/drafter.log" >&2; exit 1; }
echo "ok: converted again with the new token budget and trained; short runs, longer runs said"

# A run stopped and started again on one --out, as a user does. Long enough never to finish
# (100000 steps, 10000 epochs); each check is named by the defect it shows.
#   wait_for FILE PATTERN: up to 60 s for a line of FILE matching PATTERN (extended)
wait_for() {
    for _ in $(seq 600); do grep -qE -- "$2" "$1" 2>/dev/null && return 0; sleep 0.1; done
    echo "FAIL: no line matching '$2' in $1 after 60 s:" >&2
    tail -n 20 "$1" >&2
    exit 1
}
S=$WORK/stop
cp "$WORK/data.jsonl" "$WORK/stop.jsonl"
STOP=(--token-budget 64 --buckets 64 --out "$S" --steps 100000 --epochs 10000 --checkpoint-every 10
    --data "$WORK/stop.jsonl")
stoprun() { train "${STOP[@]}" "$@"; }
# bg_stoprun LOG: stoprun in the background, its pid BG, in its own session and process group
# (as a shell runs a command in the foreground: a terminal's Ctrl-C reaches the whole group),
# with SIGINT not ignored (a background job's is, and bash cannot trap a signal ignored at start)
bg_stoprun() {
    setsid env --default-signal=INT bash "$ROOT/scripts/train" "${TRAIN[@]}" "${STOP[@]}" \
        > "$1" 2>&1 &
    BG=$!
}
bg_stoprun "$WORK/s1.log"
wait_for "$S/drafter.log" "checkpoint .*step-[0-9]+ written"
# a second run on the same --out is refused before it touches a log: it used to truncate the
# running run's logs (which then began with its ERROR and NUL bytes) before the drafter's lock
# refused it
lines=$(wc -l < "$S/drafter.log")
if stoprun > "$WORK/s1-twin.log" 2>&1; then
    echo "FAIL: a second run on a running --out was not refused" >&2
    exit 1
fi
grep -q "$S is in use by another scripts/train" "$WORK/s1-twin.log" ||
    { echo "FAIL: the second run did not say the --out is in use:" >&2; cat "$WORK/s1-twin.log" >&2
      exit 1; }
if [ "$(wc -l < "$S/drafter.log")" -lt "$lines" ] || ! head -n 1 "$S/drafter.log" |
    grep -q "^---- scripts/train started " || grep -q "ERROR" "$S/drafter.log"; then
    echo "FAIL: the second run touched the running run's drafter.log:" >&2
    head -n 5 "$S/drafter.log" >&2
    exit 1
fi
# Ctrl-C (SIGINT to the whole process group) is a deliberate stop: the drafter stops first and
# acks its last batch, writes its final checkpoint and reports it while the broker still runs;
# the script says so and exits 130. It got SIGINT with every daemon: the broker stopped at once,
# the drafter's last batch went into its checkpoint unacked, and the script failed (exit 1,
# "dflash-queue stopped").
rc=0
kill -INT -- "-$BG"
wait "$BG" || rc=$?
BG=""
flock -w 30 "$S/train.lock" true # the daemons have exited too
step=$(sed -n 's/.*reported the final checkpoint (step \([0-9]*\)) as committed.*/\1/p' \
    "$S/drafter.log")
if [ "$rc" != 130 ] || [ -z "$step" ] || grep -q "not acked" "$S/drafter.log" ||
    grep -q "dflash-queue stopped" "$WORK/s1.log" ||
    ! grep -q "interrupted (SIGINT) at step $step of 100000; final checkpoint: \
$S/checkpoints/step-0*$step$" "$WORK/s1.log" ||
    ! grep -q "run the same command again to resume" "$WORK/s1.log"; then
    echo "FAIL: Ctrl-C: exit $rc (want 130), final checkpoint reported at step '$step':" >&2
    tail -n 5 "$WORK/s1.log" >&2
    grep -E "WARN|ERROR|final checkpoint" "$S/drafter.log" >&2
    exit 1
fi
# a sequential re-run appends to the logs after its own separator line, and resumes; it prints
# the broker's runtime directory (it was only in queue.log), where dflash-ctl pauses it
bg_stoprun "$WORK/s2.log"
wait_for "$WORK/s2.log" "^train: the broker's runtime directory is "
rd=$(sed -n "s/^train: the broker's runtime directory is \([^:]*\): .*/\1/p" "$WORK/s2.log")
"$BUILD/tools/dflash-ctl" --runtime-dir "$rd" --timeout-ms 5000 pause > /dev/null ||
    { echo "FAIL: dflash-ctl pause of the re-run's broker" >&2; exit 1; }
wait_for "$WORK/s2.log" "policy: running -> paused"
[ "$(grep -c "^---- scripts/train started " "$S/drafter.log")" = 2 ] &&
    grep -q "checkpoint .*step-0*10 written" "$S/drafter.log" ||
    { echo "FAIL: the re-run did not append to drafter.log after a separator:" >&2
      head -n 5 "$S/drafter.log" >&2; exit 1; }
wait_for "$S/drafter.log" "resumed exactly from $S/checkpoints/step-0*$step at step $step"
# SIGTERM to the script alone: the same deliberate stop, exit 143
rc=0
kill -TERM "$BG"
wait "$BG" || rc=$?
BG=""
flock -w 30 "$S/train.lock" true
[ "$rc" = 143 ] && grep -q "interrupted (SIGTERM) at step" "$WORK/s2.log" ||
    { echo "FAIL: SIGTERM: exit $rc (want 143):" >&2; tail -n 5 "$WORK/s2.log" >&2; exit 1; }
# the pause outlives the stop (documented): the next run says the broker is paused and how to
# resume it, instead of waiting without a word for ever
bg_stoprun "$WORK/s3.log"
wait_for "$WORK/s3.log" "^train: the broker is paused: nothing trains until it is resumed: "
resume=$(sed -n 's/^train: the broker is paused: nothing trains until it is resumed: //p' \
    "$WORK/s3.log")
$resume > /dev/null || { echo "FAIL: the printed resume command failed: $resume" >&2; exit 1; }
wait_for "$WORK/s3.log" "policy: paused -> running"
# an operator's drain ends the run short of --steps: said as such (exit 1), with the way on; it
# was reported as "the data ran out after --epochs" with the advice to raise them. The target
# leaves first (the drain ends it once the drafter has every ready slot), while the drafter
# still trains and saves: the script waits for the drafter (it said "dflash-target stopped").
# The drafter is held (SIGSTOP) until the target is gone, so the order does not depend on speed.
rd=$(sed -n "s/^train: the broker's runtime directory is \([^:]*\): .*/\1/p" "$WORK/s3.log")
dpid=$(sed -n 's/.*dflash-drafter \([0-9]*\);.*/\1/p' "$S/train.lock")
tpid=$(sed -n 's/.*dflash-target \([0-9]*\),.*/\1/p' "$S/train.lock")
# (children of scripts/train, not of this test: their bare pids are used while they run; a tpid
# reused after the target's end only lets the wait below run to its 30 s)
HELD=$dpid
kill -STOP "$dpid"
"$BUILD/tools/dflash-ctl" --runtime-dir "$rd" --timeout-ms 5000 drain > /dev/null ||
    { echo "FAIL: dflash-ctl drain" >&2; exit 1; }
for _ in $(seq 300); do kill -0 "$tpid" 2> /dev/null || break; sleep 0.1; done
kill -CONT "$dpid"
HELD=""
rc=0
wait "$BG" || rc=$?
BG=""
if [ "$rc" != 1 ] || grep -q "the data ran out" "$WORK/s3.log" ||
    ! grep -q "the broker was drained (dflash-ctl drain), with data left; .*Run the same command \
again to continue" "$WORK/s3.log"; then
    echo "FAIL: a drained run: exit $rc (want 1) or the wrong reason:" >&2
    tail -n 40 "$WORK/s3.log" >&2 # the script's lines, and a failing daemon's log tail
    exit 1
fi
echo "ok: a second run on a running --out refused, its logs untouched; Ctrl-C and SIGTERM stop \
in order (exit 130, 143; the final checkpoint named); a re-run appends and resumes; the \
runtime directory is printed, a pause said with the command that resumes; a drain said"
# A run trains one dataset: another --token-budget, or new lines in the JSONL, on an --out that
# has trained are refused (exit 2) before the shard is touched, pointing to a new --out and
# --init-from; the shard used to be overwritten, then the target refused the new batch plan
# naming --journal (exit 1). A JSONL newer but the same converts nothing, and resumes.
cp "$S/stop.shard" "$WORK/stop.shard.before"
rc=0
stoprun --token-budget 128 > "$WORK/s4.log" 2>&1 || rc=$?
[ "$rc" = 2 ] && grep -q "was made with .*--token-budget 64; this command gives .*--token-budget \
128" "$WORK/s4.log" && grep -q "another --out (add --init-from $S " "$WORK/s4.log" ||
    { echo "FAIL: another --token-budget on a trained --out: exit $rc (want 2):" >&2
      cat "$WORK/s4.log" >&2; exit 1; }
head -n 1 "$WORK/data.jsonl" >> "$WORK/stop.jsonl"
rc=0
stoprun > "$WORK/s5.log" 2>&1 || rc=$?
[ "$rc" = 2 ] && grep -q "$WORK/stop.jsonl changed since $S/stop.shard was made from it" \
    "$WORK/s5.log" && cmp -s "$S/stop.shard" "$WORK/stop.shard.before" ||
    { echo "FAIL: new data on a trained --out: exit $rc (want 2), or the shard changed:" >&2
      cat "$WORK/s5.log" >&2; exit 1; }
cp "$WORK/data.jsonl" "$WORK/stop.jsonl" # the same lines, a newer file
rc=0
stoprun --steps 1 > "$WORK/s6.log" 2>&1 || rc=$?
[ "$rc" = 0 ] && ! grep -q "converting" "$WORK/s6.log" ||
    { echo "FAIL: the unchanged command did not resume without converting (exit $rc):" >&2
      grep "^train: " "$WORK/s6.log" >&2; exit 1; }
# new lines in a file given an older time (cp -p, rsync -a, tar x keep one) are new data too:
# the md5 is checked when the size or time is not the one hashed (only a newer file was)
head -n 1 "$WORK/data.jsonl" >> "$WORK/stop.jsonl"
touch -d '2001-01-01' "$WORK/stop.jsonl"
rc=0
stoprun > "$WORK/s6b.log" 2>&1 || rc=$?
[ "$rc" = 2 ] && grep -q "$WORK/stop.jsonl changed since" "$WORK/s6b.log" ||
    { echo "FAIL: new data with an older time on a trained --out: exit $rc (want 2):" >&2
      grep "^train: " "$WORK/s6b.log" >&2; exit 1; }
cp "$WORK/data.jsonl" "$WORK/stop.jsonl"
# another --max-seqs (not the shard's, the plan's), and other data under another file name (a
# shard of its own): refused up front from OUT/plan.args, nothing converted or started (both
# got as far as the target, which refused the plan: exit 1, or 0 when the drafter ended first)
rc=0
stoprun --max-seqs 1 > "$WORK/s7.log" 2>&1 || rc=$?
[ "$rc" = 2 ] && grep -q "^train: $S was trained with .*max-seqs 2; this command gives .*\
max-seqs 1" "$WORK/s7.log" && grep -q "nothing was converted or started" "$WORK/s7.log" ||
    { echo "FAIL: another --max-seqs: exit $rc (want 2), not explained:" >&2
      grep "^train: " "$WORK/s7.log" >&2; exit 1; }
head -n 3 "$WORK/data.jsonl" > "$WORK/other.jsonl"
rc=0
stoprun --data "$WORK/other.jsonl" > "$WORK/s7b.log" 2>&1 || rc=$?
[ "$rc" = 2 ] && grep -q "this command gives shards OUT/other.shard" "$WORK/s7b.log" &&
    [ ! -e "$S/other.shard" ] && ! grep -q "converting" "$WORK/s7b.log" ||
    { echo "FAIL: other data under another name on a trained --out: exit $rc (want 2), or it \
was converted:" >&2; grep "^train: " "$WORK/s7b.log" >&2; exit 1; }
# the run moved elsewhere keeps its plan (its shard is named from OUT), and resumes
cp -r "$S" "$WORK/moved"
rc=0
stoprun --out "$WORK/moved" --steps 1 > "$WORK/s7c.log" 2>&1 || rc=$?
[ "$rc" = 0 ] && ! grep -q "was trained with" "$WORK/s7c.log" ||
    { echo "FAIL: a moved run did not resume (exit $rc):" >&2; grep "^train: " "$WORK/s7c.log" >&2
      exit 1; }
rm -rf "$WORK/moved"
# an --out with a journal and no checkpoint (its first run stopped before one: nothing to
# resume) takes new data: the journal is moved aside and the run starts afresh (it was refused
# as "has trained on that shard")
cp -r "$S" "$WORK/nockpt"
rm -rf "$WORK/nockpt/checkpoints"
head -n 2 "$WORK/data.jsonl" >> "$WORK/stop.jsonl"
rc=0
stoprun --out "$WORK/nockpt" --steps 1 > "$WORK/s8.log" 2>&1 || rc=$?
[ "$rc" = 0 ] && grep -q "has no checkpoint: its journal (of the old shard) is moved to" \
    "$WORK/s8.log" && compgen -G "$WORK/nockpt/queue.journal.before-*" > /dev/null ||
    { echo "FAIL: new data on an --out without a checkpoint: exit $rc (want 0):" >&2
      grep "^train: " "$WORK/s8.log" >&2; exit 1; }
cp "$WORK/data.jsonl" "$WORK/stop.jsonl"
echo "ok: a trained --out refuses new data (also in a file with an older time, or under another \
name), another --token-budget (shard untouched) and another --max-seqs; the same data in a newer \
file resumes; an --out without a checkpoint takes new data, its journal moved aside"
# SIGTERM while the JSONL is converted: the conversion stops with the script (exit 143, said):
# the script died with its default action and left dflash-data running, holding --out's lock,
# and a re-run was refused with a recovery command of empty pids. Then the re-run converts and
# trains. (A conversion of 600k lines takes seconds; the signal goes once dflash-data runs, and
# the script's trap is set before it starts.)
python3 - "$WORK/big.jsonl" <<'EOF'
import json, sys
lines = [json.dumps({"input_ids": [(s * 7 + k * 13) % 500 for k in range(20 + s % 40)],
                     "loss_mask": [0] * 8 + [1] * (12 + s % 40)}) + "\n" for s in range(40)]
with open(sys.argv[1], "w") as f:
    f.writelines(lines * 15000)
EOF
C=$WORK/conv
setsid bash "$ROOT/scripts/train" "${TRAIN[@]}" --token-budget 64 --buckets 64 --out "$C" \
    --data "$WORK/big.jsonl" --steps 1 > "$WORK/c1.log" 2>&1 &
BG=$!
for _ in $(seq 600); do
    pgrep -f "dflash-data .*--out $C/big.shard" > /dev/null && break
    sleep 0.05
done
rc=0
kill -TERM "$BG"
wait "$BG" || rc=$?
BG=""
sleep 0.5
left=$(pgrep -f "dflash-data .*--out $C/big.shard" || true)
[ "$rc" = 143 ] && grep -q "^train: SIGTERM: the conversion was stopped" "$WORK/c1.log" &&
    [ -z "$left" ] ||
    { echo "FAIL: SIGTERM during the conversion: exit $rc (want 143), dflash-data left: \
'${left}':" >&2; tail -n 5 "$WORK/c1.log" >&2; exit 1; }
rc=0
train --token-budget 64 --buckets 64 --out "$C" --data "$WORK/big.jsonl" --steps 1 \
    > "$WORK/c2.log" 2>&1 || rc=$?
[ "$rc" = 0 ] && grep -q "converting" "$WORK/c2.log" ||
    { echo "FAIL: the run after a stopped conversion: exit $rc (want 0):" >&2
      grep "^train: " "$WORK/c2.log" >&2; exit 1; }
echo "ok: SIGTERM during the conversion stops it with the script (exit 143); the next run converts \
and trains"

