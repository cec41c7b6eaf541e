"""A cell of your own as a C++ cell of the Newton solver (src/solvers/cell.hpp): traced once, emitted.

step(h_prev, x) is traced with torch.fx (make_fx on fake tensors) on one row, h_prev [H] or
[state_slots, H] and x [input], with the tensors the cell uses as inputs (those the general path
differentiates: parameters, buffers, tensors of closures and globals). The graph splits in two:

* the prologue, every operation that does not depend on h_prev (an input map of x, functions of
  the parameters, constants). It runs in PyTorch once per solve, over all rows (b, t) at once
  (torch.vmap); what the recurrence reads of it is the solver's input u [B, T, ...] (values that
  depend on x) or its parameter vector (values that do not), so autograd carries their gradients
  on to x and to the cell's tensors.
* the recurrence, every operation that depends on h_prev. It is evaluated element by element into
  a program of scalar operations (each element of the result an expression of elements of h_prev,
  u and the parameters) and cut into the groups of the cell's Jacobian structure: one state element
  ("diag"), the k slots of a channel ("block2", "block4") or the whole state ("dense"). A group's
  result may read h_prev only within the group (checked exactly: a declared structure that the step
  does not have raises ValueError), and every group must run the same program on elements of its
  own, so that one C++ function of the group index serves them all; a table per group says which
  elements of u and of the parameters it reads.

The C++ struct UserCell evaluates a group's program in a templated step (dual numbers give its
Jacobian, src/loops/dual.hpp) and a generated reverse-mode vjp. Its input and parameter vector hold
each group's own copies of what the group reads, in the order of its program, so that every input
column and parameter slot belongs to one group as the cell concept requires; the gather (one
index_select each) sums the gradients of elements that several groups read. For the diagonal and
block structures the source does not depend on hidden_size: one extension serves every size.

Supported in the recurrence: + - * / neg, ** a constant, exp, log, tanh, sigmoid, sin, cos, sqrt,
abs, relu, reciprocal, sign; leaky_relu, hardtanh (relu6), elu (selu), softplus, hardsigmoid, silu
with their constants; where, masked_fill, comparisons, isnan, isinf, isfinite, logical
and/or/xor/not (their scalars are bools), heaviside, maximum, minimum, clamp to numbers or tensors;
indexing, slicing, reshapes, transposes, stack, cat, unbind; sum and mean, max and min of a
dimension (their values), amax and amin over any dimensions; matrix products (mm, addmm, mv,
addmv, dot, bmm: @, F.linear, torch.matmul); zeros_like and the like. The derivatives, in the
Jacobian from dual numbers as in the vjp, are torch's at kinks and ties too; an operation whose
result the step is not differentiable in (one used only in a mask) has no adjoint lines. The
prologue may hold any operation torch.vmap can batch, except random ones; it gives booleans (a
condition on x alone) as 1 or 0. Anything else raises Unsupported naming it.
"""

from __future__ import annotations

import hashlib
import math
from typing import NamedTuple

import torch

from . import _field_codegen
from ._field_codegen import _EXTREMES, _MATH_FUNCTIONS, _MOVES, _SELECTIONS, Unsupported, _describe, _is_boolean, \
    _literal, _name, _shape, _shape_of, check_precision, extreme_kind, extreme_output, selection, unary_functions, \
    unary_key

STRUCTURE_TYPES = {"diag": "paraseq::Diagonal", "block2": "paraseq::BlockDiagonal<2>",
                   "block4": "paraseq::BlockDiagonal<4>"}
_PRODUCTS = {"mm", "addmm", "mv", "addmv", "dot", "bmm"}
_FILLS = {"zeros_like": 0, "ones_like": 1, "full_like": None, "new_zeros": 0, "new_ones": 1, "new_full": None}
_STATE_MOVES = _MOVES - {"detach"}  # a detached h_prev would change the Jacobian: not taken as a move


def trace(token, tensors, state_shape, input_size, dtype, x_dtype):
    """step's graph (torch.fx.GraphModule) of (h_prev, x, *tensors) on one row of fake tensors."""
    h = torch.zeros(state_shape, dtype=dtype)
    x = torch.zeros((input_size,), dtype=x_dtype)
    return _field_codegen.trace_call(
        token, (h, x), tensors, f"a step(h_prev, x) that cannot be traced on one row, h_prev {list(state_shape)} and "
        f"x [{input_size}] (a data-dependent branch, .item(), a conversion to a Python number, or indexing that "
        "assumes leading dimensions")


