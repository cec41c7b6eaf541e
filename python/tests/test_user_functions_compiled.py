"""odeint's compiled path (generated C++ operators) against the general path, float64 RK4 loops
written here and gradcheck; torch.compile; opcheck; the fallbacks; the on-disk cache.

Three extensions are compiled per test session (the Van der Pol module with dopri5 and with tsit5,
and the closure MLP with rk4), in the session's cache directory (conftest.py)."""

import sys
import types

import pytest
import torch
import torch.nn.functional as F

from conftest import cached_use_in_a_new_process, graph_break_count
from paraseq import _compiled_odeint, _extension_build, _field_codegen, _user_function, odeint
from test_user_functions import DOUBLE, VanDerPol, rk4_loop

TIMES = [0.0, 0.5, 1.0, 2.0]
TOLERANCES = dict(rtol=1e-10, atol=1e-12)


@pytest.fixture(scope="module")
def van_der_pol():
    """The module, its states and the compiled extension (compiled here once)."""
    model = VanDerPol(1.5)
    y0 = torch.tensor([[2.0, 0.0], [0.5, -1.0]], dtype=DOUBLE, requires_grad=True)
    odeint(model, y0, torch.tensor(TIMES, dtype=DOUBLE), compile=True, **TOLERANCES)
    return model, y0


def mlp_closure(hidden=6, n=3):
    """A neural ODE y' = W2 tanh(W1 y + b1) + b2 + 0.1 sin(t) - 0.05 |y|^2 y, closing over its four
    tensors."""
    generator = torch.Generator().manual_seed(1)
    W1, b1, W2, b2 = (0.5 * torch.randn(shape, generator=generator, dtype=DOUBLE)
                      for shape in ((hidden, n), (hidden,), (n, hidden), (n,)))
    tensors = [x.requires_grad_() for x in (W1, b1, W2, b2)]

    def rhs(t, y):
        return torch.tanh(F.linear(y, W1, b1)) @ W2.T + b2 + 0.1 * torch.sin(t) - 0.05 * y.square().sum(-1, True) * y
    return rhs, tensors


def test_van_der_pol_module_equals_the_general_path_and_a_fine_rk4_loop(van_der_pol):
    model, y0 = van_der_pol
    t = torch.tensor(TIMES, dtype=DOUBLE)
    compiled = odeint(model, y0, t, compile=True, **TOLERANCES)
    general = odeint(model, y0, t, compile=False, **TOLERANCES)
    torch.testing.assert_close(compiled, general, rtol=0, atol=1e-12)  # the same steps, to rounding
    expected = rk4_loop(model, y0, TIMES, 400)
    torch.testing.assert_close(compiled, expected, rtol=0, atol=1e-8)
    weight = torch.randn_like(compiled)
    for a, b, c in zip(torch.autograd.grad((compiled * weight).sum(), (y0, model.mu)),
                       torch.autograd.grad((general * weight).sum(), (y0, model.mu)),
                       torch.autograd.grad((expected * weight).sum(), (y0, model.mu))):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-11)
        torch.testing.assert_close(a, c, rtol=1e-6, atol=1e-7)


def test_tsit5_compiled_equals_the_general_path(van_der_pol):
    """The C++ Tsit5 (src/loops/tableaus.hpp) and the general path's tableau take the same steps."""
    model, y0 = van_der_pol
    t = torch.tensor(TIMES, dtype=DOUBLE)
    compiled = odeint(model, y0, t, method="tsit5", compile=True, **TOLERANCES)
    general = odeint(model, y0, t, method="tsit5", compile=False, **TOLERANCES)
    torch.testing.assert_close(compiled, general, rtol=0, atol=1e-12)
    torch.testing.assert_close(compiled, rk4_loop(model, y0, TIMES, 400), rtol=0, atol=1e-8)
    weight = torch.randn_like(compiled)
    for a, b in zip(torch.autograd.grad((compiled * weight).sum(), (y0, model.mu)),
                    torch.autograd.grad((general * weight).sum(), (y0, model.mu))):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-11)


