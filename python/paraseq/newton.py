"""ParaGRU (diagonal or head-block recurrence), ParaLSTM and ParaSLSTM solved by Newton's method (the C++
newton_solve through their operators), and their configuration."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import operator
from typing import NamedTuple, Optional, Tuple, Union

import torch
import torch.nn.functional as F
from torch import nn

from . import _compiled_cell, _distributed, _packed, _user_cell, _user_function
from ._ops import ops

# The solve's modes: the names of the C++ NewtonMode ("auto" for NewtonMode::automatic, a C++
# keyword), and the former Python name "scan" of "newton", still accepted.
SCAN_BACKENDS = ("auto", "newton", "fused", "sequential", "one_pass")
SCAN_BACKEND_ALIASES = {"scan": "newton", "automatic": "auto"}
# The Jacobians of the linear solves: the names of the C++ NewtonJacobian.
JACOBIANS = ("exact", "quasi")
INT_SETTING_MAX = 2 ** 31 - 1  # the C++ NewtonConfig holds its counts as int
DEFAULT_RESIDUAL_FAIL = 1e-3
# The layout of NewtonConfig._operator_config, the operators' packed config; the C++ side
# (newton_config_from_list) refuses another version.
_OPERATOR_CONFIG_VERSION = 2
_OPERATOR_NONE = -1.0  # an unset threshold in the packed config


def _check_count(function, name, value):
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= INT_SETTING_MAX:
        raise (ValueError if isinstance(value, int) and not isinstance(value, bool) else TypeError)(
            f"{function}: argument '{name}' is {value!r}, expected an int with 0 <= {name} <= {INT_SETTING_MAX} (2^31 - 1)")


def _check_threshold(name, value):
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"NewtonConfig: argument '{name}' is {value!r}, expected None or a number >= 0")
    if not value >= 0:
        raise ValueError(f"NewtonConfig: argument '{name}' is {value!r}, expected None or a number >= 0")


@dataclasses.dataclass(frozen=True)
class NewtonConfig:
    """How the Newton solve runs (docs/solvers.md, "Configuration"); frozen, checked on creation.

    Parameters
    ----------
    max_iters : int
        Newton iterations K (>= 0). Compiled graphs always run exactly K.
    omega : float
        Damping of each Newton update, 0 < omega <= 1 (1: undamped).
    residual_atol : float, optional
        Stop early once max |F| is at most this (eager mode); None: run K. The newton mode (and a
        cell of your own on the general path) checks the whole sequence after every iteration, one
        host read each; the fused mode stops each window of the sequence on its own once the
        window's max |F| is at most this, on the device (docs/solvers.md, "Early exit").
    residual_fail : float, optional
        In eager mode a solve whose max |F| exceeds this, or is not finite, raises
        NewtonDivergenceError. Default 1e-3; None accepts every result unchecked.
    picard_iters : int
        Picard sweeps (h <- f(h_prev, x) for all t at once) before Newton's iterations.
    picard_adapt : bool
        On a failed residual check, retry with more Picard sweeps (eager mode).
    scan_backend : {"auto", "newton", "fused", "sequential", "one_pass"}
        "auto" takes the measured rule of docs/solvers.md; "newton" one ordered scan per iteration
        ("scan", its former name, is still accepted); "fused" one kernel with windows on chip;
        "sequential" the loop over t; "one_pass" the newton mode's iterations in one kernel, all
        windows at once (exact Jacobian, no Picard sweeps, no residual_atol; "auto" picks it on
        CUDA for long sequences with few channels, docs/solvers.md). The backward's kernel is the
        automatic rule's for the shape whatever the forward's backend (its adjoint is the same at
        the converged states; docs/solvers.md, "Backward").
    jacobian : {"exact", "quasi"}
        The Jacobian of each Newton iteration's linear solve (the C++ NewtonJacobian). "exact": the
        cell's structured Jacobian (quadratic convergence). "quasi": only its diagonal (quasi-DEER):
        a diagonal scan per iteration, linear convergence, and like exact Newton with omega = 1 the
        first k steps are exact after k iterations. It applies to the newton mode (and a cell of
        your own on the general path); "sequential" is the exact loop either way, "auto" never
        picks the fused mode with it, and "fused" refuses it (the fused kernel runs the exact
        Jacobian only). For a diagonal cell (ParaGRU, jac_structure "diag") both are the same scan.
        Gradients are the exact adjoint at the result either way.

    Raises
    ------
    TypeError, ValueError
        A value of the wrong type or out of range, naming the argument; jacobian="quasi" with
        scan_backend="fused" or "one_pass"; scan_backend="one_pass" with picard_iters, picard_adapt
        or residual_atol.

    Notes
    -----
    residual_atol, residual_fail and picard_adapt read the residual on the host: they are
    eager-only and ignored while ``torch.compiler.is_compiling()``.
    """
    max_iters: int = 3
    omega: float = 1.0
    residual_atol: Optional[float] = None
    residual_fail: Optional[float] = DEFAULT_RESIDUAL_FAIL
    picard_iters: int = 0
    picard_adapt: bool = False
    scan_backend: str = "auto"
    jacobian: str = "exact"

    def __post_init__(self):
        _check_count("NewtonConfig", "max_iters", self.max_iters)
        _check_count("NewtonConfig", "picard_iters", self.picard_iters)
        if isinstance(self.omega, bool) or not isinstance(self.omega, (int, float)) or not 0 < self.omega <= 1:
            raise (ValueError if isinstance(self.omega, (int, float)) else TypeError)(
                f"NewtonConfig: argument 'omega' is {self.omega!r}, expected a number with 0 < omega <= 1")
        _check_threshold("residual_atol", self.residual_atol)
        _check_threshold("residual_fail", self.residual_fail)
        if not isinstance(self.picard_adapt, bool):
            raise TypeError(f"NewtonConfig: argument 'picard_adapt' is {self.picard_adapt!r}, expected True or False")
        backend = SCAN_BACKEND_ALIASES.get(self.scan_backend, self.scan_backend)
        if backend not in SCAN_BACKENDS:
            raise ValueError(f"NewtonConfig: argument 'scan_backend' is {self.scan_backend!r}, "
                             f"expected one of {', '.join(map(repr, SCAN_BACKENDS))} ('scan' is the former name "
                             "of 'newton')")
        object.__setattr__(self, "scan_backend", backend)
        if not isinstance(self.jacobian, str):
            raise TypeError(f"NewtonConfig: argument 'jacobian' is {self.jacobian!r}, expected one of "
                            f"{', '.join(map(repr, JACOBIANS))}")
        if self.jacobian not in JACOBIANS:
            raise ValueError(f"NewtonConfig: argument 'jacobian' is {self.jacobian!r}, expected one of "
                             f"{', '.join(map(repr, JACOBIANS))}")
        if self.jacobian == "quasi" and backend in ("fused", "one_pass"):
            raise ValueError(f"NewtonConfig: argument 'jacobian' is 'quasi' with scan_backend {backend!r}, expected "
                             f"jacobian 'exact' for the {backend} mode (its kernel runs the exact Jacobian only) or "
                             "scan_backend 'auto', 'newton' or 'sequential' for 'quasi'")
        if backend == "one_pass" and (self.picard_iters or self.picard_adapt or self.residual_atol is not None):
            raise ValueError("NewtonConfig: argument 'scan_backend' is 'one_pass' with picard_iters, picard_adapt or "
                             "residual_atol set, expected none of them (the one-pass mode runs max_iters iterations)")

    def _operator_config(self, eager: bool) -> list[float]:
        """The config as the Newton operators' ``float[] config`` argument, layout version 2
        (src/adapters/torch/work.hpp): [version, max_iters, omega, residual_atol,
        residual_fail, picard_iters, picard_adapt, scan_backend, jacobian], None as -1,
        picard_adapt as 0 or 1, scan_backend as its index in SCAN_BACKENDS, jacobian as its index
        in JACOBIANS.

        The settings that read the residual on the host (residual_atol, residual_fail,
        picard_adapt) are dropped unless eager. residual_fail reaches the solver only with
        picard_adapt, which retries against it: the divergence check itself is newton_apply's, on
        the residual the operator returns.
        """
        def threshold(value):
            return _OPERATOR_NONE if value is None or not eager else float(value)
        adapt = self.picard_adapt and eager
        return [float(_OPERATOR_CONFIG_VERSION), float(self.max_iters), float(self.omega),
                threshold(self.residual_atol), threshold(self.residual_fail if adapt else None),
                float(self.picard_iters), float(adapt), float(SCAN_BACKENDS.index(self.scan_backend)),
                float(JACOBIANS.index(self.jacobian))]


def compile_safe_config(max_iters: int = 3, *, scan_backend: str = "auto") -> NewtonConfig:
    """A NewtonConfig with a fixed iteration count and no residual check: no host synchronisation.

    The C++ ``compile_safe_config(K)``. residual_fail is None, so an eager call does not check the
    result either (read the residual with ``return_stats=True``).

    Parameters
    ----------
    max_iters : int
        Newton iterations K (>= 0).
    scan_backend : {"auto", "newton", "fused", "sequential", "one_pass"}
        As NewtonConfig's.

    Returns
    -------
    NewtonConfig

    Raises
    ------
    TypeError
        max_iters given as a string (the backend is a keyword) or not an int.
    """
    if isinstance(max_iters, str):
        raise TypeError(f"compile_safe_config: argument 'max_iters' is {max_iters!r}, expected an int "
                        f"(the scan backend is a keyword: compile_safe_config(scan_backend={max_iters!r}))")
    _check_count("compile_safe_config", "max_iters", max_iters)
    return NewtonConfig(max_iters=max_iters, residual_fail=None, scan_backend=scan_backend)


class NewtonDivergenceError(RuntimeError):
    """The solve's max |F| exceeded NewtonConfig.residual_fail after the last iteration, or was not finite.

    Raised by newton_apply (and the modules' forward) from the residual the solve returns, also
    after picard_adapt's retries.

    Attributes
    ----------
    residual : torch.Tensor
        [B] float64: the max over t and channels of |F_t(h)| per batch element, of the result that
        failed the check.
    residual_fail : float
        The threshold.
    iterations : int
        The Newton iterations of the failed solve (its max_iters).
    """

    def __init__(self, message, residual=None, residual_fail=None, iterations=None):
        super().__init__(message)
        self.residual, self.residual_fail, self.iterations = residual, residual_fail, iterations


class NewtonStats(NamedTuple):
    """What ``newton_apply(..., return_stats=True)`` returns beside the states.

    Attributes
    ----------
    residual : torch.Tensor
        [B] float64: the max over t and channels of |F_t(h)| at the result.
    iterations : int or torch.Tensor
        The Newton iterations run: ``max_iters``, or fewer when ``residual_atol`` stopped early;
        in the fused mode the most that any window ran (each window stops on its own); 0 in the
        sequential mode. While ``torch.compiler.is_compiling()``: a 0-d int64 tensor of the graph.
    backend : str or torch.Tensor
        The mode that ran, by NewtonConfig.scan_backend's names: "newton", "fused", "sequential"
        or "one_pass" ("auto" resolved; a cell of your own on the general path runs "newton").
        While compiling: a 0-d int64 tensor, the mode's index in ("auto", "newton", "fused",
        "sequential", "one_pass"), so that a graph with ``fullgraph=True`` has no break.

    Notes
    -----
    In eager mode iterations and backend are read on the host (one synchronisation, on a call
    with ``return_stats=True`` only).
    """
    residual: torch.Tensor
    iterations: Union[int, torch.Tensor]
    backend: Union[str, torch.Tensor]


def _operator_stats(residual, stats):
    """NewtonStats from a Newton operator's residual and stats ([2] int64: iterations, the
    SCAN_BACKENDS index of the mode that ran): Python values in eager mode, tensors while compiling."""
    if torch.compiler.is_compiling():
        return NewtonStats(residual, stats[0], stats[1])
    iterations, backend = stats.tolist()
    return NewtonStats(residual, iterations, SCAN_BACKENDS[backend])


def _general_path_stats(residual, iterations):
    """NewtonStats of the general path (PyTorch around linear_scan: the newton mode)."""
    if torch.compiler.is_compiling():
        return _operator_stats(residual, torch.tensor([iterations, SCAN_BACKENDS.index("newton")], dtype=torch.int64,
                                                      device=residual.device))
    return NewtonStats(residual, iterations, "newton")


def _check_size(module, name, value):
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise (ValueError if isinstance(value, int) and not isinstance(value, bool) else TypeError)(
            f"{module}: argument '{name}' is {value!r}, expected an int >= 1")


def _init_uniform(tensor, hidden_size):
    bound = 1.0 / math.sqrt(hidden_size)
    with torch.no_grad():
        tensor.uniform_(-bound, bound)


# ParaGRU's recurrent mixes (pararnn's ParaGRU(mix=...)) and the head sizes mix="head" takes: a head
# is one dense group of the C++ scan (ParaGRUHeads, DenseUpTo<32>).
GRU_MIXES = ("diag", "head")
MIN_HEAD_SIZE, MAX_HEAD_SIZE = 2, 32


def _check_heads(hidden_size, mix, n_heads):
    """n_heads for the mix, after checking both (hidden_size is checked already)."""
    if mix not in GRU_MIXES:
        raise ValueError(f"ParaGRU: argument 'mix' is {mix!r}, expected 'diag' (diagonal recurrence) or 'head' "
                         "(dense recurrent blocks per head)")
    if mix == "diag":
        if n_heads is not None:
            raise ValueError(f"ParaGRU: argument 'n_heads' is {n_heads!r} with mix='diag', expected None (heads are "
                             "for mix='head')")
        return None
    if isinstance(n_heads, bool) or not isinstance(n_heads, int):
        raise TypeError(f"ParaGRU: argument 'n_heads' is {n_heads!r} with mix='head', expected an int >= 1 that "
                        f"divides hidden_size = {hidden_size}")
    if n_heads < 1 or hidden_size % n_heads != 0:
        raise ValueError(f"ParaGRU: argument 'n_heads' is {n_heads} with mix='head', expected an int >= 1 that "
                         f"divides hidden_size = {hidden_size}")
    d_head = hidden_size // n_heads
    if not MIN_HEAD_SIZE <= d_head <= MAX_HEAD_SIZE:
        raise ValueError(f"ParaGRU: argument 'n_heads' is {n_heads} with hidden_size = {hidden_size}, giving heads of "
                         f"d_head = {d_head} channels, expected {MIN_HEAD_SIZE} <= d_head <= {MAX_HEAD_SIZE} "
                         "(mix='diag' is d_head = 1)")
    return n_heads


class ParaGRU(nn.Module):
    """ParaRNN's GRU with diagonal or head-block recurrence, solved for all t at once by newton_apply.

    mix="diag": h' = z c + (1 - z) h with z = s(a_z h + u_z), r = s(a_r h + u_r),
    c = tanh(a_c (h r) + u_c), all channelwise. mix="head" (pararnn's ParaGRU(mix="head")): the
    state splits into n_heads heads of d_head = H / n_heads channels and, on each head,
    z = s(h A_z + u_z), r = s(h A_r + u_r), c = tanh((h r) A_c + u_c) with dense d_head x d_head
    matrices (h a row vector), h' as above. u = in_proj(x) with gates (z, r, c); s is the logistic
    sigmoid.

    Parameters
    ----------
    input_size : int
        Features of x.
    hidden_size : int
        H, the state size.
    bias : bool
        Whether in_proj has a bias.
    config : NewtonConfig, optional
        How forward() solves (default NewtonConfig()).
    mix : {"diag", "head"}
        The recurrence: "diag" (default) channelwise, "head" dense blocks per head.
    n_heads : int, optional
        mix="head" only (required there): the head count, dividing hidden_size with
        2 <= d_head = hidden_size / n_heads <= 32.

    Attributes
    ----------
    in_proj : torch.nn.Linear
        [3H, input_size] weight (and [3H] bias): u = in_proj(x).
    recurrent : torch.nn.Parameter
        mix="diag": [3, H], (a_z, a_r, a_c). mix="head": [3, n_heads, d_head, d_head], (A_z, A_r,
        A_c) per head, rows the input channel and columns the output channel (pararnn's A_z, A_r,
        A_n stacked).
    mix : str
        "diag" or "head", as given.
    n_heads, d_head : int or None
        The head geometry with mix="head"; None with mix="diag".
    config : NewtonConfig

    Raises
    ------
    ValueError, TypeError
        An unknown mix; n_heads given with mix="diag", missing with mix="head", not dividing
        hidden_size, or giving d_head outside [2, 32].
    """

    def __init__(self, input_size: int, hidden_size: int, bias: bool = True,
                 config: Optional[NewtonConfig] = None, *, mix: str = "diag", n_heads: Optional[int] = None):
        super().__init__()
        _check_size("ParaGRU", "input_size", input_size)
        _check_size("ParaGRU", "hidden_size", hidden_size)
        self.input_size, self.hidden_size = input_size, hidden_size
        self.mix, self.n_heads = mix, _check_heads(hidden_size, mix, n_heads)
        self.d_head = None if self.n_heads is None else hidden_size // self.n_heads
        self.in_proj = nn.Linear(input_size, 3 * hidden_size, bias=bias)
        self.recurrent = nn.Parameter(torch.empty(self._recurrent_shape()))
        _init_uniform(self.recurrent, hidden_size)
        self.config = config if config is not None else NewtonConfig()

    def _recurrent_shape(self):
        return (3, self.hidden_size) if self.mix == "diag" else (3, self.n_heads, self.d_head, self.d_head)

    def extra_repr(self) -> str:
        heads = f", mix='head', n_heads={self.n_heads}" if self.mix == "head" else ""
        return f"input_size={self.input_size}, hidden_size={self.hidden_size}{heads}"

    def forward(self, x: torch.Tensor, h0: Optional[torch.Tensor] = None, *,
                cu_seqlens: Optional[torch.Tensor] = None, max_seqlen: Optional[int] = None,
                process_group: Optional[torch.distributed.ProcessGroup] = None) -> torch.Tensor:
        """h [B, T, H] for x [B, T, input_size] and h0 [B, H] (zero when None): newton_apply.
        With cu_seqlens, x [1, T, input_size] holds packed sequences and h0 is [S, H] (newton_apply's
        cu_seqlens and max_seqlen); with process_group, this rank's slice of t (newton_apply's)."""
        return newton_apply(self, x, self.config, h0=h0, cu_seqlens=cu_seqlens, max_seqlen=max_seqlen,
                            process_group=process_group)

    def step(self, h_prev: Optional[torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        """One step, for decoding: h_t [B, H] from h_prev = h_{t-1} [B, H] (zero when None) and
        x = x_t [B, input_size]. The step is the solve's sequential mode over one step (C++
        ``cell_step``), so stepping a sequence reproduces newton_apply's states; differentiable."""
        return newton_apply(self, _one_step_input(self, x, h_prev), _STEP_CONFIG, h0=h_prev).squeeze(1)

    def sequential(self, x, h0=None):
        """The reference: the loop over t in PyTorch, in the dtype of x and the module."""
        u = self.in_proj(x)
        h = h0 if h0 is not None else u.new_zeros((u.shape[0], self.hidden_size))
        states = []
        for u_t in u.unbind(1):
            h = _gru_step(self.recurrent, h, u_t)
            states.append(h)
        return torch.stack(states, dim=1)


