# Session 8, device call 5 (final): the ordered scan of sync_commit (COMMIT: published maps read ReadAhead at a
# time, the segment fold without 7 maps held at once): the Newton solver's tests and the core tests on CUDA;
# scans and ParaGRU (newton mode) against the f56a3be binary in the same run.
set -u
export PATH=/opt/torch/.venv/bin:/usr/local/cuda/bin:$PATH PYTHONUNBUFFERED=1
start=$(date +%s); t(){ echo "[$(( $(date +%s) - start ))s] $*"; }
tar -C /tmp -xzf .gpu/deps.tar.gz; tar -C /tmp -xzf .gpu/s8cuda.tar.gz; tar -C /tmp -xzf .gpu/s8newton.tar.gz; mkdir -p /tmp/old && tar -C /tmp/old -xzf .gpu/cuda.tar.gz
L=/tmp/logs; mkdir -p $L; cp /tmp/s8cuda/COMMIT $L/commit.txt; cp /tmp/s8newton/COMMIT $L/newton-commit.txt; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv > $L/gpu.txt; cp .gpu/s8call5.sh $L/script.sh
timeout 300 /tmp/s8newton/paraseq_newton_tests > $L/test-newton.txt 2>&1; t "tests newton rc=$?"; grep -E "PASSED|FAILED|tests ran" $L/test-newton.txt | head -20
timeout 100 /tmp/s8cuda/paraseq_core_tests > $L/test-core.txt 2>&1; t "tests core rc=$?"; grep -E "PASSED|FAILED|tests ran" $L/test-core.txt | head
M="NVIDIA H200 (one GPU), 16-core Intel Xeon host"
SCANS='scan_diagonal_(forward|reverse)/log2BN:(0/log2T:(22|26)|6/log2T:16|8/log2T:18|10/log2T:12|12/log2T:14|14/log2T:(8|12)|16/log2T:10|20/log2T:6)/sequential:[023]/|scan_block2/.*/sequential:0/|scan_dense16/.*/sequential:0/'
GRU='gru_forward/B:(16/T:4096/H:1024|8/T:16384/H:512)/mode:[02]/|gru_forward/B:1/T:(65536/H:256|262144/H:1)/mode:[01]/|gru_forward_backward/B:(16/T:4096/H:1024|8/T:16384/H:512)/mode:[02]/|gru_forward_backward/B:1/T:65536/H:256/mode:[01]/'
timeout 200 python3 perf_tests/run_benchmarks.py --build-dir /tmp/s8cuda --filter "ceiling_|$SCANS|$GRU" --repetitions 3 --timeout 30 --machine "$M" --out $OUT/h200-report.json > $L/bench-new.txt 2>&1; t "bench new rc=$?"
OLD='ceiling_|scan_diagonal_forward/log2BN:(0/log2T:(22|26)|6/log2T:16|8/log2T:18|10/log2T:12|12/log2T:14|14/log2T:12)/sequential:[02]/|gru_forward/B:1/T:(65536/H:256|262144/H:1)/mode:1/|gru_forward_backward/B:1/T:65536/H:256/mode:1/'
timeout 120 python3 perf_tests/run_benchmarks.py --build-dir /tmp/old/cuda --filter "$OLD" --repetitions 3 --timeout 30 --machine "$M" --out $OUT/h200-f56a3be.json > $L/bench-old.txt 2>&1; t "bench old rc=$?"
for f in h200-report h200-f56a3be; do python3 perf_tests/report.py $OUT/$f.json > $L/report-$f.txt 2>&1; done
grep -E "scan_|gru_|copy_runtime" $L/report-h200-report.txt | cut -c1-110; echo "== f56a3be"; grep -E "scan_diag|gru_|copy_runtime" $L/report-h200-f56a3be.txt | cut -c1-110
tar -C /tmp -czf $OUT/logs.tar.gz logs; t done