def test_van_der_pol_gradcheck_and_a_finite_difference_of_mu(van_der_pol):
    model, _ = van_der_pol
    y0 = torch.tensor([[1.0, 0.5]], dtype=DOUBLE, requires_grad=True)
    t = torch.tensor([0.0, 0.3, 0.6], dtype=DOUBLE)
    solve = lambda y0: odeint(model, y0, t, method="dopri5", step_size=0.1, compile=True)
    assert torch.autograd.gradcheck(solve, (y0,))
    (grad_mu,) = torch.autograd.grad(solve(y0).sum(), model.mu)
    eps, mu = 1e-6, model.mu.detach().clone()
    with torch.no_grad():
        values = []
        for shift in (eps, -eps):
            model.mu.copy_(mu + shift)
            values.append(solve(y0).sum())
        model.mu.copy_(mu)
    torch.testing.assert_close(grad_mu, (values[0] - values[1]) / (2 * eps), rtol=1e-7, atol=1e-9)


def test_second_derivatives_raise(van_der_pol):
    model, y0 = van_der_pol
    out = odeint(model, y0, torch.tensor([0.0, 0.5], dtype=DOUBLE), compile=True, **TOLERANCES)
    (grad,) = torch.autograd.grad(out.square().sum(), y0, create_graph=True)
    with pytest.raises(NotImplementedError, match="does not support double backward"):
        grad.sum().backward()


def test_torch_compile_sees_one_operator_equal_to_eager(van_der_pol):
    model, y0 = van_der_pol
    t = torch.tensor(TIMES, dtype=DOUBLE)
    solve = lambda y0: odeint(model, y0, t, compile=True, **TOLERANCES)
    assert graph_break_count(solve, y0) == 0
    compiled = torch.compile(solve, fullgraph=True, backend="aot_eager")
    eager_y, compiled_y = solve(y0), compiled(y0)
    assert torch.equal(compiled_y, eager_y)
    for a, b in zip(torch.autograd.grad(compiled_y.sum(), (y0, model.mu)),
                    torch.autograd.grad(eager_y.sum(), (y0, model.mu))):
        assert torch.equal(a, b)


def test_one_trajectory_runs_the_same_extension(van_der_pol):
    """y0 [n] (func sees y [n] and a 0-d t): the same per-trajectory code, so no second compile."""
    model, y0 = van_der_pol
    t = torch.tensor(TIMES, dtype=DOUBLE)
    compiles = _extension_build.statistics["compiles"]
    alone = odeint(model, y0[1], t, compile=True, **TOLERANCES)
    assert _extension_build.statistics["compiles"] == compiles
    assert alone.shape == (len(TIMES), 2)
    torch.testing.assert_close(alone, odeint(model, y0[1], t, compile=False, **TOLERANCES), rtol=0, atol=1e-12)


def test_opcheck_of_the_generated_operators(van_der_pol):
    model, y0 = van_der_pol
    token = _user_function.register(*_user_function.split(model))
    extension = _compiled_odeint._extensions[_compiled_odeint.choose(token, 2, DOUBLE, "cpu", "dopri5", False, True)]
    shared = model.mu.detach().reshape(1).requires_grad_()
    args = (y0.detach().requires_grad_(), torch.tensor([0.0, 0.4, 1.0], dtype=DOUBLE), shared, None, 1e-8, 1e-10,
            10000)
    torch.library.opcheck(extension.odeint, args)
    grad_y = torch.randn(2, 3, 2, dtype=DOUBLE)
    detached = (y0.detach(), args[1], shared.detach(), *args[3:])
    torch.library.opcheck(extension.backward, detached + (grad_y,))
    # The forward's accepted steps spare the backward its counting pass, with the same bits.
    accepted = extension.odeint(*detached)[1]
    assert accepted.dtype == torch.int32 and accepted.shape == (2,) and int(accepted.min()) > 0
    torch.library.opcheck(extension.backward, detached + (grad_y, accepted))
    for got, wanted in zip(extension.backward(*detached, grad_y, accepted), extension.backward(*detached, grad_y)):
        assert torch.equal(got, wanted)


