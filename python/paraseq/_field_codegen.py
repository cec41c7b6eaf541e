"""A right-hand side of your own as a C++ vector field (src/loops/field.hpp): traced once, emitted.

The function is traced with torch.fx (make_fx on fake tensors, with the tensors odeint found as
inputs: nn.Modules, closures and plain functions alike) into a graph of ATen operations. Each
operation becomes a few lines of C++ on one trajectory's values: the graph's values lose their
batch dimension (a value [N, k] is an array of k per trajectory) and the function's tensors are
read from the field's shared parameters, one flat vector [Q]. The generated struct has n as a
compile-time state_size, a templated operator() (so dual numbers work) and a vjp() that runs the
graph forward and then backward, operation by operation (reverse mode).

Supported: elementwise + - * / neg, pow with a constant exponent, exp, log, tanh, sigmoid, sin,
cos, sqrt, abs, relu, reciprocal, sign; leaky_relu, hardtanh (relu6), elu (selu), softplus,
hardsigmoid, silu with their constants; where, masked_fill, comparisons, isnan, isinf, isfinite,
logical and/or/xor/not (booleans are values of their own kind: bool, no adjoint), heaviside,
maximum, minimum, clamp to numbers or to tensors; indexing, slicing, reshaping, transposing,
stacking and concatenating (any operation that only moves elements within a trajectory); sum,
mean, amax, amin, and max and min of a dimension (their values; of everything on one trajectory),
over the last dimensions of a trajectory's value; matrix products whose second factor is not the
state's (y @ W.T + b, F.linear, torch.matmul); constants and t. Anything else (torch.sort, a
branch on the data, an operation that mixes trajectories, arithmetic that torch computes in
another dtype, the indices of torch.max) raises Unsupported naming it. The derivatives are
torch's, at kinks and ties too; a value the result is not differentiable in (one used only in a
mask, as isnan(log(y))) gets no adjoint lines, so that its infinite derivatives do not turn the
zero adjoint into NaN.
"""

from __future__ import annotations

import math
import operator

import torch
from torch.fx.experimental.proxy_tensor import make_fx

from . import _user_function

TRACE_BATCH = 3  # the trajectories of the trace; any number works, values are per trajectory


class Unsupported(Exception):
    """An operation (or use of one) that the generator cannot turn into C++; str() names it."""


# ---- tracing ---------------------------------------------------------------------------------------

def trace(token, tensors, n, dtype, one_trajectory):
    """func's graph (torch.fx.GraphModule) of (t, y, *tensors) on fake tensors."""
    y = torch.zeros((n,) if one_trajectory else (TRACE_BATCH, n), dtype=dtype)
    t = torch.zeros(() if one_trajectory else (TRACE_BATCH, 1), dtype=dtype)
    return trace_call(token, (t, y), tensors, "a use of the state's values in Python (a data-dependent branch, "
                                              ".item() or a conversion to a Python number")


def trace_call(token, arguments, tensors, failure):
    """The graph (torch.fx.GraphModule) of the registered callable on its two `arguments`, with
    `tensors` substituted for the tensors it uses and taken as inputs, on fake tensors. A call that
    cannot be traced raises Unsupported: `failure`, then the error, in parentheses."""
    entry = _user_function.entry(token)

    def pure(first, second, *tensors):
        return _user_function.call_with(entry, first, second, list(tensors))

    # The graph does not depend on the device: it is traced on the CPU, with CPU stand-ins for tensors
    # that live elsewhere (fake tensors hold no data, so nothing is copied from the device).
    stand_ins = [torch.empty(x.shape, dtype=x.dtype) for x in tensors]
    try:  # outside torch.compile's tracing context, whose fake mode would make the sizes symbolic
        with torch.no_grad(), torch._guards.tracing(None):
            return make_fx(pure, tracing_mode="fake")(*arguments, *stand_ins)
    except Exception as error:  # data-dependent Python control flow or values: fake tensors have no data
        raise Unsupported(f"{failure}: {type(error).__name__}: {str(error).splitlines()[0]})") from None


# ---- values of one trajectory ----------------------------------------------------------------------

def _flat(index_terms, offset=0):
    """A C++ index expression: offset + sum of var * stride, omitting zero terms."""
    parts = [f"{var} * {stride}" if stride != 1 else var for var, stride in index_terms if stride != 0 and var != "0"]
    if offset or not parts:
        parts.append(str(offset))
    return " + ".join(parts)


def _strides(shape):
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= size
    return list(reversed(strides))


def _double(value):
    """A C++ double (or integer) literal of a Python number, exact for doubles."""
    value = float(value)
    if math.isnan(value):
        return "Kokkos::Experimental::quiet_NaN<double>::value"
    if math.isinf(value):
        return f"{'' if value > 0 else '-'}Kokkos::Experimental::infinity<double>::value"
    if value == int(value) and abs(value) < 2**53:
        return str(int(value))
    return repr(value)


def _literal(value):
    """A C++ literal of type S of a Python number, exact for doubles."""
    return f"S({_double(value)})"


class Value:
    """One graph value on one trajectory: `shape` (per trajectory), read(i) an expression of its
    element i, adjoint(i) an lvalue of its adjoint element (for active values: those that depend
    on the state or the function's tensors). A boolean value (of a comparison) holds bools and has
    no adjoint."""

    def __init__(self, shape, read, adjoint=None, batched=False, boolean=False):
        self.shape, self.size = tuple(shape), math.prod(shape)
        self.read, self.adjoint, self.batched, self.boolean = read, adjoint, batched, boolean

    @property
    def active(self):
        return self.adjoint is not None


def _array(name, shape, active, batched, boolean=False):
    """A value computed into a local array (or variable) `name`, its adjoint into g_<name>."""
    if math.prod(shape) == 1:  # a number: no array
        return Value(shape, lambda i: name, (lambda i: f"g_{name}") if active else None, batched, boolean)
    return Value(shape, lambda i: f"{name}[{i}]", (lambda i: f"g_{name}[{i}]") if active else None, batched,
                 boolean)


def as_kind(value, boolean):
    """`value` read as booleans (a number: whether it is nonzero, as torch converts) or as numbers
    (a boolean: 1 or 0), without a copy; the conversion has no derivative."""
    if value.boolean == boolean:
        return value
    if boolean:
        return Value(value.shape, lambda i: f"!equal({value.read(i)}, S(0))", None, value.batched, True)
    return Value(value.shape, lambda i: f"({value.read(i)} ? S(1) : S(0))", None, value.batched)


def _is_boolean(node):
    value = node.meta.get("val")
    return isinstance(value, torch.Tensor) and value.dtype == torch.bool


def _number(x):
    """A Python number operand."""
    return Value((), lambda i: _literal(x))


# ---- the generator ---------------------------------------------------------------------------------

