"""ParaGRU / ParaLSTM: Newton against float64 loops written here, gradients, compile, precision."""

import pytest
import torch

from conftest import assert_steps_reproduce_the_solve, graph_break_count
from paraseq import (NewtonConfig, NewtonDivergenceError, ParaGRU, ParaLSTM, compile_safe_config, newton_apply)


def gru_loop(cell, x, h0=None):
    """The GRU recurrence written out from the reference equations."""
    u = x @ cell.in_proj.weight.T + cell.in_proj.bias
    H = cell.hidden_size
    h = x.new_zeros((x.shape[0], H)) if h0 is None else h0
    out = []
    for t in range(x.shape[1]):
        z = torch.sigmoid(cell.recurrent[0] * h + u[:, t, :H])
        r = torch.sigmoid(cell.recurrent[1] * h + u[:, t, H:2 * H])
        c = torch.tanh(cell.recurrent[2] * h * r + u[:, t, 2 * H:])
        h = h + z * (c - h)
        out.append(h)
    return torch.stack(out, 1)


def lstm_loop(cell, x):
    u = x @ cell.in_proj.weight.T + cell.in_proj.bias
    H = cell.hidden_size
    (a_f, a_c, a_o), (p_f, p_o) = cell.recurrent, cell.peephole
    h = c = x.new_zeros((x.shape[0], H))
    hs, cs = [], []
    for t in range(x.shape[1]):
        f = torch.sigmoid(a_f * h + p_f * c + u[:, t, :H])
        c = f * c + (1 - f) * torch.tanh(a_c * h + u[:, t, H:2 * H])
        h = torch.sigmoid(a_o * h + p_o * c + u[:, t, 2 * H:]) * torch.tanh(c)
        hs.append(h)
        cs.append(c)
    return torch.stack(hs, 1), torch.stack(cs, 1)


BACKENDS = ["auto", "fused", "newton", "sequential", "one_pass"]


def op_config(**settings):
    """The operators' packed config (one float[] argument) of NewtonConfig(residual_fail=None, **settings)."""
    return NewtonConfig(**{"residual_fail": None, **settings})._operator_config(eager=True)


def small_inputs(cell, B=3, T=50):
    """x in the cell's dtype, on its device."""
    return torch.rand(B, T, cell.input_size, dtype=cell.recurrent.dtype, device=cell.recurrent.device) - 0.5


@pytest.mark.parametrize("backend", BACKENDS)
def test_gru_matches_the_loop_in_double(device, backend):
    cell = ParaGRU(5, 8, config=NewtonConfig(max_iters=4, scan_backend=backend)).to(device, torch.float64)
    x = small_inputs(cell)
    h0 = torch.rand(3, 8, dtype=torch.float64, device=device) - 0.5
    expected = gru_loop(cell, x, h0)
    assert (cell(x, h0) - expected).abs().max() <= 1e-10
    assert (cell.sequential(x, h0) - expected).abs().max() <= 1e-14


@pytest.mark.parametrize("backend", BACKENDS)
def test_lstm_matches_the_loop_in_double(device, backend):
    cell = ParaLSTM(5, 8, config=NewtonConfig(max_iters=5, scan_backend=backend)).to(device, torch.float64)
    x = small_inputs(cell)
    h_ref, c_ref = lstm_loop(cell, x)
    h, c = cell(x, return_cell_state=True)
    assert (h - h_ref).abs().max() <= 1e-10 and (c - c_ref).abs().max() <= 1e-10
    assert (cell.sequential(x) - h_ref).abs().max() <= 1e-14


@pytest.mark.parametrize("backend", BACKENDS)
def test_gradients_match_the_loop_in_double(device, backend):
    for cell in (ParaGRU(4, 6, config=NewtonConfig(max_iters=5, scan_backend=backend)).to(device, torch.float64),
                 ParaLSTM(4, 6, config=NewtonConfig(max_iters=6, scan_backend=backend)).to(device, torch.float64)):
        x = small_inputs(cell, B=2, T=20).requires_grad_()
        weight = torch.randn(2, 20, 6, dtype=torch.float64, device=device)
        loop = gru_loop if isinstance(cell, ParaGRU) else (lambda cell, x: lstm_loop(cell, x)[0])
        inputs = [x] + list(cell.parameters())
        got = torch.autograd.grad((cell(x) * weight).sum(), inputs)
        expected = torch.autograd.grad((loop(cell, x) * weight).sum(), inputs)
        for g, e in zip(got, expected):
            assert torch.allclose(g, e, rtol=1e-8, atol=1e-10)


def test_gradcheck_ops_in_double(device):
    u = (torch.rand(2, 7, 9, dtype=torch.float64, device=device) - 0.5).requires_grad_()
    a = (torch.rand(3, 3, dtype=torch.float64, device=device) - 0.5).requires_grad_()
    h0 = (torch.rand(2, 3, dtype=torch.float64, device=device) - 0.5).requires_grad_()
    gru = lambda u, a, h0: torch.ops.paraseq.para_gru(u, a, h0, op_config(max_iters=8, scan_backend="newton"), False)[0]
    assert torch.autograd.gradcheck(gru, (u, a, h0))
    p = (torch.rand(2, 3, dtype=torch.float64, device=device) - 0.5).requires_grad_()
    s0 = (torch.rand(2, 6, dtype=torch.float64, device=device) - 0.5).requires_grad_()
    lstm = lambda u, a, p, s0: torch.ops.paraseq.para_lstm(u, a, p, s0, op_config(max_iters=8, scan_backend="fused"),
                                                           False)[0]
    assert torch.autograd.gradcheck(lstm, (u, a, p, s0))


