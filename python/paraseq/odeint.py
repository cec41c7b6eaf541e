"""odeint: batched Runge-Kutta integration of a built-in field as one operator (src/loops)."""

from __future__ import annotations

import math
import numbers
from typing import Callable, Optional, Sequence, Union

import torch

from . import _compiled_odeint, _user_function, _user_odeint
from ._ops import ops
from .fields import Field, finite_number
from .newton import _check_compile_argument

METHODS = ("euler", "heun", "rk4", "bosh3", "dopri5", "tsit5")
# The methods of the built-in fields' operator; bosh3 and tsit5 integrate a built-in field on the
# general path (each step in PyTorch), which builds no C++ for them.
OPERATOR_METHODS = ("euler", "heun", "rk4", "dopri5")
STATE_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
MAX_INT32 = 2**31 - 1  # the loops count trajectories, times and steps in int


def _real(name, value, expected, condition):
    if not isinstance(value, numbers.Real) or isinstance(value, bool):
        raise TypeError(f"odeint: argument '{name}' is {value!r} (a {type(value).__name__}), expected {expected}")
    if not condition(value):
        raise ValueError(f"odeint: argument '{name}' is {value!r}, expected {expected}")
    return value


def _step_size(step_size, options):
    if options is None:
        return step_size
    if not isinstance(options, dict):
        raise TypeError(f"odeint: argument 'options' is a {type(options).__name__}, expected a dict or None")
    unknown = sorted(set(options) - {"step_size"})
    if unknown:
        raise ValueError(f"odeint: argument 'options' has the key(s) {unknown}, expected only 'step_size'")
    if step_size is not None and "step_size" in options:
        raise ValueError("odeint: step_size is given both as an argument and in 'options', expected one of them")
    return options.get("step_size", step_size)