_UNARY = {  # name: (forward expression of x, derivative times g of x, output y and g, or None: none)
    "neg": (lambda x: f"-{x}", lambda x, y, g: f"-{g}"),
    "exp": (lambda x: f"exp({x})", lambda x, y, g: f"{g} * {y}"),
    "log": (lambda x: f"log({x})", lambda x, y, g: f"{g} / {x}"),
    "tanh": (lambda x: f"tanh({x})", lambda x, y, g: f"{g} * (S(1) - {y} * {y})"),
    "sigmoid": (lambda x: f"S(1) / (S(1) + exp(-{x}))", lambda x, y, g: f"{g} * {y} * (S(1) - {y})"),
    "sin": (lambda x: f"sin({x})", lambda x, y, g: f"{g} * cos({x})"),
    "cos": (lambda x: f"cos({x})", lambda x, y, g: f"-{g} * sin({x})"),
    "sqrt": (lambda x: f"sqrt({x})", lambda x, y, g: f"{g} / (S(2) * {y})"),
    "abs": (lambda x: f"abs({x})", lambda x, y, g: f"({x} > S(0) ? {g} : {x} < S(0) ? -{g} : S(0))"),
    "relu": (lambda x: f"({x} > S(0) ? {x} : S(0))", lambda x, y, g: f"({x} > S(0) ? {g} : S(0))"),
    "sign": (lambda x: f"({x} > S(0) ? S(1) : {x} < S(0) ? S(-1) : S(0))", None),  # torch's: 0 for a NaN
    "reciprocal": (lambda x: f"S(1) / {x}", lambda x, y, g: f"-{g} * {y} * {y}"),
}
_UNARY["sgn"] = _UNARY["sign"]  # of a real number
_MATH_FUNCTIONS = ("exp", "log", "tanh", "sin", "cos", "sqrt", "abs")
_CLAMPS = ("clamp", "clamp_min", "clamp_max")
# Unary operations with constant arguments, each a struct of HELPERS (its value and torch's slope,
# kinks included): name: (the struct, the defaults of the constants after x, in torch's order).
_ACTIVATIONS = {"leaky_relu": ("leaky_relu", (0.01,)), "elu": ("elu", (1.0, 1.0, 1.0)),
                "softplus": ("softplus", (1.0, 20.0)), "hardsigmoid": ("hardsigmoid", ()), "silu": ("silu", ())}


def _constants(node, defaults, first=1):
    """The constant number arguments of node after its first `first`, with their defaults."""
    names = [argument.name for argument in node.target._schema.arguments[first:first + len(defaults)]]
    values = [node.args[first + k] if first + k < len(node.args) else node.kwargs.get(name, default)
              for k, (name, default) in enumerate(zip(names, defaults))]
    for value in values:
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise Unsupported(f"{_describe(node)} with an argument {value!r} that is not a constant number")
    return tuple(float(value) for value in values)


def unary_key(node):
    """The unary operation of a node as a key of unary_functions (a name of _UNARY, ("clamp", low,
    high) of a clamp to numbers or hardtanh, (name of _ACTIVATIONS, *constants)), or None."""
    name = _name(node.target)
    if name in _UNARY:
        return name
    if name in _CLAMPS and not _clamps_to_tensors(node):
        return ("clamp", *clamp_bounds(node))
    if name == "hardtanh":  # torch's derivative of hardtanh is a clamp's to numbers: 0 at the bounds
        return ("clamp", *_constants(node, (-1.0, 1.0)))
    if name in _ACTIVATIONS:
        return (name, *_constants(node, _ACTIVATIONS[name][1]))
    return None


def unary_functions(key):
    """(forward expression of x, derivative times g of x, y and g, or None) of a unary_key."""
    if isinstance(key, str):
        return _UNARY[key]
    if key[0] == "clamp":
        return clamp_functions(*key[1:])
    struct = f"aten_ops::{_ACTIVATIONS[key[0]][0]}"
    constants = "".join(f", {_double(c)}" for c in key[1:])
    return (lambda x: f"apply<{struct}>({x}{constants})",
            lambda x, y, g: f"{g} * {struct}::slope({x}{constants})")


def _half_at(tie, g, otherwise):
    return f"({tie} ? {g} / S(2) : {otherwise})"


def _clamp_derivative(x, low, high, g, to):
    """torch's derivative of clamp(x, low, high) to tensors (high where low > high), times g, to
    x, low or high: x's inside [low, high] (and where x is NaN), a bound's where it is the result,
    halved between x and the bound where they tie and low < high."""
    ordered = f"{low} < {high}"
    if to == "x":
        return f"(({x} < {low} || {x} > {high}) ? S(0) : " + \
            _half_at(f"({ordered} && (equal({x}, {low}) || equal({x}, {high})))", g, g) + ")"
    if to == "low":
        return f"(({low} <= {high} && {x} < {low}) ? {g} : " + \
            _half_at(f"({ordered} && equal({x}, {low}))", g, "S(0)") + ")"
    return f"(({low} > {high} || ({low} <= {high} && {x} > {high})) ? {g} : " + \
        _half_at(f"({ordered} && equal({x}, {high}))", g, "S(0)") + ")"


# Elementwise operations of several operands, of numbers ("n") and booleans ("b"): name: (the
# operands' kinds, the result's kind, forward of the operands' expressions, each operand's
# derivative times g of (the operands' expressions r, the result y, g), or None: none). The
# derivatives are torch's, ties included: maximum, minimum and a clamp to tensors split g in
# halves where the values tie.
_SELECTIONS = {
    "where": ("bnn", "n", lambda c, a, b: f"({c} ? {a} : {b})",
              (None, lambda r, y, g: f"({r[0]} ? {g} : S(0))", lambda r, y, g: f"({r[0]} ? S(0) : {g})")),
    "maximum": ("nn", "n", lambda a, b: f"maximum({a}, {b})",
                (lambda r, y, g: _half_at(f"equal({r[0]}, {r[1]})", g, f"({r[0]} < {r[1]} ? S(0) : {g})"),
                 lambda r, y, g: _half_at(f"equal({r[0]}, {r[1]})", g, f"({r[0]} > {r[1]} ? S(0) : {g})"))),
    "minimum": ("nn", "n", lambda a, b: f"minimum({a}, {b})",
                (lambda r, y, g: _half_at(f"equal({r[0]}, {r[1]})", g, f"({r[0]} > {r[1]} ? S(0) : {g})"),
                 lambda r, y, g: _half_at(f"equal({r[0]}, {r[1]})", g, f"({r[0]} < {r[1]} ? S(0) : {g})"))),
    "clamp_to_tensors": ("nnn", "n", lambda x, low, high: f"minimum(maximum({x}, {low}), {high})",
                         tuple(lambda r, y, g, to=to: _clamp_derivative(*r, g, to) for to in ("x", "low", "high"))),
    **{name: ("nn", "b", lambda a, b, o=symbol: f"({a} {o} {b})", (None, None))
       for name, symbol in (("lt", "<"), ("le", "<="), ("gt", ">"), ("ge", ">="))},
    "eq": ("nn", "b", lambda a, b: f"equal({a}, {b})", (None, None)),
    "ne": ("nn", "b", lambda a, b: f"!equal({a}, {b})", (None, None)),
    "logical_and": ("bb", "b", lambda a, b: f"({a} && {b})", (None, None)),
    "logical_or": ("bb", "b", lambda a, b: f"({a} || {b})", (None, None)),
    "logical_xor": ("bb", "b", lambda a, b: f"({a} != {b})", (None, None)),
    "logical_not": ("b", "b", lambda a: f"!{a}", (None,)),
    "isnan": ("n", "b", lambda a: f"is_nan({a})", (None,)),
    "isinf": ("n", "b", lambda a: f"(equal({a}, {_literal(math.inf)}) || equal({a}, {_literal(-math.inf)}))", (None,)),
    # torch does not differentiate heaviside; its derivative is taken as the piecewise one: none in
    # x, the selection's in `values` where x is 0.
    "heaviside": ("nn", "n", lambda x, v: f"(equal({x}, S(0)) ? {v} : {x} > S(0) ? S(1) : S(0))",
                  (None, lambda r, y, g: f"(equal({r[0]}, S(0)) ? {g} : S(0))")),
}
_BITWISE = {"bitwise_and": "logical_and", "bitwise_or": "logical_or", "bitwise_xor": "logical_xor",
            "bitwise_not": "logical_not"}  # & | ^ ~ of booleans


