"""newton_apply for a cell of your own (pararnn's RNNCell protocol), in PyTorch around linear_scan.

A cell is an nn.Module with an int `hidden_size` and `step(h_prev, x)`, which maps states
[..., H] (or [..., state_slots, H]) and inputs [..., input] to the next states for any leading
dimensions. Each Newton iteration linearises step around the current iterate at every t at once
(Jacobians from torch.func) and solves the linear recurrence with one linear_scan (with the quasi
Jacobian, NewtonConfig(jacobian="quasi"), only the Jacobian's diagonal: a diagonal scan). Gradients are
the adjoint of the solution, h_t = step(h_{t-1}, x_t), not of the iterations: one reverse
linear_scan with the transposed Jacobians at the solution, then one vjp of step over all t (the
autograd graph of one batched call of step). With a process group (sequence parallelism,
_distributed.py) each rank solves its slice of t: the state entering the slice comes from the rank
before at every iteration, and the linear solves are distributed scans.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.func import jacrev, jvp, vmap

from ._distributed import RefuseSecondDerivative, shifted
from .scan import linear_scan

JAC_STRUCTURES = ("diag", "block2", "block4", "dense")
STATE_SLOTS = (1, 2, 4)
DENSE_MAX_STATE = 32  # linear_scan's dense structure


class CellLayout:
    """The cell's state layout ([..., H] or [..., slots, H]), its Jacobian structure and the
    matching layout of linear_scan's state [..., N]: slot-major for diag and dense, channel-major
    (each channel's k slots adjacent) for block2/block4, whose blocks couple the slots of a channel."""

    def __init__(self, cell):
        if not isinstance(cell, nn.Module):
            raise TypeError(f"newton_apply: argument 'cell' is a {type(cell).__module__}.{type(cell).__name__}, "
                            "expected a paraseq.ParaGRU, paraseq.ParaLSTM or an nn.Module with hidden_size and "
                            "step(h_prev, x) (docs/migration.md)")
        name = type(cell).__name__
        given = f"newton_apply: argument 'cell' is a {type(cell).__module__}.{name}, expected a paraseq.ParaGRU, " \
                "paraseq.ParaLSTM or a cell of your own (torch.nn.GRU and LSTM have other gates), which needs"
        hidden = getattr(cell, "hidden_size", getattr(cell, "d_h", None))
        if isinstance(hidden, bool) or not isinstance(hidden, int) or hidden < 1:
            raise TypeError(f"{given} an int attribute hidden_size >= 1 (it has {hidden!r}) and a method "
                            "step(h_prev, x)")
        if not callable(getattr(cell, "step", None)):
            raise TypeError(f"{given} a method step(h_prev, x) that returns the next state for states "
                            "[..., hidden_size] and inputs [..., input] (it has none)")
        slots = getattr(cell, "state_slots", 1)
        if slots not in STATE_SLOTS or isinstance(slots, bool):
            raise ValueError(f"newton_apply: argument 'cell' (a {name}) has state_slots {slots!r}, expected 1, 2 or 4")
        structure = getattr(cell, "jac_structure", None) or "dense"
        if structure not in JAC_STRUCTURES:
            raise ValueError(f"newton_apply: argument 'cell' (a {name}) has jac_structure {structure!r}, expected one "
                             f"of {', '.join(map(repr, JAC_STRUCTURES))} (or none: 'dense')")
        block = {"block2": 2, "block4": 4}.get(structure)
        if block is not None and slots != block:
            raise ValueError(f"newton_apply: argument 'cell' (a {name}) has jac_structure {structure!r} with "
                             f"state_slots {slots}, expected state_slots {block}: {structure} couples the {block} "
                             "slots of each channel")
        if structure == "dense" and slots * hidden > DENSE_MAX_STATE:
            raise ValueError(f"newton_apply: argument 'cell' (a {name}) has jac_structure 'dense' with a state of "
                             f"{slots * hidden} values (state_slots {slots} x hidden_size {hidden}), expected at most "
                             f"{DENSE_MAX_STATE} (linear_scan's dense limit); declare jac_structure 'diag', 'block2' "
                             "or 'block4' if the Jacobian has that structure")
        self.cell, self.hidden, self.slots, self.structure, self.block = cell, hidden, slots, structure, block
        self.state_size = slots * hidden
        self.scan_structure = "block" if block else structure

    def state_shape(self, leading):
        return (*leading, self.hidden) if self.slots == 1 else (*leading, self.slots, self.hidden)

    def to_scan(self, state):
        """[B, T, (slots,) H] -> [B, T, N] in linear_scan's layout."""
        if self.block:
            state = state.transpose(-1, -2)
        return state.reshape(*state.shape[:2], self.state_size)

    def from_scan(self, flat):
        B, T = flat.shape[:2]
        if self.block:
            return flat.reshape(B, T, self.hidden, self.slots).transpose(-1, -2)
        return flat.reshape(self.state_shape((B, T)))

    def step(self, h_prev, x):
        out = self.cell.step(h_prev, x)
        if not torch.is_tensor(out) or out.shape != h_prev.shape or out.dtype != h_prev.dtype:
            given = (f"shape {list(out.shape)} and dtype {out.dtype}" if torch.is_tensor(out)
                     else f"a {type(out).__name__}")
            raise ValueError(f"newton_apply: argument 'cell' (a {type(self.cell).__name__}) returned {given} from "
                             f"step(h_prev, x), expected h_prev's shape {list(h_prev.shape)} and dtype {h_prev.dtype}")
        return out

    def linearize(self, h_prev, x):
        """(step(h_prev, x), A): A the Jacobian d step / d h_prev at every (b, t) in linear_scan's
        structure: [B, T, N] (diag), [B, T, H, k, k] (block k, [.., channel, out slot, in slot]) or
        [B, T, N, N] (dense, slot-major)."""
        if h_prev.shape[1] == 0:  # an empty slice of a distributed solve: nothing to differentiate
            return self.step(h_prev, x), h_prev.new_zeros(self.jacobian_shape(h_prev.shape[0]))
        step_at = lambda h: self.step(h, x)
        if self.structure == "diag":
            value, diagonal = jvp(step_at, (h_prev,), (torch.ones_like(h_prev),))
            return value, self.to_scan(diagonal)
        if self.block:
            columns = []
            for slot in range(self.block):  # column `slot` of each channel's block: one jvp
                probe = torch.zeros_like(h_prev)
                probe[..., slot, :] = 1
                value, column = jvp(step_at, (h_prev,), (probe,))
                columns.append(column)
            # [B, T, out slot, H, in slot] -> [B, T, H, out slot, in slot]
            return value, torch.stack(columns, dim=-1).permute(0, 1, 3, 2, 4)
        shape = h_prev.shape[2:]

        def flat_step(h_flat, x_t):
            out = self.step(h_flat.reshape(shape), x_t).reshape(self.state_size)
            return out, out

        jacobian, value = vmap(vmap(jacrev(flat_step, has_aux=True)))(self.to_scan(h_prev), x)
        return self.from_scan(value), jacobian

    def diagonal(self, A):
        """The diagonal of A (linearize's structure) as a diagonal Jacobian [B, T, N] of linear_scan's
        layout: the quasi Jacobian. A block's diagonal is its channel's slots, adjacent as in to_scan."""
        if self.structure == "diag":
            return A
        return A.diagonal(dim1=-2, dim2=-1).reshape(*A.shape[:2], self.state_size)

    def jacobian_shape(self, B, T=0):
        if self.structure == "diag":
            return (B, T, self.state_size)
        if self.block:
            return (B, T, self.hidden, self.block, self.block)
        return (B, T, self.state_size, self.state_size)

    def apply_jacobian(self, A, v):
        """A v in linear_scan's layout, for the structure check."""
        if self.structure == "diag":
            return A * v
        if self.block:
            groups = v.reshape(*v.shape[:2], self.hidden, self.block, 1)
            return (A @ groups).reshape(v.shape)
        return (A @ v.unsqueeze(-1)).squeeze(-1)


def check_structure(layout, A, h_prev, x, slices=None):
    """Refuses a jac_structure that the step does not have: the directional derivative along a
    vector with no structure must equal the structured Jacobian applied to it (one jvp). Over ranks,
    the error and the scale are maxima over the ranks, so that every rank decides alike."""
    error, scale = 0.0, 0.0
    if h_prev.shape[1]:
        N = layout.state_size
        index = torch.arange(N, dtype=torch.float64, device=h_prev.device)
        probe_flat = (1 + 0.5 * torch.sin(1.7 * index + 0.3)).to(h_prev.dtype).expand(*h_prev.shape[:2], N)
        probe = layout.from_scan(probe_flat).contiguous()
        _, exact = jvp(lambda h: layout.step(h, x), (h_prev,), (probe,))
        exact = layout.to_scan(exact)
        error = (exact - layout.apply_jacobian(A, probe_flat)).abs().max().item()
        scale = exact.abs().max().item() + A.abs().max().item()
    if slices is not None:
        not_finite = float(not error <= float("inf"))
        measured = torch.tensor([not_finite, error if not not_finite else 0.0, scale], dtype=torch.float64,
                                device=h_prev.device)
        not_finite, error, scale = slices.max(measured).tolist()
        error = float("nan") if not_finite else error
    tolerance = 10 * torch.finfo(h_prev.dtype).eps ** 0.5 * max(scale, 1.0)
    if not error <= tolerance:
        raise ValueError(f"newton_apply: argument 'cell' (a {type(layout.cell).__name__}) declares jac_structure "
                         f"{layout.structure!r}, but the Jacobian of its step with respect to h_prev is not "
                         f"{layout.structure} (|J v - J_{layout.structure} v| = {error:.3g} for a test vector v, "
                         f"tolerance {tolerance:.3g}); declare jac_structure 'dense', or the structure it has")


SECOND_DERIVATIVE_REFUSED = (
    "newton_apply: the gradient of a cell of your own is not differentiable (no second derivatives: Hessians, "
    "gradgradcheck, a gradient penalty's backward); differentiate a loop over t of cell.step for those")


class _FixedPointAdjoint(torch.autograd.Function):
    """Returns the solution h; sends the adjoint lambda (dL/dh through all later steps) to
    step_at_solution = step(h_prev, x), whose graph carries it to x, h0 and the cell's tensors.
    lambda_t = g_t + A_{t+1}^T lambda_{t+1}: linear_scan with reverse=True.

    Over ranks (slices given) the reverse scan is distributed. h0 is an input for one case only:
    group rank 0 with an empty slice, where h0's gradient (A_0^T lambda_0) is what the reverse scan
    passes on to rank 0, not a vjp of rank 0's (empty) step; anchor makes this rank's result
    require grad when only other ranks' inputs do, so that its backward joins the collective."""

    @staticmethod
    def forward(step_at_solution, h, A, layout, slices, h0, anchor):
        return h.clone()

    @staticmethod
    def setup_context(ctx, inputs, output):
        step_at_solution, _, A, layout, slices, h0, _ = inputs
        ctx.save_for_backward(A, step_at_solution)
        ctx.layout, ctx.slices, ctx.h0_given = layout, slices, h0 is not None

    @staticmethod
    def backward(ctx, grad_h):
        A, anchor = ctx.saved_tensors
        layout, slices = ctx.layout, ctx.slices
        grad_flat = layout.to_scan(grad_h).contiguous()
        grad_h0 = None
        if slices is None:
            adjoint = linear_scan(A, grad_flat, None, layout.scan_structure, reverse=True)
        else:
            adjoint, _, leaving = slices.scan(A, grad_flat, layout.scan_structure, reverse=True, ordered=False)
            if ctx.h0_given and grad_h.shape[1] == 0:
                grad_h0 = layout.from_scan(leaving.to(grad_h.dtype).unsqueeze(1)).squeeze(1)
        if torch.is_grad_enabled():  # create_graph=True: the result may be differentiated again
            adjoint = RefuseSecondDerivative.apply(adjoint, SECOND_DERIVATIVE_REFUSED, anchor)
        return layout.from_scan(adjoint), None, None, None, None, grad_h0, None


def solve(layout, x, h0, cfg, return_stats, slices=None):
    """(h [B, T, (slots,) H], the residual [B] (float64; None when neither asked for nor checked),
    the Newton iterations run). slices: a _distributed.NewtonSlices when each rank of a process
    group holds a slice of t."""
    eager = not torch.compiler.is_compiling()
    B, T = x.shape[:2]
    dtype = h0.dtype if h0 is not None else x.dtype
    check = eager and cfg.residual_fail is not None
    # The quasi Jacobian: the iterations' scans take the diagonal alone (the adjoint stays exact).
    quasi = cfg.jacobian == "quasi"
    newton_structure = "diag" if quasi else layout.scan_structure
    if slices is None:
        entering = lambda h: h0
        scan = lambda A, rhs: linear_scan(A, rhs, None, newton_structure)
    else:
        entering = lambda h: slices.entering(h, h0)
        scan = lambda A, rhs: slices.scan(A, rhs, newton_structure)[0]
    with torch.no_grad():
        h = layout.step(torch.zeros(layout.state_shape((B, T)), dtype=dtype, device=x.device), x)  # f(0, x_t)
        for _ in range(cfg.picard_iters):
            h = layout.step(shifted(h, entering(h)), x)
        iterations = 0
        for _ in range(cfg.max_iters):
            value, A = layout.linearize(shifted(h, entering(h)), x)
            if eager and cfg.residual_atol is not None and _largest(h - value, slices) <= cfg.residual_atol:
                break
            delta = scan(layout.diagonal(A) if quasi else A, layout.to_scan(value - h).contiguous())
            h = h + cfg.omega * layout.from_scan(delta)
            iterations += 1
    if slices is None and not torch.is_grad_enabled() and not (return_stats or check):
        return h, None, iterations  # neither an adjoint nor the residual: no step at the solution
    h_prev = shifted(h, entering(h))  # h0 with its graph: the adjoint reaches it through step at t = 0
    step_at_solution = layout.step(h_prev, x)
    # h0 too: over ranks, group rank 0's h0 reaches the solution through other ranks' steps when
    # rank 0's slice is empty
    needs_adjoint = step_at_solution.requires_grad or (h0 is not None and h0.requires_grad and torch.is_grad_enabled())
    residual = None
    if return_stats or check:
        residual = (h - step_at_solution.detach()).abs().flatten(1).amax(1).to(torch.float64) if T else \
            torch.zeros(B, dtype=torch.float64, device=x.device)
    needs_adjoint_here = needs_adjoint
    if slices is not None:  # every rank decides alike: the residual and the need of an adjoint over all ranks
        needs_adjoint, residual = slices.needs_adjoint(needs_adjoint, residual)
    check_structure_here = check and layout.structure != "dense"
    if needs_adjoint or check_structure_here:
        with torch.no_grad():
            _, A = layout.linearize(h_prev.detach(), x.detach())
        if check_structure_here:
            with torch.no_grad():
                check_structure(layout, A, h_prev.detach(), x.detach(), slices)
    if needs_adjoint:
        if slices is None:
            h = _FixedPointAdjoint.apply(step_at_solution, h, A, layout, None, None, None)
        else:
            anchor = slices.anchor(needs_adjoint_here, x.device)
            h = _FixedPointAdjoint.apply(step_at_solution, h, A, layout, slices, h0, anchor)
    return h, residual, iterations


def _largest(change, slices):
    """max |change| (over the ranks too), on the host: residual_atol's early stop."""
    largest = change.abs().max() if change.numel() else change.new_zeros(())
    return (slices.max(largest) if slices is not None else largest).item()


def check_initial_state(layout, x, h0):
    if h0 is None:
        return None
    expected = list(layout.state_shape((x.shape[0],)))
    described = "[B, hidden_size]" if layout.slots == 1 else "[B, state_slots, hidden_size]"
    if not torch.is_tensor(h0):
        raise TypeError(f"newton_apply: argument 'h0' is a {type(h0).__name__}, expected a tensor {expected} "
                        f"({described})")
    if list(h0.shape) != expected:
        raise ValueError(f"newton_apply: argument 'h0' has shape {list(h0.shape)}, expected {expected} ({described})")
    if not h0.is_floating_point():
        raise TypeError(f"newton_apply: argument 'h0' has dtype {h0.dtype}, expected a floating-point dtype")
    return h0
