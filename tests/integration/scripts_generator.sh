#!/usr/bin/env bash
# scripts_generator: scripts/train and scripts/test share build/, so they must configure it with
# the same CMake generator. scripts/train used the default (Unix Makefiles) and scripts/test
# Ninja: after scripts/train, scripts/test failed with "Does not match the generator used
# previously". Both (and scripts/demo, scripts/gpu-carry) now configure through
# scripts/build-lib.sh. Runs the real scripts and the real cmake configure on a copy of the tree (the
# sources linked, the scripts copied); a cmake wrapper stops at the build step (exit 3), so
# nothing is compiled. Also: a build/ made by hand with Unix Makefiles keeps working with both.
#   scripts_generator.sh SOURCE_ROOT
set -euo pipefail
SRC=$1
CMAKE=$(command -v cmake)
command -v ninja > /dev/null || { echo "skipped: ninja not installed"; exit 77; }
WORK=$(mktemp -d "${TMPDIR:-/tmp}/dflash-test-gen.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
ROOT=$WORK/root
mkdir -p "$ROOT/scripts" "$WORK/bin" "$WORK/model"
for f in "$SRC"/*; do
    case $(basename "$f") in build* | scripts) ;; *) ln -s "$f" "$ROOT/" ;; esac
done
cp "$SRC"/scripts/* "$ROOT/scripts/" # every script and the libraries they source
cat > "$WORK/bin/cmake" << EOF
#!/usr/bin/env bash
if [ "\$1" = --build ]; then echo "build \$2" >> "$WORK/builds"; exit 3; fi
exec "$CMAKE" "\$@"
EOF
chmod +x "$WORK/bin/cmake"
echo '{}' > "$WORK/model/config.json"
echo '{"input_ids": [1], "loss_mask": [1]}' > "$WORK/data.jsonl"
export PATH=$WORK/bin:$PATH
unset CMAKE_GENERATOR
unset SANITIZE # scripts/test's build/ (SANITIZE=1, as in CI's second pass, uses build-asan/)

failed=0
# run NAME WANT SCRIPT ARGS...: the script must get past its configure to the build step (exit 3)
# with build/ configured for the generator WANT
run() {
    local name=$1 want=$2 rc=0 gen
    shift 2
    : > "$WORK/builds"
    (cd "$ROOT" && "$@") > "$WORK/$name.log" 2>&1 || rc=$?
    gen=$(sed -n 's/^CMAKE_GENERATOR:INTERNAL=//p' "$ROOT/build/CMakeCache.txt" 2>/dev/null ||
        echo "no build/CMakeCache.txt")
    if [ "$rc" = 3 ] && [ -s "$WORK/builds" ] && [ "$gen" = "$want" ]; then
        echo "ok: $name configured $gen"
    elif [ "$rc" = 3 ] && [ -s "$WORK/builds" ]; then
        echo "FAIL: $name configured '$gen', want '$want'"
        failed=$((failed + 1))
    else
        echo "FAIL: $name: exit $rc before its build step:"
        tail -n 5 "$WORK/$name.log"
        failed=$((failed + 1))
    fi
}
train() {
    run "$1" "$2" bash scripts/train --model "$WORK/model" --data "$WORK/data.jsonl" \
        --out "$WORK/out" --build build
}

# a new build/ from scripts/train, then scripts/test; and the other way round
train "train on a new build dir" Ninja
run "test after train" Ninja bash scripts/test
rm -rf "$ROOT/build"
run "test on a new build dir" Ninja bash scripts/test
train "train after test" Ninja
# a build/ made by hand with Unix Makefiles
rm -rf "$ROOT/build"
"$CMAKE" -S "$ROOT" -B "$ROOT/build" -G "Unix Makefiles" -DCMAKE_BUILD_TYPE=Release > /dev/null
run "test on a Makefiles build dir" "Unix Makefiles" bash scripts/test
train "train on a Makefiles build dir" "Unix Makefiles"
[ "$failed" = 0 ] || exit 1
echo "ok: scripts/train and scripts/test share build/"