def selection(node):
    """(name in _SELECTIONS, operands: graph nodes or numbers) of a node that is one of them (also
    a clamp to tensors, masked_fill and & | ^ ~ of booleans), or None."""
    name, args, kwargs = _name(node.target), node.args, node.kwargs
    if _clamps_to_tensors(node):
        low, high = _clamp_arguments(node)
        if low is None or high is None:  # torch's derivatives of these are maximum's and minimum's
            return ("minimum", (args[0], high)) if low is None else ("maximum", (args[0], low))
        return "clamp_to_tensors", (args[0], low, high)
    if name == "masked_fill":
        return "where", (args[1], args[2], args[0])
    if name in _BITWISE:
        if node.meta["val"].dtype != torch.bool:
            raise Unsupported(f"{_describe(node)} of tensors of dtype {node.meta['val'].dtype} (of booleans only)")
        name = _BITWISE[name]
    if name not in _SELECTIONS:
        return None
    count = len(_SELECTIONS[name][0])
    if len(args) != count or kwargs:
        raise Unsupported(f"{_describe(node)} with arguments {list(args)} and {dict(kwargs)}")
    return name, tuple(args)


def _clamps_to_tensors(node):
    return _name(node.target) in _CLAMPS and getattr(node.target, "_overloadname", "") == "Tensor"


def _clamp_arguments(node):
    """(low, high) of a clamp, clamp_min or clamp_max (None: no bound)."""
    name, args, kwargs = _name(node.target), node.args, node.kwargs
    if name == "clamp":
        return (args[1] if len(args) > 1 else kwargs.get("min")), (args[2] if len(args) > 2 else kwargs.get("max"))
    return (args[1], None) if name == "clamp_min" else (None, args[1])


def clamp_bounds(node):
    """(low, high) of a clamp to constant numbers (clamp, clamp_min, clamp_max; None: no bound)."""
    low, high = _clamp_arguments(node)
    for bound in (low, high):
        if bound is not None and (not isinstance(bound, (int, float)) or isinstance(bound, bool)):
            raise Unsupported(f"{_describe(node)} with a bound {bound!r} that is neither a constant number nor a "
                              "tensor")
    return low, high


def clamp_functions(low, high):
    """(forward, derivative) of a clamp to constant numbers [low, high], in the form of _UNARY's
    entries: high where low > high, as in torch; the derivative is g strictly inside the bounds and
    0 at them, outside and for a NaN (torch's for constant bounds)."""
    def forward(x):
        value = f"maximum({x}, {_literal(low)})" if low is not None else x
        return f"minimum({value}, {_literal(high)})" if high is not None else value

    def derivative(x, y, g):
        inside = [test for test in (f"{_literal(low)} < {x}" if low is not None else None,
                                    f"{x} < {_literal(high)}" if high is not None else None) if test]
        return f"({' && '.join(inside)} ? {g} : S(0))"

    return forward, derivative


# Helpers of the generated code, emitted before the field or cell: x^c for a constant c on numbers
# and on dual numbers (whose pow takes the exponent in their value type); equality, and torch's
# maximum and minimum (NaN where either is NaN), written with < and <= alone, which dual numbers
# define (on their values); x <= x is false only for a NaN.
HELPERS = """template <class S>
KOKKOS_INLINE_FUNCTION S power(const S& x, double c) {
  using Kokkos::pow;
  if constexpr (std::is_floating_point_v<S>) return pow(x, S(c));
  else return pow(x, decltype(x.value)(c));
}
template <class S>
KOKKOS_INLINE_FUNCTION bool equal(const S& x, const S& y) { return x <= y && y <= x; }
template <class S>
KOKKOS_INLINE_FUNCTION S maximum(const S& x, const S& y) { return y < x || !(x <= x) ? x : y; }
template <class S>
KOKKOS_INLINE_FUNCTION S minimum(const S& x, const S& y) { return x < y || !(x <= x) ? x : y; }
template <class S>
KOKKOS_INLINE_FUNCTION bool is_nan(const S& x) { return !(x <= x); }
// The reductions max, min, amax and amin as torch's: the running extreme, where the first of equal
// values stays and a NaN wins (the first NaN); `same` says which values stand for the result in
// the derivative (equal to it, or both NaN).
template <class S>
KOKKOS_INLINE_FUNCTION S first_max(const S& best, const S& x) {
  return x > best || (is_nan(x) && !is_nan(best)) ? x : best;
}
template <class S>
KOKKOS_INLINE_FUNCTION S first_min(const S& best, const S& x) {
  return x < best || (is_nan(x) && !is_nan(best)) ? x : best;
}
template <class S>
KOKKOS_INLINE_FUNCTION bool same(const S& x, const S& y) { return equal(x, y) || (is_nan(x) && is_nan(y)); }
// The extreme of x[0..n) whose derivative is the mean of the derivatives of the values that stand
// for it (torch's amax and amin: ties_with_nan false, equal values; max and min of a whole tensor:
// true, and NaNs for a NaN): on dual numbers, the value is the extreme's, the derivatives the mean.
template <bool Max, class S>
KOKKOS_INLINE_FUNCTION S first_extreme(const S* x, int n) {
  S best = x[0];
  for (int k = 1; k < n; ++k) best = Max ? first_max(best, x[k]) : first_min(best, x[k]);
  return best;
}
template <bool Max, bool TiesWithNaN, class S>
KOKKOS_INLINE_FUNCTION S shared_extreme(const S* x, int n) {
  const S best = first_extreme<Max>(x, n);
  if constexpr (std::is_floating_point_v<S>) {
    return best;
  } else {
    S sum(0);
    int ties = 0;
    for (int k = 0; k < n; ++k)
      if (TiesWithNaN ? same(x[k], best) : equal(x[k], best)) {
        sum += x[k];
        ++ties;
      }
    S mean = sum / S(decltype(best.value)(ties));  // no ties (amax of a NaN): NaN derivatives, as torch's
    mean.value = best.value;
    return mean;
  }
}
// y = Op::value(x, c...) with torch's derivative Op::slope(x, c...), also on dual numbers (so that
// a cell's Jacobian has torch's derivatives at the kinks too); the constants c are doubles.
template <class Op, class S, class... C>
KOKKOS_INLINE_FUNCTION S apply(const S& x, C... c) {
  if constexpr (std::is_floating_point_v<S>) return Op::value(x, double(c)...);
  else return x.chain(Op::value(x.value, double(c)...), Op::slope(x.value, double(c)...));
}
// torch's activations (their CPU kernels' formulas) and derivatives, of a number x.
namespace aten_ops {
struct leaky_relu {  // slope at 0: negative_slope
  template <class V>
  KOKKOS_INLINE_FUNCTION static V value(V x, double negative_slope) { return x > V(0) ? x : x * V(negative_slope); }
  template <class V>
  KOKKOS_INLINE_FUNCTION static V slope(V x, double negative_slope) { return x > V(0) ? V(1) : V(negative_slope); }
};
struct elu {  // slope at 0: the negative branch's, alpha scale input_scale
  template <class V>
  KOKKOS_INLINE_FUNCTION static V value(V x, double alpha, double scale, double input_scale) {
    return x <= V(0) ? Kokkos::expm1(x * V(input_scale)) * (V(alpha) * V(scale)) : x * V(scale);
  }
  template <class V>
  KOKKOS_INLINE_FUNCTION static V slope(V x, double alpha, double scale, double input_scale) {
    return x <= V(0) ? V(input_scale) * (V(alpha) * V(scale)) * Kokkos::exp(x * V(input_scale)) : V(scale);
  }
};
struct softplus {  // x itself above the threshold of beta x
  template <class V>
  KOKKOS_INLINE_FUNCTION static V value(V x, double beta, double threshold) {
    return x * V(beta) > V(threshold) ? x : V(Kokkos::log1p(Kokkos::exp(x * V(beta)))) / V(beta);
  }
  template <class V>
  KOKKOS_INLINE_FUNCTION static V slope(V x, double beta, double threshold) {
    const V z = Kokkos::exp(x * V(beta));
    return x * V(beta) > V(threshold) ? V(1) : z / (z + V(1));
  }
};
struct hardsigmoid {  // slope 0 at -3 and 3; inside, torch's kernel's one sixth in float
  template <class V>
  KOKKOS_INLINE_FUNCTION static V value(V x) { return minimum(maximum(x + V(3), V(0)), V(6)) / V(6); }
  template <class V>
  KOKKOS_INLINE_FUNCTION static V slope(V x) { return x > V(-3) && x < V(3) ? V(1.0f / 6.0f) : V(0); }
};
struct silu {
  template <class V>
  KOKKOS_INLINE_FUNCTION static V value(V x) { return x / (V(1) + Kokkos::exp(-x)); }
  template <class V>
  KOKKOS_INLINE_FUNCTION static V slope(V x) {
    const V sigmoid = V(1) / (V(1) + Kokkos::exp(-x));
    return sigmoid * (V(1) + x * (V(1) - sigmoid));
  }
};
}  // namespace aten_ops
"""
# Operations that only move elements (within a trajectory): evaluated on integer codes to find
# where each output element comes from.
_MOVES = {"select", "slice", "unsqueeze", "squeeze", "squeeze_", "view", "_unsafe_view", "reshape", "t",
          "transpose", "permute", "expand", "clone", "alias", "cat", "stack", "unbind", "lift_fresh_copy",
          "detach", "contiguous", "flatten", "unflatten", "narrow", "split", "split_with_sizes", "chunk",
          "movedim", "repeat", "flip"}
