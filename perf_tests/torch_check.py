#!/usr/bin/env python3
"""The PyTorch operators on one device: agreement with the CPU operators and with eager, graph
breaks under torch.compile(fullgraph=True), and the per-call overhead of an operator against a
plain torch op of the same size. Writes one JSON report.

    PARASEQ_TORCH_LIBRARY=... torch_check.py --device cuda --out torch-cuda.json
"""

import argparse
import json
import time

import torch

import paraseq


def max_relative_error(x, reference):
    x, reference = x.detach().double().cpu(), reference.detach().double().cpu()
    return float((x - reference).abs().max() / reference.abs().max().clamp_min(1e-30))


def median_call_microseconds(fn, device, calls=200, repeats=7):
    """Median over repeats of the mean wall time of `calls` back-to-back calls, synchronised at the end."""
    def synchronize():
        if device == "cuda":
            torch.cuda.synchronize()
    for _ in range(20):
        fn()
    synchronize()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        synchronize()
        samples.append((time.perf_counter() - start) / calls * 1e6)
    return sorted(samples)[len(samples) // 2]


def runtime_calls_per_call(fn, device, calls=20):
    """What one call does on the host side besides Python: CUDA runtime calls and kernels per call
    (torch.profiler), so that an overhead above a plain op's can be attributed."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    fn()
    with torch.profiler.profile(activities=activities) as profile:
        for _ in range(calls):
            fn()
        if device == "cuda":
            torch.cuda.synchronize()
    counts = {}
    for event in profile.events():
        name = event.name
        if name.startswith("cuda") or name.startswith("cu") or event.device_type == torch.autograd.DeviceType.CUDA:
            key = name if name.startswith("cu") else "kernel: " + name[:80]
            counts[key] = counts.get(key, 0) + 1
    return {name: count / calls for name, count in sorted(counts.items()) if not name.startswith("cudaDeviceSynchronize")}


def graph_breaks(fn, *args):
    torch._dynamo.reset()
    return torch._dynamo.explain(fn)(*args).graph_break_count


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    device = args.device
    torch.manual_seed(0)
    report = {"device": device, "torch": torch.__version__,
              "gpu": torch.cuda.get_device_name() if device == "cuda" else None, "checks": {}}
    checks = report["checks"]

    # linear_scan on the device against the CPU operator, float64.
    A = torch.rand(4, 4096, 64, dtype=torch.float64) * 0.1 + 0.9
    b = torch.randn(4, 4096, 64, dtype=torch.float64)
    checks["linear_scan_vs_cpu"] = max_relative_error(paraseq.linear_scan(A.to(device), b.to(device)),
                                                      paraseq.linear_scan(A, b))

    # The seed example: ParaGRU in bf16, compiled with fullgraph, forward and backward, against eager.
    cell = paraseq.ParaGRU(32, 64).to(device=device, dtype=torch.bfloat16)
    x = torch.randn(2, 128, 32, dtype=torch.bfloat16, device=device)
    cfg = paraseq.compile_safe_config(scan_backend="auto")
    eager = paraseq.newton_apply(cell, x, cfg)
    compiled_fn = torch.compile(lambda z: paraseq.newton_apply(cell, z, cfg), fullgraph=True)
    compiled = compiled_fn(x)
    compiled.float().sum().backward()
    checks["seed_example_compiled_vs_eager"] = max_relative_error(compiled, eager)
    checks["seed_example_graph_breaks"] = graph_breaks(lambda z: paraseq.newton_apply(cell, z, cfg), x)
    checks["seed_example_grad_finite"] = bool(all(p.grad is not None and torch.isfinite(p.grad).all()
                                                  for p in cell.parameters()))

    # ParaGRU on the device against its own sequential loop in float64.
    cell64 = paraseq.ParaGRU(16, 32).to(device=device, dtype=torch.float64)
    x64 = torch.randn(3, 500, 16, dtype=torch.float64, device=device)
    checks["paragru_vs_sequential_float64"] = max_relative_error(cell64(x64), cell64.sequential(x64))

    # Per-call overhead: a tiny linear_scan against torch.add on tensors of the same size.
    A_small = torch.full((1, 1, 1), 0.5, device=device)
    b_small = torch.ones(1, 1, 1, device=device)
    report["overhead_us"] = {
        "paraseq.linear_scan": median_call_microseconds(lambda: paraseq.linear_scan(A_small, b_small), device),
        "torch.ops.paraseq.linear_scan": median_call_microseconds(
            lambda: torch.ops.paraseq.linear_scan(A_small, b_small, None, "diag", False), device),
        "torch.add": median_call_microseconds(lambda: torch.add(A_small, b_small), device),
    }
    # An integration whose arithmetic is negligible (8 RK4 steps of 2^16 oscillators): its time is
    # the operator's fixed cost.
    N = 1 << 16
    oscillators = paraseq.fields.DampedOscillator(torch.rand(N, device=device) + 0.5, torch.rand(N, device=device) * 0.1)
    y0 = torch.randn(N, 2, device=device)
    ends = torch.tensor([0.0, 0.08], device=device)
    integrate = lambda: paraseq.odeint(oscillators, y0, ends, method="rk4", step_size=0.01)
    report["overhead_us"]["paraseq.odeint rk4, 2^16 x 8 steps"] = median_call_microseconds(integrate, device, calls=20)
    report["runtime_calls_per_call"] = {
        "torch.ops.paraseq.linear_scan": runtime_calls_per_call(
            lambda: torch.ops.paraseq.linear_scan(A_small, b_small, None, "diag", False), device),
        "torch.add": runtime_calls_per_call(lambda: torch.add(A_small, b_small), device),
        "paraseq.odeint rk4, 2^16 x 8 steps": runtime_calls_per_call(integrate, device, calls=5),
    }
    print(json.dumps(report, indent=1))
    if args.out:
        with open(args.out, "w") as out:
            json.dump(report, out, indent=1)


if __name__ == "__main__":
    main()
