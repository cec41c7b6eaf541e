"""NewtonConfig(jacobian="quasi"): the quasi-Newton iterates (the diagonal of the cell's Jacobian)
of ParaGRU, ParaLSTM and cells of your own (general and compiled path) against a float64
quasi-Newton loop written here, convergence to the sequential loop, gradients, torch.compile and
the errors."""

import pytest
import torch

from conftest import graph_break_count
from paraseq import NewtonConfig, ParaGRU, ParaLSTM, newton_apply
from test_user_functions import DenseGRU, DiagonalCell, TwoSlotCell, cell_case, cell_loop

T = 12


def gru_step(cell, u_t):
    """ParaGRU's step on the state [B, H], from the reference equations."""
    H = cell.hidden_size
    a_z, a_r, a_c = cell.recurrent

    def step(h):
        z = torch.sigmoid(a_z * h + u_t[:, :H])
        r = torch.sigmoid(a_r * h + u_t[:, H:2 * H])
        c = torch.tanh(a_c * h * r + u_t[:, 2 * H:])
        return h + z * (c - h)
    return step


def lstm_step(cell, u_t):
    """ParaLSTM's step on the state [B, 2, H] (slots c, h), from the reference equations."""
    H = cell.hidden_size
    (a_f, a_c, a_o), (p_f, p_o) = cell.recurrent, cell.peephole

    def step(state):
        c, h = state[:, 0], state[:, 1]
        f = torch.sigmoid(a_f * h + p_f * c + u_t[:, :H])
        c_next = f * c + (1 - f) * torch.tanh(a_c * h + u_t[:, H:2 * H])
        h_next = torch.sigmoid(a_o * h + p_o * c_next + u_t[:, 2 * H:]) * torch.tanh(c_next)
        return torch.stack([c_next, h_next], dim=1)
    return step


def jacobian_diagonal(step, state):
    """d step(state)_i / d state_i for every batch element, one dense Jacobian each."""
    rows = []
    for b in range(state.shape[0]):
        at_b = lambda s: step(torch.cat([state[:b], s.reshape(1, *state.shape[1:]), state[b + 1:]]))[b].flatten()
        rows.append(torch.autograd.functional.jacobian(at_b, state[b].flatten()).diagonal())
    return torch.stack(rows).reshape(state.shape)


def quasi_newton_loop(steps, h0, iterations, omega=1.0):
    """`iterations` quasi-Newton iterations for h_t = steps[t](h_{t-1}), from the solver's guess
    h_t = steps[t](0): delta_t = D_t delta_{t-1} + steps[t](h_{t-1}) - h_t with D_t the diagonal
    of d steps[t] / dh at h_{t-1}, one t after the other; then h += omega delta."""
    with torch.no_grad():
        h = [step(torch.zeros_like(h0)) for step in steps]
    for _ in range(iterations):
        previous = [h0] + h[:-1]
        delta = torch.zeros_like(h0)
        updated = []
        for step, h_prev, h_t in zip(steps, previous, h):
            diagonal = jacobian_diagonal(step, h_prev)
            with torch.no_grad():
                delta = diagonal * delta + step(h_prev) - h_t
            updated.append(h_t + omega * delta)
        h = updated
    return torch.stack(h, dim=1)


def builtin_case(module):
    cell = module(3, 4).to(torch.float64)
    with torch.no_grad():  # recurrent weights large enough that a few iterations are far from converged
        cell.recurrent.mul_(4)
    x = torch.rand(2, T, 3, dtype=torch.float64) - 0.5
    h0 = 0.5 * torch.randn(2, 4, dtype=torch.float64)
    return cell, x, h0


def builtin_reference(cell, x, h0, iterations, omega=1.0):
    """The quasi-Newton loop of a ParaGRU ([B, T, H]) or ParaLSTM ([B, T, 2, H], slots c, h)."""
    u = (x @ cell.in_proj.weight.T + cell.in_proj.bias).detach()
    if isinstance(cell, ParaGRU):
        return quasi_newton_loop([gru_step(cell, u[:, t]) for t in range(T)], h0, iterations, omega)
    state0 = torch.stack([torch.zeros_like(h0), h0], dim=1)  # c0 = 0
    return quasi_newton_loop([lstm_step(cell, u[:, t]) for t in range(T)], state0, iterations, omega)


def builtin_solve(cell, x, h0, config):
    if isinstance(cell, ParaGRU):
        return newton_apply(cell, x, config, h0=h0)
    h, c = newton_apply(cell, x, config, h0=(h0, torch.zeros_like(h0)), return_cell_state=True)
    return torch.stack([c, h], dim=2)


