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

Every exchange runs inside a custom operator (torch.ops.paraseq.distributed_*), which takes the
group by its name (ProcessGroup.group_name): torch.compile sees each as one opaque node with a
shape-only fake kernel, and the host reads of the exchanged values (the agreement, the counts of
steps) happen inside the operators, so a compiled function has no graph break.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import torch
import torch.distributed as dist

from ._ops import ops

HALF_TYPES = (torch.float16, torch.bfloat16)
DTYPE_CODES = (torch.float64, torch.float32, torch.float16, torch.bfloat16)
STRUCTURE_CODES = ("diag", "block", "dense", "block2", "block4")
DEVICE_TYPE_CODES = ("cpu", "cuda")
AGREEMENT_WIDTH = 24  # the int64 values each rank sends to agree(): 5 and at most 19 arguments
# AFTER: the operators' argument `after`, not read, is the result of the collective that the
# program runs before this one. A data dependency is what keeps a compiled graph (inductor) from
# reordering collectives whose inputs are otherwise independent, and group rank 0's graph differs
# from the others' (it takes h0 where they take the boundary state), so a reordering could differ
# between ranks and pair mismatched collectives.


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
    """One argument property that every rank must share: its name in the message, what it is, how
    to print its value (an int), and the exception type of a mismatch."""
    argument: str
    what: str
    describe: Callable[[int], str] = str
    error: type = ValueError


# The properties each function's ranks agree on, in the order of the values they send: looked up by
# the function's name inside the agreement operator, which takes no Python objects.
AGREEMENTS = {}


def register_agreement(function: str, entries: Sequence[Agreed]) -> None:
    AGREEMENTS[function] = tuple(entries)


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
    """This rank's place in the group and the agreement: rows [ranks, AGREEMENT_WIDTH] int64, each
    rank's row (column 1 its number of steps)."""

    def __init__(self, group, rows: torch.Tensor):
        self.group, self.rows = group, rows
        self.rank = dist.get_rank(group)


def agree(function: str, group, device: torch.device, local_error: Optional[BaseException], values: Sequence[int],
          steps: int, has_h0: bool, grad_enabled: bool, needs_grad: bool, grads_must_agree: bool = False) -> Slices:
    """The ranks exchange their arguments (values, in the order of AGREEMENTS[function]) and raise on
    every rank alike (exchange_and_check), so that no rank waits in a collective the others never
    reach: a rank whose own arguments were refused raises its own error (local_error) after the
    exchange, the others name it. grad_enabled: the caller's grad mode (an operator runs without)."""
    row = agreement_row(local_error, values, steps, has_h0, grad_enabled, needs_grad).to(device)
    if local_error is not None:
        _all_gather(row, group)  # the collective the others run inside the operator
        raise local_error
    return Slices(group, distributed_agree(row, function, group.group_name, grads_must_agree))


def agreement_row(local_error, values, steps, has_h0, grad_enabled, needs_grad) -> torch.Tensor:
    local = [0 if local_error is None else 1, steps, int(has_h0), int(needs_grad), int(grad_enabled)]
    local += list(values) if local_error is None else []
    local += [0] * (AGREEMENT_WIDTH - len(local))  # one size on every rank, whatever failed where
    return torch.tensor(local, dtype=torch.int64)


