"""The general path: cells and right-hand sides of your own, against float64 loops written here,
closed forms, finite differences and gradcheck; torch.compile; errors."""

import math

import pytest
import torch
from torch import nn

from conftest import graph_break_count
from paraseq import NewtonConfig, NewtonDivergenceError, compile_safe_config, newton_apply


# ---- cells ----------------------------------------------------------------------------------------

class DenseGRU(nn.Module):
    """A GRU with full recurrent matrices: its Jacobian mixes all channels."""

    def __init__(self, input_size, hidden_size):
        super().__init__()
        self.input_size, self.hidden_size = input_size, hidden_size
        self.input_map = nn.Linear(input_size, 3 * hidden_size)
        self.recurrent_map = nn.Linear(hidden_size, 3 * hidden_size, bias=False)
        with torch.no_grad():
            self.recurrent_map.weight.mul_(0.5)

    def step(self, h, x):
        H = self.hidden_size
        gx, gh = self.input_map(x), self.recurrent_map(h)
        z = torch.sigmoid(gx[..., :H] + gh[..., :H])
        r = torch.sigmoid(gx[..., H:2 * H] + gh[..., H:2 * H])
        c = torch.tanh(gx[..., 2 * H:] + r * gh[..., 2 * H:])
        return z * h + (1 - z) * c


class DiagonalCell(nn.Module):
    jac_structure = "diag"

    def __init__(self, input_size, hidden_size):
        super().__init__()
        self.hidden_size = hidden_size
        self.input_map = nn.Linear(input_size, hidden_size)
        self.decay = nn.Parameter(torch.rand(hidden_size) - 0.5)

    def step(self, h, x):
        return torch.tanh(self.decay * h + self.input_map(x))


class TwoSlotCell(nn.Module):
    """State [..., 2, H] (slots c, h) coupled within each channel: block2."""
    jac_structure, state_slots = "block2", 2

    def __init__(self, input_size, hidden_size):
        super().__init__()
        self.hidden_size = hidden_size
        self.input_map = nn.Linear(input_size, 2 * hidden_size)
        self.mix = nn.Parameter(torch.rand(4, hidden_size) - 0.5)

    def step(self, state, x):
        H = self.hidden_size
        c, h = state[..., 0, :], state[..., 1, :]
        u = self.input_map(x)
        c_next = torch.tanh(self.mix[0] * c + self.mix[1] * h + u[..., :H])
        h_next = torch.sigmoid(self.mix[2] * c + self.mix[3] * h + u[..., H:]) * c_next
        return torch.stack([c_next, h_next], dim=-2)


def cell_loop(cell, x, h0):
    """The recurrence h_t = step(h_{t-1}, x_t), one t after the other."""
    h, states = h0, []
    for x_t in x.unbind(1):
        h = cell.step(h, x_t)
        states.append(h)
    return torch.stack(states, dim=1)


def cell_case(cell_type, device, B=2, T=24):
    cell = cell_type(3, 5).to(device, torch.float64)
    x = (torch.rand(B, T, 3, dtype=torch.float64, device=device) - 0.5).requires_grad_()
    slots = getattr(cell, "state_slots", 1)
    shape = (B, 5) if slots == 1 else (B, slots, 5)
    h0 = (0.3 * torch.randn(shape, dtype=torch.float64, device=device)).requires_grad_()
    return cell, x, h0


CELLS = [DenseGRU, DiagonalCell, TwoSlotCell]


class CountingCell(DiagonalCell):
    """DiagonalCell that counts the calls of step (a jvp traces step once)."""

    def __init__(self, *args):
        super().__init__(*args)
        self.calls = 0

    def step(self, h, x):
        self.calls += 1
        return super().step(h, x)


