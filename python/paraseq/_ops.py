"""Fake (meta) kernels of the torch.ops.paraseq operators.

The fake kernels give torch.compile the output shapes and dtypes without running anything, so each
operator is one opaque node of the graph. The autograd kernels are registered in C++
(src/adapters/torch/autograd.cpp): a Python autograd wrapper cost about 10 us of every call.
"""

import torch

from . import _library  # noqa: F401  (loads the operators before they are registered here)

ops = torch.ops.paraseq


def _contiguous_like(tensor):
    """A contiguous tensor of tensor's shape, dtype and device: the kernels' outputs are contiguous
    whatever the strides of their inputs (transposed, expanded)."""
    return torch.empty_like(tensor, memory_format=torch.contiguous_format)


# ---- linear_scan ----------------------------------------------------------------------------------

@torch.library.register_fake("paraseq::linear_scan")
def _linear_scan_fake(A, b, h0, structure, reverse):
    return _contiguous_like(b)


# ---- ParaGRU / ParaLSTM / ParaSLSTM Newton solves -------------------------------------------------

def newton_diagnostics_fake(u, with_residual):
    """The Newton operators' residual ([B] float64) and stats ([2] int64: iterations, the
    scan_backend index of the mode that ran), empty without with_residual; also the compiled
    cells' operators' (_compiled_cell.py)."""
    residual = u.new_empty((u.shape[0] if with_residual else 0,), dtype=torch.float64)
    stats = u.new_empty((2 if with_residual else 0,), dtype=torch.int64)
    return residual, stats


def _newton_fake(u, state_size, with_residual):
    return u.new_empty((u.shape[0], u.shape[1], state_size)), *newton_diagnostics_fake(u, with_residual)


@torch.library.register_fake("paraseq::para_gru")
def _para_gru_fake(u, a, h0, config, with_residual):
    return _newton_fake(u, a.shape[1], with_residual)


@torch.library.register_fake("paraseq::para_gru_head")
def _para_gru_head_fake(u, a, h0, config, with_residual):
    return _newton_fake(u, a.shape[1] * a.shape[2], with_residual)


@torch.library.register_fake("paraseq::para_lstm")
def _para_lstm_fake(u, a, p, state0, config, with_residual):
    return _newton_fake(u, 2 * a.shape[1], with_residual)


@torch.library.register_fake("paraseq::para_slstm")
def _para_slstm_fake(u, r, state0, eps, config, with_residual):
    return _newton_fake(u, 4 * r.shape[1], with_residual)


@torch.library.register_fake("paraseq::para_gru_backward")
def _para_gru_backward_fake(u, a, h0, h, grad_h):
    return _contiguous_like(u), _contiguous_like(a), u.new_empty((h.shape[0], h.shape[2]))


@torch.library.register_fake("paraseq::para_gru_head_backward")
def _para_gru_head_backward_fake(u, a, h0, h, grad_h):
    return _contiguous_like(u), _contiguous_like(a), u.new_empty((h.shape[0], h.shape[2]))


@torch.library.register_fake("paraseq::para_lstm_backward")
def _para_lstm_backward_fake(u, a, p, state0, state, grad_state):
    return (_contiguous_like(u), _contiguous_like(a), _contiguous_like(p),
            u.new_empty((state.shape[0], state.shape[2])))


@torch.library.register_fake("paraseq::para_slstm_backward")
def _para_slstm_backward_fake(u, r, state0, state, grad_state, eps):
    return _contiguous_like(u), _contiguous_like(r), u.new_empty((state.shape[0], state.shape[2]))


# ---- odeint ---------------------------------------------------------------------------------------

@torch.library.register_fake("paraseq::odeint")
def _odeint_fake(field, y0, t, params, shared, mlp_hidden, method, step_size, rtol, atol, max_steps):
    return y0.new_empty((y0.shape[0], t.shape[0], y0.shape[1]))


@torch.library.register_fake("paraseq::odeint_with_steps")
def _odeint_with_steps_fake(field, y0, t, params, shared, mlp_hidden, method, step_size, rtol, atol, max_steps):
    return (y0.new_empty((y0.shape[0], t.shape[0], y0.shape[1])),
            y0.new_empty((y0.shape[0],), dtype=torch.int32))


@torch.library.register_fake("paraseq::odeint_backward")
def _odeint_backward_fake(field, y0, t, params, shared, mlp_hidden, method, step_size, rtol, atol, max_steps, grad_y,
                          accepted=None):
    # The kernel returns contiguous gradients whatever the strides of its inputs.
    grad_params = y0.new_empty(params.shape if params is not None else (0,))
    grad_shared = y0.new_empty(shared.shape if shared is not None else (0,))
    return y0.new_empty(y0.shape), grad_params, grad_shared
