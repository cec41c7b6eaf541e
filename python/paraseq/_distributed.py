"""Sequence parallelism: linear_scan and the general Newton path over torch.distributed ranks.

Each rank of a process group holds a contiguous slice of the time axis ([B, T_r, ...], the ranks in
group-rank order along time; T_r may differ and may be 0). A rank's slice acts on the state that
enters it as one affine map, h_out = M h_in + c (M the product of the slice's A_t in its structure,
c the slice's last state from a zero state). Every rank all_gathers the maps, composes those of
the ranks before it (after it, for reverse=True) in rank order, the same operations in the same
order on every rank, and re-runs its slice from the state that enters it. all_gather rather than a
chain of send/recv: one collective whatever the number of ranks, the same on every rank, and the
maps are small (B x [N, N k or N^2] + B x N values per rank).

The rank that starts the recurrence (group rank 0; the last rank for reverse=True) runs its slice
once, from h0, and the one that ends it once, from the state entering it (its own map is never
needed); those between run it twice: from zero for their map, then from the state entering them.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from typing import Callable, List, Optional, Sequence

import torch
import torch.distributed as dist

from ._ops import ops

HALF_TYPES = (torch.float16, torch.bfloat16)
DTYPE_CODES = (torch.float64, torch.float32, torch.float16, torch.bfloat16)
STRUCTURE_CODES = ("diag", "block", "dense", "block2", "block4")
DEVICE_TYPE_CODES = ("cpu", "cuda")
AGREEMENT_WIDTH = 24  # the int64 values each rank sends to agree(): 5 and at most 19 arguments


# ---- the group and the agreement between ranks ----------------------------------------------------

def check_group(function: str, process_group) -> None:
    """Refuses anything but a ProcessGroup of an initialised torch.distributed (on every rank alike:
    no collective has run yet)."""
    if not dist.is_available():
        raise RuntimeError(f"{function}: argument 'process_group' is given, but this torch has no torch.distributed")
    if not dist.is_initialized():
        raise RuntimeError(f"{function}: argument 'process_group' is given, but torch.distributed is not initialised: "
                           "call torch.distributed.init_process_group first")
    if not isinstance(process_group, dist.ProcessGroup):
        raise TypeError(f"{function}: argument 'process_group' is a {type(process_group).__module__}."
                        f"{type(process_group).__name__}, expected a torch.distributed.ProcessGroup (or None for one "
                        "process); a rank outside a group made by new_group has no group to pass")


@dataclass(frozen=True)
class Agreed:
    """One argument property that every rank must share: its name in the message, what it is, its
    value as an int, how to print that int, and the exception type of a mismatch."""
    argument: str
    what: str
    value: int
    describe: Callable[[int], str] = str
    error: type = ValueError


def describe_bool(code: int) -> str:
    return str(bool(code))


def describe_dtype(code: int) -> str:
    return str(DTYPE_CODES[code]) if 0 <= code < len(DTYPE_CODES) else "another dtype"


def describe_structure(code: int) -> str:
    return repr(STRUCTURE_CODES[code])


def describe_device(code: int) -> str:
    return DEVICE_TYPE_CODES[code] if 0 <= code < len(DEVICE_TYPE_CODES) else "another device type"


NO_FLOAT = -1  # the code of None (the bits of a NaN, which no checked setting is)


def float_code(value: Optional[float]) -> int:
    """A setting's float64 bits as an int (exact: equal codes are equal settings)."""
    return NO_FLOAT if value is None else struct.unpack("<q", struct.pack("<d", float(value)))[0]


def describe_float(code: int) -> str:
    return "None" if code == NO_FLOAT else repr(struct.unpack("<d", struct.pack("<q", code))[0])


def dtype_code(dtype: torch.dtype) -> int:
    return DTYPE_CODES.index(dtype) if dtype in DTYPE_CODES else len(DTYPE_CODES)


def device_code(device: torch.device) -> int:
    return DEVICE_TYPE_CODES.index(device.type) if device.type in DEVICE_TYPE_CODES else len(DEVICE_TYPE_CODES)


class Slices:
    """This rank's place in the group and every rank's number of steps, after the ranks agreed."""

    def __init__(self, group, counts: List[int], grad_anywhere: bool):
        self.group, self.counts, self.grad_anywhere = group, counts, grad_anywhere
        self.rank = dist.get_rank(group)


