"""The built-in vector fields of paraseq.odeint (src/loops/fields.hpp). Their tensors may require
grad: odeint's backward sends gradients to them. Scalars and [N] tensors give per-trajectory values.

    DampedOscillator(k, c)                     y0' = y1, y1' = -k y0 - c y1
    LotkaVolterra(alpha, beta, delta, gamma)   x' = alpha x - beta x y, y' = delta x y - gamma y
    SIR(beta, gamma)                           s' = -beta s i, i' = beta s i - gamma i, r' = gamma i
    Linear(A, b=None)                          y' = A y + b; A [n, n] shared or [N, n, n] per trajectory,
                                               b [n] or [N, n]
    MLP(W1, b1, W2, b2)                        y' = W2 tanh(W1 y + b1) + b2; W1 [hidden, n], W2 [n, hidden],
                                               hidden <= 128

A field's tensors must have the dtype and device of odeint's y0 (they are never cast); Python
numbers are taken in y0's dtype exactly. NaN and Inf are refused, naming the field's argument
(tensors: by odeint in eager mode, once the operator has refused them).
"""

import math
import numbers

import torch


class Field:
    """A built-in field: name and state_size as the operator knows them; operands(y0) gives
    (params [N, P] or None, shared [Q] or None, mlp_hidden) after check(y0)."""
    name = ""
    state_size = None

    def named_values(self):
        """(argument name, number or tensor) of each of the field's own arguments."""
        raise NotImplementedError

    def operands(self, y0):
        raise NotImplementedError

    @staticmethod
    def _rhs(y, params, shared, hidden):
        """dy [rows, n] in PyTorch from y [rows, n], the rows' params [rows, P] ([rows, 0] when
        none) and shared [Q] (empty when none) as operands() packs them, and operands()'s
        mlp_hidden: the formulas of src/loops/fields.hpp, for odeint's general path (the methods
        the field's operator does not have)."""
        raise NotImplementedError

    def _tensors(self):
        return [(name, value) for name, value in self.named_values() if torch.is_tensor(value)]

    def check(self, y0):
        """Refuses tensors of another dtype or device than y0, naming the field's argument."""
        for name, value in self._tensors():
            if value.dtype != y0.dtype:
                raise TypeError(f"{type(self).__name__}: argument '{name}' has dtype {value.dtype}, expected "
                                f"{y0.dtype} (the dtype of odeint's y0; field tensors are not cast)")
            if value.device != y0.device:
                raise ValueError(f"{type(self).__name__}: argument '{name}' is on device {value.device}, "
                                 f"expected {y0.device} (the device of odeint's y0)")

    def require_finite(self):
        """Raises naming the first of the field's tensors that holds a NaN or Inf."""
        for name, value in self._tensors():
            if not torch.isfinite(value).all():
                raise ValueError(f"{type(self).__name__}: argument '{name}' holds a NaN or Inf, expected finite values")

    def _shape_error(self, name, tensor, expected):
        return ValueError(f"{type(self).__name__}: argument '{name}' has shape {list(tensor.shape)}, "
                          f"expected {expected}")


def finite_number(value):
    """math.isfinite as comparisons, which torch.compile traces also for a symbolic float."""
    return -math.inf < value < math.inf


def _checked_number_or_tensor(field, name, value):
    if torch.is_tensor(value):
        if not value.is_floating_point():
            raise TypeError(f"{field}: argument '{name}' has dtype {value.dtype}, expected a floating dtype")
        return value
    if not isinstance(value, numbers.Real) or isinstance(value, bool):
        raise TypeError(f"{field}: argument '{name}' is a {type(value).__name__}, expected a real number or a tensor")
    if not finite_number(value):
        raise ValueError(f"{field}: argument '{name}' is {value}, expected a finite number")
    return value


class _OwnParameterField(Field):
    """A field whose parameters are numbers, 0-d tensors or [N] tensors (one per trajectory)."""

    def __init__(self, **values):
        self.values = {name: _checked_number_or_tensor(type(self).__name__, name, value)
                       for name, value in values.items()}

    def named_values(self):
        return list(self.values.items())

    def operands(self, y0):
        """params [N, P]: each value as one column in y0's dtype (Python numbers exactly, not through
        the default dtype)."""
        N = y0.shape[0]
        columns = []
        for name, value in self.values.items():
            if not torch.is_tensor(value):
                value = torch.tensor(value, dtype=y0.dtype, device=y0.device)
            elif value.dim() > 1 or (value.dim() == 1 and value.shape[0] != N):
                raise self._shape_error(name, value,
                                        f"a number, a 0-d tensor or [N] = [{N}] (one value per trajectory of y0)")
            columns.append(value.expand(N))
        return torch.stack(columns, dim=-1), None, 0


class DampedOscillator(_OwnParameterField):
    """y0' = y1, y1' = -k y0 - c y1 (n = 2).

    Parameters
    ----------
    k, c : float or torch.Tensor
        Numbers, 0-d tensors or [N] tensors (one value per trajectory).
    """
    name, state_size = "damped_oscillator", 2

    def __init__(self, k, c):
        super().__init__(k=k, c=c)

    @staticmethod
    def _rhs(y, params, shared, hidden):
        k, c = params.unbind(-1)
        return torch.stack([y[:, 1], -k * y[:, 0] - c * y[:, 1]], dim=-1)


