#!/usr/bin/env bash
# cli_checks: the daemons refuse at start-up, with exit 2 (bad configuration, docs/operating.md
# section 7) and a message naming the flag, what they used to take silently or fail on later
# with another status. No broker runs: a daemon that gets past its checks waits
# --broker-wait-ms (short here) and exits 1, which fails the check.
#   cli_checks.sh BUILD_DIR HAVE_CUDA (ON or OFF: the build's DFLASH_HAVE_CUDA)
set -uo pipefail
BUILD=$1
HAVE_CUDA=${2:-ON}
Q=$BUILD/services/queue/dflash-queue
T=$BUILD/services/target/dflash-target
D=$BUILD/services/drafter/dflash-drafter
WORK=$(mktemp -d "${TMPDIR:-/tmp}/dflash-test-cli.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
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

# an explicit shape flag that disagrees with the model was replaced by the model's value
expect target_hidden 2 "--hidden 999 does not match" "$T" "${COMMON[@]}" "${MODEL[@]}" --hidden 999
expect target_layers 2 "--layers 5 disagrees" "$T" "${COMMON[@]}" "${MODEL[@]}" --layers 5 \
    --capture-layers 1,2
# the synthetic target never parsed --capture-layers
expect target_capture_synthetic 2 "bad --capture-layers 'abc'" "$T" "${COMMON[@]}" \
    --capture-layers abc
# the drafter took an explicit --hidden 256 (the default's value) for "not given"
expect drafter_hidden_256 2 "--hidden 256 does not match" "$D" "${COMMON[@]}" \
    --model "$WORK/target" --hidden 256 --buckets 64 --token-budget 64 --max-seqs 2
# a token budget below the largest bucket failed in the batch plan, after the flags (exit 1)
expect target_budget 2 "--token-budget 100, --buckets 32,128: .*smaller than the largest" \
    "$T" "${COMMON[@]}" "${MODEL[@]}" --buckets 32,128 --token-budget 100
# --backend cuda in a build without CUDA failed when the pool was made (exit 1)
if [ "$HAVE_CUDA" = OFF ]; then
    expect target_cuda_cpu_build 2 "this build has no CUDA" "$T" "${COMMON[@]}" --backend cuda
    expect drafter_cuda_cpu_build 2 "this build has no CUDA" "$D" "${COMMON[@]}" --verify \
        --backend cuda
else
    echo "skip --backend cuda in a build without CUDA: this build has CUDA"
fi
# --help names the eval subcommand
expect drafter_help_eval 0 "dflash-drafter eval" "$D" --help

exit $failed
