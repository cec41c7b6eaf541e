"""odeint's inputs: exact dtypes, 32-bit ranges, stored overflow, bad arguments named in the caller's
terms, torchdiffeq's spellings, second derivatives, and fakes against kernels on strided inputs."""

import inspect
import math

import pytest
import torch

from paraseq import fields, odeint

DOUBLE = torch.float64
ops = torch.ops.paraseq


def oscillator(device, dtype=DOUBLE):
    return torch.tensor([[1.0, 0.0], [0.5, -0.2]], dtype=dtype, device=device)


# ---- dtypes -------------------------------------------------------------------------------------

def test_python_number_parameters_are_exact_in_float64(device):
    y0 = oscillator(device)
    params = fields.DampedOscillator(1.1, 0.3).operands(y0)[0]
    assert params.dtype == DOUBLE
    assert params[0].tolist() == [1.1, 0.3]
    t = torch.tensor([0.0, 1.0], dtype=DOUBLE)
    from_numbers = odeint(fields.DampedOscillator(1.1, 0.3), y0, t, "rk4", 0.01)
    from_tensors = odeint(fields.DampedOscillator(torch.tensor(1.1, dtype=DOUBLE, device=device),
                                                  torch.tensor(0.3, dtype=DOUBLE, device=device)), y0, t, "rk4", 0.01)
    assert torch.equal(from_numbers, from_tensors)


def test_field_tensors_of_another_dtype_are_refused_not_cast(device):
    y0 = oscillator(device, torch.float32)
    k = torch.tensor([1.5, 2.0], dtype=DOUBLE, device=device)
    with pytest.raises(TypeError, match="DampedOscillator: argument 'k' has dtype torch.float64, "
                                        "expected torch.float32"):
        odeint(fields.DampedOscillator(k, 0.1), y0, [0.0, 1.0])
    with pytest.raises(TypeError, match="Linear: argument 'A' has dtype torch.float64"):
        odeint(fields.Linear(torch.eye(2, dtype=DOUBLE, device=device)), y0, [0.0, 1.0])


def test_overflow_of_the_stored_type_is_reported_as_non_finite(device):
    # e^{3 t} passes float16's 65504 near t = 3.7, finite in the float32 that computes it. (bfloat16
    # has float32's range: its overflow is float32's, which the loops report themselves.)
    dtype, end = torch.float16, 5.0
    field = fields.Linear(torch.tensor([[3.0]], dtype=dtype, device=device))
    y0 = torch.ones(2, 1, dtype=dtype, device=device)
    with pytest.raises(RuntimeError, match="2 of 2 trajectories failed; the first, trajectory 0, stopped with status "
                                           "non_finite .*overflowed"):
        odeint(field, y0, torch.tensor([0.0, end]), "rk4", 0.01)
    assert torch.isfinite(odeint(field, y0, torch.tensor([0.0, 1.0]), "rk4", 0.01)).all()


# ---- 32-bit ranges ------------------------------------------------------------------------------

def direct_args(device, **changes):
    args = dict(field="damped_oscillator", y0=oscillator(device), t=torch.tensor([0.0, 1.0], dtype=DOUBLE),
                params=torch.ones(2, 2, dtype=DOUBLE, device=device), shared=None, mlp_hidden=0, method="rk4",
                step_size=0.1, rtol=1e-7, atol=1e-9, max_steps=1000)
    args.update(changes)
    return args


@pytest.mark.parametrize("max_steps", [2**32, 2**31, 0, -1])
def test_max_steps_out_of_the_int_range_is_refused(device, max_steps):
    y0 = oscillator(device)
    for method, step_size in (("rk4", 0.1), ("dopri5", None)):
        with pytest.raises(ValueError, match=f"odeint: argument 'max_steps' is {max_steps}, expected 1 to 2\\^31 - 1"):
            odeint(fields.DampedOscillator(1.0, 0.1), y0, [0.0, 1.0], method, step_size, max_steps=max_steps)
        with pytest.raises(ValueError, match=f"paraseq::odeint: argument 'max_steps' is {max_steps}"):
            ops.odeint(**direct_args(device, method=method, step_size=step_size, max_steps=max_steps))


def test_mlp_hidden_out_of_range_is_refused_by_the_operator(device):
    n, hidden = 2, 2
    shared = torch.zeros(2 * n * hidden + hidden + n, dtype=DOUBLE, device=device)
    for mlp_hidden in (2**32 + 2, 129, 0):
        with pytest.raises(ValueError, match=f"argument 'mlp_hidden' is {mlp_hidden}, expected 1 to 128"):
            ops.odeint(**direct_args(device, field="mlp", params=None, shared=shared, mlp_hidden=mlp_hidden))
    with pytest.raises(ValueError, match="argument 'mlp_hidden' is 4294967298, expected 0"):
        ops.odeint(**direct_args(device, mlp_hidden=2**32 + 2))