def test_general_path_evaluates_the_step_only_where_needed(device):
    """K iterations cost K + 1 evaluations of step over all t (the first guess step(0, x), one
    linearisation per iteration); the evaluation at the solution and its linearisation are the
    adjoint's (and the residual's) and do not run for inference."""
    cell = CountingCell(3, 5).to(device, torch.float64)
    x = torch.rand(2, 16, 3, dtype=torch.float64, device=device)
    config = compile_safe_config(3)
    with torch.no_grad():
        h = newton_apply(cell, x, config, compile=False)
        assert cell.calls == 4
        cell.calls = 0
        _, stats = newton_apply(cell, x, config, return_stats=True, compile=False)
        assert cell.calls == 5 and stats.residual.max() <= 1e-6
    cell.calls = 0
    h_trained = newton_apply(cell, x, config, compile=False)
    assert cell.calls == 6 and h_trained.requires_grad
    assert torch.equal(h_trained.detach(), h)


@pytest.mark.parametrize("cell_type", CELLS)
def test_user_cells_match_the_loop_in_double(device, cell_type):
    cell, x, h0 = cell_case(cell_type, device)
    h, stats = newton_apply(cell, x, NewtonConfig(max_iters=8), h0=h0, return_stats=True, compile=False)
    expected = cell_loop(cell, x, h0)
    assert (h - expected).abs().max() <= 1e-12
    assert stats.residual.shape == (2,) and stats.residual.max() <= 1e-12
    weight = torch.randn_like(expected)
    inputs = [x, h0] + list(cell.parameters())
    got = torch.autograd.grad((h * weight).sum(), inputs)
    wanted = torch.autograd.grad((expected * weight).sum(), inputs)
    for g, e in zip(got, wanted):
        assert torch.allclose(g, e, rtol=1e-9, atol=1e-12)


def test_user_cell_gradcheck_in_double(device):
    for cell_type in (DiagonalCell, TwoSlotCell):  # DenseGRU's gradients: against the loop above
        cell, x, h0 = cell_case(cell_type, device, B=1, T=5)
        solve = lambda x, h0: newton_apply(cell, x, NewtonConfig(max_iters=10), h0=h0, compile=False)
        assert torch.autograd.gradcheck(solve, (x, h0))


# Inductor for one cell; the others through dynamo and AOTAutograd only, which is where graph
# breaks would come from (inductor's code generation costs most of the time on a small CPU).
@pytest.mark.parametrize("cell_type,backend", [(DiagonalCell, "inductor"), (DenseGRU, "aot_eager"),
                                               (TwoSlotCell, "aot_eager")])
def test_user_cells_compile_without_graph_breaks_and_equal_eager(device, cell_type, backend):
    cell, x, h0 = cell_case(cell_type, device, T=8)
    solve = lambda x, h0: newton_apply(cell, x, compile_safe_config(3), h0=h0, compile=False)
    assert graph_break_count(solve, x, h0) == 0
    compiled = torch.compile(solve, fullgraph=True, backend=backend)
    eager_h, compiled_h = solve(x, h0), compiled(x, h0)
    torch.testing.assert_close(compiled_h, eager_h, rtol=0, atol=1e-14)
    inputs = [x, h0] + list(cell.parameters())
    eager_grads = torch.autograd.grad(eager_h.square().sum(), inputs)
    compiled_grads = torch.autograd.grad(compiled_h.square().sum(), inputs)
    for c, e in zip(compiled_grads, eager_grads):
        torch.testing.assert_close(c, e, rtol=1e-12, atol=1e-14)


def test_general_path_stats_report_its_iterations_and_the_newton_mode(device):
    """residual_atol stops the general path before max_iters with a residual (from cell.step in a
    loop) within it; under torch.compile (no graph break) it runs max_iters, reported as tensors."""
    cell, x, h0 = cell_case(DiagonalCell, device)
    x, h0 = x.detach(), h0.detach()
    expected = cell_loop(cell, x, h0)
    h, stats = newton_apply(cell, x, NewtonConfig(max_iters=30, residual_fail=None), h0=h0, return_stats=True,
                            compile=False)
    assert stats.iterations == 30 and stats.backend == "newton"
    early = NewtonConfig(max_iters=30, residual_atol=1e-10, residual_fail=None)
    h, stats = newton_apply(cell, x, early, h0=h0, return_stats=True, compile=False)
    assert type(stats.iterations) is int and 1 <= stats.iterations < 30 and stats.backend == "newton"
    previous = torch.cat([h0.unsqueeze(1), h[:, :-1]], 1)
    with torch.no_grad():
        assert (h - cell.step(previous, x)).abs().max() <= 1e-10
    assert (h - expected).abs().max() <= 1e-9
    solve = lambda x, h0: newton_apply(cell, x, early, h0=h0, return_stats=True, compile=False)
    assert graph_break_count(solve, x, h0) == 0
    _, compiled_stats = torch.compile(solve, fullgraph=True, backend="aot_eager")(x, h0)
    assert int(compiled_stats.iterations) == 30 and int(compiled_stats.backend) == 1  # "newton"


