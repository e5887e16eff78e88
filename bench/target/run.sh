#!/usr/bin/env bash
# bench/target/run.sh: ours (bench-target, cuda backend) and Hugging Face transformers
# (hf_target_bench.py) on the same Qwen3-8B-shaped random checkpoint and the same lengths, in one
# run; last line: the ratio ours / transformers in tokens/s.
# Usage (GPU machine, repository root):
#   bench/target/run.sh BIN_DIR [MODEL_DIR] [BUDGET] [N_SEQS] [UNIFORM_LEN]
#   UNIFORM_LEN > 0: every sequence that long instead of the mix of lengths (both sides).
#   BIN_DIR holds bench-target (and devlibs/); MODEL_DIR (default /tmp/dflash-qwen3-8b) is made
#   by bench/target/make_checkpoint.py when it has no config.json. Logs go to $OUT or ./.
set -uo pipefail
bin=${1:?usage: bench/target/run.sh BIN_DIR [MODEL_DIR] [BUDGET] [N_SEQS]}
model=${2:-/tmp/dflash-qwen3-8b}
budget=${3:-16384}
nseqs=${4:-160}
uniform=${5:-0}
out=${OUT:-.}
mkdir -p "$out"
here=$(cd "$(dirname "$0")" && pwd)
if [ ! -f "$model/config.json" ]; then
  t0=$SECONDS
  python3 "$here/make_checkpoint.py" "$model" || exit 1
  echo "checkpoint made in $((SECONDS - t0)) s"
fi
LD_LIBRARY_PATH="$bin/devlibs:${LD_LIBRARY_PATH:-}" OPENBLAS_CORETYPE=Haswell \
  "$bin/bench-target" "$model" "$budget" "$nseqs" "$out/target_lengths.txt" "$uniform" 2>&1 |
  tee "$out/bench_target.log"
rc=${PIPESTATUS[0]}
ours=$(grep -o 'RESULT tokens_per_s=[0-9.]*' "$out/bench_target.log" | cut -d= -f2)
peak=$(grep -o 'peak_tflops=[0-9.]*' "$out/bench_target.log" | cut -d= -f2)
[ "$rc" = 0 ] && [ -n "$ours" ] || { echo "bench-target failed (exit $rc) or gave no result"; exit 1; }
python3 "$here/hf_target_bench.py" "$model" "$out/target_lengths.txt" --budget "$budget" \
  --peak-tflops "$peak" 2>&1 | grep -v "Warning\|warn(" | tee "$out/hf_target.log"
rc=${PIPESTATUS[0]}
hf=$(grep -o 'RESULT tokens_per_s=[0-9.]*' "$out/hf_target.log" | cut -d= -f2)
[ "$rc" = 0 ] && [ -n "$hf" ] || { echo "transformers failed (exit $rc) or gave no result"; exit 1; }
python3 -c "print('ratio ours / transformers (tokens/s): %.2fx (%s / %s)' % ($ours / $hf, '$ours', '$hf'))"
