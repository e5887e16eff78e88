#!/usr/bin/env bash
# scripts_options: the command line of scripts/{train,test,install-deps,gpu-carry,gpu-check,
# gpu-bench,gpu-parity,docker-up}: -h and --help print the usage (exit 0), an unknown option is
# refused (exit 2) before the script does anything; scripts/train refuses an option without its
# value ("$2: unbound variable" under set -u) and a bad number (--steps 0 made its final check pass
# always) before it builds or starts a daemon, and its help says which --data names are JSONL; its
# --init-from is refused when it names --out or a path inside it; --slots, --buckets and --features
# are checked against the broker's and the target's needs; chat data is refused with the
# scripts/chat_to_jsonl.py command, and .JSONL is JSONL; --drafters / --drafter-gpus / --target-gpu
# are checked against a group's needs (a share of the step each, a slot each); an --out whose lock
# names a gone scripts/train by a pid another process has now is said to be held by a gone one. cmake, apt-get,
# dpkg-query, nvidia-smi and nvcc are stand-ins that exit 99, in a scratch working directory: a
# script that got past its arguments stops at once.
# scripts/gpu-carry's OUT: with a cmake that "builds" (stand-in binaries) and a strip that does
# nothing, a failing DEVICE_LIBS tool or a missing one named by DEVICE_LIBS leaves an existing
# OUT as it was; one that works replaces it; none at the default place (a copy of scripts/ with
# no ../shared beside it) warns and carries the binaries without devlibs/ (it failed with 127
# after the build, OUT half filled). A failing strip or xz exits 1 (it exited with their status)
# and leaves OUT as it was; no temporary folder (OUT.tmp.*, formerly .gpu-carry.* in the
# repository root, not ignored by git) is left by a failure or a success; an old OUT that cannot
# be removed after the swap only warns (OUT was removed first: a failing rm left it half
# deleted).
#   scripts_options.sh SOURCE_ROOT
set -uo pipefail
SRC=$1
WORK=$(mktemp -d "${TMPDIR:-/tmp}/dflash-test-scripts.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$WORK/bin" "$WORK/cwd"
for tool in cmake apt-get dpkg-query nvidia-smi nvcc; do
    printf '#!/bin/sh\necho "stand-in %s ran" >&2\nexit 99\n' "$tool" > "$WORK/bin/$tool"
    chmod +x "$WORK/bin/$tool"
done
export PATH=$WORK/bin:$PATH
failed=0

# verdict NAME STATUS PATTERN GOT: the run that wrote $WORK/out exited GOT; it should have
# exited STATUS with output matching PATTERN
verdict() {
    local name=$1 want=$2 pattern=$3 got=$4
    if [ "$got" != "$want" ] || ! grep -qE -- "$pattern" "$WORK/out"; then
        echo "FAIL $name: exit $got (want $want), output should match '$pattern':" >&2
        head -n 5 "$WORK/out" >&2
        failed=1
    else
        echo "ok   $name"
    fi
}

# expect NAME STATUS PATTERN SCRIPT ARGS...: the script exits STATUS, its output matches PATTERN
expect() {
    local name=$1 want=$2 pattern=$3
    shift 3
    (cd "$WORK/cwd" && timeout 60 bash "$SRC/scripts/$@") > "$WORK/out" 2>&1
    verdict "$name" "$want" "$pattern" $?
}

for s in train test install-deps gpu-carry gpu-check gpu-bench gpu-parity docker-up; do
    expect "$s -h" 0 "^(scripts/)?$s: " "$s" -h
    expect "$s --help" 0 "^(scripts/)?$s: " "$s" --help
    expect "$s --bogus" 2 "unknown option --bogus" "$s" --bogus
done
# scripts/demo: its help is its whole header (a fixed line range cut it mid-sentence); an --out
# holding a run is refused before anything is built (a second demo in it resumed the first's
# checkpoints, trained nothing and failed on an unrelated check)
expect "demo --help" 0 "failing step and the tail of its daemon's log are printed" demo --help
mkdir -p "$WORK/used" && touch "$WORK/used/journal"
expect "demo --out used" 2 "--out .*/used is not empty" demo --out "$WORK/used"
# its options' values: a missing one said so (bash's "unbound variable" under set -u), and an
# unknown argument, exit 2 as its header says
expect "demo --out (no value)" 2 "demo: --out needs a directory" demo --out
expect "demo --build (no value)" 2 "demo: --build needs a directory" demo --build
expect "demo --bogus" 2 "demo: unknown argument --bogus" demo --bogus
# a failing build says why: scripts/demo with a cmake whose build fails, writing its errors to
# stdout as Ninja does (the build's output went to /dev/null, and the script exited unsaid)
mkdir -p "$WORK/failbuild"
cat > "$WORK/failbuild/cmake" << 'EOF'
#!/bin/sh
case " $* " in
*" --build "*) echo "FAILED: common/x.c.o"; echo "x.c:1:1: error: stand-in compiler error"; exit 1 ;;
esac
exit 0
EOF
chmod +x "$WORK/failbuild/cmake"
(cd "$WORK/cwd" && PATH="$WORK/failbuild:$PATH" timeout 60 bash "$SRC/scripts/demo" --build \
    "$WORK/demo-build" --out "$WORK/demo-out") > "$WORK/out" 2>&1