class LotkaVolterra(_OwnParameterField):
    """x' = alpha x - beta x y, y' = delta x y - gamma y (n = 2).

    Parameters
    ----------
    alpha, beta, delta, gamma : float or torch.Tensor
        Numbers, 0-d tensors or [N] tensors (one value per trajectory).
    """
    name, state_size = "lotka_volterra", 2

    def __init__(self, alpha, beta, delta, gamma):
        super().__init__(alpha=alpha, beta=beta, delta=delta, gamma=gamma)

    @staticmethod
    def _rhs(y, params, shared, hidden):
        alpha, beta, delta, gamma = params.unbind(-1)
        x, z = y.unbind(-1)
        return torch.stack([alpha * x - beta * x * z, delta * x * z - gamma * z], dim=-1)


class SIR(_OwnParameterField):
    """s' = -beta s i, i' = beta s i - gamma i, r' = gamma i (n = 3).

    Parameters
    ----------
    beta, gamma : float or torch.Tensor
        Numbers, 0-d tensors or [N] tensors (one value per trajectory).
    """
    name, state_size = "sir", 3

    def __init__(self, beta, gamma):
        super().__init__(beta=beta, gamma=gamma)

    @staticmethod
    def _rhs(y, params, shared, hidden):
        beta, gamma = params.unbind(-1)
        infection, recovery = beta * y[:, 0] * y[:, 1], gamma * y[:, 1]
        return torch.stack([-infection, infection - recovery, recovery], dim=-1)


def _require_tensor(field, name, value):
    if not torch.is_tensor(value):
        raise TypeError(f"{field}: argument '{name}' is a {type(value).__name__}, expected a tensor")


class Linear(Field):
    """y' = A y + b.

    Parameters
    ----------
    A : torch.Tensor
        [n, n] shared by all trajectories or [N, n, n] one per trajectory.
    b : torch.Tensor, optional
        [n] or [N, n]; zero when None.
    """

    def __init__(self, A, b=None):
        _require_tensor("Linear", "A", A)
        if A.dim() not in (2, 3) or A.shape[-1] != A.shape[-2]:
            raise ValueError(f"Linear: argument 'A' has shape {list(A.shape)}, expected [n, n] or [N, n, n]")
        n = A.shape[-1]
        if b is not None:
            _require_tensor("Linear", "b", b)
            if b.dim() not in (1, 2) or b.shape[-1] != n:
                raise ValueError(f"Linear: argument 'b' has shape {list(b.shape)}, expected [{n}] or [N, {n}]")
        self.A, self.b, self.state_size = A, b, n
        # Shared when neither A nor b differs between trajectories; otherwise both per trajectory.
        self.name = "linear_shared" if A.dim() == 2 and (b is None or b.dim() == 1) else "linear_own"

    def named_values(self):
        return [("A", self.A)] + ([("b", self.b)] if self.b is not None else [])

    def operands(self, y0):
        n, N, A = self.state_size, y0.shape[0], self.A
        b = self.b if self.b is not None else A.new_zeros(n)
        if self.name == "linear_shared":
            return None, torch.cat([A.reshape(n * n), b]), 0
        for name, value in self.named_values():
            if value.dim() == (3 if name == "A" else 2) and value.shape[0] != N:
                raise self._shape_error(name, value, f"{N} (the trajectories of y0) as its first size")
        return torch.cat([A.expand(N, n, n).reshape(N, n * n), b.expand(N, n)], dim=-1), None, 0

    @staticmethod
    def _rhs(y, params, shared, hidden):
        n = y.shape[-1]
        if params.shape[-1] == 0:  # [A (row-major), b] shared by all rows
            return y @ shared[:n * n].reshape(n, n).T + shared[n * n:]
        A, b = params[:, :n * n].reshape(-1, n, n), params[:, n * n:]
        return (A @ y.unsqueeze(-1)).squeeze(-1) + b


class MLP(Field):
    """y' = W2 tanh(W1 y + b1) + b2, a one-hidden-layer neural ODE with shared weights.

    Parameters
    ----------
    W1 : torch.Tensor
        [hidden, n], 1 <= hidden <= 128.
    b1 : torch.Tensor
        [hidden].
    W2 : torch.Tensor
        [n, hidden].
    b2 : torch.Tensor
        [n].
    """
    name = "mlp"
    max_hidden = 128

    def __init__(self, W1, b1, W2, b2):
        for name, tensor in {"W1": W1, "b1": b1, "W2": W2, "b2": b2}.items():
            _require_tensor("MLP", name, tensor)
        if W1.dim() != 2:
            raise ValueError(f"MLP: argument 'W1' has shape {list(W1.shape)}, expected [hidden, n]")
        hidden, n = W1.shape
        expected = {"W1": (W1, (hidden, n)), "b1": (b1, (hidden,)), "W2": (W2, (n, hidden)), "b2": (b2, (n,))}
        for name, (tensor, shape) in expected.items():
            if tuple(tensor.shape) != shape:
                raise ValueError(f"MLP: argument '{name}' has shape {list(tensor.shape)}, expected {list(shape)}")
        if not 1 <= hidden <= self.max_hidden:
            raise ValueError(f"MLP: argument 'W1' has {hidden} rows (hidden units), expected 1 to {self.max_hidden}")
        self.weights, self.hidden, self.state_size = (W1, b1, W2, b2), hidden, n

    def named_values(self):
        return list(zip(("W1", "b1", "W2", "b2"), self.weights))

    def operands(self, y0):
        return None, torch.cat([w.reshape(-1) for w in self.weights]), self.hidden

    @staticmethod
    def _rhs(y, params, shared, hidden):
        n = y.shape[-1]
        W1, b1, W2, b2 = shared.split([hidden * n, hidden, n * hidden, n])
        return torch.tanh(y @ W1.reshape(hidden, n).T + b1) @ W2.reshape(n, hidden).T + b2