# ---- the recurrence as scalar operations -----------------------------------------------------------
#
# A scalar is an index into Recurrence.ops; an operation is a tuple:
#   ("h", e)  element e of h_prev (flat, per row)   ("u", c), ("p", c)  column c of the prologue's
#   ("c", value)  a constant                          inputs, of its parameters
#   ("unary", _field_codegen.unary_key, a)      ("add" | "sub" | "mul" | "div", a, b)  ("pow", a, exponent)
#   ("dot", bias or None, ((a0, b0), (a1, b1), ...))  bias + a0 b0 + a1 b1 + ...
#   ("sum", divisor, (t0, t1, ...))                   (t0 + t1 + ...) / divisor
#   ("extreme", maximum, ties, (t0, t1, ...))         max or min of t0, t1, ... (ties: extreme_kind's)
#   (name of _field_codegen._SELECTIONS, operand, ...)  where, maximum, comparisons, logical operations
# A scalar of a comparison or logical operation is a bool; the others are numbers.

def _operands(op):
    kind = op[0]
    if kind in ("h", "u", "p", "c"):
        return ()
    if kind == "unary":
        return (op[2],)
    if kind == "pow":
        return (op[1],)
    if kind == "dot":
        return ((op[1],) if op[1] is not None else ()) + tuple(x for pair in op[2] for x in pair)
    if kind == "sum":
        return op[2]
    if kind == "extreme":
        return op[3]
    return op[1:]


def _is_boolean_op(op):
    return op[0] in _SELECTIONS and _SELECTIONS[op[0]][1] == "b"


