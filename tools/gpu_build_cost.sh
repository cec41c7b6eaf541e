#!/usr/bin/env bash
# The CUDA build cost of paraseq and its kernels' speed, on a GPU machine with CUDA, CMake, Ninja
# and PyTorch but no Kokkos (the H200 or H100 machines of docs/performance.md, "Build cost"; the
# report names the GPU and the host's processor).
#
#   tools/gpu_build_cost.sh DEPS OUT [BASELINE_TAR]
#
# DEPS holds whole source trees (each a `git archive`): kokkos/ (a Kokkos that builds with this CUDA),
# googletest/, benchmark/.
# They are built first, into /tmp. Then one build tree of everything (the ETI library, the PyTorch
# operators, tests, benchmarks, examples, CUDA sm_90) is built from empty in two phases: the
# operator library alone (`ninja paraseq_torch`), then the rest. OUT receives, in this order:
# build-cost.json (perf_tests/build_cost.py over the Ninja log, with both phases' wall times and,
# unless PARASEQ_ALONE=0, the application units compiled again one at a time on the idle host);
# ctest.log and pytest-cuda.log (the CUDA ctest beside python/tests/test_cuda.py, whose
# compiled-path tests compile extensions with nvcc) and, with PARASEQ_PYTEST_DEVICE_SECONDS,
# pytest-device.log (the suite's device-parametrised tests on CUDA); then, so that a lease that ends early keeps
# what the targets name, bench-heads.json and bench.json from the target benchmarks on the idle host
# (with BASELINE_TAR, below, bench-baseline.json and bench-again.json); compare-gru.json,
# compare-scan.json, compare-user.json, compare-sweep.json, compare-head.json, compare-packed.json and
# compare-slstm.json, compare-decode.json (perf_tests/compare.py: paraseq's operators against PyTorch and the peer
# libraries importable here, e.g. from wheels on PYTHONPATH; the shapes of the long-sequence targets);
# compare-ode.json (torch.compile's cold compiles, torchdiffeq, torchode), unless
# PARASEQ_COMPARE_ODE=0; with PARASEQ_NCU=1, Nsight Compute's reports of the long-sequence shape (and
# the one-pass forward's stall samples per instruction), the fused forward and adjoint at
# (16, 4096, 1024), the one-channel scan and the RK4 gradient (PARASEQ_NCU_PROFILES picks among them),
# and those kernels' registers (below); last extension-compile.json
# (perf_tests/extension_compile.py: the compiled path's nvcc compile). Beside the tests, wherever the
# build has it, cell-math-bits.json (perf_tests/cell_math_bits.cpp: the cells' approximate gates
# against their __expf formulas for every float).
# PARASEQ_COMPARE_SECTIONS (default "gru scan user sweep head packed slstm decode"; empty: none) names the compare.py
# sections to run, PARASEQ_COMPARE_SECONDS limits each section (by default 300 s for gru, scan and
# user, 240 s for the others), PARASEQ_USER_PARTS (compare.py --user-parts) picks the user section's
# comparisons, PARASEQ_BENCH=0 leaves the target benchmarks out (PARASEQ_BENCH_HEADS=0 only the head
# GRU's), PARASEQ_EXTENSION_COMPILE=0 the first use, PARASEQ_PYTEST_CUDA_SECONDS (default 480; 0 leaves it out) limits
# test_cuda.py and PARASEQ_PYTEST_CUDA_FILTER picks its tests (pytest -k), and PARASEQ_SCAN_SHAPES and
# PARASEQ_GRU_SHAPES replace the scan and gru sections' shapes (compare.py --scan-shapes, --gru-shapes).
# BASELINE_TAR, a `git archive` of an earlier commit, has its benchmark binary built beside the
# tests (its build time is not measured) and measured between two runs of this tree's, on the idle
# host: bench-baseline.json, then bench-again.json.
# PARASEQ_OPERATORS_ONLY=1 builds the operator library alone (no ctest), for test_cuda.py and the
# comparisons, and then, unless PARASEQ_BENCH=0 and PARASEQ_NCU=0, the benchmark binary beside
# test_cuda.py (its build time is not measured), with the unit-test executables that
# PARASEQ_UNIT_TESTS names (e.g. "paraseq_solvers_tests paraseq_workspace_tests"), whose CUDA tests
# then run (unit-tests.log; also with PARASEQ_BENCH_ONLY=1; PARASEQ_UNIT_TESTS_FILTER, a GoogleTest
# filter, picks among them: '*Cuda*' by default; a typed suite's CUDA tests are named
# SUITE/Cuda.TEST, e.g. 'NewtonOnePass/Cuda.*:OnePassLookBack/Cuda.*'). PARASEQ_BENCH_FILTER
# replaces the target benchmarks' filter (a regular expression of benchmark names).
# PARASEQ_BENCH_ONLY=1 builds the benchmark binary alone (with the library, not the operators) as
# the first phase and nothing else: a lease for the target benchmarks' speed (set
# PARASEQ_PYTEST_CUDA_SECONDS=0, PARASEQ_COMPARE_SECTIONS='' and PARASEQ_EXTENSION_COMPILE=0 with it).
# PARASEQ_SOURCE_COMMIT names the sources' commit in build-cost.json where this copy of the tree
# has other git metadata.
set -euo pipefail
deps=$(realpath "${1:?usage: tools/gpu_build_cost.sh DEPS OUT [BASELINE_TAR]}")
out=$(realpath -m "${2:?usage: tools/gpu_build_cost.sh DEPS OUT [BASELINE_TAR]}")
baseline=${3:-}
repo=$(cd "$(dirname "$0")/.." && pwd)
jobs=$(nproc)
mkdir -p "$out"
# OUT/exit-status appears when the script ends, however it ends: poll for it (a `pgrep -f` of the
# script's name also matches the shell that polls).
trap 'echo $? >"$out/exit-status"' EXIT
# The system compiler, as torch's: a second libstdc++ in one process aborts (docs/compatibility.md).
export CC=/usr/bin/gcc CXX=/usr/bin/g++ CUDAHOSTCXX=/usr/bin/g++
prefix=/tmp/paraseq-deps
common=(-G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX=$prefix -DCMAKE_PREFIX_PATH=$prefix)