def odeint(func: Union[Field, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]], y0: torch.Tensor,
           t: Union[torch.Tensor, Sequence[float]], method: str = "dopri5", step_size: Optional[float] = None,
           rtol: float = 1e-7, atol: float = 1e-9, max_steps: int = 100000, options: Optional[dict] = None, *,
           compile: Union[str, bool] = "auto") -> torch.Tensor:
    """Integrates y' = func(t, y) for the N trajectories y0 [N, n] (or one, y0 [n]); returns
    [len(t), N, n] (or [len(t), n]) as torchdiffeq does, result[0] = y0.

    func: a built-in field (paraseq.fields: one C++ operator) or any callable of your own (a
    function, a closure, an nn.Module). It is called as func(t, y) with y [N, n] and t [N, 1] (each
    trajectory's own time: adaptive steps differ per trajectory), or y [n] and a 0-d t for y0 [n],
    and must return y's shape and dtype, treating rows independently. Gradients reach y0 and the
    tensors it uses that odeint finds: an nn.Module's parameters and buffers (func, the owner of a
    bound method, or a module it closes over), tensors it closes over and tensor defaults; eager
    mode refuses a func whose result requires grad through a tensor not found.
    compile (for a func of your own): "auto" takes the compiled path (func traced and emitted as
    C++, compiled on first use and cached under $PARASEQ_CACHE_DIR or ~/.cache/paraseq) when it
    supports every operation of func, else the general path (the same methods and step rules in
    PyTorch, one custom operator under torch.compile) with a warning naming why; True the compiled
    path or NotImplementedError; False the general path. With a CUDA build of paraseq nvcc
    compiles the first use (on the CPU and on CUDA), 21-43 s for a Van der Pol oscillator on H100
    machines' hosts (2026-12-05 and 2026-12-06). Built-in fields run their operator
    (compile "auto" or True). See docs/migration.md and docs/torch.md.

    t: the observation times, finite and strictly increasing (integrating backward in time is not
    supported); a 1-D tensor or a sequence, real. method: "euler", "heun", "rk4", "bosh3"
    (Bogacki-Shampine 3(2)), "dopri5" or "tsit5" (Tsitouras 5(4)). A built-in field runs bosh3 and
    tsit5 on the general path (its steps in PyTorch: slower than its operator, docs/torch.md), the
    other four in its operator. A step_size (or torchdiffeq's options=dict(step_size=...)) makes any
    method fixed-step (a shorter step lands exactly on each t). Without one, euler and rk4 step from
    one t to the next and heun, bosh3, dopri5 and tsit5 adapt their steps to rtol and atol (defaults
    1e-7 and 1e-9 as torchdiffeq's; at most max_steps attempts per trajectory). The field's tensors
    must have y0's dtype and device.

    Gradients reach y0 and the field's tensors, through the discrete steps taken; a t that requires
    grad is refused (no gradient to the times), and second derivatives (gradients of gradients)
    raise. The whole integration is one operator: a compiled graph does not grow with the number of
    steps.
    """
    _check_compile_argument("odeint", compile)
    field = func
    if not isinstance(field, Field):
        if not callable(func):
            raise TypeError(f"odeint: argument 'func' is a {type(func).__name__}, expected a callable func(t, y) or a "
                            "paraseq.fields field")
    elif compile is False:
        raise ValueError(f"odeint: argument 'compile' is False for the built-in field {type(field).__name__}, whose "
                         "integration is a C++ operator; pass compile='auto' (or True)")
    if not torch.is_tensor(y0):
        raise TypeError(f"odeint: argument 'y0' is a {type(y0).__name__}, expected a tensor [N, n] or [n] "
                        "(tuple and dict states are not supported: concatenate their components)")
    if y0.dtype not in STATE_DTYPES:
        raise TypeError(f"odeint: argument 'y0' has dtype {y0.dtype}, expected float32, float64, float16 or bfloat16")
    one_trajectory = y0.dim() == 1
    if one_trajectory:
        y0 = y0.unsqueeze(0)
    state_size = field.state_size if isinstance(field, Field) else (y0.shape[-1] if y0.dim() == 2 else None)
    if y0.dim() != 2 or y0.shape[1] != state_size:
        if state_size is None:
            raise ValueError(f"odeint: argument 'y0' has shape {list(y0.shape)}, expected [N, n] or [n]")
        raise ValueError(f"odeint: argument 'y0' has shape {list(y0.shape)}, "
                         f"expected [N, {field.state_size}] or [{field.state_size}] (the field's state size)")
    if y0.shape[0] > MAX_INT32:
        raise ValueError(f"odeint: argument 'y0' has shape {list(y0.shape)}, expected at most 2^31 - 1 trajectories")
    if method not in METHODS:
        raise ValueError(f"odeint: argument 'method' is {method!r}, expected one of {', '.join(map(repr, METHODS))}")
    step_size = _step_size(step_size, options)
    if step_size is not None:
        _real("step_size", step_size, "a finite number > 0 or None", lambda v: finite_number(v) and v > 0)
    for name, value in (("rtol", rtol), ("atol", atol)):
        _real(name, value, "a finite number >= 0", lambda v: finite_number(v) and v >= 0)
    if not isinstance(max_steps, numbers.Integral) or isinstance(max_steps, bool):
        raise TypeError(f"odeint: argument 'max_steps' is {max_steps!r} (a {type(max_steps).__name__}), "
                        "expected an int")
    if not 1 <= max_steps <= MAX_INT32:
        raise ValueError(f"odeint: argument 'max_steps' is {max_steps}, expected 1 to 2^31 - 1")
    if torch.is_tensor(t) and t.requires_grad and torch.is_grad_enabled():
        raise ValueError("odeint: argument 't' requires grad, but paraseq.odeint gives no gradient to the times; "
                         "pass t.detach()")
    if not torch.is_tensor(t):
        try:
            t = torch.tensor(t, dtype=torch.float64)
        except (TypeError, ValueError, RuntimeError) as error:
            raise TypeError(f"odeint: argument 't' is {t!r}, expected a 1-D tensor or a sequence of real times "
                            f"({error})") from None
    if t.is_complex():
        raise TypeError(f"odeint: argument 't' has dtype {t.dtype}, expected a real dtype")
    if not isinstance(field, Field):
        return _odeint_user_function(func, y0, t, method, step_size, float(rtol), float(atol), int(max_steps),
                                     one_trajectory, compile)
    field.check(y0)
    params, shared, mlp_hidden = field.operands(y0)
    if method not in OPERATOR_METHODS:
        observed = _odeint_field_in_pytorch(field, y0, t, params, shared, mlp_hidden, method, step_size, float(rtol),
                                            float(atol), int(max_steps))
        return observed[:, 0] if one_trajectory else observed
    arguments = (field.name, y0, t.to(torch.float64), params, shared, mlp_hidden, method,
                 None if step_size is None else float(step_size), float(rtol), float(atol), int(max_steps))
    if torch.compiler.is_compiling():
        observed = ops.odeint(*arguments)
    else:
        try:
            observed = ops.odeint(*arguments)
        except ValueError:
            # The operator names its own 'params' or 'shared'; the field names the argument the
            # caller gave. Checked only after a failure: nothing is read back when all is well.
            field.require_finite()
            raise
    return observed[0] if one_trajectory else observed.transpose(0, 1)


def _check_times(t):
    """The general path's check of t (the operator's for built-in fields): 1-D, finite, increasing."""
    if t.dim() != 1 or t.numel() < 1:
        raise ValueError(f"odeint: argument 't' has shape {list(t.shape)}, expected a 1-D tensor of at least one time")
    times = t.tolist()
    for k, value in enumerate(times):
        if not finite_number(value):
            raise ValueError(f"odeint: argument 't' has t[{k}] = {value}, expected finite times")
        if k and not value > times[k - 1]:
            raise ValueError(f"odeint: argument 't' has t[{k}] = {value} after t[{k - 1}] = {times[k - 1]}, expected "
                             "strictly increasing times")


