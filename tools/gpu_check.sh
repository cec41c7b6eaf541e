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
# The targets of docs/performance.md by default, each benchmark in a process of its own stopped after
# 60 s (reported): the whole grid includes forced-sequential scans of one channel and n = 32
# gradients that take seconds per call on a GPU, and some cases stalled there (performance.md).
targets='ceiling_|scan_diagonal_forward/log2BN:(0/log2T:26|8/log2T:18|14/log2T:12|20/log2T:6)/sequential:0'
targets+='|scan_diagonal_reverse|gru_forward(_backward)?/B:16/T:4096/H:1024/'
targets+='|(rk4_fixed|dopri5_adaptive)/log2N:20/n:2/steps:1000/gradient:[01]/stepped:0'
python3 "$repo/perf_tests/run_benchmarks.py" --build-dir "$build" --out "$out/gpu.json" \
  ${PARASEQ_BENCH_ARGS:---filter $targets --repetitions 3 --timeout 60} |
  tee "$out/bench.log"
exit $status