@pytest.mark.parametrize("loss", [torch.sum, lambda h: h.square().sum()], ids=["linear", "square"])
def test_user_cell_second_derivatives_raise(device, loss):
    """Also when the loss is linear, so that its gradient does not depend on h."""
    cell, x, h0 = cell_case(DiagonalCell, device, T=6)
    (grad,) = torch.autograd.grad(loss(newton_apply(cell, x, h0=h0, compile=False)), cell.decay, create_graph=True)
    with pytest.raises(NotImplementedError, match="not differentiable"):
        grad.sum().backward()


def test_a_wrong_jacobian_structure_is_caught(device):
    cell, x, h0 = cell_case(DenseGRU, device)
    cell.jac_structure = "diag"  # its recurrent matrices mix the channels
    # The diagonal quasi-Newton iteration converges to the solution (the residual check passes), but
    # its Jacobians would make the gradients wrong: the structure check refuses it.
    h, stats = newton_apply(cell, x, NewtonConfig(max_iters=40, residual_fail=None), h0=h0, return_stats=True,
                            compile=False)
    assert stats.residual.max() <= 1e-10
    with pytest.raises(ValueError, match="declares jac_structure 'diag', but the Jacobian of its step"):
        newton_apply(cell, x, NewtonConfig(max_iters=40), h0=h0, compile=False)


def test_a_diverged_user_solve_is_refused(device):
    cell, x, h0 = cell_case(DenseGRU, device)
    with torch.no_grad():
        cell.recurrent_map.weight.mul_(20)
    with pytest.raises(NewtonDivergenceError, match="did not converge"):
        newton_apply(cell, 3 * x, NewtonConfig(max_iters=2), h0=h0, compile=False)


class NoHiddenSize(nn.Module):
    def step(self, h, x):
        return h


class WrongShape(DiagonalCell):
    def step(self, h, x):
        return super().step(h, x)[..., :-1]


def test_user_cell_errors_name_the_argument(device):
    cell, x, h0 = cell_case(DiagonalCell, device)
    with pytest.raises(TypeError, match="argument 'cell' is a .*NoHiddenSize.*hidden_size >= 1 \\(it has None\\)"):
        newton_apply(NoHiddenSize(), x)
    with pytest.raises(TypeError, match="argument 'cell' is a torch.nn.modules.rnn.GRU.*step\\(h_prev, x\\)"):
        newton_apply(nn.GRU(3, 5), x)
    with pytest.raises(TypeError, match="argument 'cell'.*expected a paraseq.ParaGRU"):
        newton_apply(lambda h, x: h, x)
    cell.jac_structure = "head"
    with pytest.raises(ValueError, match="argument 'cell'.*jac_structure 'head', expected one of 'diag'"):
        newton_apply(cell, x)
    cell.jac_structure = "block4"
    with pytest.raises(ValueError, match="jac_structure 'block4' with state_slots 1"):
        newton_apply(cell, x)
    cell.jac_structure = "diag"
    with pytest.raises(ValueError, match="argument 'compile' is 'yes'"):
        newton_apply(cell, x, compile="yes")
    with pytest.raises(ValueError, match=r"argument 'h0' has shape \[2, 4\], expected \[2, 5\]"):
        newton_apply(cell, x, h0=h0[:, :4])
    with pytest.raises(ValueError, match="argument 'cell'.*returned shape"):
        newton_apply(WrongShape(3, 5).to(device, torch.float64), x)
    with pytest.raises(ValueError, match="scan_backend 'fused'"):
        newton_apply(cell, x, NewtonConfig(scan_backend="fused"), compile=False)
    big = DenseGRU(3, 40).to(device, torch.float64)
    with pytest.raises(ValueError, match="at most 32"):
        newton_apply(big, x)


