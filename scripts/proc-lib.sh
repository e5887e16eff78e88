# shellcheck shell=bash
# proc-lib.sh: the background processes a script started, named for good (sourced by
# scripts/train, scripts/demo and the shell tests that start daemons). A bare pid names a process
# only until it is reaped, and bash reaps a child that ended at once, without a `wait`: the kernel
# then gives that pid to a later process (pids wrap at /proc/sys/kernel/pid_max, 32768 by
# default: minutes on a machine running a test suite), so a `kill PID` or `kill -0 PID` after the
# process ended may signal or see an unrelated one (scripts/train's stop sent SIGTERM to the pids
# of drafters it had already reaped). Each pid is kept with its start time (/proc/PID/stat, field
# 22) and used only while the process of that pid has it. Without /proc (not Linux) the bare
# pid is used, as before.
#   proc_track PID          records PID's start time: call it right after `cmd &` (proc_track $!)
#   proc_alive PID...       whether any of them is still the process tracked, not ended (a
#                           zombie is ended); an untracked or empty PID is not alive
#   proc_signal SIG PID...  sends SIG (TERM, KILL, INT, ...) to those of them proc_alive finds;
#                           status 0 when it signalled any
declare -gA PROC_START=()
PROC_HAVE_PROCFS=0
if [ -r /proc/self/stat ]; then PROC_HAVE_PROCFS=1; fi # (a last command failing: source fails)

# _proc_start_of PID VAR: VAR <- PID's start time ("" when no process has PID or it has ended)
_proc_start_of() {
    local -n _proc_out=$2
    local stat
    local -a fields
    _proc_out=""
    { IFS= read -r stat < "/proc/$1/stat"; } 2>/dev/null || return 0
    # "PID (COMM) STATE ...": COMM may hold spaces and ')', the fields after its last ')' do not
    read -ra fields <<< "${stat##*) }"
    [ "${fields[0]:-}" != Z ] && [ "${fields[0]:-}" != X ] || return 0
    _proc_out=${fields[19]:-}
}

proc_track() {
    local start=tracked
    [ "$PROC_HAVE_PROCFS" = 0 ] || _proc_start_of "$1" start
    PROC_START[$1]=$start
}

proc_alive() {
    local p start
    for p in "$@"; do
        [ -n "$p" ] && [ -n "${PROC_START[$p]:-}" ] || continue
        if [ "$PROC_HAVE_PROCFS" = 0 ]; then
            kill -0 "$p" 2>/dev/null && return 0
            continue
        fi
        _proc_start_of "$p" start
        [ "$start" = "${PROC_START[$p]}" ] && return 0
    done
    return 1
}

proc_signal() {
    local sig=$1 p sent=1
    shift
    for p in "$@"; do
        proc_alive "$p" && kill -"$sig" "$p" 2>/dev/null && sent=0
    done
    return "$sent"
}