if [[ ! -f $prefix/.built ]]; then
  cmake -S "$deps/kokkos" -B /tmp/build-kokkos "${common[@]}" -DCMAKE_CXX_STANDARD=20 -DBUILD_SHARED_LIBS=ON \
    -DKokkos_ENABLE_CUDA=ON -DKokkos_ENABLE_SERIAL=ON -DKokkos_ARCH_HOPPER90=ON \
    -DKokkos_ENABLE_COMPILE_AS_CMAKE_LANGUAGE=ON -DKokkos_ENABLE_IMPL_VIEW_LEGACY=ON >"$out/deps.log" 2>&1
  cmake --build /tmp/build-kokkos -j "$jobs" >>"$out/deps.log" 2>&1 && cmake --install /tmp/build-kokkos >>"$out/deps.log"
  cmake -S "$deps/googletest" -B /tmp/build-gtest "${common[@]}" >>"$out/deps.log" 2>&1
  cmake --build /tmp/build-gtest -j "$jobs" >>"$out/deps.log" 2>&1 && cmake --install /tmp/build-gtest >>"$out/deps.log"
  cmake -S "$deps/benchmark" -B /tmp/build-benchmark "${common[@]}" -DBENCHMARK_ENABLE_TESTING=OFF \
    -DBENCHMARK_ENABLE_WERROR=OFF -DBENCHMARK_INSTALL_DOCS=OFF >>"$out/deps.log" 2>&1
  cmake --build /tmp/build-benchmark -j "$jobs" >>"$out/deps.log" 2>&1 && cmake --install /tmp/build-benchmark >>"$out/deps.log"
  touch $prefix/.built
fi
torch_prefix=$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)')

