#!/usr/bin/env python3
"""paraseq against what users would pick instead, in one run on one device: cuDNN GRU, a PyTorch eager Newton solve,
the PyTorch sequential loop, an eager RK4 loop, torchdiffeq, diffrax (JAX, in a subprocess), torch.compile of an
unrolled RK4 loop (cold and warm), and the peer libraries pararnn-torch (its fused Newton GRU, its diagonal scan and
newton_apply forward and backward), accelerated-scan (diagonal linear scan), flash-linear-attention (its HGRN
kernels) and torchode, next to paraseq's operators on the same workloads and the HBM floor from a copy measured in
the same run; and (section "user") a GRU cell and an oscillator written as functions of one's own, through paraseq's
compiled and general paths, against the built-in ParaGRU and DampedOscillator and against pararnn-torch's
newton_apply (its autograd Jacobian) and torchdiffeq on the same functions; and (section "sweep") the ParaGRU
forward against T and against B x H and the one-channel scan against T, for the plots of docs/performance.md; and
(section "head") ParaGRU(mix="head") against pararnn-torch's with the same weights. Times are medians of CUDA-event (or wall-clock on CPU) timed calls after a first call, whose output is
the one checked against paraseq's; a call that takes more than a second is timed once. Writes one JSON report and
prints a table.

    PARASEQ_TORCH_LIBRARY=... python3 perf_tests/compare.py --out compare.json          # H200 shapes
    python3 perf_tests/compare.py --quick                                               # tiny, any device

A baseline or peer that is not installed, or cannot be imported here, is recorded as missing with the text of the
import error; one that refuses a shape or a device, or runs out of memory, as refused with its error's text. A peer's
results carry its version.
"""

import argparse
import importlib
import importlib.metadata
import json
import os
import platform
import statistics
import subprocess
import sys
import time
import warnings

import torch

import paraseq


def timer(device):
    """Returns time_ms(fn, reps, warmed=False) -> (median ms, samples): a warm-up call unless warmed, then up
    to reps timed calls (one when that call takes more than a second, as the long sequential loops do)."""
    def one_call(fn):
        if device == "cuda":
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            stop.record()
            stop.synchronize()
            return start.elapsed_time(stop)
        begin = time.perf_counter()
        fn()
        return (time.perf_counter() - begin) * 1e3

    def time_ms(fn, reps, warmed=False):
        if not warmed:
            fn()
        samples = [one_call(fn)]
        while len(samples) < reps and samples[0] <= 1e3:
            samples.append(one_call(fn))
        return statistics.median(samples), samples
    return time_ms


def error_text(error):
    """The first line of an exception, with its type: what the report records of a refusal or an import error."""
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0] if lines else ''}"[:500]


def measure(time_ms, entry, fn, reps, check=None):
    """entry with fn's median time and the differences check(first output) returns; where fn raises, the error as
    "refused" instead: an alternative that refuses a shape or device, or runs out of memory, is recorded and the
    run goes on."""
    try:
        first = fn()
        if check is not None:
            entry.update(check(first))
        del first
        entry["ms"], samples = time_ms(fn, reps, warmed=True)
        entry["calls"] = len(samples)
    except Exception as error:  # noqa: BLE001 - every failure of an alternative is a result to report
        entry["refused"] = error_text(error)
    if "refused" in entry and torch.cuda.is_initialized():
        torch.cuda.empty_cache()
    return entry


def max_abs_diff(x, y):
    return float((x - y).abs().max())


def max_rel_grad_diff(gradients, references):
    """The largest difference of a gradient from its reference, relative to the reference's largest entry (a
    weight's gradient sums over B T terms)."""
    return max(max_abs_diff(g, r) / float(r.abs().max()) for g, r in zip(gradients, references))


# --- Optional libraries: peers and baselines that users compare paraseq against.

PEERS = {  # name: the distributions whose versions its results carry
    "pararnn-torch": ("pararnn-torch",),
    "accelerated-scan": ("accelerated-scan",),
    "flash-linear-attention": ("flash-linear-attention", "fla-core"),
    "torchode": ("torchode",),
    "torchdiffeq": ("torchdiffeq",),
}


class Peers:
    """Imports each optional module once. A peer's results carry its version; a module that cannot be imported
    (not installed, a dependency missing, or, for accelerated_scan.warp, its CUDA build failing) gives one entry per
    workload and implementation with "missing": the import error's text."""

    def __init__(self):
        self.modules, self.missing = {}, []

    @staticmethod
    def version(peer):
        found = []
        for distribution in PEERS[peer]:
            try:
                found.append(f"{distribution} {importlib.metadata.version(distribution)}")
            except importlib.metadata.PackageNotFoundError:
                pass
        return ", ".join(found) or None

    def tag(self, peer):
        return {"peer": peer, "version": self.version(peer)}

    def module(self, peer, name, implementation, *workloads):
        """The module, or None once it is recorded missing for each of workloads."""
        if name not in self.modules:
            try:
                self.modules[name] = importlib.import_module(name)
            except Exception as error:  # noqa: BLE001 - an import failure of any kind is reported, not fatal
                self.modules[name] = error_text(error)
        module = self.modules[name]
        if not isinstance(module, str):
            return module
        for workload in workloads:
            entry = {"workload": workload, "implementation": implementation, **self.tag(peer), "module": name,
                     "missing": module}
            if entry not in self.missing:
                self.missing.append(entry)
        return None


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


