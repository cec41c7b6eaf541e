"""What only CUDA has: operands on two devices, agreement with the CPU kernels (long sequences of few channels
included: the one-pass kernels with staged windows), PyTorch's current stream,
the general and the compiled paths (functions and cells of your own; the compiled one's extensions
compiled by nvcc), packed sequences (cu_seqlens) on CUDA tensors against the CPU, ParaSLSTM's operator
and the head GRU's team step against float64 loops.

conftest.py collects this module only when cuda is among the tested devices.
"""

import pytest
import torch

from paraseq import linear_scan
from test_linear_scan import CASES, operands, reference


# A, the first tensor argument, sets the device the others must be on.
@pytest.mark.parametrize("on_cpu,message", [
    ("b", r"linear_scan: argument 'b' is on device cpu, expected cuda:\d+"),
    ("A", r"linear_scan: argument 'b' is on device cuda:\d+, expected cpu"),
    ("h0", r"linear_scan: argument 'h0' is on device cpu, expected cuda:\d+"),
], ids=["b_on_cpu", "A_on_cpu", "h0_on_cpu"])
def test_operands_on_two_devices_are_refused(on_cpu, message):
    arguments = dict(zip(("A", "b", "h0"), operands("diag", "cuda")))
    arguments[on_cpu] = arguments[on_cpu].cpu()
    with pytest.raises(RuntimeError, match=message):
        linear_scan(**arguments)


@pytest.mark.parametrize("structure,reverse", CASES)
def test_linear_scan_on_cuda_equals_cpu_in_double(structure, reverse):
    A, b, h0 = operands(structure, "cpu")
    h0 = None if reverse else h0
    on_cpu = linear_scan(A, b, h0, structure, reverse)
    on_cuda = linear_scan(A.cuda(), b.cuda(), None if h0 is None else h0.cuda(), structure, reverse)
    assert torch.allclose(on_cuda.cpu(), on_cpu, rtol=0, atol=1e-12)


# Long sequences of few channels take the one-pass scan with its windows staged through team scratch
# (for scans of Views a kernel of its own, StagedChainedTag): against the CPU's kernels in double,
# across chunks and segments of the look-back, and bitwise repeatable.
@pytest.mark.parametrize("structure,channels,k", [("diag", 1, 1), ("diag", 4, 1), ("block", 2, 2), ("block", 6, 3)])
@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reverse"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
def test_long_scans_of_few_channels_on_cuda_equal_cpu(structure, channels, k, reverse, dtype):
    A, b, h0 = operands(structure, "cpu", B=1, T=3 * 2 ** 15 + 5, N=channels, k=k)
    h0 = None if reverse else h0
    on_cpu = linear_scan(A, b, h0, structure, reverse)
    arguments = [A.cuda().to(dtype), b.cuda().to(dtype), None if h0 is None else h0.cuda().to(dtype), structure, reverse]
    on_cuda = linear_scan(*arguments)
    tolerance = 1e-12 if dtype == torch.float64 else 1e-4
    assert torch.allclose(on_cuda.cpu().double(), on_cpu, rtol=tolerance, atol=tolerance)
    assert torch.equal(linear_scan(*arguments), on_cuda)


# The Newton mode's scans and its adjoint's over a long sequence of few channels run the one-pass
# kernel with staged windows too (computed maps: the kernel with both paths), forward and backward.
@pytest.mark.parametrize("hidden", [1, 2])
def test_long_newton_solves_of_few_channels_on_cuda_equal_cpu_in_double(hidden):
    from paraseq import NewtonConfig, ParaGRU, newton_apply

    torch.manual_seed(0)
    cell = ParaGRU(3, hidden).to(torch.float64)
    x = torch.rand(1, 3 * 2 ** 15 + 5, 3, dtype=torch.float64) - 0.5
    config = NewtonConfig(max_iters=4, residual_fail=None, scan_backend="newton")
    results = []
    for device in ("cpu", "cuda"):
        cell = cell.to(device)
        x_d = x.to(device).requires_grad_()
        h = newton_apply(cell, x_d, config)
        grads = torch.autograd.grad(h.square().sum(), [x_d] + list(cell.parameters()))
        results.append([h.detach().cpu()] + [g.cpu() for g in grads])
    assert all(torch.isfinite(r).all() for r in results[0])
    for on_cuda, on_cpu in zip(results[1], results[0]):
        assert torch.allclose(on_cuda, on_cpu, rtol=1e-9, atol=1e-12)