class ParaLSTM(nn.Module):
    """ParaRNN's LSTM with diagonal recurrence and peepholes, solved for all t at once by newton_apply.

    c' = f c + (1 - f) c~, h' = o tanh(c') with f = s(a_f h + p_f c + u_f), c~ = tanh(a_c h + u_c),
    o = s(a_o h + p_o c' + u_o), u = in_proj(x) with gates (f, c, o); s is the logistic sigmoid.

    Parameters
    ----------
    input_size : int
        Features of x.
    hidden_size : int
        H, the size of h and of c.
    config : NewtonConfig, optional
        How forward() solves (default NewtonConfig()).

    Attributes
    ----------
    in_proj : torch.nn.Linear
        [3H, input_size] weight and [3H] bias: u = in_proj(x).
    recurrent : torch.nn.Parameter
        [3, H]: (a_f, a_c, a_o).
    peephole : torch.nn.Parameter
        [2, H]: (p_f, p_o).
    config : NewtonConfig
    """

    def __init__(self, input_size: int, hidden_size: int, config: Optional[NewtonConfig] = None):
        super().__init__()
        _check_size("ParaLSTM", "input_size", input_size)
        _check_size("ParaLSTM", "hidden_size", hidden_size)
        self.input_size, self.hidden_size = input_size, hidden_size
        self.in_proj = nn.Linear(input_size, 3 * hidden_size)
        self.recurrent = nn.Parameter(torch.empty(3, hidden_size))
        self.peephole = nn.Parameter(torch.empty(2, hidden_size))
        _init_uniform(self.recurrent, hidden_size)
        _init_uniform(self.peephole, hidden_size)
        self.config = config if config is not None else NewtonConfig()

    def forward(self, x: torch.Tensor, h0: Optional[Tuple[torch.Tensor, torch.Tensor]] = None,
                return_cell_state: bool = False, *, cu_seqlens: Optional[torch.Tensor] = None,
                max_seqlen: Optional[int] = None, process_group: Optional[torch.distributed.ProcessGroup] = None):
        """h [B, T, H] (and c with return_cell_state) for x [B, T, input_size] and h0 a pair
        (h0, c0) of [B, H] (zero when None): newton_apply. With cu_seqlens, x [1, T, input_size]
        holds packed sequences and h0 is a pair of [S, H] (newton_apply's cu_seqlens and max_seqlen);
        with process_group, this rank's slice of t (newton_apply's)."""
        return newton_apply(self, x, self.config, h0=h0, return_cell_state=return_cell_state, cu_seqlens=cu_seqlens,
                            max_seqlen=max_seqlen, process_group=process_group)

    def step(self, state_prev: Optional[Tuple[torch.Tensor, torch.Tensor]],
             x: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """One step, for decoding: (h_t, c_t), each [B, H], from state_prev = (h_{t-1}, c_{t-1})
        (zero when None) and x = x_t [B, input_size]. The step is the solve's sequential mode over
        one step (C++ ``cell_step``), so stepping a sequence reproduces newton_apply's states;
        differentiable."""
        x_seq = _one_step_input(self, x, state_prev)
        h0 = tuple(state_prev) if state_prev is not None else None
        h, c = newton_apply(self, x_seq, _STEP_CONFIG, h0=h0, return_cell_state=True)
        return h.squeeze(1), c.squeeze(1)

    def sequential(self, x, h0=None, return_cell_state=False):
        """The reference: the loop over t in PyTorch. h0 is a pair (h0, c0) of [B, H] or None."""
        u = self.in_proj(x)
        h, c = h0 if h0 is not None else (u.new_zeros((u.shape[0], self.hidden_size)),) * 2
        hs, cs = [], []
        for u_t in u.unbind(1):
            h, c = _lstm_step(self.recurrent, self.peephole, h, c, u_t)
            hs.append(h)
            cs.append(c)
        h_all, c_all = torch.stack(hs, dim=1), torch.stack(cs, dim=1)
        return (h_all, c_all) if return_cell_state else h_all


class ParaSLSTM(nn.Module):
    """The sLSTM of xLSTM (Beck et al. 2024) with diagonal recurrence.

    State [..., 4, H] with slots (c, n, m, h), pararnn's layout. With u = in_proj(x) split into
    the pre-activations (i, f, z, o) and p_g = u_g + r_g h (r = the recurrent weights clamped to
    [-max_recurrent_norm, max_recurrent_norm]):
    m' = max(p_f + m, p_i), i = exp(p_i - m'), f = exp(p_f + m - m'), c' = f c + i tanh(p_z),
    n' = f n + i, h' = s(p_o) c' / (n' + eps); s is the logistic sigmoid. The forget gate is
    exponential (pararnn's choice); at a tie p_f + m = p_i the derivative of the max is the mean of
    the branches' (torch.maximum's).

    newton_apply solves it with its operator, ``torch.ops.paraseq.para_slstm`` (the C++ cell
    ``paraseq::ParaSLSTM`` of src/solvers/cells.hpp, in the library's compiled instances: nothing is
    compiled on first use), on the CPU and CUDA, in every mode; ``step`` (decoding) is the same
    operator over one step. With ``compile=False`` it is solved as a cell of your own on the
    general path (``state_slots = 4``, ``jac_structure = "block4"``, the step's equations in
    PyTorch: Newton in PyTorch, Jacobians from torch.func).

    Parameters
    ----------
    input_size : int
        Features of x.
    hidden_size : int
        H, the size of each of c, n, m and h.
    max_recurrent_norm : float, optional
        The clamp of the recurrent weights in every step (pararnn's, xLSTM App. C.1); None: none.
    eps : float
        The floor in h' = s(p_o) c' / (n' + eps), > 0.
    config : NewtonConfig, optional
        How forward() solves. Default ``NewtonConfig(scan_backend="sequential")``: Newton's
        iterations from the default guess converge slowly for this cell (docs/solvers.md,
        "ParaSLSTM's convergence"), so the default is the operator's exact loop over t.
        The quasi Jacobian converges where exact Newton does not (measured there), e.g.
        ``NewtonConfig(jacobian="quasi", scan_backend="newton", max_iters=200, residual_atol=1e-10)``.

    Attributes
    ----------
    in_proj : torch.nn.Linear
        [4H, input_size] weight and [4H] bias (zero at initialisation): u = in_proj(x), gates
        (i, f, z, o); pararnn's W_x.
    recurrent : torch.nn.Parameter
        [4, H]: (r_i, r_f, r_z, r_o), pararnn's R.
    config : NewtonConfig
    state_slots : int
        4: (c, n, m, h).
    hidden_slot : int
        3, the slot of h.
    jac_structure : str
        "block4": each channel's four slots form one block of the Jacobian.
    """

    state_slots = 4
    hidden_slot = 3
    jac_structure = "block4"

    def __init__(self, input_size: int, hidden_size: int, *, max_recurrent_norm: Optional[float] = 0.5,
                 eps: float = 1e-6, config: Optional[NewtonConfig] = None):
        super().__init__()
        _check_size("ParaSLSTM", "input_size", input_size)
        _check_size("ParaSLSTM", "hidden_size", hidden_size)
        if max_recurrent_norm is not None and (isinstance(max_recurrent_norm, bool) or
                                               not isinstance(max_recurrent_norm, (int, float)) or
                                               not max_recurrent_norm > 0):
            raise ValueError(f"ParaSLSTM: argument 'max_recurrent_norm' is {max_recurrent_norm!r}, expected None or a "
                             "number > 0")
        if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not 0 < eps < math.inf:
            raise ValueError(f"ParaSLSTM: argument 'eps' is {eps!r}, expected a finite number > 0")
        if config is not None and not isinstance(config, NewtonConfig):
            raise TypeError(f"ParaSLSTM: argument 'config' is a {type(config).__name__}, expected a NewtonConfig or None")
        self.input_size, self.hidden_size = input_size, hidden_size
        self.max_recurrent_norm = None if max_recurrent_norm is None else float(max_recurrent_norm)
        self.eps = float(eps)
        self.in_proj = nn.Linear(input_size, 4 * hidden_size)
        nn.init.zeros_(self.in_proj.bias)
        # pararnn's initialisation: Xavier-normal as the diagonal of a [4H, 4H] matrix (small
        # recurrent weights help Newton, ParaRNN App. C.1)
        self.recurrent = nn.Parameter(torch.empty(4, hidden_size))
        with torch.no_grad():
            self.recurrent.normal_(0.0, math.sqrt(1.0 / (4 * hidden_size)))
        self.config = config if config is not None else NewtonConfig(scan_backend="sequential")

    def extra_repr(self) -> str:
        return (f"{self.input_size}, {self.hidden_size}, max_recurrent_norm={self.max_recurrent_norm}, "
                f"eps={self.eps}")

    def forward(self, x: torch.Tensor, h0: Optional[torch.Tensor] = None, return_state: bool = False, *,
                cu_seqlens: Optional[torch.Tensor] = None, max_seqlen: Optional[int] = None,
                compile: Union[str, bool] = "auto") -> torch.Tensor:
        """h [B, T, H] (the whole state [B, T, 4, H] with return_state) for x [B, T, input_size]
        and h0 [B, 4, H] (slots (c, n, m, h); zero when None, which gives n > 0 from t = 0 on):
        newton_apply with self.config. n0 must be >= 0. With cu_seqlens, x [1, T, input_size] holds
        packed sequences and h0 is [S, 4, H] (newton_apply's cu_seqlens and max_seqlen)."""
        state = newton_apply(self, x, self.config, h0=h0, cu_seqlens=cu_seqlens, max_seqlen=max_seqlen,
                             compile=compile)
        return state if return_state else state[..., self.hidden_slot, :]

    def clipped_recurrent(self) -> torch.Tensor:
        """The recurrent weights as every step uses them: clamped to +-max_recurrent_norm."""
        if self.max_recurrent_norm is None:
            return self.recurrent
        return self.recurrent.clamp(-self.max_recurrent_norm, self.max_recurrent_norm)

    def step(self, h_prev: Optional[torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        """One step, for decoding: the state [..., 4, H] after h_prev [..., 4, H] (slots (c, n, m, h);
        zero when None) and x [..., input_size], for any leading dimensions (none for one
        sequence). The step is the operator's sequential mode over one step (C++ ``cell_step``), so
        stepping a sequence reproduces newton_apply's states; differentiable."""
        function, H = "ParaSLSTM.step", self.hidden_size
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{function}: argument 'x' is a {type(x).__name__}, expected a tensor [..., "
                            f"{self.input_size}] ([..., input_size])")
        if x.dim() < 1 or x.shape[-1] != self.input_size:
            raise ValueError(f"{function}: argument 'x' has shape {list(x.shape)}, expected [..., {self.input_size}] "
                             "([..., input_size])")
        leading = tuple(x.shape[:-1])
        if h_prev is not None and not isinstance(h_prev, torch.Tensor):
            raise TypeError(f"{function}: argument 'h_prev' is a {type(h_prev).__name__}, expected None or a tensor "
                            f"{[*leading, 4, H]}")
        if h_prev is not None and tuple(h_prev.shape) != (*leading, 4, H):
            raise ValueError(f"{function}: argument 'h_prev' has shape {list(h_prev.shape)}, expected "
                             f"{[*leading, 4, H]} (x's leading dimensions, then slots c, n, m, h)")
        rows = math.prod(leading)
        state = newton_apply(self, x.reshape(rows, 1, self.input_size), _STEP_CONFIG,
                             h0=None if h_prev is None else h_prev.reshape(rows, 4, H))
        return state.reshape(*leading, 4, H)

    def sequential(self, x, h0=None):
        """The reference: the loop over t of the step's equations in PyTorch; the state [B, T, 4, H]."""
        state = h0 if h0 is not None else x.new_zeros((x.shape[0], 4, self.hidden_size))
        equations = _SlstmEquations(self)
        states = []
        for x_t in x.unbind(1):
            state = equations.step(state, x_t)
            states.append(state)
        return torch.stack(states, dim=1)


def _gru_step(recurrent, h, u):
    """ParaGRU's step in PyTorch (any leading dimensions): the reference loop's and the
    distributed solve's. recurrent [3, H] (diagonal) or [3, n_heads, d_head, d_head] (heads)."""
    u_z, u_r, u_c = u.chunk(3, dim=-1)
    if recurrent.dim() == 2:
        a_z, a_r, a_c = recurrent
        mix_z, mix_r, mix_c = (lambda v, a=a: a * v for a in (a_z, a_r, a_c))
    else:
        heads, d_head = recurrent.shape[1], recurrent.shape[2]

        def head_mix(a):  # v A per head: [..., H] -> [..., H]
            return lambda v: (v.unflatten(-1, (heads, 1, d_head)) @ a).flatten(-3)
        mix_z, mix_r, mix_c = (head_mix(a) for a in recurrent)
    z = torch.sigmoid(mix_z(h) + u_z)
    r = torch.sigmoid(mix_r(h) + u_r)
    c = torch.tanh(mix_c(h * r) + u_c)
    return z * c + (1 - z) * h


def _lstm_step(recurrent, peephole, h, c, u):
    """ParaLSTM's step in PyTorch (any leading dimensions): (h', c')."""
    a_f, a_c, a_o = recurrent
    p_f, p_o = peephole
    u_f, u_c, u_o = u.chunk(3, dim=-1)
    f = torch.sigmoid(a_f * h + p_f * c + u_f)
    c = f * c + (1 - f) * torch.tanh(a_c * h + u_c)
    return torch.sigmoid(a_o * h + p_o * c + u_o) * torch.tanh(c), c


def _slstm_step(recurrent, state, u, eps):
    """ParaSLSTM's step (any leading dimensions): the state (c, n, m, h) along dimension -2 after
    `state`, for the projected input u (i, f, z, o). The max is (a + b + |a - b|) / 2, which the
    compiled path can emit and whose derivative at a tie is 1/2 for each branch, as torch.maximum's."""
    c, n, m, h = state.unbind(-2)
    u_i, u_f, u_z, u_o = u.chunk(4, dim=-1)
    r_i, r_f, r_z, r_o = recurrent
    pre_i = u_i + r_i * h
    left = u_f + r_f * h + m
    m_next = 0.5 * (left + pre_i + (left - pre_i).abs())
    input_gate = torch.exp(pre_i - m_next)
    forget_gate = torch.exp(left - m_next)
    c_next = forget_gate * c + input_gate * torch.tanh(u_z + r_z * h)
    n_next = forget_gate * n + input_gate
    h_next = torch.sigmoid(u_o + r_o * h) * c_next / (n_next + eps)
    return torch.stack((c_next, n_next, m_next, h_next), dim=-2)


class _SlstmEquations(nn.Module):
    """A ParaSLSTM as a cell of the general path (compile=False, process_group) and its reference
    loop: step(state, x) in PyTorch, which torch.func differentiates (ParaSLSTM.step is the
    operator)."""
    state_slots, jac_structure = 4, "block4"

    def __init__(self, cell):
        super().__init__()
        self.builtin = cell
        self.input_size, self.hidden_size, self.config = cell.input_size, cell.hidden_size, cell.config

    def step(self, state, x):
        cell = self.builtin
        return _slstm_step(cell.clipped_recurrent(), state, F.linear(x, cell.in_proj.weight, cell.in_proj.bias),
                           cell.eps)


def _general_path_cell(cell):
    """The cell whose step the general path differentiates: a ParaSLSTM's equations, else the cell."""
    return _SlstmEquations(cell) if isinstance(cell, ParaSLSTM) else cell


class _BuiltinCellSteps(nn.Module):
    """A ParaGRU or ParaLSTM as a cell of the general path (the distributed solve): step(state, u)
    on the projected input u. ParaGRU: state [..., H], diagonal Jacobian; ParaLSTM: state
    [..., 2, H] with slots (c, h), each channel's two slots coupled (block2)."""

    def __init__(self, cell):
        super().__init__()
        self.builtin = cell
        self.hidden_size = cell.hidden_size
        self.lstm = isinstance(cell, ParaLSTM)
        self.state_slots, self.jac_structure = (2, "block2") if self.lstm else (1, "diag")

    def step(self, state, u):
        if not self.lstm:
            return _gru_step(self.builtin.recurrent, state, u)
        h, c = _lstm_step(self.builtin.recurrent, self.builtin.peephole, state[..., 1, :], state[..., 0, :], u)
        return torch.stack([c, h], dim=-2)


# A decoding step: the sequential mode over one step is exact, so nothing to iterate or check.
_STEP_CONFIG = NewtonConfig(max_iters=0, residual_fail=None, scan_backend="sequential")


def _one_step_input(cell, x, state_prev):
    """x_t [B, input_size] as a sequence of one step, [B, 1, input_size], after checking x and the
    state before the step (h_prev [B, H]; for ParaLSTM a pair (h, c) of them, or None)."""
    function = f"{type(cell).__name__}.step"
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{function}: argument 'x' is a {type(x).__name__}, expected a tensor "
                        f"[B, {cell.input_size}] ([B, input_size])")
    if x.dim() != 2 or x.shape[-1] != cell.input_size:
        raise ValueError(f"{function}: argument 'x' has shape {list(x.shape)}, "
                         f"expected [B, {cell.input_size}] ([B, input_size]: one step)")
    if isinstance(cell, ParaLSTM) and state_prev is not None:
        if not (isinstance(state_prev, (tuple, list)) and len(state_prev) == 2):
            raise TypeError(f"{function}: argument 'state_prev' is a {type(state_prev).__name__}, expected None or a "
                            "pair (h, c) of [B, hidden_size] tensors")
        for name, tensor in zip(("state_prev[0] (h)", "state_prev[1] (c)"), state_prev):
            _check_initial_state(name, tensor, x, cell, function)
    elif state_prev is not None:
        _check_initial_state("h_prev", state_prev, x, cell, function)
    return x.unsqueeze(1)


class _ProjectionWithoutAutocast(torch.autograd.Function):
    """u = x W^T + bias with autocast off in the forward and in the backward: under an outer
    autocast, the backward's matmuls would otherwise run in its lower precision (the backward runs
    with the autocast state of the call to backward, not of the forward)."""

    @staticmethod
    def forward(x, weight, bias):
        with torch.autocast(device_type=x.device.type, enabled=False):
            return F.linear(x, weight, bias)

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, weight, bias = inputs
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None

    @staticmethod
    def backward(ctx, grad_u):
        x, weight = ctx.saved_tensors
        with torch.autocast(device_type=x.device.type, enabled=False):
            grad_x = grad_u @ weight if ctx.needs_input_grad[0] else None
            grad_weight = grad_u.flatten(0, -2).T @ x.flatten(0, -2) if ctx.needs_input_grad[1] else None
            grad_bias = grad_u.flatten(0, -2).sum(0) if ctx.has_bias and ctx.needs_input_grad[2] else None
        return grad_x, grad_weight, grad_bias


def _projection(cell, x):
    """cell.in_proj(x) in the module's dtype, outside any autocast region (forward and backward)."""
    x = x.to(cell.in_proj.weight.dtype)
    if torch.is_autocast_enabled(x.device.type):
        return _ProjectionWithoutAutocast.apply(x, cell.in_proj.weight, cell.in_proj.bias)
    return F.linear(x, cell.in_proj.weight, cell.in_proj.bias)  # no autocast: the plain (cheaper) node


def _check_parameter(cell, name, tensor, shape):
    if tuple(tensor.shape) != shape:
        raise ValueError(f"newton_apply: argument 'cell' has {name} of shape {list(tensor.shape)}, expected "
                         f"{list(shape)} (from input_size = {cell.input_size}, hidden_size = {cell.hidden_size})")


def _check_initial_state(name, tensor, x, cell, function="newton_apply", slots=None, layout="[B, hidden_size]"):
    """A state tensor [B, H], or [B, slots, H] with slots (layout says how, in messages), in the module's dtype."""
    expected = [x.shape[0], cell.hidden_size] if slots is None else [x.shape[0], slots, cell.hidden_size]
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{function}: argument '{name}' is a {type(tensor).__name__}, expected a tensor {expected} "
                        f"({layout})")
    if list(tensor.shape) != expected:
        raise ValueError(f"{function}: argument '{name}' has shape {list(tensor.shape)}, expected {expected} "
                         f"({layout})")
    dtype = cell.recurrent.dtype
    if tensor.dtype != dtype:
        raise TypeError(f"{function}: argument '{name}' has dtype {tensor.dtype}, expected {dtype} (the module's dtype)")


def _initial_state(cell, x, h0):
    """h0 as the operator takes it: [B, H] for ParaGRU, (h0, c0) interleaved as [B, 2H] for ParaLSTM."""
    if h0 is None:
        return None
    if isinstance(cell, ParaGRU):
        _check_initial_state("h0", h0, x, cell)
        return h0
    if not isinstance(h0, (tuple, list)) or len(h0) != 2:
        raise TypeError(f"newton_apply: argument 'h0' is a {type(h0).__name__}, expected a pair (h0, c0) of tensors "
                        f"[B, hidden_size] for a ParaLSTM")
    _check_initial_state("h0[0] (h0)", h0[0], x, cell)
    _check_initial_state("h0[1] (c0)", h0[1], x, cell)
    return torch.stack([h0[1], h0[0]], dim=-1).flatten(1)  # channels (c, h)


def _divergence(residual, residual_fail, iterations):
    """The NewtonDivergenceError of a solve whose residual is not finite or exceeds residual_fail, else None."""
    failed = ~(residual <= residual_fail)
    if not failed.any():
        return None
    worst = residual.max().item()  # NaN when any is
    return NewtonDivergenceError(
        f"newton_apply: the Newton solve did not converge: max |F| = {worst:.3g} with max_iters = {iterations} "
        f"(batch elements {failed.nonzero().flatten().tolist()}), expected <= residual_fail = {residual_fail:g}. "
        "A NaN in x or in the parameters makes the residual non-finite. Raise max_iters or picard_iters, or pass "
        "NewtonConfig(residual_fail=None) to accept the result unchecked", residual, residual_fail, iterations)


def newton_apply(cell: nn.Module, x: torch.Tensor, cfg: Optional[NewtonConfig] = None,
                 h0: Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor], None] = None, return_stats: bool = False,
                 return_cell_state: bool = False, *, compile: Union[str, bool] = "auto",
                 cu_seqlens: Optional[torch.Tensor] = None, max_seqlen: Optional[int] = None,
                 process_group: Optional[torch.distributed.ProcessGroup] = None):
    """Solves a cell's recurrence h_t = f(h_{t-1}, x_t) over x for all t at once, by Newton's method.

    Parameters
    ----------
    cell : ParaGRU, ParaLSTM, ParaSLSTM or torch.nn.Module
        A built-in cell (its C++ operators) or a cell of your own: any module with an int
        ``hidden_size`` and ``step(h_prev, x)`` (pararnn's RNNCell protocol), optionally
        ``state_slots`` (1, 2 or 4) and ``jac_structure`` ("diag", "block2", "block4" or "dense",
        the default). A cell of your own takes the compiled path when it can (``compile``: step
        traced once and emitted as a C++ cell of the Newton solver, compiled on first use and
        cached) or the general path: Newton's iterations in PyTorch, Jacobians of step from
        torch.func, one linear_scan per iteration, gradients by the adjoint recurrence (one reverse
        linear_scan and one vjp of step over all t). See docs/migration.md.
    x : torch.Tensor
        [B, T, input_size], floating point; converted to the module's dtype.
    cfg : NewtonConfig, optional
        Default: ``cell.config`` (NewtonConfig() for a cell of your own without one). A cell of your
        own on the general path needs scan_backend "auto" or "newton" and no picard_adapt (the
        compiled path runs every setting, as for the built-in cells).
    h0 : torch.Tensor or tuple, optional
        The state before t = 0: [B, H] (ParaGRU; [B, H] or [B, state_slots, H] for a cell of your
        own), a pair (h0, c0) of [B, H] for ParaLSTM; zero when None.
    return_stats : bool
        Also return NewtonStats.
    return_cell_state : bool
        ParaLSTM only: return (h, c).
    compile : {"auto", True, False}
        For a cell of your own: "auto" takes the compiled path (step traced on one row and emitted
        as C++, compiled on first use and cached under $PARASEQ_CACHE_DIR or ~/.cache/paraseq)
        when it supports every operation of step's recurrence, the state is float32 or float64 on
        the CPU (or on CUDA, with a CUDA build), autocast is off and a C++ compiler is there, else
        the general path with a warning naming why; True the compiled path or NotImplementedError
        naming why (with a CUDA build of paraseq, on the CPU and on CUDA, nvcc compiles its first
        use: 28-65 s for the cells of perf_tests/extension_compile.py on H100 machines' hosts,
        2026-12-05 and 2026-12-06); False the general path. With ``process_group`` the solve is the general path
        ("auto"; True raises). ParaGRU and ParaLSTM always run their operators ("auto" or True; False raises);
        ParaSLSTM runs its operator with "auto" or True and the general path with False.
    cu_seqlens : torch.Tensor, optional
        Packed sequences (FlashAttention's convention): int32 or int64 [S + 1] on x's device,
        0 = cu_seqlens[0] <= ... <= cu_seqlens[S] = T; sequence s is t in
        [cu_seqlens[s], cu_seqlens[s + 1]) of x [1, T, input_size]; equal neighbours are an empty
        sequence. Each sequence is solved independently from its own h0, [S, H] (ParaLSTM: a pair
        of [S, H]; a cell of your own: [S, H] or [S, state_slots, H]). The sequences are gathered
        into padded batches [S_g, T_g, input_size] (one index_select each, padding reads a zero
        row), each solved in one call, and the valid positions gathered back into [1, T, ...];
        padding follows each sequence's end, so the causal recurrence cannot carry it into a
        sequence's states, and the padding's gradient is dropped. In eager mode the non-empty
        sequences form groups of similar length (longest first; a group takes the next sequence
        while its padded steps stay within 1.25x its steps; at most 4 groups), each padded to its
        own longest: a long document among short ones costs about its own steps, not S times
        them. In compiled graphs (the lengths are not read on the host) one batch [S, T_max].
        Cost: the solves' time and memory for the padded steps, plus a gather of x and one of the
        result (scatters in the backward). The residual (NewtonStats, NewtonDivergenceError's batch
        elements) is per sequence, [S], and includes its group's padding steps (the recurrence
        continued with zero input); an empty sequence's is 0 in eager mode. A divergence is
        reported from one padded batch, as in compiled graphs. With return_stats in eager mode,
        iterations is the most of any group and backend that of the group with the most padded
        steps. Eager and compiled results agree to rounding, not bitwise (other batches).
    max_seqlen : int, optional
        With cu_seqlens: T_max, at least the longest sequence's length (FlashAttention's
        max_seqlen), the padded length of compiled graphs. When None it is read from cu_seqlens on
        the host: under torch.compile a graph break (a data-dependent shape; none with
        ``torch._dynamo.config.capture_scalar_outputs = True``); pass it to compile with
        fullgraph=True without that read. A larger value only adds padding there. Eager mode reads
        the lengths on the host in any case (one synchronisation, with the checks).
    process_group : torch.distributed.ProcessGroup, optional
        Sequence parallelism (docs/distributed.md): each rank of the group passes its contiguous
        slice of the time axis, x [B, T_r, input] (the ranks in group-rank order along time; T_r
        may differ and may be 0), and gets its slice of h. Every rank solves by the general path
        (the built-in cells too, through their step in PyTorch: not their C++ kernels): at every
        iteration the state entering the slice comes from the rank before (one all_gather of
        B x state values) and the linear solve is a distributed linear_scan. h0 is given on group
        rank 0 only. Every rank must call with the same B, state size, dtype, device type, cell
        structure and cfg; cfg.scan_backend "auto" or "newton". When any rank's result requires
        grad, every rank's does and every rank must run the backward (it is collective). Under
        torch.compile the exchanges are opaque operators (no graph break, a fixed max_iters), and
        the ranks' results must all require grad or none. None: one process.

    Returns
    -------
    torch.Tensor or tuple
        h [B, T, H] (a cell of your own: the state's layout; [1, T, ...] with cu_seqlens), or
        (h, c) with return_cell_state,
        followed by NewtonStats when return_stats. Gradients reach x, h0 and the cell's parameters
        through the adjoint recurrence; gradients of gradients raise.

    Raises
    ------
    NewtonDivergenceError
        In eager mode, when max |F| after the last iteration exceeds ``cfg.residual_fail``
        (default 1e-3) or is not finite. Compiled graphs run the fixed ``cfg.max_iters`` and report
        the residual only in the stats.
    TypeError, ValueError
        Bad arguments, naming the argument, what was given and what was expected; a declared
        jac_structure that step does not have (the compiled path reads it from the traced step,
        also in compiled graphs; the general path checks it with one jvp in eager mode). With
        cu_seqlens: cu_seqlens not 1-D [S + 1], not int32/int64 (TypeError), on another device than
        x, not starting at 0, not ending at T or decreasing; x with a batch size other than 1; h0
        without S states; max_seqlen not an int >= 0 (TypeError) or shorter than the longest
        sequence. The values are read on the host in eager mode (one synchronisation, which reading
        T_max needs anyway); compiled graphs check them with ``torch._assert_async``.
    NotImplementedError
        ``compile=True`` for a cell of your own that the compiled path does not take (naming the
        operation, dtype, device or missing compiler), or with ``process_group``.
    RuntimeError
        ``process_group`` given while torch.distributed is not initialised.

    Notes
    -----
    An outer autocast is disabled inside, in the forward and the backward: the projection and the
    solve run in the module's dtype; float16/bfloat16 modules are stored as such and computed in
    float32 (with ``process_group``, the general path computes them in their own dtype).

    With ``process_group``, every rank checks its arguments before any collective, and every rank
    raises when one rank's are refused (that rank its own error), when the ranks differ in an
    argument (ValueError or TypeError naming it and each rank's value), when h0 is given on a rank
    other than group rank 0, or when the solve diverges (the residual is the maximum over ranks).
    The cell's parameters receive each rank's part of their gradient: sum them over the group.
    """
    if process_group is not None:
        if cu_seqlens is not None or max_seqlen is not None:
            raise ValueError("newton_apply: arguments 'cu_seqlens' and 'process_group' are both given, expected at "
                             "most one (packed sequences split across ranks are not supported)")
        return _newton_apply_distributed(cell, x, cfg, h0, return_stats, return_cell_state, compile, process_group)
    _check_compile_argument("newton_apply", compile)
    if cu_seqlens is not None or max_seqlen is not None:
        return _packed.newton_apply_packed(newton_apply, cell, x, h0, cu_seqlens, max_seqlen,
                                           getattr(cell, "input_size", None), cfg=cfg, return_stats=return_stats,
                                           return_cell_state=return_cell_state, compile=compile)
    if isinstance(cell, ParaSLSTM) and compile is not False:
        return _newton_apply_slstm(cell, x, cfg, h0, return_stats, return_cell_state)
    if not isinstance(cell, (ParaGRU, ParaLSTM)):
        return _newton_apply_user_cell(_general_path_cell(cell), x, cfg, h0, return_stats, return_cell_state, compile)
    cfg, state0 = _checked_builtin_arguments(cell, x, cfg, h0, return_cell_state, compile)
    # In eager mode the divergence check is made here, on the residual the operator returns (also
    # after picard_adapt's retries: the operator returns the failed result instead of raising).
    eager = not torch.compiler.is_compiling()
    check = eager and cfg.residual_fail is not None
    config = cfg._operator_config(eager)
    u = _projection(cell, x)
    with torch.autocast(device_type=x.device.type, enabled=False):
        if isinstance(cell, ParaGRU):
            gru_op = ops.para_gru_head if cell.mix == "head" else ops.para_gru
            state, residual, stats = gru_op(u, cell.recurrent, state0, config, return_stats or check)
        else:
            state, residual, stats = ops.para_lstm(u, cell.recurrent, cell.peephole, state0, config,
                                                   return_stats or check)
    _check_divergence(residual if check else None, cfg)
    if isinstance(cell, ParaGRU):
        result = state
    else:
        h, c = state[..., 1::2], state[..., 0::2]
        result = (h, c) if return_cell_state else h
    return (result, _operator_stats(residual, stats)) if return_stats else result


