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


@pytest.mark.parametrize("cell_type", CELLS)
def test_user_cells_match_the_loop_in_double(device, cell_type):
    cell, x, h0 = cell_case(cell_type, device)
    h, stats = newton_apply(cell, x, NewtonConfig(max_iters=8), h0=h0, return_stats=True)
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
        solve = lambda x, h0: newton_apply(cell, x, NewtonConfig(max_iters=10), h0=h0)
        assert torch.autograd.gradcheck(solve, (x, h0))


# Inductor for one cell; the others through dynamo and AOTAutograd only, which is where graph
# breaks would come from (inductor's code generation costs most of the time on a small CPU).
@pytest.mark.parametrize("cell_type,backend", [(DiagonalCell, "inductor"), (DenseGRU, "aot_eager"),
                                               (TwoSlotCell, "aot_eager")])
def test_user_cells_compile_without_graph_breaks_and_equal_eager(device, cell_type, backend):
    cell, x, h0 = cell_case(cell_type, device)
    solve = lambda x, h0: newton_apply(cell, x, compile_safe_config(8), h0=h0)
    assert graph_break_count(solve, x, h0) == 0
    compiled = torch.compile(solve, fullgraph=True, backend=backend)
    eager_h, compiled_h = solve(x, h0), compiled(x, h0)
    torch.testing.assert_close(compiled_h, eager_h, rtol=0, atol=1e-14)
    inputs = [x, h0] + list(cell.parameters())
    eager_grads = torch.autograd.grad(eager_h.square().sum(), inputs)
    compiled_grads = torch.autograd.grad(compiled_h.square().sum(), inputs)
    for c, e in zip(compiled_grads, eager_grads):
        torch.testing.assert_close(c, e, rtol=1e-12, atol=1e-14)


def test_user_cell_second_derivatives_raise(device):
    cell, x, h0 = cell_case(DiagonalCell, device, T=6)
    (grad_x,) = torch.autograd.grad(newton_apply(cell, x, h0=h0).square().sum(), x, create_graph=True)
    with pytest.raises(NotImplementedError, match="not differentiable"):
        grad_x.sum().backward()


def test_a_wrong_jacobian_structure_is_caught(device):
    cell, x, h0 = cell_case(DenseGRU, device)
    cell.jac_structure = "diag"  # its recurrent matrices mix the channels
    with pytest.raises((ValueError, NewtonDivergenceError), match="jac_structure 'diag'|did not converge"):
        newton_apply(cell, x, NewtonConfig(max_iters=30), h0=h0)


def test_a_diverged_user_solve_is_refused(device):
    cell, x, h0 = cell_case(DenseGRU, device)
    with torch.no_grad():
        cell.recurrent_map.weight.mul_(20)
    with pytest.raises(NewtonDivergenceError, match="did not converge"):
        newton_apply(cell, 3 * x, NewtonConfig(max_iters=2), h0=h0)


class NoHiddenSize(nn.Module):
    def step(self, h, x):
        return h


class WrongShape(DiagonalCell):
    def step(self, h, x):
        return super().step(h, x)[..., :-1]


def test_user_cell_errors_name_the_argument(device):
    cell, x, h0 = cell_case(DiagonalCell, device)
    with pytest.raises(TypeError, match="argument 'cell'.*hidden_size"):
        newton_apply(NoHiddenSize(), x)
    with pytest.raises(TypeError, match="argument 'cell'.*expected a paraseq.ParaGRU"):
        newton_apply(lambda h, x: h, x)
    cell.jac_structure = "head"
    with pytest.raises(ValueError, match="argument 'cell'.*jac_structure 'head', expected one of 'diag'"):
        newton_apply(cell, x)
    cell.jac_structure = "block4"
    with pytest.raises(ValueError, match="jac_structure 'block4' with state_slots 1"):
        newton_apply(cell, x)
    cell.jac_structure = "diag"
    with pytest.raises(NotImplementedError, match="argument 'compile' is True.*not available yet.*compile='auto'"):
        newton_apply(cell, x, compile=True)
    with pytest.raises(ValueError, match="argument 'compile' is 'yes'"):
        newton_apply(cell, x, compile="yes")
    with pytest.raises(ValueError, match=r"argument 'h0' has shape \[2, 4\], expected \[2, 5\]"):
        newton_apply(cell, x, h0=h0[:, :4])
    with pytest.raises(ValueError, match="argument 'cell'.*returned shape"):
        newton_apply(WrongShape(3, 5).to(device, torch.float64), x)
    with pytest.raises(ValueError, match="scan_backend 'fused'"):
        newton_apply(cell, x, NewtonConfig(scan_backend="fused"))
    big = DenseGRU(3, 40).to(device, torch.float64)
    with pytest.raises(ValueError, match="at most 32"):
        newton_apply(big, x)