def test_a_closure_mlp_with_fixed_steps_equals_the_general_path_and_the_rk4_loop():
    rhs, tensors = mlp_closure()
    y0 = torch.randn(4, 3, dtype=DOUBLE, requires_grad=True)
    times = [0.0, 0.25, 0.5]
    t = torch.tensor(times, dtype=DOUBLE)
    compiles = _extension_build.statistics["compiles"]
    compiled = odeint(rhs, y0, t, method="rk4", step_size=0.05, compile=True)
    assert _extension_build.statistics["compiles"] <= compiles + 1
    general = odeint(rhs, y0, t, method="rk4", step_size=0.05, compile=False)
    torch.testing.assert_close(compiled, general, rtol=0, atol=1e-13)
    torch.testing.assert_close(compiled, rk4_loop(rhs, y0, times, 5), rtol=0, atol=1e-13)
    weight = torch.randn_like(compiled)
    inputs = [y0] + tensors
    for a, b in zip(torch.autograd.grad((compiled * weight).sum(), inputs),
                    torch.autograd.grad((general * weight).sum(), inputs)):
        torch.testing.assert_close(a, b, rtol=1e-11, atol=1e-12)


def test_a_clamped_right_hand_side_equals_the_general_path_and_its_gradients():
    def saturating(t, y):
        return torch.clamp(2.0 * y, -1.0, 0.5) - y.clamp(max=0.3)

    y0 = torch.tensor([[2.0, -2.0, 0.2], [0.4, -0.6, 1.5]], dtype=DOUBLE, requires_grad=True)
    t = torch.tensor([0.0, 0.5, 1.0], dtype=DOUBLE)
    compiled = odeint(saturating, y0, t, method="rk4", step_size=0.05, compile=True)
    general = odeint(saturating, y0, t, method="rk4", step_size=0.05, compile=False)
    torch.testing.assert_close(compiled, general, rtol=0, atol=1e-13)
    weight = torch.randn_like(compiled)
    for a, b in zip(torch.autograd.grad((compiled * weight).sum(), y0),
                    torch.autograd.grad((general * weight).sum(), y0)):
        torch.testing.assert_close(a, b, rtol=1e-11, atol=1e-12)


def switching_closure():
    """A right-hand side through every selection the compiled path takes: where on comparisons of
    the state with numbers and with tensors, & | ^ ~ and logical_or/xor/not, a boolean as a number,
    masked_fill, maximum, minimum, sign, clamps to tensors (both bounds, each alone) and to numbers
    (crossed bounds included). It closes over W, low and high."""
    W = torch.tensor([0.3, -0.4, 0.8], dtype=DOUBLE, requires_grad=True)
    low = torch.tensor([-0.6, -0.2, 0.1], dtype=DOUBLE, requires_grad=True)
    high = torch.tensor([0.5, 0.4, 0.9], dtype=DOUBLE, requires_grad=True)

    def rhs(t, y):
        up = torch.where(y > W, y - W, 0.5 * (W - y))
        band = torch.where((y >= -1.0) & (y < 1.0), -y, 0.2 * y)
        flip = torch.where(torch.logical_or(y <= -0.5, torch.logical_not(y != W)), 0.3, -0.1)
        odd = torch.logical_xor(y > 0, W > 0).to(y.dtype) - (~(y < 0.2) ^ (W < 0)).to(y.dtype)
        extremes = torch.maximum(y, W) - torch.minimum(y, 0.5 * W)
        clamped = torch.clamp(y, low, high) + y.clamp_min(low) - torch.clamp(y, max=high) + \
            torch.clamp(y, -0.8, 0.6) + torch.clamp(y, 0.4, -0.4)
        filled = y.masked_fill(y == 0.0, 1.0) + 0.1 * torch.sign(y)
        return -0.5 * y + 0.2 * (up + band + flip + odd + extremes + clamped + filled) + 0.1 * torch.cos(t)
    return rhs, [W, low, high]


SWITCHING_TIMES = [0.0, 0.25, 0.5]


def switching_solve(rhs, y0, compile):
    return odeint(rhs, y0, torch.tensor(SWITCHING_TIMES, dtype=DOUBLE), method="rk4", step_size=0.05,
                  compile=compile)


