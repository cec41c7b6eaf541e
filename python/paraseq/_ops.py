"""Fake (meta) kernels and autograd formulas of the torch.ops.paraseq operators.

The fake kernels give torch.compile the output shapes and dtypes without running anything, so each
operator is one opaque node of the graph; the autograd formulas call the backward operators.
"""

import torch

from . import _library  # noqa: F401  (loads the operators before they are registered here)

ops = torch.ops.paraseq


# ---- linear_scan ----------------------------------------------------------------------------------

@torch.library.register_fake("paraseq::linear_scan")
def _linear_scan_fake(A, b, h0, structure, reverse):
    return torch.empty_like(b, memory_format=torch.contiguous_format)


def _outer(structure, left, right, block_size):
    """dA_t = left_t right_t^T in the layout of A: its diagonal, its k x k blocks, or all of it."""
    if structure == "diag":
        return left * right
    if structure == "dense":
        return left.unsqueeze(-1) * right.unsqueeze(-2)
    B, T, N = left.shape
    k = block_size
    return left.reshape(B, T, N // k, k).unsqueeze(-1) * right.reshape(B, T, N // k, k).unsqueeze(-2)


def _transpose_apply(structure, A_t, v):
    """A_t^T v for one time step (A_t [B, ...], v [B, N])."""
    if structure == "diag":
        return A_t * v
    if structure == "dense":
        return torch.einsum("bij,bi->bj", A_t, v)
    B, G, k, _ = A_t.shape
    return torch.einsum("bgij,bgi->bgj", A_t, v.reshape(B, G, k)).reshape(B, G * k)


def _shifted(x, first):
    """[first, x_0, ..., x_{T-2}] along time: the previous state of every step."""
    return torch.cat([first.unsqueeze(1), x[:, :-1]], dim=1)


def _linear_scan_setup(ctx, inputs, output):
    A, b, h0, structure, reverse = inputs
    ctx.structure, ctx.reverse, ctx.has_h0 = structure, reverse, h0 is not None
    ctx.save_for_backward(A, output, h0)


def _linear_scan_backward(ctx, grad):
    A, output, h0 = ctx.saved_tensors
    structure, reverse = ctx.structure, ctx.reverse
    # The adjoint of the forward recurrence is the reverse one over the same A, and vice versa.
    adjoint = ops.linear_scan(A, grad.contiguous(), None, structure, not reverse)
    if reverse:  # lambda_t = A_{t+1}^T lambda_{t+1} + b_t: dA_{t} = lambda_t adjoint_{t-1}^T, dA_0 = 0
        left, right = output, _shifted(adjoint, torch.zeros_like(adjoint[:, 0]))
    else:  # h_t = A_t h_{t-1} + b_t: dA_t = adjoint_t h_{t-1}^T
        left, right = adjoint, _shifted(output, h0 if h0 is not None else torch.zeros_like(output[:, 0]))
    dA = _outer(structure, left, right, A.shape[-1])
    dh0 = _transpose_apply(structure, A[:, 0], adjoint[:, 0]) if ctx.has_h0 else None
    return dA, adjoint, dh0, None, None


torch.library.register_autograd("paraseq::linear_scan", _linear_scan_backward, setup_context=_linear_scan_setup)


# ---- ParaGRU / ParaLSTM Newton solves -------------------------------------------------------------

def _newton_fake(u, state_size, with_residual):
    h = u.new_empty((u.shape[0], u.shape[1], state_size))
    residual = u.new_empty((u.shape[0] if with_residual else 0,), dtype=torch.float64)
    return h, residual


@torch.library.register_fake("paraseq::para_gru")
def _para_gru_fake(u, a, h0, max_iters, omega, residual_atol, residual_fail, picard_iters, picard_adapt,
                   scan_backend, with_residual):
    return _newton_fake(u, a.shape[1], with_residual)


@torch.library.register_fake("paraseq::para_lstm")
def _para_lstm_fake(u, a, p, state0, max_iters, omega, residual_atol, residual_fail, picard_iters, picard_adapt,
                    scan_backend, with_residual):
    return _newton_fake(u, 2 * a.shape[1], with_residual)


@torch.library.register_fake("paraseq::para_gru_backward")
def _para_gru_backward_fake(u, a, h0, h, grad_h):
    return torch.empty_like(u), torch.empty_like(a), h.new_empty((h.shape[0], h.shape[2]))


@torch.library.register_fake("paraseq::para_lstm_backward")
def _para_lstm_backward_fake(u, a, p, state0, state, grad_state):
    return (torch.empty_like(u), torch.empty_like(a), torch.empty_like(p),
            state.new_empty((state.shape[0], state.shape[2])))


def _gru_setup(ctx, inputs, output):
    u, a, h0 = inputs[:3]
    ctx.has_h0 = h0 is not None
    ctx.save_for_backward(u, a, h0, output[0])


def _gru_backward(ctx, grad_h, grad_residual):
    u, a, h0, h = ctx.saved_tensors
    du, da, dh0 = ops.para_gru_backward(u, a, h0, h, grad_h.contiguous())
    return (du, da, dh0 if ctx.has_h0 else None) + (None,) * 8


def _lstm_setup(ctx, inputs, output):
    u, a, p, state0 = inputs[:4]
    ctx.has_state0 = state0 is not None
    ctx.save_for_backward(u, a, p, state0, output[0])


def _lstm_backward(ctx, grad_state, grad_residual):
    u, a, p, state0, state = ctx.saved_tensors
    du, da, dp, dstate0 = ops.para_lstm_backward(u, a, p, state0, state, grad_state.contiguous())
    return (du, da, dp, dstate0 if ctx.has_state0 else None) + (None,) * 8


torch.library.register_autograd("paraseq::para_gru", _gru_backward, setup_context=_gru_setup)
torch.library.register_autograd("paraseq::para_lstm", _lstm_backward, setup_context=_lstm_setup)


# ---- odeint ---------------------------------------------------------------------------------------

@torch.library.register_fake("paraseq::odeint")
def _odeint_fake(field, y0, t, params, shared, mlp_hidden, method, step_size, rtol, atol, max_steps):
    return y0.new_empty((y0.shape[0], t.shape[0], y0.shape[1]))


@torch.library.register_fake("paraseq::odeint_backward")
def _odeint_backward_fake(field, y0, t, params, shared, mlp_hidden, method, step_size, rtol, atol, max_steps, grad_y):
    grad_params = torch.empty_like(params) if params is not None else y0.new_empty((0,))
    grad_shared = torch.empty_like(shared) if shared is not None else y0.new_empty((0,))
    return torch.empty_like(y0), grad_params, grad_shared


def _odeint_setup(ctx, inputs, output):
    field, y0, t, params, shared, *settings = inputs
    ctx.field, ctx.settings = field, settings
    ctx.has_params, ctx.has_shared = params is not None, shared is not None
    ctx.save_for_backward(y0, t, params, shared)


def _odeint_backward(ctx, grad_y):
    y0, t, params, shared = ctx.saved_tensors
    grad_y0, grad_params, grad_shared = ops.odeint_backward(ctx.field, y0, t, params, shared, *ctx.settings,
                                                            grad_y.contiguous())
    return (None, grad_y0, None, grad_params if ctx.has_params else None, grad_shared if ctx.has_shared else None,
            None, None, None, None, None, None)


torch.library.register_autograd("paraseq::odeint", _odeint_backward, setup_context=_odeint_setup)
