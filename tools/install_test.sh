#!/usr/bin/env bash
# Installs the library from the preset's build tree into a scratch prefix, then configures, builds and
# runs the consumer project in unit_tests/install_test against that prefix. Runs inside an environment:
#   tools/dev run main -- tools/install_test.sh main
set -euo pipefail
preset=${1:?usage: tools/install_test.sh PRESET}
repo=$(cd "$(dirname "$0")/.." && pwd)
build=$repo/build/$preset
prefix=$build/install-test/prefix
consumer=$build/install-test/consumer
rm -rf "$build/install-test"
cmake --install "$build" --prefix "$prefix" >/dev/null
cmake -G Ninja -S "$repo/unit_tests/install_test" -B "$consumer" -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
cmake --build "$consumer" >/dev/null
ctest --test-dir "$consumer" --output-on-failure
