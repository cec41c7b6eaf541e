"""paraseq.ParaSLSTM (the xLSTM sLSTM cell with diagonal recurrence) against a float64 loop over t
written here from the sLSTM equations (torch.maximum, plain exp): its step (decoding, the operator
over one step), newton_apply through its operator (paraseq::para_slstm) in every mode and on the
general path, gradients (gradcheck; the loop's autograd for the parameters), the tie rule of the
max, torch.compile, opcheck, and its arguments' errors."""

import math

import pytest
import torch
from torch.func import functional_call

from conftest import assert_steps_reproduce_the_solve, graph_break_count
from paraseq import NewtonConfig, NewtonDivergenceError, ParaSLSTM, compile_safe_config, newton_apply

EPS = 1e-6


def slstm_loop(x, weight, bias, recurrent, h0, eps=EPS, max_recurrent_norm=0.5):
    """The sLSTM with exponential gates, stabiliser m and a diagonal recurrence, one step at a time:
    the state [B, T, 4, H] with slots (c, n, m, h), pre-activations (i, f, z, o)."""
    r = recurrent.clamp(-max_recurrent_norm, max_recurrent_norm)
    c, n, m, h = h0.unbind(1)
    states = []
    for x_t in x.unbind(1):
        pre = x_t @ weight.T + bias + torch.cat([r[0] * h, r[1] * h, r[2] * h, r[3] * h], dim=-1)
        i_tilde, f_tilde, z_tilde, o_tilde = pre.split(h.shape[-1], dim=-1)
        m_next = torch.maximum(f_tilde + m, i_tilde)
        i_gate, f_gate = torch.exp(i_tilde - m_next), torch.exp(f_tilde + m - m_next)
        c = f_gate * c + i_gate * torch.tanh(z_tilde)
        n = f_gate * n + i_gate
        m = m_next
        h = torch.sigmoid(o_tilde) * c / (n + eps)
        states.append(torch.stack([c, n, m, h], dim=1))
    return torch.stack(states, dim=1)


def case(B=2, T=24, input_size=3, H=4, seed=0):
    """A float64 cell (recurrent weights partly beyond the clamp), x and an h0 with n0 > 0."""
    generator = torch.Generator().manual_seed(seed)
    cell = ParaSLSTM(input_size, H).double()
    with torch.no_grad():
        cell.in_proj.bias.uniform_(-0.5, 0.5, generator=generator)
        cell.recurrent.uniform_(-0.8, 0.8, generator=generator)
    x = torch.randn(B, T, input_size, dtype=torch.float64, generator=generator)
    h0 = torch.rand(B, 4, H, dtype=torch.float64, generator=generator) * 2 - 1
    h0[:, 1] = h0[:, 1].abs() + 0.25  # n0 > 0
    return cell, x, h0


def loop_of(cell, x, h0):
    return slstm_loop(x, cell.in_proj.weight, cell.in_proj.bias, cell.recurrent, h0, cell.eps, cell.max_recurrent_norm)


def test_step_and_sequential_are_the_loop_and_the_clamp_applies():
    cell, x, h0 = case()
    assert (cell.recurrent.abs() > 0.5).any()  # the clamp matters here
    expected = loop_of(cell, x, h0)
    torch.testing.assert_close(cell.step(h0, x[:, 0]), expected[:, 0], rtol=0, atol=1e-14)
    torch.testing.assert_close(cell.sequential(x, h0), expected, rtol=0, atol=1e-13)
    assert cell.sequential(x).shape == (2, 24, 4, 4)
    assert (cell.sequential(x)[:, :, 1] > 0).all()  # n > 0 from the zero state on


def test_step_decodes_what_newton_apply_solved(device):
    cell, x, h0 = case(B=3, T=20)
    cell, x, h0 = cell.to(device), x.to(device), h0.to(device)
    assert_steps_reproduce_the_solve(cell, x, (h0, None), ("sequential", "newton"))
    # Leading dimensions: none (one sequence) and two.
    expected = loop_of(cell, x[:, :1], h0)[:, 0]
    torch.testing.assert_close(cell.step(h0[1], x[1, 0]), expected[1], rtol=0, atol=1e-14)
    grid = cell.step(h0.unsqueeze(0).expand(2, -1, -1, -1), x[:, 0].unsqueeze(0).expand(2, -1, -1))
    torch.testing.assert_close(grid, expected.unsqueeze(0).expand(2, -1, -1, -1), rtol=0, atol=1e-14)


