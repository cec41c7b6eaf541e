#!/usr/bin/env bash
# Builds the PyTorch operators against a CUDA Kokkos install and the torch of `python3`, then runs
# the pytest suite on CUDA tensors, the comparison with what users would pick instead
# (perf_tests/compare.py) and the operator checks (perf_tests/torch_check.py). It builds only the
# operator library, on every core: the C++ tests and benchmarks are tools/gpu_check.sh's. It never
# builds Kokkos: pass the prefix of an existing CUDA-enabled install.
#
#   tools/gpu_torch_check.sh KOKKOS_PREFIX OUT_DIR
#
# OUT_DIR receives build.log, pytest.log, compare.json/.log and torch-cuda.json/.log. Environment:
# PARASEQ_TEST_DEVICES (default cuda; CI covers cpu), PARASEQ_COMPARE_ARGS (default: the anchor
# shape (16, 4096, 1024) for the GRU and the scan, and an 8-step unrolled loop, whose cold compile
# stays short). A PYTHONPATH set by the caller is kept after the repository's python/: that is where
# the peer libraries compare.py measures are found (docs/performance.md).
set -euo pipefail
usage="usage: tools/gpu_torch_check.sh KOKKOS_PREFIX OUT_DIR"
kokkos=${1:?$usage}
out=${2:?$usage}
repo=$(cd "$(dirname "$0")/.." && pwd)
build=${PARASEQ_GPU_TORCH_BUILD:-$repo/build/gpu-torch}
mkdir -p "$out"
torch_prefix=$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)')

cmake -S "$repo" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKokkos_ROOT="$kokkos" \
  "-DCMAKE_PREFIX_PATH=$kokkos;$torch_prefix" -DCMAKE_CUDA_ARCHITECTURES=90 -DPARASEQ_ENABLE_TORCH=ON \
  -DPARASEQ_ENABLE_TESTS=OFF -DPARASEQ_ENABLE_BENCHMARKS=OFF -DPARASEQ_ENABLE_EXAMPLES=OFF >"$out/build.log" 2>&1
cmake --build "$build" -j "$(nproc)" >>"$out/build.log" 2>&1 || { tail -n 40 "$out/build.log"; exit 1; }

export PARASEQ_TORCH_LIBRARY=$build/src/adapters/torch/libparaseq_torch.so PYTHONPATH=$repo/python${PYTHONPATH:+:$PYTHONPATH}
status=0
PARASEQ_TEST_DEVICES=${PARASEQ_TEST_DEVICES:-cuda} python3 -m pytest -q -p no:cacheprovider -rfE "$repo/python/tests" \
  >"$out/pytest.log" 2>&1 || status=1
tail -n 5 "$out/pytest.log"
# shellcheck disable=SC2086 # PARASEQ_COMPARE_ARGS is a list of arguments
python3 "$repo/perf_tests/compare.py" ${PARASEQ_COMPARE_ARGS:---gru-shapes 16x4096x1024 --scan-shapes 16x4096x1024 --compiled-steps 8} \
  --out "$out/compare.json" >"$out/compare.log" 2>&1 || status=1
tail -n 25 "$out/compare.log"
python3 "$repo/perf_tests/torch_check.py" --device cuda --out "$out/torch-cuda.json" >"$out/torch-cuda.log" 2>&1 || status=1
tail -n 12 "$out/torch-cuda.log"
exit $status