def _newton_apply_slstm(cell, x, cfg, h0, return_stats, return_cell_state):
    """A ParaSLSTM through paraseq::para_slstm: the state [B, T, 4, H] with slots (c, n, m, h)."""
    if return_cell_state:
        raise ValueError("newton_apply: argument 'return_cell_state' is True for a ParaSLSTM, expected False (its "
                         "state [B, T, 4, H] holds every slot: c, n, m, h)")
    cfg = _checked_cell_input(cell, x, cfg)
    H = cell.hidden_size
    _check_parameter(cell, "in_proj.weight", cell.in_proj.weight, (4 * H, cell.input_size))
    _check_parameter(cell, "recurrent", cell.recurrent, (4, H))
    state0 = None
    if h0 is not None:
        _check_initial_state("h0", h0, x, cell, slots=4, layout="[B, 4, hidden_size]: slots c, n, m, h")
        state0 = h0.transpose(1, 2).flatten(1)  # the operator's layout: each channel's (c, n, m, h) together
    eager = not torch.compiler.is_compiling()
    check = eager and cfg.residual_fail is not None
    u = _projection(cell, x)
    with torch.autocast(device_type=x.device.type, enabled=False):
        state, residual, stats = ops.para_slstm(u, cell.clipped_recurrent(), state0, cell.eps,
                                                cfg._operator_config(eager), return_stats or check)
    _check_divergence(residual if check else None, cfg)
    state = state.unflatten(-1, (H, 4)).transpose(-1, -2)  # [B, T, 4, H]
    return (state, _operator_stats(residual, stats)) if return_stats else state


