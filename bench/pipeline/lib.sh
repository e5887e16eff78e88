# bench/pipeline/lib.sh: shared shell pieces of the GPU pipeline benches (real_model.sh,
# ../scaling/multi_gpu.sh): a Qwen3-8B-shaped checkpoint, random token data in shards, a private
# runtime directory, and the broker and target daemons. Source it after setting `bin` (the folder
# of carried binaries) and `here`; every daemon started goes into `pids` (pipe_own) and is
# stopped on exit, while its pid still names it (scripts/proc-lib.sh).
# Environment: SEQS (400), LEN_MIN / LEN_MAX (64 / 3072, log-uniform lengths; equal values give
# uniform lengths), BUCKETS (512,1024,2048,3072; only buckets the data fills).

source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/proc-lib.sh"
pids=()
# pipe_own PID: a daemon this bench started (after `cmd &`: pipe_own $!)
pipe_own() {
  pids+=("$1")
  proc_track "$1"
}
pipe_cleanup() {
  for p in "${pids[@]}"; do proc_signal CONT "$p"; proc_signal TERM "$p"; done
  wait 2>/dev/null
  rm -rf "$work"
}

pipe_die() {
  echo "${0##*/}: $*" >&2
  for f in "$out"/*.log; do echo "---- $f"; tail -n 15 "$f"; done
  exit 1
}

pipe_ctl() { "$bin/dflash-ctl" --runtime-dir "$run" --timeout-ms 3000 "$@"; }
pipe_status() { pipe_ctl status --json; }
# bucket fields of one status reply, each summed over buckets, space-separated (ready, produced,
# produced_tokens, consumed, ...): pipe_bsum produced produced_tokens
pipe_bsum() {
  pipe_status | python3 -c "
import json, sys
b = json.load(sys.stdin)['buckets']
print(' '.join(str(sum(x[k] for x in b)) for k in sys.argv[1:]))" "$@"
}

# pipe_setup MODEL BACKEND OUT: checkpoint (made when missing), data, runtime dir, SLOT_ARGS.
pipe_setup() {
  model=$1 backend=$2 out=$3
  export LD_LIBRARY_PATH="$bin/devlibs:${LD_LIBRARY_PATH:-}" OPENBLAS_CORETYPE=Haswell
  work=$(mktemp -d /tmp/dflash-pipe.XXXXXX)
  run="$work/run"
  mkdir -p -m 700 "$run"
  trap pipe_cleanup EXIT
  if [ ! -f "$model/config.json" ]; then
    local t0=$SECONDS
    python3 "$here/../target/make_checkpoint.py" "$model" || pipe_die "cannot make the checkpoint"
    echo "checkpoint made in $((SECONDS - t0)) s"
  fi
  python3 - "$work/train.jsonl" "${SEQS:-400}" "$model/config.json" "${LEN_MIN:-64}" \
    "${LEN_MAX:-3072}" <<'PY'
import json, math, random, sys
path, n = sys.argv[1], int(sys.argv[2])
vocab = json.load(open(sys.argv[3]))["vocab_size"]
lo, hi = int(sys.argv[4]), int(sys.argv[5])
r = random.Random(7)
with open(path, "w") as f:  # random tokens; the first 10% of each sequence is the prompt
    for _ in range(n):
        L = int(round(math.exp(r.uniform(math.log(lo), math.log(hi)))))
        ids = [r.randrange(vocab) for _ in range(L)]
        p = max(1, L // 10)
        f.write(json.dumps({"input_ids": ids, "loss_mask": [0] * p + [1] * (L - p)}) + "\n")
PY
  local buckets=${BUCKETS:-512,1024,2048,3072}
  "$bin/dflash-data" --in "$work/train.jsonl" --out "$work/train.shard" --model "$model" \
    --buckets "$buckets" --max-len 3072 --strict > "$out/data.log" 2>&1 || pipe_die "dflash-data failed"
  SLOT_ARGS=(--buckets "$buckets" --token-budget 3072 --max-seqs 1 --layers 5 --backend "$backend")
}

# pipe_queue ARGS...: the broker (journal in the work dir), waited for; sets qpid.
pipe_queue() {
  "$bin/dflash-queue" --runtime-dir "$run" --journal "$work/queue.journal" --liveness 100 \
    --lease-timeout-ms 60000 "$@" > "$out/queue.log" 2>&1 &
  qpid=$!
  pipe_own $qpid
  for _ in $(seq 50); do
    proc_alive $qpid || pipe_die "dflash-queue exited"
    pipe_ctl ping > /dev/null 2>&1 && return 0
    sleep 0.2
  done
  pipe_die "the broker did not start"
}

# pipe_target ARGS...: dflash-target on the shards; sets tpid.
pipe_target() {
  "$bin/dflash-target" --runtime-dir "$run" --name tgt --model "$model" \
    --shards "$work/train.shard" "${SLOT_ARGS[@]}" --progress-ms 10000 "$@" > "$out/target.log" 2>&1 &
  tpid=$!
  pipe_own $tpid
}

# After a drain: waits up to 30 s for the target to exit.
pipe_stop_target() {
  for _ in $(seq 150); do proc_alive $tpid || break; sleep 0.2; done
  wait $tpid || pipe_die "dflash-target exit status $? after the drain"
}

# pipe_copies_ok LOG...: each drafter log's summary line (written as it exits) counts the slot
# copies that failed (the slot given back unread); prints them and dies unless every count is 0
# (a run without faults copies every slot; a failing copy path would only lower the rates).
pipe_copies_ok() {
  local f n
  for f in "$@"; do
    n=$(grep -ao "[0-9]* copies failed" "$f" | tail -n 1 | grep -o "^[0-9]*" || true)
    echo "${f##*/}: ${n:-no summary of the} copies failed"
    [ "$n" = 0 ] || pipe_die "${f##*/}: slot copies failed, or no summary line: must be 0"
  done
}

# pipe_hot_loops LOG...: each daemon log's summary line counts host waits for the whole compute
# stream and memory allocations inside its hot loop (the target's fills, the drafter's steps);
# prints them and dies unless every count is 0.
pipe_hot_loops() {
  local f counts
  for f in "$@"; do
    counts=$(grep -a "host waits for the whole compute stream" "$f" | tail -n 1 |
      grep -o "inside [a-z]*: [0-9]*" || true)
    echo "${f##*/}: $(echo $counts)"
    [ "$(echo "$counts" | grep -c ': 0$')" = 2 ] ||
      pipe_die "${f##*/}: host waits and allocations in the hot loop must be 0, 0"
  done
}
