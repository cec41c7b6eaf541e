#!/usr/bin/env bash
# Runs the README's "build your own project" commands as written: a plain build and install of
# paraseq (Kokkos only), then a consumer project outside the repository, mounted with
# `tools/dev run --mount`, built against that install and run. Runs on the host, as root:
#   tools/readme_test.sh
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd -P)
project=$(mktemp -d /tmp/paraseq-consumer.XXXXXX)
trap 'rm -rf "$project"' EXIT
cp "$repo"/unit_tests/install_test/* "$project/"
cd "$repo"
tools/dev run main -- bash -c 'cmake -S . -B build/plain -DCMAKE_INSTALL_PREFIX=$PWD/build/plain/prefix && cmake --build build/plain && cmake --install build/plain' >/dev/null
cd "$project"
"$repo/tools/dev" run main --mount . -- bash -c "cmake -S . -B build -DCMAKE_PREFIX_PATH=$repo/build/plain/prefix && cmake --build build" >/dev/null
"$repo/tools/dev" run main --mount . -- bash -c 'test "$PWD" = "$1" && ./build/consumer' _ "$project"
"$repo/tools/dev" run main --no-repo-python -- bash -c 'test -z "${PYTHONPATH:-}"'
echo "readme_test: the README's consumer-project commands work"