@pytest.mark.parametrize("iterations, omega", [(1, 1.0), (2, 1.0), (4, 1.0), (3, 0.6)])
@pytest.mark.parametrize("module", [ParaGRU, ParaLSTM])
def test_builtin_quasi_iterates_match_a_float64_quasi_newton_loop(module, iterations, omega):
    cell, x, h0 = builtin_case(module)
    with torch.no_grad():
        expected = builtin_reference(cell, x, h0, iterations, omega)
        config = dict(max_iters=iterations, omega=omega, residual_fail=None, scan_backend="newton")
        quasi = builtin_solve(cell, x, h0, NewtonConfig(**config, jacobian="quasi"))
        exact = builtin_solve(cell, x, h0, NewtonConfig(**config))
    assert (quasi - expected).abs().max() <= 1e-12
    assert (quasi - builtin_solve(cell, x, h0, NewtonConfig(max_iters=T, residual_fail=None))).abs().max() > 1e-4
    if module is ParaGRU:  # a diagonal cell's quasi Jacobian is its exact one: the same scan
        assert torch.equal(quasi, exact)
    else:  # the LSTM's 2 x 2 blocks lose their off-diagonal entries
        assert (quasi - exact).abs().max() > 1e-6


def user_reference(cell, x, h0, iterations):
    x = x.detach()
    steps = [(lambda h, x_t=x[:, t]: cell.step(h, x_t)) for t in range(x.shape[1])]
    return quasi_newton_loop(steps, h0.detach(), iterations)


@pytest.mark.parametrize("compile", [False, True])
@pytest.mark.parametrize("cell_type", [DenseGRU, TwoSlotCell, DiagonalCell])
def test_user_cell_quasi_iterates_match_a_float64_quasi_newton_loop(cell_type, compile):
    """The general path (diagonal of torch.func's Jacobian, a diagonal linear_scan) and the compiled
    path (the C++ newton mode with NewtonJacobian::quasi)."""
    cell, x, h0 = cell_case(cell_type, "cpu", T=T)
    for iterations in (1, 3):
        config = dict(max_iters=iterations, residual_fail=None, scan_backend="newton")
        with torch.no_grad():
            quasi = newton_apply(cell, x, NewtonConfig(**config, jacobian="quasi"), h0=h0, compile=compile)
            exact = newton_apply(cell, x, NewtonConfig(**config), h0=h0, compile=compile)
        expected = user_reference(cell, x, h0, iterations)
        assert (quasi - expected).abs().max() <= 1e-12
        if cell_type is DiagonalCell:
            assert (quasi - exact).abs().max() <= 1e-15
        else:
            assert (quasi - exact).abs().max() > 1e-6


@pytest.mark.parametrize("module", [ParaGRU, ParaLSTM])
def test_converged_quasi_equals_the_sequential_loop_in_double(module):
    """Quasi-Newton with omega = 1 makes one more step exact per iteration: exact after T. With
    residual_atol it stops early; the sequential mode (and "auto") ignore the Jacobian."""
    cell, x, h0 = builtin_case(module)
    state0 = h0 if module is ParaGRU else (h0, torch.zeros_like(h0))
    expected = cell.sequential(x, state0)
    with torch.no_grad():
        after_t = newton_apply(cell, x, NewtonConfig(max_iters=T, jacobian="quasi", scan_backend="newton"), h0=state0)
        early, stats = newton_apply(cell, x, NewtonConfig(max_iters=200, residual_atol=1e-13, jacobian="quasi",
                                                          scan_backend="newton"), h0=state0, return_stats=True)
        assert (after_t - expected).abs().max() <= 1e-12
        assert (early - expected).abs().max() <= 1e-11 and stats.backend == "newton" and stats.iterations < 200
        sequential = NewtonConfig(max_iters=1, scan_backend="sequential")
        assert torch.equal(newton_apply(cell, x, NewtonConfig(max_iters=1, jacobian="quasi", scan_backend="sequential"),
                                        h0=state0), newton_apply(cell, x, sequential, h0=state0))
        auto, auto_stats = newton_apply(cell, x, NewtonConfig(max_iters=T, jacobian="quasi"), h0=state0,
                                        return_stats=True)
        assert auto_stats.backend in ("newton", "sequential") and (auto - expected).abs().max() <= 1e-12


