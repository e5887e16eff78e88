#!/usr/bin/env bash
# cli_checks: what the daemons say and how they exit, as a user sees it.
#   - they refuse at start-up, with exit 2 (bad configuration, docs/operating.md section 7) and
#     a message naming the flag, what they used to take silently or fail on later with another
#     status. No broker runs there: a daemon that gets past its checks waits --broker-wait-ms
#     (short here) and exits 1, which fails the check;
#   - the target reports its warm-up after loading the model;
#   - with no broker, "no broker answered ... for T" states the time waited (a request timeout
#     of 1 s is past a --broker-wait-ms of 100), not the configured wait, and why it is longer
#     (each request waits up to --timeout-ms; "for 1.0 s (--broker-wait-ms 100)" read as a bug);
#   - --dump-config refuses (exit 2) what the start refuses (dflash-queue: min-ready above
#     max-depth; the drafter: --lr x --weight-decay of 1, --max-steps past --total-steps,
#     --capture-layers against --layers, no mode, a mode without what it needs, --comm nccl on
#     the host, a group step past 64 batches; eval: two drafters; the target: --capture-layers
#     out of order or against --layers, a token budget below a bucket, a bad --name, a model
#     without --shards; every program: a --log-level that is not a level): each printed its
#     dump with exit 0;
#   - a bad value from a DFLASH_* variable or a config file is named so ("DFLASH_HIDDEN=4096
#     (environment)", "layers 5 (config file F, line 2)"), not blamed on a flag nobody gave;
#   - dflash-ctl --json keygen prints one JSON object on success and on failure (it printed
#     text lines); an eval whose result standard output does not take exits 1 (it was 0);
#   - with a broker, a drafter's grant-to-copy latency p99 is not below its p50 after 2 batches
#     (the percentiles' ranks used to cross with few samples); a batch failing --verify is
#     exit 3, a target replaced by another of its --name exit 4;
#   - a second dflash-queue on the runtime dir of a running one exits 1 and leaves no --journal
#     file or .lock of its own behind (both stayed).
#   cli_checks.sh BUILD_DIR HAVE_CUDA (ON or OFF: the build's DFLASH_HAVE_CUDA)
set -uo pipefail
BUILD=$1
HAVE_CUDA=${2:-ON}
Q=$BUILD/services/queue/dflash-queue
T=$BUILD/services/target/dflash-target
D=$BUILD/services/drafter/dflash-drafter
WORK=$(mktemp -d "${TMPDIR:-/tmp}/dflash-test-cli.XXXXXX")
source "$(dirname "$0")/../../scripts/proc-lib.sh"
PIDS=()
cleanup() {
    [ ${#PIDS[@]} -eq 0 ] || proc_signal TERM "${PIDS[@]}"
    wait 2> /dev/null
    rm -rf "$WORK"
}
trap cleanup EXIT
mkdir -m 700 "$WORK/run"
failed=0

# expect NAME STATUS PATTERN CMD...: CMD exits STATUS and its output matches PATTERN (grep -E)
expect() {
    local name=$1 want=$2 pattern=$3
    shift 3
    "$@" > "$WORK/$name.log" 2>&1
    local got=$?
    if [ "$got" != "$want" ] || ! grep -qE -- "$pattern" "$WORK/$name.log"; then
        echo "FAIL $name: exit $got (want $want), output should match '$pattern':" >&2
        tail -n 8 "$WORK/$name.log" >&2
        failed=1
    else
        echo "ok   $name: $(grep -E -m1 -- "$pattern" "$WORK/$name.log")"
    fi
}

"$BUILD/tools/dflash-mkmodel" --family qwen3 --layers 4 --seed 1 --out "$WORK/target" \
    > "$WORK/mkmodel.log" 2>&1 || { cat "$WORK/mkmodel.log"; exit 1; }
HIDDEN=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["hidden_size"])' \
    "$WORK/target/config.json")
[ "$HIDDEN" != 256 ] || { echo "the test needs a target whose hidden size is not 256" >&2; exit 1; }
python3 - "$WORK/data.jsonl" << 'EOF'
import json, sys
with open(sys.argv[1], "w") as f:
    for s in range(8):
        f.write(json.dumps({"input_ids": [(s + 3 * k) % 100 for k in range(40)],
                            "loss_mask": [0] * 8 + [1] * 32}) + "\n")
EOF
"$BUILD/tools/dflash-data" --in "$WORK/data.jsonl" --out "$WORK/data.shard" \
    --model "$WORK/target" > "$WORK/data.log" 2>&1 || { cat "$WORK/data.log"; exit 1; }
COMMON=(--runtime-dir "$WORK/run" --broker-wait-ms 300 --timeout-ms 100 --threads 1
    --backend host)
MODEL=(--model "$WORK/target" --shards "$WORK/data.shard" --buckets 64 --token-budget 64
    --max-seqs 2)

# a model the target does not run is a bad configuration (exit 2, as the drafter says it), not
# an I/O failure: a quantized checkpoint keeps its model_type
cp -r "$WORK/target" "$WORK/awq"
python3 - "$WORK/awq/config.json" << 'EOF'
import json, sys
c = json.load(open(sys.argv[1]))
c["quantization_config"] = {"bits": 4, "quant_method": "awq", "version": "gemm"}
json.dump(c, open(sys.argv[1], "w"))
EOF
expect target_quantized 2 'quantized checkpoint \(quantization_config, quant_method "awq"\)' \
    "$T" "${COMMON[@]}" --model "$WORK/awq" --shards "$WORK/data.shard" --buckets 64 \
    --token-budget 64 --max-seqs 2
# a captured layer the model lacks: --verify-model said it as a failed load (exit 1)
expect drafter_verify_model_layer 2 "captured layer id 99 outside \[0, 4\)" "$D" "${COMMON[@]}" \
    --verify-model --model "$WORK/target" --shards "$WORK/data.shard" --buckets 64 \
    --token-budget 64 --max-seqs 2 --capture-layers 1,99 --layers 2

# an explicit shape flag that disagrees with the model was replaced by the model's value
expect target_hidden 2 "--hidden 999 does not match" "$T" "${COMMON[@]}" "${MODEL[@]}" --hidden 999
expect target_layers 2 "--layers 5 disagrees" "$T" "${COMMON[@]}" "${MODEL[@]}" --layers 5 \
    --capture-layers 1,2
# a --layers count DFlash's rule cannot place in the model (3 distinct ids in 1..1 of a 4-layer
# target): the load refused it, exit 1 as a failed load
expect target_layers_rule 2 "--layers 3: DFlash's default rule gives no 3 distinct layer ids" \
    "$T" "${COMMON[@]}" "${MODEL[@]}" --layers 3
expect drafter_verify_model_rule 2 "--layers 3: DFlash's default rule gives no 3 distinct" "$D" \
    "${COMMON[@]}" --verify-model "${MODEL[@]}" --layers 3
# the synthetic target never parsed --capture-layers
expect target_capture_synthetic 2 "bad --capture-layers 'abc'" "$T" "${COMMON[@]}" \
    --capture-layers abc
# captured layers not in ascending order trained, and the checkpoint recorded them in that
# column order, which SGLang and vLLM (capturing as the layers run) would serve permuted; a
# repeated id was caught only by the target's load (eval: exit 1, "cannot load the target").
# Every program refuses both with its options, exit 2.
expect target_capture_order 2 "bad --capture-layers '3,1': .*ascending order" "$T" \
    "${COMMON[@]}" "${MODEL[@]}" --capture-layers 3,1
expect drafter_capture_order 2 "bad --capture-layers '2,1': .*ascending order" "$D" \
    "${COMMON[@]}" --model "$WORK/target" --buckets 64 --token-budget 64 --max-seqs 2 \
    --layers 2 --capture-layers 2,1
expect drafter_capture_twice 2 "bad --capture-layers '1,1': captured layer id 1 given twice" \
    "$D" "${COMMON[@]}" --model "$WORK/target" --buckets 64 --token-budget 64 --max-seqs 2 \
    --layers 2 --capture-layers 1,1
expect eval_capture_twice 2 "bad --capture-layers '1,1': captured layer id 1 given twice" \
    "$D" eval --init-only --model "$WORK/target" --data "$WORK/data.shard" --layers 2 \
    --capture-layers 1,1 --threads 1
expect eval_capture_order 2 "bad --capture-layers '2,1': .*ascending order" "$D" eval \
    --init-only --model "$WORK/target" --data "$WORK/data.shard" --layers 2 \
    --capture-layers 2,1 --threads 1
# The target's last layer (3 of 4): no serving system can feed it to a drafter (SGLang and vLLM
# capture a layer's output as the next one's input): refused at start-up, exit 2.
expect drafter_capture_last 2 "captured layer 3 is the target's last .4 layers.*below 3" "$D" \
    "${COMMON[@]}" --model "$WORK/target" --buckets 64 --token-budget 64 --max-seqs 2 \
    --layers 2 --capture-layers 1,3
expect eval_capture_last 2 "captured layer 3 is the target's last" "$D" eval --init-only \
    --model "$WORK/target" --data "$WORK/data.shard" --layers 2 --capture-layers 2,3 --threads 1
# a result that standard output does not take (a full disk, a closed pipe) is exit 1, not 0
expect eval_stdout_full 1 "dflash-drafter eval: cannot write the result to standard output" \
    bash -c '"$0" "$@" > /dev/full' "$D" eval --init-only --model "$WORK/target" \
    --data "$WORK/data.shard" --layers 2 --capture-layers 1,2 --threads 1 --json
# the drafter took an explicit --hidden 256 (the default's value) for "not given"
expect drafter_hidden_256 2 "--hidden 256 does not match" "$D" "${COMMON[@]}" \
    --model "$WORK/target" --hidden 256 --buckets 64 --token-budget 64 --max-seqs 2
# --lr 1 --weight-decay 10 (each in its range) made AdamW's decay factor 1 - lr * wd negative:
# the weights grew until the loss was NaN; 0.5 x 2 is the edge (the factor 0)
expect drafter_lr_decay 2 "--lr 1 with --weight-decay 10: .*must stay below 1.*1 - lr" \
    "$D" "${COMMON[@]}" --model "$WORK/target" --lr 1 --weight-decay 10
expect drafter_lr_decay_edge 2 "their product 1 must stay below 1" "$D" "${COMMON[@]}" \
    --model "$WORK/target" --lr 0.5 --weight-decay 2
# gradient accumulation in a group: a group step holds at most 64 batches (ranks x micro-steps);
# a larger --accumulate is refused at start-up (any --accumulate was, before groups accumulated)
expect drafter_accumulate_group 2 "--accumulate 65 with --group 'g': a group step holds at most 64" \
    "$D" "${COMMON[@]}" --model "$WORK/target" --accumulate 65 --group g
# a token budget below the largest bucket failed in the batch plan, after the flags (exit 1)
expect target_budget 2 "--token-budget 100, --buckets '32,128': .*smaller than the largest" \
    "$T" "${COMMON[@]}" "${MODEL[@]}" --buckets 32,128 --token-budget 100
# --backend cuda in a build without CUDA failed when the pool was made (exit 1)
if [ "$HAVE_CUDA" = OFF ]; then
    expect target_cuda_cpu_build 2 "this build has no CUDA" "$T" "${COMMON[@]}" --backend cuda
    expect drafter_cuda_cpu_build 2 "this build has no CUDA" "$D" "${COMMON[@]}" --verify \
        --backend cuda
else
    echo "skip --backend cuda in a build without CUDA: this build has CUDA"
fi
# --backend cuda with no GPU visible (hidden here): exit 2 with the reason, in both daemons (the
# target exited 1 after "no cuda compute backend", the drafter 2 after "cannot create the cuda
# compute context")
CUDA_VISIBLE_DEVICES= expect target_cuda_no_gpu 2 "no CUDA device is visible|this build has no" \
    "$T" "${COMMON[@]}" "${MODEL[@]}" --backend cuda
CUDA_VISIBLE_DEVICES= expect drafter_cuda_no_gpu 2 "no CUDA device is visible|this build has no" \
    "$D" "${COMMON[@]}" --model "$WORK/target" --train --backend cuda
# --help names the eval and show subcommands; show refuses what it cannot read or share
expect drafter_help_eval 0 "dflash-drafter eval" "$D" --help
expect drafter_help_show 0 "dflash-drafter show CHECKPOINT" "$D" --help
expect drafter_show_none 1 "$WORK/run holds no checkpoint" "$D" show "$WORK/run"
expect drafter_show_drafters 2 "--drafters '0' is not a number of drafters" "$D" show "$WORK/run" \
    --drafters 0
expect drafter_show_args 2 "--drafters needs a number" "$D" show "$WORK/run" --drafters

# after loading, the target reports the warm-up of each bucket (it was silent for minutes on a
# large model), then waits for the broker
expect target_warmup 1 "warm-up bucket 1/1 \(2 sequences of 40 tokens\)" "$T" "${COMMON[@]}" \
    "${MODEL[@]}" --buckets 40 --token-budget 80 --capture-layers 1,2
# the time actually waited for the broker (a 1 s request timeout), not --broker-wait-ms 100
WAITED="no broker answered at .* for [1-9][0-9]*\.[0-9] s \(--broker-wait-ms 100, checked"
WAITED+=" after each request, which waits up to --timeout-ms 1000;"
expect target_waited 1 "$WAITED" "$T" "${COMMON[@]}" --broker-wait-ms 100 --timeout-ms 1000
expect drafter_waited 1 "$WAITED" "$D" "${COMMON[@]}" --verify --broker-wait-ms 100 \
    --timeout-ms 1000
# on tcp:// without an answer: the CURVE keys are named (a keyless client only heard "is
# dflash-queue running?")
expect target_waited_tcp 1 "answers only the CURVE keys it knows.*--curve-server-key" "$T" \
    "${COMMON[@]}" --endpoint tcp://127.0.0.1:9 --broker-wait-ms 100 --timeout-ms 200
# while no broker has answered yet, the progress lines say so (they read "waiting for a grant
# 0%" / "waiting for a free slot 0%", like an idle pipeline: a mistyped --runtime-dir)
expect target_no_broker_yet 1 "free slot.*waiting for a broker \(none answered for" "$T" \
    "${COMMON[@]}" --broker-wait-ms 1500 --progress-ms 300
expect drafter_no_broker_yet 1 "grant.*waiting for a broker \(none answered for" "$D" \
    "${COMMON[@]}" --verify --broker-wait-ms 1500 --progress-ms 300

# --dump-config makes the start's checks first; the depth refusal names where each value came
# from (it said neither a default nor an environment variable)
expect queue_dump_checked 2 "--min-ready 100 needs that many ready slots, but --max-depth 10 caps" \
    "$Q" --runtime-dir "$WORK/run" --min-ready 100 --max-depth 10 --dump-config
DFLASH_MAX_DEPTH=4 expect queue_dump_sources 2 "--min-ready 30 \(default\) needs that many \
ready slots, but DFLASH_MAX_DEPTH=4 \(environment\) caps" "$Q" --runtime-dir "$WORK/run" \
    --dump-config
expect queue_dump_ok 0 "^min-ready 5$" "$Q" --runtime-dir "$WORK/run" --min-ready 5 --dump-config
expect queue_dump_log_level 2 "bad --log-level 'loud': use debug, info, warn or error" "$Q" \
    --runtime-dir "$WORK/run" --log-level loud --dump-config
DFLASH_LOG_LEVEL=x expect data_dump_log_level 2 \
    "dflash-data: bad DFLASH_LOG_LEVEL='x' \(environment\)" "$BUILD/tools/dflash-data" --dump-config
# --insecure-tcp (tcp without CURVE: anyone who reaches the port may steer) serves loopback only
# (it took any address, its help's "loopback only" was advice)
expect queue_insecure_any_host 2 "--insecure-tcp serves loopback only .*tcp://0.0.0.0:5599 is not" \
    "$Q" --runtime-dir "$WORK/run" --insecure-tcp --bind tcp://0.0.0.0:5599 --dump-config
expect queue_insecure_loopback 0 "insecure-tcp" "$Q" --runtime-dir "$WORK/run" --insecure-tcp \
    --bind tcp://127.0.0.1:5599 --dump-config
# a CURVE key file the broker cannot read: a bad configuration (exit 2), not a failure (1)
mkdir -m 700 "$WORK/qkeys"
expect queue_missing_key 2 "cannot open key file $WORK/qkeys/none.key" "$Q" --runtime-dir \
    "$WORK/run" --journal none --bind tcp://127.0.0.1:5597 --curve-secret-key \
    "$WORK/qkeys/none.key" --curve-clients "$WORK/qkeys"
# ... in the drafter, its eval and the target too: each printed these with exit 0
expect drafter_dump_lr_decay 2 "--lr 1 with --weight-decay 1: their product 1 must stay below 1" \
    "$D" --model "$WORK/target" --lr 1 --weight-decay 1 --dump-config
expect drafter_dump_schedule 2 "--max-steps 20 is past --total-steps 10" "$D" \
    --model "$WORK/target" --total-steps 10 --max-steps 20 --dump-config
expect drafter_dump_capture 2 "--capture-layers '1,2,3' names 3 target layers but the slots \
hold 2 captured layers \(--layers 2\)" "$D" --model "$WORK/target" --layers 2 \
    --capture-layers 1,2,3 --dump-config
expect drafter_dump_mode 2 "choose one mode" "$D" --dump-config
expect drafter_dump_train_model 2 "--train needs --model TARGET_DIR" "$D" --train --dump-config
expect drafter_dump_verify_model_shards 2 "--verify-model needs the target's --shards" "$D" \
    --verify-model --model "$WORK/target" --dump-config
expect drafter_dump_verify_model_cuda 2 \
    "--verify-model runs its direct forward on the cpu|this build has no CUDA|no CUDA device" \
    "$D" \
    --verify-model --model "$WORK/target" --shards "$WORK/data.shard" --backend cuda --dump-config
expect drafter_dump_comm_nccl 2 "--comm nccl needs the cuda backend" "$D" --model "$WORK/target" \
    --group g --comm nccl --backend host --dump-config
# a group step holds at most 64 batches: ranks x --accumulate, each bound at its last value
expect drafter_dump_group_acc64 0 "^accumulate 64$" "$D" --model "$WORK/target" --group g \
    --accumulate 64 --dump-config
expect drafter_dump_group_8x8 0 "^group-size 8$" "$D" --model "$WORK/target" --group g \
    --group-size 8 --accumulate 8 --dump-config
expect drafter_dump_group_8x9 2 "--group-size 8 with --accumulate 9: a group step holds at most 64" \
    "$D" --model "$WORK/target" --group g --group-size 8 --accumulate 9 --dump-config
expect drafter_dump_ok 0 "^lr 0.00059999999999999995$" "$D" --model "$WORK/target" --dump-config
expect eval_dump_two_drafters 2 "--checkpoint '/x' and --init-only name two drafters" "$D" \
    eval --model "$WORK/target" --data "$WORK/data.shard" --checkpoint /x --init-only \
    --dump-config
expect target_dump_bad_name 2 "--name 'a b': give 1 to .* letters, digits" "$T" --name "a b" \
    --dump-config
expect target_dump_no_shards 2 "--model .*/target needs --shards" "$T" --model "$WORK/target" \
    --dump-config
# deploy's compose variables are no options, and not warned about as misspelt ones
# (DFLASH_DRAFTER_GPUS, the group overlay's drafter GPUs, was)
DFLASH_DRAFTER_GPUS=1,2 DFLASH_TARGET_GPU=0 "$D" --verify --dump-config > "$WORK/gpus.log" 2>&1
if grep -q "names no option" "$WORK/gpus.log"; then
    echo "FAIL compose_variables_quiet: $(grep "names no option" "$WORK/gpus.log")" >&2
    failed=1
else
    echo "ok   compose_variables_quiet"
fi
# a list of no file is no list (it was taken, and the open failed later: exit 1)
expect target_dump_comma_shards 2 "--model .*/target needs --shards" "$T" --model \
    "$WORK/target" --shards " , " --dump-config
expect eval_dump_comma_data 2 "needs --model TARGET_DIR, --data SHARD" "$D" eval --model \
    "$WORK/target" --data "," --init-only --dump-config
expect target_dump_capture_order 2 "bad --capture-layers '3,1': .*ascending order" "$T" \
    "${MODEL[@]}" --capture-layers 3,1 --dump-config
expect target_dump_layers 2 "--layers 5 disagrees with the 2 ids of --capture-layers '1,2'" \
    "$T" "${MODEL[@]}" --layers 5 --capture-layers 1,2 --dump-config
expect target_dump_budget 2 "--token-budget 100, --buckets '32,128': .*smaller than the" "$T" \
    "${MODEL[@]}" --buckets 32,128 --token-budget 100 --dump-config
expect target_dump_ok 0 "^capture-layers 1,2$" "$T" "${MODEL[@]}" --capture-layers 1,2 \
    --dump-config

# a value from the environment or a config file is named so, not as a flag nobody gave
expect drafter_hidden_env 2 "DFLASH_HIDDEN=4096 \(environment\) does not match the target's" \
    env DFLASH_HIDDEN=4096 "$D" "${COMMON[@]}" --model "$WORK/target" --buckets 64 \
    --token-budget 64 --max-seqs 2
expect target_hidden_env 2 "DFLASH_TARGET_HIDDEN=4096 \(environment\) does not match" \
    env DFLASH_TARGET_HIDDEN=4096 "$T" "${COMMON[@]}" "${MODEL[@]}"
expect drafter_lr_env 2 "DFLASH_LR=2 \(environment\) with --weight-decay 0.5: their product" \
    env DFLASH_LR=2 "$D" --model "$WORK/target" --weight-decay 0.5 --dump-config
printf '# layers for the daemons\nlayers 5\n' > "$WORK/layers.conf"
expect target_layers_file 2 "layers 5 \(config file $WORK/layers.conf, line 2\) disagrees \
with the 2 ids of --capture-layers '1,2'" "$T" "${COMMON[@]}" "${MODEL[@]}" --config \
    "$WORK/layers.conf" --capture-layers 1,2
# keygen under --json: JSON on stdout, success and failure alike
mkdir "$WORK/keys"
expect ctl_keygen_json 0 '^\{"ok":true,"verb":"keygen","secret_key_file":"[^"]*/keys/n.key",'\
'"public_key_file":"[^"]*/keys/n.pub","public_key":"[^"]{40}"\}$' \
    "$BUILD/tools/dflash-ctl" --json keygen "$WORK/keys" n
expect ctl_keygen_json_exists 1 '^\{"ok":false,"verb":"keygen","error":"EXISTS","message":' \
    "$BUILD/tools/dflash-ctl" --json keygen "$WORK/keys" n
expect ctl_keygen_json_usage 1 '^\{"ok":false,"verb":"keygen","error":"INVAL",' \
    "$BUILD/tools/dflash-ctl" --json keygen "$WORK/keys"

# p50 and p99 of two copies: nearest rank; v[n/2] and v[(n-1)*0.99] gave p99 < p50
"$Q" --runtime-dir "$WORK/run" --journal none --min-ready 1 --max-depth 4 \
    > "$WORK/queue.log" 2>&1 &
PIDS+=($!)
proc_track $!
SLOTS=(--buckets 64 --token-budget 64 --max-seqs 2 --hidden 16 --layers 2)
"$T" --runtime-dir "$WORK/run" --backend host "${SLOTS[@]}" --slots 4 --epochs 1 \
    > "$WORK/target.log" 2>&1 &
PIDS+=($!)
proc_track $!
expect drafter_percentiles 0 "grant to copy done p50" "$D" --runtime-dir "$WORK/run" \
    --backend host "${SLOTS[@]}" --verify --max-batches 2 --progress-ms 0
read -r P50 P99 < <(sed -nE 's/.*grant to copy done p50 ([0-9.]+) ms, p99 ([0-9.]+) ms.*/\1 \2/p' \
    "$WORK/drafter_percentiles.log")
if ! python3 -c 'import sys; sys.exit(not float(sys.argv[2]) >= float(sys.argv[1]))' \
    "${P50:-x}" "${P99:-x}"; then
    echo "FAIL drafter_percentiles: p99 ${P99:-?} ms is below p50 ${P50:-?} ms" >&2
    failed=1
fi
# a batch that fails --verify (the drafter expects another vocabulary than the target's) ends
# the drafter with exit 3, the documented "a batch failed verification"
expect drafter_verify_failed 3 "VERIFY FAILED|failed verification" "$D" --runtime-dir "$WORK/run" \
    --backend host "${SLOTS[@]}" --verify --vocab-size 999 --max-batches 1 --progress-ms 0
# a target replaced by another of its --name exits 4, the documented "name in use"
"$T" --runtime-dir "$WORK/run" --backend host "${SLOTS[@]}" --slots 2 --name clitgt \
    > "$WORK/target_a.log" 2>&1 &
TA=$!
proc_track $TA
for _ in $(seq 300); do grep -q "registered pool" "$WORK/target_a.log" && break; sleep 0.1; done
"$T" --runtime-dir "$WORK/run" --backend host "${SLOTS[@]}" --slots 2 --name clitgt \
    > "$WORK/target_b.log" 2>&1 &
PIDS+=($!)
proc_track $!
# A exits once B took its name over: waited for 60 s at most (A registering after B would
# replace B instead, and run on)
for _ in $(seq 600); do proc_alive $TA || break; sleep 0.1; done
proc_signal KILL $TA || true
GOT=0
wait $TA || GOT=$?
if [ "$GOT" != 4 ] || ! grep -q "name 'clitgt' is in use" "$WORK/target_a.log"; then
    echo "FAIL target_name_in_use: exit $GOT (want 4) naming the name in use:" >&2
    tail -n 8 "$WORK/target_a.log" >&2
    failed=1
else
    echo "ok   target_name_in_use: the replaced target exits 4"
fi
# a second broker on the busy runtime dir: refused, and its new journal files removed
expect queue_second 1 "cannot start" "$Q" --runtime-dir "$WORK/run" --journal "$WORK/second.j"
for f in "$WORK/second.j" "$WORK/second.j.lock"; do
    if [ -e "$f" ]; then
        echo "FAIL queue_second: $f was left behind by a broker that did not start" >&2
        failed=1
    fi
done

exit $failed