def test_opcheck(device):
    u = (torch.rand(2, 7, 9, device=device) - 0.5).requires_grad_()
    a = (torch.rand(3, 3, device=device) - 0.5).requires_grad_()
    p = (torch.rand(2, 3, device=device) - 0.5).requires_grad_()
    h0 = torch.rand(2, 3, device=device)
    torch.library.opcheck(torch.ops.paraseq.para_gru, (u, a, h0, op_config(), True))
    torch.library.opcheck(torch.ops.paraseq.para_lstm, (u, a, p, None, op_config(), False))
    # The stats output and the fused mode's early exit.
    early_fused = op_config(max_iters=20, residual_atol=1e-5, scan_backend="fused")
    torch.library.opcheck(torch.ops.paraseq.para_gru, (u, a, h0, early_fused, True))
    torch.library.opcheck(torch.ops.paraseq.para_lstm, (u, a, p, None, early_fused, True))
    h = torch.ops.paraseq.para_gru(u, a, h0, op_config(), False)[0].detach()
    torch.library.opcheck(torch.ops.paraseq.para_gru_backward, (u.detach(), a.detach(), h0, h, torch.randn_like(h)))
    state = torch.ops.paraseq.para_lstm(u, a, p, None, op_config(), False)[0].detach()
    torch.library.opcheck(torch.ops.paraseq.para_lstm_backward,
                          (u.detach(), a.detach(), p.detach(), None, state, torch.randn_like(state)))


def test_seed_example_compiles_without_graph_breaks_and_equals_eager(device):
    cell = ParaGRU(32, 64).to(device, torch.bfloat16)
    x = torch.randn(2, 128, 32, dtype=torch.bfloat16, device=device)
    cfg = compile_safe_config(scan_backend="auto")
    step = lambda z: newton_apply(cell, z, cfg)
    assert graph_break_count(step, x) == 0
    compiled = torch.compile(step, fullgraph=True)
    y = compiled(x)
    y.float().sum().backward()
    compiled_grads = [p.grad.clone() for p in cell.parameters()]
    cell.zero_grad()
    y_eager = step(x)
    y_eager.float().sum().backward()
    assert y.dtype == torch.bfloat16 and torch.equal(y, y_eager)
    for compiled_grad, p in zip(compiled_grads, cell.parameters()):
        assert torch.equal(compiled_grad, p.grad)


def test_forward_and_backward_compile_for_lstm(device):
    cell = ParaLSTM(4, 8).to(device)
    x = torch.randn(2, 30, 4, device=device, requires_grad=True)
    loss = lambda z: newton_apply(cell, z, compile_safe_config()).square().sum()
    assert graph_break_count(loss, x) == 0
    compiled = torch.compile(loss, fullgraph=True)
    assert torch.equal(torch.autograd.grad(compiled(x), x)[0], torch.autograd.grad(loss(x), x)[0])


@pytest.mark.parametrize("dtype,tolerance", [(torch.bfloat16, 3e-2), (torch.float16, 4e-3)])
def test_half_precision_agrees_with_the_float32_loop(device, dtype, tolerance):
    cell = ParaGRU(16, 32).to(device)
    x = torch.randn(2, 200, 16, device=device)
    expected = cell.sequential(x)
    half = ParaGRU(16, 32).to(device, dtype)
    half.load_state_dict(cell.state_dict())
    got = half(x.to(dtype))
    assert got.dtype == dtype
    assert (got.float() - expected).abs().max() <= tolerance


def test_autocast_leaves_the_solve_in_the_module_dtype(device):
    cell = ParaGRU(8, 16).to(device)
    x = torch.randn(2, 20, 8, device=device)
    with torch.autocast(device, dtype=torch.bfloat16):
        inside = cell(x)
        bf16_input = cell(x.bfloat16())  # converted to the module's dtype
    assert inside.dtype == torch.float32 and torch.equal(inside, cell(x))
    assert bf16_input.dtype == torch.float32