_PRODUCTS = {"mm", "addmm", "mv", "dot"}
# Operations that select or place values, whose results are the same computed in any floating
# dtype at least as wide as torch's (the others are refused in another dtype: check_precision).
_EXACT_IN_ANY_DTYPE = _MOVES | {"getitem", "where", "masked_fill", "maximum", "minimum", "max", "min", "amax", "amin",
                                "heaviside", "zeros_like", "ones_like",
                                "full_like", "scalar_tensor", "full", "zeros", "ones", "new_zeros", "new_ones",
                                "new_full", "_to_copy", "to"}


def check_precision(node, dtype):
    """Refuses an operation that torch computes in a floating dtype other than the state's `dtype`
    (the generated code computes everything in the state's): a comparison in the dtype of its
    operands, anything else in its result's; those that only select values are exact in any."""
    name, value = _name(node.target), node.meta.get("val")
    if name in _EXACT_IN_ANY_DTYPE or _clamps_to_tensors(node) or not isinstance(value, torch.Tensor):
        return
    dtypes = [value.dtype] if value.dtype != torch.bool else \
        [arg.meta["val"].dtype for arg in node.all_input_nodes if isinstance(arg.meta.get("val"), torch.Tensor)]
    floating = [d for d in dtypes if d.is_floating_point]
    computing = floating[0] if floating else None
    for other in floating[1:]:
        computing = torch.promote_types(computing, other)
    if computing is not None and computing != dtype:
        raise Unsupported(f"{_describe(node)} computed in dtype {computing} in a function of a state of dtype {dtype} "
                          "(torch.where of two numbers gives the default dtype: write one of them as a tensor of "
                          "the state's dtype)")


def _name(target):
    if target is operator.getitem:
        return "getitem"
    packet = getattr(target, "_overloadpacket", None)  # aten.add.Tensor -> add
    return packet.__name__ if packet is not None else getattr(target, "__name__", str(target))


def _shape(node):
    """A traced value's shape as ints (under torch.compile the trace's sizes are SymInts)."""
    return _shape_of(node.meta["val"])


def _shape_of(value):
    return tuple(int(size) for size in value.shape)


# Reductions to an extreme: name: whether a maximum.
_EXTREMES = {"max": True, "min": False, "amax": True, "amin": False}


def extreme_kind(node, name):
    """(whether a maximum, how torch shares the derivative: "first" (max and min of a dimension:
    to the first extreme), "shared" (amax and amin: among the values equal to it) or
    "shared_with_nan" (max and min of everything: also among NaNs), the dimensions reduced or None
    for all) of a reduction of _EXTREMES."""
    overload = getattr(node.target, "_overloadname", "")
    if name in ("max", "min") and overload == "dim":
        return _EXTREMES[name], "first", [node.args[1]]
    if name in ("max", "min") and overload == "default":
        return _EXTREMES[name], "shared_with_nan", None
    if name in ("amax", "amin"):
        dims = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", [])
        return _EXTREMES[name], "shared", list(dims) or None
    raise Unsupported(_describe(node))


def extreme_output(node, values):
    """getitem of max or min of a dimension: its values; its indices are refused where used."""
    if node.args[1] == 0:
        return values
    if node.users:
        raise Unsupported(f"the indices of {_describe(node.args[0])} (torch.max or torch.min of a dimension: "
                          "their values are supported, their indices are not)")
    return None


def _describe(node):
    return f"the operation {node.target}" if node.op == "call_function" else f"a graph node of kind {node.op}"