verdict "demo build failing" 1 "stand-in compiler error" $?
grep -q "the build in .*demo-build failed (exit 1)" "$WORK/out" ||
    { echo "FAIL demo build failing: no line naming the failed build" >&2; failed=1; }
# scripts/test's -LE joins the script's own gpu in one pattern: ctest excludes a test only when
# it matches every -LE given ("-LE docker" beside "-LE gpu" excluded nothing); a copy of the
# script whose cmake makes the build folder and whose ctest prints its arguments
TT=$WORK/testrun
mkdir -p "$TT/scripts" "$TT/bin"
cp "$SRC/scripts/test" "$SRC/scripts/cli-lib.sh" "$SRC/scripts/build-lib.sh" "$TT/scripts/"
echo 'import sys; sys.exit(0)' > "$TT/scripts/ctest_skips.py"
cat > "$TT/bin/cmake" << 'EOF'
#!/bin/sh
while [ $# -gt 0 ]; do [ "$1" = -B ] && mkdir -p "$2"; shift; done
exit 0
EOF
printf '#!/bin/sh\necho "ctest args: $*"\n' > "$TT/bin/ctest"
chmod +x "$TT/bin/cmake" "$TT/bin/ctest"
(cd "$WORK/cwd" && PATH="$TT/bin:$PATH" timeout 60 bash "$TT/scripts/test" -LE docker -L unit) \
    > "$WORK/out" 2>&1
verdict "test -LE docker -L unit" 0 "ctest args: .*-LE gpu\|docker .*-L unit" $?
T=(train --model "$WORK/m" --data "$WORK/d.jsonl" --out "$WORK/o" --build "$WORK/b")
expect "train --steps (no value)" 2 "--steps needs a value" "${T[@]}" --steps
expect "train --steps 0" 2 "--steps must be a whole number >= 1" "${T[@]}" --steps 0
expect "train --epochs x" 2 "--epochs must be a whole number" "${T[@]}" --epochs x
expect "train --help on --data" 0 "ending in .jsonl is JSONL" train --help
expect "train --help on training longer" 0 "--init-from OLD_OUT" train --help
# the batch a step trains, the recipe's 32 sequences (it called the defaults "the DFlash paper's
# recipe", with no word of a 32x smaller batch; then said so, before --accumulate existed)
expect "train --help on the batch per step" 0 "^sequence of up to 3072 tokens, so a step is 32 \
sequences" train --help
expect "train --accumulate 0" 2 "--accumulate must be a whole number >= 1" "${T[@]}" \
    --accumulate 0
expect "train --init-from (no value)" 2 "--init-from needs a value" "${T[@]}" --init-from
# --init-from OUT, OUT/checkpoints, a checkpoint in it or a link into it: refused (the drafter
# would resume OUT's newest checkpoint and ignore the weights; only OUT/checkpoints was); a run
# beside OUT whose name begins with OUT's is not OUT's (it gets to the build: stand-in cmake)
mkdir -p "$WORK/m" "$WORK/o/checkpoints/step-2" "$WORK/old/checkpoints/step-2"
echo '{}' > "$WORK/m/config.json"
: > "$WORK/d.jsonl"
ln -s "$WORK/o/checkpoints" "$WORK/link"
for from in o o/checkpoints o/checkpoints/step-2 o/checkpoints/step-2/ link/step-2; do
    expect "train --init-from $from of --out" 2 "names --out's own checkpoints" "${T[@]}" \
        --init-from "$WORK/$from"
done
expect "train --init-from another run" 99 "stand-in cmake ran" "${T[@]}" --init-from "$WORK/old"
# an --out held by the daemons of a scripts/train that is gone, its pid now another process's
# (the lock names the script by pid and start time): said as gone, with the command that stops
# the daemons in order (it said "in use by another scripts/train": the pid ran), naming only
# those of its daemons' pids that still hold the lock (here this shell as the "target"; the
# "drafter", a process that does not hold it, and the "broker", no process, are left out: a
# daemon's pid may be another process's too); the same lock naming that process's own start
# time is a live scripts/train's
mkdir -p "$WORK/held"
sleep 120 &
other=$!
held_lock() {
    printf 'scripts/train pid %s (started %s); dflash-queue %s, dflash-target %s, dflash-drafter %s; ctl --runtime-dir /tmp/dflash-train.x status\n' \
        "$other" "$1" 4194304 "$$" "$other" > "$WORK/held/train.lock"
}
held_lock 1
exec {held_fd}>> "$WORK/held/train.lock" # held by this shell: no process left behind
flock -n "$held_fd"
expect "train --out held, its script's pid another's" 1 "is held by the daemons of a \
scripts/train that is gone \(pid $other, killed\?\)" train --model "$WORK/m" --data \
    "$WORK/d.jsonl" --out "$WORK/held" --build "$WORK/b"
want="  kill -TERM $$; while kill -0 $$ 2>/dev/null; do sleep 1; done; rm -rf /tmp/dflash-train.x"
grep -qxF -- "$want" "$WORK/out" || { echo "FAIL train --out held: the stop command is not \
'$want':" >&2; grep "^  " "$WORK/out" >&2; failed=1; }
held_lock "$(sed 's/.*) //' "/proc/$other/stat" | cut -d' ' -f20)"
expect "train --out held by a live scripts/train" 1 "is in use by another scripts/train" train \
    --model "$WORK/m" --data "$WORK/d.jsonl" --out "$WORK/held" --build "$WORK/b"
exec {held_fd}>&-
kill "$other" 2> /dev/null
wait "$other" 2> /dev/null
# a comma in the shard's path (the daemons' --shards is a comma-separated list: the target
# failed on half of it after the conversion), refused before --out is made
expect "train --out with a comma" 2 "would have a comma in its path" train --model "$WORK/m" \
    --data "$WORK/d.jsonl" --out "$WORK/a,b" --build "$WORK/b"
[ ! -e "$WORK/a,b" ] || { echo "FAIL train --out with a comma: --out was made" >&2; failed=1; }
# what the daemons refused after the conversion (exit 1), naming their options, is refused here
# with this script's: fewer --slots than the broker's 2 ready ones, --buckets out of order, more
# --features than DFlash's rule finds in the target's layers (unless --capture-layers names them)
expect "train --slots 1" 2 "--slots 1: .* --slots must be at least 2" "${T[@]}" --slots 1
expect "train --buckets 1024,512" 2 "--buckets must be ascending" "${T[@]}" --buckets 1024,512
# several drafters (a group): each trains the same share of a step, a step takes a slot for each
# at once, one GPU each when named; refused before anything starts
expect "train --drafters 0" 2 "--drafters must be a whole number >= 1" "${T[@]}" --drafters 0
expect "train --drafters 65" 2 "--drafters 65: a group holds at most 64 drafters" "${T[@]}" \
    --drafters 65
expect "train --drafters 3 --accumulate 32" 2 "--accumulate 32 is not a multiple of --drafters \
3 .*: give --accumulate 30 or 33" "${T[@]}" --drafters 3
expect "train --drafters 2 --accumulate 66" 2 "a group's step holds at most 64 slots" "${T[@]}" \
    --drafters 2 --accumulate 66
expect "train --drafters 3 --slots 3" 2 "--slots 3: .* one for each of the 3 drafters at once, \
so --slots must be at least 4" "${T[@]}" --drafters 3 --accumulate 3 --slots 3
expect "train --drafters 2 --drafter-gpus 1,2,3" 2 "--drafters 2 and --drafter-gpus 1,2,3 \
\(3 GPUs\) disagree" "${T[@]}" --drafters 2 --drafter-gpus 1,2,3
expect "train --drafter-gpus 1,x" 2 "--drafter-gpus must be comma-separated GPU ordinals" \
    "${T[@]}" --drafter-gpus 1,x
expect "train --backend host --target-gpu 1" 2 "--backend host runs on no GPU" "${T[@]}" \
    --backend host --target-gpu 1
expect "train --drafter-gpus 1,2 --accumulate 4" 99 "stand-in cmake ran" "${T[@]}" \
    --drafter-gpus 1,2 --accumulate 4
mkdir -p "$WORK/m4"
echo '{"model_type": "qwen3", "num_hidden_layers": 4}' > "$WORK/m4/config.json"
T4=("${T[@]}" --model "$WORK/m4")
expect "train --features 5, 4 layers" 2 "has 4 layers, .* give --features 1 or less, or name the \
layers: --extra-target and --extra-drafter" "${T4[@]}" --features 5
expect "train --features 1, 4 layers" 99 "stand-in cmake ran" "${T4[@]}" --features 1
expect "train --features 2, 4 layers, --capture-layers" 99 "stand-in cmake ran" "${T4[@]}" \
    --features 2 --extra-target "--capture-layers 0,1" --extra-drafter "--capture-layers 0,1"
# chat data is refused with the command that tokenizes it (dflash-data skipped every line,
# "input_ids missing", naming no way out); .JSONL in upper case is JSONL too (it was opened as a
# shard: "bad magic"), and JSON lines under another name are refused saying so
printf '%s\n' '{"messages": [{"role": "user", "content": "hi"}]}' > "$WORK/chat.jsonl"
printf '%s\n' '{"conversations": [{"from": "human", "value": "hi"}]}' > "$WORK/share.jsonl"
printf '%s\n' '{"prompt": "hi", "response": "yo"}' > "$WORK/pr.jsonl"
printf '%s\n' '{"input_ids": [1, 2], "loss_mask": [0, 1]}' > "$WORK/tok.JSONL"
cp "$WORK/tok.JSONL" "$WORK/tok.json"
# the command cuts at the token budget (chat_to_jsonl.py --max-len keeps a conversation's first
# tokens and their mask; without it dflash-data left every longer one out whole)
expect "train --data chat" 2 "^  python3 $SRC/scripts/chat_to_jsonl.py --tokenizer $WORK/m --in \
$WORK/chat.jsonl --out $WORK/chat.tokens.jsonl --max-len 3072$" "${T[@]}" --data "$WORK/chat.jsonl"
expect "train --data chat --token-budget 512" 2 "^  python3 .*chat_to_jsonl.py .* --max-len 512$" \
    "${T[@]}" --data "$WORK/chat.jsonl" --token-budget 512
# a JSON array: "rename it" (as .json) then "is a JSON array" (as .jsonl, from dflash-data) led
# nowhere; the python3 command printed converts it, and its output is taken as JSONL
printf '[\n  {"input_ids": [1, 2],\n   "loss_mask": [0, 1]},\n  {"input_ids": [3], "loss_mask": [1]}\n]\n' \
    > "$WORK/arr.json"
cp "$WORK/arr.json" "$WORK/arr2.jsonl"
expect "train --data array.jsonl" 2 "is a JSON array, not JSONL" "${T[@]}" --data "$WORK/arr2.jsonl"
expect "train --data array.json" 2 "^  python3 -c .* < $WORK/arr.json > $WORK/arr.lines.jsonl$" \
    "${T[@]}" --data "$WORK/arr.json"
(cd "$WORK/cwd" && bash -c "$(sed -n 's/^  python3 -c/python3 -c/p' "$WORK/out")")
if [ "$(cat "$WORK/arr.lines.jsonl" 2>/dev/null)" != '{"input_ids": [1, 2], "loss_mask": [0, 1]}
{"input_ids": [3], "loss_mask": [1]}' ]; then
    echo "FAIL train --data array.json: the printed conversion did not write the JSONL" >&2
    failed=1
fi
expect "train --data array.lines.jsonl" 99 "stand-in cmake ran" "${T[@]}" \
    --data "$WORK/arr.lines.jsonl"
printf '[{"messages": [{"role": "user", "content": "hi"}]}]\n' > "$WORK/chats.json"
expect "train --data chat array" 2 "^  python3 .*chat_to_jsonl.py .* --in $WORK/chats.json --out \
$WORK/chats.tokens.jsonl --max-len 3072$" "${T[@]}" --data "$WORK/chats.json"
expect "train --data sharegpt" 2 "share.jsonl holds chat conversations" "${T[@]}" \
    --data "$WORK/share.jsonl"
expect "train --data prompt/response" 2 "write each pair as a conversation" "${T[@]}" \
    --data "$WORK/pr.jsonl"
expect "train --data tok.JSONL" 99 "stand-in cmake ran" "${T[@]}" --data "$WORK/tok.JSONL"
expect "train --data tok.json" 2 "looks like JSON, but only a name ending in .jsonl" "${T[@]}" \
    --data "$WORK/tok.json"
expect "test -R (no value)" 2 "-R needs a value" test -R
expect "gpu-parity (no binaries)" 2 "no bench-cuda_parity in build-gpu" gpu-parity
expect "gpu-parity x" 2 "DRAFTER_LAYERS must be a whole number" gpu-parity bin x

# gpu-carry's OUT (see the top): a copy of scripts/ in a tree with no ../shared/tools
mkdir -p "$WORK/carry/bin" "$WORK/carry/repo"
cp -r "$SRC/scripts" "$WORK/carry/repo/"
cat > "$WORK/carry/bin/cmake" <<'EOF'
#!/bin/sh
# configure (-B DIR): makes DIR; --build DIR: the binaries gpu-carry gathers, as stand-ins
prev=""
for a; do [ "$prev" = -B ] && mkdir -p "$a"; prev=$a; done
[ "$1" = --build ] || exit 0
mkdir -p "$2/bin"
for n in dflash-queue dflash-target; do printf '#!/bin/sh\n' > "$2/bin/$n"; chmod +x "$2/bin/$n"; done
EOF
printf '#!/bin/sh\nexit 0\n' > "$WORK/carry/bin/strip"
printf '#!/bin/sh\nexit 1\n' > "$WORK/carry/bin/libs-fail"
printf '#!/bin/sh\nmkdir -p "$1" && touch "$1/libzmq.so.5" "$1/libopenblas.so.0"\n' \
    > "$WORK/carry/bin/libs-ok"
# failing stand-ins, each in its own folder put first on PATH: strip and xz exit 3; rm refuses
# the old OUT moved aside (*.old)
mkdir -p "$WORK/carry/strip-fail" "$WORK/carry/xz-fail" "$WORK/carry/rm-fail"
printf '#!/bin/sh\nexit 3\n' > "$WORK/carry/strip-fail/strip"
printf '#!/bin/sh\nexit 3\n' > "$WORK/carry/xz-fail/xz"
printf '#!/bin/sh\nfor a; do case "$a" in *.old) exit 1 ;; esac; done\nexec %s "$@"\n' \
    "$(command -v rm)" > "$WORK/carry/rm-fail/rm"
chmod +x "$WORK/carry/bin"/* "$WORK/carry"/*-fail/*
# carry NAME STATUS PATTERN [VAR=VALUE...]: gpu-carry into cwd/out (which holds old/ before)
carry() {
    local name=$1 want=$2 pattern=$3
    shift 3
    rm -rf "$WORK/cwd/out" && mkdir -p "$WORK/cwd/out/old"
    (cd "$WORK/cwd" && env PATH="$WORK/carry/bin:$PATH" "$@" timeout 60 \
        bash "$WORK/carry/repo/scripts/gpu-carry" b out dflash-queue,dflash-target) \
        > "$WORK/out" 2>&1
    verdict "$name" "$want" "$pattern" $?
    leftover "$name" "${CARRY_LEFT:-}"
}
# leftover NAME [ALLOWED]: no temporary folder of gpu-carry (OUT.tmp.*, or the old .gpu-carry.*)
# in cwd but one matching the glob ALLOWED
leftover() {
    local f left=""
    for f in "$WORK/cwd"/*.tmp.* "$WORK/cwd"/.gpu-carry.*; do
        [ -e "$f" ] || continue
        # shellcheck disable=SC2053 # ALLOWED is a glob
        [ -n "${2:-}" ] && [[ "$f" == $2 ]] && continue
        left+=" ${f##*/}"
    done
    [ -z "$left" ] || { echo "FAIL $1: temporary folders left:$left" >&2; failed=1; }
}
gone() { [ ! -e "$WORK/cwd/out/old" ] || { echo "FAIL $1: the old OUT was not replaced" >&2; failed=1; }; }
kept() {
    if [ ! -e "$WORK/cwd/out/old" ] || [ -e "$WORK/cwd/out/dflash-queue" ]; then
        echo "FAIL $1: OUT was touched" >&2
        failed=1
    fi
}
carry "gpu-carry DEVICE_LIBS missing" 2 "DEVICE_LIBS=/nonexistent is not an executable" \
    DEVICE_LIBS=/nonexistent
