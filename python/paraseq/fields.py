"""The built-in vector fields of paraseq.odeint (src/loops/fields.hpp). Their tensors may require
grad: odeint's backward sends gradients to them. Scalars and [N] tensors give per-trajectory values.

    DampedOscillator(k, c)                     y0' = y1, y1' = -k y0 - c y1
    LotkaVolterra(alpha, beta, delta, gamma)   x' = alpha x - beta x y, y' = delta x y - gamma y
    SIR(beta, gamma)                           s' = -beta s i, i' = beta s i - gamma i, r' = gamma i
    Linear(A, b=None)                          y' = A y + b; A [n, n] shared or [N, n, n] per trajectory,
                                               b [n] or [N, n]
    MLP(W1, b1, W2, b2)                        y' = W2 tanh(W1 y + b1) + b2; W1 [hidden, n], W2 [n, hidden],
                                               hidden <= 128
"""

import torch


def _per_trajectory(values, y0):
    """[N, P]: each value (a number, a 0-d or an [N] tensor) as one column."""
    N = y0.shape[0]
    columns = [torch.as_tensor(value, device=y0.device).to(y0.dtype).expand(N) for value in values]
    return torch.stack(columns, dim=-1)


class Field:
    """A built-in field: name and state_size as the operator knows them; operands(y0) gives
    (params [N, P] or None, shared [Q] or None, mlp_hidden)."""
    name = ""
    state_size = None

    def operands(self, y0):
        raise NotImplementedError


class _OwnParameterField(Field):
    def __init__(self, *values):
        self.values = values

    def operands(self, y0):
        return _per_trajectory(self.values, y0), None, 0


class DampedOscillator(_OwnParameterField):
    name, state_size = "damped_oscillator", 2

    def __init__(self, k, c):
        super().__init__(k, c)


class LotkaVolterra(_OwnParameterField):
    name, state_size = "lotka_volterra", 2

    def __init__(self, alpha, beta, delta, gamma):
        super().__init__(alpha, beta, delta, gamma)


class SIR(_OwnParameterField):
    name, state_size = "sir", 3

    def __init__(self, beta, gamma):
        super().__init__(beta, gamma)


class Linear(Field):
    def __init__(self, A, b=None):
        if A.dim() not in (2, 3) or A.shape[-1] != A.shape[-2]:
            raise ValueError(f"Linear: argument 'A' has shape {list(A.shape)}, expected [n, n] or [N, n, n]")
        n = A.shape[-1]
        if b is not None and (b.dim() not in (1, 2) or b.shape[-1] != n):
            raise ValueError(f"Linear: argument 'b' has shape {list(b.shape)}, expected [{n}] or [N, {n}]")
        self.A, self.b, self.state_size = A, b, n
        # Shared when neither A nor b differs between trajectories; otherwise both per trajectory.
        self.name = "linear_shared" if A.dim() == 2 and (b is None or b.dim() == 1) else "linear_own"

    def operands(self, y0):
        n, A = self.state_size, self.A.to(y0.dtype)
        b = self.b.to(y0.dtype) if self.b is not None else A.new_zeros(n)
        if self.name == "linear_shared":
            return None, torch.cat([A.reshape(n * n), b]), 0
        N = y0.shape[0]
        return torch.cat([A.expand(N, n, n).reshape(N, n * n), b.expand(N, n)], dim=-1), None, 0


class MLP(Field):
    name = "mlp"
    max_hidden = 128

    def __init__(self, W1, b1, W2, b2):
        hidden, n = W1.shape
        expected = {"W1": (W1, (hidden, n)), "b1": (b1, (hidden,)), "W2": (W2, (n, hidden)), "b2": (b2, (n,))}
        for name, (tensor, shape) in expected.items():
            if tuple(tensor.shape) != shape:
                raise ValueError(f"MLP: argument '{name}' has shape {list(tensor.shape)}, expected {list(shape)}")
        if not 1 <= hidden <= self.max_hidden:
            raise ValueError(f"MLP: argument 'W1' has {hidden} rows (hidden units), expected 1 to {self.max_hidden}")
        self.weights, self.hidden, self.state_size = (W1, b1, W2, b2), hidden, n

    def operands(self, y0):
        return None, torch.cat([w.to(y0.dtype).reshape(-1) for w in self.weights]), self.hidden
