"""Packed variable-length sequences (FlashAttention's ``cu_seqlens``) for linear_scan and newton_apply.

x (or b) is [1, T, ...] holding S sequences back to back; sequence s covers t in
[cu_seqlens[s], cu_seqlens[s + 1]). Empty sequences (equal neighbours) are allowed: they have no
steps, so their h0 enters nothing. No state crosses a boundary.

* linear_scan: one scan over the packed sequence, with A cut at each sequence's first step (so the
  forward recurrence does not carry h across the boundary, nor the reverse one lambda) and each
  sequence's h0 added to its first b. The first step of the packed sequence keeps its A and takes
  its h0 as the operator's h0, so a single sequence is the unpacked call exactly.
* newton_apply: the sequences gathered into padded batches, one solve each, the valid positions
  gathered back. Padding follows each sequence's end, so the causal recurrence cannot carry it
  into the sequence's states, and its gradient is dropped. Eager mode, which reads the lengths on
  the host for the checks, pads groups of similar length (length_groups) each to its own longest;
  compiled graphs pad all S sequences to max_seqlen (or the longest) in one batch.
"""

from __future__ import annotations

from typing import Optional

import torch

INDEX_DTYPES = (torch.int32, torch.int64)


# ---- cu_seqlens ----------------------------------------------------------------------------------------

def check_cu_seqlens(function, cu_seqlens, data, data_name, max_seqlen=None, host_lengths=False):
    """Checks cu_seqlens against data ([1, T, ...]); returns it as int64, S, and the longest
    sequence's length (None in compiled graphs, where reading it would be a graph break); with
    host_lengths, a fourth value: every sequence's length as a list (None in compiled graphs).

    The shape, dtype and device are checked on the host. The values (cu_seqlens[0] = 0,
    cu_seqlens[-1] = T, non-decreasing, and no sequence longer than max_seqlen) are read on the host
    in eager mode (one device synchronisation, naming the values); in compiled graphs they are
    torch._assert_async checks, which do not synchronise (a CUDA device-side assertion)."""
    if not isinstance(cu_seqlens, torch.Tensor):
        raise TypeError(f"{function}: argument 'cu_seqlens' is a {type(cu_seqlens).__name__}, expected an int32 or "
                        "int64 tensor [S + 1] of sequence offsets")
    if cu_seqlens.dim() != 1 or cu_seqlens.shape[0] < 2:
        raise ValueError(f"{function}: argument 'cu_seqlens' has shape {list(cu_seqlens.shape)}, expected [S + 1] "
                         "with S >= 1 sequences (1-D: 0, the ends of the sequences, T)")
    if cu_seqlens.dtype not in INDEX_DTYPES:
        raise TypeError(f"{function}: argument 'cu_seqlens' has dtype {cu_seqlens.dtype}, expected torch.int32 or "
                        "torch.int64")
    if cu_seqlens.device != data.device:
        raise ValueError(f"{function}: argument 'cu_seqlens' is on device {cu_seqlens.device}, expected "
                         f"{data.device} (the device of argument '{data_name}')")
    if data.dim() < 2 or data.shape[0] != 1:
        raise ValueError(f"{function}: argument '{data_name}' has shape {list(data.shape)}, expected [1, T, ...] "
                         "with cu_seqlens (the sequences packed end to end in one batch element)")
    if max_seqlen is not None and (isinstance(max_seqlen, bool) or not isinstance(max_seqlen, int) or max_seqlen < 0):
        raise (ValueError if isinstance(max_seqlen, int) and not isinstance(max_seqlen, bool) else TypeError)(
            f"{function}: argument 'max_seqlen' is {max_seqlen!r}, expected None or an int >= 0 (the longest "
            "sequence's length, or more)")
    T = data.shape[1]
    offsets = cu_seqlens.long()
    lengths = offsets[1:] - offsets[:-1]
    if torch.compiler.is_compiling():
        ok = (offsets[0] == 0) & (offsets[-1] == T) & (lengths >= 0).all()
        if max_seqlen is not None:
            ok = ok & (lengths <= max_seqlen).all()
        bound = "" if max_seqlen is None else f", with no sequence longer than max_seqlen = {max_seqlen}"
        torch._assert_async(ok, f"{function}: argument 'cu_seqlens' must start at 0, end at T = {T} (the length of "
                                f"argument '{data_name}') and not decrease{bound}")
        return (offsets, cu_seqlens.shape[0] - 1, None) + ((None,) if host_lengths else ())
    if host_lengths:
        host = offsets.tolist()
        all_lengths = [end - start for start, end in zip(host, host[1:])]
        first, last, shortest, longest = host[0], host[-1], min(all_lengths), max(all_lengths)
    else:
        first, last, shortest, longest = torch.stack([offsets[0], offsets[-1], lengths.min(), lengths.max()]).tolist()
    if first != 0 or last != T or shortest < 0:
        shown = cu_seqlens.tolist() if cu_seqlens.shape[0] <= 12 else \
            cu_seqlens[:6].tolist() + ["..."] + cu_seqlens[-6:].tolist()
        wrong = "its first value is not 0" if first != 0 else (
            f"its last value is {last}, not T = {T} (the length of argument '{data_name}')" if last != T else
            "it decreases")
        raise ValueError(f"{function}: argument 'cu_seqlens' is {shown}: {wrong}; expected 0 = cu_seqlens[0] <= "
                         f"cu_seqlens[1] <= ... <= cu_seqlens[-1] = T = {T}")
    if max_seqlen is not None and longest > max_seqlen:
        raise ValueError(f"{function}: argument 'max_seqlen' is {max_seqlen}, but the longest sequence of "
                         f"cu_seqlens has {longest} steps; expected max_seqlen >= {longest}")
    return (offsets, cu_seqlens.shape[0] - 1, longest) + ((all_lengths,) if host_lengths else ())