configure() { # source build [extra cmake args]
  cmake -S "$1" -B "$2" "${common[@]}" -DCMAKE_PREFIX_PATH="$prefix;$torch_prefix" -DKokkos_ROOT=$prefix \
    -DCMAKE_CUDA_ARCHITECTURES=90 -DPARASEQ_ENABLE_TESTS=ON -DPARASEQ_ENABLE_BENCHMARKS=ON \
    -DPARASEQ_ENABLE_EXAMPLES=ON "${@:3}"
}

build=/tmp/build-paraseq
rm -rf "$build"
configure "$repo" "$build" -DPARASEQ_ENABLE_TORCH=ON >"$out/build.log" 2>&1
start=$(date +%s.%N)
# A unit that fails in either phase is reported, and the rest is still built, tested and measured.
first_target=paraseq_torch
[[ ${PARASEQ_BENCH_ONLY:-0} == 1 ]] && first_target=paraseq_benchmarks
ninja -C "$build" -j "$jobs" -k 0 "$first_target" >>"$out/build.log" 2>&1 || { grep -B2 -A20 "FAILED" "$out/build.log" | head -n 80; }
operators=$(date +%s.%N)
[[ ${PARASEQ_OPERATORS_ONLY:-0} == 1 || ${PARASEQ_BENCH_ONLY:-0} == 1 ]] ||
  ninja -C "$build" -j "$jobs" -k 0 >>"$out/build.log" 2>&1 || { grep -B2 -A20 "FAILED" "$out/build.log" | head -n 80; }
finished=$(date +%s.%N)

# The report, then the application units again, each alone on the idle host (--alone): the
# build-cost probes and the two Newton examples, as a user who compiles one unit sees them
# (PARASEQ_ALONE=0 leaves them out).
alone_units=()
[[ ${PARASEQ_ALONE:-1} == 0 ]] || alone_units=(perf_tests/CMakeFiles/paraseq_build_probes.dir/build_probes/kokkos_core.cpp.o
  perf_tests/CMakeFiles/paraseq_build_probes.dir/build_probes/newton_builtin_cell.cpp.o
  examples/CMakeFiles/paraseq_newton_gru.dir/newton_gru.cpp.o examples/CMakeFiles/paraseq_custom_cell.dir/custom_cell.cpp.o)
python3 "$repo/perf_tests/build_cost.py" "$build" ${PARASEQ_SOURCE_COMMIT:+--commit "$PARASEQ_SOURCE_COMMIT"} --machine "$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1) machine, $jobs cores ($(lscpu | sed -n 's/^Model name: *//p')), nvcc $(nvcc --version | sed -n 's/.*release \([0-9.]*\).*/\1/p')" \
  ${alone_units[@]:+--alone "${alone_units[@]}"} --out "$out/build-cost.json" | tee "$out/build-cost.txt"
python3 - "$out/build-cost.json" "$first_target" "$start" "$operators" "$finished" <<'EOF'
import json, sys
path, first_target, (start, operators, finished) = sys.argv[1], sys.argv[2], map(float, sys.argv[3:])
report = json.load(open(path))
first_phase = "operator_library_seconds" if first_target == "paraseq_torch" else "benchmark_binary_seconds"
report["phases"] = {first_phase: round(operators - start, 1),
                    "everything_else_seconds": round(finished - operators, 1),
                    "full_build_seconds": round(finished - start, 1)}
report["wall_seconds"] = report["phases"]["full_build_seconds"]  # two Ninja runs: the log's clock restarts
json.dump(report, open(path, "w"), indent=1)
print("phases:", report["phases"])
EOF

# The baseline's benchmarks are built beside the tests (their build time is not measured).
if [[ -n $baseline ]]; then
  (mkdir -p /tmp/baseline && tar -xf "$baseline" -C /tmp/baseline >/tmp/baseline.log 2>&1 &&
    configure /tmp/baseline /tmp/build-baseline >>/tmp/baseline.log 2>&1 &&
    nice -n 19 ninja -C /tmp/build-baseline -j "$jobs" paraseq_benchmarks >>/tmp/baseline.log 2>&1
    echo $? >/tmp/baseline.rc) &
  baseline_pid=$!
