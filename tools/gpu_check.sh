#!/usr/bin/env bash
# Builds paraseq against a CUDA Kokkos install, runs the unit tests, then the full benchmark suite.
# It never builds Kokkos: pass the prefix of an existing CUDA-enabled install.
#
#   tools/gpu_check.sh KOKKOS_PREFIX OUT_DIR [CMAKE_PREFIX_PATH for GoogleTest / Google Benchmark]
#
# OUT_DIR receives build.log, ctest.log, ptxas.log (registers and spills per kernel) and the
# benchmark report gpu.json.
set -euo pipefail
kokkos=${1:?usage: tools/gpu_check.sh KOKKOS_PREFIX OUT_DIR [PREFIX_PATH]}
out=${2:?usage: tools/gpu_check.sh KOKKOS_PREFIX OUT_DIR [PREFIX_PATH]}
prefix_path=${3:-$kokkos}
repo=$(cd "$(dirname "$0")/.." && pwd)
build=${PARASEQ_GPU_BUILD:-$repo/build/gpu}
mkdir -p "$out"

cmake -S "$repo" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKokkos_ROOT="$kokkos" \
  -DCMAKE_PREFIX_PATH="$prefix_path" -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_CUDA_FLAGS="-Xptxas=-v" \
  ${PARASEQ_GPU_CMAKE_ARGS:-} >"$out/build.log" 2>&1
cmake --build "$build" -j "$(nproc)" >>"$out/build.log" 2>&1 || { tail -n 40 "$out/build.log"; exit 1; }
grep -E "ptxas info|bytes stack frame" "$out/build.log" >"$out/ptxas.log" || true

status=0
ctest --test-dir "$build" --output-on-failure -j 1 >"$out/ctest.log" 2>&1 || status=1
tail -n 5 "$out/ctest.log"
python3 "$repo/perf_tests/run_benchmarks.py" --build-dir "$build" --out "$out/gpu.json" ${PARASEQ_BENCH_ARGS:-} |
  tee "$out/bench.log"
exit $status
