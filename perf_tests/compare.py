#!/usr/bin/env python3
"""paraseq against what users would pick instead, in one run on one device: cuDNN GRU, a PyTorch eager Newton solve, the PyTorch sequential loop, an eager RK4 loop,
torchdiffeq, diffrax (JAX, in a subprocess) and torch.compile of an unrolled RK4 loop (cold and
warm), next to paraseq's operators on the same workloads and the HBM floor from a copy measured in
the same run. Times are medians of CUDA-event (or wall-clock on CPU) timed calls after a warm-up
call. Writes one JSON report; perf_tests/report.py-style tables are printed.

    PARASEQ_TORCH_LIBRARY=... python3 perf_tests/compare.py --out compare.json          # H200 shapes
    python3 perf_tests/compare.py --quick                                               # tiny, any device

A baseline that is not installed is recorded as missing, not skipped silently.
"""

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

import torch

import paraseq


def timer(device):
    """Returns time_ms(fn, reps) -> (median ms, samples): one warm-up call, then reps timed calls."""
    def time_ms(fn, reps):
        fn()
        samples = []
        for _ in range(reps):
            if device == "cuda":
                start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                stop.record()
                stop.synchronize()
                samples.append(start.elapsed_time(stop))
            else:
                begin = time.perf_counter()
                fn()
                samples.append((time.perf_counter() - begin) * 1e3)
        return statistics.median(samples), samples
    return time_ms


# --- Recurrences: ParaGRU with diagonal recurrence (cells.md) on pre-projected u [B, T, 3H].

def gru_step(a, h, u_t):
    u_z, u_r, u_c = u_t.chunk(3, dim=-1)
    z = torch.sigmoid(a[0] * h + u_z)
    r = torch.sigmoid(a[1] * h + u_r)
    c = torch.tanh(a[2] * (h * r) + u_c)
    return z * c + (1 - z) * h


