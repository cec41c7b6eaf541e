# Session 6, device call 1: the solvers and core tests on CUDA with the final kernels (sources of
# the commit in COMMIT, built for sm_90 without PTX so that the solvers binary fits the carry limit).
set -u
export PATH=/opt/torch/.venv/bin:/usr/local/cuda/bin:$PATH PYTHONUNBUFFERED=1
start=$(date +%s); t(){ echo "[$(( $(date +%s) - start ))s] $*"; }
tar -C /tmp -xzf .gpu/deps.tar.gz; python3 -c "import tarfile; tarfile.open('.gpu/tests.tar.xz').extractall('/tmp')"
L=$OUT; cp /tmp/tests/COMMIT $L/commit.txt; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv > $L/gpu.txt
timeout 240 /tmp/tests/paraseq_solvers_tests --gtest_brief=1 > $L/test-solvers.txt 2>&1; t "solvers tests rc=$?"; grep -E "PASSED|FAILED|tests ran" $L/test-solvers.txt | head -20
timeout 200 /tmp/tests/paraseq_core_tests --gtest_brief=1 > $L/test-core.txt 2>&1; t "core tests rc=$?"; grep -E "PASSED|FAILED|tests ran" $L/test-core.txt | head -20
t done
