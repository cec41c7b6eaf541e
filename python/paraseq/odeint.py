"""odeint: batched Runge-Kutta integration of a built-in field as one operator (src/loops)."""

from __future__ import annotations

import numbers
from typing import Optional, Sequence, Union

import torch

from ._ops import ops
from .fields import Field, finite_number

METHODS = ("euler", "heun", "rk4", "dopri5")  # the operator's; src/loops also has bosh3 and tsit5
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


def odeint(field: Field, y0: torch.Tensor, t: Union[torch.Tensor, Sequence[float]], method: str = "dopri5",
           step_size: Optional[float] = None, rtol: float = 1e-7, atol: float = 1e-9, max_steps: int = 100000,
           options: Optional[dict] = None) -> torch.Tensor:
    """Integrates y' = field(t, y) for the N trajectories y0 [N, n] (or one, y0 [n]); returns
    [len(t), N, n] (or [len(t), n]) as torchdiffeq does, result[0] = y0.

    t: the observation times, finite and strictly increasing (integrating backward in time is not
    supported); a 1-D tensor or a sequence, real. method: "euler", "heun", "rk4" or "dopri5"
    (torchdiffeq's "bosh3" and "tsit5" are not available here). A step_size (or torchdiffeq's
    options=dict(step_size=...)) makes any method fixed-step (a shorter step lands exactly on each
    t). Without one, euler and rk4 step from one t to the next and heun and dopri5 adapt their steps
    to rtol and atol (defaults 1e-7 and 1e-9 as torchdiffeq's; at most max_steps attempts per
    trajectory). The field's tensors
    must have y0's dtype and device.

    Gradients reach y0 and the field's tensors, through the discrete steps taken; a t that requires
    grad is refused (no gradient to the times), and second derivatives (gradients of gradients)
    raise. The whole integration is one operator: a compiled graph does not grow with the number of
    steps.
    """
    if not isinstance(field, Field):
        raise TypeError(f"odeint: argument 'field' is a {type(field).__name__}, expected a paraseq.fields field")
    if not torch.is_tensor(y0):
        raise TypeError(f"odeint: argument 'y0' is a {type(y0).__name__}, expected a tensor [N, n] or [n] "
                        "(tuple and dict states are not supported: concatenate their components)")
    if y0.dtype not in STATE_DTYPES:
        raise TypeError(f"odeint: argument 'y0' has dtype {y0.dtype}, expected float32, float64, float16 or bfloat16")
    one_trajectory = y0.dim() == 1
    if one_trajectory:
        y0 = y0.unsqueeze(0)
    if y0.dim() != 2 or y0.shape[1] != field.state_size:
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
    field.check(y0)
    params, shared, mlp_hidden = field.operands(y0)
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
