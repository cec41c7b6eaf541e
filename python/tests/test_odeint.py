"""odeint against closed forms and a Runge-Kutta loop written here; gradients; compile; errors."""

import math

import pytest
import torch

from conftest import graph_break_count
from paraseq import fields, odeint

DOUBLE = torch.float64


def oscillator_closed_form(k, c, y0, t):
    """exp(M t) y0 for M = [[0, 1], [-k, -c]], per trajectory."""
    M = torch.stack([torch.stack([torch.zeros_like(k), torch.ones_like(k)], -1), torch.stack([-k, -c], -1)], -2)
    return torch.stack([torch.einsum("nij,nj->ni", torch.linalg.matrix_exp(M * s), y0) for s in t.tolist()])


# Tolerances: the global error of each method at its step size or rtol (euler O(h), heun O(h^2),
# rk4 and dopri5 O(h^4) and O(h^5)), with a margin of about 2.
@pytest.mark.parametrize("method,step_size,rtol,tolerance", [
    ("dopri5", None, 1e-9, 1e-7), ("heun", None, 1e-6, 1e-4), ("rk4", 0.01, None, 2e-8), ("euler", 1e-4, None, 3e-3),
    ("heun", 1e-3, None, 1e-5), ("dopri5", 0.05, None, 1e-7),
    ("bosh3", None, 1e-8, 1e-6), ("tsit5", None, 1e-9, 1e-7), ("bosh3", 0.01, None, 1e-5), ("tsit5", 0.05, None, 1e-7)])
def test_damped_oscillator_matches_the_closed_form(device, method, step_size, rtol, tolerance):
    """Per-trajectory k and c, observation times inside the steps (dense output), and the same
    trajectory alone as torchdiffeq's y0 [n] (bosh3 and tsit5 take the general path, where k and c
    ride in the state)."""
    k = torch.tensor([1.0, 4.0, 2.5], dtype=DOUBLE, device=device)
    c = torch.tensor([0.0, 0.3, 1.0], dtype=DOUBLE, device=device)
    y0 = torch.randn(3, 2, dtype=DOUBLE, device=device)
    t = torch.tensor([0.0, 0.37, 1.0, 2.0], dtype=DOUBLE, device=device)
    y = odeint(fields.DampedOscillator(k, c), y0, t, method=method, step_size=step_size, rtol=rtol or 1e-6,
               atol=(rtol or 1e-6) * 1e-2)
    assert y.shape == (4, 3, 2)
    assert torch.equal(y[0], y0)
    assert (y - oscillator_closed_form(k, c, y0, t)).abs().max() <= tolerance
    one = odeint(fields.DampedOscillator(k[1], c[1]), y0[1], t, method=method, step_size=step_size,
                 rtol=rtol or 1e-6, atol=(rtol or 1e-6) * 1e-2)
    assert one.shape == (4, 2) and (one - oscillator_closed_form(k[1:2], c[1:2], y0[1:2], t)[:, 0]).abs().max() <= tolerance


def test_rk4_on_the_grid_converges_with_order_four(device):
    k, c = torch.tensor(3.0, dtype=DOUBLE, device=device), torch.tensor(0.2, dtype=DOUBLE, device=device)
    y0 = torch.tensor([[1.0, 0.0]], dtype=DOUBLE, device=device)
    field = fields.DampedOscillator(k, c)
    exact = oscillator_closed_form(k.reshape(1), c.reshape(1), y0, torch.tensor([2.0], device=device))[0]
    grids = [torch.linspace(0, 2, steps + 1, dtype=DOUBLE, device=device) for steps in (20, 40)]
    errors = [(odeint(field, y0, t, method="rk4")[-1] - exact).abs().max() for t in grids]
    assert 14 <= errors[0] / errors[1] <= 18


