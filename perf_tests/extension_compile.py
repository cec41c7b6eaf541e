#!/usr/bin/env python3
"""The compiled path's cost for a function and a cell of your own (docs/torch.md, "Functions and
cells of your own"): the first use, which compiles the generated extension, and a cached use in a
new process, which loads it, each in a fresh process with an empty cache; with the generated units'
compile times, slowest first (a CUDA build compiles them side by side: the first use waits for the slowest).

    python3 perf_tests/extension_compile.py --device cuda --out extension-compile.json

The extension is compiled for the operator library that paraseq loads (PARASEQ_TORCH_LIBRARY):
with a CUDA Kokkos by nvcc, for the CPU and CUDA at once.
"""

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

SLOWEST_UNITS = 5  # units reported per case, slowest first

CASES = {
    "odeint Van der Pol, dopri5, float64": """
        import torch
        from paraseq import odeint
        mu = torch.tensor(1.5, dtype=torch.float64, device=DEVICE)
        def van_der_pol(t, y):
            return torch.stack([y[..., 1], mu * (1 - y[..., 0] ** 2) * y[..., 1] - y[..., 0]], dim=-1)
        y0 = torch.tensor([[2.0, 0.0]], dtype=torch.float64, device=DEVICE)
        t = torch.linspace(0, 1, 3, dtype=torch.float64, device=DEVICE)
        run = lambda: odeint(van_der_pol, y0, t, method="dopri5", compile=True)
    """,
    "newton_apply diagonal cell, float64": """
        import torch
        from torch import nn
        from paraseq import NewtonConfig, newton_apply
        class Cell(nn.Module):
            hidden_size, jac_structure = 64, "diag"
            def __init__(self):
                super().__init__()
                self.w = nn.Parameter(torch.rand(64, dtype=torch.float64) - 0.5)
                self.proj = nn.Linear(8, 64, dtype=torch.float64)
            def step(self, h, x):
                return torch.tanh(self.w * h + self.proj(x))
        cell = Cell().to(DEVICE)
        x = torch.rand(2, 128, 8, dtype=torch.float64, device=DEVICE)
        run = lambda: newton_apply(cell, x, NewtonConfig(max_iters=4), compile=True)
    """,
    "newton_apply dense GRU cell (H = 5), float32": """
        import torch
        from torch import nn
        from paraseq import NewtonConfig, newton_apply
        class Cell(nn.Module):
            hidden_size, jac_structure = 5, "dense"
            def __init__(self):
                super().__init__()
                self.input_map = nn.Linear(3, 15)
                self.recurrent_map = nn.Linear(5, 15, bias=False)
            def step(self, h, x):
                gx, gh = self.input_map(x), self.recurrent_map(h)
                z = torch.sigmoid(gx[..., :5] + gh[..., :5])
                r = torch.sigmoid(gx[..., 5:10] + gh[..., 5:10])
                c = torch.tanh(gx[..., 10:] + r * gh[..., 10:])
                return z * h + (1 - z) * c
        cell = Cell().to(DEVICE)
        x = torch.rand(2, 128, 3, device=DEVICE)
        run = lambda: newton_apply(cell, x, NewtonConfig(max_iters=4), compile=True)
    """,
}

TIMED = """
import json, time, warnings
from paraseq import _extension_build
warnings.simplefilter("ignore")
DEVICE = {device!r}
{setup}
start = time.perf_counter()
run()
if DEVICE == "cuda":
    torch.cuda.synchronize()
elapsed = time.perf_counter() - start
print(json.dumps(_extension_build.statistics.get("last_compile_units", {{}})))
print(_extension_build.statistics["compiles"], _extension_build.statistics.get("last_compile_seconds", 0.0), elapsed)
"""


def timed_use(setup, device, cache):
    """(compiles, compile seconds, call seconds, {unit: compile seconds}) of one call in a new process."""
    script = TIMED.format(device=device, setup=textwrap.dedent(setup))
    environment = dict(os.environ, PARASEQ_CACHE_DIR=str(cache))
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=environment)
    if result.returncode != 0:
        raise RuntimeError(f"the timed call failed:\n{result.stderr[-3000:]}")
    units_line, counts_line = result.stdout.strip().splitlines()[-2:]
    compiles, compile_seconds, seconds = counts_line.split()
    return int(compiles), float(compile_seconds), float(seconds), json.loads(units_line)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    import torch
    from paraseq import _extension_build
    settings = _extension_build.build_settings()
    report = {"machine": platform.node(), "cpus": os.cpu_count(), "device": args.device, "torch": torch.__version__,
              "compiler": settings.compiler, "cuda_extension": settings.cuda, "cases": []}
    for name, setup in CASES.items():
        with tempfile.TemporaryDirectory() as cache:
            compiles, compile_seconds, first, units = timed_use(setup, args.device, cache)
            cached_compiles, _, cached, _ = timed_use(setup, args.device, cache)
        # The slowest units (the namespace's hash left out): the first use waits for the longest.
        slowest = sorted(((seconds, re.sub(r"_[0-9a-f]{20}", "", unit)) for unit, seconds in units.items()),
                         reverse=True)[:SLOWEST_UNITS]
        report["cases"].append({"case": name, "first_use_seconds": round(first, 2),
                                "compile_seconds": round(compile_seconds, 2), "compiles": compiles,
                                "units": len(units) - ("(link)" in units),
                                "slowest_units_seconds": {unit: round(seconds, 1) for seconds, unit in slowest},
                                "cached_use_seconds": round(cached, 3), "cached_compiles": cached_compiles})
        print(f"{name}: first use {first:.1f} s (compile {compile_seconds:.1f} s; slowest: "
              + ", ".join(f"{unit} {seconds:.1f} s" for seconds, unit in slowest[:3]) + f"), cached use {cached:.2f} s")
    if args.out:
        args.out.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
