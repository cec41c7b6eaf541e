"""paraseq from PyTorch: a bf16 ParaGRU compiled with fullgraph, and a batch of ODEs with gradients.

Run: tools/dev run main -- python3 python/examples/compiled_gru_and_ode.py
"""

import torch

from paraseq import ParaGRU, compile_safe_config, fields, newton_apply, odeint

# The seed example: Newton-solved GRU, bf16 storage with float32 state math, one graph.
cell = ParaGRU(32, 64).to(torch.bfloat16)
x = torch.randn(2, 128, 32, dtype=torch.bfloat16)
cfg = compile_safe_config(scan_backend="auto")
compiled = torch.compile(lambda z: newton_apply(cell, z, cfg), fullgraph=True)
y = compiled(x)
y.float().sum().backward()
print(f"ParaGRU: h {tuple(y.shape)} {y.dtype}, |dL/da| = {cell.recurrent.grad.float().norm():.4f}, "
      f"max |compiled - sequential| = {(y.float() - cell.sequential(x).float()).abs().max():.3e}")

# 1000 damped oscillators with their own stiffness, observed at 5 times, one operator.
k = torch.linspace(1.0, 4.0, 1000, dtype=torch.float64, requires_grad=True)
y0 = torch.tensor([[1.0, 0.0]], dtype=torch.float64).expand(1000, 2)
t = torch.linspace(0.0, 2.0, 5, dtype=torch.float64)
trajectory = odeint(fields.DampedOscillator(k, 0.1), y0, t, method="dopri5", rtol=1e-8, atol=1e-10)
trajectory[-1, :, 0].sum().backward()
print(f"odeint: {tuple(trajectory.shape)} (len(t), N, n), d(sum of positions at t=2)/dk[0] = {k.grad[0]:.6f}")