def agree(function: str, group, device: torch.device, local_error: Optional[BaseException],
          entries: Sequence[Agreed], steps: int, has_h0: bool, needs_grad: bool) -> Slices:
    """all_gathers a small int64 tensor of every rank's arguments and raises on every rank alike
    (so that no rank waits in a collective the others never reach): this rank's own error, or the
    group rank whose arguments were refused, or the first argument on which the ranks differ, or an
    h0 given on a rank other than group rank 0."""
    local = [0 if local_error is None else 1, steps, int(has_h0), int(needs_grad), int(torch.is_grad_enabled())]
    local += [entry.value for entry in entries] if local_error is None else []
    local += [0] * (AGREEMENT_WIDTH - len(local))  # one size on every rank, whatever failed where
    rows = torch.stack(_all_gather(torch.tensor(local, dtype=torch.int64, device=device), group)).tolist()
    if local_error is not None:
        raise local_error
    refused = [rank for rank, row in enumerate(rows) if row[0]]
    if refused:
        raise ValueError(f"{function}: the arguments of group rank(s) {refused} were refused there (their error names "
                         "the argument); nothing was computed")
    for column, entry in enumerate(entries, start=5):
        values = [row[column] for row in rows]
        if len(set(values)) > 1:
            given = ", ".join(f"{entry.describe(value)} on group rank {rank}" for rank, value in enumerate(values))
            raise entry.error(f"{function}: argument '{entry.argument}' has {entry.what} {given}, expected the same "
                              "on every rank of 'process_group' (only the number of steps T may differ)")
    if len({row[4] for row in rows}) > 1:
        modes = ", ".join(f"{bool(row[4])} on group rank {rank}" for rank, row in enumerate(rows))
        raise RuntimeError(f"{function}: torch.is_grad_enabled() is {modes}, expected the same on every rank of "
                           "'process_group' (the backward is collective)")
    late_h0 = [rank for rank, row in enumerate(rows) if row[2] and rank > 0]
    if late_h0:
        raise ValueError(f"{function}: argument 'h0' is given on group rank(s) {late_h0}, expected None there: h0 is "
                         "the state before the global t = 0, given on group rank 0 only; the state entering each "
                         "other rank's slice comes from the ranks before it")
    return Slices(group, [row[1] for row in rows], any(row[3] for row in rows))


def _all_gather(tensor, group):
    gathered = [torch.empty_like(tensor) for _ in range(dist.get_world_size(group))]
    dist.all_gather(gathered, tensor.contiguous(), group=group)
    return gathered


def global_max(tensor: torch.Tensor, group) -> torch.Tensor:
    """The elementwise max over the ranks (exact, so the same bits on every rank)."""
    result = tensor.clone()
    dist.all_reduce(result, op=dist.ReduceOp.MAX, group=group)
    return result


def grad_anchor(anywhere: bool, locally: bool, device) -> Optional[torch.Tensor]:
    """When some rank's inputs require grad and none of this rank's do, an empty leaf that does:
    this rank's result then requires grad too, and its backward joins the collective backward."""
    return torch.zeros(0, device=device, requires_grad=True) if anywhere and not locally else None


# ---- the maps of the slices -----------------------------------------------------------------------

def map_product(A: torch.Tensor, structure: str, N: int, dtype: torch.dtype) -> torch.Tensor:
    """M = A_{T-1} ... A_1 A_0 ([B, N], [B, N/k, k, k] or [B, N, N]) by a pairwise tree of products:
    log2(T) batched multiplies, each a fixed sequence of operations (deterministic)."""
    A = A.to(dtype)
    if A.shape[1] == 0:
        B = A.shape[0]
        if structure == "diag":
            return A.new_ones((B, N))
        return torch.eye(A.shape[-1], dtype=dtype, device=A.device).expand(B, *A.shape[2:]).clone()
    while A.shape[1] > 1:
        pairs = A.shape[1] // 2
        earlier, later = A[:, 0:2 * pairs:2], A[:, 1:2 * pairs:2]
        product = later * earlier if structure == "diag" else later @ earlier
        A = torch.cat([product, A[:, 2 * pairs:]], dim=1)  # an odd last factor waits for the next round
    return A[:, 0]


def apply_map(M: torch.Tensor, v: torch.Tensor, structure: str, transpose: bool) -> torch.Tensor:
    """M v (M^T v with transpose) for v [B, N]."""
    if structure == "diag":
        return M * v
    if transpose:
        M = M.transpose(-1, -2)
    if structure == "block":
        return (M @ v.reshape(*M.shape[:-1], 1)).reshape(v.shape)
    return (M @ v.unsqueeze(-1)).squeeze(-1)