# ---- right-hand sides -------------------------------------------------------------------------------

from paraseq import fields, odeint  # noqa: E402

DOUBLE = torch.float64


def oscillator_closure(k, c):
    """y0' = y1, y1' = -k y0 - c y1, closing over k (a tensor) and c."""
    def rhs(t, y):
        return torch.stack([y[..., 1], -k * y[..., 0] - c * y[..., 1]], dim=-1)
    return rhs


class VanDerPol(nn.Module):
    def __init__(self, mu):
        super().__init__()
        self.mu = nn.Parameter(torch.tensor(mu, dtype=DOUBLE))

    def forward(self, t, y):
        return torch.stack([y[..., 1], self.mu * (1 - y[..., 0] ** 2) * y[..., 1] - y[..., 0]], dim=-1)


class NeuralODE(nn.Module):
    def __init__(self, n, hidden):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(n, hidden), nn.Tanh(), nn.Linear(hidden, n)).to(DOUBLE)

    def forward(self, t, y):
        return self.net(y)


def rk4_loop(func, y0, times, substeps):
    """Classic RK4 written here: `substeps` equal steps between consecutive times."""
    y, out = y0, [y0]
    for t_a, t_b in zip(times[:-1], times[1:]):
        h = (t_b - t_a) / substeps
        for s in range(substeps):
            t = t_a + s * h
            tt = torch.full((*y.shape[:-1], 1), t, dtype=y.dtype, device=y.device)
            k1 = func(tt, y)
            k2 = func(tt + h / 2, y + h / 2 * k1)
            k3 = func(tt + h / 2, y + h / 2 * k2)
            k4 = func(tt + h, y + h * k3)
            y = y + h / 6 * (k1 + 2 * k2 + 2 * k3 + k4)
        out.append(y)
    return torch.stack(out)


METHODS = [("dopri5", None), ("heun", None), ("rk4", None), ("euler", None), ("rk4", 0.07), ("dopri5", 0.25),
           ("heun", 0.1)]


@pytest.mark.parametrize("method,step_size", METHODS)
def test_a_closure_equals_the_built_in_field(device, method, step_size):
    """The same field as a closure and as paraseq.fields.DampedOscillator (the C++ loops): the same
    steps, so the same values and gradients to rounding."""
    k = torch.tensor(2.0, dtype=DOUBLE, device=device, requires_grad=True)
    y0 = torch.tensor([[1.0, 0.0], [0.5, 0.2], [-0.3, 1.0]], dtype=DOUBLE, device=device, requires_grad=True)
    t = torch.linspace(0, 2, 5, dtype=DOUBLE, device=device)
    tolerances = dict(rtol=1e-5, atol=1e-7) if method == "heun" else {}
    ours = odeint(oscillator_closure(k, 0.3), y0, t, method=method, step_size=step_size, **tolerances, compile=False)
    built_in = odeint(fields.DampedOscillator(k, 0.3), y0, t, method=method, step_size=step_size, **tolerances)
    torch.testing.assert_close(ours, built_in, rtol=0, atol=1e-13)
    weight = torch.randn_like(ours)
    for a, b in zip(torch.autograd.grad((ours * weight).sum(), (y0, k)),
                    torch.autograd.grad((built_in * weight).sum(), (y0, k))):
        torch.testing.assert_close(a, b, rtol=1e-11, atol=1e-12)


@pytest.mark.parametrize("method,rtol,tolerance", [("dopri5", 1e-10, 1e-9), ("tsit5", 1e-10, 1e-9),
                                                   ("bosh3", 1e-10, 1e-8)])  # bosh3: third order, more error