def test_selections_equal_the_general_path_and_the_rk4_loop_with_torchs_gradients_at_ties():
    rhs, (W, low, high) = switching_closure()
    y0 = torch.tensor([[0.3, -0.4, 0.8], [-0.6, -0.2, 0.1], [0.5, 0.4, 0.9],  # W, low and high: ties
                       [0.0, -0.8, 0.6], [-1.5, 1.6, -2.0], [1.2, 0.05, -0.3]], dtype=DOUBLE, requires_grad=True)
    compiled = switching_solve(rhs, y0, True)
    general = switching_solve(rhs, y0, False)
    expected = rk4_loop(rhs, y0, SWITCHING_TIMES, 5)  # the same steps, in PyTorch
    torch.testing.assert_close(compiled, general, rtol=0, atol=1e-13)
    torch.testing.assert_close(compiled, expected, rtol=0, atol=1e-13)
    y = expected.detach().reshape(-1, 3)
    both = lambda condition: bool(condition.any() and (~condition).any())
    assert all(both(c) for c in (y > W, y >= -1, y < 1, y <= -0.5, y > 0, y < 0.2, y < low, y > high, y < -0.8,
                                 y > 0.6, torch.logical_xor(y > 0, W > 0)))
    ties = y0.detach()
    assert all(bool((ties == bound).any()) for bound in (W, low, high, 0.0, -0.8, 0.6))
    weight = torch.randn_like(compiled)
    inputs = [y0, W, low, high]
    for a, b, c in zip(torch.autograd.grad((compiled * weight).sum(), inputs),
                       torch.autograd.grad((general * weight).sum(), inputs),
                       torch.autograd.grad((expected * weight).sum(), inputs)):
        torch.testing.assert_close(a, b, rtol=1e-11, atol=1e-12)
        torch.testing.assert_close(a, c, rtol=1e-11, atol=1e-12)


def test_selections_gradcheck_of_y0_and_the_closed_over_bounds():
    rhs, tensors = switching_closure()
    y0 = torch.tensor([[0.7, -1.3, 0.25], [-0.35, 0.15, 1.1]], dtype=DOUBLE, requires_grad=True)
    # gradcheck perturbs the closed-over tensors themselves, which the solve reads at each call
    assert torch.autograd.gradcheck(lambda y0, *bounds: switching_solve(rhs, y0, True), (y0, *tensors))


def kinked_closure(heaviside):
    """A right-hand side through the activations (leaky_relu, hardtanh, relu6, elu, softplus with
    beta and threshold, hardsigmoid, silu, heaviside), isinf, isnan and isfinite as masks of where,
    of values used only there that are infinite or NaN (1 / y at 0, log y), whose derivatives are
    then not taken, and max and min of the last dimension (their values, with and without keepdim)
    and amax and amin, of y and of a tensor of ties. It closes over `heaviside` and its value at 0."""
    at_zero = torch.tensor([0.3, 0.7, 0.2, 0.9, 0.5], dtype=DOUBLE, requires_grad=True)

    def rhs(t, y):
        kinked = F.leaky_relu(y, 0.2) + F.hardtanh(y, -0.5, 0.4) + F.relu6(y) + F.elu(y, 1.3) + \
            F.softplus(y, beta=2.5, threshold=1.0) + F.hardsigmoid(y) + F.silu(y) + heaviside(y, at_zero)
        masks = torch.where(torch.isinf(1.0 / y), 0.3, 0.1 * y) + \
            torch.where(torch.isnan(torch.log(y)), -0.2 * y, 0.0) + torch.where(torch.isfinite(torch.log(y)), 0.1, -0.1)
        pairs = y.unsqueeze(-1).expand(*y.shape, 2)  # each element twice: ties
        extremes = torch.max(y, -1, keepdim=True).values - 0.5 * torch.min(y, -1)[0].unsqueeze(-1) + \
            0.3 * y.amax(-1, keepdim=True) + 0.2 * y.amin(dim=-1, keepdim=True) + 0.4 * pairs.amax(-1) - \
            0.3 * torch.max(pairs, -1).values
        return -0.5 * y + 0.1 * (kinked + masks + extremes) + 0.1 * torch.cos(t)
    return rhs, at_zero


def differentiable_heaviside(z, values):
    """heaviside, which torch does not differentiate, as a where: the compiled path's derivative
    of it (0 in z, the selection's in values)."""
    return torch.where(z == 0, values, (z > 0).to(z.dtype))