def outer(left: torch.Tensor, right: torch.Tensor, structure: str, A: torch.Tensor) -> torch.Tensor:
    """d(left . A right)/dA in A's structure, for left and right [B, T, N]."""
    if structure == "diag":
        return left * right
    if structure == "block":
        k = A.shape[-1]
        B, T, N = left.shape
        return left.reshape(B, T, N // k, k, 1) * right.reshape(B, T, N // k, 1, k)
    return left.unsqueeze(-1) * right.unsqueeze(-2)


def shifted(h: torch.Tensor, entering: Optional[torch.Tensor]) -> torch.Tensor:
    """h_prev: [entering, h_0, ..., h_{T-2}] (entering zero when None; empty for T = 0)."""
    if h.shape[1] == 0:
        return h
    first = entering.unsqueeze(1) if entering is not None else torch.zeros_like(h[:, :1])
    return torch.cat([first, h[:, :-1]], dim=1)


# ---- the distributed scan -------------------------------------------------------------------------

def scan(A: torch.Tensor, b: torch.Tensor, h0: Optional[torch.Tensor], structure: str, reverse: bool, group):
    """The slice's part of the global scan, without autograd: (h, entering, leaving), [B, T_r, N],
    [B, N], [B, N]. entering is the state entering the slice (forward: h_{s-1}, h0 or zero on group
    rank 0; reverse: A_e^T lambda_e, zero on the last rank); leaving is what the slice passes on
    (forward: h_{e-1}; reverse: A_s^T lambda_s), entering itself for an empty slice."""
    rank, size = dist.get_rank(group), dist.get_world_size(group)
    B, T, N = b.shape
    work = torch.float32 if b.dtype in HALF_TYPES else b.dtype
    source = (size - 1) if reverse else 0  # the rank whose slice starts the global recurrence
    upstream = range(size - 1, rank, -1) if reverse else range(0, rank)  # in the order the state travels

    def leaving_of(h, entering):
        if T == 0:
            return entering
        if reverse:
            return apply_map(A[:, 0].to(work), h[:, 0].to(work), structure, transpose=True)
        return h[:, -1].to(work)

    zero = b.new_zeros((B, N), dtype=work)
    shape_of_map = _map_shape(structure, N, A)
    size_of_map = math.prod(shape_of_map)
    if rank == source:
        h = ops.linear_scan(A, b, h0, structure, reverse)
        entering = h0.to(work) if h0 is not None else zero
        mapping = torch.cat([b.new_zeros((B, size_of_map), dtype=work), leaving_of(h, entering)], dim=1)
    elif rank == size - 1 - source:  # the last to receive: its own map is never used
        h, mapping = None, b.new_zeros((B, size_of_map + N), dtype=work)
    else:
        local = ops.linear_scan(A, b, None, structure, reverse)
        M = map_product(A, structure, N, work).reshape(B, size_of_map)
        mapping = torch.cat([M, leaving_of(local, zero)], dim=1)
    maps = _all_gather(mapping, group)
    if rank != source:
        entering = maps[source][:, size_of_map:]
        for other in upstream:
            if other == source:
                continue
            M = maps[other][:, :size_of_map].reshape(B, *shape_of_map)
            entering = apply_map(M, entering, structure, transpose=reverse) + maps[other][:, size_of_map:]
        if reverse:
            b = b.clone()
            if T:
                b[:, -1] += entering.to(b.dtype)
            h = ops.linear_scan(A, b, None, structure, True)
        else:
            h = ops.linear_scan(A, b, entering.to(b.dtype), structure, False)
    return h, entering, leaving_of(h, entering)


def _map_shape(structure, N, A):
    """A slice's M without the batch: [N] (diag), [N/k, k, k] (block), [N, N] (dense)."""
    if structure == "diag":
        return (N,)
    if structure == "block":
        k = A.shape[-1]
        return (N // k, k, k)
    return (N, N)


class RefuseSecondDerivative(torch.autograd.Function):
    """Identity on a first derivative; differentiating it raises `message`. anchor, a tensor that
    requires grad, puts it on the graph: a gradient that holds something fixed (the Jacobians at a
    solution, the maps of a distributed scan) would otherwise give a silently wrong second one."""

    @staticmethod
    def forward(value, message, anchor):
        return value.clone()

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.message = inputs[1]

    @staticmethod
    def backward(ctx, grad):
        raise NotImplementedError(ctx.message)


SCAN_SECOND_DERIVATIVE_REFUSED = (
    "linear_scan: the gradient of a distributed scan (process_group) is not differentiable (no second derivatives: "
    "Hessians, gradgradcheck, a gradient penalty's backward); without process_group, linear_scan has them")


class DistributedLinearScan(torch.autograd.Function):
    """The distributed scan with its backward, the distributed scan the other way: for h_t = A_t h_{t-1}
    + b_t, lambda = the reverse scan of grad_h, grad_b = lambda, grad_A_t = lambda_t h_{t-1}^T and
    grad_h0 = what group rank 0's slice passes on (A_0^T lambda_0); for reverse=True, mu = the
    forward scan of grad, grad_b = mu and grad_A_t = lambda_t mu_{t-1}^T."""

    @staticmethod
    def forward(ctx, A, b, h0, anchor, structure, reverse, group):
        h, entering, _ = scan(A, b, h0, structure, reverse, group)
        ctx.save_for_backward(A, h, entering)
        ctx.structure, ctx.reverse, ctx.group = structure, reverse, group
        ctx.h0_given = h0 is not None
        return h

    @staticmethod
    def backward(ctx, grad_h):
        A, h, entering = ctx.saved_tensors
        structure, reverse, group = ctx.structure, ctx.reverse, ctx.group
        adjoint, adjoint_entering, adjoint_leaving = scan(A, grad_h.contiguous(), None, structure, not reverse, group)
        if reverse:
            left, right = h, shifted(adjoint, adjoint_entering.to(adjoint.dtype))
        else:
            left, right = adjoint, shifted(h, entering.to(h.dtype))
        work = torch.float32 if A.dtype in HALF_TYPES else A.dtype
        grad_A = outer(left.to(work), right.to(work), structure, A).to(A.dtype)
        grad_h0 = adjoint_leaving.to(A.dtype) if ctx.h0_given and ctx.needs_input_grad[2] else None
        anchor = next((t for t in (A, h, grad_h) if t.requires_grad), None)
        if torch.is_grad_enabled() and anchor is not None:  # create_graph=True: refuse the next derivative
            refuse = lambda value: RefuseSecondDerivative.apply(value, SCAN_SECOND_DERIVATIVE_REFUSED, anchor)
            grad_A, adjoint = refuse(grad_A), refuse(adjoint)
            grad_h0 = refuse(grad_h0) if grad_h0 is not None else None
        return grad_A, adjoint, grad_h0, None, None, None, None


def linear_scan(A, b, h0, structure, reverse, group, check_local: Callable[[], None]) -> torch.Tensor:
    """paraseq.linear_scan with process_group: the ranks agree on the arguments, then scan."""
    check_group("linear_scan", group)
    device = b.device if isinstance(b, torch.Tensor) else torch.device("cpu")
    error, entries, steps = None, [], 0
    try:
        check_local()
        B, T, N = b.shape
        block = A.shape[-1] if structure == "block" else 0
        entries = [Agreed("b", "batch size B", B), Agreed("b", "state size N", N),
                   Agreed("b", "dtype", dtype_code(b.dtype), describe_dtype, TypeError),
                   Agreed("b", "device type", device_code(b.device), describe_device),
                   Agreed("structure", "value", STRUCTURE_CODES.index(structure), describe_structure),
                   Agreed("A", "block size k", block), Agreed("reverse", "value", int(bool(reverse)), describe_bool)]
        steps = T
    except (TypeError, ValueError, RuntimeError, IndexError) as raised:
        error = raised
    inputs = (A, b, h0) if error is None else ()
    needs_grad = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in inputs)
    slices = agree("linear_scan", group, device, error, entries, steps, h0 is not None, needs_grad)
    if not slices.grad_anywhere:
        with torch.no_grad():
            return scan(A, b, h0, structure, reverse, group)[0]
    anchor = grad_anchor(slices.grad_anywhere, needs_grad, b.device)
    return DistributedLinearScan.apply(A, b, h0, anchor, structure, reverse, group)


# ---- the general Newton path over the ranks --------------------------------------------------------

class NewtonSlices:
    """What the general Newton solve (_user_cell.solve) does differently over the ranks: the state
    entering the slice comes from the rank before, the linear solves are distributed scans, and the
    checks reduce over the ranks."""

    def __init__(self, slices: Slices):
        self.slices, self.group = slices, slices.group
        self.rank, self.counts = slices.rank, slices.counts

    def entering(self, h: torch.Tensor, h0: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
        """The iterate's state before the slice's first step: group rank 0's h0 (None: zero), else the
        last state of the nearest earlier rank with steps (group rank 0's h0 when none has). One
        all_gather of B x state values."""
        B, T = h.shape[:2]
        if T:
            last = h[:, -1].detach()
        elif self.rank == 0 and h0 is not None:
            last = h0.detach().to(h.dtype)
        else:
            last = h.new_zeros((B, *h.shape[2:]))
        gathered = _all_gather(last, self.group)
        if self.rank == 0:
            return h0
        before = next((other for other in range(self.rank - 1, 0, -1) if self.counts[other]), 0)
        return gathered[before]

    def scan(self, A, b, structure, reverse=False):
        return scan(A, b, None, structure, reverse, self.group)

    def max(self, tensor: torch.Tensor) -> torch.Tensor:
        return global_max(tensor, self.group)

    def anchor(self, locally: bool, device) -> Optional[torch.Tensor]:
        """For a solve that needs its adjoint on some rank (the caller reduced that over the ranks)."""
        return grad_anchor(True, locally, device)