def test_a_time_dependent_closure_against_its_closed_form(device, method, rtol, tolerance):
    """y' = -a y + sin(t): y = (y0 - s(0)) e^(-a t) + s(t), s(t) = (a sin t - cos t) / (1 + a^2)."""
    a = torch.tensor([[0.5], [2.0]], dtype=DOUBLE, device=device)
    y0 = torch.tensor([[1.0], [-0.5]], dtype=DOUBLE, device=device)
    t = torch.linspace(0, 3, 7, dtype=DOUBLE, device=device)
    got = odeint(lambda t, y: -a * y + torch.sin(t), y0, t, method=method, rtol=rtol, atol=rtol * 1e-2, compile=False)
    s = lambda t: (a * torch.sin(t) - torch.cos(t)) / (1 + a ** 2)
    expected = torch.stack([(y0 - s(torch.zeros(()))) * torch.exp(-a * ti) + s(ti) for ti in t])
    torch.testing.assert_close(got, expected, rtol=0, atol=tolerance)


def test_van_der_pol_module_against_a_fine_rk4_loop(device):
    """Adaptive dopri5 on a learnable Van der Pol oscillator: states and gradients (y0, mu) against
    autograd through an RK4 loop of 400 steps per interval written here."""
    model = VanDerPol(1.5).to(device)
    y0 = torch.tensor([[2.0, 0.0], [0.5, -1.0]], dtype=DOUBLE, device=device, requires_grad=True)
    times = [0.0, 0.5, 1.0, 2.0]
    got = odeint(model, y0, torch.tensor(times, dtype=DOUBLE), rtol=1e-10, atol=1e-12, compile=False)
    expected = rk4_loop(model, y0, times, 400)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-8)
    weight = torch.randn_like(got)
    for a, b in zip(torch.autograd.grad((got * weight).sum(), (y0, model.mu)),
                    torch.autograd.grad((expected * weight).sum(), (y0, model.mu))):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


def test_neural_ode_with_fixed_steps_equals_the_rk4_loop(device):
    model = NeuralODE(3, 8).to(device)
    y0 = torch.randn(4, 3, dtype=DOUBLE, device=device, requires_grad=True)
    times = [0.0, 0.3, 0.6, 0.9]
    got = odeint(model, y0, torch.tensor(times, dtype=DOUBLE), method="rk4", step_size=0.1, compile=False)
    expected = rk4_loop(model, y0, times, 3)  # step_size 0.1 splits every interval in equal steps
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-13)
    inputs = [y0] + list(model.parameters())
    weight = torch.randn_like(got)
    for a, b in zip(torch.autograd.grad((got * weight).sum(), inputs),
                    torch.autograd.grad((expected * weight).sum(), inputs)):
        torch.testing.assert_close(a, b, rtol=1e-11, atol=1e-12)


def test_each_trajectory_takes_its_own_steps(device):
    """A stiff and a slow trajectory together give what each gives alone."""
    rates = torch.tensor([[40.0], [0.1]], dtype=DOUBLE, device=device)
    rhs = lambda t, y: -rates * y * (1 + 0.5 * torch.sin(3 * y))
    y0 = torch.tensor([[1.0], [1.0]], dtype=DOUBLE, device=device)
    t = torch.tensor([0.0, 0.5, 1.0], dtype=DOUBLE, device=device)
    together = odeint(rhs, y0, t, rtol=1e-6, atol=1e-9, compile=False)
    for row in range(2):
        alone = odeint(lambda t, y, r=rates[row:row + 1]: -r * y * (1 + 0.5 * torch.sin(3 * y)), y0[row:row + 1], t,
                       rtol=1e-6, atol=1e-9, compile=False)
        torch.testing.assert_close(together[:, row:row + 1], alone, rtol=0, atol=1e-15)


SCALE = torch.tensor(0.8, dtype=DOUBLE, requires_grad=True)


def decay_by_a_global(t, y):
    return -SCALE * y


def test_tensors_are_found_in_closures_defaults_globals_and_modules(device):
    y0 = torch.tensor([1.0, 2.0], dtype=DOUBLE)
    t = torch.tensor([0.0, 1.0], dtype=DOUBLE)
    k = torch.tensor(0.8, dtype=DOUBLE, requires_grad=True)
    for func, tensor in ((decay_by_a_global, SCALE), (lambda t, y: -k * y, k),
                         (lambda t, y, rate=k: -rate * y, k)):
        (grad,) = torch.autograd.grad(odeint(func, y0, t, compile=False)[-1].sum(), tensor)
        expected = -(y0 * math.exp(-0.8)).sum()  # d/dk of y0 e^(-k)
        torch.testing.assert_close(grad, expected, rtol=1e-7, atol=0)