class FieldGenerator:
    """Walks the graph once, emitting the forward lines (shared by operator() and vjp()) and the
    backward lines (vjp() only, in reverse order)."""

    def __init__(self, graph_module, n, one_trajectory, tensor_shapes):
        self.graph_module, self.n, self.one_trajectory = graph_module, n, one_trajectory
        self.forward, self.backward, self.adjoints = [], [], []
        self.values, self.used_tensors, self.math = {}, [], set()
        self.extremes = {}  # the values of max and min of a dimension, whose indices are not taken
        self.tensor_shapes = tensor_shapes
        self.counter = 0
        self.uses = {}
        for node in graph_module.graph.nodes:
            for used in node.all_input_nodes:
                self.uses.setdefault(used, []).append(node)

    # -- helpers --
    def fresh(self, shape, active, batched, comment, boolean=False):
        name = f"v{self.counter}"
        self.counter += 1
        size = math.prod(shape)
        self.forward.append(_Declaration(name, size, f"{comment} [{', '.join(map(str, shape))}]" if shape else comment,
                                         "bool" if boolean else "S"))
        if active:
            self.adjoints.append(f"S g_{name} = 0;" if size == 1 else f"S g_{name}[{size}] = {{}};")
        return _array(name, shape, active, batched, boolean)

    def row_shape(self, node, batched, shape=None):
        """The shape per trajectory of node's value (or of `shape`, one of its values)."""
        shape = _shape(node) if shape is None else shape
        if batched and not self.one_trajectory:
            if not shape or shape[0] != TRACE_BATCH:
                raise Unsupported(f"{_describe(node)} giving shape {list(shape)}, which moves the trajectories' "
                                  "dimension away from the first (each trajectory must be computed on its own)")
            return shape[1:]
        return shape

    def operand(self, arg, boolean=False):
        """An argument read as numbers (or as booleans)."""
        if isinstance(arg, torch.fx.Node):
            return as_kind(self.values[arg], boolean)
        if isinstance(arg, (int, float)) and not isinstance(arg, bool):
            return as_kind(_number(arg), boolean)
        raise Unsupported(f"an operand {arg!r} of type {type(arg).__name__}")

    @staticmethod
    def loops(shape):
        """(for-lines, loop variables, flat index expression) over a shape."""
        variables = [f"i{d}" if len(shape) > 1 else "i" for d in range(len(shape))]
        heads = [f"for (int {v} = 0; {v} < {size}; ++{v})" for v, size in zip(variables, shape) if size > 1]
        index = _flat([(v, s) for v, s, size in zip(variables, _strides(shape), shape) if size > 1])
        return heads, variables, index

    @staticmethod
    def broadcast_index(value, out_shape, variables):
        """The flat index into `value` of the output element at `variables` (broadcasting)."""
        shape = value.shape
        extra = len(shape) - len(out_shape)
        if extra > 0:  # a tensor of more dimensions than a trajectory's value: only leading ones
            if any(size != 1 for size in shape[:extra]):
                raise Unsupported(f"a tensor of shape {list(shape)} broadcast along the trajectories (each "
                                  "trajectory must be computed on its own, with tensors shared by all)")
            shape = shape[extra:]
        offset = len(out_shape) - len(shape)
        terms = [(variables[offset + d], stride) for d, (size, stride) in enumerate(zip(shape, _strides(shape)))
                 if size > 1 and out_shape[offset + d] > 1]
        return _flat(terms)

    def emit_loop(self, lines, shape, body):
        heads, variables, index = self.loops(shape)
        statement = body(variables, index)
        if len(heads) <= 1:
            lines.append(" ".join(heads + [statement]))
        else:
            lines.extend([" ".join(heads) + " {", "  " + statement, "}"])

    # -- operations --
    def elementwise(self, node, operands, forward, derivatives, boolean=False):
        """out = forward(*inputs); derivatives[k](inputs, out, g) is the adjoint of operand k (None:
        it has none); a boolean result (of bools) has none."""
        shape = self.row_shape(node, any(v.batched for v in operands))
        active = not boolean and any(v.active and d is not None for v, d in zip(operands, derivatives))
        out = self.fresh(shape, active, any(v.batched for v in operands), f"aten.{_name(node.target)}", boolean)

        def reads(variables):
            return [v.read(self.broadcast_index(v, shape, variables)) for v in operands]

        self.emit_loop(self.forward, shape,
                       lambda variables, index: f"{out.read(index)} = {forward(*reads(variables))};")
        if active:
            lines = []
            for k, v in enumerate(operands):
                if v.active and derivatives[k] is not None:
                    self.emit_loop(lines, shape, lambda variables, index, k=k, v=v: (
                        f"{v.adjoint(self.broadcast_index(v, shape, variables))} += "
                        f"{derivatives[k](reads(variables), out.read(index), out.adjoint(index))};"))
            self.backward.append(lines)
        return out

    def binary(self, node, name, args, kwargs):
        a, b = self.operand(args[0]), self.operand(args[1])
        alpha = kwargs.get("alpha", args[2] if len(args) > 2 else 1)
        scaled = (lambda x: x) if alpha == 1 else (lambda x: f"{_literal(alpha)} * {x}")
        if name == "rsub":
            a, b = b, a
            name = "sub"
        if name == "add":
            return self.elementwise(node, [a, b], lambda x, y: f"{x} + {scaled(y)}",
                                    [lambda r, o, g: g, lambda r, o, g: scaled(g)])
        if name == "sub":
            return self.elementwise(node, [a, b], lambda x, y: f"{x} - {scaled(y)}",
                                    [lambda r, o, g: g, lambda r, o, g: "-" + scaled(g)])
        if alpha != 1:
            raise Unsupported(f"{_describe(node)} with alpha={alpha}")
        if name == "mul":
            return self.elementwise(node, [a, b], lambda x, y: f"{x} * {y}",
                                    [lambda r, o, g: f"{g} * {r[1]}", lambda r, o, g: f"{r[0]} * {g}"])
        if kwargs.get("rounding_mode") is not None:
            raise Unsupported(f"{_describe(node)} with rounding_mode={kwargs['rounding_mode']!r}")
        return self.elementwise(node, [a, b], lambda x, y: f"{x} / {y}",
                                [lambda r, o, g: f"{g} / {r[1]}", lambda r, o, g: f"-{g} * {o} / {r[1]}"])

    def power(self, node, args):
        x, c = self.operand(args[0]), args[1]
        if not isinstance(c, (int, float)) or isinstance(c, bool):
            raise Unsupported(f"{_describe(node)} with an exponent that is not a constant number")
        c = float(c)
        if c == 2:
            return self.elementwise(node, [x], lambda v: f"{v} * {v}", [lambda r, o, g: f"{g} * S(2) * {r[0]}"])
        slope = (lambda v: "S(1)") if c == 1 else (lambda v: f"power({v}, {c - 1!r})")
        return self.elementwise(node, [x], lambda v: f"power({v}, {c!r})",
                                [lambda r, o, g: f"{g} * {_literal(c)} * {slope(r[0])}"])

    def moves(self, node, name):
        """An operation that only moves elements: out element -> (input, element), found by running
        it on integer codes (input k's element e is k * 2^32 + e)."""
        operation = node.args[0] if name == "getitem" else node  # getitem: of a tuple (unbind, split)
        inputs = list(operation.all_input_nodes)
        batched = any(self.values[i].batched for i in inputs) and not self.one_trajectory
        codes = {}
        for k, i in enumerate(inputs):
            shape = _shape(i)
            codes[i] = (torch.arange(math.prod(shape), dtype=torch.int64) + (k << 32)).reshape(shape)
        substitute = lambda a: codes[a] if isinstance(a, torch.fx.Node) else a
        result = operation.target(*torch.fx.node.map_aggregate(operation.args, substitute),
                                  **torch.fx.node.map_aggregate(operation.kwargs, substitute))
        if name == "getitem":
            result = result[node.args[1]]
        if isinstance(result, (tuple, list)):
            return None  # a tuple of values (unbind, split): its getitem users are the moves
        out_shape = self.row_shape(node, batched)
        result = result.reshape(TRACE_BATCH, -1) if batched else result.reshape(1, -1)
        sources = []
        for row in range(result.shape[0]):
            entries = []
            for code in result[row].tolist():
                k, e = code >> 32, code & 0xFFFFFFFF
                source = self.values[inputs[k]]
                if source.batched and not self.one_trajectory:
                    if e // max(source.size, 1) != row:
                        raise Unsupported(f"{_describe(node)}, which mixes the trajectories (each must be computed "
                                          "on its own)")
                    e %= max(source.size, 1)
                entries.append((k, e))
            sources.append(entries)
        if any(entries != sources[0] for entries in sources):
            raise Unsupported(f"{_describe(node)}, which treats the trajectories differently")
        mapping = sources[0]
        boolean = _is_boolean(node)
        values = [as_kind(self.values[i], boolean) for i in inputs]  # cat promotes booleans among numbers
        stop_gradient = name == "detach"
        if len(values) == 1 and values[0].size == len(mapping) and [e for _, e in mapping] == list(range(len(mapping))):
            source = values[0]  # the same elements in the same order (view, reshape, clone): no copy
            return Value(out_shape, source.read, None if stop_gradient else source.adjoint, source.batched, boolean)
        active = any(v.active for v in values) and not stop_gradient
        out = self.fresh(out_shape, active, batched, f"aten.{name}", boolean)
        lines = []
        for (start, k, source_start, length, step) in _runs(mapping):
            source = values[k]
            if length == 1:
                self.forward.append(f"{out.read(start)} = {source.read(source_start)};")
                if active and source.active:
                    lines.append(f"{source.adjoint(source_start)} += {out.adjoint(start)};")
            else:
                src = _flat([("i", step)], source_start)
                dst = _flat([("i", 1)], start)
                self.forward.append(f"for (int i = 0; i < {length}; ++i) {out.read(dst)} = {source.read(src)};")
                if active and source.active:
                    lines.append(f"for (int i = 0; i < {length}; ++i) {source.adjoint(src)} += {out.adjoint(dst)};")
        if lines:
            self.backward.append(lines)
        return out

    def product(self, node, name, args, kwargs):
        """out[i, j] = bias[i, j] + sum_k a[i, k] b[k, j] on one trajectory (mm, addmm, mv, dot)."""
        if name == "addmm" and (kwargs.get("beta", 1) != 1 or kwargs.get("alpha", 1) != 1):
            raise Unsupported(f"{_describe(node)} with beta or alpha other than 1")
        bias_arg, a_arg, b_arg = (args[0], args[1], args[2]) if name == "addmm" else (None, args[0], args[1])
        a, b = self.factor(a_arg), self.factor(b_arg)
        full_a, full_b = _shape(a_arg), _shape(b_arg)
        batch = not self.one_trajectory
        if batch and b is not None and b.batched:
            raise Unsupported(f"{_describe(node)} with the state in its second factor along the trajectories "
                              "(write y @ W.T, not W @ y.T)")
        per_row_a = batch and a is not None and a.batched  # a is [N, K]: a vector of K per trajectory
        if name in ("mm", "addmm"):
            I, K = (1, full_a[1]) if per_row_a else full_a
            J = full_b[1]
            b_at = lambda k, j: _flat([(k, J), (j, 1)])
        elif name == "mv":
            (I, K), J = ((1, full_a[1]) if per_row_a else full_a), 1
            b_at = lambda k, j: k
        else:  # dot
            I, K, J = 1, full_a[0], 1
            b_at = lambda k, j: k
        a_at = (lambda i, k: k) if (per_row_a or name == "dot") else (lambda i, k: _flat([(i, K), (k, 1)]))
        a, a_at = self.transposed(a_arg, a, a_at)
        b, b_at = self.transposed(b_arg, b, b_at)
        bias = self.operand(bias_arg) if bias_arg is not None else None
        operands = [x for x in (bias, a, b) if x is not None]
        batched = any(x.batched for x in operands)
        out_shape = self.row_shape(node, batched)
        if math.prod(out_shape) != I * J:
            raise Unsupported(f"{_describe(node)} of shapes {list(full_a)} and {list(full_b)}")
        active = any(x.active for x in operands)
        out = self.fresh(out_shape, active, batched, f"aten.{name}: ({I} x {K}) times ({K} x {J})")
        i, j = ("i" if I > 1 else "0"), ("j" if J > 1 else "0")
        o = _flat([(i, J), (j, 1)])
        heads = ([f"for (int i = 0; i < {I}; ++i)"] if I > 1 else []) + \
            ([f"for (int j = 0; j < {J}; ++j)"] if J > 1 else [])
        out_variables = {2: ["i", "j"], 1: ["j" if I == 1 else "i"], 0: []}[len(out_shape)]
        bias_at = self.broadcast_index(bias, out_shape, out_variables) if bias is not None else None
        term = f"{a.read(a_at(i, 'k'))} * {b.read(b_at('k', j))}"
        body = [f"S sum = {bias.read(bias_at) if bias is not None else 'S(0)'};",
                f"for (int k = 0; k < {K}; ++k) sum += {term};",
                f"{out.read(o)} = sum;"]
        self.forward.extend(_block(heads, body))
        if active:
            back = [f"const S g = {out.adjoint(o)};"]
            if bias is not None and bias.active:
                back.append(f"{bias.adjoint(bias_at)} += g;")
            inner = []
            if a.active:
                inner.append(f"{a.adjoint(a_at(i, 'k'))} += g * {b.read(b_at('k', j))};")
            if b.active:
                inner.append(f"{b.adjoint(b_at('k', j))} += {a.read(a_at(i, 'k'))} * g;")
            if len(inner) == 1:
                back.append(f"for (int k = 0; k < {K}; ++k) {inner[0]}")
            elif inner:
                back += [f"for (int k = 0; k < {K}; ++k) {{"] + ["  " + line for line in inner] + ["}"]
            self.backward.append(_block(heads, back))
        return out

    def reduced(self, node, x_arg, dims, out_shape, comment):
        """(x, its group of elements per output, the output, the loop heads over the outputs, the
        output index, x's element k of the output) of a reduction over the trailing dimensions
        `dims` of one trajectory's value (None: all of them)."""
        x = self.operand(x_arg)
        full = _shape(x_arg)
        given = list(range(len(full))) if dims is None else list(dims)
        dims = sorted({d % len(full) for d in given}) if len(full) else []
        first = 1 if (x.batched and not self.one_trajectory) else 0
        if not dims or dims[0] < first or dims != list(range(dims[0], len(full))):
            raise Unsupported(f"{_describe(node)} over dimensions {given} of a value of shape {list(full)} "
                              "(reductions over the last dimensions of one trajectory's value only)")
        group = math.prod(full[d] for d in dims)
        out_shape = self.row_shape(node, x.batched, out_shape)
        count = math.prod(out_shape)
        out = self.fresh(out_shape, x.active, x.batched, f"aten.{comment} of {group} elements")
        o = "i" if count > 1 else "0"
        heads = [f"for (int i = 0; i < {count}; ++i)"] if count > 1 else []
        return x, group, out, heads, o, _flat([(o, group), ("k", 1)])

    def reduction(self, node, name, args, kwargs):
        """sum or mean over the trailing dimensions of one trajectory's value."""
        if kwargs.get("dtype") is not None:
            raise Unsupported(f"{_describe(node)} with dtype={kwargs['dtype']}")
        x, group, out, heads, o, element = self.reduced(node, args[0], args[1], None, name)
        scale = "" if name == "sum" else f" / S({group})"
        body = ["S sum = 0;", f"for (int k = 0; k < {group}; ++k) sum += {x.read(element)};",
                f"{out.read(o)} = sum{scale};"]
        self.forward.extend(_block(heads, body))
        if x.active:
            back = [f"for (int k = 0; k < {group}; ++k) {x.adjoint(element)} += {out.adjoint(o)}{scale};"]
            self.backward.append([" ".join(heads + back)] if heads else back)
        return out

    def extreme(self, node, name, args):
        """max, min (of a dimension, giving values and indices, or of everything), amax or amin
        over the trailing dimensions of one trajectory's value, with torch's derivatives: to the
        first extreme (max and min of a dimension), or shared by the values equal to it (the
        others; max and min of everything count NaNs as equal to a NaN result)."""
        maximum, ties, dims = extreme_kind(node, name)
        values_shape = _shape_of(node.meta["val"][0] if ties == "first" else node.meta["val"])
        x, group, out, heads, o, element = self.reduced(node, args[0], dims, values_shape, name)
        running = "first_max" if maximum else "first_min"
        body = [f"S best = {x.read(_flat([(o, group)]))};",
                f"for (int k = 1; k < {group}; ++k) best = {running}(best, {x.read(element)});",
                f"{out.read(o)} = best;"]
        self.forward.extend(_block(heads, body))
        if x.active:
            y, g, read = out.read(o), out.adjoint(o), x.read(element)
            if ties == "first":
                back = ["int k = 0;", f"while (k < {group - 1} && !same({read}, {y})) ++k;",
                        f"{x.adjoint(element)} += {g};"]
            else:
                stands = f"same({read}, {y})" if ties == "shared_with_nan" else f"equal({read}, {y})"
                back = ["S ties = 0;", f"for (int k = 0; k < {group}; ++k) ties += {stands} ? S(1) : S(0);",
                        "// none (amax of a NaN): NaN derivatives, as torch's",
                        f"for (int k = 0; k < {group}; ++k) "
                        f"{x.adjoint(element)} += {g} / ties * ({stands} ? S(1) : S(0));"]
            self.backward.append(_block(heads, back))
        if ties == "first":
            self.extremes[node] = out
            return None
        return out

    def factor(self, arg):
        return self.values[arg] if arg not in self.transposes else None

    def transposed(self, arg, value, at):
        """A factor that is the transpose of a matrix of one trajectory (W.T) is read from that
        matrix with its indices swapped: no copy."""
        source = self.transposes.get(arg)
        if source is None:
            return value, at
        columns = self.values[source].shape[1]
        return self.values[source], (lambda r, c: _flat([(c, columns), (r, 1)]))

    def find_transposes(self):
        """The 2-D transposes (t, permute [1, 0], transpose 0 1) of values that do not depend on
        the state, used only as factors of matrix products."""
        for node in self.graph_module.graph.nodes:
            if node.op != "call_function" or not node.all_input_nodes:
                continue
            name, source = _name(node.target), node.args[0]
            swaps = name == "t" or (name == "permute" and [d % 2 for d in node.args[1]] == [1, 0]) \
                or (name == "transpose" and sorted(d % 2 for d in node.args[1:3]) == [0, 1])
            if not swaps or len(_shape(source)) != 2 or _depends_on(source, self.state_nodes):
                continue
            users = self.uses.get(node, [])
            factor = lambda user: _name(user.target) in _PRODUCTS and \
                node in (user.args[1:3] if _name(user.target) == "addmm" else user.args[:2])
            if users and all(factor(user) for user in users):
                self.transposes[node] = source

    # -- the walk --
    def run(self):
        placeholders = [node for node in self.graph_module.graph.nodes if node.op == "placeholder"]
        t_node, y_node, tensor_nodes = placeholders[0], placeholders[1], placeholders[2:]
        self.state_nodes = {t_node, y_node}
        self.dtype = y_node.meta["val"].dtype
        self.transposes = {}
        self.find_transposes()
        self.values[t_node] = Value(_shape(t_node)[0 if self.one_trajectory else 1:],
                                    lambda i: "t", None, batched=True)
        self.values[y_node] = Value((self.n,), lambda i: f"y[{i}]", lambda i: f"y_bar[{i}]", batched=True)
        offset = 0
        for index, node in enumerate(tensor_nodes):
            if not self.uses.get(node):
                continue
            shape = self.tensor_shapes[index]
            self.used_tensors.append(index)
            self.values[node] = Value(shape, lambda i, o=offset: f"S(p.shared({_offset(o, i)}))",
                                      lambda i, o=offset: f"p_bar.shared({_offset(o, i)})")
            offset += math.prod(shape)
        self.shared_count = offset
        needed = needing_adjoints(self.graph_module.graph)
        output = None
        for node in self.graph_module.graph.nodes:
            if node.op == "placeholder":
                continue
            if node.op == "output":
                output = node.args[0]
                break
            if node.op == "get_attr":
                constant = getattr(self.graph_module, node.target)
                self.values[node] = self.constant(constant)
                continue
            if node.op != "call_function":
                raise Unsupported(_describe(node))
            if node not in self.transposes:
                emitted = len(self.backward), len(self.adjoints)
                value = self.call(node)  # of the node's kind: booleans for a tensor of bools
                if node not in needed:  # no adjoint: none of its 0 times an infinite derivative
                    del self.backward[emitted[0]:], self.adjoints[emitted[1]:]
                    value = _inactive(value) if value is not None else None
                    if node in self.extremes:
                        self.extremes[node] = _inactive(self.extremes[node])
                self.values[node] = as_kind(value, _is_boolean(node)) if value is not None else None
        if isinstance(output, (tuple, list)):
            raise Unsupported("a function returning a tuple (return one tensor of y's shape)")
        return self.values[output]

    def conversion(self, node):
        """A conversion to bool or to the state's dtype (from bool, or to the same dtype)."""
        target = node.meta["val"].dtype
        if target not in (torch.bool, self.dtype) or set(node.kwargs) - {"dtype"}:
            raise Unsupported(f"{_describe(node)}, a conversion to dtype {target} (to bool or the state's dtype "
                              f"{self.dtype} only)")
        return self.operand(node.args[0], target == torch.bool)

    def constant(self, tensor):
        boolean = tensor.dtype == torch.bool
        literal = (lambda x: "true" if x else "false") if boolean else _literal
        values = [literal(x) for x in tensor.detach().reshape(-1).tolist()]
        if len(values) == 1:
            return Value(tuple(tensor.shape), lambda i, x=values[0]: x, boolean=boolean)
        name = f"c{self.counter}"
        self.counter += 1
        self.forward.append(f"const {'bool' if boolean else 'S'} {name}[{len(values)}] = {{{', '.join(values)}}};")
        return Value(tuple(tensor.shape), lambda i: f"{name}[{i}]", boolean=boolean)

    def call(self, node):
        name = _name(node.target)
        args, kwargs = node.args, node.kwargs
        check_precision(node, self.dtype)
        found = selection(node)
        if found is not None:
            kinds, result, forward, derivatives = _SELECTIONS[found[0]]
            operands = [self.operand(arg, kind == "b") for arg, kind in zip(found[1], kinds)]
            return self.elementwise(node, operands, forward, derivatives, result == "b")
        key = unary_key(node)
        if key is not None:
            forward, derivative = unary_functions(key)
            self.math.update(f for f in _MATH_FUNCTIONS
                             if f + "(" in forward("x") + (derivative("x", "y", "g") if derivative else ""))
            return self.elementwise(node, [self.operand(args[0])], forward,
                                    [(lambda r, o, g, d=derivative: d(r[0], o, g)) if derivative else None])
        if name == "_to_copy":
            return self.conversion(node)
        if name in ("add", "sub", "mul", "div", "rsub") and len(args) >= 2:
            return self.binary(node, name, args, kwargs)
        if name == "pow" and isinstance(args[0], torch.fx.Node):
            return self.power(node, args)
        if name in _PRODUCTS:
            return self.product(node, name, args, kwargs)
        if name in ("sum", "mean") and len(args) >= 2:
            return self.reduction(node, name, args, kwargs)
        if name in _EXTREMES:
            return self.extreme(node, name, args)
        if name == "getitem" and node.args[0] in self.extremes:
            return extreme_output(node, self.extremes[node.args[0]])
        if name in _MOVES or name == "getitem":
            return self.moves(node, name)
        if name in ("zeros_like", "ones_like", "full_like", "scalar_tensor", "full", "zeros", "ones"):
            batched = name.endswith("_like") and self.values[node.args[0]].batched
            return self.constant(_fill(node, self.row_shape(node, batched)))
        raise Unsupported(_describe(node))