def test_activations_masks_and_extremes_at_kinks_and_ties_have_torchs_derivatives():
    rhs, at_zero = kinked_closure(torch.heaviside)
    reference, reference_at_zero = kinked_closure(differentiable_heaviside)
    with torch.no_grad():
        reference_at_zero.copy_(at_zero)
    # The first stage evaluates the kinks (0, -0.5 and 0.4, 3, 6, softplus's threshold 0.4) and
    # ties of two maxima and two minima.
    y0 = torch.tensor([[0.0, -0.5, 0.4, 3.0, 6.0], [0.3, -0.2, 0.3, -0.2, 0.1], [-1.5, 0.8, -4.0, 2.0, 0.2]],
                      dtype=DOUBLE, requires_grad=True)
    compiled = switching_solve(rhs, y0, True)
    general = switching_solve(reference, y0, False)
    expected = rk4_loop(reference, y0, SWITCHING_TIMES, 5)  # the same steps, in PyTorch
    torch.testing.assert_close(compiled, general, rtol=0, atol=1e-13)
    torch.testing.assert_close(compiled, expected, rtol=0, atol=1e-13)
    torch.testing.assert_close(compiled, switching_solve(rhs, y0.detach(), False), rtol=0, atol=1e-13)
    weight = torch.randn_like(compiled)
    for a, b, c in zip(torch.autograd.grad((compiled * weight).sum(), (y0, at_zero)),
                       torch.autograd.grad((general * weight).sum(), (y0, reference_at_zero)),
                       torch.autograd.grad((expected * weight).sum(), (y0, reference_at_zero))):
        torch.testing.assert_close(a, b, rtol=1e-11, atol=1e-12)
        torch.testing.assert_close(a, c, rtol=1e-11, atol=1e-12)


def test_activations_masks_and_extremes_gradcheck_of_y0_and_heavisides_value():
    rhs, at_zero = kinked_closure(torch.heaviside)
    y0 = torch.tensor([[0.7, -1.3, 0.25, 2.5, 5.5], [-0.35, 0.15, 1.1, -3.5, 0.6]], dtype=DOUBLE, requires_grad=True)
    # gradcheck perturbs the closed-over tensor itself, which the solve reads at each call
    assert torch.autograd.gradcheck(lambda y0, at_zero: switching_solve(rhs, y0, True), (y0, at_zero))


def test_max_and_min_of_one_trajectorys_state_share_torchs_derivative_among_ties():
    """torch.max and torch.min of everything (of y [n], one trajectory) and amax of every
    dimension: the derivative shared among the tied extremes of y0, at the first stage."""
    def rhs(t, y):
        return -0.5 * y + 0.2 * torch.max(y) - 0.1 * torch.min(y) + 0.05 * torch.amax(y) + 0.1 * y.square()

    y0 = torch.tensor([0.4, -0.3, 0.4, -0.3, 0.1], dtype=DOUBLE, requires_grad=True)  # two maxima, two minima
    compiled = switching_solve(rhs, y0, True)
    general = switching_solve(rhs, y0, False)
    expected = rk4_loop(rhs, y0, SWITCHING_TIMES, 5)
    torch.testing.assert_close(compiled, general, rtol=0, atol=1e-13)
    torch.testing.assert_close(compiled, expected, rtol=0, atol=1e-13)
    weight = torch.randn_like(compiled)
    for a, b in zip(torch.autograd.grad((compiled * weight).sum(), y0),
                    torch.autograd.grad((expected * weight).sum(), y0)):
        torch.testing.assert_close(a, b, rtol=1e-11, atol=1e-12)


@pytest.mark.parametrize("rhs,named", [
    (lambda t, y: -y * torch.max(y, -1, keepdim=True).indices,
     r"the indices of the operation aten\.max\.dim \(torch\.max or torch\.min of a dimension: their values are "
     r"supported, their indices are not\)"),
    (lambda t, y: -y * torch.max(y),
     r"the operation aten\.max\.default over dimensions \[0, 1\] of a value of shape \[3, 2\] \(reductions over the "
     r"last dimensions of one trajectory's value only\)"),
    (lambda t, y: -y.float().double(), r"the operation aten\._to_copy\.default, a conversion to dtype torch\.float32"),
    (lambda t, y: y * (0.5 * torch.where(y > 0, 0.3, -0.1)),  # two numbers: a where of the default dtype
     r"the operation aten\.mul\.Tensor computed in dtype torch\.float32 in a function of a state of dtype "
     r"torch\.float64"),
], ids=["max-indices", "max-of-everything", "to-float32", "float32-arithmetic"])
def test_an_unsupported_selection_or_conversion_is_named(rhs, named):
    y0 = torch.tensor([[1.0, -2.0], [0.5, 0.25]], dtype=DOUBLE)
    t = torch.tensor([0.0, 0.5], dtype=DOUBLE)
    with pytest.warns(UserWarning, match=f"general path.*does not support {named}"):
        auto = odeint(rhs, y0, t, method="rk4")
    assert torch.equal(auto, odeint(rhs, y0, t, method="rk4", compile=False))
    with pytest.raises(NotImplementedError, match=f"compile' is True.*{named}"):
        odeint(rhs, y0, t, method="rk4", compile=True)