fi
# Operators only: the benchmarks, if wanted, are built beside the Python package's CUDA tests.
if [[ ${PARASEQ_OPERATORS_ONLY:-0} == 1 && (${PARASEQ_BENCH:-1} != 0 || ${PARASEQ_NCU:-0} == 1) ]]; then
  ninja -C "$build" -j "$jobs" -k 0 paraseq_benchmarks paraseq_cell_math_bits ${PARASEQ_UNIT_TESTS:-} \
    >"$out/build-benchmarks.log" 2>&1 &
  benchmarks_pid=$!
elif [[ ${PARASEQ_BENCH_ONLY:-0} == 1 ]]; then
  ninja -C "$build" -j "$jobs" -k 0 paraseq_cell_math_bits ${PARASEQ_UNIT_TESTS:-} >"$out/build-benchmarks.log" 2>&1 &
  benchmarks_pid=$!
fi
# The CUDA ctest beside the Python package's CUDA tests: the first runs on the GPU, the second
# mostly compiles, and only their outcomes are reported.
if [[ ${PARASEQ_OPERATORS_ONLY:-0} != 1 && ${PARASEQ_BENCH_ONLY:-0} != 1 ]]; then
  ctest --test-dir "$build" --output-on-failure -j 4 --timeout 300 >"$out/ctest.log" 2>&1 &
  ctest_pid=$!
fi
# The Python package's CUDA tests on the operators just built, in 4 processes (pytest-xdist): the
# compiled-path tests each compile an extension with nvcc (its units in parallel) into a cache the
# processes share, one compile at a time. pytest-timeout's limit per test makes a hung test fail
# with its stack; the overall limit interrupts pytest (SIGINT, as Ctrl-C), which then still prints
# the messages of the failures so far and the short summary (-rf), before a SIGKILL 60 s later.
# The rest of the Python suite's tests that take a device, on CUDA alone (their ids hold "cuda"):
# decoding steps, packed sequences, the modules and the loops, as CI runs them on the CPU
# (PARASEQ_PYTEST_DEVICE_SECONDS, default 0: left out; pytest-device.log), beside test_cuda.py.
if [[ ${PARASEQ_PYTEST_DEVICE_SECONDS:-0} != 0 ]]; then
  PARASEQ_TEST_DEVICES=cuda PARASEQ_TORCH_LIBRARY="$build/src/adapters/torch/libparaseq_torch.so" \
    PYTHONPATH="$repo/python${PYTHONPATH:+:$PYTHONPATH}" timeout -s INT -k 60 "$PARASEQ_PYTEST_DEVICE_SECONDS" \
    python3 -m pytest -q -rf -n 4 -p no:cacheprovider --timeout 360 -k "cuda" --ignore="$repo/python/tests/test_cuda.py" \
    "$repo/python/tests" >"$out/pytest-device.log" 2>&1 &
  device_tests_pid=$!
fi
if [[ ${PARASEQ_PYTEST_CUDA_SECONDS:-480} != 0 ]]; then
  PARASEQ_TORCH_LIBRARY="$build/src/adapters/torch/libparaseq_torch.so" PYTHONPATH="$repo/python${PYTHONPATH:+:$PYTHONPATH}" \
    timeout -s INT -k 60 "${PARASEQ_PYTEST_CUDA_SECONDS:-480}" python3 -m pytest -v -rf -n 4 -p no:cacheprovider --timeout 360 \
    ${PARASEQ_PYTEST_CUDA_FILTER:+-k "$PARASEQ_PYTEST_CUDA_FILTER"} "$repo/python/tests/test_cuda.py" >"$out/pytest-cuda.log" 2>&1 || true
  tail -n 3 "$out/pytest-cuda.log"
fi
if [[ -n ${device_tests_pid:-} ]]; then
  wait "$device_tests_pid" || true
  tail -n 3 "$out/pytest-device.log"