# ---- linear_scan ---------------------------------------------------------------------------------------

def linear_scan_packed(scan, A, b, h0, structure, reverse, cu_seqlens):
    """linear_scan over packed sequences: see the module docstring. scan is linear_scan without cu_seqlens."""
    offsets, S, _ = check_cu_seqlens("linear_scan", cu_seqlens, b, "b")
    T, N = b.shape[1], b.shape[2]
    if h0 is not None:
        if reverse:
            raise ValueError("linear_scan: argument 'h0' is given with reverse=True, expected None (each sequence's "
                             "reverse recurrence starts from lambda at its last step = b there)")
        _check_packed_state("linear_scan", h0, b, [S, N], "[S, N]")
    if T == 0:
        return scan(A, b, None, structure, reverse)
    # Indices are clamped: compiled graphs check the values on the device, without stopping here.
    starts = offsets[:-1].clamp(0, T)
    # A at the first step of every sequence except the packed sequence's own first step (t = 0, whose
    # A is either multiplied by the operator's h0 or, in reverse, never read). Forward this cuts
    # h_{t-1} out of h_t; in reverse, lambda_{t-1} = A_t^T lambda_t + b_{t-1} is cut at the same t,
    # so lambda at each sequence's last step is b there. An empty sequence's start is the next
    # sequence's start (or T, the extra entry dropped here).
    cut = torch.zeros(T + 1, dtype=torch.bool, device=b.device).index_fill(0, starts, True)[:T]
    cut[0] = False
    A_cut = torch.where(cut.view((1, T) + (1,) * (A.dim() - 2)), 0.0, A)
    if h0 is None:
        return scan(A_cut, b, None, structure, reverse)
    # Sequence s enters through b at its first step t_s > 0: b_{t_s} + A_{t_s} h0_s. The sequence that
    # holds t = 0 (the first non-empty one) enters through the operator's h0.
    first_step = starts.clamp(max=T - 1)
    enters_through_b = (offsets[1:] > offsets[:-1]) & (starts > 0)
    entry = _apply(A[0].index_select(0, first_step), h0, structure)
    entry = torch.where(enters_through_b.unsqueeze(-1), entry, 0.0)
    b_entered = b.index_add(1, first_step, entry.unsqueeze(0))
    first_sequence = (torch.searchsorted(offsets, offsets.new_zeros(1), right=True) - 1).clamp(0, S - 1)
    return scan(A_cut, b_entered, h0.index_select(0, first_sequence), structure, reverse)


def _apply(A, h, structure):
    """A_s h_s for A [S, ...] in the structure and h [S, N]."""
    if structure == "diag":
        return A * h
    if structure == "dense":
        return torch.einsum("sij,sj->si", A, h)
    k = A.shape[-1]
    return torch.einsum("sgij,sgj->sgi", A, h.reshape(h.shape[0], -1, k)).flatten(1)


