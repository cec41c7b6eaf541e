"""linear_scan: linear recurrences h_t = A_t h_{t-1} + b_t by paraseq's ordered parallel scan."""

from __future__ import annotations

from typing import Optional

import torch

from . import _distributed, _packed
from ._ops import ops

STRUCTURES = ("diag", "block", "dense")


def linear_scan(A: torch.Tensor, b: torch.Tensor, h0: Optional[torch.Tensor] = None, structure: str = "diag",
                reverse: bool = False, *, cu_seqlens: Optional[torch.Tensor] = None,
                process_group: Optional[torch.distributed.ProcessGroup] = None) -> torch.Tensor:
    """Solves h_t = A_t h_{t-1} + b_t for all t at once, with paraseq's ordered parallel scan.

    Parameters
    ----------
    A : torch.Tensor
        The transitions: [B, T, N] for ``structure="diag"``, [B, T, N/k, k, k] for ``"block"``
        (k = 2, 3 or 4: N/k blocks of k x k) or [B, T, N, N] for ``"dense"`` (N <= 32). b's dtype
        and device.
    b : torch.Tensor
        The inputs, [B, T, N]: float32, float64, float16 or bfloat16 (the last two are stored as
        such and accumulated in float32), on the CPU or a CUDA device.
    h0 : torch.Tensor, optional
        The state before t = 0, [B, N]; zero when None. With ``process_group``, the state before
        the global t = 0: given on group rank 0 only (None on the other ranks).
    structure : {"diag", "block", "dense"}
        The structure of each A_t.
    reverse : bool
        Solve the adjoint recurrence instead: lambda_{T-1} = b_{T-1} and
        lambda_t = A_{t+1}^T lambda_{t+1} + b_t. h0 must then be None.
    cu_seqlens : torch.Tensor, optional
        Packed sequences (FlashAttention's convention): int32 or int64 [S + 1] on b's device,
        0 = cu_seqlens[0] <= cu_seqlens[1] <= ... <= cu_seqlens[S] = T; sequence s is
        t in [cu_seqlens[s], cu_seqlens[s + 1]) of the one batch element (B = 1); equal neighbours
        are an empty sequence. No state crosses a boundary, in either direction: each sequence starts
        from its own h0 (forward) and from lambda = b at its own last step (reverse). h0 is then
        [S, N] (None: zeros). Cost: one extra elementwise pass over A and b (A cut at each
        sequence's first step, h0_s added to b there) before the one scan; gradients reach A, b and
        h0 through these tensor operations and the scan's backward.

    process_group : torch.distributed.ProcessGroup, optional
        Sequence parallelism (docs/distributed.md): each rank of the group passes its contiguous
        slice of the time axis, A [B, T_r, ...] and b [B, T_r, N] (the ranks in group-rank order
        along time; T_r may differ between ranks and may be 0), and gets its slice of the global
        result. Every rank of the group must call, with the same B, N, dtype, device type,
        structure and reverse; the ranks exchange one all_gather of their slices' affine maps. When
        any rank's inputs require grad, every rank's result does, and every rank must run the
        backward (it is collective). Under torch.compile the scan and its backward are opaque
        operators (no graph break), and the ranks' inputs must all require grad or none (else
        RuntimeError on every rank). None: one process, as without the argument.

    Returns
    -------
    torch.Tensor
        h (or lambda), [B, T, N] ([1, T, N] with cu_seqlens), in b's dtype. Gradients reach A, b
        and h0 (the backward is another scan), also gradients of gradients (with
        ``process_group``: first derivatives only; the backward is a distributed scan the other
        way, and differentiating it raises).

    Raises
    ------
    TypeError
        An argument that is not a tensor, or tensors of different dtypes; cu_seqlens not int32 or
        int64.
    ValueError
        A structure other than the three, shapes that do not match (the message names the argument
        and the expected shape), h0 with ``reverse=True``; with cu_seqlens: cu_seqlens not 1-D
        [S + 1], on another device than b, not starting at 0, not ending at T or decreasing; b with a
        batch size other than 1; h0 not [S, N]. The values of cu_seqlens are read on the host in
        eager mode (one device synchronisation); compiled graphs check them with
        ``torch._assert_async`` (no synchronisation; a RuntimeError on the CPU, a device-side
        assertion on CUDA); cu_seqlens together with process_group.
    RuntimeError
        Tensors on different devices, or a device this build has no kernels for; with
        ``process_group``, a torch.distributed that is not initialised, or grad modes that differ
        between the ranks.

    Notes
    -----
    With ``process_group``, every check runs on every rank before any work, and every rank raises
    when one rank's arguments are refused (that rank raises its own error), when the ranks differ
    in B, N, dtype (TypeError), device type, structure, block size or reverse (ValueError naming
    the argument and each rank's value), when h0 is given on a rank other than group rank 0
    (ValueError), or when ``process_group`` is not a ProcessGroup (TypeError).
    """
    if process_group is not None:
        if cu_seqlens is not None:
            raise ValueError("linear_scan: arguments 'cu_seqlens' and 'process_group' are both given, expected at "
                             "most one (packed sequences split across ranks are not supported)")
        return _distributed.linear_scan(A, b, h0, structure, reverse, process_group,
                                        lambda: _check_with_the_operator(A, b, h0, structure, reverse))
    _check_arguments(A, b, h0, structure, reverse)
    if cu_seqlens is not None:
        return _packed.linear_scan_packed(ops.linear_scan, A, b, h0, structure, reverse, cu_seqlens)
    return ops.linear_scan(A, b, h0, structure, reverse)


def _check_arguments(A, b, h0, structure, reverse):
    if structure not in STRUCTURES:
        raise ValueError(f"linear_scan: argument 'structure' is {structure!r}, "
                         f"expected one of {', '.join(map(repr, STRUCTURES))}")
    for name, tensor in (("A", A), ("b", b)) + ((("h0", h0),) if h0 is not None else ()):
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"linear_scan: argument '{name}' is a {type(tensor).__name__}, expected a tensor")
    _check_b_against_A(A, b, structure)


def _check_with_the_operator(A, b, h0, structure, reverse):
    """The Python checks, then the operator's own (dtypes, devices, block sizes, h0) on at most one
    step: a distributed call refuses bad arguments before any collective, with the same messages."""
    _check_arguments(A, b, h0, structure, reverse)
    first = slice(0, min(b.shape[1], 1))
    with torch.no_grad():
        ops.linear_scan(A[:, first] if A.dim() >= 2 else A, b[:, first], h0, structure, reverse)


def _check_b_against_A(A, b, structure):
    """b [B, T, N] for A's structure; dtypes, devices and A's own shape are the operator's checks."""
    if b.dim() != 3:
        raise ValueError(f"linear_scan: argument 'b' has shape {list(b.shape)}, expected [B, T, N]")
    B, T, N = b.shape
    if structure == "diag":
        expected, layout = [B, T, N], "[B, T, N]"
    elif structure == "dense":
        expected, layout = [B, T, N, N], "[B, T, N, N]"
    else:
        k = A.shape[-1] if A.dim() == 5 else None
        if k is None or N % k:
            return  # the operator names what is wrong with a "block" A, or with N for its k
        expected, layout = [B, T, N // k, k, k], "[B, T, N/k, k, k]"
    if list(A.shape) != expected:
        raise ValueError(f"linear_scan: argument 'A' has shape {list(A.shape)}, expected {layout} = {expected} "
                         f"for structure={structure!r} (B, T, N from argument 'b' {list(b.shape)})")