class Recurrence:
    """Walks the graph once: classifies every node ("state": depends on h_prev; "u": on x, so the
    prologue gives it per row; "p": on neither, a parameter of the solve) and evaluates the state
    nodes into scalar operations, each value a tensor of scalar indices of the node's shape."""

    def __init__(self, graph_module, dtype):
        self.graph_module, self.dtype = graph_module, dtype
        self.ops, self.literals, self.conversions = [], {}, {}
        self.values, self.leaves = {}, {}
        self.frontier = {"u": [], "p": []}  # prologue values the recurrence reads, in order
        self.width = {"u": 0, "p": 0}
        placeholders = [node for node in graph_module.graph.nodes if node.op == "placeholder"]
        self.h_node, self.x_node, self.tensor_nodes = placeholders[0], placeholders[1], placeholders[2:]
        self.kind = {}
        for node in graph_module.graph.nodes:
            if node.op == "placeholder":
                self.kind[node] = "state" if node is self.h_node else "u" if node is self.x_node else "p"
            elif node.op != "output":
                kinds = {self.kind[i] for i in node.all_input_nodes}
                self.kind[node] = "state" if "state" in kinds else "u" if "u" in kinds else "p"

    def add(self, op):
        self.ops.append(op)
        return len(self.ops) - 1

    def literal(self, value):
        value = float(value)
        key = repr(value)  # NaN is its own key
        if key not in self.literals:
            self.literals[key] = self.add(("c", value))
        return self.literals[key]

    def ids(self, arg):
        """The scalars of an operand: a state value, a prologue value (its scalars are leaves) or a
        number."""
        if isinstance(arg, torch.fx.Node):
            return self.values[arg] if self.kind[arg] == "state" else self.prologue_value(arg)
        if isinstance(arg, (int, float)) and not isinstance(arg, bool):
            return torch.tensor(self.literal(arg))
        raise Unsupported(f"an operand {arg!r} of type {type(arg).__name__} in the recurrence")

    def numbers(self, arg):
        return self.as_kind(self.ids(arg), False)

    def as_kind(self, scalars, boolean):
        """The scalars as bools (a number: whether it is nonzero) or as numbers (a bool: 1 or 0)."""
        def convert(index):
            if _is_boolean_op(self.ops[index]) == boolean:
                return index
            if (index, boolean) not in self.conversions:
                zero = self.literal(0)
                self.conversions[index, boolean] = self.add(("ne", index, zero) if boolean else
                                                            ("where", index, self.literal(1), zero))
            return self.conversions[index, boolean]
        return torch.tensor([convert(index) for index in scalars.reshape(-1).tolist()],
                            dtype=torch.int64).reshape(scalars.shape)

    def prologue_value(self, node):
        found = self.leaves.get(node)
        if found is not None:
            return found
        value = node.meta.get("val")
        kind = self.kind[node]
        origin = "x" if kind == "u" else "the cell's tensors"
        if not isinstance(value, torch.Tensor):
            raise Unsupported(f"a value of type {type(value).__name__} computed from {origin} ({_describe(node)})")
        if not _widens_exactly(value.dtype, self.dtype):
            raise Unsupported(f"a value of dtype {value.dtype} computed from {origin} ({_describe(node)}) in a "
                              f"step of a state of dtype {self.dtype} (give the cell's tensors and x the state's "
                              "dtype)")
        start, shape = self.width[kind], _shape(node)
        found = torch.tensor([self.add((kind, start + e)) for e in range(math.prod(shape))],
                             dtype=torch.int64).reshape(shape)
        self.width[kind] += math.prod(shape)
        self.frontier[kind].append(node)
        self.leaves[node] = found
        return found

    def new(self, shape, operands, make):
        """make(*scalars) at every element of the broadcast operands."""
        shaped = torch.broadcast_tensors(*operands)
        if shape is not None and tuple(shaped[0].shape) != shape:
            raise Unsupported(f"broadcasting shapes {[list(x.shape) for x in operands]} to {list(shape)}")
        flat = [x.reshape(-1).tolist() for x in shaped]
        return torch.tensor([self.add(make(*args)) for args in zip(*flat)], dtype=torch.int64) \
            .reshape(shaped[0].shape)

    def run(self, state_shape):
        """The scalars of step's result [state shape]."""
        self.values[self.h_node] = torch.tensor([self.add(("h", e)) for e in range(math.prod(state_shape))],
                                                dtype=torch.int64).reshape(state_shape)
        for node in self.graph_module.graph.nodes:
            if node.op == "output":
                result = node.args[0]
                break
            if node.op == "placeholder" or self.kind[node] != "state":
                continue
            if node.op != "call_function":
                raise Unsupported(_describe(node))
            value = self.call(node)  # of the node's kind: bools for a tensor of bools
            self.values[node] = self.as_kind(value, _is_boolean(node)) if isinstance(value, torch.Tensor) else value
        if not isinstance(result, torch.fx.Node):
            raise Unsupported(f"a step returning a {type(result).__name__} (return one tensor of h_prev's shape)")
        return self.ids(result), result

    def call(self, node):
        name = _name(node.target)
        args, kwargs = node.args, node.kwargs
        check_precision(node, self.dtype)
        schema = getattr(node.target, "_schema", None)
        if schema is not None and schema.is_mutable and isinstance(args[0], torch.fx.Node) and len(args[0].users) > 1:
            raise Unsupported(f"{_describe(node)}, an in-place operation on a value that is used elsewhere")
        if name == "getitem" and _name(args[0].target) in _EXTREMES:  # of max or min of a dimension
            return extreme_output(node, self.values[args[0]])
        if name == "getitem":  # of a tuple-valued move (unbind, split)
            return self.values[args[0]][args[1]]
        found = selection(node)
        if found is not None:
            entry, operands = found
            scalars = [self.as_kind(self.ids(arg), kind == "b") for arg, kind in zip(operands, _SELECTIONS[entry][0])]
            return self.new(_shape(node), scalars, lambda *a: (entry, *a))
        key = unary_key(node)
        if key is not None:
            return self.new(_shape(node), [self.numbers(args[0])], lambda a: ("unary", key, a))
        if name in ("add", "sub", "mul", "div", "rsub") and len(args) >= 2:
            return self.binary(node, name, args, kwargs)
        if name == "pow" and isinstance(args[0], torch.fx.Node):
            exponent = args[1]
            if not isinstance(exponent, (int, float)) or isinstance(exponent, bool):
                raise Unsupported(f"{_describe(node)} with an exponent that is not a constant number")
            return self.new(_shape(node), [self.numbers(args[0])], lambda a: ("pow", a, float(exponent)))
        if name in _PRODUCTS:
            return self.product(node, name, args, kwargs)
        if name in ("sum", "mean"):
            return self.reduction(node, name, args, kwargs)
        if name in _EXTREMES:
            return self.extreme(node, name, args)
        if name in ("_to_copy", "to"):  # to the same dtype, to bool, or of bools to numbers
            target = node.meta["val"].dtype
            if target not in (args[0].meta["val"].dtype, torch.bool, self.dtype):
                raise Unsupported(f"{_describe(node)}, a conversion to dtype {target}")
            return self.ids(args[0])
        if name in _STATE_MOVES:
            return self.moves(node, name)
        if name in _FILLS:
            value = _FILLS[name]
            if value is None:
                value = args[2] if name == "new_full" else args[1] if name == "full_like" else None
            if not isinstance(value, (int, float)) or isinstance(value, bool):
                raise Unsupported(f"{_describe(node)} without a constant number to fill")
            value = torch.tensor(value, dtype=node.meta["val"].dtype).item()  # in torch's dtype
            return torch.full(_shape(node), self.literal(value), dtype=torch.int64)
        raise Unsupported(_describe(node))

    def binary(self, node, name, args, kwargs):
        a, b = self.numbers(args[0]), self.numbers(args[1])
        alpha = kwargs.get("alpha", args[2] if len(args) > 2 else 1)
        if name == "rsub":
            a, b, name = b, a, "sub"
        if alpha != 1:
            if name not in ("add", "sub"):
                raise Unsupported(f"{_describe(node)} with alpha={alpha}")
            b = self.new(None, [b], lambda y: ("mul", self.literal(alpha), y))
        if kwargs.get("rounding_mode") is not None:
            raise Unsupported(f"{_describe(node)} with rounding_mode={kwargs['rounding_mode']!r}")
        return self.new(_shape(node), [a, b], lambda x, y: (name, x, y))

    def moves(self, node, name):
        """An operation that only moves elements: run on the scalars' indices."""
        substitute = lambda a: self.ids(a).clone() if isinstance(a, torch.fx.Node) else a
        call_args = torch.fx.node.map_aggregate(node.args, substitute)
        call_kwargs = torch.fx.node.map_aggregate(node.kwargs, substitute)
        if name in ("view", "_unsafe_view"):  # the indices need not have the strides a view needs
            result = torch.reshape(*call_args)
        else:
            result = node.target(*call_args, **call_kwargs)
        if isinstance(result, torch.Tensor):
            return result
        return list(result)

    def product(self, node, name, args, kwargs):
        biased = name in ("addmm", "addmv")
        beta = args[3] if biased and len(args) > 3 else kwargs.get("beta", 1)
        alpha = args[4] if biased and len(args) > 4 else kwargs.get("alpha", 1)
        if beta != 1 or alpha != 1:
            raise Unsupported(f"{_describe(node)} with beta={beta} and alpha={alpha} (expected 1)")
        bias = self.numbers(args[0]) if biased else None
        a, b = self.numbers(args[1 if biased else 0]), self.numbers(args[2 if biased else 1])
        if name in ("mv", "addmv"):
            b = b.unsqueeze(-1)
        elif name == "dot":
            a, b = a.unsqueeze(0), b.unsqueeze(-1)
        if a.dim() == 2:
            a, b = a.unsqueeze(0), b.unsqueeze(0)
        out_shape = _shape(node)
        count, rows, inner = a.shape
        columns = b.shape[2]
        if bias is not None:
            bias = torch.broadcast_to(bias, out_shape).reshape(count, rows, columns).tolist()
        a_rows, b_columns = a.tolist(), b.transpose(1, 2).tolist()
        ids = [self.add(("dot", bias[n][i][j] if bias is not None else None,
                         tuple(zip(a_rows[n][i], b_columns[n][j]))))
               for n in range(count) for i in range(rows) for j in range(columns)]
        return torch.tensor(ids, dtype=torch.int64).reshape(out_shape)

    @staticmethod
    def reduced_rows(x, dims):
        """The scalars of x that each result of a reduction over `dims` (none given: all) reads."""
        dims = sorted({d % x.dim() for d in dims}) if x.dim() else []
        dims = dims or list(range(x.dim()))
        kept = [d for d in range(x.dim()) if d not in dims]
        return x.permute(kept + dims).reshape(-1, math.prod(x.shape[d] for d in dims)).tolist()

    def reduction(self, node, name, args, kwargs):
        if kwargs.get("dtype") is not None:
            raise Unsupported(f"{_describe(node)} with dtype={kwargs['dtype']}")
        rows = self.reduced_rows(self.numbers(args[0]), args[1] if len(args) > 1 and args[1] is not None else [])
        divisor = len(rows[0]) if name == "mean" else 1
        return torch.tensor([self.add(("sum", divisor, tuple(row))) for row in rows],
                            dtype=torch.int64).reshape(_shape(node))

    def extreme(self, node, name, args):
        """max, min (of a dimension: its values; of everything), amax, amin."""
        maximum, ties, dims = extreme_kind(node, name)
        rows = self.reduced_rows(self.numbers(args[0]), dims or [])
        shape = _shape_of(node.meta["val"][0] if ties == "first" else node.meta["val"])
        return torch.tensor([self.add(("extreme", maximum, ties, tuple(row))) for row in rows],
                            dtype=torch.int64).reshape(shape)