def _checked_cell_input(cell, x, cfg):
    """cfg (cell.config when None) after checking it and x, for a built-in cell."""
    cfg = cfg if cfg is not None else cell.config
    if not isinstance(cfg, NewtonConfig):
        raise TypeError(f"newton_apply: argument 'cfg' is a {type(cfg).__name__}, expected a NewtonConfig or None")
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"newton_apply: argument 'x' is a {type(x).__name__}, expected a tensor "
                        f"[B, T, {cell.input_size}] ([B, T, input_size])")
    if not x.is_floating_point():
        raise TypeError(f"newton_apply: argument 'x' has dtype {x.dtype}, expected a floating-point dtype "
                        f"(it is converted to the module's dtype, {cell.recurrent.dtype})")
    if x.dim() != 3 or x.shape[-1] != cell.input_size:
        raise ValueError(f"newton_apply: argument 'x' has shape {list(x.shape)}, "
                         f"expected [B, T, {cell.input_size}] ([B, T, input_size])")
    return cfg


def _checked_builtin_arguments(cell, x, cfg, h0, return_cell_state, compile):
    """(cfg, state0) for a ParaGRU or ParaLSTM, after checking every argument."""
    if compile is False:
        raise ValueError("newton_apply: argument 'compile' is False for a paraseq." + type(cell).__name__ + ", whose "
                         "solve is a C++ operator; pass compile='auto' (or True)")
    cfg = _checked_cell_input(cell, x, cfg)
    if return_cell_state and isinstance(cell, ParaGRU):
        raise ValueError("newton_apply: argument 'return_cell_state' is True for a ParaGRU, which has no cell state")
    H = cell.hidden_size
    _check_parameter(cell, "in_proj.weight", cell.in_proj.weight, (3 * H, cell.input_size))
    _check_parameter(cell, "recurrent", cell.recurrent,
                     cell._recurrent_shape() if isinstance(cell, ParaGRU) else (3, H))
    if isinstance(cell, ParaLSTM):
        _check_parameter(cell, "peephole", cell.peephole, (2, H))
    state0 = _initial_state(cell, x, h0)
    return cfg, state0


