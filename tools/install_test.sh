#!/usr/bin/env bash
# Installs the library from the preset's build tree into a scratch prefix, then configures, builds and
# runs two consumer projects against that prefix: unit_tests/install_test (find_package and its
# components) and examples/ (what `spack test run paraseq` builds). Runs inside an environment:
#   tools/dev run main -- tools/install_test.sh main
set -euo pipefail
preset=${1:?usage: tools/install_test.sh PRESET}
repo=$(cd "$(dirname "$0")/.." && pwd)
build=$repo/build/$preset
prefix=$build/install-test/prefix
rm -rf "$build/install-test"
cmake --install "$build" --prefix "$prefix" >/dev/null
for consumer in unit_tests/install_test examples; do
  consumer_build=$build/install-test/$(basename "$consumer")
  cmake -G Ninja -S "$repo/$consumer" -B "$consumer_build" -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
  cmake --build "$consumer_build" >/dev/null
  ctest --test-dir "$consumer_build" --output-on-failure
done