class _Declaration:
    """A value's declaration among the forward lines (of C++ type S or bool); rendered with its
    first assignment when it is a single element."""

    def __init__(self, name, size, comment, type_name="S"):
        self.name, self.size, self.comment, self.type_name = name, size, comment, type_name


def _render(lines):
    rendered, k = [], 0
    while k < len(lines):
        line = lines[k]
        if isinstance(line, _Declaration):
            following = lines[k + 1] if k + 1 < len(lines) else None
            if line.size == 1 and isinstance(following, str) and following.startswith(f"{line.name} = "):
                rendered.append(f"const {line.type_name} {following}  // {line.comment}")
                k += 2
                continue
            declared = line.name if line.size == 1 else f"{line.name}[{line.size}]"
            rendered.append(f"{line.type_name} {declared};  // {line.comment}")
        else:
            rendered.append(line)
        k += 1
    return rendered


def _fill(node, shape):
    """The constant tensor of a creation operation (zeros_like, full, ...), per trajectory: of
    bools for a tensor of bools, else of numbers."""
    name = _name(node.target)
    value = {"zeros_like": 0, "ones_like": 1, "zeros": 0, "ones": 1}.get(name)
    if value is None:
        value = node.args[1] if name in ("full_like", "full") else node.args[0]
    if not isinstance(value, (int, float)) or (isinstance(value, bool) and not _is_boolean(node)):
        raise Unsupported(_describe(node) + " with a value that is not a constant number")
    return torch.full(shape, value, dtype=node.meta["val"].dtype)  # the value in torch's dtype