def _check_compile_argument(function, compile):
    """compile: "auto", True or False (the compiled paths: _compiled_odeint.py, _compiled_cell.py)."""
    if not (compile is True or compile is False or compile == "auto"):
        raise ValueError(f"{function}: argument 'compile' is {compile!r}, expected 'auto', True or False")


def _newton_apply_user_cell(cell, x, cfg, h0, return_stats, return_cell_state, compile):
    layout, cfg, h0 = _checked_user_cell_arguments(cell, x, cfg, h0, return_cell_state)
    if compile is not False:
        owner, function = _user_function.split(cell.step)
        token = _user_function.register(owner, function)
        dtype = h0.dtype if h0 is not None else x.dtype
        # The trace's input size is a constant: operator.index specialises a dynamic size (torch.compile).
        plan = _compiled_cell.choose(token, layout.structure, layout.slots, layout.hidden, operator.index(x.shape[2]),
                                     dtype, x.dtype, x.device.type, torch.is_autocast_enabled(x.device.type), compile,
                                     type(cell).__name__)
        if plan:
            eager = not torch.compiler.is_compiling()
            check = eager and cfg.residual_fail is not None
            tensors = _user_function.found_tensors(owner, function)
            h, residual, stats = _compiled_cell.run(plan, layout, x, h0, tensors, cfg._operator_config(eager),
                                                    return_stats or check)
            _check_divergence(residual if check else None, cfg)
            return (h, _operator_stats(residual, stats)) if return_stats else h
    _check_general_path_config(cfg)
    h, residual, iterations = _user_cell.solve(layout, x, h0, cfg, return_stats)
    _check_divergence(residual, cfg)
    return (h, _general_path_stats(residual, iterations)) if return_stats else h