def test_linear_field_shared_and_per_trajectory(device):
    n, N = 3, 4
    A = torch.randn(n, n, dtype=DOUBLE, device=device) * 0.5
    y0 = torch.randn(N, n, dtype=DOUBLE, device=device)
    t = torch.tensor([0.0, 0.5, 1.5], dtype=DOUBLE, device=device)
    y = odeint(fields.Linear(A), y0, t, rtol=1e-10, atol=1e-12)
    expected = torch.stack([y0 @ torch.linalg.matrix_exp(A * s).T for s in t.tolist()])
    assert (y - expected).abs().max() <= 1e-8
    A_each = torch.randn(N, n, n, dtype=DOUBLE, device=device) * 0.5
    b = torch.randn(n, dtype=DOUBLE, device=device)
    y = odeint(fields.Linear(A_each, b), y0, t, rtol=1e-10, atol=1e-12)
    # y(t) = e^{At} y0 + A^{-1} (e^{At} - I) b
    identity = torch.eye(n, dtype=DOUBLE, device=device)
    for j, s in enumerate(t.tolist()):
        E = torch.linalg.matrix_exp(A_each * s)
        particular = torch.linalg.solve(A_each, torch.einsum("nij,j->ni", E - identity, b))
        assert (y[j] - (torch.einsum("nij,nj->ni", E, y0) + particular)).abs().max() <= 1e-8


def test_sir_without_recovery_is_logistic_and_conserves_the_population(device):
    beta, i0 = torch.tensor([0.8, 1.5], dtype=DOUBLE, device=device), 0.01
    y0 = torch.tensor([[1 - i0, i0, 0.0]] * 2, dtype=DOUBLE, device=device)
    t = torch.linspace(0, 5, 6, dtype=DOUBLE, device=device)
    y = odeint(fields.SIR(beta, 0.0), y0, t, rtol=1e-10, atol=1e-12)
    growth = torch.exp(beta[None, :] * t[:, None])
    assert (y[..., 1] - i0 * growth / (1 - i0 + i0 * growth)).abs().max() <= 1e-8
    y = odeint(fields.SIR(beta, 0.3), y0, t)
    assert (y.sum(-1) - 1).abs().max() <= 1e-12


def test_lotka_volterra_conserves_its_invariant(device):
    alpha, beta, delta, gamma = 1.1, 0.4, 0.1, 0.4
    y0 = torch.tensor([[10.0, 5.0], [3.0, 2.0]], dtype=DOUBLE, device=device)
    t = torch.linspace(0, 20, 11, dtype=DOUBLE, device=device)
    y = odeint(fields.LotkaVolterra(alpha, beta, delta, gamma), y0, t, rtol=1e-10, atol=1e-12)
    x, p = y[..., 0], y[..., 1]
    invariant = delta * x - gamma * torch.log(x) + beta * p - alpha * torch.log(p)
    assert (invariant - invariant[0]).abs().max() <= 1e-7


def rk4_loop(f, y, t, step):
    """A torchdiffeq-style fixed-step loop landing on each t."""
    out, now = [y], t[0].item()
    for target in t[1:].tolist():
        while now < target - 1e-12:
            h = min(step, target - now)
            k1 = f(y)
            k2 = f(y + h / 2 * k1)
            k3 = f(y + h / 2 * k2)
            k4 = f(y + h * k3)
            y, now = y + h / 6 * (k1 + 2 * k2 + 2 * k3 + k4), now + h
        out.append(y)
    return torch.stack(out)


def mlp_field(device, n=3, hidden=5):
    weights = [torch.randn(hidden, n, dtype=DOUBLE, device=device) * 0.5,
               torch.randn(hidden, dtype=DOUBLE, device=device) * 0.1,
               torch.randn(n, hidden, dtype=DOUBLE, device=device) * 0.5,
               torch.randn(n, dtype=DOUBLE, device=device) * 0.1]
    return [w.requires_grad_() for w in weights]