def _check_packed_state(function, tensor, data, expected, layout, name="h0"):
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{function}: argument '{name}' is a {type(tensor).__name__}, expected a tensor {expected} "
                        f"({layout}: one state per sequence of cu_seqlens)")
    if list(tensor.shape) != list(expected):
        raise ValueError(f"{function}: argument '{name}' has shape {list(tensor.shape)}, expected {list(expected)} "
                         f"({layout}: one state per sequence of cu_seqlens, S = {expected[0]})")
    if tensor.dtype != data.dtype:
        raise TypeError(f"{function}: argument '{name}' has dtype {tensor.dtype}, expected {data.dtype} (the dtype of "
                        "argument 'b')")
    if tensor.device != data.device:
        raise RuntimeError(f"{function}: argument '{name}' is on device {tensor.device}, expected {data.device} (the "
                           "device of argument 'b')")


# ---- newton_apply --------------------------------------------------------------------------------------

def newton_apply_packed(solve, cell, x, h0, cu_seqlens, max_seqlen: Optional[int], input_size, **settings):
    """newton_apply over packed sequences: solve (newton_apply) on padded batches, one per group of
    similar lengths in eager mode (length_groups), one [S, T_max, ...] in compiled graphs."""
    if cu_seqlens is None:
        raise ValueError(f"newton_apply: argument 'max_seqlen' is {max_seqlen!r} without cu_seqlens, expected None "
                         "(max_seqlen is the longest of the packed sequences)")
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"newton_apply: argument 'x' is a {type(x).__name__}, expected a tensor [1, T, input_size] "
                        "with cu_seqlens")
    if x.dim() != 3:
        raise ValueError(f"newton_apply: argument 'x' has shape {list(x.shape)}, expected [1, T, input_size] with "
                         "cu_seqlens")
    if isinstance(input_size, int) and x.shape[-1] != input_size:
        raise ValueError(f"newton_apply: argument 'x' has shape {list(x.shape)}, expected [1, T, {input_size}] "
                         "([1, T, input_size] with cu_seqlens)")
    offsets, S, longest, lengths = check_cu_seqlens("newton_apply", cu_seqlens, x, "x", max_seqlen, host_lengths=True)
    states_given = True
    for name, state in _states(h0):
        if not isinstance(state, torch.Tensor):
            states_given = False
            break  # the solve names what is wrong with it
        if state.dim() < 1 or state.shape[0] != S:
            raise ValueError(f"newton_apply: argument '{name}' has shape {list(state.shape)}, expected [{S}, ...] "
                             f"([S, hidden_size]: one state per sequence of cu_seqlens, S = {S})")
    T = x.shape[1]
    if lengths is not None and T > 0 and states_given:
        grouped = _solve_by_length(solve, cell, x, h0, offsets, lengths, settings)
        if grouped is not None:
            return grouped
    if max_seqlen is not None:
        longest = max_seqlen
    elif longest is None:  # compiled: the padded shape depends on the values (a graph break)
        longest = int((offsets[1:] - offsets[:-1]).max())
    padded = _padded(_rows_of(x), offsets[:-1], offsets[1:] - offsets[:-1], longest)
    result = solve(cell, padded, h0=h0, **settings)
    states, stats = result if settings.get("return_stats") else (result, None)
    unpadded = _unpadded([states], torch.arange(S, device=x.device) * longest, offsets, T)
    return (unpadded, stats) if settings.get("return_stats") else unpadded


def _rows_of(x):
    """x [1, T, input]'s rows and a zero row T after them, the padding's input."""
    return torch.cat([x[0], x.new_zeros((1, x.shape[2]))])


def _padded(rows_of_x, start, length, longest):
    """The sequences (start, length: [R] on the device) as a padded batch [R, longest, input]:
    position (r, j) reads packed row start_r + j while j < length_r, else the zero row."""
    T = rows_of_x.shape[0] - 1
    steps = torch.arange(longest, device=rows_of_x.device)
    rows = torch.where(steps < length.unsqueeze(1), start.unsqueeze(1) + steps, T).clamp(0, T).flatten()
    return rows_of_x.index_select(0, rows).view(start.shape[0], longest, rows_of_x.shape[1])