def test_trajectory_counts_beyond_int_are_refused_without_a_negative_size(device):
    huge = torch.zeros(1, 2, dtype=DOUBLE, device=device).expand(2**31, 2)  # no memory behind it
    too_many = r"argument 'y0' has shape \[2147483648, 2\], expected at most 2\^31 - 1"
    with pytest.raises(ValueError, match=too_many) as odeint_error:
        odeint(fields.DampedOscillator(1.0, 0.1), huge, [0.0, 1.0])
    with pytest.raises(ValueError, match=r"argument 'y0' has shape \[2147483648, 2\]") as operator_error:
        ops.odeint(**direct_args(device, y0=huge, params=huge))
    for error in (odeint_error, operator_error):
        assert "-2147483648" not in str(error.value)


# ---- times and steps ----------------------------------------------------------------------------

@pytest.mark.parametrize("t,message", [
    ([math.nan], r"argument 't' has t\[0\] = nan, expected finite times"),
    ([0.0, math.inf], r"argument 't' has t\[1\] = inf, expected finite times"),
    ([0.0, -1.0], r"argument 't' has t\[1\] = -1 after t\[0\] = 0, expected strictly increasing times")])
def test_bad_times_are_named(device, t, message):
    with pytest.raises(ValueError, match=message):
        odeint(fields.DampedOscillator(1.0, 0.1), oscillator(device), t)


def test_step_sizes_are_named_in_the_callers_terms(device):
    field, y0 = fields.DampedOscillator(1.0, 0.1), oscillator(device)
    with pytest.raises(ValueError, match="argument 'step_size' is 1e-12, which takes 1e\\+12 steps .* expected at most "
                                         "2\\^31 - 1 steps") as error:
        odeint(field, y0, [0.0, 1.0], "rk4", 1e-12)
    assert "'dt'" not in str(error.value)
    with pytest.raises(TypeError, match="argument 'step_size' is 'abc' \\(a str\\)"):
        odeint(field, y0, [0.0, 1.0], "rk4", "abc")
    for bad in (math.nan, math.inf, 0.0):
        with pytest.raises(ValueError, match="argument 'step_size' is"):
            odeint(field, y0, [0.0, 1.0], "rk4", bad)
        with pytest.raises(ValueError, match="paraseq::odeint: argument 'step_size' is"):
            ops.odeint(**direct_args(device, step_size=bad))


# ---- field arguments ----------------------------------------------------------------------------

def test_field_parameters_of_the_wrong_length_are_named(device):
    y0 = oscillator(device)
    with pytest.raises(ValueError, match=r"DampedOscillator: argument 'k' has shape \[3\], expected a number, a 0-d "
                                         r"tensor or \[N\] = \[2\]"):
        odeint(fields.DampedOscillator(torch.ones(3, dtype=DOUBLE, device=device), 0.1), y0, [0.0, 1.0])
    with pytest.raises(ValueError, match=r"Linear: argument 'A' has shape \[3, 2, 2\], expected 2 \(the trajectories"):
        odeint(fields.Linear(torch.zeros(3, 2, 2, dtype=DOUBLE, device=device)), y0, [0.0, 1.0])


def test_nan_in_a_field_parameter_names_the_fields_argument(device):
    y0 = oscillator(device)
    with pytest.raises(ValueError, match="DampedOscillator: argument 'c' holds a NaN or Inf"):
        odeint(fields.DampedOscillator(1.0, torch.tensor([0.1, math.nan], dtype=DOUBLE, device=device)), y0, [0.0, 1.0])
    with pytest.raises(ValueError, match="LotkaVolterra: argument 'delta' is nan, expected a finite number"):
        fields.LotkaVolterra(1.0, 1.0, math.nan, 1.0)
    W = [torch.zeros(shape, dtype=DOUBLE, device=device) for shape in [(3, 2), (3,), (2, 3), (2,)]]
    W[2][0, 1] = math.inf
    with pytest.raises(ValueError, match="MLP: argument 'W2' holds a NaN or Inf"):
        odeint(fields.MLP(*W), y0, [0.0, 1.0])


def test_a_one_dimensional_mlp_weight_is_named(device):
    with pytest.raises(ValueError, match=r"MLP: argument 'W1' has shape \[4\], expected \[hidden, n\]"):
        fields.MLP(*(torch.zeros(shape, device=device) for shape in [(4,), (4,), (2, 4), (2,)]))


def test_complex_states_and_times_are_refused(device):
    field = fields.DampedOscillator(1.0, 0.1)
    with pytest.raises(TypeError, match="argument 'y0' has dtype torch.complex128"):
        odeint(field, oscillator(device).to(torch.complex128), [0.0, 1.0])
    with pytest.raises(TypeError, match="argument 't' has dtype torch.complex64"):
        odeint(field, oscillator(device), torch.tensor([0.0, 1.0 + 1.0j]))
    with pytest.raises(TypeError, match="argument 't' is"):
        odeint(field, oscillator(device), [0.0, 1.0 + 1.0j])


# ---- torchdiffeq's spellings --------------------------------------------------------------------

def test_tuple_and_dict_states_are_refused(device):
    field, y0 = fields.DampedOscillator(1.0, 0.1), oscillator(device)
    for state in ((y0[:, :1], y0[:, 1:]), {"x": y0}):
        with pytest.raises(TypeError, match=f"argument 'y0' is a {type(state).__name__}, expected a tensor"):
            odeint(field, state, [0.0, 1.0])


