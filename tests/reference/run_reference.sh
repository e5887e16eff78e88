#!/bin/sh
# run_reference: one reference test = a PyTorch script that writes a dump, then a C program that
# compares our implementation with it.
#   run_reference.sh PYTHON SCRIPT PROGRAM DUMP
# Exits 77 (ctest SKIP_RETURN_CODE) when PYTHON cannot import torch; otherwise the status of the
# first failing step.
set -eu
py=$1 script=$2 prog=$3 dump=$4
if ! "$py" -c 'import torch' >/dev/null 2>&1; then
    echo "SKIPPED: torch not installed"
    exit 77
fi
rm -f "$dump"
cd "$(dirname "$script")"
"$py" "$script" "$dump"
"$prog" "$dump"
