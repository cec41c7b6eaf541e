"""newton_apply's compiled path (generated C++ cells) against float64 loops of cell.step, the general
path and gradcheck; every mode of the C++ solver; torch.compile; opcheck; the fallbacks; the cache;
errors.

Three extensions are compiled per test session, in the session's cache directory (conftest.py):
the diagonal, the two-slot block2 and the dense GRU cell of test_user_functions.py, in float64. The
diagonal and block sources do not depend on hidden_size, so other sizes (test_packed.py's) load them."""

import warnings
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from conftest import cached_use_in_a_new_process, graph_break_count
from paraseq import CompilingWarning, NewtonConfig, NewtonDivergenceError, _cell_codegen, _compiled_cell, _extension_build, \
    _user_cell, _user_function, compile_safe_config, newton_apply
from test_user_functions import DenseGRU, DiagonalCell, TwoSlotCell, cell_case, cell_loop

CELLS = [DiagonalCell, TwoSlotCell, DenseGRU]
CONVERGED = NewtonConfig(max_iters=30)  # T = 24 steps: Newton is exact after T iterations


def gradients(h, inputs, weight):
    return torch.autograd.grad((h * weight).sum(), inputs)


@pytest.mark.parametrize("backend", ["auto", "newton", "fused", "sequential"])
@pytest.mark.parametrize("cell_type", CELLS)
def test_compiled_equals_the_loop_and_the_general_path_in_double(cell_type, backend):
    cell, x, h0 = cell_case(cell_type, "cpu")
    cfg = NewtonConfig(max_iters=30, scan_backend=backend)
    h, stats = newton_apply(cell, x, cfg, h0=h0, return_stats=True, compile=True)
    expected = cell_loop(cell, x, h0)
    general = newton_apply(cell, x, CONVERGED, h0=h0, compile=False)
    assert (h - expected).abs().max() <= 1e-10
    assert (h - general).abs().max() <= 1e-10
    assert stats.residual.shape == (2,) and stats.residual.dtype == torch.float64 and stats.residual.max() <= 1e-10
    assert stats.backend == backend if backend != "auto" else stats.backend in ("newton", "fused", "sequential")
    assert stats.iterations == (0 if stats.backend == "sequential" else 30)
    weight = torch.randn_like(expected)
    inputs = [x, h0] + list(cell.parameters())
    for got, wanted, general_grad in zip(gradients(h, inputs, weight), gradients(expected, inputs, weight),
                                         gradients(general, inputs, weight)):
        torch.testing.assert_close(got, wanted, rtol=1e-9, atol=1e-11)
        torch.testing.assert_close(got, general_grad, rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize("backend", ["newton", "fused"])
def test_compiled_path_residual_atol_stops_early(backend):
    """The fused mode's windows and the newton mode stop before max_iters, within atol (the
    residual from cell.step in a loop), bitwise repeatable."""
    cell, x, h0 = cell_case(DiagonalCell, "cpu")
    x, h0 = x.detach(), h0.detach()
    cfg = NewtonConfig(max_iters=30, residual_atol=1e-10, residual_fail=None, scan_backend=backend)
    h, stats = newton_apply(cell, x, cfg, h0=h0, return_stats=True, compile=True)
    assert stats.backend == backend and 1 <= stats.iterations < 30
    with torch.no_grad():
        assert (h - cell.step(torch.cat([h0.unsqueeze(1), h[:, :-1]], 1), x)).abs().max() <= 1e-10
    assert (h - cell_loop(cell, x, h0)).abs().max() <= 1e-9
    again, again_stats = newton_apply(cell, x, cfg, h0=h0, return_stats=True, compile=True)
    assert torch.equal(again, h) and again_stats.iterations == stats.iterations


def test_auto_is_the_compiled_path_and_two_calls_are_bitwise_equal(monkeypatch):
    cell, x, h0 = cell_case(DiagonalCell, "cpu")

    def general_path(*args):
        raise AssertionError("compile='auto' took the general path")
    monkeypatch.setattr(_user_cell, "solve", general_path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warnings.simplefilter("ignore", CompilingWarning)  # a first use announces its compile
        auto = newton_apply(cell, x, h0=h0)
    assert torch.equal(auto, newton_apply(cell, x, h0=h0, compile=True))
    assert torch.equal(auto, newton_apply(cell, x, h0=h0))


def solve_with(cell, params, x, h0):
    """The compiled solve with the cell's parameters replaced by `params` (a list in the order of
    cell.parameters()): the compiled path takes the module's parameters where they are at the call."""
    places = [(cell.get_submodule(name.rpartition(".")[0]), name.rpartition(".")[2])
              for name, _ in cell.named_parameters()]
    originals = [module._parameters[leaf] for module, leaf in places]
    try:
        for (module, leaf), value in zip(places, params):
            module._parameters[leaf] = value
        return newton_apply(cell, x, CONVERGED, h0=h0, compile=True)
    finally:
        for (module, leaf), value in zip(places, originals):
            module._parameters[leaf] = value


@pytest.mark.parametrize("cell_type", CELLS)
def test_gradcheck_of_x_h0_and_the_parameters_and_the_loops_gradients(cell_type):
    cell, x, h0 = cell_case(cell_type, "cpu", B=1, T=5)
    params = [p.detach().clone().requires_grad_() for p in cell.parameters()]
    solve = lambda x, h0, *params: solve_with(cell, params, x, h0)
    assert torch.autograd.gradcheck(solve, (x, h0, *params), fast_mode=True)
    weight = torch.randn(cell_loop(cell, x, h0).shape, dtype=torch.float64)
    got = gradients(solve(x, h0, *params), [x, h0, *params], weight)
    wanted = gradients(cell_loop(cell, x, h0), [x, h0, *cell.parameters()], weight)
    for g, w in zip(got, wanted):
        torch.testing.assert_close(g, w, rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize("loss", [torch.sum, lambda h: h.square().sum()], ids=["linear", "square"])
def test_second_derivatives_raise(loss):
    cell, x, h0 = cell_case(DiagonalCell, "cpu", T=6)
    (grad,) = torch.autograd.grad(loss(newton_apply(cell, x, h0=h0, compile=True)), cell.decay, create_graph=True)
    with pytest.raises(NotImplementedError, match="not differentiable"):
        grad.sum().backward()


@pytest.mark.parametrize("cell_type", [TwoSlotCell, DenseGRU])
def test_torch_compile_sees_the_operator_without_graph_breaks_and_equals_eager(cell_type):
    cell, x, h0 = cell_case(cell_type, "cpu", T=8)
    solve = lambda x, h0: newton_apply(cell, x, compile_safe_config(8), h0=h0, compile=True)
    assert graph_break_count(solve, x, h0) == 0
    compiled = torch.compile(solve, fullgraph=True, backend="aot_eager")
    eager_h, compiled_h = solve(x, h0), compiled(x, h0)
    torch.testing.assert_close(compiled_h, eager_h, rtol=0, atol=1e-14)
    inputs = [x, h0] + list(cell.parameters())
    for c, e in zip(torch.autograd.grad(compiled_h.square().sum(), inputs),
                    torch.autograd.grad(eager_h.square().sum(), inputs)):
        torch.testing.assert_close(c, e, rtol=1e-12, atol=1e-14)
    with torch.no_grad():  # the parameters are inputs of the graph: their new values are used
        for parameter in cell.parameters():
            parameter.mul_(0.9)
    changed = solve(x, h0)
    assert not torch.equal(changed, eager_h)
    torch.testing.assert_close(compiled(x, h0), changed, rtol=0, atol=1e-14)


def test_one_graph_for_every_batch_size_and_length_under_dynamic_shapes():
    cell, _, _ = cell_case(DiagonalCell, "cpu")
    solve = lambda x, h0: newton_apply(cell, x, compile_safe_config(12), h0=h0, compile=True)
    compiled = torch.compile(solve, fullgraph=True, dynamic=True, backend="aot_eager")
    torch._dynamo.reset()
    with torch._dynamo.config.patch(error_on_recompile=True):
        for B, T in ((2, 8), (3, 5), (5, 11), (4, 2)):  # sizes 0 and 1 are specialised by dynamo
            x = (torch.rand(B, T, 3, dtype=torch.float64) - 0.5).requires_grad_()
            h0 = torch.randn(B, 5, dtype=torch.float64, requires_grad=True)
            got, wanted = compiled(x, h0), solve(x, h0)
            torch.testing.assert_close(got, wanted, rtol=0, atol=1e-14)
            for c, e in zip(torch.autograd.grad(got.sum(), (x, h0)), torch.autograd.grad(wanted.sum(), (x, h0))):
                torch.testing.assert_close(c, e, rtol=0, atol=1e-14)


def plan_of(cell, x, h0):
    """The compiled path's plan (extension, prologues, gathers) of a call."""
    layout = _user_cell.CellLayout(cell)
    token = _user_function.register(*_user_function.split(cell.step))
    key = _compiled_cell.choose(token, layout.structure, layout.slots, layout.hidden, x.shape[2], h0.dtype, x.dtype,
                                "cpu", False, True, type(cell).__name__)
    return _compiled_cell._plans[key], layout


def test_opcheck_of_the_generated_operators():
    cell, x, h0 = cell_case(TwoSlotCell, "cpu", T=6)
    plan, layout = plan_of(cell, x, h0)
    ext = plan.extension
    N = layout.state_size
    u = torch.randn(2, 6, plan.input_index.numel(), dtype=torch.float64, requires_grad=True)
    params = torch.randn(plan.groups, plan.param_index.numel() // plan.groups, dtype=torch.float64,
                         requires_grad=True)
    state0 = torch.randn(2, N, dtype=torch.float64, requires_grad=True)
    config = CONVERGED._operator_config(True)
    torch.library.opcheck(ext.newton, (u, params, state0, config, True))
    torch.library.opcheck(ext.newton, (u, params, None, config, False))
    early_fused = NewtonConfig(max_iters=30, residual_atol=1e-8, residual_fail=None, scan_backend="fused")
    torch.library.opcheck(ext.newton, (u, params, state0, early_fused._operator_config(True), True))
    h = ext.newton(u.detach(), params.detach(), state0.detach(), config, False)[0]
    grad_h = torch.randn_like(h)
    torch.library.opcheck(ext.backward, (u.detach(), params.detach(), state0.detach(), h, grad_h))


def test_the_operators_name_their_arguments():
    cell, x, h0 = cell_case(DiagonalCell, "cpu", T=4)
    plan, layout = plan_of(cell, x, h0)
    u = torch.zeros(2, 4, plan.input_index.numel(), dtype=torch.float64)
    params = torch.zeros(plan.groups, 1, dtype=torch.float64)
    config = CONVERGED._operator_config(True)
    with pytest.raises(ValueError, match=r"argument 'u' has shape \[2, 4, 4\], expected \[B, T, 5\]"):
        plan.extension.newton(u[..., :4], params, None, config, False)
    with pytest.raises(ValueError, match="argument 'u' has dtype Float, expected Double"):
        plan.extension.newton(u.float(), params.float(), None, config, False)
    with pytest.raises(ValueError, match=r"argument 'h0' has shape \[2, 3\], expected \[2, 5\]"):
        plan.extension.newton(u, params, torch.zeros(2, 3, dtype=torch.float64), config, False)
    with pytest.raises(ValueError, match=r"argument 'config' has entry 2 \(omega\) = 0"):
        plan.extension.newton(u, params, None, [2, 3, 0, -1, -1, 0, 0, 0, 0], False)
    h = torch.zeros(2, 4, 5, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"argument 'grad_h' has shape \[2, 4, 4\], expected \[2, 4, 5\]"):
        plan.extension.backward(u, params, None, h, h[..., :4])


# ---- cells the compiled path does not take -------------------------------------------------------

class SortingCell(nn.Module):
    """A dense cell whose step sorts the state: aten.sort has no generated code."""

    def __init__(self):
        super().__init__()
        self.hidden_size = 3
        self.input_map = nn.Linear(3, 3)

    def step(self, h, x):
        return torch.tanh(0.5 * torch.sort(h, dim=-1).values + self.input_map(x))


class BranchingCell(DiagonalCell):
    def step(self, h, x):
        return super().step(h, x) if h.sum() > 0 else torch.tanh(self.input_map(x))


class DropoutCell(DiagonalCell):
    def step(self, h, x):
        return torch.tanh(self.decay * h + self.input_map(F.dropout(x, 0.5, training=True)))


def test_an_unsupported_operation_takes_the_general_path_under_auto_and_raises_under_true():
    cell = SortingCell().double()
    x = torch.rand(2, 6, 3, dtype=torch.float64) - 0.5
    with pytest.warns(UserWarning, match=r"general path for this cell: the compiled path does not support the "
                                         r"operation aten\.sort"):
        auto = newton_apply(cell, x, CONVERGED)
    assert torch.equal(auto, newton_apply(cell, x, CONVERGED, compile=False))
    with pytest.raises(NotImplementedError, match=r"argument 'compile' is True, but the compiled path does not "
                                                  r"support the operation aten\.sort"):
        newton_apply(cell, x, CONVERGED, compile=True)
    branching = BranchingCell(3, 5).double()
    with pytest.warns(UserWarning, match="data-dependent branch"):
        auto = newton_apply(branching, x, CONVERGED)
    assert torch.equal(auto, newton_apply(branching, x, CONVERGED, compile=False))
    with pytest.raises(NotImplementedError, match="random operation"):
        newton_apply(DropoutCell(3, 5).double(), x, CONVERGED, compile=True)


class MaxIndexCell(DiagonalCell):
    def step(self, h, x):
        return super().step(h, x) + 0.1 * torch.max(h, -1, keepdim=True).indices


class NarrowWhereCell(DiagonalCell):
    def step(self, h, x):  # torch.where of two numbers is of the default dtype, float32
        return super().step(h, x) + 0.5 * torch.where(h > 0, 0.1, -0.1)


@pytest.mark.parametrize("cell_type,named", [
    (MaxIndexCell, r"the indices of the operation aten\.max\.dim \(torch\.max or torch\.min of a dimension: their "
                   r"values are supported, their indices are not\)"),
    (NarrowWhereCell, r"the operation aten\.mul\.Tensor computed in dtype torch\.float32 in a function of a state "
                      r"of dtype torch\.float64"),
])
def test_an_unsupported_selection_takes_the_general_path_under_auto_and_raises_under_true(cell_type, named):
    cell, x, h0 = cell_case(cell_type, "cpu", T=4)
    with pytest.warns(UserWarning, match=f"general path for this cell: the compiled path does not support {named}"):
        auto = newton_apply(cell, x, CONVERGED, h0=h0)
    assert torch.equal(auto, newton_apply(cell, x, CONVERGED, h0=h0, compile=False))
    with pytest.raises(NotImplementedError, match=f"argument 'compile' is True, but the compiled path does not "
                                                  f"support {named}"):
        newton_apply(cell, x, CONVERGED, h0=h0, compile=True)


def test_states_of_half_precision_and_other_devices_take_the_general_path():
    cell, x, h0 = cell_case(DiagonalCell, "cpu", T=4)
    cell = cell.to(torch.bfloat16)
    x_half = x.detach().to(torch.bfloat16)
    cfg = NewtonConfig(max_iters=4, residual_fail=None)
    with pytest.warns(UserWarning, match="does not support a state of dtype torch.bfloat16"):
        newton_apply(cell, x_half, cfg)
    with pytest.raises(NotImplementedError, match="does not support a state of dtype torch.bfloat16"):
        newton_apply(cell, x_half, cfg, compile=True)


def test_without_a_compiler_auto_takes_the_general_path_and_true_raises(monkeypatch):
    cell, x, h0 = cell_case(DiagonalCell, "cpu", T=4)
    monkeypatch.setenv("CXX", "/nonexistent/c++")
    _extension_build.build_settings.cache_clear()
    monkeypatch.setattr(_compiled_cell, "_chosen", _user_function.TraceMemo())  # as in a new process
    try:
        with pytest.warns(UserWarning, match=r"general path for this cell: the compiled path is not available here: "
                                             r"no C\+\+ compiler"):
            auto = newton_apply(cell, x, CONVERGED, h0=h0)
        assert torch.equal(auto, newton_apply(cell, x, CONVERGED, h0=h0, compile=False))
        with pytest.raises(NotImplementedError, match=r"compile' is True.*no C\+\+ compiler"):
            newton_apply(cell, x, CONVERGED, h0=h0, compile=True)
    finally:
        monkeypatch.delenv("CXX")
        _extension_build.build_settings.cache_clear()


# ---- the cache -----------------------------------------------------------------------------------

def test_a_second_call_and_another_hidden_size_hit_the_cache_and_a_new_process_loads_it():
    cell, x, h0 = cell_case(DiagonalCell, "cpu", T=4)
    newton_apply(cell, x, h0=h0, compile=True)
    counts = lambda: (_extension_build.statistics["compiles"], _extension_build.statistics["loads"])
    before = counts()
    newton_apply(cell, x, h0=h0, compile=True)
    wider = DiagonalCell(3, 7).double()  # the diagonal cell's source does not depend on hidden_size
    h = newton_apply(wider, x, NewtonConfig(max_iters=30), compile=True)
    assert counts() == before
    torch.testing.assert_close(h, cell_loop(wider, x, torch.zeros(2, 7, dtype=torch.float64)), rtol=0, atol=1e-12)
    compiled, loaded, seconds = cached_use_in_a_new_process(
        """
        from paraseq import newton_apply
        from test_user_functions import DiagonalCell, cell_case
        cell, x, h0 = cell_case(DiagonalCell, "cpu", T=4)
        """,
        "newton_apply(cell, x, h0=h0, compile=True)")
    assert (compiled, loaded) == (0, 1)
    # A compile takes tens of seconds; loading well under one (the bound leaves room for a busy machine).
    assert seconds < 5.0, f"a cached use took {seconds} s"


class LeakyDecayCell(DiagonalCell):
    """A diagonal cell whose generated source no other test compiles (a scaling of a parameter alone
    would not do: the parameters' prologue runs in PyTorch, outside the generated cell)."""

    def step(self, h, x):
        return 0.75 * torch.tanh(self.decay * h + self.input_map(x)) + 0.25 * h


def test_a_compile_is_announced_once_and_a_cached_use_is_silent(tmp_path, monkeypatch):
    monkeypatch.setenv("PARASEQ_CACHE_DIR", str(tmp_path))
    cell, x, h0 = cell_case(LeakyDecayCell, "cpu", T=4)
    compiles = _extension_build.statistics["compiles"]
    with pytest.warns(CompilingWarning, match=f"newton_apply: compiling .* cached in {tmp_path}"):
        h = newton_apply(cell, x, CONVERGED, h0=h0, compile=True)
    assert _extension_build.statistics["compiles"] == compiles + 1
    with warnings.catch_warnings():
        warnings.simplefilter("error", CompilingWarning)
        again = newton_apply(cell, x, CONVERGED, h0=h0, compile=True)
    assert torch.equal(h, again)
    torch.testing.assert_close(h, cell_loop(cell, x, h0), rtol=0, atol=1e-12)


class ClampedCell(DiagonalCell):
    """A recurrence through clamps with constant bounds (both, and each alone)."""

    def step(self, h, x):
        pre = self.decay * h + self.input_map(x)
        return 0.5 * torch.clamp(pre, -0.3, 0.4) + 0.3 * pre.clamp(min=-0.2) + 0.2 * torch.clamp(h, max=0.1)


def test_clamps_in_the_recurrence_equal_the_loop_and_the_general_paths_gradients():
    cell, x, h0 = cell_case(ClampedCell, "cpu")
    with torch.no_grad():  # inputs wide enough that every clamp is active somewhere
        x.mul_(4)
    h = newton_apply(cell, x, CONVERGED, h0=h0, compile=True)
    expected = cell_loop(cell, x, h0)
    general = newton_apply(cell, x, CONVERGED, h0=h0, compile=False)
    assert (h - expected).abs().max() <= 1e-12
    pre = (cell.decay * expected.roll(1, 1) + cell.input_map(x))[:, 1:]
    assert (pre < -0.3).any() and (pre > 0.4).any() and (expected < 0.1).any() and (expected > 0.1).any()
    weight = torch.randn_like(expected)
    inputs = [x, h0] + list(cell.parameters())
    for got, wanted in zip(gradients(h, inputs, weight), gradients(general, inputs, weight)):
        torch.testing.assert_close(got, wanted, rtol=1e-9, atol=1e-11)


class SwitchingCell(DiagonalCell):
    """A recurrence through every selection the compiled path takes: where on comparisons of the
    state, & ~ and logical_and/or/xor/not, booleans as numbers, masked_fill, maximum, minimum,
    sign, clamps to tensors computed from a parameter (both bounds, each alone) and to numbers;
    conditions on x alone and on a parameter alone (computed by the prologue, in PyTorch)."""

    def step(self, h, x):
        pre = self.decay * h + self.input_map(x)
        gate = torch.where((h > 0) & ~(pre < -0.5), torch.tanh(pre), 0.5 * pre)
        kept = torch.where(x[..., :1] > 0, gate, h) + torch.where(self.decay > 0, 0.2 * h, -0.1 * h)
        either = torch.where(torch.logical_or(h <= -0.2, h >= 0.2), 0.1, -0.1)
        exact = h.masked_fill(h == self.decay, 0.3) - torch.where(h != 0, 0.0, 0.2)
        odd = torch.logical_xor(h > 0, pre > 0).to(h.dtype) - \
            torch.logical_and(h < 0.1, torch.logical_not(pre > 0.3)).to(h.dtype)
        extremes = torch.maximum(h, self.decay) + torch.minimum(pre, -self.decay)
        clamped = torch.clamp(pre, self.decay - 0.3, self.decay + 0.3) + pre.clamp_min(self.decay) - \
            torch.clamp(h, max=self.decay) + torch.clamp(pre, -0.4, 0.5)
        return 0.5 * kept + 0.1 * (either + exact + odd + extremes + clamped + torch.sign(pre))


def switching_case(**sizes):
    cell, x, h0 = cell_case(SwitchingCell, "cpu", **sizes)
    with torch.no_grad():  # inputs wide enough that every branch is taken somewhere
        x.mul_(4)
    return cell, x, h0


def test_selections_in_the_recurrence_equal_the_loop_with_torchs_gradients_at_ties():
    cell, x, h0 = switching_case()
    with torch.no_grad():  # ties at the first step: h_prev equal to the decay, and zeros
        h0[0] = cell.decay
        h0[1, :2] = 0
    h = newton_apply(cell, x, CONVERGED, h0=h0, compile=True)
    expected = cell_loop(cell, x, h0)
    general = newton_apply(cell, x, CONVERGED, h0=h0, compile=False)
    assert (h - expected).abs().max() <= 1e-12
    assert (h - general).abs().max() <= 1e-12
    h_prev = torch.cat([h0.unsqueeze(1), expected[:, :-1]], dim=1).detach()
    pre = (cell.decay * h_prev + cell.input_map(x)).detach()
    decay = cell.decay.detach()
    both = lambda condition: bool(condition.any() and (~condition).any())
    assert all(both(c) for c in (h_prev > 0, pre < -0.5, x[..., :1] > 0, decay > 0, h_prev <= -0.2, h_prev >= 0.2,
                                 torch.logical_xor(h_prev > 0, pre > 0), h_prev < 0.1, pre > 0.3, h_prev > decay,
                                 pre < -decay, pre < decay - 0.3, pre > decay + 0.3, pre < decay, pre < -0.4, pre > 0.5))
    assert bool((h_prev == decay).any()) and bool((h_prev == 0).any())
    weight = torch.randn_like(expected)
    inputs = [x, h0] + list(cell.parameters())
    for got, wanted, general_grad in zip(gradients(h, inputs, weight), gradients(expected, inputs, weight),
                                         gradients(general, inputs, weight)):
        torch.testing.assert_close(got, wanted, rtol=1e-9, atol=1e-11)
        torch.testing.assert_close(got, general_grad, rtol=1e-9, atol=1e-11)


def test_selections_gradcheck_of_x_h0_and_the_parameters():
    cell, x, h0 = switching_case(B=1, T=5)
    params = [p.detach().clone().requires_grad_() for p in cell.parameters()]
    solve = lambda x, h0, *params: solve_with(cell, params, x, h0)
    assert torch.autograd.gradcheck(solve, (x, h0, *params), fast_mode=True)


def on_the_points(x, points):
    """x and h0 [B, H] with z = h0 + x[:, 0, :H], the argument of the cells' kinks and ties at the
    first step, exactly on `points` [H]. (Later steps' states are the solver's, equal to the
    loop's to rounding only: a kink there is not evaluated at the same point.)"""
    x = x.detach().clone()
    x[:, 0, :points.numel()] = 0
    return x.requires_grad_(), points.repeat(x.shape[0], 1).requires_grad_()


def kinks_equal_the_general_path_and_the_loop(cell, reference, x, h0):
    """In every mode, the compiled solve of `cell` equals the float64 loop and the general path of
    `reference` (the same cell in operations torch differentiates), gradients included (the
    generated vjp's), and so does one Newton iteration, which linearizes the cell at h0 (the
    Jacobian from dual numbers)."""
    one_iteration = dict(max_iters=1, residual_fail=None)
    general_iterate = newton_apply(reference, x, NewtonConfig(**one_iteration), h0=h0, compile=False)
    for backend in ("newton", "fused"):
        iterate = newton_apply(cell, x, NewtonConfig(scan_backend=backend, **one_iteration), h0=h0, compile=True)
        torch.testing.assert_close(iterate, general_iterate, rtol=1e-12, atol=1e-13, msg=lambda m: f"{backend}: {m}")
    expected = cell_loop(reference, x, h0)
    general = newton_apply(reference, x, CONVERGED, h0=h0, compile=False)
    assert (general - expected).abs().max() <= 1e-12
    weight = torch.randn_like(expected)
    wanted = gradients(expected, [x, h0] + list(reference.parameters()), weight)
    general_grads = gradients(general, [x, h0] + list(reference.parameters()), weight)
    for backend in ("newton", "fused", "sequential"):
        h = newton_apply(cell, x, NewtonConfig(max_iters=30, scan_backend=backend), h0=h0, compile=True)
        assert (h - expected).abs().max() <= 1e-12, backend
        named = lambda message: f"{backend}: {message}"
        for got, want, general_grad in zip(gradients(h, [x, h0] + list(cell.parameters()), weight), wanted,
                                           general_grads):
            torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-11, msg=named)
            torch.testing.assert_close(got, general_grad, rtol=1e-9, atol=1e-11, msg=named)


class AbsCell(nn.Module):
    """h_t = decay |h_{t-1}| + h_{t-1} / 2 + x_t: its Jacobian at h_{t-1} = 0 is torch's, 1/2 (the
    derivative of |h| at 0 is sign(0) = 0), from dual numbers as in the generated vjp."""
    jac_structure = "diag"

    def __init__(self, hidden_size):
        super().__init__()
        self.hidden_size = hidden_size
        self.decay = nn.Parameter(torch.full((hidden_size,), 0.25))

    def step(self, h, x):
        return self.decay * h.abs() + 0.5 * h + x


def test_abs_at_zero_has_torchs_derivative_zero_in_the_newton_iterate():
    """One Newton iteration from the initial guess h^0_t = step(0, x_t) = x_t linearizes the cell at
    h^0_{t-1} = x_{t-1}, exactly 0 where x is: its result is h^1_t = h^0_t + J_t (h^1_{t-1} - h^0_{t-1})
    with J_t = decay sign(x_{t-1}) + 1/2 (a float64 loop here), and the general path's."""
    cell = AbsCell(5).double()
    x = torch.randn(2, 12, 5, dtype=torch.float64)
    x[:, 1::2, :3] = 0  # kinks at every other step
    h0 = torch.randn(2, 5, dtype=torch.float64)
    h0[:, 1] = 0
    decay = cell.decay.detach()
    guess = x.detach()
    previous, iterate, expected = h0, h0, []
    for t in range(12):  # previous: h^0_{t-1}, iterate: h^1_{t-1}
        slope = decay * torch.sign(previous) + 0.5
        step = cell.step(previous, x[:, t]).detach() + slope * (iterate - previous)
        previous, iterate = guess[:, t], step
        expected.append(step)
    expected = torch.stack(expected, dim=1)
    one_iteration = dict(max_iters=1, residual_fail=None)
    general = newton_apply(cell, x, NewtonConfig(**one_iteration), h0=h0, compile=False)
    torch.testing.assert_close(general, expected, rtol=0, atol=1e-14)
    assert (expected - cell_loop(cell, x, h0)).abs().max() > 0.1  # one iteration is not yet the solution
    for backend in ("newton", "fused"):
        h = newton_apply(cell, x, NewtonConfig(scan_backend=backend, **one_iteration), h0=h0, compile=True)
        torch.testing.assert_close(h, expected, rtol=0, atol=1e-14, msg=lambda m: f"{backend}: {m}")


KINKS = torch.tensor([0.0, -0.5, 0.4, 3.0, 6.0], dtype=torch.float64)  # of the activations, per channel


class ActivationCell(DiagonalCell):
    """A recurrence through the activations, with z on their kinks at KINKS (leaky_relu, elu, relu6
    and heaviside at 0, hardtanh at -0.5 and 0.4, softplus's threshold at 0.4, hardsigmoid at 3,
    relu6 at 6), silu, and isinf, isnan and isfinite as masks of where, of values used only there
    that are infinite or NaN (1 / z at 0, log z), whose derivatives are then not taken."""

    def __init__(self, hidden_size):
        super().__init__(hidden_size, hidden_size)
        self.at_zero = nn.Parameter(torch.rand(hidden_size))  # heaviside's value at 0

    def heaviside(self, z):
        return torch.heaviside(z, self.at_zero)

    def step(self, h, x):
        z = h + x
        kinked = F.leaky_relu(z, 0.2) + F.hardtanh(z, -0.5, 0.4) + F.relu6(z) + F.elu(z, 1.3) + \
            F.softplus(z, beta=2.5, threshold=1.0) + F.hardsigmoid(z) + F.silu(z) + self.heaviside(z)
        masks = torch.where(torch.isinf(1.0 / z), 0.3, 0.1 * h) + \
            torch.where(torch.isnan(torch.log(z)), -0.2 * h, 0.0) + torch.where(torch.isfinite(torch.log(z)), 0.1, -0.1)
        return 0.5 * torch.tanh(self.decay * h + self.input_map(x)) + 0.05 * (kinked + masks)


class ActivationReference(ActivationCell):
    """ActivationCell with heaviside, which torch does not differentiate, as a where: the compiled
    path's derivative of it (0 in z, the selection's in its value at 0)."""

    def heaviside(self, z):
        return torch.where(z == 0, self.at_zero, (z > 0).to(z.dtype))


def activation_case(B=2, T=12):
    cell = ActivationCell(5).double()
    reference = ActivationReference(5).double()
    reference.load_state_dict(cell.state_dict())
    x, h0 = on_the_points(torch.rand(B, T, 5, dtype=torch.float64) - 0.5, KINKS)
    return cell, reference, x, h0


def test_activations_at_their_kinks_have_torchs_derivatives():
    cell, reference, x, h0 = activation_case()
    z = torch.cat([h0.unsqueeze(1), cell_loop(cell, x, h0)[:, :-1]], 1).detach() + x.detach()
    assert bool((z < -0.5).any() and ((z > 0.4) & (z < 3)).any())  # off the kinks, every branch
    kinks_equal_the_general_path_and_the_loop(cell, reference, x, h0)


def test_activations_gradcheck_of_x_h0_and_the_parameters():
    cell, _, x, h0 = activation_case(B=1, T=5)
    with torch.no_grad():  # off the kinks, which gradcheck's differences would cross
        x[:, 0] += 0.01
    params = [p.detach().clone().requires_grad_() for p in cell.parameters()]
    solve = lambda x, h0, *params: solve_with(cell, params, x, h0)
    assert torch.autograd.gradcheck(solve, (x, h0, *params), fast_mode=True)


class ExtremesCell(nn.Module):
    """A dense recurrence through max and min of a dimension (their values, with and without
    keepdim), amax and amin, of the state and of z = h_prev + x."""
    jac_structure = "dense"

    def __init__(self, hidden_size):
        super().__init__()
        self.hidden_size = hidden_size
        self.input_map = nn.Linear(hidden_size, hidden_size)
        self.decay = nn.Parameter(torch.rand(hidden_size) - 0.5)

    def step(self, h, x):
        z = h + x
        pairs = z.unsqueeze(-1).expand(*z.shape, 2)  # [..., H, 2]: each element twice, a tie
        extremes = torch.max(z, dim=-1, keepdim=True).values - 0.5 * torch.min(z, -1)[0].unsqueeze(-1) + \
            0.3 * h.amax(-1, keepdim=True) + 0.2 * z.amin(dim=-1, keepdim=True) + 0.4 * pairs.amax(-1) - \
            0.3 * torch.max(pairs, -1).values
        return torch.tanh(self.decay * h + self.input_map(x) + 0.3 * extremes)


def test_extremes_with_ties_have_torchs_derivatives():
    cell = ExtremesCell(5).double()
    tied = torch.tensor([0.3, -0.2, 0.3, -0.2, 0.1], dtype=torch.float64)  # two maxima, two minima
    x, h0 = on_the_points(torch.rand(2, 12, 5, dtype=torch.float64) - 0.5, tied)
    kinks_equal_the_general_path_and_the_loop(cell, cell, x, h0)


def test_extremes_gradcheck_of_x_h0_and_the_parameters():
    cell = ExtremesCell(5).double()
    x = (torch.rand(1, 5, 5, dtype=torch.float64) - 0.5).requires_grad_()
    h0 = torch.randn(1, 5, dtype=torch.float64, requires_grad=True)
    params = [p.detach().clone().requires_grad_() for p in cell.parameters()]
    solve = lambda x, h0, *params: solve_with(cell, params, x, h0)
    assert torch.autograd.gradcheck(solve, (x, h0, *params), fast_mode=True)


# ---- errors --------------------------------------------------------------------------------------

def test_a_declared_structure_that_the_step_does_not_have_is_refused_exactly():
    """Also without a residual check (compile_safe_config): the traced step shows the coupling."""
    cell, x, h0 = cell_case(DenseGRU, "cpu", T=4)
    cell.jac_structure = "diag"
    with pytest.raises(ValueError, match=r"argument 'cell' \(a DenseGRU\) declares jac_structure 'diag', but its "
                                         r"step \(traced\) computes the state \[0\] from h_prev\[\d\], outside its "
                                         "diag group"):
        newton_apply(cell, x, compile_safe_config(3), h0=h0)
    two_slots, x, state0 = cell_case(TwoSlotCell, "cpu", T=4)
    two_slots.jac_structure = "diag"
    with pytest.raises(ValueError, match=r"declares jac_structure 'diag', but its step \(traced\) computes the state "
                                         r"\[0, 0\] from h_prev\[1, 0\]"):
        newton_apply(two_slots, x, compile_safe_config(3), h0=state0, compile=True)


def test_a_diverged_compiled_solve_is_refused():
    cell, x, h0 = cell_case(DenseGRU, "cpu")
    with torch.no_grad():
        cell.recurrent_map.weight.mul_(20)
    with pytest.raises(NewtonDivergenceError, match="did not converge"):
        newton_apply(cell, 3 * x, NewtonConfig(max_iters=2, scan_backend="newton"), h0=h0, compile=True)


class WrongShape(DiagonalCell):
    def step(self, h, x):
        return super().step(h, x)[..., :-1]


def test_bad_arguments_name_the_argument():
    cell, x, h0 = cell_case(DiagonalCell, "cpu", T=4)
    with pytest.raises(ValueError, match=r"argument 'x' has shape \[2, 3\], expected \[B, T, input\]"):
        newton_apply(cell, x[:, 0], compile=True)
    with pytest.raises(TypeError, match="argument 'x' has dtype torch.int64, expected a floating-point dtype"):
        newton_apply(cell, x.long(), compile=True)
    with pytest.raises(ValueError, match=r"argument 'h0' has shape \[2, 4\], expected \[2, 5\]"):
        newton_apply(cell, x, h0=h0[:, :4], compile=True)
    with pytest.raises(ValueError, match="argument 'compile' is 'yes'"):
        newton_apply(cell, x, compile="yes")
    with pytest.raises(ValueError, match=r"argument 'cell' \(a WrongShape\) returned shape \[4\] and dtype "
                                         r"torch.float64 from step\(h_prev, x\) on one row, expected h_prev's shape "
                                         r"\[5\]"):
        newton_apply(WrongShape(3, 5).double(), x, compile=True)
    with pytest.raises(ValueError, match="argument 'cfg' has scan_backend 'fused'.*on the general path"):
        newton_apply(cell, x, NewtonConfig(scan_backend="fused"), compile=False)
    with pytest.raises(ValueError, match="argument 'return_cell_state' is True for a cell of your own"):
        newton_apply(cell, x, return_cell_state=True, compile=True)


def test_a_second_eager_call_does_not_trace_the_step_again(monkeypatch):
    cell, x, h0 = cell_case(DiagonalCell, "cpu")
    first = newton_apply(cell, x, CONVERGED, h0=h0, compile=True)
    traces = []
    trace = _cell_codegen.trace
    monkeypatch.setattr(_cell_codegen, "trace", lambda *args: traces.append(args) or trace(*args))
    second = newton_apply(cell, x, CONVERGED, h0=h0, compile=True)
    assert traces == []
    assert torch.equal(first, second)
    with torch.no_grad():
        cell.decay.mul_(0.5)  # parameters are inputs of the trace: the same trace, new values
    third = newton_apply(cell, x, CONVERGED, h0=h0, compile=True)
    assert traces == []
    torch.testing.assert_close(third, cell_loop(cell, x, h0), rtol=0, atol=1e-12)


@pytest.mark.parametrize("structure", ["diag", "block2", "dense"])
def test_each_extern_piece_of_a_cuda_extension_is_defined_in_exactly_one_of_its_units(structure):
    """A CUDA build's extension (generated here without compiling) splits its solves into units:
    every piece the shared header and the work's unit declare extern, and nothing else, is
    explicitly instantiated by exactly one unit, so the link has each piece once; the operators'
    PyTorch half is a unit of its own for the C++ compiler, which includes no Kokkos header."""
    tags = _extension_build.build_settings().device_scan_kernels
    files = _compiled_cell._extension_sources("ns", "", structure, torch.float64, True, ".cu", tags)
    declared = [line.removeprefix("extern ") for text in (files["ns.hpp"], files["ns_work.cu"])
                for line in text.splitlines() if line.startswith("extern template")]
    defined = [line for name, text in files.items() if name not in ("ns.hpp", "ns_work.cu")
               for line in text.splitlines() if line.startswith("template ")]
    included = [line for line in files["ns.cpp"].splitlines() if line.startswith("#include")]
    assert included == ['#include "ns_work.hpp"', '#include "tensors.hpp"', "#include <ATen/ops/empty.h>",
                        "#include <ATen/ops/zeros.h>", "#include <torch/library.h>"]
    assert [line for line in files["ns_work.hpp"].splitlines() if line.startswith("#include")] == ['#include "work.hpp"']
    assert sorted(declared) == sorted(defined) and len(set(defined)) == len(defined)
    scan_kernels = [line for line in defined if "ScanKernel" in line]
    assert len(scan_kernels) == len(tags) * (2 if structure == "diag" else 3)  # each kernel of each scan
    quasi_forward = "forward_family<paraseq::CompiledNewtonModes::newton_quasi>"  # a diagonal cell's is its exact one
    assert sum(quasi_forward in line for line in defined) == (0 if structure == "diag" else 1)


def test_the_build_description_names_the_device_scan_kernels_of_cmakes_list():
    """A CUDA extension splits off the scan kernels that the library's instances do: CMake writes
    PARASEQ_ETI_DEVICE_SCAN_KERNELS into the build description, and a source tree without one reads
    that list from cmake/paraseqInstances.cmake."""
    tree = Path(_extension_build.__file__).resolve().parents[2]
    listed = _extension_build._instance_list(tree, "PARASEQ_ETI_DEVICE_SCAN_KERNELS")
    assert listed and _extension_build.build_settings().device_scan_kernels == tuple(listed)