def exchange_and_check(row: torch.Tensor, function: str, group, grads_must_agree: bool) -> torch.Tensor:
    """all_gathers the agreement rows and raises on every rank alike: the group rank whose arguments
    were refused, or the first argument on which the ranks differ, or an h0 given on a rank other
    than group rank 0; with grads_must_agree (a compiled graph, which fixes whether its result
    requires grad when it is traced) inputs that require grad on some ranks only."""
    rows = torch.stack(_all_gather(row, group))
    listed = rows.tolist()
    refused = [rank for rank, values in enumerate(listed) if values[0]]
    if refused:
        raise ValueError(f"{function}: the arguments of group rank(s) {refused} were refused there (their error names "
                         "the argument); nothing was computed")
    for column, entry in enumerate(AGREEMENTS[function], start=5):
        values = [values[column] for values in listed]
        if len(set(values)) > 1:
            given = ", ".join(f"{entry.describe(value)} on group rank {rank}" for rank, value in enumerate(values))
            raise entry.error(f"{function}: argument '{entry.argument}' has {entry.what} {given}, expected the same "
                              "on every rank of 'process_group' (only the number of steps T may differ)")
    if len({values[4] for values in listed}) > 1:
        modes = ", ".join(f"{bool(values[4])} on group rank {rank}" for rank, values in enumerate(listed))
        raise RuntimeError(f"{function}: torch.is_grad_enabled() is {modes}, expected the same on every rank of "
                           "'process_group' (the backward is collective)")
    if grads_must_agree and len({values[3] for values in listed}) > 1:
        given = ", ".join(f"{bool(values[3])} on group rank {rank}" for rank, values in enumerate(listed))
        raise RuntimeError(f"{function}: under torch.compile, inputs that require grad: {given}, expected the same on "
                           "every rank of 'process_group' (a compiled graph fixes when it is traced whether its result "
                           "requires grad, and every rank must join the collective backward); call it eagerly when "
                           "only some ranks' inputs require grad")
    late_h0 = [rank for rank, values in enumerate(listed) if values[2] and rank > 0]
    if late_h0:
        raise ValueError(f"{function}: argument 'h0' is given on group rank(s) {late_h0}, expected None there: h0 is "
                         "the state before the global t = 0, given on group rank 0 only; the state entering each "
                         "other rank's slice comes from the ranks before it")
    return rows


@torch.library.custom_op("paraseq::distributed_agree", mutates_args=())
def distributed_agree(row: torch.Tensor, function: str, group_name: str, grads_must_agree: bool) -> torch.Tensor:
    """The agreement (exchange_and_check) as one opaque operator: [ranks, AGREEMENT_WIDTH] int64."""
    return exchange_and_check(row, function, _group(group_name), grads_must_agree)


@distributed_agree.register_fake
def _distributed_agree_fake(row, function, group_name, grads_must_agree):
    return row.new_empty((_group_size(group_name), AGREEMENT_WIDTH))


def _group(group_name: str):
    """The ProcessGroup of a name (the operators take names: a ProcessGroup is no operator argument)."""
    from torch.distributed.distributed_c10d import _resolve_process_group  # absent without torch.distributed
    return _resolve_process_group(group_name)


def _group_size(group_name: str) -> int:
    return dist.get_world_size(_group(group_name))


def _all_gather(tensor, group):
    gathered = [torch.empty_like(tensor) for _ in range(dist.get_world_size(group))]
    dist.all_gather(gathered, tensor.contiguous(), group=group)
    return gathered