def _check_divergence(residual, cfg):
    if residual is not None and cfg.residual_fail is not None and not torch.compiler.is_compiling():
        error = _divergence(residual, cfg.residual_fail, cfg.max_iters)
        if error is not None:
            raise error


def _checked_user_cell_arguments(cell, x, cfg, h0, return_cell_state):
    """(layout, cfg, h0) for a cell of your own, after checking every argument."""
    layout = _user_cell.CellLayout(cell)
    if cfg is None:
        cfg = getattr(cell, "config", None)
        cfg = cfg if isinstance(cfg, NewtonConfig) else NewtonConfig()
    if not isinstance(cfg, NewtonConfig):
        raise TypeError(f"newton_apply: argument 'cfg' is a {type(cfg).__name__}, expected a NewtonConfig or None")
    if return_cell_state:
        raise ValueError("newton_apply: argument 'return_cell_state' is True for a cell of your own, expected False "
                         "(h has all of the state's slots)")
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"newton_apply: argument 'x' is a {type(x).__name__}, expected a tensor [B, T, input]")
    if not x.is_floating_point():
        raise TypeError(f"newton_apply: argument 'x' has dtype {x.dtype}, expected a floating-point dtype")
    input_size = getattr(cell, "input_size", None)
    if x.dim() != 3 or (isinstance(input_size, int) and x.shape[-1] != input_size):
        expected = f"[B, T, {input_size}]" if isinstance(input_size, int) else "[B, T, input]"
        raise ValueError(f"newton_apply: argument 'x' has shape {list(x.shape)}, expected {expected}")
    return layout, cfg, _user_cell.check_initial_state(layout, x, h0)