def test_times_that_require_grad_are_refused(device):
    t = torch.tensor([0.0, 1.0], dtype=DOUBLE, requires_grad=True)
    with pytest.raises(ValueError, match="argument 't' requires grad"):
        odeint(fields.DampedOscillator(1.0, 0.1), oscillator(device), t)
    with torch.no_grad():
        odeint(fields.DampedOscillator(1.0, 0.1), oscillator(device), t)


def test_options_step_size_is_the_step_size_argument(device):
    field, y0, t = fields.DampedOscillator(1.0, 0.1), oscillator(device), [0.0, 0.35, 1.0]
    assert torch.equal(odeint(field, y0, t, "rk4", options=dict(step_size=0.1)), odeint(field, y0, t, "rk4", 0.1))
    with pytest.raises(ValueError, match="argument 'options' has the key\\(s\\) \\['first_step'\\]"):
        odeint(field, y0, t, "rk4", options=dict(first_step=0.1))
    with pytest.raises(ValueError, match="step_size is given both"):
        odeint(field, y0, t, "rk4", 0.1, options=dict(step_size=0.1))


def test_one_trajectory_state(device):
    field, y0, t = fields.DampedOscillator(1.0, 0.1), oscillator(device), [0.0, 0.5, 1.0]
    y = odeint(field, y0[1], t)
    assert y.shape == (3, 2)
    assert torch.equal(y, odeint(field, y0[1:], t)[:, 0])


def test_default_tolerances_are_torchdiffeqs():
    parameters = inspect.signature(odeint).parameters
    assert (parameters["rtol"].default, parameters["atol"].default) == (1e-7, 1e-9)


def test_an_unknown_method_is_refused_naming_the_supported_ones(device):
    with pytest.raises(ValueError, match="argument 'method' is 'rk45', expected one of 'euler', 'heun', 'rk4', "
                                         "'bosh3', 'dopri5', 'tsit5'"):
        odeint(fields.DampedOscillator(1.0, 0.1), oscillator(device), [0.0, 1.0], "rk45")


# ---- second derivatives -------------------------------------------------------------------------

def test_double_backward_raises_instead_of_returning_zero(device):
    k = torch.tensor([2.0], dtype=DOUBLE, device=device, requires_grad=True)
    y0 = torch.tensor([[1.0, 0.0]], dtype=DOUBLE, device=device, requires_grad=True)
    t = torch.tensor([0.0, 1.0], dtype=DOUBLE)
    for method, step_size in (("euler", 0.1), ("rk4", 0.1), ("dopri5", None)):
        loss = odeint(fields.DampedOscillator(k, 0.1), y0, t, method, step_size)[-1].square().sum()
        grad_y0, grad_k = torch.autograd.grad(loss, (y0, k), create_graph=True)
        # The first derivatives are those of a plain backward.
        loss_again = odeint(fields.DampedOscillator(k, 0.1), y0, t, method, step_size)[-1].square().sum()
        expected = torch.autograd.grad(loss_again, (y0, k))
        assert torch.equal(grad_y0, expected[0]) and torch.equal(grad_k, expected[1])
        with pytest.raises(RuntimeError, match="paraseq.odeint does not support double backward"):
            torch.autograd.grad(grad_y0.sum(), y0)
    fn = lambda y0: odeint(fields.DampedOscillator(2.0, 0.1), y0, t, "rk4", 0.1)
    with pytest.raises(RuntimeError, match="paraseq.odeint does not support double backward"):
        torch.autograd.gradgradcheck(fn, (y0,))


# ---- fakes against kernels on strided inputs ----------------------------------------------------

def test_opcheck_transposed_and_expanded_inputs(device):
    y0_transposed = torch.randn(2, 3, device=device).t()
    y0_expanded = torch.randn(1, 2, device=device).expand(3, 2)
    params_transposed = torch.rand(2, 3, device=device).t()
    params_expanded = torch.rand(1, 2, device=device).expand(3, 2)
    shared_strided = torch.randn(6, 2, device=device)[:, 0]  # linear_shared with n = 2: Q = n n + n = 6
    grad_y = torch.randn(3, 2, 3, device=device).transpose(1, 2)  # [N, len(t), n], not contiguous
    t = torch.tensor([0.0, 0.5, 1.0], dtype=DOUBLE)
    cases = [("damped_oscillator", y0_transposed, params_transposed, None, "rk4", 0.1),
             ("damped_oscillator", y0_expanded, params_expanded, None, "dopri5", None),
             ("linear_shared", y0_transposed, None, shared_strided, "dopri5", None)]
    for field, y0, params, shared, method, step_size in cases:
        args = (field, y0, t, params, shared, 0, method, step_size, 1e-6, 1e-8, 1000)
        torch.library.opcheck(ops.odeint, args)
        torch.library.opcheck(ops.odeint_backward, args + (grad_y,))
        differentiable = tuple(a.detach().requires_grad_() if torch.is_tensor(a) and a is not t else a for a in args)
        torch.library.opcheck(ops.odeint, differentiable)
