#!/usr/bin/env bash
# nocuda_build: the build a machine without the CUDA toolkit makes (-DDFLASH_CUDA=OFF: the cpu
# backend and POSIX shared memory only), which is what README's first command builds on a fresh
# machine without nvcc. CI's machine has nvcc, so its builds never compiled this variant (the
# Docker image built from a Debian base does, where a Docker daemon runs). Configures and builds
# the programs scripts/demo runs in BUILD_DIR/nocuda, then runs cli_checks.sh on them (its "build
# without CUDA" cases: --backend cuda refused, exit 2) and scripts/demo --quick (the main job:
# loss falls, held-out tau rises).
#   nocuda_build.sh BUILD_DIR SOURCE_ROOT
set -euo pipefail
BUILD=$1/nocuda
SRC=$2
mkdir -p "$BUILD"
source "$SRC/scripts/build-lib.sh"
echo "configuring $BUILD (-DDFLASH_CUDA=OFF)"
cmake_configure "$BUILD" -DCMAKE_BUILD_TYPE=Release -DDFLASH_CUDA=OFF > "$BUILD/configure.log" 2>&1 ||
    { tail -n 30 "$BUILD/configure.log" >&2; exit 1; }
grep -q "dflash: CUDA parts OFF" "$BUILD/configure.log" ||
    { echo "FAIL: the configure did not leave the CUDA parts out:" >&2
      grep "dflash:" "$BUILD/configure.log" >&2; exit 1; }
echo "building the daemons and tools without CUDA"
cmake_build_quiet "$BUILD" -j "$(nproc)" --target dflash-queue dflash-target dflash-drafter \
    dflash-ctl dflash-mkmodel dflash-gen dflash-data
if nm -D --undefined-only "$BUILD/services/drafter/dflash-drafter" | grep -q "cuda\|cublas"; then
    echo "FAIL: dflash-drafter of the build without CUDA links CUDA symbols" >&2
    exit 1
fi
bash "$SRC/tests/integration/cli_checks.sh" "$BUILD" OFF
bash "$SRC/scripts/demo" --quick --build "$BUILD" --no-build --clean
echo "ok: the build without CUDA: cli_checks and scripts/demo --quick passed"
