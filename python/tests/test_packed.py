"""Packed variable-length sequences (cu_seqlens): linear_scan and newton_apply against each sequence
run alone (float64 loops written in the tests, and the unpacked API), gradients, gradcheck, no state
across a boundary, torch.compile, and argument errors."""

import os
import subprocess
import sys

import pytest
import torch

from conftest import graph_break_count
from paraseq import NewtonConfig, NewtonDivergenceError, ParaGRU, ParaLSTM, compile_safe_config, linear_scan, newton_apply
from paraseq._packed import GROUP_SLACK, MOST_GROUPS, length_groups
from test_linear_scan import CASES, reference
from test_newton import gru_loop
from test_user_functions import DiagonalCell, TwoSlotCell, cell_loop

DOUBLE = torch.float64
# Lengths 3, 1, 0 (an empty sequence), 4 and 2: T = 10, S = 5.
LENGTHS = [3, 1, 0, 4, 2]
SOLVE = NewtonConfig(max_iters=6)  # Newton is exact after T_max = 4 iterations: 6 converge to rounding


def offsets(lengths, device, dtype=torch.int32):
    return torch.tensor([0] + lengths, device=device).cumsum(0).to(dtype)


def spans(lengths):
    """(start, end) of each sequence."""
    ends = torch.tensor(lengths).cumsum(0).tolist()
    return [(end - length, end) for length, end in zip(lengths, ends)]