def test_runs_on_the_current_stream():
    A, b, h0 = operands("diag", "cpu")
    expected = reference(A, 2 * b, h0, "diag", False)
    A, b, h0 = A.cuda(), b.cuda(), h0.cuda()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        # The side stream is held busy before it writes `doubled`: an operator running on any other
        # stream would most likely read `doubled` before it is written.
        torch.cuda._sleep(50_000_000)
        doubled = 2 * b
        got = linear_scan(A, doubled, h0)
    side.synchronize()
    assert torch.allclose(got.cpu(), expected, rtol=0, atol=1e-12)


# ---- the general path (functions and cells of your own) on CUDA tensors -------------------------------

def test_user_right_hand_side_on_cuda_equals_cpu_in_double():
    from paraseq import odeint
    from test_user_functions import VanDerPol

    results = []
    for device in ("cpu", "cuda"):
        model = VanDerPol(1.5).to(device)
        y0 = torch.tensor([[2.0, 0.0], [0.5, -1.0]], dtype=torch.float64, device=device, requires_grad=True)
        t = torch.linspace(0, 2, 5, dtype=torch.float64, device=device)
        y = odeint(model, y0, t, rtol=1e-8, atol=1e-10, compile=False)
        assert y.device.type == device
        grads = torch.autograd.grad(y.square().sum(), (y0, model.mu))
        results.append([y.detach().cpu()] + [g.cpu() for g in grads])
    for on_cuda, on_cpu in zip(results[1], results[0]):
        assert torch.allclose(on_cuda, on_cpu, rtol=0, atol=1e-10)


def test_user_cell_on_cuda_equals_cpu_in_double():
    from paraseq import NewtonConfig, newton_apply
    from test_user_functions import DenseGRU, TwoSlotCell, cell_case

    for cell_type in (DenseGRU, TwoSlotCell):
        cell, x, h0 = cell_case(cell_type, "cpu")
        h = newton_apply(cell, x, NewtonConfig(max_iters=8), h0=h0, compile=False)
        grads = torch.autograd.grad(h.square().sum(), [x, h0] + list(cell.parameters()))
        cell_cuda = cell.cuda()
        x_cuda, h0_cuda = x.detach().cuda().requires_grad_(), h0.detach().cuda().requires_grad_()
        h_cuda = newton_apply(cell_cuda, x_cuda, NewtonConfig(max_iters=8), h0=h0_cuda, compile=False)
        grads_cuda = torch.autograd.grad(h_cuda.square().sum(), [x_cuda, h0_cuda] + list(cell_cuda.parameters()))
        assert torch.allclose(h_cuda.cpu(), h, rtol=0, atol=1e-12)
        for a, b in zip(grads_cuda, grads):
            assert torch.allclose(a.cpu(), b, rtol=1e-10, atol=1e-12)


# ---- the compiled path (generated extensions, compiled by nvcc) on CUDA tensors ---------------------

def test_the_extensions_of_a_cuda_build_are_cuda_sources():
    from paraseq import _extension_build

    settings = _extension_build.build_settings()
    assert settings.cuda and settings.suffix == ".cu"
    assert any(flag.startswith("-gencode=arch=compute_") for flag in settings.compile_flags)


def test_auto_in_a_cuda_build_takes_the_compiled_path(device):
    """compile="auto" takes the compiled path on either device of a CUDA build (nvcc compiles its first use):
    its result is compile=True's, and no warning but the first use's CompilingWarning (whose text says that
    compile=False would take the general path) names the general path."""
    import warnings

    from paraseq import CompilingWarning, NewtonConfig, newton_apply, odeint
    from test_user_functions import DiagonalCell, VanDerPol, cell_case

    cell, x, h0 = cell_case(DiagonalCell, device, T=4)
    y0 = torch.tensor([[2.0, 0.0]], dtype=torch.float64, device=device)
    t = torch.linspace(0, 1, 3, dtype=torch.float64, device=device)
    field = VanDerPol(1.5).to(device)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        h_auto = newton_apply(cell, x, NewtonConfig(max_iters=4), h0=h0)
        y_auto = odeint(field, y0, t)
    chose_general = [w for w in caught if w.category is not CompilingWarning and "general path" in str(w.message)]
    assert not chose_general, [str(w.message) for w in chose_general]
    assert torch.equal(h_auto, newton_apply(cell, x, NewtonConfig(max_iters=4), h0=h0, compile=True))
    assert torch.equal(y_auto, odeint(field, y0, t, compile=True))