def test_step_gradcheck_in_double(device):
    cell, x, h0 = case(B=2, T=1, input_size=3, H=2)
    cell = cell.to(device)
    x, h0 = x[:, 0].to(device).requires_grad_(), h0.to(device).requires_grad_()
    assert torch.autograd.gradcheck(lambda x, h, *params: cell.step(h, x), (x, h0, *cell.parameters()))


def test_step_compiles_without_graph_breaks_and_equals_eager(device):
    cell, x, h0 = case(B=2, T=2)
    cell, x, h0 = cell.to(device), x.to(device), h0.to(device)
    decode = lambda z: cell.step(cell.step(h0, z[:, 0]), z[:, 1])  # noqa: E731
    assert graph_break_count(decode, x) == 0
    assert torch.equal(torch.compile(decode, fullgraph=True)(x), decode(x))


def test_step_errors_name_the_argument():
    cell = ParaSLSTM(3, 4)
    x = torch.randn(2, 3)
    with pytest.raises(TypeError, match="ParaSLSTM.step: argument 'x' is a list"):
        cell.step(None, [1.0])
    with pytest.raises(ValueError, match=r"ParaSLSTM.step: argument 'x' has shape \[2, 5\], expected \[..., 3\]"):
        cell.step(None, torch.randn(2, 5))
    with pytest.raises(ValueError, match=r"ParaSLSTM.step: argument 'h_prev' has shape \[2, 4\], expected \[2, 4, 4\]"):
        cell.step(torch.zeros(2, 4), x)
    with pytest.raises(TypeError, match="ParaSLSTM.step: argument 'h_prev' is a tuple"):
        cell.step((torch.zeros(2, 4),), x)


@pytest.mark.parametrize("backend", ["sequential", "fused", "newton", "one_pass", "auto"])
def test_the_operator_in_every_mode_equals_the_loop_with_its_gradients(backend):
    cell, x, h0 = case()
    x.requires_grad_(), h0.requires_grad_()
    cfg = NewtonConfig(max_iters=24, scan_backend=backend)  # T = 24: exact after T iterations
    state, stats = newton_apply(cell, x, cfg, h0=h0, return_stats=True, compile=True)
    expected = loop_of(cell, x, h0)
    torch.testing.assert_close(state, expected, rtol=0, atol=1e-12)
    assert stats.residual.max() <= 1e-12
    weight = torch.randn_like(expected)
    inputs = [x, h0, cell.in_proj.weight, cell.in_proj.bias, cell.recurrent]
    for got, wanted in zip(torch.autograd.grad((state * weight).sum(), inputs),
                           torch.autograd.grad((expected * weight).sum(), inputs)):
        torch.testing.assert_close(got, wanted, rtol=1e-9, atol=1e-11)