def compare_gru(time_ms, device, shapes, reps, sequential_up_to, peers):
    for B, T, H in shapes:
        torch.manual_seed(0)
        a = (torch.rand(3, H, device=device) - 0.5)  # |a| <= 0.5
        u = torch.randn(B, T, 3 * H, device=device)
        shape = {"B": B, "T": T, "H": H}
        forward = {"workload": "gru_forward", **shape}
        with torch.no_grad():
            reference = torch.ops.paraseq.para_gru(u, a, None, packed("sequential"), False)[0]
            agrees = lambda h: {"max_abs_diff_to_paraseq_sequential": max_abs_diff(h, reference)}  # noqa: E731
            for backend in ("sequential", "fused", "one_pass", "scan", "auto"):
                solve = lambda: torch.ops.paraseq.para_gru(u, a, None, packed(backend), False)[0]  # noqa: E731
                yield measure(time_ms, {**forward, "implementation": f"paraseq {backend}"}, solve, reps, agrees)
            yield measure(time_ms, {**forward, "implementation": "PyTorch eager Newton K=3 (doubling scan)"},
                          lambda: gru_eager_newton(a, u), reps, agrees)
            if B * T <= sequential_up_to:
                yield measure(time_ms, {**forward, "implementation": "PyTorch sequential loop"},
                              lambda: gru_sequential(a, u), 1, agrees)
            # The seed library's fused Newton operator on the same u and a: the same cell (cells.md), initial guess
            # f(0, u_t), K = 3 and no residual check.
            if peers.module("pararnn-torch", "pararnn", "pararnn-torch newton_gru_fused (Triton)", "gru_forward"):
                fused = lambda: torch.ops.pararnn.newton_gru_fused(u, a[0], a[1], a[2], max_iters=3, omega=1.0)  # noqa: E731
                yield measure(time_ms, {**forward, "implementation": "pararnn-torch newton_gru_fused (Triton)",
                                        **peers.tag("pararnn-torch")}, fused, reps, agrees)
            del reference
            x = torch.randn(B, T, H, device=device)
            gru = torch.nn.GRU(H, H, batch_first=True).to(device)
            yield measure(time_ms, {**forward, "implementation": "torch.nn.GRU (cuDNN, dense recurrence)"
                                    if device == "cuda" else "torch.nn.GRU (dense recurrence)"},
                          lambda: gru(x), reps)
            del x, gru
        # Forward + backward: paraseq's operator with autograd, against the eager Newton's autograd.
        u_grad, a_grad = u.clone().requires_grad_(), a.clone().requires_grad_()
        weight = torch.randn(B, T, H, device=device)
        backward = {"workload": "gru_forward_backward", **shape}
        for backend in ("fused", "one_pass", "scan", "sequential"):
            def forward_backward():
                h = torch.ops.paraseq.para_gru(u_grad, a_grad, None, packed(backend), False)[0]
                return torch.autograd.grad((h * weight).sum(), (u_grad, a_grad))
            yield measure(time_ms, {**backward, "implementation": f"paraseq {backend}"}, forward_backward, reps)
        yield measure(time_ms, {**backward, "implementation": "PyTorch eager Newton K=3, autograd"},
                      lambda: torch.autograd.grad((gru_eager_newton(a_grad, u_grad) * weight).sum(),
                                                  (u_grad, a_grad)), reps)
        floor_bytes = 16 * B * T * H  # read u (3 floats), write h (1 float) per element
        yield {**forward, "implementation": "HBM floor (read u, write h)", "bytes": floor_bytes}
        del u, u_grad, weight
        yield from compare_gru_layer(time_ms, device, shape, reps, peers)


def compare_gru_layer(time_ms, device, shape, reps, peers):
    """A GRU layer from its input x [B, T, H]: the projection u = W_x x + b_x (one GEMM) and the recurrence.
    pararnn-torch's newton_apply takes x and projects inside, so paraseq's operator is timed after the same torch
    GEMM; both K = 3 without residual checks, each library's automatic backend."""
    B, T, H = shape["B"], shape["T"], shape["H"]
    torch.manual_seed(1)
    x = torch.randn(B, T, H, device=device)
    W = torch.randn(3 * H, H, device=device) / H ** 0.5
    bias = torch.randn(3 * H, device=device) * 0.1
    a = torch.rand(3, H, device=device) - 0.5
    weight = torch.randn(B, T, H, device=device)
    forward, backward = {"workload": "gru_layer_forward", **shape}, {"workload": "gru_layer_forward_backward", **shape}

    def paraseq_layer(x, W, bias, a):
        return torch.ops.paraseq.para_gru(torch.nn.functional.linear(x, W, bias), a, None, packed("auto"), False)[0]

    leaves = [t.clone().requires_grad_() for t in (x, W, bias, a)]
    paraseq_gradients = lambda: torch.autograd.grad((paraseq_layer(*leaves) * weight).sum(), leaves)  # noqa: E731
    with torch.no_grad():
        reference = paraseq_layer(x, W, bias, a)
        yield measure(time_ms, {**forward, "implementation": "paraseq auto"}, lambda: paraseq_layer(x, W, bias, a),
                      reps)
    reference_gradients = paraseq_gradients()
    yield measure(time_ms, {**backward, "implementation": "paraseq auto"}, paraseq_gradients, reps)

    name = "pararnn-torch newton_apply"
    pararnn = peers.module("pararnn-torch", "pararnn", name, forward["workload"], backward["workload"])
    if pararnn is None:
        return
    # The same cell: no clamp of a (pararnn's default clamps it to [-0.5, 0.5], which these a already satisfy).
    cell = pararnn.ParaGRU(H, H, max_recurrent_norm=None, device=device)
    with torch.no_grad():
        cell.W_x.weight.copy_(W)
        cell.W_x.bias.copy_(bias)
        for gate, row in zip((cell.a_z, cell.a_r, cell.a_n), a):
            gate.copy_(row)
    config = pararnn.compile_safe_config(scan_backend="auto")  # K = 3, no residual check or host sync

    def agrees(h):
        stats = pararnn.NewtonStats()  # the backend "auto" chose, from one more call
        pararnn.newton_apply(cell, x, config, stats=stats)
        return {"max_abs_diff_to_paraseq": max_abs_diff(h, reference), "scan_backend": stats.scan_backend}

    x_leaf = x.clone().requires_grad_()
    parameters = (cell.W_x.weight, cell.W_x.bias, cell.a_z, cell.a_r, cell.a_n)

    def pararnn_gradients():
        dx, dW, db, *da = torch.autograd.grad((pararnn.newton_apply(cell, x_leaf, config) * weight).sum(),
                                              (x_leaf, *parameters))
        return dx, dW, db, torch.stack(da)

    def gradients_agree(gradients):
        return {"max_rel_grad_diff_to_paraseq": max_rel_grad_diff(gradients, reference_gradients)}

    tag = peers.tag("pararnn-torch")
    with torch.no_grad():
        yield measure(time_ms, {**forward, "implementation": name, **tag},
                      lambda: pararnn.newton_apply(cell, x, config), reps, agrees)
    yield measure(time_ms, {**backward, "implementation": name, **tag}, pararnn_gradients, reps, gradients_agree)


# --- Diagonal linear recurrences h_t = A_t h_{t-1} + b_t (h_{-1} = 0) on [B, T, N].