def test_a_second_use_hits_the_cache_in_this_process_and_in_a_new_one(van_der_pol):
    model, y0 = van_der_pol
    compiles, loads = _extension_build.statistics["compiles"], _extension_build.statistics["loads"]
    odeint(model, y0, torch.tensor(TIMES, dtype=DOUBLE), compile=True, **TOLERANCES)
    assert (_extension_build.statistics["compiles"], _extension_build.statistics["loads"]) == (compiles, loads)
    compiled, loaded, seconds = cached_use_in_a_new_process(
        """
        import torch
        from paraseq import odeint
        from test_user_functions import DOUBLE, VanDerPol
        y0 = torch.tensor([[2.0, 0.0], [0.5, -1.0]], dtype=DOUBLE)
        """,
        "odeint(VanDerPol(1.5), y0, torch.tensor([0.0, 0.5, 1.0, 2.0], dtype=DOUBLE), compile=True, rtol=1e-10, "
        "atol=1e-12)")
    assert (compiled, loaded) == (0, 1)
    # Loading takes well under 1 s on an idle machine (0.43 s on the 2-core development machine,
    # docs/torch.md); a compile takes tens of seconds. The bound leaves room for a busy machine.
    assert seconds < 5.0, f"a cached use took {seconds} s"


def test_an_unsupported_operation_takes_the_general_path_under_auto_and_raises_under_true():
    y0 = torch.tensor([[1.0, -2.0], [0.5, 0.25]], dtype=DOUBLE)
    t = torch.tensor([0.0, 0.5], dtype=DOUBLE)
    sorted_rhs = lambda t, y: -torch.sort(y, dim=-1).values
    with pytest.warns(UserWarning, match=r"general path.*does not support the operation aten\.sort"):
        auto = odeint(sorted_rhs, y0, t, method="rk4")
    assert torch.equal(auto, odeint(sorted_rhs, y0, t, method="rk4", compile=False))
    with pytest.raises(NotImplementedError, match=r"compile' is True.*aten\.sort"):
        odeint(sorted_rhs, y0, t, method="rk4", compile=True)

    def branch(t, y):
        return -y if y.sum() > 0 else y
    with pytest.warns(UserWarning, match="data-dependent branch"):
        auto = odeint(branch, y0, t, method="rk4")
    assert torch.equal(auto, odeint(branch, y0, t, method="rk4", compile=False))
    with pytest.raises(NotImplementedError, match="data-dependent branch"):
        odeint(branch, y0, t, method="rk4", compile=True)


def test_without_a_compiler_auto_takes_the_general_path_and_true_raises(van_der_pol, monkeypatch):
    model, y0 = van_der_pol
    t = torch.tensor([0.0, 0.5], dtype=DOUBLE)
    monkeypatch.setenv("CXX", "/nonexistent/c++")
    _extension_build.build_settings.cache_clear()
    monkeypatch.setattr(_compiled_odeint, "_chosen", _user_function.TraceMemo())  # as in a new process
    try:
        with pytest.warns(UserWarning, match=r"general path.*not available here: no C\+\+ compiler"):
            auto = odeint(model, y0, t, **TOLERANCES)
        assert torch.equal(auto, odeint(model, y0, t, compile=False, **TOLERANCES))
        with pytest.raises(NotImplementedError, match=r"compile' is True.*no C\+\+ compiler"):
            odeint(model, y0, t, compile=True, **TOLERANCES)
    finally:
        monkeypatch.delenv("CXX")
        _extension_build.build_settings.cache_clear()


def test_a_second_eager_call_does_not_trace_the_function_again(van_der_pol, monkeypatch):
    model, y0 = van_der_pol
    traces = []
    trace = _field_codegen.trace
    monkeypatch.setattr(_field_codegen, "trace", lambda *args: traces.append(args) or trace(*args))
    t = torch.tensor(TIMES, dtype=DOUBLE)
    first = odeint(model, y0, t, compile=True, **TOLERANCES)
    second = odeint(model, y0, t, compile=True, **TOLERANCES)
    assert traces == []  # the fixture's call traced it
    assert torch.equal(first, second)