@torch.library.custom_op("paraseq::distributed_max", mutates_args=())
def global_max(tensor: torch.Tensor, group_name: str, first_must_agree: str,
               after: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The elementwise max over the ranks (exact, so the same bits on every rank). With
    first_must_agree (a message), the ranks' tensor[0] must be equal: each sends -tensor[0] too,
    and every rank raises RuntimeError(first_must_agree) alike when max(-x) != -max(x). after:
    see AFTER."""
    checked = bool(first_must_agree)
    result = torch.cat([tensor, -tensor[:1]]) if checked else tensor.clone()
    dist.all_reduce(result, op=dist.ReduceOp.MAX, group=_group(group_name))
    if checked:
        if result[0].item() != -result[-1].item():
            raise RuntimeError(first_must_agree)
        return result[:-1].clone()
    return result


@global_max.register_fake
def _global_max_fake(tensor, group_name, first_must_agree, after=None):
    return torch.empty_like(tensor)


def grad_anchor(locally: bool, device) -> Optional[torch.Tensor]:
    """When none of this rank's inputs requires grad, an empty leaf that does (for a call where some
    rank's do): this rank's result then requires grad too, and its backward joins the collective
    backward."""
    return torch.zeros(0, device=device, requires_grad=True) if not locally else None


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


@torch.library.custom_op("paraseq::distributed_linear_scan", mutates_args=())
def distributed_linear_scan(A: torch.Tensor, b: torch.Tensor, h0: Optional[torch.Tensor],
                            anchor: Optional[torch.Tensor], structure: str, reverse: bool, group_name: str,
                            agreement: bool, grad_enabled: bool, needs_grad: bool, grads_must_agree: bool,
                            after: Optional[torch.Tensor] = None,
                            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """scan() as one opaque operator: (h, entering, leaving, grad_anywhere). With agreement (a call of
    linear_scan), this rank's arguments are checked and the ranks agree first (agree()): the
    operator's own checks run here on real tensors, also under torch.compile, before any other
    collective; grad_anywhere (a 0-d bool) is then whether any rank's inputs require grad. Without
    (the Newton solve's scans, agreed once per call), grad_anywhere is False. anchor (grad_anchor)
    is not read: it makes this rank's result require grad. after: see AFTER."""
    group = _group(group_name)
    grad_anywhere = False
    if agreement:
        from .scan import _check_with_the_operator  # scan.py imports this module
        error, values = None, []
        try:
            _check_with_the_operator(A, b, h0, structure, reverse)
            values = [b.shape[0], b.shape[2], dtype_code(b.dtype), device_code(b.device),
                      STRUCTURE_CODES.index(structure), A.shape[-1] if structure == "block" else 0, int(reverse)]
        except (TypeError, ValueError, RuntimeError, IndexError) as raised:
            error = raised
        slices = agree("linear_scan", group, b.device, error, values, b.shape[1] if error is None else 0,
                       h0 is not None, grad_enabled, needs_grad, grads_must_agree)
        grad_anywhere = bool(slices.rows[:, 3].any())
    with torch.no_grad():
        h, entering, leaving = scan(A, b, h0, structure, reverse, group)
    # An operator's outputs may not alias its inputs or each other: entering may be h0, leaving h's last step.
    return h, entering.clone(), leaving.clone(), torch.tensor(grad_anywhere, device=b.device)


@distributed_linear_scan.register_fake
def _distributed_linear_scan_fake(A, b, h0, anchor, structure, reverse, group_name, agreement, grad_enabled,
                                  needs_grad, grads_must_agree, after=None):
    work = torch.float32 if b.dtype in HALF_TYPES else b.dtype
    # Shapes only; wrong ones pass here and are refused at run time, on every rank alike, by the agreement.
    B, N = b.shape[0], b.shape[-1]
    return (torch.empty_like(b, memory_format=torch.contiguous_format), b.new_empty((B, N), dtype=work),
            b.new_empty((B, N), dtype=work), b.new_empty((), dtype=torch.bool))


SCAN_AGREEMENT = (Agreed("b", "batch size B"), Agreed("b", "state size N"),
                  Agreed("b", "dtype", describe_dtype, TypeError), Agreed("b", "device type", describe_device),
                  Agreed("structure", "value", describe_structure), Agreed("A", "block size k"),
                  Agreed("reverse", "value", describe_bool))
register_agreement("linear_scan", SCAN_AGREEMENT)


@torch.library.custom_op("paraseq::distributed_linear_scan_backward", mutates_args=())
def distributed_linear_scan_backward(A: torch.Tensor, h: torch.Tensor, entering: torch.Tensor, grad_h: torch.Tensor,
                                     structure: str, reverse: bool,
                                     group_name: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The distributed scan's backward, the distributed scan the other way: (grad_A, grad_b, grad_h0).
    For h_t = A_t h_{t-1} + b_t, lambda = the reverse scan of grad_h, grad_b = lambda, grad_A_t =
    lambda_t h_{t-1}^T and grad_h0 = what the slice passes on (A_s^T lambda_s: group rank 0's is h0's
    gradient); for reverse=True, mu = the forward scan of grad_h, grad_b = mu and grad_A_t =
    lambda_t mu_{t-1}^T."""
    group = _group(group_name)
    adjoint, adjoint_entering, adjoint_leaving = scan(A, grad_h.contiguous(), None, structure, not reverse, group)
    if reverse:
        left, right = h, shifted(adjoint, adjoint_entering.to(adjoint.dtype))
    else:
        left, right = adjoint, shifted(h, entering.to(h.dtype))
    work = torch.float32 if A.dtype in HALF_TYPES else A.dtype
    grad_A = outer(left.to(work), right.to(work), structure, A).to(A.dtype)
    return grad_A, adjoint, adjoint_leaving.to(A.dtype, copy=True)  # a copy: not a view of adjoint


@distributed_linear_scan_backward.register_fake
def _distributed_linear_scan_backward_fake(A, h, entering, grad_h, structure, reverse, group_name):
    return (torch.empty_like(A, memory_format=torch.contiguous_format),
            torch.empty_like(grad_h, memory_format=torch.contiguous_format),
            A.new_empty((grad_h.shape[0], grad_h.shape[2])))


def _setup_scan_backward(ctx, inputs, output):
    A, _, h0, _, structure, reverse, group_name = inputs[:7]
    h, entering, _, _ = output
    ctx.save_for_backward(A, h, entering)
    ctx.mark_non_differentiable(*output[1:])
    ctx.structure, ctx.reverse, ctx.group_name, ctx.h0_given = structure, reverse, group_name, h0 is not None


def _scan_backward(ctx, grad_h, *unused):
    A, h, entering = ctx.saved_tensors
    with torch.no_grad():  # the operator has no derivative: with create_graph=True, RefuseSecondDerivative below
        grad_A, grad_b, grad_h0 = distributed_linear_scan_backward(A, h, entering, grad_h, ctx.structure,
                                                                   ctx.reverse, ctx.group_name)
    grad_h0 = grad_h0 if ctx.h0_given and ctx.needs_input_grad[2] else None
    anchor = next((t for t in (A, h, grad_h) if t.requires_grad), None)
    if torch.is_grad_enabled() and anchor is not None:  # create_graph=True: refuse the next derivative
        refuse = lambda value: RefuseSecondDerivative.apply(value, SCAN_SECOND_DERIVATIVE_REFUSED, anchor)
        grad_A, grad_b = refuse(grad_A), refuse(grad_b)
        grad_h0 = refuse(grad_h0) if grad_h0 is not None else None
    return grad_A, grad_b, grad_h0, None, None, None, None, None, None, None, None, None


distributed_linear_scan.register_autograd(_scan_backward, setup_context=_setup_scan_backward)


def linear_scan(A, b, h0, structure, reverse, group, check_local: Callable[[], None]) -> torch.Tensor:
    """paraseq.linear_scan with process_group: one distributed_linear_scan, which checks, agrees and
    scans. Arguments that the operator cannot take (not tensors, structure not a str) are refused
    here, after the agreement's exchange, so that the other ranks raise too."""
    check_group("linear_scan", group)
    if not (isinstance(A, torch.Tensor) and isinstance(b, torch.Tensor) and isinstance(structure, str)
            and (h0 is None or isinstance(h0, torch.Tensor))):
        try:
            check_local()  # raises, naming the argument
        except (TypeError, ValueError) as error:
            device = b.device if isinstance(b, torch.Tensor) else torch.device("cpu")
            agree("linear_scan", group, device, error, [], 0, False, torch.is_grad_enabled(), False)
    compiling = torch.compiler.is_compiling()
    needs_grad = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (A, b, h0))
    # Eager, a rank whose inputs need no grad learns from the agreement whether another rank's do:
    # its result then requires grad through an empty anchor, else it is detached. A compiled graph
    # cannot decide this at run time: the ranks must agree on needs_grad instead.
    anchor = grad_anchor(needs_grad, b.device) if not compiling and torch.is_grad_enabled() else None
    h, _, _, grad_anywhere = distributed_linear_scan(A, b, h0, anchor, structure, bool(reverse), group.group_name,
                                                     True, torch.is_grad_enabled(), needs_grad, compiling)
    if anchor is not None and not grad_anywhere.item():
        return h.detach()
    return h


# ---- the general Newton path over the ranks --------------------------------------------------------

@torch.library.custom_op("paraseq::distributed_boundary", mutates_args=())
def distributed_boundary(last: torch.Tensor, rows: torch.Tensor, group_name: str,
                         after: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The state entering this rank's slice: the last state of the nearest earlier rank with steps
    (rows: the agreement, column 1 the number of steps), that of group rank 0 when none has. Every
    rank sends its last (an empty slice the state entering it). after: see AFTER."""
    group = _group(group_name)
    gathered = _all_gather(last, group)
    counts = rows[:, 1].tolist()
    before = next((other for other in range(dist.get_rank(group) - 1, 0, -1) if counts[other]), 0)
    return gathered[before].clone()


@distributed_boundary.register_fake
def _distributed_boundary_fake(last, rows, group_name, after=None):
    return torch.empty_like(last)


NEEDS_ADJOINT_DIFFER = (
    "newton_apply: under torch.compile, the solution needs its gradient on some ranks of 'process_group' and not "
    "on others, expected the same on every rank (a compiled graph fixes when it is traced whether its result "
    "requires grad, and every rank must join the collective backward); call it eagerly when only some ranks' "
    "inputs or parameters require grad")


class NewtonSlices:
    """What the general Newton solve (_user_cell.solve) does differently over the ranks: the state
    entering the slice comes from the rank before, the linear solves are distributed scans, and the
    checks reduce over the ranks."""

    def __init__(self, slices: Slices):
        self.slices, self.group, self.rank = slices, slices.group, slices.rank
        self.group_name = slices.group.group_name
        self.last_exchanged = slices.rows  # the result of the latest collective: AFTER

    def exchanged(self, result: torch.Tensor) -> torch.Tensor:
        self.last_exchanged = result
        return result

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
        before = self.exchanged(distributed_boundary(last, self.slices.rows, self.group_name, self.last_exchanged))
        return h0 if self.rank == 0 else before

    def scan(self, A, b, structure, reverse=False, ordered=True):
        """ordered=False in a backward, a graph of its own: this object's tensors are the forward's."""
        h, entering, leaving, _ = distributed_linear_scan(A, b, None, None, structure, reverse, self.group_name,
                                                          False, False, False, False,
                                                          self.last_exchanged if ordered else None)
        return (self.exchanged(h) if ordered else h), entering, leaving

    def max(self, tensor: torch.Tensor, first_must_agree: str = "") -> torch.Tensor:
        return self.exchanged(global_max(tensor, self.group_name, first_must_agree, self.last_exchanged))

    def needs_adjoint(self, needs_adjoint: bool, residual: Optional[torch.Tensor]):
        """(whether any rank needs the adjoint, the residual's max over the ranks), one all_reduce.
        A compiled graph keeps its own decision, checked to be every rank's."""
        local = torch.tensor([float(needs_adjoint)], dtype=torch.float64, device=self.slices.rows.device)
        compiling = torch.compiler.is_compiling()
        reduced = self.max(torch.cat([local, residual]) if residual is not None else local,
                           NEEDS_ADJOINT_DIFFER if compiling else "")
        return needs_adjoint if compiling else bool(reduced[0]), (reduced[1:] if residual is not None else None)

    def anchor(self, locally: bool, device) -> Optional[torch.Tensor]:
        """For a solve that needs its adjoint on some rank (the caller reduced that over the ranks)."""
        return grad_anchor(locally, device)


# Collectives must run in the order the program calls them, on every rank, and none may be dropped
# where its result is not used (group rank 0 takes h0, not distributed_boundary's result). Ordered
# effects keep torch.compile's graph passes from eliminating them; they did not keep inductor (torch
# 2.14) from running group rank 0's scans before its agreement, whose results these scans do not
# read: hence AFTER as well.
for _collective in (distributed_agree, global_max, distributed_linear_scan, distributed_linear_scan_backward,
                    distributed_boundary):
    torch.library._register_effectful_op(_collective._qualname, torch._library.effects.EffectType.ORDERED)