@pytest.mark.parametrize("cell_type", [DenseGRU, TwoSlotCell])
def test_converged_quasi_of_a_user_cell_equals_the_loop(cell_type):
    cell, x, h0 = cell_case(cell_type, "cpu", T=T)
    expected = cell_loop(cell, x, h0)
    for compile in (False, True):
        h = newton_apply(cell, x, NewtonConfig(max_iters=T, jacobian="quasi"), h0=h0, compile=compile)
        assert (h - expected).abs().max() <= 1e-12


def packed(**settings):
    return NewtonConfig(**{"residual_fail": None, "scan_backend": "newton", "jacobian": "quasi",
                           **settings})._operator_config(eager=True)


def test_gradcheck_of_the_operators_with_the_quasi_jacobian():
    """The backward is the exact adjoint at the result: converged, the gradient of the solution."""
    u = (torch.rand(2, 7, 9, dtype=torch.float64) - 0.5).requires_grad_()
    a = (torch.rand(3, 3, dtype=torch.float64) - 0.5).requires_grad_()
    p = (torch.rand(2, 3, dtype=torch.float64) - 0.5).requires_grad_()
    h0 = (torch.rand(2, 3, dtype=torch.float64) - 0.5).requires_grad_()
    s0 = (torch.rand(2, 6, dtype=torch.float64) - 0.5).requires_grad_()
    gru = lambda u, a, h0: torch.ops.paraseq.para_gru(u, a, h0, packed(max_iters=8), False)[0]
    lstm = lambda u, a, p, s0: torch.ops.paraseq.para_lstm(u, a, p, s0, packed(max_iters=8), False)[0]
    assert torch.autograd.gradcheck(gru, (u, a, h0))
    assert torch.autograd.gradcheck(lstm, (u, a, p, s0))


@pytest.mark.parametrize("compile", [False, True])
def test_gradcheck_of_a_user_cell_with_the_quasi_jacobian(compile):
    cell, x, h0 = cell_case(TwoSlotCell, "cpu", T=6)
    config = NewtonConfig(max_iters=8, jacobian="quasi", scan_backend="newton")
    assert torch.autograd.gradcheck(lambda x, h0: newton_apply(cell, x, config, h0=h0, compile=compile), (x, h0))


def test_quasi_compiles_without_graph_breaks_and_equals_eager():
    cell = ParaLSTM(4, 8)
    x = torch.randn(2, 30, 4, requires_grad=True)
    config = NewtonConfig(max_iters=3, residual_fail=None, jacobian="quasi", scan_backend="newton")
    loss = lambda z: newton_apply(cell, z, config).square().sum()
    assert graph_break_count(loss, x) == 0
    compiled = torch.compile(lambda z: newton_apply(cell, z, config), fullgraph=True)
    h = compiled(x)
    eager = newton_apply(cell, x, config)
    assert torch.equal(h, eager)
    exact = newton_apply(cell, x, NewtonConfig(max_iters=3, residual_fail=None, scan_backend="newton"))
    assert not torch.equal(h, exact)  # the graph runs the quasi Jacobian
    (grad,) = torch.autograd.grad(h.square().sum(), x)
    (eager_grad,) = torch.autograd.grad(eager.square().sum(), x)
    assert torch.equal(grad, eager_grad)


def test_bad_jacobian_values_are_refused_naming_the_argument():
    with pytest.raises(ValueError, match=r"NewtonConfig: argument 'jacobian' is 'diagonal', expected one of "
                                         r"'exact', 'quasi'"):
        NewtonConfig(jacobian="diagonal")
    with pytest.raises(TypeError, match=r"NewtonConfig: argument 'jacobian' is None, expected one of 'exact', 'quasi'"):
        NewtonConfig(jacobian=None)
    with pytest.raises(ValueError, match=r"argument 'jacobian' is 'quasi' with scan_backend 'fused', expected "
                                         r"jacobian 'exact' for the fused mode"):
        NewtonConfig(jacobian="quasi", scan_backend="fused")
    u, a = torch.randn(2, 5, 18), torch.randn(3, 6)
    bad = packed()
    bad[8] = 2
    with pytest.raises(ValueError, match=r"para_gru: argument 'config' has entry 8 \(jacobian\) = 2, expected 0 "
                                         r"\(\"exact\"\) or 1 \(\"quasi\"\)"):
        torch.ops.paraseq.para_gru(u, a, None, bad, False)
    # Packed by hand, the fused mode with the quasi Jacobian reaches the solver, which refuses it.
    fused = packed()
    fused[7] = 2
    with pytest.raises(ValueError, match=r"config.mode.*fused together with the quasi Jacobian"):
        torch.ops.paraseq.para_lstm(u, a, a[:2], None, fused, False)