SCALE = 2.0


def scaled(y):
    return SCALE * y


class Decay(torch.nn.Module):
    def __init__(self, rate):
        super().__init__()
        self.rate = rate

    def forward(self, t, y):
        return -self.rate * y


def test_the_trace_is_memoised_until_something_it_reads_changes(monkeypatch):
    """What a trace bakes in: a global number read by a function the right-hand side calls, a module's
    number attribute, the shape of a closed-over tensor; a closure over a list is traced at every call."""
    extensions = []

    def extension(token, tensors, n, dtype, method, one_trajectory):
        extensions.append(token)
        return types.SimpleNamespace(namespace=f"paraseq_user_{len(extensions)}")

    monkeypatch.setattr(_compiled_odeint, "extension", extension)
    monkeypatch.setattr(_compiled_odeint, "_chosen", _user_function.TraceMemo())

    def choose(func):
        owner, function = _user_function.split(func)
        return _compiled_odeint._choose(_user_function.register(owner, function), 2, DOUBLE, "cpu", "rk4", False,
                                        True)

    def through_a_global(t, y):
        return scaled(y)
    assert choose(through_a_global) == choose(through_a_global) == "paraseq_user_1"
    monkeypatch.setattr(sys.modules[__name__], "SCALE", 3.0)
    assert choose(through_a_global) == "paraseq_user_2"

    decay = Decay(0.5)
    assert choose(decay) == choose(Decay(0.5)) == "paraseq_user_3"  # another module of the same structure
    decay.rate = 0.25
    assert choose(decay) == "paraseq_user_4"

    def closing_over(weight):
        return lambda t, y: y @ weight.T
    assert choose(closing_over(torch.ones(2, 2, dtype=DOUBLE))) == "paraseq_user_5"
    assert choose(closing_over(torch.zeros(2, 2, dtype=DOUBLE))) == "paraseq_user_5"  # values are inputs
    assert choose(closing_over(torch.ones(3, 2, dtype=DOUBLE))) == "paraseq_user_6"

    rates = [0.5]
    listed = lambda t, y: -rates[0] * y  # noqa: E731 - a list's contents are not keyed
    assert choose(listed) == "paraseq_user_7"
    assert choose(listed) == "paraseq_user_8"


def test_a_cuda_extensions_pytorch_half_is_a_unit_of_its_own_and_each_extern_piece_is_defined_once():
    """A CUDA build's extension (generated here without compiling) compiles its PyTorch half with
    the C++ compiler, in a unit that includes no Kokkos header, and its work with nvcc: the forward
    and the adjoint on each space in units of their own, each defined once for what the work declares
    extern."""
    files = _compiled_odeint._extension_sources("ns", "", [0], "rk4", DOUBLE, True, ".cu")
    assert sorted(files) == ["ns.cpp", "ns.hpp", "ns_adjoint_cuda.cu", "ns_adjoint_host.cu", "ns_forward_cuda.cu",
                             "ns_forward_host.cu", "ns_work.cu", "ns_work.hpp"]
    includes = {name: [line for line in text.splitlines() if line.startswith("#include")] for name, text in files.items()}
    assert includes["ns.cpp"] == ['#include "ns_work.hpp"', '#include "odeint_checks.hpp"', "#include <torch/library.h>"]
    assert includes["ns_work.hpp"] == ['#include "work.hpp"']
    declared = [line.removeprefix("extern ") for line in files["ns_work.cu"].splitlines() if line.startswith("extern template")]
    defined = [line for name, text in files.items() if name != "ns_work.cu"
               for line in text.splitlines() if line.startswith("template void")]
    assert len(declared) == 4 and sorted(declared) == sorted(defined)
    host_only = _compiled_odeint._extension_sources("ns", "", [0], "rk4", DOUBLE, False, ".cpp")
    assert sorted(host_only) == ["ns.cpp", "ns.hpp", "ns_work.cpp", "ns_work.hpp"]
    assert "TORCH_LIBRARY_IMPL(ns, CUDA" not in host_only["ns.cpp"]
