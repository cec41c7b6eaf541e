"""perf_tests/resource_usage.py on a report in cuobjdump -res-usage's format: the matching kernels of each
architecture, demangled and cut to the functor, with their registers, stack, shared and local memory; a kernel
that two objects hold is listed once."""

import json
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]

REPORT = """
Fatbin elf code:
================
arch = sm_90
code version = [1,8]

Resource usage:
 Common:
  GLOBAL:0 CONSTANT[3]:16
 Function _ZN7paraseq6detail13OnePassNewtonIfEclEv:
  REG:110 STACK:8 SHARED:0 LOCAL:0 CONSTANT[0]:904 TEXTURE:0 SURFACE:0 SAMPLER:0
 Function _ZN7paraseq6detail10ScanKernelIdE3runEv:
  REG:72 STACK:0 SHARED:16 LOCAL:4 CONSTANT[0]:900 TEXTURE:0 SURFACE:0 SAMPLER:0

Fatbin elf code:
================
arch = sm_90

Resource usage:
 Function _ZN7paraseq6detail13OnePassNewtonIfEclEv:
  REG:110 STACK:8 SHARED:0 LOCAL:0 CONSTANT[0]:904 TEXTURE:0 SURFACE:0 SAMPLER:0
"""


def test_resource_usage_lists_the_matching_kernels_once_with_their_resources():
    done = subprocess.run([sys.executable, str(ROOT / "perf_tests" / "resource_usage.py"), "OnePassNewton<"],
                          input=REPORT, capture_output=True, text=True, check=True, timeout=60)
    assert json.loads(done.stdout) == [{"arch": "sm_90", "kernel": "OnePassNewton<float>::operator()()",
                                        "reg": 110, "stack": 8, "shared": 0, "local": 0}]