def _odeint_field_in_pytorch(field, y0, t, params, shared, mlp_hidden, method, step_size, rtol, atol, max_steps):
    """A built-in field on the general path: the state carries each trajectory's parameters behind
    its n components (constants: their derivative is zero, and the step control measures only
    the n), so that the rows of every step see their own parameters; the shared ones are the
    function's one tensor. Returns [len(t), N, n]."""
    n = field.state_size
    own = y0.new_zeros((y0.shape[0], 0)) if params is None else params
    token = _field_function_token(type(field), n, mlp_hidden)
    tensors = [y0.new_zeros((0,)) if shared is None else shared]
    observed = _integrate_registered(token, tensors, torch.cat([y0, own], dim=-1), t, method, step_size, rtol, atol,
                                     max_steps, False, False, n)
    return observed[..., :n]


_field_functions = {}  # (field type, n, mlp_hidden) -> its function, held for the registry's weak reference


@torch._dynamo.assume_constant_result
def _field_function_token(field_type, n, mlp_hidden) -> int:
    """The registry token of the general path's function for a built-in field type and size; runs
    at trace time under torch.compile (a constant of the graph, like a function of your own)."""
    key = (field_type, n, mlp_hidden)
    if key not in _field_functions:
        rhs = field_type._rhs

        def field_function(t, state, shared=torch.zeros(0)):  # shared: the operator's tensor, substituted
            y, row_params = state[:, :n], state[:, n:]
            return torch.cat([rhs(y, row_params, shared, mlp_hidden), torch.zeros_like(row_params)], dim=-1)
        _field_functions[key] = field_function
    return _user_function.register(None, _field_functions[key])


def _odeint_user_function(func, y0, t, method, step_size, rtol, atol, max_steps, one_trajectory, compile):
    """func's tensors found and func registered, then _integrate_registered."""
    owner, function = _user_function.split(func)
    tensors = _user_function.found_tensors(owner, function)
    token = _user_function.register(owner, function)
    return _integrate_registered(token, tensors, y0, t, method, step_size, rtol, atol, max_steps, one_trajectory,
                                 compile, y0.shape[1])


def _integrate_registered(token, tensors, y0, t, method, step_size, rtol, atol, max_steps, one_trajectory, compile,
                          measured):
    """One call of the registered function's generated operator (the compiled path) or of
    paraseq::user_odeint (the general path, whose step control measures the first `measured`
    components of the state)."""
    if step_size is None and method in _user_odeint.ADAPTIVE and rtol == 0 and atol == 0:
        raise ValueError("odeint: arguments 'rtol' and 'atol' are both 0, expected rtol > 0 or atol > 0 for adaptive "
                         f"steps (method {method!r} without a step_size)")
    t = t.detach().to(torch.float64)
    if not torch.compiler.is_compiling():
        _check_times(t)
        if step_size is not None:
            steps = math.ceil((t[-1].item() - t[0].item()) / step_size)
            if steps > MAX_INT32:
                raise ValueError(f"odeint: argument 'step_size' is {step_size}, which takes {steps} steps, expected "
                                 "at most 2^31 - 1 steps (a larger step_size)")
        _check_function(token, y0, t, tensors, one_trajectory)
    step_size = None if step_size is None else float(step_size)
    if compile is not False:
        namespace = _compiled_odeint.choose(token, y0.shape[1], y0.dtype, y0.device.type, method, one_trajectory,
                                            compile)
        if namespace:
            observed = _compiled_odeint.run(namespace, y0, tensors, t, step_size, rtol, atol, max_steps)
            return observed[:, 0] if one_trajectory else observed
    observed = _user_odeint.user_odeint(token, y0, t, tensors, method, step_size, rtol, atol, max_steps,
                                        one_trajectory, measured)
    return observed[:, 0] if one_trajectory else observed


def _check_function(token, y0, t, tensors, one_trajectory):
    """One evaluation at (t[0], y0) with every found tensor detached: its shape and dtype, and a
    result that still requires grad (a tensor odeint did not find, whose gradient would be lost)."""
    with _user_odeint.registered_rhs(token, [x.detach() for x in tensors], one_trajectory) as rhs:
        with torch.enable_grad():
            probe = rhs(t[:1].to(y0.dtype).to(y0.device).expand(y0.shape[0], 1), y0.detach())
    if probe.requires_grad:
        raise ValueError("odeint: argument 'func' uses a tensor that requires grad which odeint does not find (found: "
                         "an nn.Module's parameters and buffers, tensors it closes over, tensor defaults, tensors "
                         "and modules it names as globals), so its gradient would be lost; make that tensor a "
                         "parameter or buffer of an nn.Module, or a variable func closes over")
