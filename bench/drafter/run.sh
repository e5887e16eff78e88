#!/usr/bin/env bash
# bench/drafter/run.sh: DFlash drafter training steps, ours (bench-drafter, cuda backend) and the
# PyTorch reference made fast (torch_drafter_bench.py: bf16 autocast, torch.compile,
# flex_attention), same shapes, same FLOP formula, same measured peak; last line the ratio of
# samples/s at 512 anchors x 3072 tokens.
# Usage (GPU machine, repository root): bench/drafter/run.sh BIN_DIR [CASES]
#   CASES: comma-separated (default all three); BENCH_STEPS (environment, default 40): timed
#   steps on each side. Ten steps read up to 6% fast at the board's power limit
#   (bench/RESULTS.md, "the drafter against PyTorch on the current code"); 40 is the window the
#   RESULTS ratios use.
# Exit 1 when either side exits non-zero or a requested case gets no ratio.
set -uo pipefail
bin=${1:?usage: bench/drafter/run.sh BIN_DIR [CASES]}
cases=${2:-s3072_a512,s768_a256,4xs768_a256}
steps=${BENCH_STEPS:-40}
out=${OUT:-.}
mkdir -p "$out"
here=$(cd "$(dirname "$0")" && pwd)
LD_LIBRARY_PATH="$bin/devlibs:${LD_LIBRARY_PATH:-}" OPENBLAS_CORETYPE=Haswell \
  "$bin/bench-drafter" 5 "$cases" 8 "$steps" 2>&1 | tee "$out/bench_drafter.log"
rc_ours=${PIPESTATUS[0]}
peak=$(grep -o 'RESULT peak_tflops=[0-9.]*' "$out/bench_drafter.log" | cut -d= -f2)
python3 "$here/torch_drafter_bench.py" --peak-tflops "${peak:-0}" --cases "$cases" \
  --steps "$steps" 2>&1 |
  grep -v "Warning\|warn(" | tee "$out/torch_drafter.log"
rc_torch=${PIPESTATUS[0]}
no_ratio=0
for c in $(echo "${cases//,/ }" | tr " " "\n" | tac); do  # the 3072/512 case last
  o=$(grep -o "RESULT case=$c steps_per_s=[0-9.]* samples_per_s=[0-9.]*" "$out/bench_drafter.log" | sed 's/.*samples_per_s=//')
  t=$(grep -o "RESULT case=$c steps_per_s=[0-9.]* samples_per_s=[0-9.]*" "$out/torch_drafter.log" | sed 's/.*samples_per_s=//')
  if [ -n "$o" ] && [ -n "$t" ]; then
    python3 -c "print('ratio ours / pytorch ($c, samples/s): %.2fx (%s / %s)' % ($o / $t, '$o', '$t'))" ||
      no_ratio=$((no_ratio + 1))
  else
    echo "ratio ours / pytorch ($c): n/a (ours '${o}', pytorch '${t}')"
    no_ratio=$((no_ratio + 1))
  fi
done
if [ "$rc_ours" -ne 0 ] || [ "$rc_torch" -ne 0 ] || [ "$no_ratio" -ne 0 ]; then
  echo "bench/drafter/run.sh: bench-drafter exit $rc_ours, PyTorch exit $rc_torch," \
    "$no_ratio case(s) without a ratio" >&2
  exit 1
fi
