#!/usr/bin/env bash
# scripts_test_skips: scripts/test lists the tests ctest skipped (exit 77, counted as passed by
# ctest) with their reasons, and under CI=true (or CI=1) fails the run when one outside its
# allow-list (the docker tests, only while DFLASH_TEST_BASE_IMAGE is unset) did not run: CI
# passed with every PyTorch oracle skipped.
# scripts/test runs from a copy of scripts/ in a scratch tree, with a cmake stand-in that does
# nothing and a ctest stand-in that writes the JUnit file given by $FAKE_JUNIT where
# --output-junit says and exits $FAKE_RC: what is checked is scripts/test's verdict alone.
#   scripts_test_skips.sh SOURCE_ROOT
set -uo pipefail
SRC=$1
WORK=$(mktemp -d "${TMPDIR:-/tmp}/dflash-test-skips.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$WORK/bin" "$WORK/tree/build/Testing"
cp -r "$SRC/scripts" "$WORK/tree/"
printf '#!/bin/sh\nexit 0\n' > "$WORK/bin/cmake"
cat > "$WORK/bin/ctest" <<'EOF'
#!/bin/sh
while [ $# -gt 0 ]; do
    [ "$1" = --output-junit ] && cp "$FAKE_JUNIT" "$2"
    shift
done
echo "100% tests passed"
exit "$FAKE_RC"
EOF
chmod +x "$WORK/bin/cmake" "$WORK/bin/ctest"
export PATH=$WORK/bin:$PATH
failed=0

# junit FILE CASE...: a JUnit file of ctest's form; CASE is NAME:STATUS:OUTPUT
junit() {
    local f=$1
    shift
    {
        echo '<?xml version="1.0" encoding="UTF-8"?>'
        echo "<testsuite name=\"(empty)\" tests=\"$#\">"
        for c in "$@"; do
            IFS=: read -r name status out <<< "$c"
            echo "<testcase name=\"$name\" classname=\"$name\" time=\"1\" status=\"$status\">"
            [ "$status" = notrun ] && echo '<skipped message="SKIP_RETURN_CODE=77"/>'
            echo "<system-out>first line"
            echo "$out</system-out></testcase>"
        done
        echo '</testsuite>'
    } > "$f"
}

# check NAME CI RC WANT PATTERN [ABSENT]: scripts/test with CI=$CI over $FAKE_JUNIT and a ctest
# exiting RC must exit WANT, its output matching PATTERN (and not ABSENT)
check() {
    local name=$1 ci=$2 rc=$3 want=$4 pattern=$5 absent=${6:-}
    local got=0
    env -u SANITIZE -u DFLASH_TEST_BASE_IMAGE ${BASE_IMAGE:+DFLASH_TEST_BASE_IMAGE=$BASE_IMAGE} \
        CI=$ci FAKE_RC=$rc "$WORK/tree/scripts/test" > "$WORK/out" 2>&1 || got=$?
    if [ "$got" != "$want" ] || ! grep -qE -- "$pattern" "$WORK/out" ||
        { [ -n "$absent" ] && grep -qE -- "$absent" "$WORK/out"; }; then
        echo "FAIL $name: exit $got (want $want), output should match '$pattern'" \
            "${absent:+and not '$absent'}:" >&2
        cat "$WORK/out" >&2
        failed=1
    else
        echo "ok   $name"
    fi
}

export FAKE_JUNIT=$WORK/junit.xml
junit "$FAKE_JUNIT" "test_rng:run:50 passed" \
    "compose_docker:notrun:no Docker daemon answers (docker info): skipped"
check "CI, only the allowed skip" true 0 0 \
    "compose_docker: no Docker daemon answers .*allowed under CI: no Docker daemon" FAIL
# a base image made ready (scripts/docker-up, as .ci/run does): the docker tests must run
BASE_IMAGE=dflash-base:test check "CI with a docker base image, compose_docker skipped" true 0 1 \
    "FAIL: under CI every test must run, and 1 did not: compose_docker"
# both docker tests (compose_docker_train too) skip as allowed without one, and fail with one
junit "$FAKE_JUNIT" "test_rng:run:50 passed" \
    "compose_docker:notrun:no Docker daemon answers (docker info): skipped" \
    "compose_docker_train:notrun:no Docker daemon answers (docker info): skipped"
check "CI, both docker tests skipped as allowed" true 0 0 \
    "compose_docker_train: no Docker daemon answers .*allowed under CI: no Docker daemon" FAIL
BASE_IMAGE=dflash-base:test check "CI with a docker base image, both skipped" true 0 1 \
    "FAIL: under CI every test must run, and 2 did not: compose_docker, compose_docker_train"

junit "$FAKE_JUNIT" "test_rng:run:50 passed" \
    "dflash_reference:notrun:SKIPPED: torch not installed" \
    "compose_docker:notrun:no Docker daemon answers (docker info): skipped" \
    "ops_reference:notrun:SKIPPED: torch not installed"
check "CI=true, oracles skipped" true 0 1 \
    "FAIL: under CI every test must run, and 2 did not: dflash_reference, ops_reference"
check "CI=true, the skip's reason" true 0 1 "dflash_reference: SKIPPED: torch not installed"
check "CI=1, oracles skipped" 1 0 1 "FAIL: under CI"
check "no CI: listed, not failed" "" 0 0 \
    "ops_reference: SKIPPED: torch not installed" FAIL
check "CI=false: listed, not failed" false 0 0 "dflash_reference: SKIPPED" FAIL
check "a failing ctest keeps its status" true 8 8 "dflash_reference: SKIPPED"

junit "$FAKE_JUNIT" "test_rng:run:50 passed"
check "CI, nothing skipped" true 0 0 "100% tests passed" "did not run"

exit $failed
