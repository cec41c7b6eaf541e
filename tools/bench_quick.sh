#!/usr/bin/env bash
# The quick performance check that `tools/dev test` runs: the small suite, compared with the committed
# baseline. Shared 2-core CI machines are noisy, so a flagged slowdown is reported, never a failure;
# only a benchmark that cannot run fails this step. It prints one summary line; PARASEQ_BENCH_TABLE=1
# prints the tables (every benchmark, and each against the baseline) as well.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
baseline=$repo/perf_tests/baselines/cpu-quick.json
compare=()
[[ ${PARASEQ_BENCH_TABLE:-0} == 1 ]] || compare+=(--summary)
if [[ -f $baseline ]]; then compare+=(--baseline "$baseline"); else echo "bench_quick: no baseline at $baseline; reporting only"; fi
python3 "$repo/perf_tests/run_benchmarks.py" --build-dir "$repo/build/main" --quick \
  --out "$repo/build/main/perf-quick.json" "${compare[@]}"
echo "bench_quick: tables: PARASEQ_BENCH_TABLE=1 tools/dev test, or perf_tests/report.py build/main/perf-quick.json"