def _inactive(value):
    return Value(value.shape, value.read, None, value.batched, value.boolean)


def needing_adjoints(graph):
    """The nodes whose adjoint can be nonzero: those the output is differentiable in (as torch's
    autograd, which does not differentiate through a comparison or where's condition), so that a
    value used only in a mask (isnan(log(y))) is not differentiated at all."""
    output = next(node for node in graph.nodes if node.op == "output").args[0]
    needed = {output} if isinstance(output, torch.fx.Node) else set()
    for node in reversed(list(graph.nodes)):
        if node in needed:
            value = node.meta.get("val")
            if isinstance(value, torch.Tensor) and not value.dtype.is_floating_point:
                continue  # booleans and indices: no derivative
            positions = {"where": (0,), "masked_fill": (1,), "heaviside": (0,), "sign": (0,), "sgn": (0,)}
            skipped = {node.args[k] for k in positions.get(_name(node.target), ()) if k < len(node.args)}
            needed.update(i for i in node.all_input_nodes if i not in skipped)
    return needed


def _depends_on(node, leaves):
    """Whether node is one of `leaves` or computed from one."""
    stack, seen = [node], set()
    while stack:
        current = stack.pop()
        if current in seen or not isinstance(current, torch.fx.Node):
            continue
        seen.add(current)
        if current in leaves:
            return True
        stack.extend(current.all_input_nodes)
    return False