fi
if [[ -n ${ctest_pid:-} ]]; then
  wait "$ctest_pid" || true
  tail -n 4 "$out/ctest.log"
fi
[[ -z ${baseline_pid:-} ]] || wait "$baseline_pid" || true
[[ -z ${benchmarks_pid:-} ]] || wait "$benchmarks_pid" || grep -A20 "FAILED" "$out/build-benchmarks.log" | head -n 40
# Operators or benchmarks only: the CUDA tests of the unit-test executables named in
# PARASEQ_UNIT_TESTS (built beside the benchmarks or after them), as unit-tests.log.
if [[ ${PARASEQ_OPERATORS_ONLY:-0} == 1 || ${PARASEQ_BENCH_ONLY:-0} == 1 ]]; then
  for executable in ${PARASEQ_UNIT_TESTS:-}; do
    timeout 600 "$build/unit_tests/$executable" --gtest_filter="${PARASEQ_UNIT_TESTS_FILTER:-*Cuda*}" --gtest_brief=1 \
      >>"$out/unit-tests.log" 2>&1 ||
      echo "$executable: exit status $?" >>"$out/unit-tests.log"
  done
fi
[[ ! -f $out/unit-tests.log ]] || tail -n 4 "$out/unit-tests.log"
# The cells' approximate gates against their __expf formulas for every float (cell-math-bits.json).
if [[ -x $build/perf_tests/paraseq_cell_math_bits ]]; then
  timeout 120 "$build/perf_tests/paraseq_cell_math_bits" >"$out/cell-math-bits.json" 2>&1 ||
    echo "paraseq_cell_math_bits: exit status $?" >>"$out/cell-math-bits.json"
  cat "$out/cell-math-bits.json"
fi

# The target benchmarks of docs/performance.md on the idle host: this tree, then the baseline.
targets='ceiling_copy|scan_diagonal_forward/log2BN:(0/log2T:26|8/log2T:18|14/log2T:12)/sequential:0|scan_diagonal_reverse/log2BN:8'
targets+='|gru_forward(_backward)?/B:16/T:4096/H:1024/|gru_(forward|newton).*B:1/T:65536/H:256/|gru_forward_long/'
targets+='|(rk4_fixed|dopri5_adaptive)/log2N:20/n:2/steps:1000/gradient:[012]/stepped:0|rk4_fixed/log2N:16/n:2/steps:1000/gradient:0/stepped:0'
targets+='|(rk4_fixed|dopri5_adaptive)/log2N:16/n:(8|32)/steps:1000/gradient:[012]/stepped:0' # fields of run-time size
targets+='|rk4_gradient_interval/log2N:20/' # the RK4 gradient against its checkpoint interval
targets+='|gru_one_pass_(threads|chunks)/|gru_forward_iterations/' # the one-pass mode's groups per team, threads per group and steps per thread; both long-sequence modes at K = 1..4
targets=${PARASEQ_BENCH_FILTER:-$targets}
bench() { # build_dir report
  python3 "$repo/perf_tests/run_benchmarks.py" --build-dir "$1" --out "$2" --filter "$targets" --repetitions 3 \
    --timeout 60 >"$2.log" 2>&1 || true
}
# With a baseline, this tree runs again after it (bench-again.json): a difference that follows the
# order of the runs (the GPU's state after minutes of load) rather than the tree shows up as a
# difference between bench.json and bench-again.json.
if [[ ${PARASEQ_BENCH:-1} != 0 ]]; then
  # The head GRU's dense heads up to 32 x 32 (forward in every mode, forward + backward in the
  # automatic one), 15 s per case: a slow mode costs its limit, not the run (PARASEQ_BENCH_HEADS=0
  # leaves them out).
  [[ ${PARASEQ_BENCH_HEADS:-1} == 0 ]] || python3 "$repo/perf_tests/run_benchmarks.py" --build-dir "$build" \
    --out "$out/bench-heads.json" --filter 'gru_heads_forward/|gru_heads_forward_backward/.*/mode:0/' --repetitions 3 \
    --timeout 15 >"$out/bench-heads.json.log" 2>&1 || true
  bench "$build" "$out/bench.json"
  if [[ -n $baseline ]]; then
    if [[ $(cat /tmp/baseline.rc) == 0 ]]; then
      bench /tmp/build-baseline "$out/bench-baseline.json"
      bench "$build" "$out/bench-again.json"
    else
      tail -n 30 /tmp/baseline.log >"$out/baseline-build-failed.log"
    fi
  fi
