# Session 8, device call 2: the ordered scan of sync_commit (COMMIT) with the serial prefix kept for up to 32
# sub-chunks: core tests on CUDA; scans in every time split, ParaGRU (newton mode) and the fused targets;
# the f56a3be binary (session 5/6 engine) on the same scan and Newton cases in the same run; two experiment
# binaries of the scans only (B, C: the one-pass kernel with launch bounds (256, 3) and (256, 4)); ncu.
set -u
export PATH=/opt/torch/.venv/bin:/usr/local/cuda/bin:$PATH PYTHONUNBUFFERED=1
start=$(date +%s); t(){ echo "[$(( $(date +%s) - start ))s] $*"; }; left(){ echo $(( 575 - ($(date +%s) - start) )); }
tar -C /tmp -xzf .gpu/deps.tar.gz; tar -C /tmp -xzf .gpu/s8cuda.tar.gz; mkdir -p /tmp/old && tar -C /tmp/old -xzf .gpu/cuda.tar.gz; tar -C /tmp -xzf .gpu/s8var.tar.gz
L=/tmp/logs; mkdir -p $L; cp /tmp/s8cuda/COMMIT $L/commit.txt; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv > $L/gpu.txt
timeout 200 /tmp/s8cuda/paraseq_core_tests --gtest_brief=1 > $L/test-core.txt 2>&1; t "tests core rc=$?"; grep -E "PASSED|FAILED|tests ran" $L/test-core.txt | head -12
M="NVIDIA H200 (one GPU), 16-core Intel Xeon host"
SCANS='scan_diagonal_(forward|reverse)/log2BN:(0/log2T:(22|26)|6/log2T:16|8/log2T:18|10/log2T:12|12/log2T:14|14/log2T:(8|12)|16/log2T:10|20/log2T:6)/sequential:[023]/|scan_block2/.*/sequential:0/|scan_dense16/.*/sequential:0/'
GRU='gru_forward/B:(16/T:4096/H:1024|8/T:16384/H:512)/mode:[02]/|gru_forward/B:1/T:(65536/H:256|262144/H:1)/mode:[01]/|gru_forward_backward/B:(16/T:4096/H:1024|8/T:16384/H:512)/mode:[02]/|gru_forward_backward/B:1/T:65536/H:256/mode:[01]/'
timeout 200 python3 perf_tests/run_benchmarks.py --build-dir /tmp/s8cuda --filter "ceiling_|$SCANS|$GRU" --repetitions 3 --timeout 30 --machine "$M" --out $OUT/h200-report.json > $L/bench-new.txt 2>&1; t "bench new rc=$?"
OLD='ceiling_|scan_diagonal_forward/log2BN:(0/log2T:(22|26)|6/log2T:16|8/log2T:18|10/log2T:12|12/log2T:14|14/log2T:12)/sequential:[02]/|gru_forward/B:1/T:(65536/H:256|262144/H:1)/mode:1/|gru_forward_backward/B:1/T:65536/H:256/mode:1/'
timeout 120 python3 perf_tests/run_benchmarks.py --build-dir /tmp/old/cuda --filter "$OLD" --repetitions 3 --timeout 30 --machine "$M" --out $OUT/h200-f56a3be.json > $L/bench-old.txt 2>&1; t "bench old rc=$?"
VAR='ceiling_copy|scan_diagonal_forward/log2BN:(0/log2T:(22|26)|2/log2T:24|6/log2T:16)/sequential:0/'
for V in B C; do mkdir -p /tmp/var/$V/perf_tests; cp /tmp/s8var/$V/bench /tmp/var/$V/perf_tests/paraseq_benchmarks
  timeout 60 python3 perf_tests/run_benchmarks.py --build-dir /tmp/var/$V --filter "$VAR" --repetitions 3 --timeout 30 --machine "$M" --out $OUT/h200-variant-$V.json > $L/bench-$V.txt 2>&1; t "bench $V rc=$?"; done
NCU="ncu --kernel-name-base demangled --launch-count 1 --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis"
ncu_run(){ [ $(left) -lt 40 ] && return; timeout 35 $NCU -k regex:$2 $4 "--benchmark_filter=$3" --benchmark_min_time=1x > $L/ncu-$1.txt 2>&1; t "ncu $1 rc=$?"; grep -E "Duration|Registers Per|Achieved Occupancy|DRAM Throughput|Block Limit Reg|Eligible Warps|Warp Cycles Per Issued" $L/ncu-$1.txt | cut -c1-150 | head -10; }
ncu_run scan-one-channel ChainedTag 'scan_diagonal_forward/log2BN:0/log2T:26/sequential:0/' /tmp/s8cuda/perf_tests/paraseq_benchmarks
ncu_run scan-one-channel-C ChainedTag 'scan_diagonal_forward/log2BN:0/log2T:26/sequential:0/' /tmp/var/C/perf_tests/paraseq_benchmarks
ncu_run scan-256-channels ApplyTag 'scan_diagonal_forward/log2BN:8/log2T:18/sequential:0/' /tmp/s8cuda/perf_tests/paraseq_benchmarks
for f in h200-report h200-f56a3be h200-variant-B h200-variant-C; do python3 perf_tests/report.py $OUT/$f.json > $L/report-$f.txt 2>&1; done
grep -E "scan_diag|gru_" $L/report-h200-report.txt | cut -c1-110; for f in h200-f56a3be h200-variant-B h200-variant-C; do echo "== $f"; grep -E "scan_diag|gru_|copy_runtime" $L/report-$f.txt | cut -c1-110; done
tar -C /tmp -czf $OUT/logs.tar.gz logs; t done
