"""ParaGRU and ParaLSTM solved by Newton's method (the C++ newton_solve), and their configuration."""

import dataclasses
import math
from typing import NamedTuple, Optional

import torch
import torch.nn.functional as F
from torch import nn

from ._ops import ops

SCAN_BACKENDS = ("auto", "fused", "scan", "sequential")


@dataclasses.dataclass(frozen=True)
class NewtonConfig:
    """How the Newton solve runs (docs/solvers.md, "Configuration").

    scan_backend: "auto" (the measured rule), "fused" (one kernel, windows on chip), "scan" (one
    ordered scan per iteration) or "sequential" (the loop over t). residual_atol, residual_fail and
    picard_adapt read the residual on the host: they are eager-only and ignored while
    torch.compiler.is_compiling().
    """
    max_iters: int = 3
    omega: float = 1.0
    residual_atol: Optional[float] = None
    residual_fail: Optional[float] = None
    picard_iters: int = 0
    picard_adapt: bool = False
    scan_backend: str = "auto"

    def __post_init__(self):
        if self.scan_backend not in SCAN_BACKENDS:
            raise ValueError(f"NewtonConfig: argument 'scan_backend' is {self.scan_backend!r}, "
                             f"expected one of {', '.join(map(repr, SCAN_BACKENDS))}")


def compile_safe_config(scan_backend="auto", max_iters=3):
    """A fixed iteration count and no residual check: no host synchronisation, one graph."""
    return NewtonConfig(max_iters=max_iters, scan_backend=scan_backend)


class NewtonDivergenceError(RuntimeError):
    """max |F| exceeded NewtonConfig.residual_fail after the last iteration (or was not finite)."""


class NewtonStats(NamedTuple):
    residual: torch.Tensor  # [B], float64: max over t and channels of |F_t(h)| at the result


def _init_uniform(tensor, hidden_size):
    bound = 1.0 / math.sqrt(hidden_size)
    with torch.no_grad():
        tensor.uniform_(-bound, bound)


class ParaGRU(nn.Module):
    """h' = z c + (1 - z) h with z = s(a_z h + u_z), r = s(a_r h + u_r), c = tanh(a_c (h r) + u_c),
    u = in_proj(x) with gates (z, r, c); recurrent = (a_z, a_r, a_c)."""

    def __init__(self, input_size, hidden_size, bias=True, config=None):
        super().__init__()
        self.input_size, self.hidden_size = input_size, hidden_size
        self.in_proj = nn.Linear(input_size, 3 * hidden_size, bias=bias)
        self.recurrent = nn.Parameter(torch.empty(3, hidden_size))
        _init_uniform(self.recurrent, hidden_size)
        self.config = config if config is not None else NewtonConfig()

    def forward(self, x, h0=None):
        return newton_apply(self, x, self.config, h0=h0)

    def sequential(self, x, h0=None):
        """The reference: the loop over t in PyTorch, in the dtype of x and the module."""
        u = self.in_proj(x)
        a_z, a_r, a_c = self.recurrent
        h = h0 if h0 is not None else u.new_zeros((u.shape[0], self.hidden_size))
        states = []
        for u_t in u.unbind(1):
            u_z, u_r, u_c = u_t.chunk(3, dim=-1)
            z = torch.sigmoid(a_z * h + u_z)
            r = torch.sigmoid(a_r * h + u_r)
            c = torch.tanh(a_c * (h * r) + u_c)
            h = z * c + (1 - z) * h
            states.append(h)
        return torch.stack(states, dim=1)