fi
compare() { # section time_limit_seconds [compare.py arguments]
  PARASEQ_TORCH_LIBRARY="$build/src/adapters/torch/libparaseq_torch.so" PYTHONPATH="$repo/python${PYTHONPATH:+:$PYTHONPATH}" \
    timeout "$2" python3 "$repo/perf_tests/compare.py" --sections "$1" --out "$out/compare-$1.json" "${@:3}" \
    >"$out/compare-$1.log" 2>&1 || echo "compare.py --sections $1: exit status $?" >>"$out/compare-$1.log"
}
for section in ${PARASEQ_COMPARE_SECTIONS-gru scan user sweep head packed slstm decode}; do
  case $section in
  gru) compare gru "${PARASEQ_COMPARE_SECONDS:-300}" --gru-shapes "${PARASEQ_GRU_SHAPES:-16x4096x1024,1x65536x256,1x1048576x64,4x262144x128}" ;;
  scan) compare scan "${PARASEQ_COMPARE_SECONDS:-300}" ${PARASEQ_SCAN_SHAPES:+--scan-shapes "$PARASEQ_SCAN_SHAPES"} ;;
  user) compare user "${PARASEQ_COMPARE_SECONDS:-300}" --user-parts "${PARASEQ_USER_PARTS:-cell,field}" ;;
  *) compare "$section" "${PARASEQ_COMPARE_SECONDS:-240}" ;;
  esac
