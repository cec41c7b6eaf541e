#!/usr/bin/env bash
# Checks PARASEQ_KOKKOS (cmake/paraseqKokkos.cmake) in an environment that has an installed Kokkos,
# and PARASEQ_ENABLE_MPI in one that has an MPI.
# `choice` (run by `tools/dev test`, needs no Kokkos source): bad values fail with a message naming
# them; SYSTEM and AUTO take the installed Kokkos; MPI's AUTO takes the MPI, or none when
# find_package(MPI) is disabled, and OFF none. `bundled` (by hand: it needs a Kokkos source tree
# or GitHub, which CI has neither of) also checks that AUTO without an installed Kokkos, and BUNDLED,
# build the bundled Kokkos. The BUNDLED build (OpenMP, header-only paraseq) is
# installed into a scratch prefix, and unit_tests/install_test, a consumer project, finds paraseq
# there with find_package, must get the Kokkos installed beside it, and runs a scan. Runs inside an
# environment:
#   tools/dev run main -- tools/kokkos_choice_test.sh choice|bundled [KOKKOS_SOURCE]
# KOKKOS_SOURCE (default: $PARASEQ_KOKKOS_SOURCE, else the repository's .kokkos-src/ if present, else
# the pinned release is downloaded) is a Kokkos source tree inside the repository (tools/dev mounts
# only the repository), given to CMake as FETCHCONTENT_SOURCE_DIR_KOKKOS.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
work=$repo/build/kokkos-choice-test
mode=${1:?usage: tools/kokkos_choice_test.sh choice|bundled [KOKKOS_SOURCE]}
[[ $mode == choice || $mode == bundled ]] || { echo "kokkos_choice_test: mode '$mode', expected choice or bundled" >&2; exit 2; }
source_dir=${2:-${PARASEQ_KOKKOS_SOURCE:-}}
if [[ -z $source_dir && -d $repo/.kokkos-src ]]; then source_dir=$repo/.kokkos-src; fi
source_args=()
if [[ -n $source_dir ]]; then source_args=(-DFETCHCONTENT_SOURCE_DIR_KOKKOS="$(realpath "$source_dir")"); fi
launcher=()
if command -v ccache >/dev/null; then launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache); fi
rm -rf "$work"
mkdir -p "$work"

fail() { echo "kokkos_choice_test: $*" >&2; exit 1; }
configure() { # name, cmake arguments...; the output goes to $work/<name>.log
  local name=$1
  shift
  cmake -G Ninja -S "$repo" -B "$work/$name" -DCMAKE_BUILD_TYPE=Release "${launcher[@]}" "$@" >"$work/$name.log" 2>&1
}
# CMake wraps long messages: the logs are compared with their whitespace runs made single spaces.
says() { tr -s '[:space:]' ' ' <"$work/$1.log" | grep -qF -- "$2"; }
expect_configure_error() { # name, expected message, cmake arguments...
  local name=$1 message=$2
  shift 2
  if configure "$name" "$@"; then fail "$name: configuring with $* succeeded; expected an error"; fi
  says "$name" "$message" || { tail -n 20 "$work/$name.log" >&2; fail "$name: the error does not say: $message"; }
}
expect_in_log() { # name, text
  says "$1" "$2" || { tail -n 20 "$work/$1.log" >&2; fail "$1: the configure output does not say: $2"; }
}

expect_configure_error bad-choice "PARASEQ_KOKKOS is 'Bundle'; expected one of: AUTO, SYSTEM, BUNDLED" -DPARASEQ_KOKKOS=Bundle
expect_configure_error bad-backend "PARASEQ_BACKENDS names 'Cuda' (in 'OpenMP;Cuda'); expected a list of: Serial, OpenMP, Threads, CUDA" \
  -DPARASEQ_KOKKOS=BUNDLED "-DPARASEQ_BACKENDS=OpenMP;Cuda"

configure system -DPARASEQ_KOKKOS=SYSTEM || { tail -n 20 "$work/system.log" >&2; fail "system: configure failed"; }
expect_in_log system "(SYSTEM, bundled: OFF)"
configure auto -DPARASEQ_KOKKOS=AUTO || { tail -n 20 "$work/auto.log" >&2; fail "auto: configure failed"; }
expect_in_log auto "(AUTO, bundled: OFF)"
expect_in_log auto "paraseq: MPI ON (PARASEQ_ENABLE_MPI=AUTO)"
expect_configure_error bad-mpi "PARASEQ_ENABLE_MPI is 'yes'; expected one of: AUTO, ON, OFF" -DPARASEQ_ENABLE_MPI=yes
configure mpi-auto-without-mpi -DCMAKE_DISABLE_FIND_PACKAGE_MPI=ON ||
  { tail -n 20 "$work/mpi-auto-without-mpi.log" >&2; fail "mpi-auto-without-mpi: configure failed"; }
expect_in_log mpi-auto-without-mpi "paraseq: MPI OFF (PARASEQ_ENABLE_MPI=AUTO)"
configure mpi-off -DPARASEQ_ENABLE_MPI=OFF || { tail -n 20 "$work/mpi-off.log" >&2; fail "mpi-off: configure failed"; }
expect_in_log mpi-off "paraseq: MPI OFF (PARASEQ_ENABLE_MPI=OFF)"
[[ $mode == choice ]] || {
# Without an installed Kokkos, AUTO builds the bundled one, with the default backends (no CUDA here).
configure auto-without-kokkos -DPARASEQ_KOKKOS=AUTO -DCMAKE_DISABLE_FIND_PACKAGE_Kokkos=ON "${source_args[@]}" ||
  { tail -n 20 "$work/auto-without-kokkos.log" >&2; fail "auto-without-kokkos: configure failed"; }
expect_in_log auto-without-kokkos "(AUTO, bundled: ON), devices: OPENMP;SERIAL"
}

if [[ $mode == choice ]]; then
  echo "kokkos_choice_test: PARASEQ_KOKKOS and PARASEQ_ENABLE_MPI checks passed (choice)"
  exit 0
fi

configure bundled -DPARASEQ_KOKKOS=BUNDLED -DPARASEQ_BACKENDS=OpenMP -DPARASEQ_ETI=OFF "${source_args[@]}" ||
  { tail -n 20 "$work/bundled.log" >&2; fail "bundled: configure failed"; }
expect_in_log bundled "(BUNDLED, bundled: ON), devices: OPENMP"
cmake --build "$work/bundled" >"$work/bundled-build.log" 2>&1 || { tail -n 40 "$work/bundled-build.log" >&2; fail "bundled: build failed"; }
prefix=$work/prefix
cmake --install "$work/bundled" --prefix "$prefix" >/dev/null
consumer=$work/consumer
cmake -G Ninja -S "$repo/unit_tests/install_test" -B "$consumer" -DCMAKE_PREFIX_PATH="$prefix" "${launcher[@]}" >"$work/consumer.log" 2>&1 ||
  { tail -n 20 "$work/consumer.log" >&2; fail "consumer: configure failed"; }
kokkos_dir=$(sed -n 's/^Kokkos_DIR:PATH=//p' "$consumer/CMakeCache.txt")
[[ $kokkos_dir == "$prefix/lib/cmake/Kokkos" ]] || fail "consumer: found Kokkos at '$kokkos_dir', not the bundled one installed at $prefix"
cmake --build "$consumer" >/dev/null
ctest --test-dir "$consumer" --output-on-failure
echo "kokkos_choice_test: PARASEQ_KOKKOS checks passed; the bundled Kokkos installs with paraseq and serves its consumers"