def gru_sequential(a, u):
    h = u.new_zeros(u.shape[0], u.shape[2] // 3)
    states = []
    for u_t in u.unbind(1):
        h = gru_step(a, h, u_t)
        states.append(h)
    return torch.stack(states, 1)


def gru_eager_newton(a, u, iterations=3):
    """DEER/ParaRNN in plain PyTorch: K Newton steps, each a Hillis–Steele doubling scan of the
    linearised recurrence (log2 T levels of out-of-place tensor ops)."""
    H = u.shape[2] // 3
    u_z, u_r, u_c = u[..., :H], u[..., H:2 * H], u[..., 2 * H:]
    h = gru_step(a, torch.zeros_like(u_z), u)  # the initial guess f(0, u_t)
    for _ in range(iterations):
        h_prev = torch.cat([torch.zeros_like(h[:, :1]), h[:, :-1]], 1)
        z = torch.sigmoid(a[0] * h_prev + u_z)
        r = torch.sigmoid(a[1] * h_prev + u_r)
        c = torch.tanh(a[2] * (h_prev * r) + u_c)
        f = z * c + (1 - z) * h_prev
        J = (1 - z) + (c - h_prev) * z * (1 - z) * a[0] + z * (1 - c * c) * a[2] * (r + h_prev * r * (1 - r) * a[1])
        A, b = J, f - J * h_prev  # h_t = A_t h_{t-1} + b_t
        shift = 1
        while shift < A.shape[1]:
            b = torch.cat([b[:, :shift], A[:, shift:] * b[:, :-shift] + b[:, shift:]], 1)
            A = torch.cat([A[:, :shift], A[:, shift:] * A[:, :-shift]], 1)
            shift *= 2
        h = b
    return h


def packed(backend):
    """The operators' packed config: 3 Newton iterations of `backend`, no residual checks."""
    return paraseq.NewtonConfig(max_iters=3, residual_fail=None, scan_backend=backend)._operator_config(eager=True)


def compare_gru(time_ms, device, shapes, reps, sequential_up_to):
    results = []
    for B, T, H in shapes:
        torch.manual_seed(0)
        a = (torch.rand(3, H, device=device) - 0.5)  # |a| <= 0.5
        u = torch.randn(B, T, 3 * H, device=device)
        shape = {"B": B, "T": T, "H": H}
        with torch.no_grad():
            states = {}
            for backend in ("sequential", "fused", "scan", "auto"):
                solve = lambda: torch.ops.paraseq.para_gru(u, a, None, packed(backend), False)[0]
                ms, _ = time_ms(solve, reps)
                states[backend] = solve()
                results.append({"workload": "gru_forward", **shape, "implementation": f"paraseq {backend}", "ms": ms,
                                "max_abs_diff_to_paraseq_sequential": float((states[backend] - states["sequential"]).abs().max())})
            reference = states.pop("sequential")
            del states
            ms, _ = time_ms(lambda: gru_eager_newton(a, u), reps)
            newton_error = float((gru_eager_newton(a, u) - reference).abs().max())
            results.append({"workload": "gru_forward", **shape, "implementation": "PyTorch eager Newton K=3 (doubling scan)",
                            "ms": ms, "max_abs_diff_to_paraseq_sequential": newton_error})
            if B * T <= sequential_up_to:
                ms, _ = time_ms(lambda: gru_sequential(a, u), 1)
                loop_error = float((gru_sequential(a, u) - reference).abs().max())
                results.append({"workload": "gru_forward", **shape, "implementation": "PyTorch sequential loop",
                                "ms": ms, "max_abs_diff_to_paraseq_sequential": loop_error})
            x = torch.randn(B, T, H, device=device)
            gru = torch.nn.GRU(H, H, batch_first=True).to(device)
            ms, _ = time_ms(lambda: gru(x), reps)
            results.append({"workload": "gru_forward", **shape, "implementation": "torch.nn.GRU (cuDNN, dense recurrence)"
                            if device == "cuda" else "torch.nn.GRU (dense recurrence)", "ms": ms})
        # Forward + backward: paraseq's operator with autograd, against the eager Newton's autograd.
        u_grad, a_grad = u.clone().requires_grad_(), a.clone().requires_grad_()
        weight = torch.randn(B, T, H, device=device)
        for backend in ("fused", "scan", "sequential"):
            def forward_backward():
                h, _ = torch.ops.paraseq.para_gru(u_grad, a_grad, None, packed(backend), False)
                torch.autograd.grad((h * weight).sum(), (u_grad, a_grad))
            ms, _ = time_ms(forward_backward, reps)
            results.append({"workload": "gru_forward_backward", **shape, "implementation": f"paraseq {backend}", "ms": ms})
        ms, _ = time_ms(lambda: torch.autograd.grad((gru_eager_newton(a_grad, u_grad) * weight).sum(), (u_grad, a_grad)), reps)
        results.append({"workload": "gru_forward_backward", **shape,
                        "implementation": "PyTorch eager Newton K=3, autograd", "ms": ms})
        floor_bytes = 16 * B * T * H  # read u (3 floats), write h (1 float) per element
        results.append({"workload": "gru_forward", **shape, "implementation": "HBM floor (read u, write h)",
                        "bytes": floor_bytes})
        del u, u_grad, x, gru
    return results


# --- Ensembles of ODEs: damped oscillators y'' = -k y - c y', per-trajectory k, c.

def oscillator(k, c):
    def field(t, y):
        return torch.stack([y[:, 1], -k * y[:, 0] - c * y[:, 1]], 1)
    return field


def rk4_loop(field, y, dt, steps):
    t = 0.0
    for _ in range(steps):
        k1 = field(t, y)
        k2 = field(t + dt / 2, y + dt / 2 * k1)
        k3 = field(t + dt / 2, y + dt / 2 * k2)
        k4 = field(t + dt, y + dt * k3)
        y = y + dt / 6 * (k1 + 2 * k2 + 2 * k3 + k4)
        t += dt
    return y


def compare_ode(time_ms, device, N, steps, compiled_steps, reps):
    torch.manual_seed(0)
    y0 = torch.rand(N, 2, device=device) * 2 - 1
    k = torch.rand(N, device=device) * 3 + 1
    c = torch.rand(N, device=device) * 0.45 + 0.05
    dt, t_end = 0.01, 0.01 * steps
    field = oscillator(k, c)
    ends = torch.tensor([0.0, t_end], dtype=torch.float64)
    shape = {"N": N, "steps": steps}
    results = []
    with torch.no_grad():
        oscillators = paraseq.fields.DampedOscillator(k, c)
        run = lambda: paraseq.odeint(oscillators, y0, ends, method="rk4", step_size=dt)[-1]
        ms, _ = time_ms(run, reps)
        reference = run()
        results.append({"workload": "rk4_fixed", **shape, "implementation": "paraseq odeint rk4", "ms": ms})
        ms, _ = time_ms(lambda: rk4_loop(field, y0, dt, steps), 1)
        results.append({"workload": "rk4_fixed", **shape, "implementation": "PyTorch eager RK4 loop", "ms": ms,
                        "max_abs_diff_to_paraseq": float((rk4_loop(field, y0, dt, steps) - reference).abs().max())})
        run = lambda: paraseq.odeint(oscillators, y0, ends, method="dopri5", rtol=1e-6, atol=1e-8)[-1]
        ms, _ = time_ms(run, reps)
        adaptive = run()
        results.append({"workload": "dopri5_adaptive", **shape, "implementation": "paraseq odeint dopri5", "ms": ms,
                        "max_abs_diff_to_rk4_dt_0.01": float((adaptive - reference).abs().max())})
        try:
            import torchdiffeq
            t = ends.to(device=device, dtype=y0.dtype)
            fixed = lambda: torchdiffeq.odeint(field, y0, t, method="rk4", options={"step_size": dt})[-1]
            ms, _ = time_ms(fixed, 1)
            results.append({"workload": "rk4_fixed", **shape, "implementation": "torchdiffeq rk4", "ms": ms,
                            "max_abs_diff_to_paraseq": float((fixed() - reference).abs().max())})
            ms, _ = time_ms(lambda: torchdiffeq.odeint(field, y0, t, method="dopri5", rtol=1e-6, atol=1e-8), 1)
            results.append({"workload": "dopri5_adaptive", **shape, "implementation": "torchdiffeq dopri5", "ms": ms})
        except ImportError:
            results.append({"workload": "rk4_fixed", "implementation": "torchdiffeq", "missing": "not installed"})

        # The seed's compiled-loop approach: the loop unrolled into one graph, compiled with fullgraph.
        short = {"N": N, "steps": compiled_steps}
        short_ends = torch.tensor([0.0, 0.01 * compiled_steps], dtype=torch.float64)
        run_short = lambda: paraseq.odeint(oscillators, y0, short_ends, method="rk4", step_size=dt)[-1]
        ms, _ = time_ms(run_short, reps)
        short_reference = run_short()
        results.append({"workload": "rk4_fixed", **short, "implementation": "paraseq odeint rk4", "ms": ms})
        compiled = torch.compile(lambda y: rk4_loop(field, y, dt, compiled_steps), fullgraph=True, dynamic=False)
        begin = time.perf_counter()
        compiled(y0)
        if device == "cuda":
            torch.cuda.synchronize()
        cold_s = time.perf_counter() - begin
        ms, _ = time_ms(lambda: compiled(y0), reps)
        results.append({"workload": "rk4_fixed", **short, "implementation": "torch.compile unrolled RK4 loop", "ms": ms,
                        "cold_compile_s": cold_s,
                        "max_abs_diff_to_paraseq": float((compiled(y0) - short_reference).abs().max())})
        ms, _ = time_ms(lambda: rk4_loop(field, y0, dt, compiled_steps), reps)
        results.append({"workload": "rk4_fixed", **short, "implementation": "PyTorch eager RK4 loop", "ms": ms})
    results.extend(diffrax_in_subprocess(N, steps, reps))
    return results


DIFFRAX = r"""
import json, statistics, sys, time
N, steps, reps = map(int, sys.argv[1:4])
import jax, jax.numpy as jnp, diffrax
key_y, key_k, key_c = jax.random.split(jax.random.PRNGKey(0), 3)
y0 = jax.random.uniform(key_y, (N, 2), minval=-1.0, maxval=1.0)
k = jax.random.uniform(key_k, (N,), minval=1.0, maxval=4.0)
c = jax.random.uniform(key_c, (N,), minval=0.05, maxval=0.5)
term = diffrax.ODETerm(lambda t, y, args: jnp.stack([y[1], -args[0] * y[0] - args[1] * y[1]]))
t_end = 0.01 * steps
def solve(solver, **options):
    one = lambda y, kk, cc: diffrax.diffeqsolve(term, solver, 0.0, t_end, 0.01, y, args=(kk, cc), **options).ys[-1]
    return jax.jit(jax.vmap(one))
cases = {"diffrax Tsit5, constant dt 0.01": ("rk4_fixed", solve(diffrax.Tsit5(), max_steps=steps + 1)),
         "diffrax Dopri5 + PID controller": ("dopri5_adaptive", solve(diffrax.Dopri5(),
             stepsize_controller=diffrax.PIDController(rtol=1e-6, atol=1e-8), max_steps=100000))}
out = []
for name, (workload, fn) in cases.items():
    begin = time.perf_counter(); fn(y0, k, c).block_until_ready(); cold = time.perf_counter() - begin
    samples = []
    for _ in range(reps):
        begin = time.perf_counter(); fn(y0, k, c).block_until_ready(); samples.append((time.perf_counter() - begin) * 1e3)
    out.append({"workload": workload, "N": N, "steps": steps, "implementation": name, "ms": statistics.median(samples),
                "cold_compile_s": cold, "jax": jax.__version__, "diffrax": diffrax.__version__})
print(json.dumps(out))
"""


def diffrax_in_subprocess(N, steps, reps):
    """JAX in its own process (it must not share the allocator with torch); preallocation off."""
    env = dict(os.environ, XLA_PYTHON_CLIENT_PREALLOCATE="false")
    done = subprocess.run([sys.executable, "-c", DIFFRAX, str(N), str(steps), str(reps)], capture_output=True, text=True,
                          env=env)
    if done.returncode != 0:
        reason = "not installed" if "ModuleNotFoundError" in done.stderr else done.stderr.strip().splitlines()[-1:]
        return [{"workload": "rk4_fixed", "implementation": "diffrax", "missing": reason}]
    return json.loads(done.stdout.strip().splitlines()[-1])


def copy_gbps(time_ms, device, elements):
    """Device-to-device copy bandwidth (bytes read + written per second): the HBM ceiling of this run."""
    src = torch.empty(elements, device=device)
    dst = torch.empty_like(src)
    ms, _ = time_ms(lambda: dst.copy_(src), 10)
    return 2 * elements * 4 / (ms * 1e-3) / 1e9


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--quick", action="store_true", help="tiny shapes: checks that every comparison runs")
    parser.add_argument("--gru-shapes", default="16x4096x1024,8x16384x512",
                        help="B x T x H shapes of the recurrence comparison, comma separated")
    parser.add_argument("--compiled-steps", type=int, default=32,
                        help="steps of the unrolled loop given to torch.compile (its cold compile grows with them)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    device, time_ms = args.device, timer(args.device)
    if args.quick:
        gru_shapes, ode_N, reps, sequential_up_to, copy_elements = [(2, 64, 16)], 256, 2, 1 << 30, 1 << 20
    else:
        gru_shapes = [tuple(int(x) for x in shape.split("x")) for shape in args.gru_shapes.split(",")]
        ode_N, reps, sequential_up_to, copy_elements = 1 << 20, 5, 16 * 4096, 1 << 28
    report = {"device": device, "gpu": torch.cuda.get_device_name() if device == "cuda" else platform.processor(),
              "torch": torch.__version__, "python": platform.python_version(),
              "paraseq_kokkos": torch.ops.paraseq.kokkos_configuration().splitlines()[:3]}
    report["copy_GBps"] = copy_gbps(time_ms, device, copy_elements)
    results = compare_gru(time_ms, device, gru_shapes, reps, sequential_up_to)
    results += compare_ode(time_ms, device, ode_N, 1000 if not args.quick else 20, args.compiled_steps if not args.quick else 4,
                           reps)
    for entry in results:
        if "bytes" in entry:
            entry["ms"] = entry["bytes"] / (report["copy_GBps"] * 1e9) * 1e3
    report["results"] = results
    for entry in results:
        shape = ",".join(f"{key}={entry[key]}" for key in ("B", "T", "H", "N", "steps") if key in entry)
        timing = f"{entry['ms']:10.3f} ms" if "ms" in entry else f"missing: {entry.get('missing')}"
        cold = f"  cold {entry['cold_compile_s']:.1f} s" if "cold_compile_s" in entry else ""
        diffs = "".join(f"  {key} {value:.2e}" for key, value in entry.items() if key.startswith("max_abs_diff"))
        print(f"{entry['workload']:22} {shape:28} {entry['implementation']:45} {timing}{cold}{diffs}")
    if args.out:
        with open(args.out, "w") as out:
            json.dump(report, out, indent=1)


if __name__ == "__main__":
    main()
