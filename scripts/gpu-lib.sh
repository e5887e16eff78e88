# shellcheck shell=bash
# gpu-lib.sh: what the scripts run on the GPU machine share (sourced by scripts/gpu-check,
# scripts/gpu-bench, scripts/gpu-parity and bench/cuda_ops/gpu_run.sh). The binaries come from
# the build machine (scripts/gpu-carry: one flat folder of stripped binaries plus devlibs/, the
# shared libraries a bare CUDA machine lacks), so each script first needs
#   gpu_env BIN_DIR
# which unpacks devlibs/libopenblas.so.0.xz where the carry compressed it (the device tool's carry
# limit), appends the CUDA toolkit's libraries (or cuBLASLt 13 from the pip wheels, where the
# toolkit's is not on the loader path) to LD_LIBRARY_PATH, exports OPENBLAS_CORETYPE and sets
# GPU_DEVLIBS; a script puts "$GPU_DEVLIBS" on LD_LIBRARY_PATH itself, for all its steps or for
# the binaries only (gpu-bench keeps it away from PyTorch). Then
#   gpu_tree BIN_DIR
# prints a build-tree layout of BIN_DIR (services/queue/dflash-queue, tools/dflash-ctl, ... as
# CMake lays them out, which the test scripts expect): BIN_DIR itself when it is a build tree,
# else a temporary folder of links to the flat folder's binaries (the caller removes it). And
#   gpu_step NAME MAX_S CMD ...
# which runs CMD when GPU_STEPS (",a,b,": the names to run; empty: all) names it, cut off at
# MAX_S or at what is left of GPU_BUDGET seconds (since the script started; empty: no budget)
# less 5, its output in $GPU_OUT/NAME.log and its tail on the terminal, and adds
# "NAME(status)" to gpu_failed when it does not exit 0; gpu_summary prints the failures and
# returns non-zero when there were any, or when no step ran (STEPS named none of the script's).
gpu_failed=()
gpu_ran=0

gpu_env() {
  local bin=$1 extra=/usr/local/cuda/lib64 p l
  [ -f "$bin/devlibs/libopenblas.so.0.xz" ] && xz -d -f "$bin/devlibs/libopenblas.so.0.xz"
  if ! ldconfig -p | grep -q libcublasLt.so.13 && [ ! -e /usr/local/cuda/lib64/libcublasLt.so.13 ]
  then
    for p in $(python3 -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null); do
      for l in "$p"/nvidia/cu13/lib "$p"/nvidia/cublas/lib "$p"/nvidia/cuda_runtime/lib; do
        [ -d "$l" ] && extra="$extra:$l"
      done
    done
  fi
  export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$extra"
  export OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-Haswell}
  GPU_DEVLIBS=$(cd "$bin" && pwd)/devlibs
}

gpu_tree() {
  local bin tree n
  bin=$(cd "$1" && pwd)
  if [ -x "$bin/services/queue/dflash-queue" ]; then echo "$bin"; return; fi
  tree=$(mktemp -d /tmp/dflash-tree.XXXXXX)
  mkdir -p "$tree"/services/{queue,target,drafter} "$tree"/tools "$tree"/bench \
    "$tree"/tests/{integration,reference,gpu}
  for n in queue target drafter; do
    [ -e "$bin/dflash-$n" ] && ln -s "$bin/dflash-$n" "$tree/services/$n/"
  done
  for n in ctl mkmodel gen data; do
    [ -e "$bin/dflash-$n" ] && ln -s "$bin/dflash-$n" "$tree/tools/"
  done
  for n in "$bin"/bench-*; do [ -e "$n" ] && ln -s "$n" "$tree/bench/"; done
  [ -e "$bin/test_pool_cuda" ] && ln -s "$bin/test_pool_cuda" "$tree/tests/integration/"
  [ -e "$bin/test_dp_nccl" ] && ln -s "$bin/test_dp_nccl" "$tree/tests/gpu/"
  for n in target_reference dflash_logits; do
    [ -e "$bin/$n" ] && ln -s "$bin/$n" "$tree/tests/reference/"
  done
  [ -e "$bin/devlibs" ] && ln -s "$bin/devlibs" "$tree/"
  echo "$tree"
}

gpu_step() {
  local name=$1 t=$2 left t0 rc
  shift 2
  if [ -n "${GPU_STEPS:-}" ] && [ "${GPU_STEPS/,$name,/}" = "$GPU_STEPS" ]; then return 0; fi
  if [ -n "${GPU_BUDGET:-}" ]; then
    left=$((GPU_BUDGET - SECONDS - 5))
    [ "$t" -gt "$left" ] && t=$left
    if [ "$t" -lt 20 ]; then
      echo "== $name: skipped (no time left)"
      gpu_failed+=("$name(skipped)")
      return 0
    fi
  fi
  echo "== $name ($t s max): $*"
  gpu_ran=$((gpu_ran + 1))
  t0=$SECONDS
  timeout -k 5 "$t" "$@" > "$GPU_OUT/$name.log" 2>&1
  rc=$?
  grep -v "^\s*$" "$GPU_OUT/$name.log" | grep -v " INFO \| DEBUG " | tail -n 30
  echo "== $name: exit $rc after $((SECONDS - t0)) s"
  [ "$rc" -eq 0 ] || gpu_failed+=("$name($rc)")
}

gpu_summary() {
  if [ "$gpu_ran" -eq 0 ] && [ ${#gpu_failed[@]} -eq 0 ]; then
    echo "no step ran: STEPS (${GPU_STEPS:-}) names none of this script's steps"
    return 1
  fi
  echo "failed: ${gpu_failed[*]:-none}"
  [ ${#gpu_failed[@]} -eq 0 ]
}