# ---- the groups ------------------------------------------------------------------------------------

class GroupProgram(NamedTuple):
    """One group's program: operations on references ("v", k) to its own results, ("h", i) its
    state, ("u", j) its inputs, ("p", j) its parameters and ("c", value) constants."""
    ops: tuple
    outputs: tuple
    input_columns: tuple  # prologue input column of each of its inputs
    param_columns: tuple


def _group_program(ops, outputs, owns):
    """The program of a group's outputs; owns(e) is the group's position of h_prev's element e, or
    None when e belongs to another group."""
    stack, cone = list(outputs), set()
    while stack:
        index = stack.pop()
        if index not in cone:
            cone.add(index)
            stack.extend(_operands(ops[index]))
    reference, local, inputs, params = {}, [], [], []
    for index in sorted(cone):  # the scalars' order is a topological one
        op = ops[index]
        kind = op[0]
        if kind == "h":
            position = owns(op[1])
            if position is None:
                return op[1]
            reference[index] = ("h", position)
        elif kind in ("u", "p"):
            columns = inputs if kind == "u" else params
            reference[index] = (kind, len(columns))
            columns.append(op[1])
        elif kind == "c":
            reference[index] = op
        else:
            mapped = {"unary": lambda: (kind, op[1], reference[op[2]]),
                      "pow": lambda: (kind, reference[op[1]], op[2]),
                      "dot": lambda: (kind, reference[op[1]] if op[1] is not None else None,
                                      tuple((reference[a], reference[b]) for a, b in op[2])),
                      "sum": lambda: (kind, op[1], tuple(reference[t] for t in op[2])),
                      "extreme": lambda: (kind, op[1], op[2], tuple(reference[t] for t in op[3]))}.get(
                          kind, lambda: (kind, *(reference[x] for x in op[1:])))()
            reference[index] = ("v", len(local))
            local.append(mapped)
    return GroupProgram(tuple(local), tuple(reference[o] for o in outputs), tuple(inputs), tuple(params))


