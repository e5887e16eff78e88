#!/usr/bin/env bash
# bench_args: the GPU benches refuse arguments they would misread, before they touch a GPU (so
# this runs anywhere they are built): an unknown case or group, a budget under the longest
# sequence. Each must exit 2 with a message; before, bench-drafter ran no case and exited 0 on a
# list of cases, bench-cuda_ops ran every group on an unknown one, torch_drafter_bench.py ran
# any name as a 768-token case.
# Usage: bench_args.sh BENCH_DRAFTER BENCH_TARGET BENCH_CUDA_OPS TORCH_DRAFTER_BENCH_PY
set -u
drafter=$1 target=$2 ops=$3 torch_py=$4
failed=0
# expect2 DESCRIPTION PATTERN CMD...: CMD must exit 2 with PATTERN (grep -E) on stderr; the
# pattern tells a refusal from a bench that found no GPU (it exits 2 or 77 saying so).
expect2() {
  local what=$1 pat=$2 err rc
  shift 2
  err=$("$@" 2>&1 >/dev/null)
  rc=$?
  if [ "$rc" = 2 ] && grep -qE "$pat" <<<"$err"; then
    echo "ok: $what: ${err%%$'\n'*}"
  else
    echo "FAIL: $what: exit $rc (want 2 and /$pat/), stderr '${err}'"
    failed=$((failed + 1))
  fi
}
expect2 "bench-drafter, unknown case" "unknown case" "$drafter" 5 s3072_a51
expect2 "bench-drafter, a list with an unknown case" "unknown case \"bogus\"" \
  "$drafter" 5 s3072_a512,bogus
expect2 "bench-target, no model" "usage" "$target"
expect2 "bench-target, budget under 3072" "BUDGET must be" "$target" /nonexistent 1024
expect2 "bench-target, uniform length over 3072" "UNIFORM_LEN" \
  "$target" /nonexistent 16384 160 "" 4096
expect2 "bench-cuda_ops, unknown group" "usage" "$ops" 1 atn
expect2 "bench-cuda_ops, negative layers" "usage" "$ops" -1
if /usr/bin/python3 -c "import torch" 2>/dev/null; then
  expect2 "torch_drafter_bench.py, unknown case" "unknown case" \
    /usr/bin/python3 "$torch_py" --cases s768_a256,x
else
  echo "skip: torch_drafter_bench.py (no torch for /usr/bin/python3)"
fi
[ "$failed" = 0 ] && echo "bench_args: all refused" || echo "bench_args: $failed not refused"
exit $((failed > 0))