def _check_general_path_config(cfg):
    """What the general path (PyTorch around linear_scan) does not run: the C++ solver's other modes."""
    if cfg.scan_backend not in ("auto", "newton"):
        raise ValueError(f"newton_apply: argument 'cfg' has scan_backend {cfg.scan_backend!r}, expected 'auto' or "
                         "'newton' for a cell of your own on the general path (the fused and sequential modes are "
                         "C++ kernels: the built-in cells' and the compiled path's)")
    if cfg.picard_adapt:
        raise ValueError("newton_apply: argument 'cfg' has picard_adapt=True, expected False for a cell of your own "
                         "on the general path (set picard_iters instead)")


_distributed.register_agreement("newton_apply", (
    _distributed.Agreed("x", "batch size B"),
    _distributed.Agreed("cell", "state size (state_slots x hidden_size)"),
    _distributed.Agreed("x", "state dtype (h0's when given, else the dtype x is solved in)",
                        _distributed.describe_dtype, TypeError),
    _distributed.Agreed("x", "device type", _distributed.describe_device),
    _distributed.Agreed("cell", "jac_structure", _distributed.describe_structure),
    _distributed.Agreed("cfg", "max_iters"),
    _distributed.Agreed("cfg", "picard_iters"),
    _distributed.Agreed("cfg", "jacobian", lambda code: repr(JACOBIANS[code])),
    _distributed.Agreed("cfg", "omega", _distributed.describe_float),
    _distributed.Agreed("cfg", "residual_atol", _distributed.describe_float),
    _distributed.Agreed("cfg", "residual_fail", _distributed.describe_float),
    _distributed.Agreed("return_stats", "value", _distributed.describe_bool),
))


