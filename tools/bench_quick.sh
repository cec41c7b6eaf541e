#!/usr/bin/env bash
# The quick performance check that `tools/dev test` runs: the small suite, compared with the committed
# baseline. Shared 2-core CI machines are noisy, so a flagged slowdown is reported, never a failure;
# only a benchmark that cannot run fails this step.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
baseline=$repo/perf_tests/baselines/cpu-quick.json
compare=()
if [[ -f $baseline ]]; then compare=(--baseline "$baseline"); else echo "bench_quick: no baseline at $baseline; reporting only"; fi
python3 "$repo/perf_tests/run_benchmarks.py" --build-dir "$repo/build/main" --quick \
  --out "$repo/build/main/perf-quick.json" "${compare[@]}"
