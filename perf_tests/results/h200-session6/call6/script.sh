# Session 6, device call 6: a native backtrace of the adaptive odeint crash on CUDA (a preloaded
# SIGSEGV handler; the device has no gdb).
set -u
export PATH=/opt/torch/.venv/bin:/usr/local/cuda/bin:$PATH PYTHONUNBUFFERED=1
tar -C /tmp -xzf .gpu/deps.tar.gz; python3 -c "import tarfile; tarfile.open('.gpu/torchlib.tar.xz').extractall('/tmp')"; tar -C /tmp -xzf .gpu/segv.tar.gz
export PARASEQ_TORCH_LIBRARY=/tmp/torchlib/libparaseq_torch.so PYTHONPATH=$PWD/python
cat > /tmp/case.py <<'PY'
import sys, torch
from paraseq import fields, odeint
N = 3
k = torch.rand(N, device="cuda") + 0.5; c = torch.rand(N, device="cuda") * 0.1
y0 = torch.randn(N, 2, device="cuda")
t = torch.tensor([0.0, 0.37, 1.0], dtype=torch.float64, device=sys.argv[1])
y = odeint(fields.DampedOscillator(k, c), y0, t, method="dopri5")
torch.cuda.synchronize(); print("ok", sys.argv[1], tuple(y.shape), float(y.abs().max()))
PY
for tdev in cpu cuda; do
  LD_PRELOAD=/tmp/segv/libsegv.so timeout 60 python3 /tmp/case.py $tdev > $OUT/backtrace-t-$tdev.txt 2>&1; echo "t on $tdev: rc=$?"; head -40 $OUT/backtrace-t-$tdev.txt | cut -c1-250
done