def _newton_apply_distributed(cell, x, cfg, h0, return_stats, return_cell_state, compile, group):
    """newton_apply with a process group: every rank checks its arguments, the ranks agree (or all
    raise), then the general path solves with distributed scans (_distributed.NewtonSlices)."""
    _distributed.check_group("newton_apply", group)
    builtin = isinstance(cell, (ParaGRU, ParaLSTM))
    error, values, steps = None, [], 0
    try:
        _check_compile_argument("newton_apply", compile)
        if builtin:
            if getattr(cell, "mix", "diag") == "head":
                raise NotImplementedError("newton_apply: argument 'cell' is a ParaGRU with mix='head' and "
                                          "'process_group' is given, but the distributed solve takes mix='diag' only "
                                          "(its general path would couple the whole state as one dense block)")
            cfg, _ = _checked_builtin_arguments(cell, x, cfg, h0, return_cell_state, compile)
            if cfg.scan_backend not in ("auto", "newton") or cfg.picard_adapt:
                raise ValueError(f"newton_apply: argument 'cfg' has scan_backend {cfg.scan_backend!r} and picard_adapt "
                                 f"{cfg.picard_adapt}, expected 'auto' or 'newton' and False with 'process_group' "
                                 "(the distributed solve is the general Newton path; the fused and sequential "
                                 "modes are single-process C++ kernels)")
            layout = _user_cell.CellLayout(_BuiltinCellSteps(cell))
            x_solved = _projection(cell, x)
            if h0 is not None and isinstance(cell, ParaLSTM):
                h0 = torch.stack([h0[1], h0[0]], dim=-2)  # slots (c, h)
        else:
            if compile is True:
                raise NotImplementedError("newton_apply: argument 'compile' is True with 'process_group', but the "
                                          "distributed solve is the general path (the compiled path solves in one "
                                          "process); pass compile='auto' or False")
            layout, cfg, h0 = _checked_user_cell_arguments(_general_path_cell(cell), x, cfg, h0, return_cell_state)
            _check_general_path_config(cfg)
            x_solved = x
        B, T = x_solved.shape[:2]
        dtype = h0.dtype if h0 is not None else x_solved.dtype
        first = slice(0, min(T, 1))
        with torch.no_grad():  # step's own errors (a wrong shape) on one step, before any collective
            layout.step(torch.zeros(layout.state_shape((B, first.stop)), dtype=dtype, device=x.device),
                        x_solved[:, first])
        values = [B, layout.state_size, _distributed.dtype_code(dtype), _distributed.device_code(x.device),
                  _distributed.STRUCTURE_CODES.index(layout.structure), cfg.max_iters, cfg.picard_iters,
                  JACOBIANS.index(cfg.jacobian), _distributed.float_code(cfg.omega),
                  _distributed.float_code(cfg.residual_atol), _distributed.float_code(cfg.residual_fail),
                  int(bool(return_stats))]
        steps = T
    except (TypeError, ValueError, NotImplementedError, RuntimeError) as raised:
        error = raised
    device = x.device if isinstance(x, torch.Tensor) else torch.device("cpu")
    slices = _distributed.agree("newton_apply", group, device, error, values, steps, h0 is not None,
                                torch.is_grad_enabled(), False)
    # The built-in cells solve outside autocast, as their operators do; a cell of your own as it is alone.
    precision = torch.autocast(device_type=device.type, enabled=False) if builtin else contextlib.nullcontext()
    with precision:
        h, residual, iterations = _user_cell.solve(layout, x_solved, h0, cfg, return_stats,
                                                   _distributed.NewtonSlices(slices))
    _check_divergence(residual, cfg)
    if builtin and isinstance(cell, ParaLSTM):
        h, c = h[:, :, 1], h[:, :, 0]
        h = (h, c) if return_cell_state else h
    return (h, _general_path_stats(residual, iterations)) if return_stats else h