kept "gpu-carry DEVICE_LIBS missing"
carry "gpu-carry DEVICE_LIBS failing" 1 "failed; out left as it was" \
    DEVICE_LIBS="$WORK/carry/bin/libs-fail"
kept "gpu-carry DEVICE_LIBS failing"
carry "gpu-carry strip failing" 1 "stripping .* failed; out left as it was" \
    PATH="$WORK/carry/strip-fail:$WORK/carry/bin:$PATH"
kept "gpu-carry strip failing"
carry "gpu-carry xz failing" 1 "xz of libopenblas.so.0 failed; out left as it was" \
    PATH="$WORK/carry/xz-fail:$WORK/carry/bin:$PATH" GPU_CARRY_XZ=1 \
    DEVICE_LIBS="$WORK/carry/bin/libs-ok"
kept "gpu-carry xz failing"
carry "gpu-carry DEVICE_LIBS" 0 "gpu-carry: 3 entries in out" DEVICE_LIBS="$WORK/carry/bin/libs-ok"
gone "gpu-carry DEVICE_LIBS"
[ -f "$WORK/cwd/out/devlibs/libzmq.so.5" ] && [ -x "$WORK/cwd/out/dflash-target" ] ||
    { echo "FAIL gpu-carry DEVICE_LIBS: binaries or devlibs missing in OUT" >&2; failed=1; }