def test_one_trajectory_is_called_as_torchdiffeq_calls_it(device):
    seen = []

    def rhs(t, y):
        seen.append((tuple(t.shape), tuple(y.shape)))
        return -y

    out = odeint(rhs, torch.ones(3, dtype=DOUBLE, device=device), torch.tensor([0.0, 1.0], dtype=DOUBLE), compile=False)
    assert out.shape == (2, 3) and set(seen) == {((), (3,))}
    torch.testing.assert_close(out[-1], torch.full((3,), math.exp(-1), dtype=DOUBLE, device=device), rtol=1e-7, atol=0)


def test_gradcheck_of_the_general_odeint_in_double(device):
    k = torch.tensor(1.3, dtype=DOUBLE, device=device, requires_grad=True)
    y0 = torch.tensor([[0.4, -0.2]], dtype=DOUBLE, device=device, requires_grad=True)
    t = torch.tensor([0.0, 0.4, 1.0], dtype=DOUBLE, device=device)
    for method, step_size in (("rk4", 0.3), ("dopri5", 0.5), ("heun", None)):
        solve = lambda y0, k: odeint(lambda t, y: torch.tanh(oscillator_closure(k, 0.2)(t, y)), y0, t,
                                     method=method, step_size=step_size, rtol=1e-4, atol=1e-6, compile=False)
        assert torch.autograd.gradcheck(solve, (y0, k))


def test_per_trajectory_tensors_of_a_closure_get_their_gradients_with_adaptive_steps(device):
    # Rates [N, 1] of different sizes make the trajectories take different numbers of steps, so
    # every reversed attempt has rows that did not take it; the closure still sees all N rows.
    rate = torch.tensor([[0.3], [2.5], [7.0]], dtype=DOUBLE, device=device, requires_grad=True)
    y0 = torch.tensor([[1.0], [-0.5], [2.0]], dtype=DOUBLE, device=device, requires_grad=True)
    t = torch.tensor([0.0, 0.5, 1.0], dtype=DOUBLE, device=device)
    # (method, rtol of the steps, how close the discrete adjoint then is to the exact derivative)
    for method, tolerance, agreement in (("bosh3", 1e-8, 1e-5), ("dopri5", 1e-10, 1e-7), ("tsit5", 1e-10, 1e-7)):
        out = odeint(lambda t, y: -rate * y, y0, t, method=method, rtol=tolerance, atol=1e-12, compile=False)
        grad_y0, grad_rate = torch.autograd.grad(out[-1].sum(), (y0, rate))
        decay = torch.exp(-rate.detach())  # y(1) = y0 e^(-rate)
        torch.testing.assert_close(grad_y0, decay, rtol=agreement, atol=0, msg=method)
        torch.testing.assert_close(grad_rate, -y0.detach() * decay, rtol=agreement, atol=0, msg=method)


def test_general_odeint_compiles_to_one_graph_equal_to_eager(device):
    model = VanDerPol(1.0).to(device)
    y0 = torch.tensor([[2.0, 0.0], [1.0, 1.0]], dtype=DOUBLE, device=device, requires_grad=True)
    t = torch.linspace(0, 1, 4, dtype=DOUBLE, device=device)
    solve = lambda y0: odeint(model, y0, t, rtol=1e-6, atol=1e-8, compile=False)
    assert graph_break_count(solve, y0) == 0
    compiled = torch.compile(solve, fullgraph=True)
    eager_y, compiled_y = solve(y0), compiled(y0)
    assert torch.equal(compiled_y, eager_y)  # the integration is one opaque operator: the same bits
    inputs = (y0, model.mu)
    weight = torch.randn_like(eager_y)
    for a, b in zip(torch.autograd.grad((compiled_y * weight).sum(), inputs),
                    torch.autograd.grad((eager_y * weight).sum(), inputs)):
        assert torch.equal(a, b)


