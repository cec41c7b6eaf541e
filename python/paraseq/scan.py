"""linear_scan: linear recurrences h_t = A_t h_{t-1} + b_t by paraseq's ordered parallel scan."""

from __future__ import annotations

from typing import Optional

import torch

from ._ops import ops

STRUCTURES = ("diag", "block", "dense")


def linear_scan(A: torch.Tensor, b: torch.Tensor, h0: Optional[torch.Tensor] = None, structure: str = "diag",
                reverse: bool = False) -> torch.Tensor:
    """h_t = A_t h_{t-1} + b_t with h_{-1} = h0 (zero when None); returns h [B, T, N].

    A: [B, T, N] ("diag"), [B, T, N/k, k, k] ("block", k = 2, 3 or 4) or [B, T, N, N] ("dense",
    N <= 32); b: [B, T, N]; h0: [B, N]. reverse=True returns lambda with lambda_{T-1} = b_{T-1} and
    lambda_t = A_{t+1}^T lambda_{t+1} + b_t (the adjoint recurrence; h0 must be None).
    float16/bfloat16 are stored as such and accumulated in float32.
    """
    if structure not in STRUCTURES:
        raise ValueError(f"linear_scan: argument 'structure' is {structure!r}, "
                         f"expected one of {', '.join(map(repr, STRUCTURES))}")
    for name, tensor in (("A", A), ("b", b)) + ((("h0", h0),) if h0 is not None else ()):
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"linear_scan: argument '{name}' is a {type(tensor).__name__}, expected a tensor")
    _check_b_against_A(A, b, structure)
    return ops.linear_scan(A, b, h0, structure, reverse)


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