def _element_name(element, slots, hidden):
    return f"[{element // hidden}, {element % hidden}]" if slots > 1 else f"[{element}]"


def cut(ops, result, structure, slots, hidden, cell_name):
    """(group size, the groups' programs) of the result's scalars [state shape]. The state's order
    in the solver is linear_scan's (_user_cell.CellLayout): slot-major for diag and dense,
    channel-major for block2/block4."""
    N = slots * hidden
    d = {"diag": 1, "block2": 2, "block4": 4, "dense": N}[structure]
    blocked = structure in ("block2", "block4")
    element_at = (lambda n: (n % d) * hidden + n // d) if blocked else (lambda n: n)
    position_of = {element_at(n): n for n in range(N)}
    flat = result.reshape(-1).tolist()
    programs = []
    for g in range(N // d):
        outputs = [flat[element_at(g * d + i)] for i in range(d)]
        owns = lambda e, g=g: position_of[e] - g * d if position_of[e] // d == g else None
        program = _group_program(ops, outputs, owns)
        if not isinstance(program, GroupProgram):
            elements = ", ".join(_element_name(element_at(g * d + i), slots, hidden) for i in range(d))
            raise ValueError(f"newton_apply: argument 'cell' (a {cell_name}) declares jac_structure {structure!r}, "
                             f"but its step (traced) computes the state {elements} from h_prev"
                             f"{_element_name(program, slots, hidden)}, outside its {structure} group; declare "
                             "jac_structure 'dense', or the structure it has")
        if programs and (program.ops, program.outputs) != (programs[0].ops, programs[0].outputs):
            raise Unsupported(f"a step whose {structure} groups are not all computed by the same operations (the "
                              f"state {_element_name(element_at(g * d), slots, hidden)} differs from "
                              f"{_element_name(element_at(0), slots, hidden)})")
        programs.append(program)
    return d, programs


# ---- C++ -------------------------------------------------------------------------------------------

def _expression(ref):
    kind = ref[0]
    if kind == "v":
        return f"v{ref[1]}"
    if kind == "h":
        return f"h[{ref[1]}]"
    if kind == "u":
        return f"u[{ref[1]}]"
    if kind == "p":
        return f"S(parameters(g, {ref[1]}))"
    return _literal(ref[1])


def _adjoint(ref):
    """The lvalue of a reference's adjoint, or None for a constant."""
    kind = ref[0]
    return {"v": f"a_v{ref[1]}", "h": f"dh[{ref[1]}]", "u": f"du[{ref[1]}]", "p": f"dparams[{ref[1]}]"}.get(kind) \
        if kind != "c" else None


def _forward_line(k, op):
    kind, e = op[0], _expression
    if kind in _SELECTIONS:
        value = _SELECTIONS[kind][2](*map(e, op[1:]))
        return f"const {'bool' if _is_boolean_op(op) else 'S'} v{k} = {value};"
    if kind == "extreme":
        operands = ", ".join(map(e, op[3]))
        return f"const S e{k}[] = {{{operands}}}; const S v{k} = {_extreme_helper(op)}(e{k}, {len(op[3])});"
    if kind == "unary":
        value = unary_functions(op[1])[0](e(op[2]))
    elif kind == "pow":
        value = f"{e(op[1])} * {e(op[1])}" if op[2] == 2 else f"power({e(op[1])}, {op[2]!r})"
    elif kind == "dot":
        terms = ([e(op[1])] if op[1] is not None else []) + [f"{e(a)} * {e(b)}" for a, b in op[2]]
        value = " + ".join(terms) or "S(0)"
    elif kind == "sum":
        value = " + ".join(e(t) for t in op[2]) or "S(0)"
        if op[1] != 1:
            value = f"({value}) / S({op[1]})"
    else:
        value = f"{e(op[1])} {dict(add='+', sub='-', mul='*', div='/')[kind]} {e(op[2])}"
    return f"const S v{k} = {value};"


def _adjoint_lines(k, op):
    """Each operand's adjoint += its part of a_v<k> (reverse mode)."""
    kind, e, g, y = op[0], _expression, f"a_v{k}", f"v{k}"
    terms = []  # (operand reference, expression added to its adjoint)
    if kind in _SELECTIONS:
        reads = [e(ref) for ref in op[1:]]
        terms += [(ref, derivative(reads, y, g)) for ref, derivative in zip(op[1:], _SELECTIONS[kind][3])
                  if derivative is not None]
    elif kind == "extreme":
        return _extreme_adjoint_lines(k, op)
    elif kind == "unary":
        derivative = unary_functions(op[1])[1]
        if derivative is not None:
            terms.append((op[2], derivative(e(op[2]), y, g)))
    elif kind == "pow":
        c = op[2]
        slope = "S(1)" if c == 1 else f"S(2) * {e(op[1])}" if c == 2 else \
            f"{_literal(c)} * power({e(op[1])}, {c - 1!r})"
        terms.append((op[1], f"{g} * {slope}"))
    elif kind == "dot":
        if op[1] is not None:
            terms.append((op[1], g))
        for a, b in op[2]:
            terms += [(a, f"{g} * {e(b)}"), (b, f"{e(a)} * {g}")]
    elif kind == "sum":
        share = g if op[1] == 1 else f"{g} / S({op[1]})"
        terms += [(t, share) for t in op[2]]
    elif kind == "add":
        terms += [(op[1], g), (op[2], g)]
    elif kind == "sub":
        terms += [(op[1], g), (op[2], f"-{g}")]
    elif kind == "mul":
        terms += [(op[1], f"{g} * {e(op[2])}"), (op[2], f"{e(op[1])} * {g}")]
    else:  # div
        terms += [(op[1], f"{g} / {e(op[2])}"), (op[2], f"-{g} * {y} / {e(op[2])}")]
    return [f"{_adjoint(ref)} += {value};" for ref, value in terms if _adjoint(ref) is not None]


def _extreme_helper(op):
    """The helper of HELPERS that computes an extreme: first_extreme's derivative is the first
    extreme's, shared_extreme's the mean of those of the values that stand for it."""
    maximum = "true" if op[1] else "false"
    return f"first_extreme<{maximum}>" if op[2] == "first" else \
        f"shared_extreme<{maximum}, {'true' if op[2] == 'shared_with_nan' else 'false'}>"


def _extreme_adjoint_lines(k, op):
    """An extreme's operands' adjoints (reverse mode), as _extreme_helper's derivatives: all to the
    first value that stands for the result, or shared among the values that stand for it."""
    operands, g, y = op[3], f"a_v{k}", f"v{k}"
    if op[2] == "first":
        lines = ["int at = 0;", f"while (at < {len(operands) - 1} && !same(e{k}[at], {y})) ++at;"]
        lines += [f"if (at == {j}) {_adjoint(ref)} += {g};" for j, ref in enumerate(operands) if _adjoint(ref)]
    else:
        stands = "same" if op[2] == "shared_with_nan" else "equal"
        lines = ["S ties = 0;",
                 f"for (int j = 0; j < {len(operands)}; ++j) ties += {stands}(e{k}[j], {y}) ? S(1) : S(0);",
                 f"const S share = {g} / ties;  // none (amax of a NaN): NaN derivatives, as torch's"]
        lines += [f"{_adjoint(ref)} += share * ({stands}(e{k}[{j}], {y}) ? S(1) : S(0));"
                  for j, ref in enumerate(operands) if _adjoint(ref)]
    return ["{"] + ["  " + line for line in lines] + ["}"]


def _differentiated_operands(op):
    """The operands of an operation that its adjoint reaches (none of a boolean's, of where's
    condition or of sign)."""
    if _is_boolean_op(op):
        return ()
    if op[0] in _SELECTIONS:
        return tuple(ref for ref, derivative in zip(op[1:], _SELECTIONS[op[0]][3]) if derivative is not None)
    if op[0] == "unary" and unary_functions(op[1])[1] is None:
        return ()
    return _operands(op)


def _live(program):
    """The operations whose adjoint can be nonzero, as torch's autograd differentiates: those the
    outputs are differentiable in, so that a value used only in a mask (isnan(log(h))) is not
    differentiated at all (no 0 times an infinite derivative)."""
    live = {ref[1] for ref in program.outputs if ref[0] == "v"}
    for k in reversed(range(len(program.ops))):
        if k in live:
            live.update(ref[1] for ref in _differentiated_operands(program.ops[k]) if ref[0] == "v")
    return live


def _structure_type(structure, d):
    """The C++ structure of df/dh; a dense group is the whole state, whose width bounds the solver's
    maps (DenseUpTo<N>: N x N, not Dense's 32 x 32, which compile and run that much faster)."""
    return f"paraseq::DenseUpTo<{d}>" if structure == "dense" else STRUCTURE_TYPES[structure]


# Groups of this many state values or more have their linearisation called rather than inlined: on
# dual numbers of d derivatives it is a large body that the scans' and the fused kernel's unrolled
# steps would each compile again (a dense cell of 5 values with nvcc 13.0 on the 2-core machine,
# 2026-12-05: its fused family 68 s inlined, 47 s called; one-pass 86 s, 55 s; newton 45 s, 25 s).
CALLED_LINEARIZE_GROUP_SIZE = 4


def _linearize_qualifiers(d):
    return ("KOKKOS_FUNCTION __attribute__((noinline))" if d >= CALLED_LINEARIZE_GROUP_SIZE
            else "KOKKOS_INLINE_FUNCTION")


def cell_source(program, structure, d):
    """The C++ struct UserCell<T, Space> of one group's program."""
    inputs, params = len(program.input_columns), len(program.param_columns)
    forward = [_forward_line(k, op) for k, op in enumerate(program.ops)]
    store = [f"f[{i}] = {_expression(ref)};" for i, ref in enumerate(program.outputs)]
    seeds = [f"{_adjoint(ref)} += mu[{i}];" for i, ref in enumerate(program.outputs) if _adjoint(ref) is not None]
    live = _live(program)
    reverse = [line for k in reversed(range(len(program.ops))) if k in live
               for line in _adjoint_lines(k, program.ops[k])]
    text = "\n".join(forward + reverse)
    usings = "".join(f"    using Kokkos::{f};\n" for f in _MATH_FUNCTIONS if f"{f}(" in text)
    indent = lambda lines: "".join(f"    {line}\n" for line in lines)
    clear = [f"for (int i = 0; i < {d}; ++i) dh[i] = Acc(0);"] + \
        ([f"for (int k = 0; k < {inputs}; ++k) du[k] = Acc(0);"] if inputs else []) + \
        ([f"for (int k = 0; k < {params}; ++k) dparams[k] = Acc(0);"] if params else [])
    adjoints = [f"Acc a_v{k} = 0;" for k, op in enumerate(program.ops) if not _is_boolean_op(op)]
    return f"""// A group: {d} state value(s), {len(program.ops)} operations, {inputs} input(s), {params} parameter(s).
template <class T, class Space>
struct UserCell {{
  using structure = {_structure_type(structure, d)};
  static constexpr int group_size = {d};
  static constexpr int inputs = {inputs};  // columns of u per group
  static constexpr int params = {params};  // parameter slots per group
  static constexpr int max_inputs_per_group = inputs > 0 ? inputs : 1;
  static constexpr int max_params_per_group = params > 0 ? params : 1;

  paraseq::InView<T, 2, Space> parameters;  // [groups, max_params_per_group]: group g's slots in row g

  int groups() const {{ return int(parameters.extent(0)); }}
  int state_size() const {{ return group_size * groups(); }}
  int input_size() const {{ return inputs * groups(); }}
  int param_count() const {{ return params * groups(); }}
  KOKKOS_INLINE_FUNCTION int inputs_per_group() const {{ return inputs; }}
  KOKKOS_INLINE_FUNCTION int params_per_group() const {{ return params; }}
  KOKKOS_INLINE_FUNCTION int input_column(int g, int k) const {{ return g * inputs + k; }}
  KOKKOS_INLINE_FUNCTION int param_index(int g, int k) const {{ return g * params + k; }}
  void check(const char* fn) const {{
    if (parameters.extent(1) != std::size_t(max_params_per_group))
      paraseq::detail::throw_invalid(fn, "params", "shape " + paraseq::detail::shape_of(parameters),
                                     "[groups, " + std::to_string(max_params_per_group) + "]");
  }}

  // f = step(h_prev, x) for group g: the traced recurrence, one scalar operation per line.
  template <class S>
  KOKKOS_INLINE_FUNCTION void evaluate([[maybe_unused]] int g, [[maybe_unused]] const S* h,
                                       [[maybe_unused]] const S* u, S* f) const {{
{usings}{indent(forward)}{indent(store)}  }}

  template <class Acc>
  KOKKOS_INLINE_FUNCTION void step(int g, const Acc* h, const Acc* u, Acc* f) const {{
    evaluate(g, h, u, f);
  }}

  // f and J = df/dh (row-major): evaluate on dual numbers seeded with the group's state.
  template <class Acc>
  {_linearize_qualifiers(d)} void linearize(int g, const Acc* h, const Acc* u, Acc* f, Acc* J) const {{
    using D = paraseq::ode::Dual<Acc, group_size>;
    D h_dual[group_size], u_dual[max_inputs_per_group], f_dual[group_size];
    for (int i = 0; i < group_size; ++i) h_dual[i] = D::variable(h[i], i);
    for (int k = 0; k < inputs; ++k) u_dual[k] = D(u[k]);
    evaluate(g, h_dual, u_dual, f_dual);
    for (int i = 0; i < group_size; ++i) {{
      f[i] = f_dual[i].value;
      for (int j = 0; j < group_size; ++j) J[i * group_size + j] = f_dual[i].grad[j];
    }}
  }}

  // dh, du, dparams = the transposed Jacobians times mu: the operations again, then each one's
  // adjoint in reverse order.
  template <class Acc>
  KOKKOS_INLINE_FUNCTION void vjp([[maybe_unused]] int g, [[maybe_unused]] const Acc* h,
                                  [[maybe_unused]] const Acc* u, const Acc* mu, Acc* dh,
                                  [[maybe_unused]] Acc* du, [[maybe_unused]] Acc* dparams) const {{
    using S = Acc;
{usings}{indent(forward)}{indent(clear)}{indent(adjoints)}{indent(seeds)}{indent(reverse)}  }}
}};
"""


# ---- the prologue ----------------------------------------------------------------------------------

def _widens_exactly(dtype, state_dtype):
    """Whether values of `dtype` are exactly values of the state's dtype (bools: 1 or 0)."""
    return dtype == torch.bool or (dtype.is_floating_point and torch.promote_types(dtype, state_dtype) == state_dtype)


def _subgraph(graph_module, inputs, outputs, dtype):
    """A GraphModule of the nodes of graph_module that `outputs` need, taking `inputs`
    (placeholders) in order and returning the tuple of `outputs` in `dtype` (bools as 1 or 0,
    narrower floating dtypes exactly)."""
    needed, stack = set(), list(outputs)
    while stack:
        node = stack.pop()
        if node not in needed:
            needed.add(node)
            stack.extend(node.all_input_nodes)
    graph, env = torch.fx.Graph(), {}
    for node in inputs:
        env[node] = graph.placeholder(node.name)
    for node in graph_module.graph.nodes:
        if node in needed and node.op != "placeholder":
            env[node] = graph.node_copy(node, lambda n: env[n])
    converted = lambda node: graph.call_function(torch.ops.aten._to_copy.default, (env[node],), {"dtype": dtype}) \
        if node.meta["val"].dtype != dtype else env[node]
    graph.output(tuple(converted(node) for node in outputs))
    return torch.fx.GraphModule(graph_module, graph)


def _check_prologue(prologue):
    for node in prologue.graph.nodes:
        if node.op == "call_function" and torch.Tag.nondeterministic_seeded in getattr(node.target, "tags", ()):
            raise Unsupported(f"{_describe(node)}, a random operation (step must be a deterministic function)")


class Generated(NamedTuple):
    source: str  # the C++ struct UserCell
    group_size: int
    groups: int
    input_prologue: torch.fx.GraphModule  # (x row, *tensors) -> the values u reads, per row
    param_prologue: torch.fx.GraphModule  # (*tensors) -> the values the parameters read
    used_tensors: list  # indices of the cell's tensors the prologues take
    input_index: list  # [groups * inputs]: column of the prologue's inputs, group by group
    param_index: list  # [groups * params]
    digest: str  # of the prologues' code and constants and the tables


def generate(graph_module, state_shape, structure, dtype, cell_name):
    """The C++ cell and the prologues of step's graph (of one row)."""
    recurrence = Recurrence(graph_module, dtype)
    result, result_node = recurrence.run(state_shape)
    value = result_node.meta.get("val")
    if not isinstance(value, torch.Tensor) or tuple(value.shape) != tuple(state_shape) or value.dtype != dtype:
        given = f"shape {list(value.shape)} and dtype {value.dtype}" if isinstance(value, torch.Tensor) else \
            f"a {type(value).__name__}"
        raise ValueError(f"newton_apply: argument 'cell' (a {cell_name}) returned {given} from step(h_prev, x) on one "
                         f"row, expected h_prev's shape {list(state_shape)} and dtype {dtype}")
    slots, hidden = (1, state_shape[0]) if len(state_shape) == 1 else state_shape
    d, programs = cut(recurrence.ops, result, structure, slots, hidden, cell_name)
    program = programs[0]
    used = [k for k, node in enumerate(recurrence.tensor_nodes) if node.users]
    taken = [recurrence.tensor_nodes[k] for k in used]
    input_prologue = _subgraph(graph_module, [recurrence.x_node] + taken, recurrence.frontier["u"], dtype)
    param_prologue = _subgraph(graph_module, taken, recurrence.frontier["p"], dtype)
    for prologue in (input_prologue, param_prologue):
        _check_prologue(prologue)
    input_index = [c for p in programs for c in p.input_columns]
    param_index = [c for p in programs for c in p.param_columns]
    digest = hashlib.sha256()
    for prologue in (input_prologue, param_prologue):
        digest.update(prologue.code.encode())
        for node in prologue.graph.nodes:
            if node.op == "get_attr":  # a constant of step: its values, not only its name
                digest.update(getattr(prologue, node.target).detach().cpu().numpy().tobytes())
    digest.update(repr((used, input_index, param_index)).encode())
    return Generated(cell_source(program, structure, d), d, len(programs), input_prologue, param_prologue, used,
                     input_index, param_index, digest.hexdigest())
