#!/usr/bin/env bash
# norm_ncu_gpu.sh BIN: ncu of the pipelined RMSNorm kernels inside one-layer 3072/512 drafter
# steps (clocks not held): the backward with dres (the post-attention norm), two launches of
# the second step, and the forward's four launches of the second step; details in the log.
bin=${1:-build-gpu}
log=${OUT:-.}/norm_ncu.log
out=${OUT:-.}
source "$(dirname "$0")/gpu_run.sh"
sec="--section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats \
--section SchedulerStats --section Occupancy --section LaunchStats"
run ncu_bwd 120 ncu --clock-control none --kernel-name-base mangled \
  -k regex:_Z18k_rmsnorm_bwd_pipeILb1 -s 2 -c 2 $sec -f -o "$out/rmsb" \
  "$bin/bench-drafter" 1 s3072_a512 0
ncu --import "$out/rmsb.ncu-rep" --page details >>"$log" 2>&1
run ncu_fwd 120 ncu --clock-control none -k regex:k_rmsnorm_fwd_pipe -s 4 -c 4 $sec -f \
  -o "$out/rmsf" "$bin/bench-drafter" 1 s3072_a512 0
ncu --import "$out/rmsf.ncu-rep" --page details >>"$log" 2>&1
