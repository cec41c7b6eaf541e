# Session 6, device call 2: the PyTorch operators on CUDA (library built on the workstation for
# sm_90 from the commit in COMMIT): pytest on CUDA tensors, the per-call overhead and graph-break
# checks (torch_check.py), and the comparison with what users would pick instead (compare.py).
set -u
export PATH=/opt/torch/.venv/bin:/usr/local/cuda/bin:$PATH PYTHONUNBUFFERED=1
start=$(date +%s); t(){ echo "[$(( $(date +%s) - start ))s] $*"; }
tar -C /tmp -xzf .gpu/deps.tar.gz; python3 -c "import tarfile; tarfile.open('.gpu/torchlib.tar.xz').extractall('/tmp')"
L=$OUT; cp /tmp/torchlib/COMMIT $L/commit.txt
# The Newton configuration tests of the head (automatic-mode rule re-fitted in session 6) on CUDA.
tar -C /tmp -xzf .gpu/rule.tar.gz; cp /tmp/rule/COMMIT $L/commit-newton-config-tests.txt
timeout 120 /tmp/rule/paraseq_newton_config_tests > $L/test-newton-config.txt 2>&1; t "newton config tests rc=$?"; grep -E "PASSED|FAILED|tests ran" $L/test-newton-config.txt | head
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name())" > $L/versions.txt 2>&1
export PARASEQ_TORCH_LIBRARY=/tmp/torchlib/libparaseq_torch.so PYTHONPATH=$PWD/python
timeout 60 python3 perf_tests/torch_check.py --device cuda --out $L/torch-cuda.json > $L/torch-cuda.txt 2>&1; t "torch_check rc=$?"; tail -30 $L/torch-cuda.txt
PARASEQ_TEST_DEVICES=cuda timeout 200 python3 -m pytest -q -p no:cacheprovider -rfE python/tests > $L/pytest-cuda.txt 2>&1; t "pytest rc=$?"; tail -5 $L/pytest-cuda.txt
timeout $(( 570 - ($(date +%s) - start) )) python3 perf_tests/compare.py --gru-shapes 16x4096x1024 --compiled-steps 8 --out $L/compare.json > $L/compare.txt 2>&1; t "compare rc=$?"; tail -40 $L/compare.txt
t done
