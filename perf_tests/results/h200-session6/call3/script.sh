# Session 6, device call 3: where call 2's pytest crashed (odeint on CUDA, alone), and where the
# linear_scan operator's per-call time goes (autograd wrapper or not).
set -u
export PATH=/opt/torch/.venv/bin:/usr/local/cuda/bin:$PATH PYTHONUNBUFFERED=1
tar -C /tmp -xzf .gpu/deps.tar.gz; python3 -c "import tarfile; tarfile.open('.gpu/torchlib.tar.xz').extractall('/tmp')"
L=$OUT; export PARASEQ_TORCH_LIBRARY=/tmp/torchlib/libparaseq_torch.so PYTHONPATH=$PWD/python
PARASEQ_TEST_DEVICES=cuda timeout 150 python3 -X faulthandler -m pytest -v -p no:cacheprovider -rfE python/tests/test_odeint.py > $L/pytest-odeint-cuda.txt 2>&1; echo "pytest odeint rc=$?"; grep -E "PASSED|FAILED|ERROR|Fatal|passed|failed" $L/pytest-odeint-cuda.txt | head -40
PARASEQ_TEST_DEVICES=cuda timeout 100 python3 -m pytest -q -p no:cacheprovider -rfE python/tests --deselect python/tests/test_odeint.py > $L/pytest-rest-cuda.txt 2>&1; echo "pytest rest rc=$?"; tail -15 $L/pytest-rest-cuda.txt
timeout 60 python3 - > $L/overhead-split.txt 2>&1 <<'PY'
import sys; sys.path.insert(0, "perf_tests")
import torch, paraseq
from torch_check import median_call_microseconds as us
A = torch.full((1, 1, 1), 0.5, device="cuda"); b = torch.ones(1, 1, 1, device="cuda")
op = torch.ops.paraseq.linear_scan
print("op, grad mode on:", us(lambda: op(A, b, None, "diag", False), "cuda"))
with torch.no_grad(): print("op, no_grad:", us(lambda: op(A, b, None, "diag", False), "cuda"))
with torch.inference_mode(): print("op, inference_mode:", us(lambda: op(A, b, None, "diag", False), "cuda"))
with torch.inference_mode(): print("torch.add, inference_mode:", us(lambda: torch.add(A, b), "cuda"))
print("torch.add:", us(lambda: torch.add(A, b), "cuda"))
PY
echo "overhead rc=$?"; cat $L/overhead-split.txt