def _offset(o, i):
    """The index expression o + i."""
    if i == "0":
        return str(o)
    return f"{o} + {i}" if o else i


def _runs(mapping):
    """(out start, input, input start, length, input step) runs of an element mapping."""
    runs = []
    for position, (k, e) in enumerate(mapping):
        if runs:
            start, rk, rs, length, step = runs[-1]
            if rk == k and position == start + length:
                if length == 1 and e != rs:
                    runs[-1] = (start, k, rs, 2, e - rs)
                    continue
                if length > 1 and e == rs + length * step:
                    runs[-1] = (start, k, rs, length + 1, step)
                    continue
        runs.append((position, k, e, 1, 1))
    return runs


def _block(heads, body):
    if not heads:
        return ["{"] + ["  " + line for line in body] + ["}"]
    return [" ".join(heads) + " {"] + ["  " + line for line in body] + ["}"]


def generate(graph_module, n, one_trajectory, tensor_shapes, struct_name="UserField"):
    """(C++ source of the field struct, indices of the tensors it reads, shared parameter count)."""
    generator = FieldGenerator(graph_module, n, one_trajectory, tensor_shapes)
    out = generator.run()
    if out.shape != (n,):
        raise Unsupported(f"a result of shape {list(out.shape)} per trajectory, expected [{n}]")
    if out.boolean:
        raise Unsupported("a result of dtype torch.bool (return the derivative, of y's dtype)")
    math_usings = "".join(f"    using Kokkos::{f};\n" for f in sorted(generator.math - {"pow"}))
    forward = "\n".join("    " + line for line in _render(generator.forward))
    store = f"    for (int i = 0; i < {n}; ++i) dy[i] = {out.read('i')};" if n > 1 else f"    dy[0] = {out.read('0')};"
    backward_lines = []
    if out.active:
        seed = f"{out.adjoint('i')} += dy_bar[i];"
        backward_lines.append(f"for (int i = 0; i < {n}; ++i) {seed}" if n > 1 else seed.replace("[i]", "[0]"))
    for lines in reversed(generator.backward):
        backward_lines.extend(lines)
    adjoints = "\n".join("    " + line for line in generator.adjoints)
    backward = "\n".join("    " + line for line in backward_lines)
    # A few shared values: the backward loop sums each trajectory's part of their gradient in a
    # local array (src/loops/field.hpp, max_shared_parameter_count).
    bound = (f"\n  static constexpr int max_shared_parameter_count = {generator.shared_count};"
             if 0 < generator.shared_count <= 16 else "")
    source = f"""struct {struct_name} {{
  static constexpr int state_size = {n};{bound}
  KOKKOS_INLINE_FUNCTION int parameter_count() const {{ return 0; }}
  KOKKOS_INLINE_FUNCTION int shared_parameter_count() const {{ return {generator.shared_count}; }}

  // dy = f(t, y) for one trajectory: the traced function, operation by operation.
  template <class S, class P>
  KOKKOS_INLINE_FUNCTION void operator()([[maybe_unused]] S t, const S* y, [[maybe_unused]] const P& p, S* dy) const {{
{math_usings}{forward}
{store}
  }}

  // y_bar += (df/dy)^T dy_bar, p_bar.shared += (df/dshared)^T dy_bar: the forward lines again, then
  // each operation's adjoint in reverse order.
  template <class S, class P, class G>
  KOKKOS_INLINE_FUNCTION void vjp([[maybe_unused]] S t, const S* y, [[maybe_unused]] const P& p, const S* dy_bar,
                                  [[maybe_unused]] S* y_bar, [[maybe_unused]] const G& p_bar) const {{
{math_usings}{forward}
{adjoints}
{backward}
  }}
}};
"""
    return source, generator.used_tensors, generator.shared_count
