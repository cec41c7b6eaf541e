# Session 7, device call 3: the operator library with the ParaLSTM forward units built (session 7 headers) and
# the autograd kernels that skip Function when nothing is differentiated: pytest on CUDA, overhead.
set -u
export PATH=/opt/torch/.venv/bin:/usr/local/cuda/bin:$PATH PYTHONUNBUFFERED=1
start=$(date +%s); t(){ echo "[$(( $(date +%s) - start ))s] $*"; }
tar -C /tmp -xzf .gpu/deps.tar.gz; python3 -c "import tarfile; tarfile.open('.gpu/torchlib.tar.xz').extractall('/tmp')"; tar -C /tmp -xzf .gpu/segv7.tar.gz
L=$OUT; cp /tmp/torchlib/COMMIT $L/commit.txt; cat $L/commit.txt
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name())" > $L/versions.txt 2>&1
export PARASEQ_TORCH_LIBRARY=/tmp/torchlib/libparaseq_torch.so PYTHONPATH=$PWD/python
cat > /tmp/case.py <<'PY'
import sys, torch
from paraseq import fields, odeint
for method in ("dopri5", "heun", "rk4"):
    for dtype in (torch.float32, torch.float64):
        for N in (3, 65536):
            k = torch.rand(N, device="cuda", dtype=dtype) + 0.5; c = torch.rand(N, device="cuda", dtype=dtype) * 0.1
            y0 = torch.randn(N, 2, device="cuda", dtype=dtype)
            t = torch.tensor([0.0, 0.37, 1.0], dtype=torch.float64, device="cuda")
            y = odeint(fields.DampedOscillator(k, c), y0, t, method=method)
            torch.cuda.synchronize(); print("ok", method, dtype, N, tuple(y.shape), float(y.abs().max()))
PY
LD_PRELOAD=/tmp/segv/libsegv.so timeout 60 python3 /tmp/case.py > $L/odeint-cases.txt 2>&1; t "odeint cases rc=$?"; cat $L/odeint-cases.txt | cut -c1-200 | head -20
timeout 90 python3 perf_tests/torch_check.py --device cuda --out $L/torch-cuda.json > $L/torch-cuda.txt 2>&1; t "torch_check cuda rc=$?"; tail -25 $L/torch-cuda.txt
timeout 60 python3 - > $L/overhead-split.txt 2>&1 <<'PY'
import sys; sys.path.insert(0, "perf_tests")
import torch, paraseq
from torch_check import median_call_microseconds as us
A = torch.full((1, 1, 1), 0.5, device="cuda"); b = torch.ones(1, 1, 1, device="cuda")
op = torch.ops.paraseq.linear_scan
for repeat in range(2):
    print("op, grad mode on:", us(lambda: op(A, b, None, "diag", False), "cuda"))
    with torch.no_grad(): print("op, no_grad:", us(lambda: op(A, b, None, "diag", False), "cuda"))
    with torch.inference_mode(): print("op, inference_mode:", us(lambda: op(A, b, None, "diag", False), "cuda"))
    with torch.inference_mode(): print("torch.add, inference_mode:", us(lambda: torch.add(A, b), "cuda"))
    print("torch.add:", us(lambda: torch.add(A, b), "cuda"))
    Ag = A.clone().requires_grad_(); print("op, A requires grad:", us(lambda: op(Ag, b, None, "diag", False), "cuda"))
    print("torch.add, A requires grad:", us(lambda: torch.add(Ag, b), "cuda"))
PY
t "overhead rc=$?"; cat $L/overhead-split.txt
PARASEQ_TEST_DEVICES=cuda LD_PRELOAD=/tmp/segv/libsegv.so timeout 300 python3 -m pytest -q -p no:cacheprovider -rfE python/tests > $L/pytest-cuda.txt 2>&1; t "pytest rc=$?"; tail -25 $L/pytest-cuda.txt | cut -c1-300
t done
