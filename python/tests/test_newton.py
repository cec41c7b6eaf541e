"""ParaGRU / ParaLSTM: Newton against float64 loops written here, gradients, compile, precision."""

import pytest
import torch

from conftest import graph_break_count
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


BACKENDS = ["auto", "fused", "scan", "sequential"]


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


def test_gradients_match_the_loop_in_double(device):
    for cell in (ParaGRU(4, 6, config=NewtonConfig(max_iters=5)).to(device, torch.float64),
                 ParaLSTM(4, 6, config=NewtonConfig(max_iters=6)).to(device, torch.float64)):
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
    gru = lambda u, a, h0: torch.ops.paraseq.para_gru(u, a, h0, 8, 1.0, None, None, 0, False, "scan", False)[0]
    assert torch.autograd.gradcheck(gru, (u, a, h0))
    p = (torch.rand(2, 3, dtype=torch.float64, device=device) - 0.5).requires_grad_()
    s0 = (torch.rand(2, 6, dtype=torch.float64, device=device) - 0.5).requires_grad_()
    lstm = lambda u, a, p, s0: torch.ops.paraseq.para_lstm(u, a, p, s0, 8, 1.0, None, None, 0, False, "fused",
                                                           False)[0]
    assert torch.autograd.gradcheck(lstm, (u, a, p, s0))


def test_opcheck(device):
    u = (torch.rand(2, 7, 9, device=device) - 0.5).requires_grad_()
    a = (torch.rand(3, 3, device=device) - 0.5).requires_grad_()
    p = (torch.rand(2, 3, device=device) - 0.5).requires_grad_()
    h0 = torch.rand(2, 3, device=device)
    torch.library.opcheck(torch.ops.paraseq.para_gru, (u, a, h0, 3, 1.0, None, None, 0, False, "auto", True))
    torch.library.opcheck(torch.ops.paraseq.para_lstm, (u, a, p, None, 3, 1.0, None, None, 0, False, "auto", False))
    h = torch.ops.paraseq.para_gru(u, a, h0, 3, 1.0, None, None, 0, False, "auto", False)[0].detach()
    torch.library.opcheck(torch.ops.paraseq.para_gru_backward, (u.detach(), a.detach(), h0, h, torch.randn_like(h)))
    state = torch.ops.paraseq.para_lstm(u, a, p, None, 3, 1.0, None, None, 0, False, "auto", False)[0].detach()
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
    h, stats = newton_apply(cell, x, NewtonConfig(max_iters=4, scan_backend="scan"), return_stats=True)
    assert stats.residual.shape == (3,) and stats.residual.max() <= 1e-10
    with pytest.raises(NewtonDivergenceError, match="did not converge"):
        newton_apply(cell, 20 * x, NewtonConfig(max_iters=1, residual_fail=1e-12, scan_backend="scan"))
    early = newton_apply(cell, x, NewtonConfig(max_iters=50, residual_atol=1e-12, scan_backend="scan"))
    assert (early - gru_loop(cell, x)).abs().max() <= 1e-10


def test_errors_name_the_argument(device):
    cell = ParaGRU(4, 6).to(device)
    with pytest.raises(ValueError, match="argument 'x' has shape"):
        cell(torch.randn(2, 5, 3, device=device))
    with pytest.raises(ValueError, match="argument 'scan_backend'"):
        NewtonConfig(scan_backend="gpu")
    u, a = torch.randn(2, 5, 18, device=device), torch.randn(3, 6, device=device)
    with pytest.raises(ValueError, match="argument 'u' has shape"):
        torch.ops.paraseq.para_gru(u[..., :-1], a, None, 3, 1.0, None, None, 0, False, "auto", False)
    with pytest.raises(TypeError, match="argument 'a' has dtype Double"):
        torch.ops.paraseq.para_gru(u, a.double(), None, 3, 1.0, None, None, 0, False, "auto", False)
    with pytest.raises(ValueError, match="argument 'h0' has shape"):
        torch.ops.paraseq.para_gru(u, a, torch.zeros(2, 5, device=device), 3, 1.0, None, None, 0, False, "auto", False)
    with pytest.raises(ValueError, match="config.omega"):
        torch.ops.paraseq.para_gru(u, a, None, 3, 1.5, None, None, 0, False, "auto", False)