def test_mlp_matches_the_loop_and_its_gradients(device):
    W1, b1, W2, b2 = mlp_field(device)
    y0 = torch.randn(4, 3, dtype=DOUBLE, device=device, requires_grad=True)
    t = torch.tensor([0.0, 0.3, 1.0], dtype=DOUBLE, device=device)
    f = lambda y: torch.tanh(y @ W1.T + b1) @ W2.T + b2
    y = odeint(fields.MLP(W1, b1, W2, b2), y0, t, method="rk4", step_size=0.1)
    expected = rk4_loop(f, y0, t, 0.1)
    assert (y - expected).abs().max() <= 1e-13
    weight = torch.randn_like(y)
    inputs = (y0, W1, b1, W2, b2)
    for g, e in zip(torch.autograd.grad((y * weight).sum(), inputs), torch.autograd.grad((expected * weight).sum(), inputs)):
        assert torch.allclose(g, e, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("method", ["euler", "heun", "rk4", "dopri5"])
def test_gradcheck_fixed_steps(device, method):
    k = torch.tensor([1.5, 2.0], dtype=DOUBLE, device=device, requires_grad=True)
    c = torch.tensor([0.1, 0.4], dtype=DOUBLE, device=device, requires_grad=True)
    y0 = torch.randn(2, 2, dtype=DOUBLE, device=device, requires_grad=True)
    t = torch.tensor([0.0, 0.25, 0.6], dtype=DOUBLE, device=device)
    fn = lambda y0, k, c: odeint(fields.DampedOscillator(k, c), y0, t, method=method, step_size=0.1)
    assert torch.autograd.gradcheck(fn, (y0, k, c))


def test_adaptive_gradient_matches_the_closed_form_sensitivity(device):
    A = torch.randn(3, 3, dtype=DOUBLE, device=device) * 0.5
    y0 = torch.randn(2, 3, dtype=DOUBLE, device=device, requires_grad=True)
    y = odeint(fields.Linear(A), y0, torch.tensor([0.0, 1.0], dtype=DOUBLE, device=device), rtol=1e-10, atol=1e-12)
    grad, = torch.autograd.grad(y[-1].sum(), y0)
    expected = torch.linalg.matrix_exp(A).T @ torch.ones(3, dtype=DOUBLE, device=device)
    assert (grad - expected).abs().max() <= 1e-8


# ---- bosh3 and tsit5: the built-in fields on the general path ---------------------------------------

@pytest.mark.parametrize("method,order", [("bosh3", 3), ("tsit5", 5)])
def test_bosh3_and_tsit5_converge_with_their_order(device, method, order):
    """Halving a fixed step divides the global error by about 2^order: the tableaus are right."""
    k, c = torch.tensor([3.0], dtype=DOUBLE, device=device), torch.tensor([0.2], dtype=DOUBLE, device=device)
    y0 = torch.tensor([[1.0, 0.0]], dtype=DOUBLE, device=device)
    t = torch.tensor([0.0, 2.0], dtype=DOUBLE, device=device)
    exact = oscillator_closed_form(k, c, y0, t)[-1]
    errors = [(odeint(fields.DampedOscillator(k, c), y0, t, method=method, step_size=step)[-1] - exact).abs().max()
              for step in (0.1, 0.05)]
    assert 0.75 * 2 ** order <= errors[0] / errors[1] <= 1.3 * 2 ** order


@pytest.mark.parametrize("method", ["bosh3", "tsit5"])
def test_bosh3_and_tsit5_on_linear_sir_and_mlp_fields(device, method):
    n, N = 3, 4
    A = torch.randn(n, n, dtype=DOUBLE, device=device) * 0.5
    y0 = torch.randn(N, n, dtype=DOUBLE, device=device)
    t = torch.tensor([0.0, 0.5, 1.5], dtype=DOUBLE, device=device)
    y = odeint(fields.Linear(A), y0, t, method=method, rtol=1e-10, atol=1e-12)
    assert (y - torch.stack([y0 @ torch.linalg.matrix_exp(A * s).T for s in t.tolist()])).abs().max() <= 1e-7
    A_each = torch.randn(N, n, n, dtype=DOUBLE, device=device) * 0.5
    b = torch.randn(N, n, dtype=DOUBLE, device=device)
    y = odeint(fields.Linear(A_each, b), y0, t, method=method, rtol=1e-10, atol=1e-12)
    identity = torch.eye(n, dtype=DOUBLE, device=device)
    for j, s in enumerate(t.tolist()):
        E = torch.linalg.matrix_exp(A_each * s)
        particular = torch.linalg.solve(A_each, torch.einsum("nij,nj->ni", E - identity, b))
        assert (y[j] - (torch.einsum("nij,nj->ni", E, y0) + particular)).abs().max() <= 1e-7
    beta, i0 = torch.tensor([0.8, 1.5], dtype=DOUBLE, device=device), 0.01
    s0 = torch.tensor([[1 - i0, i0, 0.0]] * 2, dtype=DOUBLE, device=device)
    times = torch.linspace(0, 5, 6, dtype=DOUBLE, device=device)
    y = odeint(fields.SIR(beta, 0.0), s0, times, method=method, rtol=1e-10, atol=1e-12)
    growth = torch.exp(beta[None, :] * times[:, None])
    assert (y[..., 1] - i0 * growth / (1 - i0 + i0 * growth)).abs().max() <= 1e-7
    W1, b1, W2, b2 = (w.detach() for w in mlp_field(device))
    f = lambda y: torch.tanh(y @ W1.T + b1) @ W2.T + b2
    y = odeint(fields.MLP(W1, b1, W2, b2), y0, t, method=method, rtol=1e-10, atol=1e-12)
    assert (y - rk4_loop(f, y0, t, 0.005)).abs().max() <= 1e-8


@pytest.mark.parametrize("method", ["bosh3", "tsit5"])
def test_the_step_control_measures_the_state_not_the_parameters_riding_with_it(device, method):
    """A built-in field's parameters ride in the state on the general path; the steps are those of
    the same field written as a function of y only (whose state is just y)."""
    y0 = torch.tensor([[1.0, 0.0], [0.5, 0.2]], dtype=DOUBLE, device=device)
    t = torch.linspace(0, 3, 4, dtype=DOUBLE, device=device)
    built_in = odeint(fields.DampedOscillator(2.0, 0.3), y0, t, method=method, rtol=1e-5, atol=1e-7)
    closure = odeint(lambda t, y: torch.stack([y[:, 1], -2.0 * y[:, 0] - 0.3 * y[:, 1]], -1), y0, t, method=method,
                     rtol=1e-5, atol=1e-7, compile=False)
    torch.testing.assert_close(built_in, closure, rtol=0, atol=1e-14)


@pytest.mark.parametrize("method,step_size", [("bosh3", None), ("tsit5", None), ("bosh3", 0.1), ("tsit5", 0.2)])
def test_gradcheck_bosh3_and_tsit5(device, method, step_size):
    """Gradients to y0, per-trajectory parameters (k, c) and a shared tensor (Linear's A)."""
    k = torch.tensor([1.5, 2.0], dtype=DOUBLE, device=device, requires_grad=True)
    c = torch.tensor([0.1, 0.4], dtype=DOUBLE, device=device, requires_grad=True)
    y0 = torch.randn(2, 2, dtype=DOUBLE, device=device, requires_grad=True)
    t = torch.tensor([0.0, 0.25, 0.6], dtype=DOUBLE, device=device)
    oscillator = lambda y0, k, c: odeint(fields.DampedOscillator(k, c), y0, t, method=method, step_size=step_size,
                                         rtol=1e-6, atol=1e-8)
    assert torch.autograd.gradcheck(oscillator, (y0, k, c))
    A = (torch.randn(2, 2, dtype=DOUBLE, device=device) * 0.5).requires_grad_()
    linear = lambda y0, A: odeint(fields.Linear(A), y0, t, method=method, step_size=step_size, rtol=1e-6, atol=1e-8)
    assert torch.autograd.gradcheck(linear, (y0, A))


@pytest.mark.parametrize("method", ["bosh3", "tsit5"])
def test_bosh3_and_tsit5_compile_without_graph_breaks(device, method):
    k = torch.tensor([2.0, 1.0], dtype=DOUBLE, device=device, requires_grad=True)
    y0 = torch.tensor([[1.0, 0.0], [0.5, 0.2]], dtype=DOUBLE, device=device, requires_grad=True)
    t = torch.linspace(0, 3, 4, dtype=DOUBLE, device=device)
    solve = lambda y0, k: odeint(fields.DampedOscillator(k, 0.3), y0, t, method=method, rtol=1e-6, atol=1e-8)
    assert graph_break_count(solve, y0, k) == 0
    eager, compiled = solve(y0, k), torch.compile(solve, fullgraph=True)(y0, k)
    assert torch.equal(compiled, eager)
    for a, b in zip(torch.autograd.grad(compiled.sum(), (y0, k)), torch.autograd.grad(eager.sum(), (y0, k))):
        assert torch.equal(a, b)


def test_opcheck(device):
    y0 = torch.randn(3, 2, device=device, requires_grad=True)
    params = torch.rand(3, 2, device=device, requires_grad=True)
    t = torch.tensor([0.0, 0.5, 1.0], dtype=DOUBLE, device=device)
    for method, step in (("rk4", 0.1), ("dopri5", None)):
        args = ("damped_oscillator", y0, t, params, None, 0, method, step, 1e-6, 1e-8, 1000)
        torch.library.opcheck(torch.ops.paraseq.odeint, args)
        detached = tuple(a.detach() if torch.is_tensor(a) else a for a in args)
        torch.library.opcheck(torch.ops.paraseq.odeint_with_steps, detached)
        grad_y = torch.randn(3, 3, 2, device=device)
        torch.library.opcheck(torch.ops.paraseq.odeint_backward, detached + (grad_y,))
        accepted = torch.ops.paraseq.odeint_with_steps(*detached)[1]
        torch.library.opcheck(torch.ops.paraseq.odeint_backward, detached + (grad_y, accepted))


def test_the_forwards_step_counts_give_the_gradient_of_counted_ones(device):
    """odeint_with_steps returns each trajectory's accepted steps; odeint_backward given them skips the
    forward loop that counts them and gives the same bits; counts the problem does not take, or of the
    wrong dtype or shape, are refused."""
    torch.manual_seed(3)
    y0 = torch.randn(5, 2, dtype=DOUBLE, device=device)
    params = torch.rand(5, 2, dtype=DOUBLE, device=device) + 0.5
    t = torch.tensor([0.0, 1.0, 4.0], dtype=DOUBLE, device=device)
    args = ("damped_oscillator", y0, t, params, None, 0, "dopri5", None, 1e-8, 1e-10, 10000)
    observed, accepted = torch.ops.paraseq.odeint_with_steps(*args)
    assert torch.equal(observed, torch.ops.paraseq.odeint(*args))
    assert accepted.dtype == torch.int32 and accepted.shape == (5,) and int(accepted.min()) > 10
    grad_y = torch.randn_like(observed)
    counted = torch.ops.paraseq.odeint_backward(*args, grad_y)
    for got, wanted in zip(torch.ops.paraseq.odeint_backward(*args, grad_y, accepted), counted):
        assert torch.equal(got, wanted)
    wrong = accepted.clone()
    wrong[3] += 1
    with pytest.raises(ValueError, match=r"'options.accepted_steps'.* for trajectory 3, which took"):
        torch.ops.paraseq.odeint_backward(*args, grad_y, wrong)
    with pytest.raises(ValueError, match=r"argument 'accepted' is a Long tensor of shape \[5\]"):
        torch.ops.paraseq.odeint_backward(*args, grad_y, accepted.long())


def test_compiled_graph_has_constant_size_in_the_step_count(device):
    field = fields.DampedOscillator(torch.tensor(2.0, device=device, requires_grad=True), 0.1)
    y0 = torch.randn(8, 2, device=device, requires_grad=True)
    t = torch.linspace(0, 1, 5, dtype=DOUBLE, device=device)
    nodes = []
    for step in (0.1, 0.0001):
        loss = lambda y0: odeint(field, y0, t, method="rk4", step_size=step).square().sum()
        torch._dynamo.reset()
        explanation = torch._dynamo.explain(loss)(y0)
        assert explanation.graph_break_count == 0
        nodes.append(len(explanation.graphs[0].graph.nodes))
        compiled = torch.compile(loss, fullgraph=True)
        assert torch.equal(torch.autograd.grad(compiled(y0), y0)[0], torch.autograd.grad(loss(y0), y0)[0])
    assert nodes[0] == nodes[1]


def test_failures_are_loud(device):
    y0 = torch.tensor([[1.0, 0.0]], dtype=DOUBLE, device=device)
    field = fields.DampedOscillator(1.0, 0.0)
    t = torch.tensor([0.0, 100.0], dtype=DOUBLE, device=device)
    with pytest.raises(RuntimeError, match="max_steps"):
        odeint(field, y0, t, max_steps=5)
    with pytest.raises(ValueError, match="argument 'method' is 'rk45'"):
        odeint(field, y0, t, method="rk45")
    with pytest.raises(ValueError, match="argument 'y0' has shape"):
        odeint(field, y0[:, :1], t)
    with pytest.raises(ValueError, match="argument 't' has t\\[2\\] = 1 after t\\[1\\]"):
        odeint(field, y0, torch.tensor([0.0, 1.0, 1.0], device=device))
    with pytest.raises(ValueError, match="argument 'step_size'"):
        odeint(field, y0, t, step_size=-0.1)
    with pytest.raises(TypeError, match="argument 'y0' has dtype torch.int64"):
        odeint(field, y0.long(), t)
    with pytest.raises(ValueError, match="argument 'W1'"):
        fields.MLP(*(torch.zeros(shape, device=device) for shape in [(200, 2), (200,), (2, 200), (2,)]))


def test_dynamic_shapes_compile_once_with_gradients(device):
    """torch.compile(dynamic=True): new numbers of trajectories and times reuse one graph, with
    gradients through odeint's backward."""
    k = torch.tensor(1.3, dtype=torch.float64, device=device, requires_grad=True)
    loss = torch.compile(lambda y0, t: odeint(fields.DampedOscillator(k, 0.2), y0, t, method="rk4").square().sum(),
                         fullgraph=True, dynamic=True, backend="aot_eager")
    torch._dynamo.reset()
    with torch._dynamo.config.patch(error_on_recompile=True):
        # The first shape's sizes differ from the fixed ones: dynamo gives equal sizes one symbol.
        for N, T in [(5, 7), (3, 4), (6, 9), (4, 5), (7, 11), (9, 13), (10, 6), (11, 8)]:
            y0 = torch.randn(N, 2, dtype=torch.float64, device=device, requires_grad=True)
            t = torch.linspace(0, 1, T, dtype=torch.float64, device=device)
            compiled = torch.autograd.grad(loss(y0, t), (y0, k))
            eager = torch.autograd.grad(odeint(fields.DampedOscillator(k, 0.2), y0, t, method="rk4").square().sum(),
                                        (y0, k))
            torch.testing.assert_close(compiled, eager)


# ---- memory: the gradient's cached temporaries -------------------------------------------------------

def test_workspace_bytes_counts_the_gradient_checkpoints_and_release_workspace_frees_them(device):
    """odeint's backward keeps its carries, checkpoints and adjoint state in paraseq's cache for the next call
    (docs/memory.md): workspace_bytes() holds at least the bytes gradient_workspace_bytes gives for the batch,
    release_workspace() frees them, and the gradients after the release are bitwise the same."""
    import paraseq
    N, steps = 64, 100
    k = torch.linspace(1, 3, N, dtype=DOUBLE, device=device)
    y0 = torch.randn(N, 2, dtype=DOUBLE, device=device, requires_grad=True)
    t = torch.tensor([0.0, 1.0], dtype=DOUBLE, device=device)

    def gradient():
        y = odeint(fields.DampedOscillator(k, 0.2), y0, t, method="rk4", step_size=1.0 / steps)
        return torch.autograd.grad(y[-1].square().sum(), y0)[0]

    paraseq.release_workspace()
    assert paraseq.workspace_bytes() == 0
    first = gradient()
    # Per trajectory (loops/integrate.hpp, gradient_workspace_bytes with k = ceil(sqrt(100)) = 10):
    # carry (2n + 3) 8 + 5 * 4, 11 checkpoints of n doubles, a segment of 10 states, the adjoint n 8 + 3 * 4.
    per_trajectory = (2 * 2 + 3) * 8 + 5 * 4 + 11 * 2 * 8 + 10 * 2 * 8 + 2 * 8 + 3 * 4
    held = paraseq.workspace_bytes()
    assert held >= N * per_trajectory
    paraseq.release_workspace()
    assert paraseq.workspace_bytes() == 0
    assert torch.equal(gradient(), first)