class DecayWithAMethod(nn.Module):
    def __init__(self):
        super().__init__()
        self.rate = nn.Parameter(torch.tensor(0.5, dtype=DOUBLE))

    def rhs(self, t, y):
        return -self.rate * y * torch.cos(t)


def test_closures_and_bound_methods_compile_without_graph_breaks(device):
    k = torch.tensor(0.7, dtype=DOUBLE, device=device, requires_grad=True)
    module = DecayWithAMethod().to(device)
    y0 = torch.ones(2, 2, dtype=DOUBLE, device=device, requires_grad=True)
    t = torch.tensor([0.0, 0.5, 1.0], dtype=DOUBLE, device=device)
    for func, tensor in ((oscillator_closure(k, 0.2), k), (module.rhs, module.rate)):
        solve = lambda y0: odeint(func, y0, t, compile=False)
        assert graph_break_count(solve, y0) == 0
        compiled = torch.compile(solve, fullgraph=True, backend="aot_eager")
        eager_y, compiled_y = solve(y0), compiled(y0)
        assert torch.equal(compiled_y, eager_y)
        for a, b in zip(torch.autograd.grad(compiled_y.sum(), (y0, tensor)),
                        torch.autograd.grad(eager_y.sum(), (y0, tensor))):
            assert torch.equal(a, b)


@pytest.mark.parametrize("loss", [torch.sum, lambda out: out.square().sum()], ids=["linear", "square"])
def test_general_odeint_second_derivatives_raise(device, loss):
    """Also when the loss is linear, so that its gradient does not depend on the output."""
    k = torch.tensor(1.0, dtype=DOUBLE, device=device, requires_grad=True)
    y0 = torch.tensor([[1.0, 0.0]], dtype=DOUBLE, device=device)
    out = odeint(oscillator_closure(k, 0.1), y0, torch.tensor([0.0, 1.0], dtype=DOUBLE), method="rk4", compile=False)
    (grad,) = torch.autograd.grad(loss(out), k, create_graph=True)
    with pytest.raises(NotImplementedError, match="does not support double backward"):
        grad.backward()


class _Holder:
    pass


def test_general_odeint_errors_name_the_argument(device):
    y0 = torch.ones(2, 2, dtype=DOUBLE, device=device)
    t = torch.tensor([0.0, 1.0], dtype=DOUBLE)
    with pytest.raises(ValueError, match=r"argument 'func' returned shape \[2, 1\].*expected y's shape \[2, 2\]"):
        odeint(lambda t, y: y[:, :1], y0, t, compile=False)
    with pytest.raises(ValueError, match="argument 'func' returned shape.*dtype torch.float32"):
        odeint(lambda t, y: y.float(), y0, t, compile=False)
    with pytest.raises(TypeError, match="argument 'func' is a int, expected a callable"):
        odeint(3, y0, t, compile=False)
    with pytest.raises(ValueError, match="argument 'compile' is False for the built-in field"):
        odeint(fields.DampedOscillator(1.0, 0.1), y0, t, compile=False)
    hidden = _Holder()
    hidden.rate = torch.tensor(1.0, dtype=DOUBLE, requires_grad=True)
    with pytest.raises(ValueError, match="argument 'func' uses a tensor that requires grad which odeint does not"):
        odeint(lambda t, y, holder=hidden: -holder.rate * y, y0, t, compile=False)
    with pytest.raises(RuntimeError, match="trajectories failed.*max_steps"):
        odeint(lambda t, y: -1000 * y, y0, t, max_steps=5, compile=False)
    with pytest.raises(RuntimeError, match="trajectories failed.*non_finite"):
        odeint(lambda t, y: y * y, y0, torch.tensor([0.0, 5.0], dtype=DOUBLE), method="rk4", step_size=0.5,
               compile=False)
    with pytest.raises(ValueError, match="argument 't' has t\\[1\\] = 0.0 after"):
        odeint(lambda t, y: -y, y0, torch.tensor([0.0, 0.0], dtype=DOUBLE), compile=False)
    with pytest.raises(ValueError, match="'rtol' and 'atol' are both 0"):
        odeint(lambda t, y: -y, y0, t, rtol=0, atol=0, compile=False)
