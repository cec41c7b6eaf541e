# Session 7, device call 1: the adaptive odeint crash on CUDA with a handler that prints the
# registers and the stack words that point into code (the fault is a call to address 0).
set -u
export PATH=/opt/torch/.venv/bin:/usr/local/cuda/bin:$PATH PYTHONUNBUFFERED=1
tar -C /tmp -xzf .gpu/deps.tar.gz; python3 -c "import tarfile; tarfile.open('.gpu/torchlib.tar.xz').extractall('/tmp')"; tar -C /tmp -xzf .gpu/segv7.tar.gz
export PARASEQ_TORCH_LIBRARY=/tmp/torchlib/libparaseq_torch.so PYTHONPATH=$PWD/python
cat /tmp/torchlib/COMMIT
cat > /tmp/case.py <<'PY'
import sys, torch
from paraseq import fields, odeint
N = 3
k = torch.rand(N, device="cuda") + 0.5; c = torch.rand(N, device="cuda") * 0.1
y0 = torch.randn(N, 2, device="cuda")
t = torch.tensor([0.0, 0.37, 1.0], dtype=torch.float64, device="cpu")
y = odeint(fields.DampedOscillator(k, c), y0, t, method=sys.argv[1])
torch.cuda.synchronize(); print("ok", sys.argv[1], tuple(y.shape), float(y.abs().max()))
PY
for method in dopri5 rk4; do
  LD_PRELOAD=/tmp/segv/libsegv.so timeout 60 python3 /tmp/case.py $method > $OUT/trace-$method.txt 2>&1; echo "$method: rc=$?"; head -80 $OUT/trace-$method.txt | cut -c1-300
done
