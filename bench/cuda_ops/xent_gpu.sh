#!/usr/bin/env bash
# xent_gpu.sh: one device call's worth of checks and timings for the one-read softmax of
# lm_head_xent (ops_cuda.cu k_xent_rows_smem: DFLASH_CUDA_XENT=smem, 1024 threads, or smem512,
# 512 threads, against the default two-read k_xent_rows). One binary: the variable picks the
# kernel. Usage on the GPU machine:
#   bench/cuda_ops/xent_gpu.sh BIN_DIR [BUDGET_S] [STEPS]
# BIN_DIR holds bench-cuda_parity, bench-cuda_ops, bench-drafter, devlibs/ and COMMIT. STEPS
# (default "parity memcheck ops ab memcheck512 ab512 racecheck") in order:
#   parity      `bench-cuda_parity loss` with the default kernel twice (DFLASH_CUDA_XENT unset,
#               then =rows: the control that two runs hash alike), smem512 and smem; then the
#               hashes of the cuda side's dh, correct and dlogits per case compared: smem512
#               should equal rows in every case, smem may differ (its sum-exp adds in another
#               order)
#   memcheck    compute-sanitizer memcheck of `bench-cuda_parity loss` with smem
#   ops         `bench-cuda_ops 0 xent` (lm_head_xent at Q 8192, V 151936, D 4096 and D 64: at
#               D 64 the products are nearly free, so that row times the softmax) rows, smem,
#               smem512, twice
#   ab          `bench-drafter 5 s3072_a512 8` unset, smem, unset, smem (ms/step, op profile)
#   memcheck512 the memcheck with smem512
#   ab512       bench-drafter with smem512, twice
#   racecheck   compute-sanitizer racecheck (shared memory) of `bench-cuda_parity loss`, smem
# A step whose timeout would end past BUDGET_S (default 570) is skipped. Log: $OUT/xent.log; a
# summary comes last.
set -uo pipefail
bin=${1:?BIN_DIR}
budget=${2:-570}
steps=${3:-parity memcheck ops ab memcheck512 ab512 racecheck}
out=${OUT:-.}
log=$out/xent.log
[ -f "$bin/devlibs/libopenblas.so.0.xz" ] && xz -d -f "$bin/devlibs/libopenblas.so.0.xz"
. "$(dirname "$0")/gpu_run.sh"
CS=compute-sanitizer
command -v $CS >/dev/null || CS=/usr/local/cuda/bin/compute-sanitizer
D="$bin/bench-drafter"

# the hash lines of one parity run's section: case, kernel, hash
hashes() {
  awk -v n="=== $1:" 'index($0, n) == 1 {p = 1; next} /^=== / {p = 0}
    p && / hash / {print $2, $3, $6, $NF}' "$log"
}
# compares two parity runs' hashes case by case
same() {
  local a b
  a=$(hashes "$1" | awk '{print $1, $2, $4}')
  b=$(hashes "$2" | awk '{print $1, $2, $4}')
  if [ -z "$a" ] || [ -z "$b" ]; then
    echo "HASH $1 vs $2: missing (did both runs finish?)"
  elif [ "$a" = "$b" ]; then
    echo "HASH $1 vs $2: dh, correct, dlogits bit for bit alike in all $(echo "$a" | wc -l) cases"
  else
    echo "HASH $1 vs $2: differ in: $(diff <(echo "$a") <(echo "$b") | grep '^>' | cut -c3- |
      awk '{print $1, $2}' | tr '\n' ';')"
  fi | tee -a "$log"
}

for step in $steps; do
  case $step in
  parity)
    run par_rows 60 "$P" loss
    run par_rows2 60 DFLASH_CUDA_XENT=rows "$P" loss
    run par_smem512 60 DFLASH_CUDA_XENT=smem512 "$P" loss
    run par_smem 60 DFLASH_CUDA_XENT=smem "$P" loss
    same par_rows par_rows2
    same par_rows par_smem512
    same par_rows par_smem
    ;;
  memcheck) run memcheck 150 DFLASH_CUDA_XENT=smem $CS --tool memcheck "$P" loss ;;
  memcheck512) run memcheck512 150 DFLASH_CUDA_XENT=smem512 $CS --tool memcheck "$P" loss ;;
  racecheck) run racecheck 200 DFLASH_CUDA_XENT=smem $CS --tool racecheck "$P" loss ;;
  ops)
    for i in 1 2; do
      for k in rows smem smem512; do
        run "ops_${k}_$i" 40 DFLASH_CUDA_XENT=$k "$bin/bench-cuda_ops" 0 xent
      done
    done
    ;;
  ab)
    for i in 1 2; do
      run "rows$i" 60 "$D" 5 s3072_a512 8
      run "smem$i" 60 DFLASH_CUDA_XENT=smem "$D" 5 s3072_a512 8
    done
    ;;
  ab512)
    for i in 1 2; do run "smem512_$i" 60 DFLASH_CUDA_XENT=smem512 "$D" 5 s3072_a512 8; done ;;
  esac
done
grep -E "^binaries|^=== |^rc |^HASH|softmax|checks failed|FAIL|ERROR SUMMARY|RACECHECK SUMMARY|\
lm_head_xent|ms/step|RESULT" "$log" | grep -v " PASS$" | head -150