carry "gpu-carry without device-libs" 0 "WARNING: no device-libs tool at .*shared/tools/device-libs"
gone "gpu-carry without device-libs"
[ ! -e "$WORK/cwd/out/devlibs" ] && [ -x "$WORK/cwd/out/dflash-queue" ] ||
    { echo "FAIL gpu-carry without device-libs: OUT is not the binaries alone" >&2; failed=1; }
# the old OUT cannot be removed after the swap: a warning, the new OUT in place, the old one kept
# aside (and only that left behind)
CARRY_LEFT="$WORK/cwd/out.tmp.*.old" carry "gpu-carry old OUT not removable" 0 \
    "WARNING: the old out, moved to out\.tmp\..*\.old, could not" \
    PATH="$WORK/carry/rm-fail:$WORK/carry/bin:$PATH"
gone "gpu-carry old OUT not removable"
[ -x "$WORK/cwd/out/dflash-queue" ] && [ -d "$WORK/cwd"/out.tmp.*.old/old ] ||
    { echo "FAIL gpu-carry old OUT not removable: the new OUT or the old one aside missing" >&2
      failed=1; }
rm -rf "$WORK/cwd"/out.tmp.*.old
# the default OUT's temporary folder (build-gpu.tmp.*) is ignored by git, where this is a checkout
if git -C "$SRC" rev-parse --git-dir > /dev/null 2>&1 &&
    ! git -C "$SRC" check-ignore -q --no-index build-gpu.tmp.x1Y2z3/bin; then
    echo "FAIL gpu-carry: the default OUT's temporary folder build-gpu.tmp.* is not gitignored" >&2
    failed=1
fi
exit $failed
