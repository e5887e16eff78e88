# shellcheck shell=bash
# build-lib.sh: how the build-machine scripts (test, demo, train, gpu-carry) configure a build
# directory, sourced by each:
#   cmake_build_quiet DIR ARGS...
# runs `cmake --build DIR ARGS...` with its output in a temporary log, and on a failure prints
# the log's last 40 lines to stderr and returns the build's status (a build sent to /dev/null
# failed with no word: Ninja writes the compiler's errors to stdout).
#   cmake_configure DIR ARGS...
# runs `cmake -S <repository root> -B DIR ARGS...` with Ninja for a new DIR; an existing DIR keeps
# the generator it was made with (cmake refuses to switch: "Does not match the generator used
# previously"). Its output goes where the caller sends it.
cmake_configure() {
    local dir=$1
    shift
    local gen=()
    [ -f "$dir/CMakeCache.txt" ] || gen=(-G Ninja)
    cmake -S "$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)" -B "$dir" "${gen[@]}" "$@"
}

cmake_build_quiet() {
    local dir=$1 rc=0 log
    shift
    log=$(mktemp "${TMPDIR:-/tmp}/dflash-build.XXXXXX")
    cmake --build "$dir" "$@" > "$log" 2>&1 || rc=$?
    if [ "$rc" -ne 0 ]; then
        echo "the build in $dir failed (exit $rc); its last lines:" >&2
        tail -n 40 "$log" >&2
    fi
    rm -f "$log"
    return "$rc"
}