def compare_scan(time_ms, device, shapes, reps, peers):
    """paraseq's linear_scan against the peers' diagonal scans, forward and forward + backward (the gradients of
    sum(h * w) to A and b). A in [0.5, 0.99) keeps h bounded and log A (HGRN's gate) finite. Each peer gets its
    inputs in its own layout, made before timing; its outputs are brought back for the checks. Yields each entry as
    it is measured, paraseq's first: a peer's compile (accelerated-scan's warp kernels compile when imported) cannot
    keep them from the report."""
    for B, T, N in shapes:
        torch.manual_seed(2)
        A = 0.5 + 0.49 * torch.rand(B, T, N, device=device)
        b = torch.randn(B, T, N, device=device)
        w = torch.randn(B, T, N, device=device)
        shape = {"B": B, "T": T, "N": N}
        forward, backward = {"workload": "scan_forward", **shape}, {"workload": "scan_forward_backward", **shape}
        with torch.no_grad():
            reference = paraseq.linear_scan(A, b)
            yield measure(time_ms, {**forward, "implementation": "paraseq linear_scan"},
                          lambda: paraseq.linear_scan(A, b), reps)
        leaves = (A.clone().requires_grad_(), b.clone().requires_grad_())
        scan_gradients = lambda: torch.autograd.grad((paraseq.linear_scan(*leaves) * w).sum(), leaves)  # noqa: E731
        reference_gradients = scan_gradients()
        yield measure(time_ms, {**backward, "implementation": "paraseq linear_scan"}, scan_gradients, reps)
        yield {**forward, "implementation": "HBM floor (read A, b, write h)", "bytes": 12 * B * T * N}

        def peer_scan(peer, module_name, implementation, scan, inputs, w_in_layout, h_back, gradients_back):
            """scan(module, *inputs) -> h in the peer's layout; h_back(h) and gradients_back(gradients of inputs)
            -> (dA, db) bring them to paraseq's for the checks."""
            module = peers.module(peer, module_name, implementation, forward["workload"], backward["workload"])
            if module is None:
                return
            tag = {"implementation": implementation, **peers.tag(peer)}
            with torch.no_grad():
                yield measure(time_ms, {**forward, **tag}, lambda: scan(module, *inputs), reps, lambda h: {
                    "max_abs_diff_to_paraseq": max_abs_diff(h_back(h), reference)})
            peer_leaves = [t.clone().requires_grad_() for t in inputs]
            gradients = lambda: torch.autograd.grad((scan(module, *peer_leaves) * w_in_layout).sum(), peer_leaves)  # noqa: E731
            yield measure(time_ms, {**backward, **tag}, gradients, reps, lambda g: {
                "max_abs_diff_to_paraseq": max(max_abs_diff(x, r) for x, r in zip(gradients_back(g), reference_gradients))})

        # pararnn-torch: its Triton operator pararnn::scan_diag, which has no autograd (its gradients go through
        # newton_apply); on the CPU also its eager Blelloch scan, its path there.
        same = lambda t: t  # noqa: E731
        for backend in ("triton",) + (("eager",) if device == "cpu" else ()):
            yield from peer_scan("pararnn-torch", "pararnn.solvers.scan", f"pararnn-torch scan_diag ({backend})",
                      lambda module, *inputs: module.scan_diag(*inputs, backend=backend), (A, b), w, same, tuple)
        # accelerated-scan takes [B, N, T] (time last). warp (CUDA C++, compiled when imported) takes a power-of-two
        # 32 <= T <= 65536 and refuses other T; scalar (Triton) any T; ref (its PyTorch reference) runs on the CPU.
        gates, tokens, w_time_last = (t.transpose(1, 2).contiguous() for t in (A, b, w))
        time_back = lambda t: t.transpose(1, 2)  # noqa: E731
        for kind in ("warp", "scalar") + (("ref",) if device == "cpu" else ()):
            yield from peer_scan("accelerated-scan", f"accelerated_scan.{kind}", f"accelerated-scan {kind}",
                      lambda module, *inputs: module.scan(*inputs), (gates, tokens), w_time_last, time_back,
                      lambda g: tuple(map(time_back, g)))
        # flash-linear-attention's HGRN kernels: h_t = exp(g_t) h_{t-1} + x_t, so x = b, g = log A and dA = dg / A.
        log_A = A.log()
        for kernel in ("chunk_hgrn", "fused_recurrent_hgrn"):
            yield from peer_scan("flash-linear-attention", "fla.ops.hgrn", f"flash-linear-attention {kernel}",
                      lambda module, *inputs: getattr(module, kernel)(*inputs)[0], (b, log_A), w, same,
                      lambda g: (g[1] / A, g[0]))
        del A, b, w, leaves, reference, reference_gradients, gates, tokens, w_time_last, log_A


# --- ParaGRU with head-block recurrence (mix="head"): dense d_head x d_head blocks per head.

def compare_head(time_ms, device, shapes, reps, peers):
    """The whole module (input projection and recurrence), K = 3, each library's automatic backend: paraseq's
    ParaGRU(mix="head") against pararnn-torch's ParaGRU(mix="head") with the same weights (orthogonal heads of gain
    0.25, pararnn's initialisation), forward and forward + backward (gradients of x and every parameter)."""
    for B, T, H, heads in shapes:
        torch.manual_seed(3)
        d_head = H // heads
        x = torch.randn(B, T, H, device=device)
        weight = torch.randn(B, T, H, device=device)
        shape = {"B": B, "T": T, "H": H, "n_heads": heads}
        forward, backward = {"workload": "gru_head_forward", **shape}, {"workload": "gru_head_forward_backward", **shape}
        module = paraseq.ParaGRU(H, H, config=paraseq.compile_safe_config(3), mix="head", n_heads=heads).to(device)
        with torch.no_grad():
            for gate in range(3):
                for head in range(heads):
                    torch.nn.init.orthogonal_(module.recurrent[gate, head], gain=0.25)
            reference = module(x)
            yield measure(time_ms, {**forward, "implementation": "paraseq ParaGRU(mix='head')"},
                          lambda: module(x), reps)
        x_leaf = x.clone().requires_grad_()
        leaves = (x_leaf, module.in_proj.weight, module.in_proj.bias, module.recurrent)
        paraseq_gradients = lambda: torch.autograd.grad((module(x_leaf) * weight).sum(), leaves)  # noqa: E731
        reference_gradients = paraseq_gradients()
        yield measure(time_ms, {**backward, "implementation": "paraseq ParaGRU(mix='head')"},
                      paraseq_gradients, reps)
        yield {**forward, "implementation": "HBM floor (read x, write h)", "bytes": 8 * B * T * H}
        name = "pararnn-torch ParaGRU(mix='head') newton_apply"
        pararnn = peers.module("pararnn-torch", "pararnn", name, forward["workload"], backward["workload"])
        if pararnn is not None:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # its note that mix="head" takes its factorised CUDA path
                cell = pararnn.ParaGRU(H, H, mix="head", n_heads=heads, device=device)
            with torch.no_grad():
                cell.W_x.weight.copy_(module.in_proj.weight)
                cell.W_x.bias.copy_(module.in_proj.bias)
                for gate, A in enumerate((cell.A_z, cell.A_r, cell.A_n)):
                    A.copy_(module.recurrent[gate])
            config = pararnn.compile_safe_config(scan_backend="auto")
            tag = {"implementation": name, **peers.tag("pararnn-torch")}
            parameters = (cell.W_x.weight, cell.W_x.bias, cell.A_z, cell.A_r, cell.A_n)

            def pararnn_gradients():
                dx, dW, db, *dA = torch.autograd.grad((pararnn.newton_apply(cell, x_leaf, config) * weight).sum(),
                                                      (x_leaf, *parameters))
                return dx, dW, db, torch.stack(dA)

            def gradients_agree(gradients):
                return {"max_rel_grad_diff_to_paraseq": max_rel_grad_diff(gradients, reference_gradients)}
            with torch.no_grad():
                yield measure(time_ms, {**forward, **tag}, lambda: pararnn.newton_apply(cell, x, config),
                              reps, lambda h: {"max_abs_diff_to_paraseq": max_abs_diff(h, reference)})
            yield measure(time_ms, {**backward, **tag}, pararnn_gradients, reps, gradients_agree)
        del x, weight, x_leaf, module, reference, reference_gradients


