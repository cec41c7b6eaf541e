"""The process lifecycle: Kokkos starts lazily and finalises cleanly at exit; TORCH_COMPILE_DISABLE."""

import os
import subprocess
import sys

SCRIPT = """
import torch, paraseq
h = paraseq.linear_scan(torch.ones(1, 4, 2) * 0.5, torch.ones(1, 4, 2))
assert torch.allclose(h[0, :, 0], torch.tensor([1.0, 1.5, 1.75, 1.875])), h
print("ran")
"""

COMPILE_DISABLED = """
import torch, paraseq
calls = []
def backend(gm, inputs):
    calls.append(gm)
    return gm.forward
cell = paraseq.ParaGRU(4, 8)
x = torch.randn(2, 10, 4)
y = torch.compile(lambda z: paraseq.newton_apply(cell, z, paraseq.compile_safe_config()), backend=backend,
                  fullgraph=True)(x)
assert torch.equal(y, cell(x))
print("compiled graphs:", len(calls))
"""


def run(script, **env):
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **env}, cwd="/")


def test_kokkos_starts_and_finalises_in_a_fresh_process():
    result = run(SCRIPT)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ran"
    assert "Kokkos" not in result.stderr  # no warning about finalisation or leaked Views


def test_torch_compile_disable_is_respected():
    assert "compiled graphs: 1" in run(COMPILE_DISABLED).stdout
    disabled = run(COMPILE_DISABLED, TORCH_COMPILE_DISABLE="1")
    assert disabled.returncode == 0, disabled.stderr
    assert "compiled graphs: 0" in disabled.stdout


def test_info_reports_the_operators():
    result = subprocess.run([sys.executable, "-m", "paraseq.info"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "paraseq::para_gru: kernels for CPU" in result.stdout