def scan_operands(structure, device, lengths=LENGTHS, N=4, k=2):
    T, S = sum(lengths), len(lengths)
    shape = {"diag": (1, T, N), "block": (1, T, N // k, k, k), "dense": (1, T, N, N)}[structure]
    A = (torch.rand(shape, dtype=DOUBLE, device=device) * 2 - 1) * 0.6
    b = torch.randn(1, T, N, dtype=DOUBLE, device=device)
    h0 = torch.randn(S, N, dtype=DOUBLE, device=device)
    return A, b, h0


def scan_each(A, b, h0, structure, reverse, lengths, scan):
    """Each non-empty sequence alone through scan (the float64 loop or the unpacked linear_scan), concatenated."""
    parts = [scan(A[:, start:end], b[:, start:end], None if reverse else h0[s:s + 1], structure, reverse)
             for s, (start, end) in enumerate(spans(lengths)) if end > start]
    return torch.cat(parts, dim=1)


# ---- linear_scan ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("structure,reverse", CASES)
def test_packed_scan_equals_each_sequence_alone(device, structure, reverse):
    A, b, h0 = scan_operands(structure, device)
    A.requires_grad_(), b.requires_grad_(), h0.requires_grad_()
    h0_arg = None if reverse else h0
    got = linear_scan(A, b, h0_arg, structure, reverse, cu_seqlens=offsets(LENGTHS, device))
    assert got.shape == b.shape
    loop = scan_each(A, b, h0, structure, reverse, LENGTHS, reference)
    assert (got - loop).abs().max() <= 1e-12
    alone = scan_each(A, b, h0, structure, reverse, LENGTHS, linear_scan)
    assert (got - alone).abs().max() <= 1e-13
    weight = torch.randn_like(got)
    inputs = [A, b] + ([] if reverse else [h0])
    for g, e in zip(torch.autograd.grad((got * weight).sum(), inputs),
                    torch.autograd.grad((loop * weight).sum(), inputs)):
        assert torch.allclose(g, e, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("structure,reverse", CASES)
def test_packed_scan_gradcheck(device, structure, reverse):
    lengths = [2, 0, 1, 3]
    A, b, h0 = scan_operands(structure, device, lengths=lengths, N=2)
    cu_seqlens = offsets(lengths, device, torch.int64)
    if reverse:
        fn, inputs = (lambda A, b: linear_scan(A, b, None, structure, True, cu_seqlens=cu_seqlens)), (A, b)
    else:
        fn, inputs = (lambda A, b, h0: linear_scan(A, b, h0, structure, cu_seqlens=cu_seqlens)), (A, b, h0)
    assert torch.autograd.gradcheck(fn, [t.requires_grad_() for t in inputs])


@pytest.mark.parametrize("structure,reverse", [("diag", False), ("dense", True)])
def test_packed_scan_gradgradcheck(device, structure, reverse):
    """The cut and the entry of h0 are differentiable tensor operations: second derivatives too."""
    lengths = [2, 0, 2]
    A, b, h0 = scan_operands(structure, device, lengths=lengths, N=2)
    cu_seqlens = offsets(lengths, device)
    fn = lambda A, b, *h0: linear_scan(A, b, *h0, structure=structure, reverse=reverse, cu_seqlens=cu_seqlens)
    inputs = (A, b) if reverse else (A, b, h0)
    assert torch.autograd.gradgradcheck(fn, [t.requires_grad_() for t in inputs])


@pytest.mark.parametrize("structure,reverse", CASES)
def test_one_packed_sequence_is_the_unpacked_call_bitwise(device, structure, reverse):
    A, b, h0 = scan_operands(structure, device, lengths=[7])
    A.requires_grad_(), b.requires_grad_(), h0.requires_grad_()
    h0_arg = None if reverse else h0
    packed = linear_scan(A, b, h0_arg, structure, reverse, cu_seqlens=offsets([7], device))
    unpacked = linear_scan(A, b, h0_arg, structure, reverse)
    assert torch.equal(packed, unpacked)
    inputs = [A, b] + ([] if reverse else [h0])
    for g, e in zip(torch.autograd.grad(packed.square().sum(), inputs),
                    torch.autograd.grad(unpacked.square().sum(), inputs)):
        assert torch.equal(g, e)


@pytest.mark.parametrize("structure,reverse", CASES)
def test_no_scan_state_crosses_a_boundary(device, structure, reverse):
    """Forward: the last b of sequence 0 leaves sequence 1 bitwise unchanged; reverse: the first b
    of sequence 1 leaves sequence 0 unchanged."""
    lengths = [4, 5]
    A, b, h0 = scan_operands(structure, device, lengths=lengths)
    cu_seqlens = offsets(lengths, device)
    h0_arg = None if reverse else h0
    before = linear_scan(A, b, h0_arg, structure, reverse, cu_seqlens=cu_seqlens)
    perturbed = b.clone()
    perturbed[:, 4 if reverse else 3] += 1.0
    after = linear_scan(A, perturbed, h0_arg, structure, reverse, cu_seqlens=cu_seqlens)
    untouched, touched = (slice(0, 4), slice(4, 9)) if reverse else (slice(4, 9), slice(0, 4))
    assert torch.equal(after[:, untouched], before[:, untouched])
    assert not torch.equal(after[:, touched], before[:, touched])


def test_empty_sequences_anywhere_and_an_all_empty_batch(device):
    lengths = [0, 2, 0, 0, 3, 0]
    A, b, h0 = scan_operands("diag", device, lengths=lengths)
    got = linear_scan(A, b, h0, cu_seqlens=offsets(lengths, device))
    assert (got - scan_each(A, b, h0, "diag", False, lengths, reference)).abs().max() <= 1e-12
    A, b, h0 = scan_operands("diag", device, lengths=[0, 0])
    assert linear_scan(A, b, h0, cu_seqlens=offsets([0, 0], device)).shape == (1, 0, 4)


def test_packed_scan_in_bfloat16_is_each_sequence_alone_to_its_rounding(device):
    A, b, h0 = scan_operands("dense", device)
    A, b, h0 = A.bfloat16(), b.bfloat16(), h0.bfloat16()
    got = linear_scan(A, b, h0, "dense", cu_seqlens=offsets(LENGTHS, device))
    assert got.dtype == torch.bfloat16
    exact = scan_each(A.double(), b.double(), h0.double(), "dense", False, LENGTHS, reference)
    # The stored output's rounding, and that of b + A h0 at each sequence's first step.
    assert (got.double() - exact).abs().max() <= 2 * 2 ** -8 * exact.abs().max()


def test_packed_scan_compiles_without_graph_breaks(device):
    A, b, h0 = scan_operands("block", device)
    cu_seqlens = offsets(LENGTHS, device)
    A.requires_grad_(), h0.requires_grad_()

    def loss(A, b, h0, cu_seqlens):
        return linear_scan(A, b, h0, "block", cu_seqlens=cu_seqlens).square().sum()
    assert graph_break_count(loss, A, b, h0, cu_seqlens) == 0
    compiled = torch.compile(loss, fullgraph=True, backend="aot_eager")
    got = torch.autograd.grad(compiled(A, b, h0, cu_seqlens), (A, h0))
    expected = torch.autograd.grad(loss(A, b, h0, cu_seqlens), (A, h0))
    for g, e in zip(got, expected):
        assert torch.equal(g, e)
    # Compiled, the values are checked on the device, without a host read.
    message = "argument 'cu_seqlens' must start at 0, end at T = 10"
    if device == "cpu":
        with pytest.raises(RuntimeError, match=message):
            compiled(A, b, h0, offsets([3, 1, 0, 5, 2], device))
    else:
        assert_refused_on_cuda(message, """
from paraseq import linear_scan
scan = torch.compile(lambda A, b, h0, cu_seqlens: linear_scan(A, b, h0, cu_seqlens=cu_seqlens), fullgraph=True,
                     backend="aot_eager")
A, b, h0 = torch.rand(1, 10, 2, device="cuda"), torch.rand(1, 10, 2, device="cuda"), torch.zeros(5, 2, device="cuda")
scan(A, b, h0, torch.tensor([0, 3, 4, 4, 9, 11], dtype=torch.int32, device="cuda"))
""")


def assert_refused_on_cuda(message, script):
    """A compiled graph checks cu_seqlens' values with torch._assert_async: a RuntimeError on the CPU, on CUDA a
    device-side assertion, which ends the process's CUDA context (as PyTorch's own device-side checks do). So
    `script` (after `import torch`) provokes it in a child process, which must fail with `message`."""
    code = f"import torch\n{script}\ntorch.cuda.synchronize()\nprint('reached')\n"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                            env=os.environ.copy())
    assert result.returncode != 0 and "reached" not in result.stdout, result.stdout
    assert message in result.stderr, result.stderr[-2000:]


def test_packed_scan_errors_name_the_argument(device):
    A, b, h0 = scan_operands("diag", device, lengths=[2, 3])
    cu_seqlens = offsets([2, 3], device)
    scan = lambda cu_seqlens, h0=h0, A=A, b=b, reverse=False: linear_scan(A, b, h0, reverse=reverse,
                                                                          cu_seqlens=cu_seqlens)
    with pytest.raises(TypeError, match="argument 'cu_seqlens' is a list, expected an int32 or int64 tensor"):
        scan([0, 2, 5])
    with pytest.raises(ValueError, match=r"argument 'cu_seqlens' has shape \[1, 3\], expected \[S \+ 1\]"):
        scan(cu_seqlens[None])
    with pytest.raises(ValueError, match=r"argument 'cu_seqlens' has shape \[1\], expected \[S \+ 1\] with S >= 1"):
        scan(cu_seqlens[:1])
    with pytest.raises(TypeError, match="argument 'cu_seqlens' has dtype torch.float32, expected torch.int32 or"):
        scan(cu_seqlens.float())
    with pytest.raises(TypeError, match="argument 'cu_seqlens' has dtype torch.int16"):
        scan(cu_seqlens.short())
    with pytest.raises(ValueError, match="argument 'cu_seqlens' is on device meta, expected"):
        scan(cu_seqlens.to("meta"))
    with pytest.raises(ValueError, match=r"argument 'cu_seqlens' is \[1, 2, 5\]: its first value is not 0"):
        scan(torch.tensor([1, 2, 5], device=device))
    with pytest.raises(ValueError, match=r"its last value is 4, not T = 5 \(the length of argument 'b'\)"):
        scan(torch.tensor([0, 2, 4], device=device))
    with pytest.raises(ValueError, match=r"argument 'cu_seqlens' is \[0, 3, 2, 5\]: it decreases"):
        scan(torch.tensor([0, 3, 2, 5], device=device), h0=torch.zeros(3, 4, dtype=DOUBLE, device=device))
    with pytest.raises(ValueError, match=r"argument 'b' has shape \[2, 5, 4\], expected \[1, T, \.\.\.\] with "
                                         "cu_seqlens"):
        scan(cu_seqlens, h0=None, A=A.expand(2, -1, -1), b=b.expand(2, -1, -1))
    with pytest.raises(ValueError, match=r"argument 'h0' has shape \[3, 4\], expected \[2, 4\] \(\[S, N\]"):
        scan(cu_seqlens, h0=torch.zeros(3, 4, dtype=DOUBLE, device=device))
    with pytest.raises(TypeError, match="argument 'h0' has dtype torch.float32, expected torch.float64"):
        scan(cu_seqlens, h0=h0.float())
    with pytest.raises(ValueError, match="argument 'h0' is given with reverse=True"):
        scan(cu_seqlens, reverse=True)


# ---- newton_apply ----------------------------------------------------------------------------------

def packed_inputs(cell, device, lengths=LENGTHS, slots=1):
    T, S = sum(lengths), len(lengths)
    x = (torch.rand(1, T, 3, dtype=DOUBLE, device=device) - 0.5).requires_grad_()
    shape = (S, cell.hidden_size) if slots == 1 else (S, slots, cell.hidden_size)
    h0 = (0.3 * torch.randn(shape, dtype=DOUBLE, device=device)).requires_grad_()
    return x, h0


def solve_each(solve, x, h0, lengths):
    """solve(x_s [1, T_s, ...], h0_s) for each non-empty sequence, concatenated along t."""
    return torch.cat([solve(x[:, start:end], h0[s:s + 1]) for s, (start, end) in enumerate(spans(lengths))
                      if end > start], dim=1)


def user_cell(cell_type, device):
    return cell_type(3, 4).to(device, DOUBLE)


CELL_CASES = {
    "ParaGRU": lambda device: ParaGRU(3, 4).to(device, DOUBLE),
    "DiagonalCell": lambda device: user_cell(DiagonalCell, device),
    "TwoSlotCell": lambda device: user_cell(TwoSlotCell, device),
}


@pytest.mark.parametrize("name", list(CELL_CASES))
def test_packed_newton_equals_each_sequence_alone(device, name):
    cell = CELL_CASES[name](device)
    x, h0 = packed_inputs(cell, device, slots=getattr(cell, "state_slots", 1))
    cu_seqlens = offsets(LENGTHS, device)
    got, stats = newton_apply(cell, x, SOLVE, h0=h0, cu_seqlens=cu_seqlens, return_stats=True)
    assert got.shape[:2] == (1, sum(LENGTHS)) and stats.residual.shape == (len(LENGTHS),)
    loop = (lambda x, h0: gru_loop(cell, x, h0)) if isinstance(cell, ParaGRU) else \
        (lambda x, h0: cell_loop(cell, x, h0))
    expected = solve_each(loop, x, h0, LENGTHS)
    assert (got - expected).abs().max() <= 1e-12
    alone = solve_each(lambda x, h0: newton_apply(cell, x, SOLVE, h0=h0), x, h0, LENGTHS)
    assert (got - alone).abs().max() <= 1e-12
    weight = torch.randn_like(got)
    inputs = [x, h0] + list(cell.parameters())
    for g, e in zip(torch.autograd.grad((got * weight).sum(), inputs),
                    torch.autograd.grad((expected * weight).sum(), inputs)):
        assert torch.allclose(g, e, rtol=1e-9, atol=1e-12)


def test_sequences_are_grouped_by_length_with_bounded_padding():
    """Each non-empty sequence in one group; a group's padded steps within 1 + GROUP_SLACK of its
    steps but the last one's; at most MOST_GROUPS groups; never more than one padded batch."""
    generator = torch.Generator().manual_seed(3)
    skewed = [400] + [8] * 63 + [0]  # one long document among short ones: 25600 padded steps in one batch
    cases = [skewed, [5], [0, 0, 7], LENGTHS] + [
        torch.randint(0, 50, (int(n),), generator=generator).tolist() for n in torch.randint(1, 40, (20,), generator=generator)]
    for lengths in cases:
        groups = length_groups(lengths)
        assert sorted(s for members, _ in groups for s in members) == [s for s, n in enumerate(lengths) if n > 0]
        assert len(groups) <= MOST_GROUPS
        for i, (members, longest) in enumerate(groups):
            assert longest == max(lengths[s] for s in members)
            if i < len(groups) - 1:
                assert len(members) * longest <= (1 + GROUP_SLACK) * sum(lengths[s] for s in members)
        padded = sum(len(members) * longest for members, longest in groups)
        assert padded <= len(lengths) * max(lengths)
    assert sum(len(members) * longest for members, longest in length_groups(skewed)) == sum(skewed)


def test_packed_newton_by_groups_reports_each_sequence(device):
    """Lengths that make three groups: states as each sequence alone, stats per sequence in
    cu_seqlens' order (0 for the empty one), and a divergence named per sequence."""
    cell = ParaGRU(3, 4).to(device, DOUBLE)
    lengths = [9, 1, 0, 2, 2, 5]
    x, h0 = packed_inputs(cell, device, lengths=lengths)
    assert len(length_groups(lengths)) == 3
    cu_seqlens = offsets(lengths, device)
    h, stats = newton_apply(cell, x, NewtonConfig(max_iters=9, scan_backend="fused"), h0=h0, cu_seqlens=cu_seqlens,
                            return_stats=True)
    assert (h - solve_each(lambda x, h0: gru_loop(cell, x, h0), x, h0, lengths)).abs().max() <= 1e-12
    assert stats.residual.shape == (6,) and stats.residual[2] == 0 and stats.residual.max() <= 1e-12
    assert stats.iterations == 9 and stats.backend == "fused"
    # One Newton iteration is exact for the first step of each sequence only (and the residual of a
    # diverged call, from one padded batch, includes each sequence's padding).
    with pytest.raises(NewtonDivergenceError, match=r"batch elements \[0, ") as error:
        newton_apply(cell, x, NewtonConfig(max_iters=1, residual_fail=1e-9, scan_backend="newton"), h0=h0,
                     cu_seqlens=cu_seqlens)
    residual = error.value.residual
    assert residual.shape == (6,) and residual[0] > 1e-9


def test_packed_lstm_equals_each_sequence_alone(device):
    cell = ParaLSTM(3, 4, config=SOLVE).to(device, DOUBLE)
    x, h0 = packed_inputs(cell, device)
    c0 = (0.3 * torch.randn_like(h0)).detach().requires_grad_()
    h, c = cell(x, (h0, c0), return_cell_state=True, cu_seqlens=offsets(LENGTHS, device, torch.int64))
    expected = [torch.cat(parts, dim=1) for parts in zip(*[
        cell.sequential(x[:, start:end], (h0[s:s + 1], c0[s:s + 1]), return_cell_state=True)
        for s, (start, end) in enumerate(spans(LENGTHS)) if end > start])]
    assert (h - expected[0]).abs().max() <= 1e-12 and (c - expected[1]).abs().max() <= 1e-12
    weights = torch.randn_like(h), torch.randn_like(c)
    inputs = [x, h0, c0] + list(cell.parameters())
    got = torch.autograd.grad((h * weights[0]).sum() + (c * weights[1]).sum(), inputs)
    wanted = torch.autograd.grad((expected[0] * weights[0]).sum() + (expected[1] * weights[1]).sum(), inputs)
    for g, e in zip(got, wanted):
        assert torch.allclose(g, e, rtol=1e-9, atol=1e-12)


def test_packed_newton_gradcheck(device):
    cell = ParaGRU(3, 2).to(device, DOUBLE)
    lengths = [2, 0, 1, 3]
    x, h0 = packed_inputs(cell, device, lengths=lengths)
    cu_seqlens = offsets(lengths, device)
    assert torch.autograd.gradcheck(lambda x, h0: cell(x, h0, cu_seqlens=cu_seqlens), (x, h0))


def test_one_packed_newton_sequence_is_the_unpacked_call_bitwise(device):
    lstm = ParaLSTM(3, 4).to(device, DOUBLE)
    for cell in (ParaGRU(3, 4).to(device, DOUBLE), user_cell(TwoSlotCell, device), lstm):
        x, h0 = packed_inputs(cell, device, lengths=[6], slots=getattr(cell, "state_slots", 1))
        state0 = (h0, 2 * h0) if cell is lstm else h0
        extra = dict(return_cell_state=True) if cell is lstm else {}
        packed = newton_apply(cell, x, h0=state0, cu_seqlens=offsets([6], device), **extra)
        unpacked = newton_apply(cell, x, h0=state0, **extra)
        for p, u in zip(packed if cell is lstm else [packed], unpacked if cell is lstm else [unpacked]):
            assert torch.equal(p, u)


@pytest.mark.parametrize("name", ["ParaGRU", "TwoSlotCell"])
def test_no_newton_state_crosses_a_boundary(device, name):
    cell = CELL_CASES[name](device)
    x, h0 = packed_inputs(cell, device, lengths=[4, 5], slots=getattr(cell, "state_slots", 1))
    cu_seqlens = offsets([4, 5], device)
    before = newton_apply(cell, x, SOLVE, h0=h0, cu_seqlens=cu_seqlens)
    perturbed = x.detach().clone()
    perturbed[:, 3] += 1.0
    after = newton_apply(cell, perturbed, SOLVE, h0=h0, cu_seqlens=cu_seqlens)
    assert torch.equal(after[:, 4:], before[:, 4:])
    assert not torch.equal(after[:, 3], before[:, 3])


def test_packed_newton_compiles_without_graph_breaks_given_max_seqlen(device):
    cell = ParaGRU(3, 4).to(device, DOUBLE)
    x, h0 = packed_inputs(cell, device)
    cu_seqlens = offsets(LENGTHS, device)
    cfg = compile_safe_config(6)

    def loss(x, h0, cu_seqlens):
        return newton_apply(cell, x, cfg, h0=h0, cu_seqlens=cu_seqlens, max_seqlen=5).square().sum()
    assert graph_break_count(loss, x, h0, cu_seqlens) == 0
    compiled = torch.compile(loss, fullgraph=True, backend="aot_eager")
    inputs = [x, h0] + list(cell.parameters())
    got = torch.autograd.grad(compiled(x, h0, cu_seqlens), inputs)
    expected = torch.autograd.grad(loss(x, h0, cu_seqlens), inputs)
    # The compiled graph pads once to max_seqlen, eager mode by groups of lengths: the parameters'
    # gradients are sums over other batches, so they agree to rounding.
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, rtol=1e-12, atol=1e-15)
    message = "with no sequence longer than max_seqlen = 5"
    if device == "cpu":
        with pytest.raises(RuntimeError, match=message):
            compiled(x, h0, offsets([3, 1, 0, 6, 0], device))
    else:
        assert_refused_on_cuda(message, """
from paraseq import ParaGRU, compile_safe_config, newton_apply
cell = ParaGRU(3, 4).to("cuda", torch.float64)
solve = torch.compile(lambda x, h0, cu_seqlens: newton_apply(cell, x, compile_safe_config(6), h0=h0,
                                                             cu_seqlens=cu_seqlens, max_seqlen=5),
                      fullgraph=True, backend="aot_eager")
x, h0 = torch.rand(1, 10, 3, dtype=torch.float64, device="cuda"), torch.zeros(5, 4, dtype=torch.float64, device="cuda")
solve(x, h0, torch.tensor([0, 3, 4, 4, 10, 10], dtype=torch.int32, device="cuda"))
""")
    # Without max_seqlen the padded length is read from cu_seqlens' values: a graph break (.item()).
    unbounded = lambda x, h0, cu_seqlens: newton_apply(cell, x, cfg, h0=h0, cu_seqlens=cu_seqlens)
    assert graph_break_count(unbounded, x, h0, cu_seqlens) >= 1
    # Compiled, the padded length comes after the break; the solve is eager mode's to rounding (on CUDA the
    # automatic mode may pick another kernel for the once-padded batch than for eager mode's groups).
    torch.testing.assert_close(torch.compile(unbounded, backend="aot_eager")(x, h0, cu_seqlens),
                               unbounded(x, h0, cu_seqlens), rtol=1e-12, atol=1e-15)


def test_without_max_seqlen_captured_scalars_compile_one_graph(device):
    """With capture_scalar_outputs, T_max is an unbacked SymInt: one graph for every cu_seqlens."""
    cell = ParaGRU(3, 4).to(device, DOUBLE)
    x, h0 = packed_inputs(cell, device)
    cfg = compile_safe_config(6)
    solve = lambda x, h0, cu_seqlens: newton_apply(cell, x, cfg, h0=h0, cu_seqlens=cu_seqlens)
    torch._dynamo.reset()
    with torch._dynamo.config.patch(capture_scalar_outputs=True, error_on_recompile=True):
        compiled = torch.compile(solve, fullgraph=True, backend="aot_eager")
        for lengths in (LENGTHS, [1, 1, 1, 1, 6], [2, 2, 2, 2, 2]):
            cu_seqlens = offsets(lengths, device)
            got, expected = compiled(x, h0, cu_seqlens), solve(x, h0, cu_seqlens)
            torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-15)  # one padded batch, eager groups
            for g, e in zip(torch.autograd.grad(got.sum(), (x, h0)), torch.autograd.grad(expected.sum(), (x, h0))):
                torch.testing.assert_close(g, e, rtol=1e-12, atol=1e-15)