def test_grad_scaler_step(device):
    cell = ParaGRU(8, 16).to(device)
    optimizer = torch.optim.SGD(cell.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler(device, init_scale=1024.0)
    x, target = torch.randn(2, 20, 8, device=device), torch.randn(2, 20, 16, device=device)
    before = cell.recurrent.detach().clone()
    loss = (cell(x) - target).square().mean()
    scaler.scale(loss).backward()
    expected_grad = torch.autograd.grad((cell(x) - target).square().mean(), cell.recurrent)[0]
    assert torch.allclose(cell.recurrent.grad, 1024.0 * expected_grad, rtol=1e-5)
    scaler.step(optimizer)
    scaler.update()
    assert torch.allclose(cell.recurrent, before - 0.1 * expected_grad, rtol=1e-5, atol=1e-7)


def test_residual_checks_and_stats(device):
    cell = ParaGRU(4, 6).to(device, torch.float64)
    x = small_inputs(cell)
    h, stats = newton_apply(cell, x, NewtonConfig(max_iters=4, scan_backend="newton"), return_stats=True)
    assert stats.residual.shape == (3,) and stats.residual.max() <= 1e-10
    with pytest.raises(NewtonDivergenceError, match="did not converge"):
        newton_apply(cell, 20 * x, NewtonConfig(max_iters=1, residual_fail=1e-12, scan_backend="newton"))
    early = newton_apply(cell, x, NewtonConfig(max_iters=50, residual_atol=1e-12, scan_backend="newton"))
    assert (early - gru_loop(cell, x)).abs().max() <= 1e-10


def test_errors_name_the_argument(device):
    cell = ParaGRU(4, 6).to(device)
    with pytest.raises(ValueError, match="argument 'x' has shape"):
        cell(torch.randn(2, 5, 3, device=device))
    with pytest.raises(ValueError, match="argument 'scan_backend'"):
        NewtonConfig(scan_backend="gpu")
    u, a = torch.randn(2, 5, 18, device=device), torch.randn(3, 6, device=device)
    with pytest.raises(ValueError, match="argument 'u' has shape"):
        torch.ops.paraseq.para_gru(u[..., :-1], a, None, op_config(), False)
    with pytest.raises(TypeError, match="argument 'a' has dtype Double"):
        torch.ops.paraseq.para_gru(u, a.double(), None, op_config(), False)
    with pytest.raises(ValueError, match="argument 'h0' has shape"):
        torch.ops.paraseq.para_gru(u, a, torch.zeros(2, 5, device=device), op_config(), False)
    with pytest.raises(ValueError, match=r"argument 'config' has entry 2 \(omega\) = 1.5, expected 0 < omega <= 1"):
        torch.ops.paraseq.para_gru(u, a, None, [2, 3, 1.5, -1, -1, 0, 0, 0, 0], False)


# ---- second derivatives ---------------------------------------------------------------------------

def newton_operators(device):
    """(name, fn, inputs) of both Newton operators in double, every tensor requiring grad."""
    rand = lambda *shape: (torch.rand(*shape, dtype=torch.float64, device=device) - 0.5).requires_grad_()
    u, a, p, h0, s0 = rand(2, 5, 9), rand(3, 3), rand(2, 3), rand(2, 3), rand(2, 6)
    gru = lambda u, a, h0: torch.ops.paraseq.para_gru(u, a, h0, op_config(max_iters=8, scan_backend="newton"), False)[0]
    lstm = lambda u, a, p, s0: torch.ops.paraseq.para_lstm(u, a, p, s0, op_config(max_iters=8, scan_backend="newton"),
                                                           False)[0]
    return [("para_gru", gru, (u, a, h0)), ("para_lstm", lstm, (u, a, p, s0))]


def test_second_derivatives_raise_instead_of_being_zero(device):
    for name, fn, inputs in newton_operators(device):
        with pytest.raises(NotImplementedError, match=f"paraseq::{name}_backward is not differentiable"):
            torch.autograd.gradgradcheck(fn, inputs)


def test_create_graph_keeps_exact_first_derivatives(device):
    """A gradient penalty's first step: create_graph=True gives the plain gradient, and only
    differentiating that gradient raises."""
    cell = ParaGRU(3, 4, config=NewtonConfig(max_iters=6)).to(device, torch.float64)
    x = small_inputs(cell, B=2, T=10).requires_grad_()
    plain, = torch.autograd.grad(cell(x).square().sum(), x)
    graph, = torch.autograd.grad(cell(x).square().sum(), x, create_graph=True)
    assert torch.equal(plain, graph.detach()) and graph.requires_grad
    with pytest.raises(NotImplementedError, match="second derivatives of paraseq::para_gru"):
        graph.square().sum().backward()


# ---- AMP ------------------------------------------------------------------------------------------

def cpu_autocast_dtypes():
    dtypes = [torch.bfloat16]
    try:
        with torch.autocast("cpu", dtype=torch.float16):
            dtypes.append(torch.float16)
    except (RuntimeError, AssertionError):  # torch builds whose CPU autocast has no float16
        pass
    return dtypes


@pytest.mark.parametrize("dtype", cpu_autocast_dtypes())
@pytest.mark.parametrize("module", [ParaGRU, ParaLSTM])
def test_gradients_inside_autocast_equal_float32_gradients(device, module, dtype):
    """pararnn's test_autocast pattern: forward and backward inside autocast, a float32 module."""
    cell = module(8, 16).to(device)
    x = torch.randn(2, 20, 8, device=device, requires_grad=True)
    weight = torch.randn(2, 20, 16, device=device)

    def gradients():
        return torch.autograd.grad((cell(x) * weight).sum(), [x, *cell.parameters()])
    expected = gradients()
    with torch.autocast(device, dtype=dtype):
        inside = gradients()
    for got, want in zip(inside, expected):
        assert got.dtype == torch.float32
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


# ---- configuration names --------------------------------------------------------------------------

def test_compile_safe_config_takes_the_iteration_count_first_as_in_cpp():
    assert compile_safe_config(5) == NewtonConfig(max_iters=5, residual_fail=None)
    assert compile_safe_config().max_iters == 3 and compile_safe_config(scan_backend="fused").scan_backend == "fused"
    with pytest.raises(TypeError, match="compile_safe_config: argument 'max_iters' is 'auto'.*scan_backend='auto'"):
        compile_safe_config("auto")


def test_mode_names_are_the_cpp_ones_and_the_former_ones_still_work(device):
    assert NewtonConfig(scan_backend="scan").scan_backend == "newton"
    assert NewtonConfig(scan_backend="automatic").scan_backend == "auto"
    u, a = torch.rand(2, 6, 9, device=device) - 0.5, torch.rand(3, 3, device=device) - 0.5
    solve = lambda name: torch.ops.paraseq.para_gru(u, a, None, op_config(scan_backend=name), False)[0]
    assert torch.equal(solve("newton"), solve("scan")) and torch.equal(solve("auto"), solve("automatic"))
    with pytest.raises(ValueError, match="NewtonConfig: argument 'scan_backend' is 'gpu', expected one of 'auto', "
                                         "'newton', 'fused', 'sequential'"):
        solve("gpu")


# ---- divergence -----------------------------------------------------------------------------------

def stiff_gru(device):
    """Recurrent weights of +-50: three Newton iterations from the default guess diverge (in the
    newton mode; the automatic one may choose the exact sequential loop)."""
    cell = ParaGRU(4, 8, config=NewtonConfig(scan_backend="newton")).to(device)
    with torch.no_grad():
        cell.recurrent.copy_(50 * torch.randn(3, 8).sign())
    return cell, torch.randn(4, 64, 4, device=device)


def gru_residual(cell, x, h):
    """max over t and channels of |h_t - f(h_{t-1}, x_t)| per batch element (h_{-1} = 0), from the
    reference equations."""
    u = x @ cell.in_proj.weight.T + cell.in_proj.bias
    H = cell.hidden_size
    previous = torch.cat([torch.zeros_like(h[:, :1]), h[:, :-1]], 1)
    z = torch.sigmoid(cell.recurrent[0] * previous + u[..., :H])
    r = torch.sigmoid(cell.recurrent[1] * previous + u[..., H:2 * H])
    c = torch.tanh(cell.recurrent[2] * previous * r + u[..., 2 * H:])
    return (h - (previous + z * (c - previous))).abs().flatten(1).amax(1)


def lstm_residual(cell, x, h, c):
    """The same for ParaLSTM's state (h, c) (h_{-1} = c_{-1} = 0)."""
    u = x @ cell.in_proj.weight.T + cell.in_proj.bias
    H = cell.hidden_size
    (a_f, a_c, a_o), (p_f, p_o) = cell.recurrent, cell.peephole
    h_prev, c_prev = (torch.cat([torch.zeros_like(v[:, :1]), v[:, :-1]], 1) for v in (h, c))
    f = torch.sigmoid(a_f * h_prev + p_f * c_prev + u[..., :H])
    c_step = f * c_prev + (1 - f) * torch.tanh(a_c * h_prev + u[..., H:2 * H])
    h_step = torch.sigmoid(a_o * h_prev + p_o * c_step + u[..., 2 * H:]) * torch.tanh(c_step)
    return torch.maximum((h - h_step).abs().flatten(1).amax(1), (c - c_step).abs().flatten(1).amax(1))


def solved_with_stats(cell, x, config):
    """(h, the residual of h from the reference equations, NewtonStats) of newton_apply."""
    if isinstance(cell, ParaGRU):
        h, stats = newton_apply(cell, x, config, return_stats=True)
        return h, gru_residual(cell, x, h), stats
    (h, c), stats = newton_apply(cell, x, config, return_stats=True, return_cell_state=True)
    return h, lstm_residual(cell, x, h, c), stats


CELLS = {"ParaGRU": lambda: ParaGRU(4, 6), "ParaLSTM": lambda: ParaLSTM(4, 6)}


@pytest.mark.parametrize("cell_name", CELLS)
@pytest.mark.parametrize("backend", ["fused", "newton", "sequential", "one_pass"])
def test_stats_report_the_iterations_and_the_mode_that_ran(device, cell_name, backend):
    cell = CELLS[cell_name]().to(device, torch.float64)
    x = small_inputs(cell)
    h, residual, stats = solved_with_stats(cell, x, NewtonConfig(max_iters=5, residual_fail=None,
                                                                 scan_backend=backend))
    assert stats.backend == backend
    assert type(stats.iterations) is int and stats.iterations == (0 if backend == "sequential" else 5)
    assert torch.allclose(stats.residual, residual, rtol=0, atol=1e-14)
    # "auto" reports the mode it chose (devices may pick the one-pass mode), which reproduces its
    # result bitwise.
    auto_h, _, auto_stats = solved_with_stats(cell, x, NewtonConfig(max_iters=5, residual_fail=None))
    assert auto_stats.backend in ("fused", "newton", "sequential") + (("one_pass",) if device == "cuda" else ())
    chosen_h, _, _ = solved_with_stats(cell, x, NewtonConfig(max_iters=5, residual_fail=None,
                                                             scan_backend=auto_stats.backend))
    assert torch.equal(auto_h, chosen_h)


@pytest.mark.parametrize("cell_name", CELLS)
@pytest.mark.parametrize("backend", ["fused", "newton"])
def test_residual_atol_stops_early_and_the_result_is_within_it(device, cell_name, backend):
    """The fused mode stops each window on the device, the newton mode the whole sequence after a
    host read: either way fewer iterations than max_iters, a result whose residual (from the
    reference equations) is within atol and that matches the float64 loop; bitwise repeatable."""
    cell = CELLS[cell_name]().to(device, torch.float64)
    x = small_inputs(cell)
    expected = gru_loop(cell, x) if isinstance(cell, ParaGRU) else lstm_loop(cell, x)[0]
    fixed = NewtonConfig(max_iters=30, residual_fail=None, scan_backend=backend)
    _, _, fixed_stats = solved_with_stats(cell, x, fixed)
    assert fixed_stats.iterations == 30
    early = NewtonConfig(max_iters=30, residual_atol=1e-10, residual_fail=None, scan_backend=backend)
    h, residual, stats = solved_with_stats(cell, x, early)
    assert stats.backend == backend and 1 <= stats.iterations < 30
    assert residual.max() <= 1e-10 and stats.residual.max() <= 1e-10
    assert (h - expected).abs().max() <= 1e-9
    again, _, again_stats = solved_with_stats(cell, x, early)
    assert torch.equal(again, h) and again_stats.iterations == stats.iterations
    # A looser atol stops no later.
    _, _, loose_stats = solved_with_stats(cell, x, NewtonConfig(max_iters=30, residual_atol=1e-3, residual_fail=None,
                                                                scan_backend=backend))
    assert loose_stats.iterations <= stats.iterations


def test_compiled_stats_are_tensors_and_residual_atol_runs_the_fixed_iterations(device):
    """Under torch.compile (fullgraph, no graph break) the stats are int64 tensors of the graph, and
    residual_atol's early stop is skipped: the compiled solve runs max_iters, as compile_safe_config."""
    cell = ParaGRU(4, 6).to(device, torch.float64)
    x = small_inputs(cell)
    config = NewtonConfig(max_iters=7, residual_atol=1e-3, residual_fail=None, scan_backend="fused")
    solve = lambda z: newton_apply(cell, z, config, return_stats=True)
    assert graph_break_count(solve, x) == 0
    h, stats = torch.compile(solve, fullgraph=True)(x)
    assert stats.iterations.dtype == torch.int64 and int(stats.iterations) == 7
    assert stats.backend.dtype == torch.int64 and int(stats.backend) == 2  # "fused" in ("auto", "newton", "fused", ...)
    fixed_h, fixed_stats = newton_apply(cell, x, NewtonConfig(max_iters=7, residual_fail=None, scan_backend="fused"),
                                        return_stats=True)
    assert torch.equal(h, fixed_h) and torch.equal(stats.residual, fixed_stats.residual)
    _, eager_stats = solve(x)
    assert eager_stats.iterations < 7 and eager_stats.backend == "fused"


def test_a_diverged_solve_is_refused_by_default(device):
    cell, x = stiff_gru(device)
    with pytest.raises(NewtonDivergenceError, match="did not converge") as raised:
        cell(x)
    assert raised.value.residual.shape == (4,) and raised.value.residual.dtype == torch.float64
    assert raised.value.residual_fail == NewtonConfig().residual_fail
    assert not (raised.value.residual <= NewtonConfig().residual_fail).all()
    # Opted out, the unchecked result comes back, with the residual that would have refused it.
    h, stats = newton_apply(cell, x, NewtonConfig(residual_fail=None, scan_backend="newton"), return_stats=True)
    assert torch.equal(stats.residual, raised.value.residual) and h.abs().max() > 1


def test_a_nan_input_is_refused_by_default(device):
    cell = ParaGRU(4, 8).to(device)
    x = torch.randn(2, 16, 4, device=device)
    x[1, 5, 0] = float("nan")
    with pytest.raises(NewtonDivergenceError, match=r"max \|F\| = (inf|nan).*batch elements \[1\]") as raised:
        cell(x)
    assert raised.value.residual[0] <= 1e-5 and not raised.value.residual[1].isfinite()


def test_compiled_solves_keep_their_fixed_iterations_and_report_the_residual(device):
    cell, x = stiff_gru(device)
    step = torch.compile(lambda z: newton_apply(cell, z, return_stats=True), fullgraph=True)
    h, stats = step(x)
    eager, eager_stats = newton_apply(cell, x, NewtonConfig(residual_fail=None, scan_backend="newton"),
                                      return_stats=True)
    assert torch.equal(h, eager) and torch.equal(stats.residual, eager_stats.residual)
    assert stats.residual.max() > NewtonConfig().residual_fail


# ---- bad input ------------------------------------------------------------------------------------

class NotACell(torch.nn.Module):
    pass


def test_python_api_errors_name_the_argument(device):
    gru, lstm = ParaGRU(4, 6).to(device), ParaLSTM(4, 6).to(device)
    x = torch.randn(2, 5, 4, device=device)
    cases = [
        (lambda: newton_apply(NotACell(), x), TypeError, "argument 'cell' is a .*NotACell, expected a paraseq.ParaGRU"),
        (lambda: newton_apply(torch.nn.GRU(4, 6), x), TypeError, "argument 'cell' is a torch.nn.modules.rnn.GRU"),
        (lambda: newton_apply(gru, None), TypeError, "argument 'x' is a NoneType, expected a tensor"),
        (lambda: gru(x.to(torch.complex64)), TypeError, "argument 'x' has dtype torch.complex64, expected a float"),
        (lambda: gru(x.long()), TypeError, "argument 'x' has dtype torch.int64"),
        (lambda: gru(x, torch.zeros(2, 5, device=device)), ValueError, r"argument 'h0' has shape \[2, 5\], expected \[2, 6\]"),
        (lambda: gru(x, torch.zeros(2, 6, device=device, dtype=torch.float64)), TypeError,
         "argument 'h0' has dtype torch.float64, expected torch.float32"),
        (lambda: lstm(x, torch.zeros(2, 6, device=device)), TypeError, "argument 'h0' is a Tensor, expected a pair"),
        (lambda: lstm(x, (torch.zeros(2, 6, device=device), torch.zeros(2, 5, device=device))), ValueError,
         r"argument 'h0\[1\] \(c0\)' has shape \[2, 5\]"),
        (lambda: newton_apply(gru, x, return_cell_state=True), ValueError, "argument 'return_cell_state'"),
        (lambda: newton_apply(gru, x, "newton"), TypeError, "argument 'cfg' is a str"),
        (lambda: ParaGRU(3, 0), ValueError, "ParaGRU: argument 'hidden_size' is 0, expected an int >= 1"),
        (lambda: ParaLSTM(0, 3), ValueError, "ParaLSTM: argument 'input_size' is 0"),
        (lambda: ParaGRU(3, 2.5), TypeError, "argument 'hidden_size' is 2.5"),
    ]
    for call, error, message in cases:
        with pytest.raises(error, match=message):
            call()


def test_wrong_parameter_shapes_are_named(device):
    gru = ParaGRU(4, 6).to(device)
    x = torch.randn(2, 5, 4, device=device)
    gru.recurrent = torch.nn.Parameter(torch.zeros(3, 5, device=device))
    with pytest.raises(ValueError, match=r"argument 'cell' has recurrent of shape \[3, 5\], expected \[3, 6\]"):
        gru(x)
    gru = ParaGRU(4, 6).to(device)
    gru.in_proj = torch.nn.Linear(4, 17).to(device)
    with pytest.raises(ValueError, match=r"argument 'cell' has in_proj.weight of shape \[17, 4\], expected \[18, 4\]"):
        gru(x)


def test_operator_errors_use_the_operators_argument_names(device):
    u, a, p = torch.randn(2, 5, 18, device=device), torch.randn(3, 6, device=device), torch.randn(2, 6, device=device)
    settings = (op_config(), False)
    gru, lstm = torch.ops.paraseq.para_gru, torch.ops.paraseq.para_lstm
    state = torch.zeros(2, 5, 12, device=device)
    cases = [
        (lambda: gru(u, a[:, :5], None, *settings), r"para_gru: argument 'u' has shape \[2, 5, 18\], expected "
                                                    r"\[B, T, 3H\] = \[B, T, 15\] \(H = 5 from argument 'a'\)"),
        (lambda: gru(u, a[:2], None, *settings), r"argument 'a' has shape \[2, 6\], expected \[3, H\]"),
        (lambda: lstm(u, a, p, torch.zeros(2, 6, device=device), *settings),
         r"para_lstm: argument 'state0' has shape \[2, 6\], expected \[B, 2H \(channels \(c, h\) interleaved\)\] = \[2, 12\]"),
        (lambda: lstm(u, a, p[:, :5], None, *settings), r"argument 'p' has shape \[2, 5\], expected \[2, H\] = \[2, 6\]"),
        (lambda: torch.ops.paraseq.para_gru_backward(u, a, None, state[..., :6], state[:, :4, :6]),
         r"para_gru_backward: argument 'grad_h' has shape \[2, 4, 6\]"),
        (lambda: torch.ops.paraseq.para_gru_backward(u, a, None, state, state[..., :6]),
         r"para_gru_backward: argument 'h' has shape \[2, 5, 12\]"),
        (lambda: torch.ops.paraseq.para_lstm_backward(u, a, p, None, state[..., :6], state),
         r"para_lstm_backward: argument 'state' has shape \[2, 5, 6\]"),
        (lambda: torch.ops.paraseq.para_lstm_backward(u, a, p, None, state, state[:1]),
         r"para_lstm_backward: argument 'grad_state' has shape \[1, 5, 12\]"),
    ]
    for call, message in cases:
        with pytest.raises(ValueError, match=message):
            call()


# ---- integer ranges -------------------------------------------------------------------------------

@pytest.mark.parametrize("value", [2 ** 31, 2 ** 32, -1])
def test_counts_that_do_not_fit_are_refused(device, value):
    for name in ("max_iters", "picard_iters"):
        with pytest.raises(ValueError, match=f"NewtonConfig: argument '{name}' is {value}, expected an int"):
            NewtonConfig(**{name: value})
    u, a = torch.randn(2, 5, 18, device=device), torch.randn(3, 6, device=device)
    with pytest.raises(ValueError, match=f"para_gru: argument 'config' has entry 1 \\(max_iters\\) = {value}, "
                                         r"expected an integer with 0 <= value <= 2147483647"):
        torch.ops.paraseq.para_gru(u, a, None, [2, value, 1.0, -1, -1, 0, 0, 1, 0], False)
    with pytest.raises(ValueError, match=f"para_lstm: argument 'config' has entry 5 \\(picard_iters\\) = {value}"):
        torch.ops.paraseq.para_lstm(u, a, a[:2], None, [2, 3, 1.0, -1, -1, value, 0, 1, 0], False)


def test_other_settings_are_checked():
    for kwargs, error, message in [(dict(omega=0.0), ValueError, "argument 'omega' is 0.0"),
                                   (dict(residual_fail=float("nan")), ValueError, "argument 'residual_fail' is nan"),
                                   (dict(residual_atol=-1.0), ValueError, "argument 'residual_atol' is -1.0"),
                                   (dict(max_iters=True), TypeError, "argument 'max_iters' is True"),
                                   (dict(picard_adapt=1), TypeError, "argument 'picard_adapt' is 1")]:
        with pytest.raises(error, match=message):
            NewtonConfig(**kwargs)


def test_one_pass_refuses_what_its_kernel_does_not_run():
    for settings in ({"picard_iters": 1}, {"picard_adapt": True}, {"residual_atol": 1e-8}):
        with pytest.raises(ValueError, match=r"NewtonConfig: argument 'scan_backend' is 'one_pass' with picard_iters, "
                                             r"picard_adapt or residual_atol set, expected none of them"):
            NewtonConfig(scan_backend="one_pass", **settings)
    with pytest.raises(ValueError, match=r"argument 'jacobian' is 'quasi' with scan_backend 'one_pass', expected "
                                         r"jacobian 'exact' for the one_pass mode"):
        NewtonConfig(jacobian="quasi", scan_backend="one_pass")


def test_the_config_reaches_the_operators_as_one_list_in_the_documented_layout():
    """Layout version 2 of src/adapters/torch/newton_ops.hpp, written out here: [version, max_iters,
    omega, residual_atol, residual_fail, picard_iters, picard_adapt, scan_backend, jacobian], None
    as -1."""
    config = NewtonConfig(max_iters=7, omega=0.5, residual_atol=1e-6, residual_fail=1e-2, picard_iters=2,
                          picard_adapt=True, scan_backend="sequential")
    assert config._operator_config(eager=True) == [2, 7, 0.5, 1e-6, 1e-2, 2, 1, 3, 0]
    # Compiled: the settings that read the residual on the host are dropped.
    assert config._operator_config(eager=False) == [2, 7, 0.5, -1, -1, 2, 0, 3, 0]
    # Without picard_adapt the threshold is newton_apply's check, not the solver's.
    assert NewtonConfig(scan_backend="scan")._operator_config(eager=True) == [2, 3, 1.0, -1, -1, 0, 0, 1, 0]
    assert NewtonConfig(jacobian="quasi")._operator_config(eager=False) == [2, 3, 1.0, -1, -1, 0, 0, 0, 1]


@pytest.mark.parametrize("config, message", [
    ([2, 3, 1.0, -1, -1, 0, 0, 0], r"8 entries, expected 9 \(paraseq.NewtonConfig layout version 2"),
    ([1, 3, 1.0, -1, -1, 0, 0, 0, 0], r"layout version 1, expected 2"),
    ([2, 2.5, 1.0, -1, -1, 0, 0, 0, 0], r"entry 1 \(max_iters\) = 2.5, expected an integer"),
    ([2, 3, 0.0, -1, -1, 0, 0, 0, 0], r"entry 2 \(omega\) = 0, expected 0 < omega <= 1"),
    ([2, 3, 1.0, -0.5, -1, 0, 0, 0, 0], r"entry 3 \(residual_atol\) = -0.5, expected -1 \(None\) or a number >= 0"),
    ([2, 3, 1.0, -1, float("nan"), 0, 0, 0, 0], r"entry 4 \(residual_fail\) = nan, expected -1 \(None\)"),
    ([2, 3, 1.0, -1, -1, 0, 2, 0, 0], r"entry 6 \(picard_adapt\) = 2, expected 0 \(False\) or 1 \(True\)"),
    ([2, 3, 1.0, -1, -1, 0, 0, 5, 0], r'entry 7 \(scan_backend\) = 5, expected 0 \("auto"\), 1 \("newton"\)'),
    ([2, 3, 1.0, -1, -1, 0, 0, 0, 0.5], r'entry 8 \(jacobian\) = 0.5, expected 0 \("exact"\) or 1 \("quasi"\)'),
])
def test_a_malformed_packed_config_is_refused_naming_the_field(device, config, message):
    u, a = torch.randn(2, 5, 18, device=device), torch.randn(3, 6, device=device)
    with pytest.raises(ValueError, match="para_gru: argument 'config' has " + message):
        torch.ops.paraseq.para_gru(u, a, None, config, False)
    with pytest.raises(ValueError, match="para_lstm: argument 'config' has " + message):
        torch.ops.paraseq.para_lstm(u, a, a[:2], None, config, False)


def test_every_packed_setting_changes_the_solve(device):
    """Each field of the list reaches the C++ solver: against the float64 loop, one iteration of
    plain Newton is inexact, the sequential mode (scan_backend 3) is exact, damping (omega) and
    Picard sweeps move the one-iteration result, residual_atol stops a long solve early, and the
    quasi Jacobian (jacobian 1) moves a ParaLSTM's one-iteration result (ParaGRU's Jacobian is
    diagonal: its quasi Jacobian is the exact one)."""
    cell = ParaGRU(4, 6).to(device, torch.float64)
    x = 3 * small_inputs(cell)
    u = x @ cell.in_proj.weight.T + cell.in_proj.bias
    exact = gru_loop(cell, x)
    solve = lambda config: torch.ops.paraseq.para_gru(u, cell.recurrent, None, config, True)
    one, one_residual, _ = solve([2, 1, 1.0, -1, -1, 0, 0, 1, 0])
    assert (one - exact).abs().max() > 1e-6 and one_residual.max() > 1e-6
    assert (solve([2, 1, 1.0, -1, -1, 0, 0, 3, 0])[0] - exact).abs().max() <= 1e-12
    assert not torch.equal(solve([2, 1, 0.5, -1, -1, 0, 0, 1, 0])[0], one)
    assert not torch.equal(solve([2, 1, 1.0, -1, -1, 2, 0, 1, 0])[0], one)
    many = solve([2, 40, 1.0, -1, -1, 0, 0, 1, 0])[0]
    early = solve([2, 40, 1.0, 1e-4, -1, 0, 0, 1, 0])[0]
    assert (many - exact).abs().max() <= 1e-12 and not torch.equal(early, many)
    assert torch.equal(solve([2, 1, 1.0, -1, -1, 0, 0, 1, 1])[0], one)
    lstm = ParaLSTM(4, 6).to(device, torch.float64)
    u = x @ lstm.in_proj.weight.T + lstm.in_proj.bias
    solve = lambda config: torch.ops.paraseq.para_lstm(u, 2 * lstm.recurrent, lstm.peephole, None, config, False)[0]
    assert not torch.equal(solve([2, 1, 1.0, -1, -1, 0, 0, 1, 1]), solve([2, 1, 1.0, -1, -1, 0, 0, 1, 0]))


def test_the_operator_reports_a_divergence_as_data_or_raises_without_the_residual(device):
    cell, x = stiff_gru(device)
    u = (x @ cell.in_proj.weight.T + cell.in_proj.bias).detach()
    config = [2, 3, 1.0, -1, 1e-3, 0, 0, 1, 0]  # residual_fail 1e-3 in the solver
    h, residual, _ = torch.ops.paraseq.para_gru(u, cell.recurrent.detach(), None, config, True)
    assert residual.shape == (4,) and residual.max() > 1e-3
    with pytest.raises(RuntimeError, match=r"para_gru: .*did not converge.*\(NewtonDivergenceError\)"):
        torch.ops.paraseq.para_gru(u, cell.recurrent.detach(), None, config, False)


@pytest.mark.parametrize("picard_adapt", [False, True])
def test_a_divergence_raises_paraseqs_own_type_with_its_attributes(device, picard_adapt):
    """Also after picard_adapt's retries (the C++ solver's own check): raised by type, with the
    residual of the failed result. A NaN in batch element 1 defeats every retry; element 0 converges."""
    cell = ParaGRU(4, 8).to(device)
    x = torch.randn(2, 16, 4, device=device)
    x[1, 5, 0] = float("nan")
    config = NewtonConfig(max_iters=4, scan_backend="newton", picard_adapt=picard_adapt)
    with pytest.raises(NewtonDivergenceError) as raised:
        newton_apply(cell, x, config)
    error = raised.value
    assert type(error) is NewtonDivergenceError and isinstance(error, RuntimeError)
    assert error.residual_fail == 1e-3 and error.iterations == 4
    assert error.residual.shape == (2,) and error.residual.dtype == torch.float64
    assert error.residual[0] <= 1e-5 and not error.residual[1].isfinite()


def test_sizes_of_2_31_are_refused_before_any_copy(device):
    u = torch.zeros(1, 1, 3, device=device).expand(1, 2 ** 31, 3)  # no memory behind the steps
    with pytest.raises(ValueError, match=r"argument 'u' has shape \[1, 2147483648, 3\], expected every dimension "
                                         r"at most 2147483647") as raised:
        torch.ops.paraseq.para_gru(u, torch.zeros(3, 1, device=device), None, op_config(), False)
    assert "-2147483648" not in str(raised.value)


# ---- opcheck on strided inputs --------------------------------------------------------------------

def strided(tensor, layout):
    """tensor's values in a transposed (non-contiguous) or an expanded (stride 0 along dim 0) layout."""
    if layout == "transposed":
        return tensor.transpose(0, -1).contiguous().transpose(0, -1)
    return tensor[:1].expand(tensor.shape)


@pytest.mark.parametrize("layout", ["transposed", "expanded"])
def test_opcheck_on_strided_inputs(device, layout):
    """The fake kernels' outputs have the kernels' (contiguous) strides whatever the inputs' layout.
    The backward operators get inputs without grad: they are not differentiable."""
    rand = lambda *shape, grad=False: strided((torch.rand(*shape, device=device) - 0.5).requires_grad_(grad), layout)
    u, a, p, h0, s0 = rand(2, 7, 9), rand(3, 3), rand(2, 3), rand(2, 3), rand(2, 6)
    settings = (op_config(), True)
    torch.library.opcheck(torch.ops.paraseq.para_gru, (rand(2, 7, 9, grad=True), rand(3, 3, grad=True), h0, *settings))
    torch.library.opcheck(torch.ops.paraseq.para_lstm, (u, rand(3, 3, grad=True), rand(2, 3, grad=True), s0, *settings))
    h = torch.ops.paraseq.para_gru(u, a, h0, *settings)[0]
    state = torch.ops.paraseq.para_lstm(u, a, p, s0, *settings)[0]
    torch.library.opcheck(torch.ops.paraseq.para_gru_backward, (u, a, h0, strided(h, layout), rand(2, 7, 3)))
    torch.library.opcheck(torch.ops.paraseq.para_lstm_backward, (u, a, p, s0, strided(state, layout), rand(2, 7, 6)))


# ---- dynamic shapes -------------------------------------------------------------------------------

@pytest.mark.parametrize("module", [ParaGRU, ParaLSTM])
def test_dynamic_shapes_compile_once_with_gradients(device, module):
    cell = module(3, 4).to(device)
    loss = torch.compile(lambda z: newton_apply(cell, z, compile_safe_config()).square().sum(), fullgraph=True,
                         dynamic=True, backend="aot_eager")
    torch._dynamo.reset()
    with torch._dynamo.config.patch(error_on_recompile=True):
        # The first shape's sizes differ from the fixed ones: dynamo gives equal sizes one symbol.
        for B, T in [(5, 11), (3, 7), (4, 9), (2, 5), (2, 13), (3, 17), (6, 19), (7, 23), (2, 29), (8, 31),
                     (9, 37), (10, 41)]:
            x = torch.randn(B, T, 3, device=device, requires_grad=True)
            compiled, = torch.autograd.grad(loss(x), x)
            eager, = torch.autograd.grad(newton_apply(cell, x, compile_safe_config()).square().sum(), x)
            torch.testing.assert_close(compiled, eager)


# ---- decoding: cell.step ----------------------------------------------------------------------------

def test_gru_step_decodes_what_newton_apply_solved(device):
    torch.manual_seed(7)
    cell = ParaGRU(4, 6).to(device, torch.float64)
    T = 20
    x = torch.rand(3, T, 4, dtype=torch.float64, device=device) * 3 - 1.5
    h0 = torch.rand(3, 6, dtype=torch.float64, device=device) - 0.5
    assert_steps_reproduce_the_solve(cell, x, (h0, None), ("newton", "fused"))
    torch.testing.assert_close(gru_loop(cell, x[:, :1], h0)[:, 0], cell.step(h0, x[:, 0]), rtol=1e-14, atol=1e-14)


def test_lstm_step_decodes_what_newton_apply_solved(device):
    torch.manual_seed(8)
    cell = ParaLSTM(3, 5).to(device, torch.float64)
    T = 16
    x = torch.rand(2, T, 3, dtype=torch.float64, device=device) * 3 - 1.5
    for backend in ("newton", "fused"):
        h_solved, c_solved = newton_apply(cell, x, NewtonConfig(max_iters=T, scan_backend=backend),
                                          return_cell_state=True)
        state = None
        for t in range(T):
            state = cell.step(state, x[:, t])
            torch.testing.assert_close(state[0], h_solved[:, t], rtol=1e-12, atol=1e-12)
            torch.testing.assert_close(state[1], c_solved[:, t], rtol=1e-12, atol=1e-12)
    h_loop, c_loop = lstm_loop(cell, x[:, :1])
    h1, c1 = cell.step(None, x[:, 0])
    torch.testing.assert_close((h1, c1), (h_loop[:, 0], c_loop[:, 0]), rtol=1e-14, atol=1e-14)


def test_step_gradcheck_in_double(device):
    gru = ParaGRU(3, 4).to(device, torch.float64)
    x = (torch.rand(2, 3, dtype=torch.float64, device=device) - 0.5).requires_grad_()
    h = (torch.rand(2, 4, dtype=torch.float64, device=device) - 0.5).requires_grad_()
    assert torch.autograd.gradcheck(lambda x, h, *params: gru.step(h, x), (x, h, *gru.parameters()))
    lstm = ParaLSTM(3, 4).to(device, torch.float64)
    c = (torch.rand(2, 4, dtype=torch.float64, device=device) - 0.5).requires_grad_()
    assert torch.autograd.gradcheck(lambda x, h, c, *params: lstm.step((h, c), x), (x, h, c, *lstm.parameters()))


def test_step_compiles_without_graph_breaks_and_equals_eager(device):
    cell = ParaLSTM(4, 8).to(device)
    x = torch.randn(2, 4, device=device)
    state = (torch.randn(2, 8, device=device), torch.randn(2, 8, device=device))
    decode = lambda z: cell.step(cell.step(state, z), z)
    assert graph_break_count(decode, x) == 0
    compiled = torch.compile(decode, fullgraph=True)
    for got, expected in zip(compiled(x), decode(x)):
        assert torch.equal(got, expected)


def test_step_errors_name_the_argument(device):
    gru, lstm = ParaGRU(4, 6).to(device), ParaLSTM(4, 6).to(device)
    x = torch.randn(2, 4, device=device)
    with pytest.raises(ValueError, match=r"ParaGRU.step: argument 'x' has shape \[2, 1, 4\], expected \[B, 4\]"):
        gru.step(None, x.unsqueeze(1))
    with pytest.raises(TypeError, match="ParaGRU.step: argument 'x' is a list"):
        gru.step(None, [1.0])
    with pytest.raises(ValueError, match=r"ParaGRU.step: argument 'h_prev' has shape \[2, 5\], expected \[2, 6\]"):
        gru.step(torch.zeros(2, 5, device=device), x)
    with pytest.raises(TypeError, match="ParaLSTM.step: argument 'state_prev' is a Tensor, expected None or a pair"):
        lstm.step(torch.zeros(2, 6, device=device), x)
    with pytest.raises(ValueError, match=r"ParaLSTM.step: argument 'state_prev\[1\] \(c\)' has shape \[3, 6\]"):
        lstm.step((torch.zeros(2, 6, device=device), torch.zeros(3, 6, device=device)), x)
