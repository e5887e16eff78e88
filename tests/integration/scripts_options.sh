#!/usr/bin/env bash
# scripts_options: the command line of scripts/{train,test,install-deps,gpu-carry,gpu-check,
# gpu-bench,gpu-parity}: -h and --help print the usage (exit 0), an unknown option is refused (exit 2)
# before the script does anything; scripts/train refuses an option without its value ("$2:
# unbound variable" under set -u) and a bad number (--steps 0 made its final check pass always)
# before it builds or starts a daemon, and its help says which --data names are JSONL.
# cmake, apt-get, dpkg-query, nvidia-smi and nvcc are stand-ins that exit 99, in a scratch
# working directory: a script that got past its arguments stops at once.
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

# expect NAME STATUS PATTERN SCRIPT ARGS...: the script exits STATUS, its output matches PATTERN
expect() {
    local name=$1 want=$2 pattern=$3 got
    shift 3
    (cd "$WORK/cwd" && timeout 60 bash "$SRC/scripts/$@") > "$WORK/out" 2>&1
    got=$?
    if [ "$got" != "$want" ] || ! grep -qE -- "$pattern" "$WORK/out"; then
        echo "FAIL $name: exit $got (want $want), output should match '$pattern':" >&2
        head -n 5 "$WORK/out" >&2
        failed=1
    else
        echo "ok   $name"
    fi
}

for s in train test install-deps gpu-carry gpu-check gpu-bench gpu-parity; do
    expect "$s -h" 0 "^(scripts/)?$s: " "$s" -h
    expect "$s --help" 0 "^(scripts/)?$s: " "$s" --help
    expect "$s --bogus" 2 "unknown option --bogus" "$s" --bogus
done
T=(train --model "$WORK/m" --data "$WORK/d.jsonl" --out "$WORK/o" --build "$WORK/b")
expect "train --steps (no value)" 2 "--steps needs a value" "${T[@]}" --steps
expect "train --steps 0" 2 "--steps must be a whole number >= 1" "${T[@]}" --steps 0
expect "train --epochs x" 2 "--epochs must be a whole number" "${T[@]}" --epochs x
expect "train --help on --data" 0 "ending in .jsonl is JSONL" train --help
expect "train --help on training longer" 0 "--init-from OLD_OUT" train --help
expect "train --init-from (no value)" 2 "--init-from needs a value" "${T[@]}" --init-from
expect "test -R (no value)" 2 "-R needs a value" test -R
expect "gpu-parity (no binaries)" 2 "no bench-cuda_parity in build-gpu" gpu-parity
expect "gpu-parity x" 2 "DRAFTER_LAYERS must be a whole number" gpu-parity bin x
exit $failed
