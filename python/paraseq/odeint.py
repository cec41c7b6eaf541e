"""odeint: batched Runge-Kutta integration of a built-in field as one operator (src/loops)."""

import torch

from ._ops import ops
from .fields import Field

METHODS = ("euler", "heun", "rk4", "dopri5")


def odeint(field, y0, t, method="dopri5", step_size=None, rtol=1e-6, atol=1e-8, max_steps=100000):
    """Integrates y' = field(t, y) for the N trajectories y0 [N, n]; returns [len(t), N, n] as
    torchdiffeq does, result[0] = y0.

    A step_size makes any method fixed-step (a shorter step lands exactly on each t). Without one,
    euler and rk4 step from one t to the next and heun and dopri5 adapt their steps to rtol and atol
    (at most max_steps attempts per trajectory). Gradients reach y0 and the field's tensors (not t),
    through the discrete steps taken. The whole integration is one operator: a compiled graph does
    not grow with the number of steps.
    """
    if not isinstance(field, Field):
        raise TypeError(f"odeint: argument 'field' is a {type(field).__name__}, expected a paraseq.fields field")
    if method not in METHODS:
        raise ValueError(f"odeint: argument 'method' is {method!r}, expected one of {', '.join(map(repr, METHODS))}")
    if y0.dim() != 2 or y0.shape[1] != field.state_size:
        raise ValueError(f"odeint: argument 'y0' has shape {list(y0.shape)}, "
                         f"expected [N, {field.state_size}] (the field's state size)")
    t = torch.as_tensor(t, dtype=torch.float64)
    params, shared, mlp_hidden = field.operands(y0)
    observed = ops.odeint(field.name, y0, t, params, shared, mlp_hidden, method,
                          None if step_size is None else float(step_size), float(rtol), float(atol), int(max_steps))
    return observed.transpose(0, 1)
