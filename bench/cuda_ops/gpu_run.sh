# gpu_run.sh: what the device scripts of this folder share; each sources it after setting bin
# (the carried binaries, with devlibs/), log (its log file) and, optionally, budget (seconds)
# and out (the folder for ncu_one's reports; default $OUT, else .).
# It sets the loader and OpenBLAS environment (gpu_env of scripts/gpu-lib.sh), empties the log,
# writes the binaries' commit (from $bin/COMMIT, when there) and the GPU to it and the terminal,
# names the binaries P
# (bench-cuda_parity), B (bench-cuda_ops) and BASE ($bin/base/bench-cuda_ops: the binary to
# compare with, where a script carries one) and defines
#   run NAME TIMEOUT [VAR=value ...] CMD ...
# which runs CMD under `timeout` with the assignments, appending "=== NAME: CMD", its output and
# "rc STATUS (N s)" (seconds since the start) to the log; a step whose timeout would end past
# $budget seconds is skipped ("=== NAME: skipped (budget)"). No budget: every step runs. And
#   ncu_one NAME KERNEL_REGEX SKIP CMD ...
# which profiles one launch of the kernel (after SKIP others) under ncu, clocks not held (speed
# of light, warp states, schedulers, compute and memory workload, source counters) into
# $out/NAME.ncu-rep, appends its details to the log and writes its per-SASS-instruction csv to
# $out/NAME_sass.csv.
#   bwd_fallback_parity
# which runs `bench-cuda_parity attn` on each fallback of the block backward (wgmma_seq, mma,
# cp.async and per-column copies, hits pieces built in list rounds, blocks pieces), one query
# block per piece (SPLIT=1) where the default split would leave a path untaken.
#   sample_board CSV MS FIELDS / stop_board
# which samples FIELDS (nvidia-smi --query-gpu names) every MS ms into CSV in the background (its
# pid in smi) for the board the benches run on, CUDA device 0, each row labelled with its
# nvidia-smi index and PCI bus id: with CUDA_DEVICE_ORDER=PCI_BUS_ID (set here unless given)
# that board is nvidia-smi's first of CUDA_VISIBLE_DEVICES (an index or a UUID), GPU 0 when it
# is unset; SMI_GPU names another.
out=${out:-${OUT:-.}}
export CUDA_DEVICE_ORDER=${CUDA_DEVICE_ORDER:-PCI_BUS_ID}
SMI_GPU=${SMI_GPU:-$(v=${CUDA_VISIBLE_DEVICES:-0}; echo "${v%%,*}")}
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/gpu-lib.sh"
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/proc-lib.sh" # sample_board's sampler
gpu_env "$bin"
export LD_LIBRARY_PATH="$GPU_DEVLIBS:$LD_LIBRARY_PATH"
: >"$log"
[ -f "$bin/COMMIT" ] && echo "binaries of commit $(cat "$bin/COMMIT")" | tee -a "$log"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader |
  tee -a "$log"
P="$bin/bench-cuda_parity"
B="$bin/bench-cuda_ops"
BASE="$bin/base/bench-cuda_ops"
t0=$(date +%s)
run() {
  local name=$1 to=$2; shift 2
  if [ -n "${budget:-}" ] && [ $(($(date +%s) - t0 + to)) -gt "$budget" ]; then
    echo "=== $name: skipped (budget)" >>"$log"
    return
  fi
  echo "=== $name: $*" >>"$log"
  timeout "$to" env "$@" >>"$log" 2>&1
  echo "rc $? ($(($(date +%s) - t0)) s)" >>"$log"
}
ncu_one() {
  local name=$1 kernel=$2 skip=$3; shift 3
  run "ncu_$name" 90 ncu --clock-control none -k "regex:$kernel" -s "$skip" -c 1 \
    --section SpeedOfLight --section WarpStateStats --section SchedulerStats \
    --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
    --section SourceCounters -f -o "$out/$name" "$@"
  [ -f "$out/$name.ncu-rep" ] || return 0
  ncu --import "$out/$name.ncu-rep" --page details >>"$log" 2>&1
  ncu --import "$out/$name.ncu-rep" --page source --print-source sass --csv \
    >"$out/${name}_sass.csv" 2>&1
}
sample_board() {
  local csv=$1 ms=$2 fields=$3
  nvidia-smi -i "$SMI_GPU" --query-gpu="index,pci.bus_id,$fields" --format=csv -lms "$ms" \
    >"$csv" 2>&1 &
  smi=$!
  proc_track "$smi"
}
# stop_board: ends sample_board's sampler, if it still runs (scripts/proc-lib.sh: its pid may be
# another process's by then, one that failed at once minutes before)
stop_board() {
  proc_signal TERM "$smi" || true
}
bwd_fallback_parity() {
  local s1="DFLASH_CUDA_ATTN_SPLIT=1"
  run par_seq_split1 30 DFLASH_CUDA_ATTN_BWD=wgmma_seq $s1 "$P" attn
  run par_mma_split1 30 DFLASH_CUDA_ATTN_BWD=mma $s1 "$P" attn
  run par_notma_split1 30 DFLASH_CUDA_ATTN_TMA=0 $s1 "$P" attn
  run par_tma1_split1 30 DFLASH_CUDA_ATTN_TMA=1 $s1 "$P" attn
  run par_hits_round3 30 DFLASH_CUDA_ATTN_FUSED_PIECES=hits DFLASH_CUDA_ATTN_LIST_ROUND=3 \
    "$P" attn
  run par_blocks_split1 30 DFLASH_CUDA_ATTN_FUSED_PIECES=blocks $s1 "$P" attn
}
