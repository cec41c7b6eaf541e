"""linear_scan against a float64 loop written here, its gradients, opcheck and argument errors."""

import pytest
import torch

from conftest import graph_break_count
from paraseq import linear_scan


def reference(A, b, h0, structure, reverse):
    """The recurrence step by step in float64, A_t as full N x N matrices."""
    B, T, N = b.shape
    if structure == "diag":
        M = torch.diag_embed(A)
    elif structure == "dense":
        M = A
    else:
        M = A.new_zeros((B, T, N, N))
        k = A.shape[-1]
        for g in range(N // k):
            M[:, :, g * k:(g + 1) * k, g * k:(g + 1) * k] = A[:, :, g]
    out = torch.zeros_like(b)
    if reverse:
        state = b[:, T - 1]
        out[:, T - 1] = state
        for t in range(T - 2, -1, -1):
            state = torch.einsum("bji,bj->bi", M[:, t + 1], state) + b[:, t]
            out[:, t] = state
    else:
        state = h0 if h0 is not None else b.new_zeros((B, N))
        for t in range(T):
            state = torch.einsum("bij,bj->bi", M[:, t], state) + b[:, t]
            out[:, t] = state
    return out


def operands(structure, device, B=2, T=37, N=6, k=3, dtype=torch.float64):
    shape = {"diag": (B, T, N), "block": (B, T, N // k, k, k), "dense": (B, T, N, N)}[structure]
    scale = {"diag": 0.9, "block": 0.5, "dense": 0.3}[structure]
    A = (torch.rand(shape, dtype=torch.float64, device=device) * 2 - 1) * scale
    b = torch.randn(B, T, N, dtype=torch.float64, device=device)
    h0 = torch.randn(B, N, dtype=torch.float64, device=device)
    return A.to(dtype), b.to(dtype), h0.to(dtype)


CASES = [(s, r) for s in ("diag", "block", "dense") for r in (False, True)]


@pytest.mark.parametrize("structure,reverse", CASES)
def test_matches_the_loop_in_double(device, structure, reverse):
    A, b, h0 = operands(structure, device)
    h0 = None if reverse else h0
    got = linear_scan(A, b, h0, structure=structure, reverse=reverse)
    assert torch.allclose(got, reference(A, b, h0, structure, reverse), rtol=0, atol=1e-12)


@pytest.mark.parametrize("k", [2, 4])
def test_block_sizes(device, k):
    A, b, h0 = operands("block", device, N=8, k=k)
    assert torch.allclose(linear_scan(A, b, h0, "block"), reference(A, b, h0, "block", False), atol=1e-12)


def differentiable_scan(structure, reverse, device, T):
    """(fn, inputs) for gradcheck: the scan of (A, b[, h0]) with every input requiring grad (no h0 in reverse)."""
    A, b, h0 = operands(structure, device, T=T, N=4, k=2)
    inputs = [A.requires_grad_(), b.requires_grad_()] + ([] if reverse else [h0.requires_grad_()])
    fn = (lambda A, b: linear_scan(A, b, None, structure, True)) if reverse else \
        (lambda A, b, h0: linear_scan(A, b, h0, structure))
    return fn, inputs


@pytest.mark.parametrize("structure,reverse", CASES)
def test_gradcheck(device, structure, reverse):
    assert torch.autograd.gradcheck(*differentiable_scan(structure, reverse, device, T=9))


@pytest.mark.parametrize("T", [1, 9])
@pytest.mark.parametrize("structure,reverse", CASES)
def test_backward_with_and_without_a_graph_gives_the_same_bits(device, structure, reverse, T):
    """Without create_graph the backward writes dA's products into its slices; with it, it multiplies
    by the shifted states: the same products, so the same bits (one step: only the first slice)."""
    fn, inputs = differentiable_scan(structure, reverse, device, T=T)
    weight = torch.randn_like(fn(*inputs))
    plain = torch.autograd.grad((fn(*inputs) * weight).sum(), inputs)
    graphed = torch.autograd.grad((fn(*inputs) * weight).sum(), inputs, create_graph=True)
    assert graphed[0].grad_fn is not None  # the gradient of A was recorded: the differentiable form ran
    for without, with_graph in zip(plain, graphed):
        assert torch.equal(without, with_graph.detach())


@pytest.mark.parametrize("structure,reverse", CASES)
def test_gradgradcheck(device, structure, reverse):
    """The backward is itself differentiable (it calls the operators through autograd)."""
    assert torch.autograd.gradgradcheck(*differentiable_scan(structure, reverse, device, T=5))


def test_no_steps_give_zero_gradients(device):
    A, b, h0 = operands("diag", device, T=0)
    A.requires_grad_(), b.requires_grad_(), h0.requires_grad_()
    linear_scan(A, b, h0).sum().backward()
    assert A.grad.shape == A.shape and h0.grad is not None and not h0.grad.any()


@pytest.mark.parametrize("structure,reverse", CASES)
def test_opcheck(device, structure, reverse):
    A, b, h0 = operands(structure, device, T=9, N=4, k=2, dtype=torch.float32)
    args = (A.requires_grad_(), b.requires_grad_(), None if reverse else h0, structure, reverse)
    torch.library.opcheck(torch.ops.paraseq.linear_scan, args)


def test_float32_and_bfloat16_accumulate_in_float32(device):
    A, b, h0 = operands("diag", device, T=500)
    exact = reference(A, b, h0, "diag", False)
    assert torch.allclose(linear_scan(A.float(), b.float(), h0.float()).double(), exact, atol=1e-5)
    # bfloat16 storage: only the rounding of inputs and outputs, not of 500 accumulated steps.
    got = linear_scan(A.bfloat16(), b.bfloat16(), h0.bfloat16())
    assert got.dtype == torch.bfloat16
    stored = reference(A.bfloat16().double(), b.bfloat16().double(), h0.bfloat16().double(), "diag", False)
    assert torch.allclose(got.double(), stored, rtol=2 ** -8, atol=2 ** -8 * stored.abs().max().item())


def test_compiles_without_graph_breaks(device):
    A, b, h0 = operands("dense", device, N=4, dtype=torch.float32)
    A.requires_grad_()

    def loss(A, b, h0):
        return linear_scan(A, b, h0, "dense").square().sum()
    assert graph_break_count(loss, A, b, h0) == 0
    compiled = torch.compile(loss, fullgraph=True)
    eager_value, = torch.autograd.grad(loss(A, b, h0), A)
    compiled_value, = torch.autograd.grad(compiled(A, b, h0), A)
    assert torch.equal(eager_value, compiled_value)


def test_errors_name_the_argument(device):
    A, b, h0 = operands("diag", device, dtype=torch.float32)
    with pytest.raises(TypeError, match="argument 'b' has dtype Long"):
        linear_scan(A, b.long())
    with pytest.raises(TypeError, match="argument 'b' has dtype Double, expected Float"):
        linear_scan(A, b.double())
    with pytest.raises(ValueError, match="argument 'A' has shape"):
        linear_scan(A[:, :-1], b)
    with pytest.raises(ValueError, match="argument 'h0' has shape"):
        linear_scan(A, b, h0[:, :-1])
    with pytest.raises(ValueError, match="argument 'structure' is 'tri'"):
        linear_scan(A, b, structure="tri")
    with pytest.raises(ValueError, match="argument 'h0' is given with reverse=True"):
        linear_scan(A, b, h0, reverse=True)
    with pytest.raises(ValueError, match="N <= 32"):
        linear_scan(torch.zeros(1, 2, 33, 33, device=device), torch.zeros(1, 2, 33, device=device), structure="dense")


def test_non_contiguous_inputs_are_copied(device):
    A, b, h0 = operands("diag", device)
    A_t = A.transpose(0, 1).contiguous().transpose(0, 1)
    assert not A_t.is_contiguous()
    assert torch.equal(linear_scan(A_t, b, h0), linear_scan(A, b, h0))


@pytest.mark.parametrize("layout", ["transposed", "expanded"])
@pytest.mark.parametrize("structure,reverse", CASES)
def test_opcheck_on_strided_inputs(device, structure, reverse, layout):
    A, b, h0 = operands(structure, device, T=9, N=4, k=2, dtype=torch.float32)
    if layout == "transposed":
        view = lambda t: t.transpose(0, 1).contiguous().transpose(0, 1)
    else:
        view = lambda t: t[:1].expand(t.shape)
    args = (view(A.requires_grad_()), view(b.requires_grad_()), None if reverse else view(h0), structure, reverse)
    assert not args[0].is_contiguous()
    torch.library.opcheck(torch.ops.paraseq.linear_scan, args)


@pytest.mark.parametrize("structure", ["diag", "block", "dense"])
def test_dynamic_shapes_compile_once_with_gradients(device, structure):
    def loss(A, b, h0):
        return linear_scan(A, b, h0, structure).square().sum()
    compiled = torch.compile(loss, fullgraph=True, dynamic=True, backend="aot_eager")
    torch._dynamo.reset()
    with torch._dynamo.config.patch(error_on_recompile=True):
        # The first shape's sizes differ from the fixed ones: dynamo gives equal sizes one symbol.
        for B, T in [(5, 11), (3, 7), (4, 9), (2, 5), (2, 13), (3, 17), (6, 19), (7, 23), (2, 29), (8, 31),
                     (9, 37), (10, 41)]:
            A, b, h0 = operands(structure, device, B=B, T=T, N=4, k=2, dtype=torch.float32)
            inputs = (A.requires_grad_(), b.requires_grad_(), h0.requires_grad_())
            got = torch.autograd.grad(compiled(*inputs), inputs)
            expected = torch.autograd.grad(loss(*inputs), inputs)
            for g, e in zip(got, expected):
                torch.testing.assert_close(g, e)


def test_python_errors_name_the_argument(device):
    A, b, h0 = operands("diag", device, dtype=torch.float32)
    with pytest.raises(TypeError, match="linear_scan: argument 'A' is a NoneType, expected a tensor"):
        linear_scan(None, b)
    with pytest.raises(TypeError, match="argument 'b' is a list"):
        linear_scan(A, [1.0])
    # The reverse recurrence's b is named b (the C++ core calls it g).
    with pytest.raises(ValueError, match=r"argument 'A' has shape \[2, 36, 6\], expected \[B, T, N\] = \[2, 37, 6\]"):
        linear_scan(A[:, 1:], b, reverse=True)
    with pytest.raises(ValueError, match=r"argument 'b' has shape \[2, 37\], expected \[B, T, N\]"):
        linear_scan(A, b[..., 0], reverse=True)
    # Called directly, the operator names its own arguments too, also in the reverse direction.
    A_block = torch.zeros(1, 4, 1, 2, 2, device=device)
    with pytest.raises(ValueError, match=r"paraseq::linear_scan: argument 'b' has \[1, 4, 3\], expected a state size N divisible by the block size K = 2"):
        torch.ops.paraseq.linear_scan(A_block, torch.zeros(1, 4, 3, device=device), None, "block", True)
    with pytest.raises(TypeError, match="argument 'A' has dtype ComplexFloat"):
        linear_scan(A.to(torch.complex64), b.to(torch.complex64))
