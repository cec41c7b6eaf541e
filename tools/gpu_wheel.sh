#!/usr/bin/env bash
# The one-command install on a GPU machine with CUDA and PyTorch but no Kokkos and no network:
# `pip wheel` builds paraseq and its bundled Kokkos (CUDA sm_90 + OpenMP + Serial, from a local Kokkos
# source tree), the wheel is installed into a new virtual environment, and the CUDA tests run there.
#
#   tools/gpu_wheel.sh KOKKOS_SRC OUT
#   PATH=/opt/torch/.venv/bin:$PATH tools/gpu_wheel.sh .kokkos-src /tmp/wheel   # on the H200 machine
#
# KOKKOS_SRC: a Kokkos source tree (given to CMake as FETCHCONTENT_SOURCE_DIR_KOKKOS). OUT receives
# wheel.json (timings and what ran), wheel-build.log, pytest.log and the wheel under dist/.
# Needs on PATH: python3 with torch, pip and scikit-build-core (the build uses --no-build-isolation,
# so nothing is downloaded), cmake, ninja; nvcc (CUDACXX, default /usr/local/cuda/bin/nvcc).
#
# The new environment is a plain venv, without system site-packages, with the wheel installed in it.
# torch cannot be installed there without a network: a .pth file appends the building Python's
# site-packages (torch, and pytest to run the tests) to its path. The venv's own site-packages come
# first, and the script checks that paraseq is imported from the venv and exists nowhere else.
set -euo pipefail
usage="usage: tools/gpu_wheel.sh KOKKOS_SRC OUT"
kokkos_src=$(realpath "${1:?$usage}")
out=$(realpath -m "${2:?$usage}")
repo=$(cd "$(dirname "$0")/.." && pwd)
die() { echo "tools/gpu_wheel.sh: $*" >&2; exit 1; }

[[ -f $kokkos_src/CMakeLists.txt ]] || die "$kokkos_src is not a Kokkos source tree (no CMakeLists.txt)"
python3 -c 'import torch' 2>/dev/null || die "python3 ($(command -v python3)) cannot import torch"
python3 -m pip --version >/dev/null 2>&1 || die "python3 ($(command -v python3)) has no pip"
python3 -c 'import scikit_build_core' 2>/dev/null ||
  die "python3 ($(command -v python3)) has no scikit-build-core, which builds the wheel; install it (pip install scikit-build-core) where a network is available"
python3 -c 'import pytest' 2>/dev/null || die "python3 ($(command -v python3)) has no pytest, which runs the tests"
for tool in cmake ninja; do command -v $tool >/dev/null || die "no $tool on PATH"; done
export CUDACXX=${CUDACXX:-/usr/local/cuda/bin/nvcc}
[[ -x $CUDACXX ]] || die "no nvcc at $CUDACXX (set CUDACXX)"
# The system compiler, as torch's: a second libstdc++ in one process aborts (docs/compatibility.md).
export CC=/usr/bin/gcc CXX=/usr/bin/g++ CUDAHOSTCXX=/usr/bin/g++
CMAKE_BUILD_PARALLEL_LEVEL=$(nproc)
export CMAKE_BUILD_PARALLEL_LEVEL
unset PYTHONPATH PARASEQ_TORCH_LIBRARY

mkdir -p "$out"
build_dir=/tmp/paraseq-wheel-build
venv=/tmp/paraseq-wheel-venv
rm -rf "$build_dir" "$venv" "$out/dist"
start=$(date +%s.%N)
python3 -m pip wheel --no-build-isolation --no-deps -v -w "$out/dist" \
  -Cbuild-dir="$build_dir" \
  -Ccmake.define.FETCHCONTENT_SOURCE_DIR_KOKKOS="$kokkos_src" \
  -Ccmake.define.CMAKE_CUDA_ARCHITECTURES=90 \
  "$repo" >"$out/wheel-build.log" 2>&1 || { tail -n 60 "$out/wheel-build.log"; die "pip wheel failed (log: $out/wheel-build.log)"; }
built=$(date +%s.%N)
wheel=$(ls "$out"/dist/paraseq-*.whl)

# A Python without ensurepip makes the venv without pip; the building Python's pip installs into it.
if python3 -m venv "$venv" 2>/dev/null; then
  venv_pip=("$venv/bin/python" -m pip)
else
  rm -rf "$venv"
  python3 -m venv --without-pip "$venv"
  venv_pip=(python3 -m pip --python "$venv/bin/python")
fi
site=$(python3 -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))')
venv_site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "$site" >"$venv_site/building-python-site-packages.pth"
"${venv_pip[@]}" install --no-index --no-deps "$wheel" >"$out/install.log" 2>&1 || { cat "$out/install.log"; die "installing $wheel failed"; }
installed=$(date +%s.%N)
[[ ! -e $site/paraseq ]] || die "$site already has a paraseq; the test would not show that the wheel works"
paraseq_from=$("$venv/bin/python" -c 'import paraseq, os; print(os.path.dirname(paraseq.__file__))')
[[ $paraseq_from == "$venv_site/paraseq" ]] || die "the venv imports paraseq from $paraseq_from, not from the installed wheel"

cd "$repo"
set +e
PARASEQ_TEST_DEVICES=cpu,cuda "$venv/bin/python" -m pytest -q -p no:cacheprovider python/tests/test_cuda.py >"$out/pytest.log" 2>&1
pytest_status=$?
set -e
finished=$(date +%s.%N)
tail -n 3 "$out/pytest.log"

python3 - "$out/wheel.json" "$start" "$built" "$installed" "$finished" "$pytest_status" "$wheel" "$paraseq_from" "$site" <<'EOF'
import json, os, subprocess, sys
path, start, built, installed, finished = sys.argv[1], *map(float, sys.argv[2:6])
status, wheel, paraseq_from, torch_site = int(sys.argv[6]), *sys.argv[7:]
import torch
result = {
    "what": "pip wheel --no-build-isolation of paraseq with the bundled Kokkos (CUDA sm_90, system g++ as host compiler), installed into a new venv, python/tests/test_cuda.py run there",
    "machine": f"{os.cpu_count()} cores, " + subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True).stdout.strip(),
    "nvcc": subprocess.run([os.environ["CUDACXX"], "--version"], capture_output=True, text=True).stdout.strip().splitlines()[-1],
    "torch": torch.__version__,
    "wheel": os.path.basename(wheel),
    "wheel_bytes": os.path.getsize(wheel),
    "wheel_build_seconds": round(built - start, 1),
    "install_seconds": round(installed - built, 1),
    "pytest_seconds": round(finished - installed, 1),
    "pytest_exit_status": status,
    "pytest_summary": open(os.path.join(os.path.dirname(path), "pytest.log")).read().strip().splitlines()[-1],
    "paraseq_imported_from": paraseq_from,
    "torch_from": f"{torch_site} (appended to the venv's path by a .pth file)",
}
json.dump(result, open(path, "w"), indent=2)
print(json.dumps(result, indent=2))
EOF
exit $pytest_status
