# Session 6, device call 5: which odeint calls crash on CUDA (each in its own process).
set -u
export PATH=/opt/torch/.venv/bin:/usr/local/cuda/bin:$PATH PYTHONUNBUFFERED=1
tar -C /tmp -xzf .gpu/deps.tar.gz; python3 -c "import tarfile; tarfile.open('.gpu/torchlib.tar.xz').extractall('/tmp')"
export PARASEQ_TORCH_LIBRARY=/tmp/torchlib/libparaseq_torch.so PYTHONPATH=$PWD/python
for dtype in float32 float64; do for N in 3 65536; do for method in rk4 dopri5; do
timeout 60 python3 - $dtype $N $method <<'PY' > /tmp/case.txt 2>&1
import sys, torch
from paraseq import fields, odeint
dtype, N, method = getattr(torch, sys.argv[1]), int(sys.argv[2]), sys.argv[3]
k = torch.rand(N, dtype=dtype, device="cuda") + 0.5; c = torch.rand(N, dtype=dtype, device="cuda") * 0.1
y0 = torch.randn(N, 2, dtype=dtype, device="cuda"); t = torch.tensor([0.0, 0.37, 1.0], dtype=dtype, device="cuda")
y = odeint(fields.DampedOscillator(k, c), y0, t, method=method, step_size=0.01 if method == "rk4" else None)
torch.cuda.synchronize(); print("ok", tuple(y.shape), float(y.abs().max()))
PY
echo "$dtype N=$N $method: rc=$? $(tail -1 /tmp/case.txt | cut -c1-100)" | tee -a $OUT/odeint-cases.txt
done; done; done
