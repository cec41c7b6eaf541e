# Session 8, device call 4: the Newton solver's tests (unit_tests/test_newton.cpp) on CUDA with the ordered scan of
# sync_commit (COMMIT): the newton mode's one-pass scans (staged 256-sub-chunk windows for few channels, the
# two-level look-back) against the sequential float64 references; then the core tests again.
set -u
export PATH=/usr/local/cuda/bin:$PATH
start=$(date +%s); t(){ echo "[$(( $(date +%s) - start ))s] $*"; }
tar -C /tmp -xzf .gpu/deps.tar.gz; tar -C /tmp -xzf .gpu/s8newton.tar.gz; tar -C /tmp -xzf .gpu/s8cuda.tar.gz
L=/tmp/logs; mkdir -p $L; cp /tmp/s8newton/COMMIT $L/commit.txt; cp .gpu/s8call4.sh $L/script.sh
timeout 400 /tmp/s8newton/paraseq_newton_tests > $L/test-newton.txt 2>&1; t "tests newton rc=$?"; grep -E "PASSED|FAILED|tests ran" $L/test-newton.txt | head -20
timeout 100 /tmp/s8cuda/paraseq_core_tests --gtest_brief=1 > $L/test-core.txt 2>&1; t "tests core rc=$?"; tail -3 $L/test-core.txt
tar -C /tmp -czf $OUT/logs.tar.gz logs; t done