done
[[ ${PARASEQ_COMPARE_ODE:-1} == 0 ]] || compare ode 240
# With PARASEQ_NCU=1, Nsight Compute's view of the long-sequence shape (1, 65536, 256): the fused
# (mode 2) and one-pass (mode 4) ParaGRU forward, three launches of the mode's kernel after the first
# two (picked by the functor's name in the demangled kernel name: a count of all launches would
# depend on how many set-up kernels a call makes), as ncu-mode2.csv and ncu-mode4.csv. The clocks
# are left alone (--clock-control none).
if [[ ${PARASEQ_NCU:-0} == 1 ]]; then
  ncu=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
  # profile NAME KERNEL_REGEX BENCHMARK_FILTER MIN_TIME [ncu options]: the kernels of the benchmarks
  # that match, as NAME.csv (ncu's messages in NAME.log); PARASEQ_NCU_PROFILES, if set, names the
  # profiles to take (e.g. "ncu-mode4 ncu-mode4-source ncu-wide-FusedNewton").
  wanted() { [[ -z ${PARASEQ_NCU_PROFILES:-} || " $PARASEQ_NCU_PROFILES " == *" $1 "* ]]; }
  profile() {
    wanted "$1" || return 0
    timeout 150 "$ncu" --clock-control none --kernel-name-base demangled \
      --kernel-name "regex:$2" "${@:5}" --section SpeedOfLight --section Occupancy --section LaunchStats \
      --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis --section WarpStateStats --section SchedulerStats \
      --csv --page details "$build/perf_tests/paraseq_benchmarks" \
      --benchmark_filter="$3" --benchmark_min_time="$4" >"$out/$1.csv" 2>"$out/$1.log" ||
      echo "ncu: exit status $?" >>"$out/$1.log"
  }
  for mode in 2 4; do
    kernel=$([[ $mode == 2 ]] && echo FusedNewton || echo OnePassNewton)
    profile "ncu-mode$mode" "$kernel<" "^gru_forward/B:1/T:65536/H:256/mode:$mode/" 5x --launch-skip 2 --launch-count 3
  done
  # Where the one-pass forward's warps wait, per SASS instruction (the sampled stall reasons of one
  # launch), as ncu-mode4-source.csv.
  if wanted ncu-mode4-source; then
    timeout 150 "$ncu" --clock-control none --kernel-name-base demangled \
      --kernel-name 'regex:OnePassNewton<' --launch-skip 2 --launch-count 1 --section WarpStateStats \
      --section SourceCounters -f -o "/tmp/ncu-mode4-source" "$build/perf_tests/paraseq_benchmarks" \
      --benchmark_filter='^gru_forward/B:1/T:65536/H:256/mode:4/' --benchmark_min_time=5x >"$out/ncu-mode4-source.log" 2>&1 &&
      timeout 150 "$ncu" -i /tmp/ncu-mode4-source.ncu-rep --page source --csv \
        --print-source sass >"$out/ncu-mode4-source.csv" 2>>"$out/ncu-mode4-source.log" ||
      echo "ncu: exit status $?" >>"$out/ncu-mode4-source.log"
  fi
  # The fused forward and its adjoint at (16, 4096, 1024), the shape of the 0.50 and 1.0 ms targets
  # (the fused mode is the automatic choice there), as ncu-wide-FusedNewton.csv and ncu-wide-FusedAdjoint.csv.
  for kernel in FusedNewton FusedAdjoint; do
    benchmark=$([[ $kernel == FusedNewton ]] && echo gru_forward || echo gru_forward_backward)
    profile "ncu-wide-$kernel" "$kernel<" "^$benchmark/B:16/T:4096/H:1024/mode:2/" 5x --launch-skip 2 --launch-count 3
  done
  # The diagonal scan of one channel x 2^26 (its copy-bandwidth target): the scan's kernels.
  profile ncu-scan-one-channel 'OrderedScan<' '^scan_diagonal_forward/log2BN:0/log2T:26/sequential:0' 5x \
    --launch-skip 2 --launch-count 4
  # The RK4 gradient of 2^20 oscillators (1000 steps): its checkpointing forward loop, the backward
  # loop's init and the backward loop itself, as ncu-rk4-gradient.csv.
  profile ncu-rk4-gradient 'ode::detail::(Forward|Backward)<' '^rk4_fixed/log2N:20/n:2/steps:1000/gradient:1/stepped:0/' 1x \
    --launch-count 6
  # Registers, stack and spills of those kernels as ptxas built them (cuobjdump's resource usage of
  # the ETI objects that hold them), as resource-usage.txt.
  find "$build/CMakeFiles/paraseq.dir/eti" -name '*.o' \( -name 'newton_ParaGRU_float_Cuda*' -o -name 'scan_Diagonal_*_float_Cuda*' \
    -o -name 'odeint_*_DampedOscillator_Cuda*' \) -print0 | xargs -0 -r -n 1 cuobjdump -res-usage 2>/dev/null |
    python3 "$repo/perf_tests/resource_usage.py" 'OnePassNewton<|FusedNewton<|FusedAdjoint<|OrderedScan<paraseq::Diagonal|ode::detail::(Forward|Backward)<paraseq::ode::(RK4|DormandPrince5)' \
    >"$out/resource-usage.txt" 2>&1 || true
fi
# The compiled path's first use (an nvcc compile of a generated extension, timed on the idle host)
# and cached use.
[[ ${PARASEQ_EXTENSION_COMPILE:-1} == 0 ]] || PARASEQ_TORCH_LIBRARY="$build/src/adapters/torch/libparaseq_torch.so" PYTHONPATH="$repo/python" \
  timeout 300 python3 "$repo/perf_tests/extension_compile.py" --device cuda --out "$out/extension-compile.json" \
  >"$out/extension-compile.log" 2>&1 || true
[[ ! -f $out/extension-compile.log ]] || tail -n 3 "$out/extension-compile.log"
echo "gpu_build_cost.sh: done"