def _unpadded(results, first_position, offsets, T):
    """[1, T, ...] (each state of a tuple alike) from padded solves' states [R, steps, ...], their
    rows one after the other: packed step t of the sequence s that holds it (the last one starting
    at or before t: empty sequences start where the next one does) is row first_position[s] + t - offsets[s]."""
    t = torch.arange(T, device=offsets.device)
    sequence = (torch.searchsorted(offsets, t, right=True) - 1).clamp(0, offsets.shape[0] - 2)
    flat = first_position.index_select(0, sequence) + t - offsets.index_select(0, sequence)

    def gather(*states):
        rows = states[0].flatten(0, 1) if len(states) == 1 else torch.cat([y.flatten(0, 1) for y in states])
        return rows.index_select(0, flat.clamp(0, max(rows.shape[0] - 1, 0))).unsqueeze(0)
    return tuple(gather(*states) for states in zip(*results)) if isinstance(results[0], tuple) else gather(*results)


# A group of sequences takes the next (shorter) one while its padded steps stay within 1 + GROUP_SLACK
# of the steps it holds; the last of MOST_GROUPS groups takes the rest.
GROUP_SLACK, MOST_GROUPS = 0.25, 4


def length_groups(lengths):
    """The non-empty sequences in groups for padded solves, longest first: [(members, longest)].
    Each group pads to its own longest; a single padded batch would pad every sequence to the
    longest of all (a long document among short ones multiplies the work)."""
    groups = []  # [members, longest, steps]
    for s in sorted((s for s, n in enumerate(lengths) if n > 0), key=lambda s: -lengths[s]):
        if groups:
            members, longest, steps = groups[-1]
            if len(groups) == MOST_GROUPS or (len(members) + 1) * longest <= (1 + GROUP_SLACK) * (steps + lengths[s]):
                members.append(s)
                groups[-1][2] += lengths[s]
                continue
        groups.append([[s], lengths[s], lengths[s]])
    return [(members, longest) for members, longest, _ in groups]


def _solve_by_length(solve, cell, x, h0, offsets, lengths, settings):
    """Eager: one padded solve per group of length_groups, the valid positions gathered back into
    [1, T, ...] with one index_select. With return_stats the residual is per sequence ([S], 0 for
    an empty one), the iterations the most of any group, the backend that of the group with the
    most padded steps. None (solve once, padded) where a group diverges, so that the error names
    the sequences as one solve does."""
    from .newton import NewtonDivergenceError, NewtonStats  # newton imports this module
    T, device = x.shape[1], x.device
    groups = length_groups(lengths)
    # Every index the gathers need, in one upload before any solve (an upload waits for the device):
    # per group its members, their starts and lengths; then where each sequence's first step lies
    # in the groups' results, flattened one after the other.
    starts, table, first_position, position = [0], [], [0] * len(lengths), 0
    for length in lengths:
        starts.append(starts[-1] + length)
    for members, longest in groups:
        table += members + [starts[s] for s in members] + [lengths[s] for s in members]
        for row, s in enumerate(members):
            first_position[s] = position + row * longest
        position += len(members) * longest
    indices = torch.tensor(table + first_position, device=device)
    rows_of_x = _rows_of(x)
    results, used = [], 0
    residual, iterations, backend, most_steps = None, 0, None, -1
    for members, longest in groups:
        member_index, start, length = indices[used:used + 3 * len(members)].view(3, len(members))
        used += 3 * len(members)
        group_h0 = None if h0 is None else _map_states(lambda state: state.index_select(0, member_index), h0)
        try:
            result = solve(cell, _padded(rows_of_x, start, length, longest), h0=group_h0, **settings)
        except NewtonDivergenceError:
            return None
        if settings.get("return_stats"):
            result, stats = result
            if residual is None:
                residual = stats.residual.new_zeros(len(lengths))
            residual = residual.index_copy(0, member_index, stats.residual)
            iterations = max(iterations, stats.iterations)
            if len(members) * longest > most_steps:
                backend, most_steps = stats.backend, len(members) * longest
        results.append(result)
    states = _unpadded(results, indices[used:], offsets, T)
    return (states, NewtonStats(residual, iterations, backend)) if settings.get("return_stats") else states


def _states(h0):
    if isinstance(h0, (tuple, list)):
        return [(f"h0[{i}]", state) for i, state in enumerate(h0)]
    return [] if h0 is None else [("h0", h0)]


def _map_states(fn, states):
    return tuple(fn(state) for state in states) if isinstance(states, tuple) else fn(states)
