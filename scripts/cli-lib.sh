# shellcheck shell=bash
# cli-lib.sh: the command line every script here shares (train, test, install-deps, gpu-carry,
# gpu-check, gpu-bench, gpu-parity), sourced by each before it parses its arguments. A script's usage is
# its leading comment block; a usage error exits 2, as the daemons' bad configuration does.
#   cli_usage             prints that block without the leading '# ' (for -h / --help)
#   cli_help_or_refuse A  for an argument A the script does not take: -h / --help prints the
#                         usage and exits 0, anything else is refused ("NAME: unknown option
#                         A (see --help)")
#   cli_value "$@"        prints the value that follows option $1; none (the script's last
#                         argument, which with `set -u` was "$2: unbound variable") is refused.
#                         Use it as VAR=$(cli_value "$@"): under `set -e` the refusal ends the
#                         script, else add `|| exit 2`
#   cli_int OPT V MIN     refuses V unless it is a whole decimal number >= MIN
#   cli_die MESSAGE       prints "NAME: MESSAGE" to stderr and exits 2
CLI_SELF=$(cd "$(dirname "$0")" && pwd)/$(basename "$0")
CLI_NAME=$(basename "$0")

cli_usage() {
    awk 'NR == 1 { next } /^#/ { sub(/^# ?/, ""); print; next } { exit }' "$CLI_SELF"
}

cli_die() {
    echo "$CLI_NAME: $1" >&2
    exit 2
}

cli_help_or_refuse() {
    case "$1" in
    -h | --help) cli_usage; exit 0 ;;
    -*) cli_die "unknown option $1 (see --help)" ;;
    *) cli_die "unexpected argument $1 (see --help)" ;;
    esac
}

cli_value() {
    [ $# -ge 2 ] || cli_die "$1 needs a value (see --help)"
    printf '%s\n' "$2"
}

cli_int() {
    [[ "$2" =~ ^-?[0-9]{1,18}$ ]] && [ "$2" -ge "$3" ] ||
        cli_die "$1 must be a whole number >= $3, not '$2'"
}