def test_general_path_equals_the_loop_with_its_gradients():
    cell, x, h0 = case(T=12)
    x.requires_grad_(), h0.requires_grad_()
    state = newton_apply(cell, x, NewtonConfig(max_iters=12), h0=h0, compile=False)
    expected = loop_of(cell, x, h0)
    torch.testing.assert_close(state, expected, rtol=0, atol=1e-12)
    inputs = [x, h0, cell.in_proj.weight, cell.in_proj.bias, cell.recurrent]
    for got, wanted in zip(torch.autograd.grad(state.sin().sum(), inputs),
                           torch.autograd.grad(expected.sin().sum(), inputs)):
        torch.testing.assert_close(got, wanted, rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize("compile", [True, False])
def test_gradcheck_of_x_h0_and_the_parameters(compile):
    cell, x, h0 = case(B=1, T=3, input_size=1, H=1)
    names = [name for name, _ in cell.named_parameters()]
    cell.config = NewtonConfig(max_iters=3)  # T = 3: exact

    def solve(x, h0, *params):  # forward() with the parameters given
        return functional_call(cell, dict(zip(names, params)), (x, h0), {"return_state": True, "compile": compile})

    inputs = [x.requires_grad_(), h0.requires_grad_()] + [p.detach().clone().requires_grad_() for p in cell.parameters()]
    assert torch.autograd.gradcheck(solve, inputs)


def test_forward_returns_h_or_the_state_and_its_default_config_is_the_exact_loop():
    cell, x, h0 = case()
    assert cell.config == NewtonConfig(scan_backend="sequential")
    expected = loop_of(cell, x, h0)
    torch.testing.assert_close(cell(x, h0), expected[:, :, 3], rtol=0, atol=1e-12)
    torch.testing.assert_close(cell(x, h0, return_state=True), expected, rtol=0, atol=1e-12)
    torch.testing.assert_close(cell(x, return_state=True), loop_of(cell, x, torch.zeros_like(h0)), rtol=0, atol=1e-12)


def test_a_tie_of_the_max_splits_its_derivative_as_torch_maximum():
    cell = ParaSLSTM(1, 2).double()
    with torch.no_grad():  # p_i = 0.75 and p_f + m = 0.25 + 0.5: an exact tie (h = 0)
        cell.in_proj.weight.zero_()
        cell.in_proj.bias.copy_(torch.tensor([0.75, 0.75, 0.25, 0.25, 0.1, 0.1, 0.2, 0.2], dtype=torch.float64))
    state = torch.tensor([[0.3, -0.2], [0.6, 0.9], [0.5, 0.5], [0.0, 0.0]], dtype=torch.float64, requires_grad=True)
    x = torch.zeros(1, dtype=torch.float64)
    (m_next,) = torch.autograd.grad(cell.step(state, x)[2].sum(), state)
    expected = loop_of(cell, x.view(1, 1, 1), state.unsqueeze(0))[0, 0, 2].sum()
    (wanted,) = torch.autograd.grad(expected, state)
    torch.testing.assert_close(m_next, wanted, rtol=0, atol=1e-15)
    assert torch.equal(m_next[2], torch.full((2,), 0.5, dtype=torch.float64))  # dm'/dm at the tie


def test_torch_compile_has_no_graph_breaks_and_equals_eager():
    cell, x, h0 = case(T=8)
    solve = lambda x, h0: newton_apply(cell, x, compile_safe_config(8), h0=h0, compile=True)
    assert graph_break_count(solve, x, h0) == 0
    compiled = torch.compile(solve, fullgraph=True, backend="aot_eager")
    eager, graph = solve(x, h0), compiled(x, h0)
    torch.testing.assert_close(graph, eager, rtol=0, atol=1e-14)
    inputs = [x.requires_grad_(), h0.requires_grad_()] + list(cell.parameters())
    for c, e in zip(torch.autograd.grad(compiled(x, h0).square().sum(), inputs),
                    torch.autograd.grad(solve(x, h0).square().sum(), inputs)):
        torch.testing.assert_close(c, e, rtol=1e-12, atol=1e-14)


def test_packed_sequences_are_solved_each_from_its_own_h0():
    cell, x, h0 = case(B=1, T=10)
    cu_seqlens = torch.tensor([0, 4, 10])
    starts = torch.rand(2, 4, cell.hidden_size, dtype=torch.float64) + 0.25  # n0 > 0
    packed = cell(x, starts, return_state=True, cu_seqlens=cu_seqlens, max_seqlen=6)
    torch.testing.assert_close(packed[:, :4], loop_of(cell, x[:, :4], starts[:1]), rtol=0, atol=1e-12)
    torch.testing.assert_close(packed[:, 4:], loop_of(cell, x[:, 4:], starts[1:]), rtol=0, atol=1e-12)


def test_too_few_newton_iterations_raise_instead_of_returning_a_wrong_state():
    cell, x, h0 = case(T=48)
    with pytest.raises(NewtonDivergenceError, match="residual_fail"):
        newton_apply(cell, x, NewtonConfig(max_iters=2, scan_backend="newton"), h0=h0, compile=True)


@pytest.mark.parametrize("arguments, message", [
    ((0, 4), "argument 'input_size' is 0, expected an int >= 1"),
    ((3, 2.5), "argument 'hidden_size' is 2.5, expected an int >= 1"),
    ((3, 4, {"eps": 0.0}), "argument 'eps' is 0.0, expected a finite number > 0"),
    ((3, 4, {"eps": math.nan}), "argument 'eps' is nan"),
    ((3, 4, {"max_recurrent_norm": -1.0}), "argument 'max_recurrent_norm' is -1.0, expected None or a number > 0"),
    ((3, 4, {"config": {"max_iters": 3}}), "argument 'config' is a dict, expected a NewtonConfig or None"),
])
def test_bad_arguments_name_the_argument(arguments, message):
    positional = [a for a in arguments if not isinstance(a, dict)]
    keywords = next((a for a in arguments if isinstance(a, dict)), {})
    with pytest.raises((TypeError, ValueError), match=message.replace("(", r"\(").replace(")", r"\)")):
        ParaSLSTM(*positional, **keywords)


def test_a_state_of_the_wrong_shape_names_h0():
    cell, x, h0 = case()
    with pytest.raises(ValueError, match=r"argument 'h0' has shape \[2, 4\], expected \[2, 4, 4\]"):
        cell(x, h0[:, 0])


@pytest.mark.parametrize("compile", [False, True])
def test_the_quasi_jacobian_reaches_the_loop_on_a_long_sequence(compile):
    """docs/solvers.md, "ParaSLSTM's convergence": from the default guess the quasi Jacobian with
    residual_atol converges at T = 160 (general path: the diagonal of torch.func's 4 x 4 blocks;
    the operator: the C++ quasi scans)."""
    cell, x, h0 = case(T=160)
    expected = loop_of(cell, x, h0)
    config = NewtonConfig(max_iters=200, residual_atol=1e-10, jacobian="quasi", scan_backend="newton")
    with torch.no_grad():
        h, stats = newton_apply(cell, x, config, h0=h0, return_stats=True, compile=compile)
    assert stats.iterations < 200 and stats.residual.max() <= 1e-10
    assert (h - expected).abs().max() <= 1e-9 * expected.abs().max()


def test_the_operator_and_the_general_path_agree_and_the_general_path_is_taken_with_compile_false():
    cell, x, h0 = case(T=12)
    config = NewtonConfig(max_iters=12, scan_backend="newton")
    through_operator, stats = newton_apply(cell, x, config, h0=h0, return_stats=True)
    general, general_stats = newton_apply(cell, x, config, h0=h0, return_stats=True, compile=False)
    torch.testing.assert_close(through_operator, general, rtol=0, atol=1e-12)
    assert stats.backend == general_stats.backend == "newton"
    with pytest.raises(ValueError, match="argument 'return_cell_state' is True for a ParaSLSTM"):
        newton_apply(cell, x, config, h0=h0, return_cell_state=True)
    with pytest.raises(TypeError, match=r"argument 'h0' has dtype torch.float32, expected torch.float64"):
        newton_apply(cell, x, config, h0=h0.float())


def test_opcheck_of_the_operators():
    cell, x, h0 = case(T=6)
    u = torch.nn.functional.linear(x, cell.in_proj.weight, cell.in_proj.bias).detach().requires_grad_()
    r = cell.clipped_recurrent().detach().requires_grad_()
    state0 = h0.transpose(1, 2).flatten(1).requires_grad_()
    config = NewtonConfig(max_iters=6)._operator_config(True)
    torch.library.opcheck(torch.ops.paraseq.para_slstm, (u, r, state0, EPS, config, True))
    torch.library.opcheck(torch.ops.paraseq.para_slstm, (u, r, None, EPS, config, False))
    state = torch.ops.paraseq.para_slstm(u, r, state0, EPS, config, False)[0].detach()
    torch.library.opcheck(torch.ops.paraseq.para_slstm_backward,
                          (u.detach(), r.detach(), state0.detach(), state, torch.randn_like(state), EPS))


@pytest.mark.parametrize("change, message", [
    (lambda u, r: (u[..., :-1], r, 1e-6), r"argument 'u' has shape \[2, 6, 15\], expected \[B, T, 4H\] = \[B, T, 16\]"),
    (lambda u, r: (u, r[:3], 1e-6), r"argument 'r' has shape \[3, 4\], expected \[4, H\] = \[4, 4\]"),
    (lambda u, r: (u, r, 0.0), r"argument 'eps' is 0, expected a finite number > 0"),
    (lambda u, r: (u, r, math.inf), r"argument 'eps' is inf, expected a finite number > 0"),
])
def test_the_operator_names_a_bad_argument(change, message):
    u, r = torch.zeros(2, 6, 16, dtype=torch.float64), torch.zeros(4, 4, dtype=torch.float64)
    u, r, eps = change(u, r)
    with pytest.raises(ValueError, match=message):
        torch.ops.paraseq.para_slstm(u, r, None, eps, NewtonConfig()._operator_config(True), False)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_modules_are_stored_as_such_and_computed_in_float32(dtype):
    """The seed contract (docs/torch.md, AMP): the module's dtype is its storage; the operator computes in float32."""
    cell, x, _ = case(T=16)
    cell = cell.float()
    x = x.float()
    reference = cell(x)
    half = ParaSLSTM(cell.input_size, cell.hidden_size).to(dtype)
    half.load_state_dict({name: value.to(dtype) for name, value in cell.state_dict().items()})
    h = half(x.to(dtype))
    assert h.dtype == dtype
    tolerance = 5e-2 if dtype == torch.bfloat16 else 5e-3
    torch.testing.assert_close(h.float(), reference, rtol=0, atol=tolerance)
    h.float().square().sum().backward()
    assert half.recurrent.grad.dtype == dtype and torch.isfinite(half.recurrent.grad.float()).all()
    with torch.autocast("cpu", dtype=torch.bfloat16):  # an outer autocast does not lower the solve
        assert torch.equal(cell(x), reference)
