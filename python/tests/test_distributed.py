"""Sequence parallelism (process_group=): linear_scan and newton_apply over gloo ranks, each rank
holding a slice of the time axis, against the single-process results computed here (float64,
1e-12), forward and backward; uneven and empty slices; determinism; the errors every rank raises.

One spawn of four CPU processes runs every case (a spawn costs seconds of imports): the 2-rank
cases run on the subgroups {0, 1} and {2, 3} at once (the second pair's group ranks are not its
global ranks), the 4-rank cases on the whole world. Each rank saves what it computed; the tests
below compare the slices, put back in rank order, with the single-process results.
"""

import math
import os
import time
import traceback
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import paraseq
from paraseq import NewtonConfig, ParaGRU, ParaLSTM, linear_scan, newton_apply
from test_user_functions import DenseGRU, DiagonalCell, TwoSlotCell

WORLD = 4
RUN_TIMEOUT_S = 150  # the whole spawned run; each collective also times out (init_process_group)
COLLECTIVE_TIMEOUT_S = 60
TOL = 1e-12

SCAN_T = 7
SCAN_SPLITS = {"pair": [(3, 4)], "world": [(2, 0, 3, 2), (0, 3, 2, 2), (3, 2, 2, 0)]}
NEWTON_T = 6
NEWTON_SPLITS = {"pair": [(2, 4)], "world": [(2, 0, 3, 1), (0, 2, 2, 2), (2, 2, 2, 0)]}
STRUCTURES = ("diag", "block", "dense")
USER_CELLS = {"dense": DenseGRU, "diag": DiagonalCell, "block2": TwoSlotCell}
USER_CONFIG = NewtonConfig(max_iters=3, residual_fail=None)  # not converged: the iterations themselves must agree
EARLY_STOP_CONFIG = NewtonConfig(max_iters=20, picard_iters=1, residual_atol=1e-9)
QUASI_CONFIG = NewtonConfig(max_iters=3, residual_fail=None, jacobian="quasi")  # not converged


# ---- the cases, built alike in every process ------------------------------------------------------