def packed_lengths(T, S, layout, generator):
    """S sequence lengths summing to T: "even" (proportional to draws uniform in [0.5, 1.5], a language-model
    batch of documents of similar size) or "skewed" (one sequence of T/4, the rest equal: the longest sets the size
    of a padded solve)."""
    if layout == "skewed":
        long = T // 4
        rest = [(T - long) // (S - 1)] * (S - 1)
        rest[-1] += T - long - sum(rest)
        return [long] + rest
    shares = torch.rand(S, generator=generator) + 0.5
    lengths = (shares / shares.sum() * T).floor().long().tolist()
    lengths[-1] += T - sum(lengths)
    return lengths


def compare_packed(time_ms, device, shapes, reps, peers):
    """Packed variable-length sequences (cu_seqlens, batch 1): the ParaGRU module (diagonal mix, K = 3, each
    library's automatic backend) of paraseq against pararnn-torch's with the same weights, forward and forward +
    backward (gradients of x, h0 and every parameter), one h0 per sequence. paraseq is given max_seqlen, as
    FlashAttention's callers pass it; pararnn-torch takes no such argument."""
    for T, H, S in shapes:
        for layout in ("even", "skewed"):
            generator = torch.Generator().manual_seed(4)
            lengths = packed_lengths(T, S, layout, generator)
            cu_seqlens = torch.tensor([0] + lengths, device=device).cumsum(0).to(torch.int32)
            longest = max(lengths)
            torch.manual_seed(4)
            x = torch.randn(1, T, H, device=device)
            h0 = torch.randn(S, H, device=device) * 0.5
            weight = torch.randn(1, T, H, device=device)
            shape = {"T": T, "H": H, "S": S, "lengths": layout, "longest": longest}
            forward = {"workload": "gru_packed_forward", **shape}
            backward = {"workload": "gru_packed_forward_backward", **shape}
            module = paraseq.ParaGRU(H, H, config=paraseq.compile_safe_config(3)).to(device)
            run = lambda x, h0: module(x, h0, cu_seqlens=cu_seqlens, max_seqlen=longest)  # noqa: E731
            with torch.no_grad():
                reference = run(x, h0)
                yield measure(time_ms, {**forward, "implementation": "paraseq ParaGRU"},
                              lambda: run(x, h0), reps)
            x_leaf, h0_leaf = x.clone().requires_grad_(), h0.clone().requires_grad_()
            leaves = (x_leaf, h0_leaf, module.in_proj.weight, module.in_proj.bias, module.recurrent)
            paraseq_gradients = lambda: torch.autograd.grad((run(x_leaf, h0_leaf) * weight).sum(), leaves)  # noqa: E731
            reference_gradients = paraseq_gradients()
            yield measure(time_ms, {**backward, "implementation": "paraseq ParaGRU"}, paraseq_gradients,
                          reps)
            yield {**forward, "implementation": "HBM floor (read x, write h)", "bytes": 8 * T * H}
            name = "pararnn-torch ParaGRU newton_apply"
            pararnn = peers.module("pararnn-torch", "pararnn", name, forward["workload"], backward["workload"])
            if pararnn is not None:
                cell = pararnn.ParaGRU(H, H, max_recurrent_norm=None, device=device)
                with torch.no_grad():
                    cell.W_x.weight.copy_(module.in_proj.weight)
                    cell.W_x.bias.copy_(module.in_proj.bias)
                    for gate, row in zip((cell.a_z, cell.a_r, cell.a_n), module.recurrent):
                        gate.copy_(row)
                config = pararnn.compile_safe_config(scan_backend="auto")
                tag = {"implementation": name, **peers.tag("pararnn-torch")}
                parameters = (cell.W_x.weight, cell.W_x.bias, cell.a_z, cell.a_r, cell.a_n)
                peer = lambda x, h0: pararnn.newton_apply(cell, x, config, h0=h0, cu_seqlens=cu_seqlens)  # noqa: E731

                def pararnn_gradients():
                    dx, dh0, dW, db, *da = torch.autograd.grad((peer(x_leaf, h0_leaf) * weight).sum(),
                                                               (x_leaf, h0_leaf, *parameters))
                    return dx, dh0, dW, db, torch.stack(da)

                def gradients_agree(gradients):
                    return {"max_rel_grad_diff_to_paraseq": max_rel_grad_diff(gradients, reference_gradients)}
                with torch.no_grad():
                    yield measure(time_ms, {**forward, **tag}, lambda: peer(x, h0), reps,
                                  lambda h: {"max_abs_diff_to_paraseq": max_abs_diff(h, reference)})
                yield measure(time_ms, {**backward, **tag}, pararnn_gradients, reps, gradients_agree)
            del x, h0, weight, x_leaf, h0_leaf, module, reference, reference_gradients


def compare_slstm(time_ms, device, shapes, reps, peers):
    """The ParaSLSTM module (diagonal mix, input projection included), K = 3 Newton iterations, each library's
    automatic backend: paraseq's (its operator) against pararnn-torch's with the same weights, forward and forward +
    backward (gradients of x and every parameter). Exact Newton with K = 3 does not solve the sLSTM's recurrence
    (docs/solvers.md, "ParaSLSTM's convergence"), so paraseq's automatic backend runs the loop for this cell; each
    library's distance to the sequential loop is recorded next to its time."""
    for B, T, H in shapes:
        torch.manual_seed(5)
        x = torch.randn(B, T, H, device=device)
        weight = torch.randn(B, T, H, device=device)
        shape = {"B": B, "T": T, "H": H}
        forward, backward = {"workload": "slstm_forward", **shape}, {"workload": "slstm_forward_backward", **shape}
        module = paraseq.ParaSLSTM(H, H, config=paraseq.compile_safe_config(3)).to(device)
        with torch.no_grad():
            torch.nn.init.uniform_(module.in_proj.bias, -0.5, 0.5)
            exact = paraseq.newton_apply(module, x, paraseq.NewtonConfig(scan_backend="sequential"))[..., 3, :]
            to_loop = lambda h: {"max_error_to_the_loop": max_abs_diff(h, exact)}  # noqa: E731
            yield measure(time_ms, {**forward, "implementation": "paraseq ParaSLSTM"}, lambda: module(x), reps, to_loop)
        x_leaf = x.clone().requires_grad_()
        leaves = (x_leaf, module.in_proj.weight, module.in_proj.bias, module.recurrent)
        yield measure(time_ms, {**backward, "implementation": "paraseq ParaSLSTM"},
                      lambda: torch.autograd.grad((module(x_leaf) * weight).sum(), leaves), reps)
        yield {**forward, "implementation": "HBM floor (read x, write h)", "bytes": 8 * B * T * H}
        name = "pararnn-torch ParaSLSTM newton_apply"
        pararnn = peers.module("pararnn-torch", "pararnn", name, forward["workload"], backward["workload"])
        if pararnn is not None:
            cell = pararnn.ParaSLSTM(H, H, device=device)
            with torch.no_grad():
                cell.W_x.weight.copy_(module.in_proj.weight)
                cell.W_x.bias.copy_(module.in_proj.bias)
                cell.R.copy_(module.recurrent)
            config = pararnn.compile_safe_config(scan_backend="auto")
            tag = {"implementation": name, **peers.tag("pararnn-torch")}
            peer = lambda x: pararnn.newton_apply(cell, x, config)[..., 3, :]  # noqa: E731
            with torch.no_grad():
                yield measure(time_ms, {**forward, **tag}, lambda: peer(x), reps, to_loop)
            parameters = (cell.W_x.weight, cell.W_x.bias, cell.R)
            yield measure(time_ms, {**backward, **tag},
                          lambda: torch.autograd.grad((peer(x_leaf) * weight).sum(), (x_leaf, *parameters)), reps)
        del x, weight, x_leaf, module, exact


def compare_decode(time_ms, device, shapes, tokens, reps, peers):
    """Decoding, token by token, without gradients: `tokens` calls of the module's step (ParaGRU's and ParaSLSTM's:
    the operator over one step, input projection included) against the loop of the step's equations in PyTorch
    (`sequential`) and pararnn-torch's `step` with the same weights. Times are of all `tokens` steps; ms_per_token
    divides them. Each entry records its last state's distance to paraseq's."""
    for B, H in shapes:
        torch.manual_seed(6)
        x = torch.randn(B, tokens, H, device=device)
        shape = {"B": B, "H": H, "tokens": tokens}
        gru = paraseq.ParaGRU(H, H).to(device)
        slstm = paraseq.ParaSLSTM(H, H).to(device)
        with torch.no_grad():
            for module in (gru, slstm):
                torch.nn.init.uniform_(module.in_proj.bias, -0.5, 0.5)

        def decode(step, state):
            def run():
                h = state
                for t in range(tokens):
                    h = step(h, x[:, t])
                return h
            return run

        def timed(entry, run, check):
            done = measure(time_ms, entry, run, reps, check)
            if "ms" in done:
                done["ms_per_token"] = done["ms"] / tokens
            return done
        cases = (("gru_decode", gru, None, lambda: gru.sequential(x)[:, -1]),
                 ("slstm_decode", slstm, torch.zeros(B, 4, H, device=device), lambda: slstm.sequential(x)[:, -1]))
        for workload, module, state, equations in cases:
            entry = {"workload": workload, **shape}
            with torch.no_grad():
                last = decode(module.step, state)()
                to_paraseq = lambda h: {"max_abs_diff_to_paraseq": max_abs_diff(h, last)}  # noqa: E731
                for name, run in ((f"paraseq {type(module).__name__}.step", decode(module.step, state)),
                                  ("PyTorch loop of the step's equations", equations)):
                    yield timed({**entry, "implementation": name}, run, to_paraseq)
            name = f"pararnn-torch {type(module).__name__}.step"
            pararnn = peers.module("pararnn-torch", "pararnn", name, workload)
            if pararnn is None:
                continue
            if module is gru:
                cell = pararnn.ParaGRU(H, H, max_recurrent_norm=None, device=device)
                with torch.no_grad():
                    for gate, row in zip((cell.a_z, cell.a_r, cell.a_n), module.recurrent):
                        gate.copy_(row)
                start = torch.zeros(B, H, device=device)
            else:
                cell = pararnn.ParaSLSTM(H, H, device=device)
                with torch.no_grad():
                    cell.R.copy_(module.recurrent)
                start = state
            with torch.no_grad():
                cell.W_x.weight.copy_(module.in_proj.weight)
                cell.W_x.bias.copy_(module.in_proj.bias)
                done = timed({**entry, "implementation": name, **peers.tag("pararnn-torch")}, decode(cell.step, start),
                             to_paraseq)
            yield done
        del x, gru, slstm


# --- Sweeps: time against T and against B x H, for docs/performance.md's plots.

SWEEP_BACKENDS = ("auto", "fused", "one_pass", "scan")  # paraseq's Newton backends in the sweeps


def compare_sweep(time_ms, device, gru_T, gru_BH, scan_T, reps, peers):
    """ParaGRU forward (K = 3) at B = 1, H = 256 against T and at T = 4096 against (B, H); the diagonal scan of one
    channel against T. paraseq's backends and the peers' kernels on the same inputs; gru_sweep_floor entries give
    the HBM floor (read u, write h). Entries are yielded as measured, so a time limit keeps the ones so far."""
    gru_shapes = [("gru_forward_against_T", (1, T, 256)) for T in gru_T]
    gru_shapes += [("gru_forward_against_BH", (B, 4096, H)) for B, H in gru_BH]
    for workload, (B, T, H) in gru_shapes:
        torch.manual_seed(0)
        a = torch.rand(3, H, device=device) - 0.5
        u = torch.randn(B, T, 3 * H, device=device)
        entry = {"workload": workload, "B": B, "T": T, "H": H}
        with torch.no_grad():
            reference = torch.ops.paraseq.para_gru(u, a, None, packed("auto"), False)[0]
            agrees = lambda h: {"max_abs_diff_to_paraseq_auto": max_abs_diff(h, reference)}  # noqa: E731
            for backend in SWEEP_BACKENDS:
                solve = lambda: torch.ops.paraseq.para_gru(u, a, None, packed(backend), False)[0]  # noqa: E731
                yield measure(time_ms, {**entry, "implementation": f"paraseq {backend}"}, solve, reps, agrees)
            name = "pararnn-torch newton_gru_fused (Triton)"
            if peers.module("pararnn-torch", "pararnn", name, workload):
                fused = lambda: torch.ops.pararnn.newton_gru_fused(u, a[0], a[1], a[2], max_iters=3, omega=1.0)  # noqa: E731
                yield measure(time_ms, {**entry, "implementation": name, **peers.tag("pararnn-torch")},
                              fused, reps, agrees)
        yield {**entry, "implementation": "HBM floor (read u, write h)", "bytes": 16 * B * T * H}
        del a, u, reference
    for T in scan_T:
        torch.manual_seed(2)
        A = 0.5 + 0.49 * torch.rand(1, T, 1, device=device)
        b = torch.randn(1, T, 1, device=device)
        entry = {"workload": "scan_against_T", "B": 1, "T": T, "N": 1}
        with torch.no_grad():
            reference = paraseq.linear_scan(A, b)
            agrees = lambda h: {"max_abs_diff_to_paraseq": max_abs_diff(h, reference)}  # noqa: E731
            yield measure(time_ms, {**entry, "implementation": "paraseq linear_scan"},
                          lambda: paraseq.linear_scan(A, b), reps)
            gates, tokens = A.transpose(1, 2).contiguous(), b.transpose(1, 2).contiguous()
            for kind in ("warp", "scalar"):
                name = f"accelerated-scan {kind}"
                module = peers.module("accelerated-scan", f"accelerated_scan.{kind}", name, entry["workload"])
                if module is not None:
                    yield measure(time_ms, {**entry, "implementation": name, **peers.tag("accelerated-scan")},
                                  lambda: module.scan(gates, tokens).transpose(1, 2), reps, agrees)
            name = "pararnn-torch scan_diag (triton)"
            module = peers.module("pararnn-torch", "pararnn.solvers.scan", name, entry["workload"])
            if module is not None:
                yield measure(time_ms, {**entry, "implementation": name, **peers.tag("pararnn-torch")},
                              lambda: module.scan_diag(A, b, backend="triton"), reps, agrees)
        yield {**entry, "implementation": "HBM floor (read A, b, write h)", "bytes": 12 * T}
        del A, b, reference, gates, tokens


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


def compare_ode(time_ms, device, N, steps, compiled_steps, reps, peers):
    torch.manual_seed(0)
    y0 = torch.rand(N, 2, device=device) * 2 - 1
    k = torch.rand(N, device=device) * 3 + 1
    c = torch.rand(N, device=device) * 0.45 + 0.05
    dt, t_end = 0.01, 0.01 * steps
    field = oscillator(k, c)
    ends = torch.tensor([0.0, t_end], dtype=torch.float64)
    shape = {"N": N, "steps": steps}
    fixed, adaptive = {"workload": "rk4_fixed", **shape}, {"workload": "dopri5_adaptive", **shape}
    with torch.no_grad():
        oscillators = paraseq.fields.DampedOscillator(k, c)
        run = lambda: paraseq.odeint(oscillators, y0, ends, method="rk4", step_size=dt)[-1]  # noqa: E731
        reference = run()
        yield measure(time_ms, {**fixed, "implementation": "paraseq odeint rk4"}, run, reps)
        to_paraseq = lambda y: {"max_abs_diff_to_paraseq": max_abs_diff(y, reference)}  # noqa: E731
        to_rk4 = lambda y: {"max_abs_diff_to_rk4_dt_0.01": max_abs_diff(y, reference)}  # noqa: E731
        yield measure(time_ms, {**fixed, "implementation": "PyTorch eager RK4 loop"},
                      lambda: rk4_loop(field, y0, dt, steps), 1, to_paraseq)
        yield measure(time_ms, {**adaptive, "implementation": "paraseq odeint dopri5"},
                      lambda: paraseq.odeint(oscillators, y0, ends, method="dopri5", rtol=1e-6, atol=1e-8)[-1],
                      reps, to_rk4)
        t = ends.to(device=device, dtype=y0.dtype)
        torchdiffeq = peers.module("torchdiffeq", "torchdiffeq", "torchdiffeq", "rk4_fixed", "dopri5_adaptive")
        if torchdiffeq is not None:
            tag = peers.tag("torchdiffeq")
            yield measure(time_ms, {**fixed, "implementation": "torchdiffeq rk4", **tag},
                          lambda: torchdiffeq.odeint(field, y0, t, method="rk4", options={"step_size": dt})[-1],
                          1, to_paraseq)
            yield measure(time_ms, {**adaptive, "implementation": "torchdiffeq dopri5", **tag},
                          lambda: torchdiffeq.odeint(field, y0, t, method="dopri5", rtol=1e-6, atol=1e-8)[-1],
                          1, to_rk4)
        # torchode steps each trajectory on its own, as paraseq does. It has no RK4: the fixed-step workload runs
        # its Tsit5 (5th order) at the same dt, as diffrax's does.
        torchode = peers.module("torchode", "torchode", "torchode", "rk4_fixed", "dopri5_adaptive")
        if torchode is not None:
            tag = peers.tag("torchode")
            term = torchode.ODETerm(field)
            dt0 = torch.full((N,), dt, device=device, dtype=y0.dtype)
            yield measure(time_ms, {**fixed, "implementation": "torchode Tsit5, constant dt 0.01", **tag},
                          lambda: torchode.solve_ivp(term, y0, t, method="tsit5", dt0=dt0,
                                                     controller=torchode.FixedStepController()).ys[:, -1],
                          reps, to_rk4)
            controller = torchode.IntegralController(atol=1e-8, rtol=1e-6, term=term)
            yield measure(time_ms, {**adaptive, "implementation": "torchode Dopri5 + integral controller",
                                    **tag},
                          lambda: torchode.solve_ivp(term, y0, t, method="dopri5", controller=controller).ys[:, -1],
                          reps, to_rk4)

        # The seed's compiled-loop approach: the loop unrolled into one graph, compiled with fullgraph.
        short = {"N": N, "steps": compiled_steps}
        short_ends = torch.tensor([0.0, 0.01 * compiled_steps], dtype=torch.float64)
        run_short = lambda: paraseq.odeint(oscillators, y0, short_ends, method="rk4", step_size=dt)[-1]
        ms, _ = time_ms(run_short, reps)
        short_reference = run_short()
        yield {"workload": "rk4_fixed", **short, "implementation": "paraseq odeint rk4", "ms": ms}
        compiled = torch.compile(lambda y: rk4_loop(field, y, dt, compiled_steps), fullgraph=True, dynamic=False)
        begin = time.perf_counter()
        compiled(y0)
        if device == "cuda":
            torch.cuda.synchronize()
        cold_s = time.perf_counter() - begin
        ms, _ = time_ms(lambda: compiled(y0), reps)
        yield {"workload": "rk4_fixed", **short, "implementation": "torch.compile unrolled RK4 loop", "ms": ms,
               "cold_compile_s": cold_s,
               "max_abs_diff_to_paraseq": float((compiled(y0) - short_reference).abs().max())}
        ms, _ = time_ms(lambda: rk4_loop(field, y0, dt, compiled_steps), reps)
        yield {"workload": "rk4_fixed", **short, "implementation": "PyTorch eager RK4 loop", "ms": ms}
    yield from diffrax_in_subprocess(N, steps, reps)


# --- Functions and cells of your own: the compiled and the general path against the built-in equivalent and the
# peers' own paths for a user function (pararnn's newton_apply with an autograd Jacobian, torchdiffeq).

class UserGRU(torch.nn.Module):
    """ParaGRU's equations (gru_step) written as a cell of one's own: pararnn's RNNCell protocol."""
    jac_structure = "diag"

    def __init__(self, W, bias, a):
        super().__init__()
        self.hidden_size = self.d_h = a.shape[1]  # pararnn's solvers read d_h, its alias of hidden_size
        self.in_proj = torch.nn.Linear(W.shape[1], W.shape[0], device=W.device)
        with torch.no_grad():
            self.in_proj.weight.copy_(W)
            self.in_proj.bias.copy_(bias)
        self.a = torch.nn.Parameter(a.clone())

    def step(self, h_prev, x):
        return gru_step(self.a, h_prev, self.in_proj(x))


def compare_user(time_ms, device, parts, gru_shape, N, steps, reps, peers):
    if "cell" in parts:
        yield from compare_user_cell(time_ms, device, gru_shape, reps, peers)
    if "field" in parts:
        yield from compare_user_field(time_ms, device, N, steps, reps, peers)


def compare_user_cell(time_ms, device, gru_shape, reps, peers):
    B, T, H = gru_shape
    torch.manual_seed(2)
    x = torch.randn(B, T, H, device=device)
    W = torch.randn(3 * H, H, device=device) / H ** 0.5
    bias = torch.randn(3 * H, device=device) * 0.1
    a = torch.rand(3, H, device=device) - 0.5
    weight = torch.randn(B, T, H, device=device)
    shape = {"B": B, "T": T, "H": H}
    forward, backward = {"workload": "user_gru_forward", **shape}, {"workload": "user_gru_forward_backward", **shape}
    cell = UserGRU(W, bias, a)
    config = paraseq.compile_safe_config(3)
    builtin_leaves = [t.clone().requires_grad_() for t in (x, W, bias, a)]

    def builtin(x, W, bias, a):
        return torch.ops.paraseq.para_gru(torch.nn.functional.linear(x, W, bias), a, None, packed("auto"), False)[0]

    with torch.no_grad():
        reference = builtin(x, W, bias, a)
    reference_gradients = torch.autograd.grad((builtin(*builtin_leaves) * weight).sum(), builtin_leaves)
    x_leaf = x.clone().requires_grad_()
    leaves = (x_leaf, cell.in_proj.weight, cell.in_proj.bias, cell.a)
    agrees = lambda h: {"max_abs_diff_to_paraseq_builtin": max_abs_diff(h, reference)}  # noqa: E731

    def gradients_agree(gradients):
        return {"max_rel_grad_diff_to_paraseq_builtin": max_rel_grad_diff(gradients, reference_gradients)}

    def user_gradients(solve):
        return lambda: torch.autograd.grad((solve(x_leaf) * weight).sum(), leaves)

    with torch.no_grad():
        yield measure(time_ms, {**forward, "implementation": "paraseq ParaGRU (built-in)"},
                      lambda: builtin(x, W, bias, a), reps)
    yield measure(time_ms, {**backward, "implementation": "paraseq ParaGRU (built-in)"},
                  lambda: torch.autograd.grad((builtin(*builtin_leaves) * weight).sum(), builtin_leaves),
                  reps)
    for path, compiled in (("compiled", True), ("general", False)):
        solve = lambda x, compiled=compiled: paraseq.newton_apply(cell, x, config, compile=compiled)  # noqa: E731
        name = f"paraseq user cell, {path} path"
        with torch.no_grad():
            # the first call compiles the generated extension (or loads it from the cache): not timed
            yield measure(time_ms, {**forward, "implementation": name}, lambda: solve(x), reps, agrees)
        yield measure(time_ms, {**backward, "implementation": name}, user_gradients(solve), reps,
                      gradients_agree)
    name = "pararnn-torch newton_apply, user cell (autograd Jacobian)"
    pararnn = peers.module("pararnn-torch", "pararnn", name, forward["workload"], backward["workload"])
    if pararnn is not None:
        tag = peers.tag("pararnn-torch")
        pararnn_config = pararnn.compile_safe_config(scan_backend="auto")
        solve = lambda x: pararnn.newton_apply(cell, x, pararnn_config)  # noqa: E731
        with torch.no_grad():
            yield measure(time_ms, {**forward, "implementation": name, **tag}, lambda: solve(x), reps,
                          agrees)
        yield measure(time_ms, {**backward, "implementation": name, **tag}, user_gradients(solve), reps,
                      gradients_agree)


def compare_user_field(time_ms, device, N, steps, reps, peers):
    # The compiled path traces func on one trajectory's row, so the coefficients are shared (0-d): a closure over
    # per-trajectory tensors [N] takes the general path.
    y0 = torch.rand(N, 2, device=device) * 2 - 1
    k, c = torch.tensor(2.5, device=device), torch.tensor(0.3, device=device)
    dt = 0.01
    ends = torch.tensor([0.0, dt * steps], dtype=torch.float64)
    field = oscillator(k, c)
    ode = {"workload": "user_rk4_fixed", "N": N, "steps": steps}
    ode_gradient = {"workload": "user_rk4_fixed_gradient", "N": N, "steps": steps}
    oscillators = paraseq.fields.DampedOscillator(k, c)
    with torch.no_grad():
        ode_reference = paraseq.odeint(oscillators, y0, ends, method="rk4", step_size=dt)[-1]
    to_builtin = lambda y: {"max_abs_diff_to_paraseq_builtin": max_abs_diff(y, ode_reference)}  # noqa: E731
    y0_leaf = y0.clone().requires_grad_()

    def final_state_gradient(integrate):
        return lambda: torch.autograd.grad(integrate(y0_leaf).sum(), y0_leaf)

    runs = (("paraseq DampedOscillator (built-in)",
             lambda y: paraseq.odeint(oscillators, y, ends, method="rk4", step_size=dt)[-1]),
            ("paraseq user function, compiled path",
             lambda y: paraseq.odeint(field, y, ends, method="rk4", step_size=dt, compile=True)[-1]),
            ("paraseq user function, general path",
             lambda y: paraseq.odeint(field, y, ends, method="rk4", step_size=dt, compile=False)[-1]))
    for name, integrate in runs:
        with torch.no_grad():
            yield measure(time_ms, {**ode, "implementation": name}, lambda: integrate(y0), reps, to_builtin)
        yield measure(time_ms, {**ode_gradient, "implementation": name}, final_state_gradient(integrate),
                      reps)
    torchdiffeq = peers.module("torchdiffeq", "torchdiffeq", "torchdiffeq rk4, the same function", ode["workload"])
    if torchdiffeq is not None:
        t = ends.to(device=device, dtype=y0.dtype)
        with torch.no_grad():
            yield measure(time_ms, {**ode, "implementation": "torchdiffeq rk4, the same function",
                                    **peers.tag("torchdiffeq")},
                          lambda: torchdiffeq.odeint(field, y0, t, method="rk4", options={"step_size": dt})[-1],
                          1, to_builtin)


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
    if done.returncode != 0:  # the last line of the traceback: the import error, or what diffrax raised
        reason = (done.stderr.strip().splitlines() or ["no output"])[-1]
        outcome = "missing" if reason.startswith(("ModuleNotFoundError", "ImportError")) else "refused"
        return [{"workload": workload, "implementation": "diffrax", outcome: reason}
                for workload in ("rk4_fixed", "dopri5_adaptive")]
    return json.loads(done.stdout.strip().splitlines()[-1])


def copy_gbps(time_ms, device, elements):
    """Device-to-device copy bandwidth (bytes read + written per second): the HBM ceiling of this run."""
    src = torch.empty(elements, device=device)
    dst = torch.empty_like(src)
    ms, _ = time_ms(lambda: dst.copy_(src), 10)
    return 2 * elements * 4 / (ms * 1e-3) / 1e9


SECTIONS = ("gru", "scan", "ode", "user", "sweep", "head", "packed", "slstm", "decode")


def shapes(text):
    return [tuple(int(x) for x in shape.split("x")) for shape in text.split(",")]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--quick", action="store_true", help="tiny shapes: checks that every comparison runs")
    parser.add_argument("--gru-shapes", default="16x4096x1024,8x16384x512,1x65536x256,1x262144x1,1x1048576x64,4x262144x128",
                        help="B x T x H shapes of the recurrence comparison, comma separated")
    parser.add_argument("--scan-shapes", default="16x4096x1024,1x65536x256,1x262144x1,1x1048576x64,4x262144x128",
                        help="B x T x N shapes of the diagonal linear scan comparison, comma separated")
    parser.add_argument("--head-shapes", default="16x4096x512x64,4x65536x256x8,16x4096x1024x32",
                        help="B x T x H x n_heads shapes of the mix='head' ParaGRU comparison, comma separated")
    parser.add_argument("--packed-shapes", default="65536x256x64,16384x1024x16",
                        help="T x H x S shapes of the packed-sequence ParaGRU comparison (S sequences, T steps in all)")
    parser.add_argument("--slstm-shapes", default="16x4096x256,1x65536x256",
                        help="B x T x H shapes of the ParaSLSTM comparison, comma separated")
    parser.add_argument("--decode-shapes", default="1x1024,16x1024,64x256",
                        help="B x H shapes of the decoding comparison (token by token), comma separated")
    parser.add_argument("--decode-tokens", type=int, default=64, help="tokens decoded per timed call")
    parser.add_argument("--user-gru-shape", default="16x4096x1024",
                        help="B x T x H of the user-cell comparison (a GRU step of one's own against ParaGRU)")
    parser.add_argument("--user-parts", default="cell,field",
                        help="the user section's comparisons, comma separated, of cell (a GRU step) and field (RK4)")
    parser.add_argument("--trajectories", type=int, default=1 << 20,
                        help="N, the ODE systems of the ode and user sections")
    parser.add_argument("--compiled-steps", type=int, default=32,
                        help="steps of the unrolled loop given to torch.compile (its cold compile grows with them)")
    parser.add_argument("--sections", default=",".join(SECTIONS),
                        help=f"the comparisons to run, comma separated, of {', '.join(SECTIONS)}")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    sections = args.sections.split(",")
    if args.trajectories < 1:
        parser.error(f"--trajectories: {args.trajectories} is not a positive count")
    if args.decode_tokens < 1:
        parser.error(f"--decode-tokens: {args.decode_tokens} is not a positive count")
    user_parts = args.user_parts.split(",")
    if not set(user_parts) <= {"cell", "field"}:
        parser.error(f"--user-parts: {args.user_parts!r} names a part other than cell, field")
    if not set(sections) <= set(SECTIONS):
        parser.error(f"--sections: {args.sections!r} names a section other than {', '.join(SECTIONS)}")
    device, time_ms = args.device, timer(args.device)
    if args.quick:
        gru_shapes, scan_shapes, ode_N, reps = [(2, 64, 16)], [(2, 64, 8), (1, 100, 4)], 256, 2
        user_gru_shape = (2, 64, 16)
        sweep_gru_T, sweep_gru_BH, sweep_scan_T = [64, 256], [(2, 8)], [1 << 10, 1 << 12]
        head_shapes, packed_shapes, slstm_shapes = [(2, 64, 16, 4)], [(64, 8, 4)], [(2, 32, 8)]
        decode_shapes, decode_tokens = [(2, 8)], 4
        sequential_up_to, copy_elements, ode_steps, compiled_steps = 1 << 30, 1 << 20, 20, 4
    else:
        gru_shapes, scan_shapes, ode_N, reps = shapes(args.gru_shapes), shapes(args.scan_shapes), args.trajectories, 5
        user_gru_shape = shapes(args.user_gru_shape)[0]
        sweep_gru_T = [1 << k for k in range(12, 21, 2)]
        sweep_gru_BH = [(1, 256), (4, 256), (16, 256), (16, 1024), (64, 1024)]
        sweep_scan_T = [1 << k for k in range(16, 27, 2)]
        head_shapes, packed_shapes = shapes(args.head_shapes), shapes(args.packed_shapes)
        slstm_shapes = shapes(args.slstm_shapes)
        decode_shapes, decode_tokens = shapes(args.decode_shapes), args.decode_tokens
        sequential_up_to, copy_elements, ode_steps, compiled_steps = 16 * 4096, 1 << 28, 1000, args.compiled_steps
    report = {"device": device, "gpu": torch.cuda.get_device_name() if device == "cuda" else platform.processor(),
              "torch": torch.__version__, "python": platform.python_version(),
              "paraseq_kokkos": torch.ops.paraseq.kokkos_configuration().splitlines()[:3],
              "peers": {peer: Peers.version(peer) or "not installed" for peer in PEERS}}
    report["copy_GBps"] = copy_gbps(time_ms, device, copy_elements)
    peers, results = Peers(), []
    runs = {"gru": lambda: compare_gru(time_ms, device, gru_shapes, reps, sequential_up_to, peers),
            "scan": lambda: compare_scan(time_ms, device, scan_shapes, reps, peers),
            "ode": lambda: compare_ode(time_ms, device, ode_N, ode_steps, compiled_steps, reps, peers),
            "head": lambda: compare_head(time_ms, device, head_shapes, reps, peers),
            "packed": lambda: compare_packed(time_ms, device, packed_shapes, reps, peers),
            "slstm": lambda: compare_slstm(time_ms, device, slstm_shapes, reps, peers),
            "decode": lambda: compare_decode(time_ms, device, decode_shapes, decode_tokens, reps, peers),
            "sweep": lambda: compare_sweep(time_ms, device, sweep_gru_T, sweep_gru_BH, sweep_scan_T, reps, peers),
            "user": lambda: compare_user(time_ms, device, user_parts, user_gru_shape, ode_N, ode_steps, reps, peers)}
    def save():
        report["results"] = results + peers.missing
        if args.out:
            with open(args.out, "w") as out:
                json.dump(report, out, indent=1)

    for section in (name for name in runs if name in sections):
        for entry in runs[section]():
            if "bytes" in entry:
                entry["ms"] = entry["bytes"] / (report["copy_GBps"] * 1e9) * 1e3
            results.append(entry)
            # Saved after every entry (every section yields them one at a time): a run stopped by a time
            # limit keeps what it measured.
            save()
        save()  # with the peers that a section found missing after its last entry
    for entry in report["results"]:
        shape = ",".join(f"{key}={entry[key]}" for key in ("B", "T", "H", "n_heads", "S", "lengths", "N", "steps", "tokens")
                         if key in entry)
        outcome = next((key for key in ("missing", "refused") if key in entry), None)
        timing = f"{outcome}: {entry[outcome]}" if outcome else f"{entry['ms']:10.3f} ms"
        cold = f"  cold {entry['cold_compile_s']:.1f} s" if "cold_compile_s" in entry else ""
        diffs = "".join(f"  {key} {value:.2e}" for key, value in entry.items() if key.startswith("max_"))
        print(f"{entry['workload']:26} {shape:28} {entry['implementation']:45} {timing}{cold}{diffs}")


if __name__ == "__main__":
    main()
