# shellcheck shell=bash
# build-lib.sh: how the build-machine scripts (test, demo, train, gpu-carry) configure a build
# directory, sourced by each:
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
