#!/usr/bin/env bash
# proc_lib: scripts/proc-lib.sh, with which scripts/train and scripts/demo signal and watch their
# daemons. A tracked process is alive while it runs; one that ended is not, reaped or still a
# zombie (kill -0 says a zombie runs); a pid whose start time is no longer the one tracked (the
# kernel gave the pid to another process: forged here, as a reuse cannot be caused on demand) is
# neither alive nor signalled (scripts/train's stop sent SIGTERM to the pids of drafters it had
# reaped, and so to whatever process had the pid then); an untracked pid is never signalled.
#   proc_lib.sh SOURCE_ROOT
set -uo pipefail
SRC=$1
source "$SRC/scripts/proc-lib.sh"
failed=0
check() { # check NAME COMMAND...: the command must succeed
    local name=$1
    shift
    if "$@"; then echo "ok: $name"; else echo "FAIL: $name" >&2; failed=1; fi
}
[ "$PROC_HAVE_PROCFS" = 1 ] || { echo "no /proc: nothing to test"; exit 77; }

sleep 30 &
p=$!
proc_track "$p"
check "a running child is alive" proc_alive "$p"
check "an empty pid and an untracked one are not alive" eval '! proc_alive "" 1'
check "proc_alive of several: any of them" proc_alive "" 1 "$p"

# the pid given to another process: its start time differs from the one tracked
real=${PROC_START[$p]}
PROC_START[$p]=$((real + 1))
check "a pid with another start time is not alive" eval '! proc_alive "$p"'
check "nor signalled (status 1: nothing sent)" eval '! proc_signal TERM "$p"'
check "the process of that pid was left running" kill -0 "$p"
PROC_START[$p]=$real

check "proc_signal TERM sends to a tracked live one (status 0)" proc_signal TERM "$p"
wait "$p"
rc=$?
check "it ended by SIGTERM (status $rc)" test "$rc" = 143
check "one that ended and was reaped is not alive" eval '! proc_alive "$p"'
check "nor signalled" eval '! proc_signal KILL "$p"'

# a zombie: a child of a parent that does not reap it (kill -0 still succeeds on it)
fifo=$(mktemp -u "${TMPDIR:-/tmp}/dflash-test-proc.XXXXXX")
mkfifo "$fifo"
python3 -c '
import os, sys, time
pid = os.fork()
if pid == 0:
    os.read(os.open(sys.argv[1], os.O_RDONLY), 1)  # ends when the test writes to the fifo
    os._exit(0)
print(pid, flush=True)
time.sleep(20)  # never reaps it
' "$fifo" > "$fifo.pid" &
parent=$!
for _ in $(seq 100); do [ -s "$fifo.pid" ] && break; sleep 0.05; done
z=$(cat "$fifo.pid")
proc_track "$z"
check "the unreaped child is alive while it runs" proc_alive "$z"
echo x > "$fifo"
for _ in $(seq 100); do
    state=$(sed 's/.*) \(.\).*/\1/' "/proc/$z/stat" 2>/dev/null)
    [ "$state" = Z ] && break
    sleep 0.05
done
check "it became a zombie (state ${state:-gone})" test "$state" = Z
check "kill -0 still succeeds on the zombie" kill -0 "$z"
check "proc_alive does not count it" eval '! proc_alive "$z"'
kill "$parent" 2>/dev/null
wait "$parent" 2>/dev/null
rm -f "$fifo" "$fifo.pid"

# a process whose command name holds spaces and ')' (the stat line's second field): still parsed
odd=$(mktemp -d "${TMPDIR:-/tmp}/dflash-test-proc.XXXXXX")
cp "$(command -v sleep)" "$odd/x) y (z"
"$odd/x) y (z" 30 &
q=$!
# (tracked once it runs the program: right after the fork the stat line still names bash)
for _ in $(seq 100); do
    [ "$(cat "/proc/$q/comm" 2>/dev/null)" != "x) y (z" ] || break
    sleep 0.05
done
proc_track "$q"
comm=$(cat "/proc/$q/comm")
check "it runs as 'x) y (z' (comm '$comm')" test "$comm" = "x) y (z"
want=$(sed 's/.*) //' "/proc/$q/stat" | cut -d' ' -f20)
check "the start time of '$comm' (${PROC_START[$q]}, want $want)" \
    test -n "$want" -a "${PROC_START[$q]}" = "$want"
check "and it is alive" proc_alive "$q"
proc_signal KILL "$q"
wait "$q" 2>/dev/null
rm -rf "$odd"
[ "$failed" = 0 ] && echo "proc_lib: all passed"
exit "$failed"