class ParaLSTM(nn.Module):
    """c' = f c + (1 - f) c~, h' = o tanh(c') with f = s(a_f h + p_f c + u_f), c~ = tanh(a_c h + u_c),
    o = s(a_o h + p_o c' + u_o), u = in_proj(x) with gates (f, c, o); recurrent = (a_f, a_c, a_o),
    peephole = (p_f, p_o)."""

    def __init__(self, input_size, hidden_size, config=None):
        super().__init__()
        self.input_size, self.hidden_size = input_size, hidden_size
        self.in_proj = nn.Linear(input_size, 3 * hidden_size)
        self.recurrent = nn.Parameter(torch.empty(3, hidden_size))
        self.peephole = nn.Parameter(torch.empty(2, hidden_size))
        _init_uniform(self.recurrent, hidden_size)
        _init_uniform(self.peephole, hidden_size)
        self.config = config if config is not None else NewtonConfig()

    def forward(self, x, h0=None, return_cell_state=False):
        return newton_apply(self, x, self.config, h0=h0, return_cell_state=return_cell_state)

    def sequential(self, x, h0=None, return_cell_state=False):
        """The reference: the loop over t in PyTorch. h0 is a pair (h0, c0) of [B, H] or None."""
        u = self.in_proj(x)
        a_f, a_c, a_o = self.recurrent
        p_f, p_o = self.peephole
        h, c = h0 if h0 is not None else (u.new_zeros((u.shape[0], self.hidden_size)),) * 2
        hs, cs = [], []
        for u_t in u.unbind(1):
            u_f, u_c, u_o = u_t.chunk(3, dim=-1)
            f = torch.sigmoid(a_f * h + p_f * c + u_f)
            c = f * c + (1 - f) * torch.tanh(a_c * h + u_c)
            h = torch.sigmoid(a_o * h + p_o * c + u_o) * torch.tanh(c)
            hs.append(h)
            cs.append(c)
        h_all, c_all = torch.stack(hs, dim=1), torch.stack(cs, dim=1)
        return (h_all, c_all) if return_cell_state else h_all


def newton_apply(cell, x, cfg=None, h0=None, return_stats=False, return_cell_state=False):
    """Solves the cell's recurrence over x [B, T, input_size] for all t at once; returns h [B, T, H].

    ParaLSTM: h0 is a pair (h0, c0) of [B, H]; return_cell_state=True returns (h, c). return_stats
    appends NewtonStats. Outer autocast is disabled inside: the projection and the solve run in the
    module's dtype (x is converted to it); float16/bfloat16 are stored as such and computed in float32.
    """
    cfg = cfg if cfg is not None else cell.config
    if not isinstance(cell, (ParaGRU, ParaLSTM)):
        raise TypeError(f"newton_apply: argument 'cell' is a {type(cell).__name__}, expected ParaGRU or ParaLSTM")
    if x.dim() != 3 or x.shape[-1] != cell.input_size:
        raise ValueError(f"newton_apply: argument 'x' has shape {list(x.shape)}, "
                         f"expected [B, T, {cell.input_size}] ([B, T, input_size])")
    eager = not torch.compiler.is_compiling()
    settings = (cfg.max_iters, cfg.omega, cfg.residual_atol if eager else None, cfg.residual_fail if eager else None,
                cfg.picard_iters, cfg.picard_adapt and eager, cfg.scan_backend, return_stats)
    with torch.autocast(device_type=x.device.type, enabled=False):
        u = F.linear(x.to(cell.in_proj.weight.dtype), cell.in_proj.weight, cell.in_proj.bias)
        if isinstance(cell, ParaGRU):
            solve = lambda: ops.para_gru(u, cell.recurrent, h0, *settings)
        else:
            state0 = None if h0 is None else torch.stack([h0[1], h0[0]], dim=-1).flatten(1)  # channels (c, h)
            solve = lambda: ops.para_lstm(u, cell.recurrent, cell.peephole, state0, *settings)
        if eager:
            try:
                state, residual = solve()
            except RuntimeError as error:
                if "NewtonDivergenceError" in str(error):
                    raise NewtonDivergenceError(str(error).split("NewtonDivergenceError: ", 1)[-1]) from None
                raise
        else:
            state, residual = solve()
    if isinstance(cell, ParaGRU):
        result = state
    else:
        h, c = state[..., 1::2], state[..., 0::2]
        result = (h, c) if return_cell_state else h
    return (result, NewtonStats(residual)) if return_stats else result