def scan_case(structure, reverse, seed):
    """A, b, h0 (None for reverse) and the loss weights w, global: [B, T, ...]."""
    g = torch.Generator().manual_seed(seed)
    B, N, T = 2, 4, SCAN_T
    shape = {"diag": (B, T, N), "block": (B, T, N // 2, 2, 2), "dense": (B, T, N, N)}[structure]
    A = (torch.rand(shape, generator=g, dtype=torch.float64) - 0.5) * (1.6 if structure == "diag" else 0.8)
    b = torch.randn(B, T, N, generator=g, dtype=torch.float64)
    h0 = None if reverse else torch.randn(B, N, generator=g, dtype=torch.float64)
    w = torch.randn(B, T, N, generator=g, dtype=torch.float64)
    return A, b, h0, w


def user_cell_case(kind, seed):
    torch.manual_seed(seed)
    cell = USER_CELLS[kind](3, 3).to(torch.float64)
    slots = getattr(cell, "state_slots", 1)
    g = torch.Generator().manual_seed(seed + 1)
    x = torch.rand(2, NEWTON_T, 3, generator=g, dtype=torch.float64) - 0.5
    state = (2, 3) if slots == 1 else (2, slots, 3)
    h0 = 0.5 * torch.randn(state, generator=g, dtype=torch.float64)
    w = torch.randn(2, NEWTON_T, *state[1:], generator=g, dtype=torch.float64)
    return cell, x, h0, w


def builtin_case(kind, seed):
    torch.manual_seed(seed)
    cell = (ParaGRU if kind == "gru" else ParaLSTM)(3, 4).to(torch.float64)
    cell.config = NewtonConfig(max_iters=NEWTON_T + 2)  # converged: both solves give the solution to rounding
    g = torch.Generator().manual_seed(seed + 1)
    x = torch.rand(2, NEWTON_T, 3, generator=g, dtype=torch.float64) - 0.5
    h0 = 0.5 * torch.randn(2, 4, generator=g, dtype=torch.float64)
    h0 = h0 if kind == "gru" else (h0, 0.3 * torch.randn(2, 4, generator=g, dtype=torch.float64))
    w = torch.randn(2, NEWTON_T, 4, generator=g, dtype=torch.float64)
    return cell, x, h0, w


def stiff_gru():
    """Recurrent weights of +-50: three Newton iterations from the default guess diverge."""
    torch.manual_seed(40)
    cell = ParaGRU(3, 4, config=NewtonConfig(max_iters=3)).to(torch.float64)
    with torch.no_grad():
        cell.recurrent.copy_(50 * torch.randn(3, 4).sign())
    return cell, torch.randn(2, 32, 3, dtype=torch.float64)


def piece(tensor, split, group_rank):
    start = sum(split[:group_rank])
    return tensor[:, start:start + split[group_rank]]


def leaf(tensor):
    return tensor.detach().clone().requires_grad_()


def grads(tensors):
    return [t.grad.clone() if t.grad is not None else None for t in tensors]


# ---- what each rank runs ---------------------------------------------------------------------------

def run_scan(group, structure, reverse, split, seed):
    me = dist.get_rank(group)
    A, b, h0, w = scan_case(structure, reverse, seed)
    A_r, b_r = leaf(piece(A, split, me)), leaf(piece(b, split, me))
    h0_r = leaf(h0) if h0 is not None and me == 0 else None
    h = linear_scan(A_r, b_r, h0_r, structure, reverse, process_group=group)
    (h * piece(w, split, me)).sum().backward()
    return {"h": h.detach(), "grad_A": A_r.grad, "grad_b": b_r.grad,
            "grad_h0": h0_r.grad if h0_r is not None else None}


def run_scan_h0_only(group, split):
    """Only group rank 0's h0 requires grad: the other ranks' results must require grad too, so that
    their backward joins the collective one."""
    me = dist.get_rank(group)
    A, b, h0, w = scan_case("block", False, 12)
    h0_r = leaf(h0) if me == 0 else None
    h = linear_scan(piece(A, split, me), piece(b, split, me), h0_r, "block", process_group=group)
    return backward_through(h, piece(w, split, me), h0_r)


def run_newton_h0_only(group, split):
    """The same for a Newton solve of a cell whose parameters are frozen, x without grad."""
    me = dist.get_rank(group)
    cell, x, h0, w = user_cell_case("block2", 22)
    cell.requires_grad_(False)
    h0_r = leaf(h0) if me == 0 else None
    h = newton_apply(cell, piece(x, split, me), USER_CONFIG, h0=h0_r, process_group=group)
    return backward_through(h, piece(w, split, me), h0_r)


def backward_through(h, weight, h0_r):
    """Whether this rank's h requires grad, and h0's gradient after the collective backward of
    sum(h * weight)."""
    requires_grad = h.requires_grad
    (h * weight).sum().backward()
    return {"requires_grad": requires_grad, "grad_h0": h0_r.grad if h0_r is not None else None}


def run_early_stop(group, split):
    """picard_iters and residual_atol's early stop, decided on the maximum over the ranks."""
    me = dist.get_rank(group)
    cell, x, h0, _ = user_cell_case("dense", 23)
    return newton_apply(cell, piece(x, split, me), EARLY_STOP_CONFIG, h0=h0 if me == 0 else None,
                        process_group=group)


def run_quasi(group, kind, split):
    """The quasi Jacobian's iterations: distributed diagonal scans."""
    me = dist.get_rank(group)
    cell, x, h0, _ = user_cell_case(kind, 24)
    return newton_apply(cell, piece(x, split, me), QUASI_CONFIG, h0=h0 if me == 0 else None, process_group=group)


def run_half(group, dtype, split):
    me = dist.get_rank(group)
    A, b, h0, _ = scan_case("dense", False, 14)
    A, b, h0 = A.to(dtype), b.to(dtype), h0.to(dtype)
    return linear_scan(piece(A, split, me), piece(b, split, me), h0 if me == 0 else None, "dense",
                       process_group=group)


def run_second_derivative(group):
    """grad_b depends on A: a second derivative through it must raise, not drop that dependence."""
    A, b, h0, w = scan_case("diag", False, 13)
    A, b = leaf(A[:, :3]), leaf(b[:, :3])
    h = linear_scan(A, b, process_group=group)
    (grad_b,) = torch.autograd.grad((h * w[:, :3]).sum(), b, create_graph=True)
    return caught(lambda: grad_b.square().sum().backward())


def run_newton(group, cell, x, h0, w, split, gru_or_lstm=False):
    me = dist.get_rank(group)
    x_r = leaf(piece(x, split, me))
    if me == 0:
        h0_r = tuple(leaf(t) for t in h0) if isinstance(h0, tuple) else leaf(h0)
    else:
        h0_r = None
    residual = None
    if gru_or_lstm:
        h = cell(x_r, h0_r, process_group=group)
    else:
        h, stats = newton_apply(cell, x_r, USER_CONFIG, h0=h0_r, return_stats=True, process_group=group)
        residual = stats.residual
    (h * piece(w, split, me)).sum().backward()
    h0_leaves = (h0_r if isinstance(h0_r, tuple) else (h0_r,)) if h0_r is not None else ()
    return {"h": h.detach(), "grad_x": x_r.grad, "grad_h0": grads(h0_leaves),
            "grad_params": grads(list(cell.parameters())), "residual": residual}


def caught(function):
    """(exception type name, message): every rank records what it raised."""
    try:
        function()
    except Exception as error:  # noqa: BLE001 (the tests check the type)
        return type(error).__name__, str(error)
    return None, None


def run_errors(group):
    me = dist.get_rank(group)
    A, b, h0, _ = scan_case("diag", False, 5)
    A, b = A[:, :3], b[:, :3]
    errors = {}
    errors["B"] = caught(lambda: linear_scan(A[:1 + me], b[:1 + me], process_group=group))
    errors["N"] = caught(lambda: linear_scan(A[..., :3 + me], b[..., :3 + me], process_group=group))
    errors["dtype"] = caught(lambda: linear_scan(A.float() if me else A, b.float() if me else b,
                                                 process_group=group))
    dense = torch.eye(4, dtype=torch.float64).expand(2, 3, 4, 4)
    errors["structure"] = caught(lambda: linear_scan(dense if me else A, b, structure="dense" if me else "diag",
                                                     process_group=group))
    errors["reverse"] = caught(lambda: linear_scan(A, b, reverse=bool(me), process_group=group))
    errors["h0"] = caught(lambda: linear_scan(A, b, h0, process_group=group))

    def grad_mode_differs():
        with torch.set_grad_enabled(me == 0):
            linear_scan(leaf(A), b, process_group=group)
    errors["grad_mode"] = caught(grad_mode_differs)
    errors["shape"] = caught(lambda: linear_scan(A, b[0] if me else b, process_group=group))
    errors["group"] = caught(lambda: linear_scan(A, b, process_group="world"))
    cell, x, h0_cell, _ = user_cell_case("diag", 6)
    errors["cfg"] = caught(lambda: newton_apply(cell, x, NewtonConfig(max_iters=2 + me), process_group=group))
    errors["jacobian"] = caught(lambda: newton_apply(cell, x, NewtonConfig(jacobian="quasi" if me else "exact"),
                                                     process_group=group))
    errors["newton_h0"] = caught(lambda: newton_apply(cell, x, h0=h0_cell, process_group=group))
    gru, x_gru, _, _ = builtin_case("gru", 7)
    diverging, x_stiff = stiff_gru()
    # Diverges on group rank 0's slice; the others have none, and raise too.
    errors["diverged"] = caught(lambda: newton_apply(diverging, x_stiff if me == 0 else x_stiff[:, :0],
                                                     process_group=group))
    errors["fused"] = caught(lambda: newton_apply(gru, x_gru, NewtonConfig(scan_backend="fused"), process_group=group))
    head_gru = ParaGRU(3, 4, mix="head", n_heads=2).to(torch.float64)
    errors["head"] = caught(lambda: newton_apply(head_gru, x_gru, process_group=group))
    # After all of these the group still works: every rank raised after the same collectives.
    errors["after"] = linear_scan(A, b, process_group=group).sum().item()
    return errors


def rank_cases(group, name):
    """Every case for one group ('pair' or 'world')."""
    results = {}
    for split_index, split in enumerate(SCAN_SPLITS[name]):
        for structure in STRUCTURES:
            for reverse in (False, True):
                results[("scan", structure, reverse, split_index)] = run_scan(group, structure, reverse, split, 10)
    for split_index, split in enumerate(NEWTON_SPLITS[name]):
        for kind in USER_CELLS:
            results[("user", kind, split_index)] = run_newton(group, *user_cell_case(kind, 20), split)
        for kind in ("gru", "lstm"):
            results[("builtin", kind, split_index)] = run_newton(group, *builtin_case(kind, 30), split, True)
    results["h0_only_scan"] = run_scan_h0_only(group, SCAN_SPLITS[name][1 if name == "world" else 0])
    results["h0_only_newton"] = run_newton_h0_only(group, NEWTON_SPLITS[name][1 if name == "world" else 0])
    results["second_derivative"] = run_second_derivative(group)
    results["early_stop"] = run_early_stop(group, NEWTON_SPLITS[name][0])
    for kind in ("dense", "block2"):
        results[("quasi", kind)] = run_quasi(group, kind, NEWTON_SPLITS[name][0])
    for dtype in (torch.float32, torch.bfloat16):
        results[("half", dtype)] = run_half(group, dtype, SCAN_SPLITS[name][0])
    split = SCAN_SPLITS[name][0]
    results["repeat_scan"] = [run_scan(group, "dense", False, split, 11) for _ in range(2)]
    results["repeat_newton"] = [run_newton(group, *user_cell_case("dense", 21), NEWTON_SPLITS[name][0])
                                for _ in range(2)]
    results["errors"] = run_errors(group)
    return results


def all_cases(rank):
    pairs = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    return {"pair": rank_cases(pairs[rank // 2], "pair"), "world": rank_cases(dist.group.WORLD, "world")}


def worker(rank, world, cases, init_file, out_dir):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world, init_method=f"file://{init_file}",
                            timeout=timedelta(seconds=COLLECTIVE_TIMEOUT_S))
    try:
        torch.save(cases(rank), os.path.join(out_dir, f"rank{rank}.pt"))
    except BaseException:
        with open(os.path.join(out_dir, f"rank{rank}.error"), "w") as file:
            file.write(traceback.format_exc())
        raise
    finally:
        dist.destroy_process_group()


def spawn(out_dir, world, cases, timeout_s):
    """Runs cases(rank) on world gloo ranks; [the results of rank 0, 1, ...]."""
    saved = {name: os.environ.get(name) for name in ("OMP_NUM_THREADS", "OMP_PROC_BIND")}
    os.environ["OMP_NUM_THREADS"], os.environ["OMP_PROC_BIND"] = "1", "false"  # several processes on few cores
    try:
        context = mp.start_processes(worker, args=(world, cases, str(out_dir / "init"), str(out_dir)), nprocs=world,
                                     join=False, start_method="spawn")
    finally:
        for name, value in saved.items():
            os.environ.pop(name, None) if value is None else os.environ.__setitem__(name, value)
    deadline = time.monotonic() + timeout_s
    finished = False
    try:
        # join() returns as each process ends (False while others run) and raises when one failed.
        while not finished and time.monotonic() < deadline:
            finished = context.join(timeout=max(deadline - time.monotonic(), 0.1))
    except mp.ProcessRaisedException as error:
        pytest.fail(f"a rank raised:\n{error}")
    except mp.ProcessExitedException as error:
        reports = "\n".join(path.read_text() for path in sorted(out_dir.glob("*.error")))
        pytest.fail(f"a rank exited: {error}\n{reports}")
    if not finished:
        for process in context.processes:
            process.terminate()
        pytest.fail(f"the ranks did not finish within {timeout_s} s (a collective that some rank never joined?)")
    return [torch.load(out_dir / f"rank{rank}.pt", weights_only=False) for rank in range(world)]


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    """Spawns the four ranks once; [results of global rank 0, 1, 2, 3]."""
    return spawn(tmp_path_factory.mktemp("ranks"), WORLD, all_cases, RUN_TIMEOUT_S)


def groups(ranks):
    """(name, [per-group-rank results]) for each group that ran: the two pairs and the world."""
    return [("pair", [ranks[0]["pair"], ranks[1]["pair"]]), ("pair", [ranks[2]["pair"], ranks[3]["pair"]]),
            ("world", [r["world"] for r in ranks])]


def joined(per_rank, key, field):
    return torch.cat([r[key][field] for r in per_rank], dim=1)


def assert_close(actual, expected, what):
    assert actual.shape == expected.shape, what
    error = (actual - expected).abs().max().item() if actual.numel() else 0.0
    assert error <= TOL * max(1.0, expected.abs().max().item()), f"{what}: max error {error:.3g}"


# ---- the tests -------------------------------------------------------------------------------------

@pytest.mark.parametrize("structure", STRUCTURES)
@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reverse"])
def test_distributed_scan_equals_one_process(ranks, structure, reverse):
    A, b, h0, w = scan_case(structure, reverse, 10)
    A, b = leaf(A), leaf(b)
    h0 = leaf(h0) if h0 is not None else None
    h = linear_scan(A, b, h0, structure, reverse)
    (h * w).sum().backward()
    for name, per_rank in groups(ranks):
        for split_index, split in enumerate(SCAN_SPLITS[name]):
            key = ("scan", structure, reverse, split_index)
            what = f"{name} split {split}"
            assert_close(joined(per_rank, key, "h"), h.detach(), f"h, {what}")
            assert_close(joined(per_rank, key, "grad_A"), A.grad, f"grad A, {what}")
            assert_close(joined(per_rank, key, "grad_b"), b.grad, f"grad b, {what}")
            if h0 is not None:  # h0 is group rank 0's, also when its slice is empty
                assert_close(per_rank[0][key]["grad_h0"], h0.grad, f"grad h0, {what}")
                assert all(r[key]["grad_h0"] is None for r in per_rank[1:])


@pytest.mark.parametrize("kind", list(USER_CELLS))
def test_distributed_newton_of_a_user_cell_equals_one_process(ranks, kind):
    cell, x, h0, w = user_cell_case(kind, 20)
    x, h0 = leaf(x), leaf(h0)
    h, stats = newton_apply(cell, x, USER_CONFIG, h0=h0, return_stats=True, compile=False)
    residual = stats.residual
    (h * w).sum().backward()
    params = [p.grad for p in cell.parameters()]
    check_newton(ranks, ("user", kind), h.detach(), x.grad, [h0.grad], params)
    for _, per_rank in groups(ranks):  # the residual is the maximum over the ranks: every rank has all of it
        for r in per_rank:
            assert_close(r[("user", kind, 0)]["residual"], residual, "residual")


@pytest.mark.parametrize("kind", ["gru", "lstm"])
def test_distributed_paragru_and_paralstm_equal_their_operators(ranks, kind):
    """Under process_group the built-in cells take the general path; converged, it gives the C++
    operators' solution and gradients."""
    cell, x, h0, w = builtin_case(kind, 30)
    x = leaf(x)
    h0 = tuple(leaf(t) for t in h0) if isinstance(h0, tuple) else leaf(h0)
    h = cell(x, h0)
    (h * w).sum().backward()
    h0_grads = [t.grad for t in h0] if isinstance(h0, tuple) else [h0.grad]
    check_newton(ranks, ("builtin", kind), h.detach(), x.grad, h0_grads, [p.grad for p in cell.parameters()])


def check_newton(ranks, prefix, h, grad_x, grad_h0, grad_params):
    for name, per_rank in groups(ranks):
        for split_index, split in enumerate(NEWTON_SPLITS[name]):
            key = (*prefix, split_index)
            what = f"{name} split {split}"
            assert_close(joined(per_rank, key, "h"), h, f"h, {what}")
            assert_close(joined(per_rank, key, "grad_x"), grad_x, f"grad x, {what}")
            for got, expected in zip(per_rank[0][key]["grad_h0"], grad_h0, strict=True):
                assert_close(got, expected, f"grad h0, {what}")
            # Each rank holds its slice's part of a parameter's gradient: their sum is the gradient.
            for index, expected in enumerate(grad_params):
                total = sum(r[key]["grad_params"][index] for r in per_rank)
                assert_close(total, expected, f"grad of parameter {index}, {what}")


def test_distributed_results_are_bitwise_repeatable(ranks):
    for _, per_rank in groups(ranks):
        for r in per_rank:
            for key in ("repeat_scan", "repeat_newton"):
                first, second = r[key]
                for field in ("h", "grad_x", "grad_A", "grad_b"):
                    if field in first:
                        assert torch.equal(first[field], second[field]), (key, field)


def test_gradients_reach_h0_when_only_rank_0_requires_grad(ranks):
    A, b, h0, w = scan_case("block", False, 12)
    h0 = leaf(h0)
    (linear_scan(A, b, h0, "block") * w).sum().backward()
    cell, x, h0_cell, w_cell = user_cell_case("block2", 22)
    cell.requires_grad_(False)
    h0_cell = leaf(h0_cell)
    (newton_apply(cell, x, USER_CONFIG, h0=h0_cell, compile=False) * w_cell).sum().backward()
    for _, per_rank in groups(ranks):  # the world's split has an empty slice on rank 0
        for key, expected in (("h0_only_scan", h0.grad), ("h0_only_newton", h0_cell.grad)):
            assert all(r[key]["requires_grad"] for r in per_rank), key
            assert_close(per_rank[0][key]["grad_h0"], expected, key)


def test_early_stop_and_picard_sweeps_agree_with_one_process(ranks):
    cell, x, h0, _ = user_cell_case("dense", 23)
    expected = newton_apply(cell, x, EARLY_STOP_CONFIG, h0=h0, compile=False)
    for name, per_rank in groups(ranks):
        assert_close(torch.cat([r["early_stop"] for r in per_rank], dim=1), expected, name)


@pytest.mark.parametrize("kind", ["dense", "block2"])
def test_quasi_iterations_agree_with_one_process(ranks, kind):
    cell, x, h0, _ = user_cell_case(kind, 24)
    expected = newton_apply(cell, x, QUASI_CONFIG, h0=h0, compile=False)
    exact = newton_apply(cell, x, NewtonConfig(max_iters=3, residual_fail=None), h0=h0, compile=False)
    assert (expected - exact).abs().max() > 1e-6  # the quasi iterates are not the exact ones
    for name, per_rank in groups(ranks):
        assert_close(torch.cat([r[("quasi", kind)] for r in per_rank], dim=1), expected, name)


@pytest.mark.parametrize("dtype, tolerance", [(torch.float32, 1e-5), (torch.bfloat16, 3e-2)])
def test_float32_and_bfloat16_scans_agree_with_one_process(ranks, dtype, tolerance):
    """Half types: the maps are combined in float32; the state entering each rank is rounded to the
    stored dtype once (one process carries it in float32), hence the bfloat16 tolerance."""
    A, b, h0, _ = scan_case("dense", False, 14)
    reference = linear_scan(A, b, h0, "dense")  # float64
    single = linear_scan(A.to(dtype), b.to(dtype), h0.to(dtype), "dense").double()
    for name, per_rank in groups(ranks):
        got = torch.cat([r[("half", dtype)] for r in per_rank], dim=1)
        assert got.dtype == dtype
        scale = reference.abs().max().item()
        assert (got.double() - reference).abs().max().item() <= tolerance * scale, name
        assert (got.double() - single).abs().max().item() <= tolerance * scale, name


def test_second_derivatives_of_a_distributed_scan_raise(ranks):
    for _, per_rank in groups(ranks):
        for r in per_rank:
            kind, message = r["second_derivative"]
            assert kind == "NotImplementedError" and "the gradient of a distributed scan (process_group) is not " \
                "differentiable" in message, (kind, message)


def test_mismatched_ranks_raise_on_every_rank(ranks):
    expected = {
        "B": ("ValueError", "argument 'b' has batch size B 1 on group rank 0, 2 on group rank 1"),
        "N": ("ValueError", "argument 'b' has state size N 3 on group rank 0, 4 on group rank 1"),
        "dtype": ("TypeError", "argument 'b' has dtype torch.float64 on group rank 0, torch.float32 on group rank 1"),
        "structure": ("ValueError", "argument 'structure' has value 'diag' on group rank 0, 'dense' on group rank 1"),
        "reverse": ("ValueError", "argument 'reverse' has value False on group rank 0, True on group rank 1"),
        "h0": ("ValueError", "argument 'h0' is given on group rank(s) [1]"),
        "grad_mode": ("RuntimeError", "torch.is_grad_enabled() is True on group rank 0, False on group rank 1"),
        "cfg": ("ValueError", "argument 'cfg' has max_iters 2 on group rank 0, 3 on group rank 1"),
        "jacobian": ("ValueError", "argument 'cfg' has jacobian 'exact' on group rank 0, 'quasi' on group rank 1"),
        "newton_h0": ("ValueError", "argument 'h0' is given on group rank(s) [1]"),
        "fused": ("ValueError", "argument 'cfg' has scan_backend 'fused'"),
        "head": ("NotImplementedError", "argument 'cell' is a ParaGRU with mix='head' and 'process_group' is given"),
        "diverged": ("NewtonDivergenceError", "the Newton solve did not converge"),
        "group": ("TypeError", "argument 'process_group' is a builtins.str, expected a torch.distributed.ProcessGroup"),
    }
    for _, per_rank in groups(ranks)[:2]:
        for r in per_rank:
            errors = r["errors"]
            for case, (kind, text) in expected.items():
                assert errors[case][0] == kind and text in errors[case][1], (case, errors[case])
            assert math.isfinite(errors["after"])  # the group still runs a scan afterwards
    # A rank whose own arguments are refused raises its own error; the others name that rank.
    pair = groups(ranks)[0][1]
    assert pair[1]["errors"]["shape"][0] == "ValueError" and "argument 'b' has shape [3, 4]" in \
        pair[1]["errors"]["shape"][1]
    assert pair[0]["errors"]["shape"] == ("ValueError", "linear_scan: the arguments of group rank(s) [1] were "
                                          "refused there (their error names the argument); nothing was computed")


def test_process_group_without_torch_distributed_initialised():
    assert not dist.is_initialized()
    A, b = torch.rand(1, 2, 3), torch.rand(1, 2, 3)
    with pytest.raises(RuntimeError, match="argument 'process_group' is given, but torch.distributed is not "
                                           "initialised"):
        linear_scan(A, b, process_group=object())
    with pytest.raises(RuntimeError, match="torch.distributed is not initialised"):
        newton_apply(ParaGRU(3, 3), b, process_group=object())
    assert paraseq.linear_scan(A, b, process_group=None).shape == b.shape


# ---- torch.compile -----------------------------------------------------------------------------------
# Two more ranks, spawned once: each traces the calls with torch._dynamo.explain (graphs and breaks) and
# runs them compiled with fullgraph=True (the aot_eager backend: AOTAutograd with the fake kernels and
# the registered backward, no code generation) and eagerly, forward and backward.

COMPILE_WORLD = 2
COMPILE_TIMEOUT_S = 300
COMPILE_SCAN_SPLIT = (3, 4)
COMPILE_NEWTON_SPLIT = (2, 4)
COMPILED_CALLS = ("scan", "scan_reverse_dense", "user_diag", "user_dense", "gru")


def graph_counts(function, *args):
    """(graphs, graph breaks, the reasons of the breaks) of function(*args) under torch.compile."""
    torch._dynamo.reset()
    explained = torch._dynamo.explain(function)(*args)
    return explained.graph_count, explained.graph_break_count, [str(reason.reason) for reason in explained.break_reasons]


def eager_and_compiled(function, inputs, weight, params=(), backend="aot_eager"):
    """{"eager": ..., "compiled": ...}: h and the gradients of sum(h * weight) with respect to the inputs
    that require grad, then params (this rank's part), from function and its fullgraph compilation."""
    compiled = torch.compile(function, fullgraph=True, backend=backend)
    runs = {}
    for name, run in (("eager", function), ("compiled", compiled)):
        leaves = [t.detach().clone().requires_grad_(t.requires_grad) if t is not None else None for t in inputs]
        for p in params:
            p.grad = None
        h = run(*leaves)
        (h * weight).sum().backward()
        runs[name] = {"h": h.detach(), "grads": [t.grad for t in leaves if t is not None and t.requires_grad],
                      "param_grads": [p.grad.clone() for p in params]}
    return runs


def compiled_cases(rank):
    group = dist.group.WORLD
    results = {}
    maybe_h0 = lambda h0: leaf(h0) if rank == 0 else None
    A, b, h0, w = scan_case("diag", False, 15)
    A_r, b_r, w_r = (piece(t, COMPILE_SCAN_SPLIT, rank) for t in (A, b, w))
    scan = lambda A, b, h0: linear_scan(A, b, h0, "diag", process_group=group)
    results["graphs", "scan"] = graph_counts(scan, A_r, b_r, h0 if rank == 0 else None)
    results["graphs", "scan with grad"] = graph_counts(scan, leaf(A_r), leaf(b_r), maybe_h0(h0))
    results["scan"] = eager_and_compiled(scan, [leaf(A_r), leaf(b_r), maybe_h0(h0)], w_r)
    # Inputs that require grad on group rank 0 only: eager handles it, a compiled graph refuses on every rank.
    results["grads on one rank"] = caught(lambda: torch.compile(scan, fullgraph=True, backend="aot_eager")(
        A_r, b_r, maybe_h0(h0)))

    A, b, _, w = scan_case("dense", True, 16)
    A_r, b_r, w_r = (piece(t, COMPILE_SCAN_SPLIT, rank) for t in (A, b, w))
    reverse = lambda A, b: linear_scan(A, b, None, "dense", True, process_group=group)
    results["graphs", "scan reverse dense with grad"] = graph_counts(reverse, leaf(A_r), leaf(b_r))
    results["scan_reverse_dense"] = eager_and_compiled(reverse, [leaf(A_r), leaf(b_r)], w_r)

    for kind in ("diag", "dense"):
        cell, x, h0, w = user_cell_case(kind, 25)
        x_r, w_r = piece(x, COMPILE_NEWTON_SPLIT, rank), piece(w, COMPILE_NEWTON_SPLIT, rank)
        newton = lambda x, h0, cell=cell: newton_apply(cell, x, USER_CONFIG, h0=h0, process_group=group)
        results["graphs", f"user {kind} with grad"] = graph_counts(newton, leaf(x_r), maybe_h0(h0))
        results[f"user_{kind}"] = eager_and_compiled(newton, [leaf(x_r), maybe_h0(h0)], w_r, list(cell.parameters()))
    # The default backend, inductor, reorders operators that do not depend on each other's results:
    # the collectives must still pair up across ranks (group rank 0's graph differs, it takes h0).
    results["inductor"] = eager_and_compiled(newton, [leaf(x_r), maybe_h0(h0)], w_r, list(cell.parameters()),
                                             backend="inductor")

    cell, x, h0, w = builtin_case("gru", 31)
    x_r, w_r = piece(x, COMPILE_NEWTON_SPLIT, rank), piece(w, COMPILE_NEWTON_SPLIT, rank)
    gru = lambda x, h0: cell(x, h0, process_group=group)
    results["graphs", "ParaGRU"] = graph_counts(gru, x_r, h0 if rank == 0 else None)
    results["graphs", "ParaGRU with grad"] = graph_counts(gru, leaf(x_r), maybe_h0(h0))
    results["gru"] = eager_and_compiled(gru, [leaf(x_r), maybe_h0(h0)], w_r, list(cell.parameters()))
    lstm, x, (h0, c0), _ = builtin_case("lstm", 32)
    state0 = (leaf(h0), leaf(c0)) if rank == 0 else None
    results["graphs", "ParaLSTM with grad"] = graph_counts(lambda x, state0: lstm(x, state0, process_group=group),
                                                           leaf(piece(x, COMPILE_NEWTON_SPLIT, rank)), state0)

    # Only group rank 0's h0 requires grad (the cell frozen): a compiled graph refuses on every rank.
    frozen, x, h0, _ = user_cell_case("block2", 22)
    frozen.requires_grad_(False)
    results["adjoint on one rank"] = caught(lambda: torch.compile(
        lambda x, h0: newton_apply(frozen, x, USER_CONFIG, h0=h0, process_group=group), fullgraph=True,
        backend="aot_eager")(piece(x, COMPILE_NEWTON_SPLIT, rank), maybe_h0(h0)))

    # residual_atol is eager-only: a compiled graph runs max_iters iterations.
    cell, x, h0, _ = user_cell_case("dense", 23)
    x_r = piece(x, COMPILE_NEWTON_SPLIT, rank)
    results["early stop config"] = torch.compile(
        lambda x: newton_apply(cell, x, EARLY_STOP_CONFIG, h0=h0 if rank == 0 else None, process_group=group),
        fullgraph=True, backend="aot_eager")(x_r)

    results["opcheck"] = opchecks(rank, group)
    return results


def opchecks(rank, group):
    """torch.library.opcheck of each distributed operator (its schema, fake kernel, autograd registration
    and AOT dispatch, each running the collective on every rank alike): (error type, message) or (None, None)."""
    from paraseq import _distributed
    A, b, h0, w = scan_case("block", False, 17)
    A_r, b_r = piece(A, COMPILE_SCAN_SPLIT, rank), piece(b, COMPILE_SCAN_SPLIT, rank)
    h0_r = leaf(h0) if rank == 0 else None
    name = group.group_name
    h, entering, _, _ = _distributed.distributed_linear_scan(A_r, b_r, h0_r, None, "block", False, name, True, True,
                                                             False, False)
    row = _distributed.agreement_row(None, [2, 4, 0, 0, 1, 2, 0], A_r.shape[1], rank == 0, True, True)
    rows = _distributed.distributed_agree(row, "linear_scan", name, False)
    checks = {
        "distributed_linear_scan": (_distributed.distributed_linear_scan,
                                    (leaf(A_r), leaf(b_r), h0_r, None, "block", False, name, True, True, True, True)),
        "distributed_linear_scan_backward": (_distributed.distributed_linear_scan_backward,
                                             (A_r, h.detach(), entering, piece(w, COMPILE_SCAN_SPLIT, rank), "block",
                                              False, name)),
        "distributed_agree": (_distributed.distributed_agree, (row, "linear_scan", name, True)),
        "distributed_boundary": (_distributed.distributed_boundary, (b_r[:, -1].contiguous(), rows, name)),
        "distributed_max": (_distributed.global_max, (b_r[:, -1].flatten().contiguous(), name, "")),
    }
    return {op_name: caught(lambda: torch.library.opcheck(op, args)) for op_name, (op, args) in checks.items()}


@pytest.fixture(scope="module")
def compiled_ranks(tmp_path_factory):
    return spawn(tmp_path_factory.mktemp("compiled"), COMPILE_WORLD, compiled_cases, COMPILE_TIMEOUT_S)


def test_compiled_distributed_calls_have_one_graph_and_no_graph_break(compiled_ranks):
    for rank, results in enumerate(compiled_ranks):
        for key in (key for key in results if key[0] == "graphs"):
            assert results[key] == (1, 0, []), (rank, key[1], results[key])


def test_compiled_distributed_calls_equal_eager_bitwise(compiled_ranks):
    for rank, results in enumerate(compiled_ranks):
        for call in COMPILED_CALLS:
            eager, compiled = results[call]["eager"], results[call]["compiled"]
            assert torch.equal(eager["h"], compiled["h"]), (rank, call)
            assert len(eager["grads"]) == len(compiled["grads"]) > 0, (rank, call)
            for field in ("grads", "param_grads"):
                for index, (expected, got) in enumerate(zip(eager[field], compiled[field], strict=True)):
                    assert torch.equal(expected, got), (rank, call, field, index)


def test_compiled_distributed_calls_equal_one_process(compiled_ranks):
    """The compiled slices, put back in rank order, against the one-process calls (and parameter
    gradients summed over the ranks)."""
    def compiled_h(call):
        return torch.cat([r[call]["compiled"]["h"] for r in compiled_ranks], dim=1)

    def compiled_grad(call, index):
        return torch.cat([r[call]["compiled"]["grads"][index] for r in compiled_ranks], dim=1)

    A, b, h0, w = scan_case("diag", False, 15)
    A, b, h0 = leaf(A), leaf(b), leaf(h0)
    h = linear_scan(A, b, h0, "diag")
    (h * w).sum().backward()
    assert_close(compiled_h("scan"), h.detach(), "scan h")
    assert_close(compiled_grad("scan", 0), A.grad, "scan grad A")
    assert_close(compiled_grad("scan", 1), b.grad, "scan grad b")
    assert_close(compiled_ranks[0]["scan"]["compiled"]["grads"][2], h0.grad, "scan grad h0")

    A, b, _, w = scan_case("dense", True, 16)
    A, b = leaf(A), leaf(b)
    h = linear_scan(A, b, None, "dense", True)
    (h * w).sum().backward()
    assert_close(compiled_h("scan_reverse_dense"), h.detach(), "reverse h")
    assert_close(compiled_grad("scan_reverse_dense", 0), A.grad, "reverse grad A")
    assert_close(compiled_grad("scan_reverse_dense", 1), b.grad, "reverse grad b")

    cases = [(f"user_{kind}", user_cell_case(kind, 25), USER_CONFIG) for kind in ("diag", "dense")]
    cases.append(("gru", builtin_case("gru", 31), None))
    for call, (cell, x, h0, w), cfg in cases:
        x, h0 = leaf(x), leaf(h0)
        h = cell(x, h0) if cfg is None else newton_apply(cell, x, cfg, h0=h0, compile=False)
        (h * w).sum().backward()
        assert_close(compiled_h(call), h.detach(), f"{call} h")
        assert_close(compiled_grad(call, 0), x.grad, f"{call} grad x")
        assert_close(compiled_ranks[0][call]["compiled"]["grads"][1], h0.grad, f"{call} grad h0")
        for index, p in enumerate(cell.parameters()):
            total = sum(r[call]["compiled"]["param_grads"][index] for r in compiled_ranks)
            assert_close(total, p.grad, f"{call} grad of parameter {index}")


def test_inductor_compiled_newton_equals_eager(compiled_ranks):
    """Inductor generates its own kernels for the cell's step: equal to rounding, not bitwise."""
    for rank, results in enumerate(compiled_ranks):
        eager, compiled = results["inductor"]["eager"], results["inductor"]["compiled"]
        assert_close(compiled["h"], eager["h"], f"h on rank {rank}")
        for field in ("grads", "param_grads"):
            for index, (expected, got) in enumerate(zip(eager[field], compiled[field], strict=True)):
                assert_close(got, expected, f"{field}[{index}] on rank {rank}")


def test_compiled_newton_runs_max_iters_without_the_residual_early_stop(compiled_ranks):
    cell, x, h0, _ = user_cell_case("dense", 23)
    fixed = NewtonConfig(max_iters=EARLY_STOP_CONFIG.max_iters, picard_iters=EARLY_STOP_CONFIG.picard_iters,
                         residual_fail=None)
    expected = newton_apply(cell, x, fixed, h0=h0, compile=False)
    assert_close(torch.cat([r["early stop config"] for r in compiled_ranks], dim=1), expected, "fixed iterations")


def test_compiled_scan_refuses_inputs_that_require_grad_on_some_ranks_only(compiled_ranks):
    for results in compiled_ranks:
        kind, message = results["grads on one rank"]
        assert kind == "RuntimeError" and "under torch.compile, inputs that require grad: True on group rank 0, " \
            "False on group rank 1, expected the same on every rank" in message, (kind, message)


def test_compiled_newton_refuses_an_adjoint_needed_on_some_ranks_only(compiled_ranks):
    for results in compiled_ranks:
        kind, message = results["adjoint on one rank"]
        assert kind == "RuntimeError" and "newton_apply: under torch.compile, the solution needs its gradient on " \
            "some ranks of 'process_group' and not on others" in message, (kind, message)


def test_opcheck_of_the_distributed_operators(compiled_ranks):
    for rank, results in enumerate(compiled_ranks):
        for op_name, outcome in results["opcheck"].items():
            assert outcome == (None, None), (rank, op_name, outcome)