def test_compiled_right_hand_side_on_cuda_equals_the_general_path_in_double():
    from paraseq import odeint
    from test_user_functions import VanDerPol

    model = VanDerPol(1.5).cuda()
    y0 = torch.tensor([[2.0, 0.0], [0.5, -1.0]], dtype=torch.float64, device="cuda", requires_grad=True)
    t = torch.linspace(0, 2, 5, dtype=torch.float64, device="cuda")
    results = []
    for compile in (True, False):
        y = odeint(model, y0, t, rtol=1e-8, atol=1e-10, compile=compile)
        assert y.device.type == "cuda"
        results.append([y.detach()] + list(torch.autograd.grad(y.square().sum(), (y0, model.mu))))
    for compiled, general in zip(*results):
        assert torch.allclose(compiled, general, rtol=0, atol=1e-9)


def assert_equals_the_loop_and_the_general_path(cell, x, h0, h):
    """h, the compiled path's states of cell from h0 over x, against the float64 loop (1e-10), and its
    gradients against the general path's (rtol 1e-9)."""
    from paraseq import NewtonConfig, newton_apply
    from test_user_functions import cell_loop

    general = newton_apply(cell, x, NewtonConfig(max_iters=30), h0=h0, compile=False)
    assert (h - cell_loop(cell, x, h0)).abs().max() <= 1e-10
    inputs = [x, h0] + list(cell.parameters())
    weight = torch.randn_like(h)
    for got, wanted in zip(torch.autograd.grad((h * weight).sum(), inputs),
                           torch.autograd.grad((general * weight).sum(), inputs)):
        torch.testing.assert_close(got, wanted, rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize("backend", ["auto", "newton", "fused", "sequential"])
def test_compiled_cells_on_cuda_equal_the_loop_and_the_general_path_in_double(backend):
    from paraseq import NewtonConfig, newton_apply
    from test_user_functions import DenseGRU, DiagonalCell, TwoSlotCell, cell_case

    for cell_type in (DiagonalCell, TwoSlotCell, DenseGRU):
        cell, x, h0 = cell_case(cell_type, "cuda")
        h, stats = newton_apply(cell, x, NewtonConfig(max_iters=30, scan_backend=backend), h0=h0, return_stats=True,
                                compile=True)
        assert h.device.type == "cuda" and stats.residual.max() <= 1e-10
        assert_equals_the_loop_and_the_general_path(cell, x, h0, h)


# A cell of one's own with 64 groups, far fewer than the GPU's resident threads: the automatic mode
# takes the one-pass kernel forward and backward (the one-pass adjoint, the extension's unit of its
# one_pass family), over many windows of a 700-step sequence.
def test_compiled_cell_with_many_groups_on_cuda_takes_the_one_pass_mode_both_ways():
    from paraseq import NewtonConfig, newton_apply
    from test_user_functions import DiagonalCell

    torch.manual_seed(0)
    cell = DiagonalCell(3, 64).to("cuda", torch.float64)
    x = (torch.rand(1, 700, 3, dtype=torch.float64, device="cuda") - 0.5).requires_grad_()
    h0 = (0.3 * torch.randn(1, 64, dtype=torch.float64, device="cuda")).requires_grad_()
    h, stats = newton_apply(cell, x, NewtonConfig(max_iters=30), h0=h0, return_stats=True, compile=True)
    assert stats.backend == "one_pass"
    assert_equals_the_loop_and_the_general_path(cell, x, h0, h)


def test_compiled_cell_on_cuda_under_torch_compile_has_no_graph_break_and_equals_eager():
    from conftest import graph_break_count
    from paraseq import compile_safe_config, newton_apply
    from test_user_functions import DiagonalCell, cell_case

    cell, x, h0 = cell_case(DiagonalCell, "cuda")

    def solve(x, h0):
        return newton_apply(cell, x, compile_safe_config(30), h0=h0, compile=True)

    assert graph_break_count(solve, x, h0) == 0
    compiled = torch.compile(solve, fullgraph=True)
    assert torch.equal(compiled(x, h0), solve(x, h0))


# ---- packed sequences (cu_seqlens) on CUDA tensors --------------------------------------------------

def test_packed_cu_seqlens_on_another_device_is_refused():
    from test_packed import offsets, scan_operands

    A, b, h0 = scan_operands("diag", "cuda", lengths=[2, 3])
    with pytest.raises(ValueError, match=r"argument 'cu_seqlens' is on device cpu, expected cuda:\d+ \(the device "
                                         "of argument 'b'\\)"):
        linear_scan(A, b, h0, cu_seqlens=offsets([2, 3], "cpu"))


@pytest.mark.parametrize("structure,reverse", CASES)
def test_packed_linear_scan_on_cuda_equals_cpu_in_double(structure, reverse):
    from test_packed import LENGTHS, offsets, scan_operands

    A, b, h0 = scan_operands(structure, "cpu")
    h0 = None if reverse else h0
    results = []
    for device in ("cpu", "cuda"):
        inputs = [A.to(device).requires_grad_(), b.to(device).requires_grad_()]
        inputs += [] if reverse else [h0.to(device).requires_grad_()]
        h = linear_scan(*inputs[:2], None if reverse else inputs[2], structure, reverse,
                        cu_seqlens=offsets(LENGTHS, device))
        results.append([h.detach().cpu()] + [g.cpu() for g in torch.autograd.grad(h.square().sum(), inputs)])
    for on_cuda, on_cpu in zip(results[1], results[0]):
        assert torch.allclose(on_cuda, on_cpu, rtol=0, atol=1e-12)


def test_packed_newton_on_cuda_equals_cpu_in_double():
    from paraseq import ParaGRU, ParaLSTM, newton_apply
    from test_packed import LENGTHS, SOLVE, offsets, user_cell
    from test_user_functions import TwoSlotCell

    for make in (lambda: ParaGRU(3, 4), lambda: ParaLSTM(3, 4), lambda: user_cell(TwoSlotCell, "cpu")):
        cell = make().to(torch.float64)
        x = torch.rand(1, sum(LENGTHS), 3, dtype=torch.float64) - 0.5
        slots = getattr(cell, "state_slots", 1)
        h0 = 0.3 * torch.randn((len(LENGTHS), 4) if slots == 1 else (len(LENGTHS), slots, 4), dtype=torch.float64)
        results = []
        for device in ("cpu", "cuda"):
            cell = cell.to(device)
            x_d, h0_d = x.to(device).requires_grad_(), h0.to(device).requires_grad_()
            state0 = (h0_d, 2 * h0_d) if isinstance(cell, ParaLSTM) else h0_d
            h = newton_apply(cell, x_d, SOLVE, h0=state0, cu_seqlens=offsets(LENGTHS, device), max_seqlen=5)
            grads = torch.autograd.grad(h.square().sum(), [x_d, h0_d] + list(cell.parameters()))
            results.append([h.detach().cpu()] + [g.cpu() for g in grads])
        for on_cuda, on_cpu in zip(results[1], results[0]):
            assert torch.allclose(on_cuda, on_cpu, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("backend", ["sequential", "fused", "newton", "one_pass", "auto"])
def test_slstm_operator_on_cuda_equals_the_loop_in_double(backend):
    from paraseq import NewtonConfig, newton_apply
    from test_slstm import case, loop_of

    cell, x, h0 = case()
    x.requires_grad_(), h0.requires_grad_()
    expected = loop_of(cell, x, h0)
    weight = torch.randn_like(expected)
    wanted = torch.autograd.grad((expected * weight).sum(), [x, h0] + list(cell.parameters()))
    cell = cell.to("cuda")
    x_d, h0_d = x.detach().to("cuda").requires_grad_(), h0.detach().to("cuda").requires_grad_()
    state = newton_apply(cell, x_d, NewtonConfig(max_iters=24, scan_backend=backend), h0=h0_d)
    assert torch.allclose(state.detach().cpu(), expected.detach(), rtol=0, atol=1e-12)
    got = torch.autograd.grad((state * weight.to("cuda")).sum(), [x_d, h0_d] + list(cell.parameters()))
    for g, w in zip(got, wanted):
        assert torch.allclose(g.cpu(), w, rtol=1e-9, atol=1e-11)


# d_head 16: on CUDA the automatic mode walks t with one thread block per (batch element, head).
@pytest.mark.parametrize("backend", ["auto", "sequential", "newton"])
def test_head_gru_on_cuda_equals_the_loop_in_double(backend):
    from test_newton_heads import head_cell, head_gru_loop

    cell = head_cell("cuda", hidden_size=32, n_heads=2, max_iters=12, scan_backend=backend)
    x = (torch.rand(2, 40, 5, dtype=torch.float64, device="cuda") - 0.5).requires_grad_()
    h0 = (torch.rand(2, 32, dtype=torch.float64, device="cuda") - 0.5).requires_grad_()
    weight = torch.randn(2, 40, 32, dtype=torch.float64, device="cuda")
    inputs = [x, h0] + list(cell.parameters())
    h, expected = cell(x, h0), head_gru_loop(cell, x, h0)
    assert (h - expected).abs().max() <= 1e-10
    got = torch.autograd.grad((h * weight).sum(), inputs)
    wanted = torch.autograd.grad((expected * weight).sum(), inputs)
    for g, w in zip(got, wanted):
        assert torch.allclose(g, w, rtol=1e-8, atol=1e-10)
