"""linear_scan: linear recurrences h_t = A_t h_{t-1} + b_t by paraseq's ordered parallel scan."""

from ._ops import ops

STRUCTURES = ("diag", "block", "dense")


def linear_scan(A, b, h0=None, structure="diag", reverse=False):
    """h_t = A_t h_{t-1} + b_t with h_{-1} = h0 (zero when None); returns h [B, T, N].

    A: [B, T, N] ("diag"), [B, T, N/k, k, k] ("block", k = 2, 3 or 4) or [B, T, N, N] ("dense",
    N <= 32); b: [B, T, N]; h0: [B, N]. reverse=True returns lambda with lambda_{T-1} = b_{T-1} and
    lambda_t = A_{t+1}^T lambda_{t+1} + b_t (the adjoint recurrence; h0 must be None).
    float16/bfloat16 are stored as such and accumulated in float32.
    """
    if structure not in STRUCTURES:
        raise ValueError(f"linear_scan: argument 'structure' is {structure!r}, "
                         f"expected one of {', '.join(map(repr, STRUCTURES))}")
    return ops.linear_scan(A, b, h0, structure, reverse)