def test_packed_newton_errors_name_the_argument(device):
    cell = ParaGRU(3, 4).to(device, DOUBLE)
    x, h0 = packed_inputs(cell, device, lengths=[2, 3])
    cu_seqlens = offsets([2, 3], device)
    with pytest.raises(ValueError, match=r"argument 'x' has shape \[2, 5, 3\], expected \[1, T, \.\.\.\] with "
                                         "cu_seqlens"):
        cell(x.expand(2, -1, -1), cu_seqlens=cu_seqlens)
    with pytest.raises(ValueError, match=r"argument 'x' has shape \[1, 5, 2\], expected \[1, T, 3\]"):
        cell(x[..., :2], cu_seqlens=cu_seqlens)
    with pytest.raises(TypeError, match="argument 'cu_seqlens' has dtype torch.float64"):
        cell(x, cu_seqlens=cu_seqlens.double())
    with pytest.raises(ValueError, match=r"argument 'cu_seqlens' has shape \[2, 1\]"):
        cell(x, cu_seqlens=torch.tensor([[0], [5]], device=device))
    with pytest.raises(ValueError, match="argument 'cu_seqlens' is on device meta"):
        cell(x, cu_seqlens=cu_seqlens.to("meta"))
    with pytest.raises(ValueError, match="its first value is not 0"):
        cell(x, cu_seqlens=torch.tensor([2, 5], device=device))
    with pytest.raises(ValueError, match=r"its last value is 6, not T = 5 \(the length of argument 'x'\)"):
        cell(x, cu_seqlens=torch.tensor([0, 2, 6], device=device))
    with pytest.raises(ValueError, match="it decreases"):
        cell(x, cu_seqlens=torch.tensor([0, 3, 2, 5], device=device))
    with pytest.raises(ValueError, match=r"argument 'h0' has shape \[3, 4\], expected \[2, \.\.\.\] "
                                         r"\(\[S, hidden_size\]"):
        cell(x, torch.zeros(3, 4, dtype=DOUBLE, device=device), cu_seqlens=cu_seqlens)
    with pytest.raises(ValueError, match=r"argument 'h0\[1\]' has shape \[1, 4\], expected \[2, \.\.\.\]"):
        ParaLSTM(3, 4).to(device, DOUBLE)(x, (h0, h0[:1]), cu_seqlens=cu_seqlens)
    with pytest.raises(ValueError, match="argument 'max_seqlen' is 2, but the longest sequence of cu_seqlens has 3 "
                                         "steps"):
        cell(x, cu_seqlens=cu_seqlens, max_seqlen=2)
    with pytest.raises(TypeError, match="argument 'max_seqlen' is 3.0, expected None or an int >= 0"):
        cell(x, cu_seqlens=cu_seqlens, max_seqlen=3.0)
    with pytest.raises(ValueError, match="argument 'max_seqlen' is -1"):
        cell(x, cu_seqlens=cu_seqlens, max_seqlen=-1)
    with pytest.raises(ValueError, match="argument 'max_seqlen' is 3 without cu_seqlens"):
        cell(x, max_seqlen=3)
    with pytest.raises(ValueError, match=r"argument 'h0' has shape \[2, 3\], expected \[2, 4\]"):
        cell(x, h0[:, :3], cu_seqlens=cu_seqlens)


def test_a_larger_max_seqlen_only_adds_padding(device):
    cell = user_cell(DiagonalCell, device)
    x, h0 = packed_inputs(cell, device)
    cu_seqlens = offsets(LENGTHS, device)
    tight = newton_apply(cell, x, SOLVE, h0=h0, cu_seqlens=cu_seqlens)
    loose = newton_apply(cell, x, SOLVE, h0=h0, cu_seqlens=cu_seqlens, max_seqlen=9)
    assert (tight - loose).abs().max() <= 1e-14
