"""newton_apply's compiled path: a cell of your own as generated C++ operators.

The cell's step is traced and emitted as a C++ cell of the Newton solver (_cell_codegen.py), then
compiled with the adapter's headers (src/adapters/torch/newton_solve.hpp: newton_solve and
newton_backward for one cell and type, as the built-in ParaGRU and ParaLSTM operators run them)
into a small extension with two operators, newton and newton_backward, in a namespace of its own
(torch.ops.paraseq_cell_<hash>): one cell program, one Jacobian structure, one compute type, for the
CPU and, where Kokkos has CUDA, CUDA (an nvcc compile). Its fake kernels and autograd are registered here (torch.library), so under torch.compile the
solve is one operator after the prologue's PyTorch operations.

A call: the prologue (step's operations that do not read h_prev) runs in PyTorch over all (b, t),
its values are gathered into each group's inputs u [B, T, groups x inputs] and parameters
[groups, params], and the operator solves (its config is the built-in cells' packed NewtonConfig,
so every scan_backend mode and the residual work as for them). Gradients: the operator's backward
(newton_backward: the adjoint recurrence and the cell's generated vjp) gives those of u, of the
parameters and of h0; autograd takes them through the gathers and the prologue to x and the
cell's tensors.

Compiling, the on-disk cache (under $PARASEQ_CACHE_DIR/cells) and loading: _extension_build.py.
"""

from __future__ import annotations

import warnings

import torch
from torch._subclasses.fake_tensor import unset_fake_temporarily

from . import _cell_codegen, _ops, _user_cell, _user_function
from ._extension_build import BuildUnavailable, build_settings, require_device
from ._extension_build import load as _load
from ._field_codegen import HELPERS, Unsupported

SCALAR_TYPES = {torch.float32: "float", torch.float64: "double"}
HEADERS = ("solvers/newton.hpp", "solvers/newton_backward.hpp", "adapters/torch/newton_solve.hpp")


# The mode families of a CUDA build's extension, each compiled in a unit of its own so that nvcc
# runs them side by side: (unit name part, CompiledNewtonModes of the forward or the backward).
CUDA_FORWARD_FAMILIES = (("sequential", "sequential"), ("newton", "newton"), ("newton_quasi", "newton_quasi"),
                         ("fused", "fused"), ("one_pass", "one_pass"))
CUDA_BACKWARD_FAMILIES = (("scan", "newton | paraseq::CompiledNewtonModes::newton_quasi"),
                          ("fused", "fused | paraseq::CompiledNewtonModes::sequential"), ("one_pass", "one_pass"))


def _instances(structure, split):
    """(unit name, function, family, space) of every solve of a family that the operators call from
    another unit: with split (a CUDA build) each CUDA family apart and the host's all together."""
    if not split:
        return []
    units = []
    for direction, families in (("forward", CUDA_FORWARD_FAMILIES), ("backward", CUDA_BACKWARD_FAMILIES)):
        units.append((f"{direction}_host", f"{direction}_family", "all", "paraseq::torch_bridge::HostSpace"))
        units += [(f"{direction}_cuda_{name}", f"{direction}_family", family, "Kokkos::Cuda")
                  for name, family in families
                  if not (name == "newton_quasi" and structure == "diag")]  # a diagonal cell's quasi scan is its exact one
    return units


def _scan_kernels(structure, split, tags):
    """(unit name, the scan's alias in the extension's namespace, tag) of every ordered-scan kernel
    with a unit of its own: with split (a CUDA build), the kernels `tags` (the library's device scan
    kernels, as its compiled instances split them: build_settings) of the Newton scan, the quasi one
    (a cell whose Jacobian is not diagonal) and the adjoint scan. The family units then compile only
    their scans' planning kernels, and nvcc compiles these beside them."""
    if not split:
        return []
    scans = ["forward_scan", "adjoint_scan"] + ([] if structure == "diag" else ["quasi_scan"])
    return [(f"{scan}_{tag[:-3].lower()}", scan, tag) for scan in scans for tag in tags]


def _scan_kernel(namespace, scan, tag, extern):
    return (f"{'extern ' if extern else ''}template struct paraseq::detail::ScanKernel<{namespace}::{scan}, "
            f"paraseq::detail::{tag}>;")


def _instance(function, family, space, extern):
    return (f"{'extern ' if extern else ''}template void {function}<paraseq::CompiledNewtonModes::{family}>("
            f"const paraseq::torch_bridge::NewtonArrays&, const paraseq::NewtonConfig&, const {space}&);")


def _extension_sources(namespace, cell, structure, dtype, split, suffix, scan_tags):
    """The extension's files: its headers (the work's, and what its PyTorch half calls), the work's
    unit and the operators' PyTorch half (a ".cpp" unit, which a CUDA build compiles with the C++
    compiler and the work with nvcc), and with split (a CUDA build) one unit per mode family and
    space (_instances), which the work declares extern, and one per device scan kernel of scan_tags
    (_scan_kernels)."""
    scalar = SCALAR_TYPES[dtype]
    dense = ("TORCH_CHECK_VALUE(groups == 1, op, \": argument 'params' has shape \", params.sizes(),\n"
             "                    \", expected [1, \", shape.max_params_per_group,\n"
             "                    \"] (a dense cell is one group)\");") if structure == "dense" else ""
    instances = _instances(structure, split)
    externs = "\n".join(_instance(function, family, space, True) for _, function, family, space in instances)
    kernels = _scan_kernels(structure, split, scan_tags)
    # The scans of the solves on CUDA (newton.hpp's and newton_backward.hpp's recurrences over the
    # Views of the operators, h0 always given) and their kernels declared extern: see _scan_kernels.
    scans = ("""
#ifdef KOKKOS_ENABLE_CUDA
namespace {namespace} {{
using DeviceCell = UserCell<T, Kokkos::Cuda>;
using forward_scan = paraseq::detail::OrderedScan<DeviceCell::structure, T, Kokkos::Cuda,
    paraseq::detail::compiled_linearization_t<T, DeviceCell, Kokkos::Cuda, false>>;
using quasi_scan = paraseq::detail::OrderedScan<paraseq::Diagonal, T, Kokkos::Cuda,
    paraseq::detail::compiled_linearization_t<T, DeviceCell, Kokkos::Cuda, true>>;
using adjoint_scan = paraseq::detail::OrderedScan<DeviceCell::structure, T, Kokkos::Cuda,
    paraseq::detail::compiled_adjoint_t<T, DeviceCell, Kokkos::Cuda>>;
}} // namespace {namespace}

{externs}
#endif
""".format(namespace=namespace,
           externs="\n".join(_scan_kernel(namespace, scan, tag, True) for _, scan, tag in kernels)) if kernels else "")
    files = {f"{namespace}.hpp": f"""// Generated by paraseq (python/paraseq/_compiled_cell.py) from a cell of your own: the cell and
// the solves of its mode families (newton_solve.hpp) for its {structure} Jacobian in {scalar}.
#pragma once
#include "{namespace}_work.hpp"
#include "newton_solve.hpp"

#include <paraseq/loops/dual.hpp>

#include <string>
#include <type_traits>

namespace {namespace} {{

{HELPERS}
{cell}
struct MakeUserCell {{
  template <class T, class Space>
  auto operator()(const paraseq::torch_bridge::NewtonArrays& arrays) const {{
    return UserCell<T, Space>{{paraseq::torch_bridge::as_view<const T, 2, Space>(arrays.params[0])}};
  }}
}};

using T = {scalar};
using Cell = UserCell<T, paraseq::torch_bridge::HostSpace>;
template <paraseq::CompiledNewtonModes Modes, class Space>
void forward_family(const paraseq::torch_bridge::NewtonArrays& arrays, const paraseq::NewtonConfig& config,
                    const Space& space) {{
  paraseq::torch_bridge::newton_forward_on<MakeUserCell, T, Modes>(forward_op, arrays, config, space);
}}

template <paraseq::CompiledNewtonModes Modes, class Space>
void backward_family(const paraseq::torch_bridge::NewtonArrays& arrays, const paraseq::NewtonConfig& config,
                     const Space& space) {{
  paraseq::torch_bridge::newton_gradients_on<MakeUserCell, T, Modes>(arrays, config, space);
}}

}} // namespace {namespace}
{scans}"""}
    files[f"{namespace}_work.hpp"] = f"""// Generated by paraseq (python/paraseq/_compiled_cell.py) from a cell of your own: what the
// operators' PyTorch half calls in the work of {namespace} (src/adapters/torch/work.hpp).
#pragma once
#include "work.hpp"

namespace {namespace} {{

constexpr const char* forward_op = "{namespace}::newton";
constexpr const char* backward_op = "{namespace}::newton_backward";

// The cell's inputs, state and parameter slots per group (its constants).
struct CellShape {{
  int64_t inputs, group_size, params, max_params_per_group;
}};
CellShape cell_shape();

// The solve and its gradients (the automatic mode, as for the built-in cells) on the arrays' device.
void forward_work(const paraseq::torch_bridge::Place& place, const paraseq::torch_bridge::NewtonArrays& arrays,
                  const paraseq::torch_bridge::PackedNewtonConfig& config);
void backward_work(const paraseq::torch_bridge::Place& place, const paraseq::torch_bridge::NewtonArrays& arrays);

}} // namespace {namespace}
"""
    work = f"""// Generated by paraseq (python/paraseq/_compiled_cell.py) from a cell of your own: the work of
// torch.ops.{namespace}.newton and .newton_backward (newton_solve and newton_backward) for its
// {structure} Jacobian, {scalar}.
#include "{namespace}.hpp"

namespace {namespace} {{

{externs}

// A space other than the host's exists only in a CUDA build, whose extension compiles each mode
// family on CUDA in a unit of its own: the mode is chosen here and its family's unit runs it. On the
// host one instance compiles every family.
template <class Space>
void run_forward(const paraseq::torch_bridge::NewtonArrays& arrays, const paraseq::NewtonConfig& config,
                 const Space& space) {{
  using paraseq::CompiledNewtonModes;
  using structure = typename Cell::structure;
  if constexpr (!std::is_same_v<Space, paraseq::torch_bridge::HostSpace>) {{
    paraseq::NewtonConfig chosen = config;
    chosen.mode = paraseq::torch_bridge::newton_mode_on<MakeUserCell, T>(arrays, config, space);
    const CompiledNewtonModes family = paraseq::detail::kernel_family<structure>(chosen.mode, chosen.jacobian);
    if (family == CompiledNewtonModes::sequential) forward_family<CompiledNewtonModes::sequential>(arrays, chosen, space);
    else if (family == CompiledNewtonModes::fused) forward_family<CompiledNewtonModes::fused>(arrays, chosen, space);
    else if (family == CompiledNewtonModes::one_pass) forward_family<CompiledNewtonModes::one_pass>(arrays, chosen, space);
    else if constexpr (!std::is_same_v<structure, paraseq::Diagonal>) {{
      if (family == CompiledNewtonModes::newton_quasi) forward_family<CompiledNewtonModes::newton_quasi>(arrays, chosen, space);
      else forward_family<CompiledNewtonModes::newton>(arrays, chosen, space);
    }} else {{
      forward_family<CompiledNewtonModes::newton>(arrays, chosen, space);
    }}
  }} else {{
    forward_family<CompiledNewtonModes::all>(arrays, config, space);
  }}
}}

// The backward's config is the default: the automatic mode, as for the built-in cells.
template <class Space>
void run_backward(const paraseq::torch_bridge::NewtonArrays& arrays, const Space& space) {{
  using paraseq::CompiledNewtonModes;
  const paraseq::NewtonConfig config;
  if constexpr (!std::is_same_v<Space, paraseq::torch_bridge::HostSpace>) {{
    paraseq::NewtonConfig chosen = config;
    chosen.mode = paraseq::torch_bridge::newton_mode_on<MakeUserCell, T>(arrays, config, space);
    if (chosen.mode == paraseq::NewtonMode::newton)
      backward_family<CompiledNewtonModes::newton | CompiledNewtonModes::newton_quasi>(arrays, chosen, space);
    else if (chosen.mode == paraseq::NewtonMode::one_pass) backward_family<CompiledNewtonModes::one_pass>(arrays, chosen, space);
    else backward_family<CompiledNewtonModes::fused | CompiledNewtonModes::sequential>(arrays, chosen, space);
  }} else {{
    backward_family<CompiledNewtonModes::all>(arrays, config, space);
  }}
}}

CellShape cell_shape() {{ return {{Cell::inputs, Cell::group_size, Cell::params, Cell::max_params_per_group}}; }}

void forward_work(const paraseq::torch_bridge::Place& place, const paraseq::torch_bridge::NewtonArrays& arrays,
                  const paraseq::torch_bridge::PackedNewtonConfig& config) {{
  const paraseq::NewtonConfig solver_config = paraseq::torch_bridge::newton_config_from_list(forward_op, config);
  paraseq::torch_bridge::with_space(forward_op, place, [&](const auto& space) {{ run_forward(arrays, solver_config, space); }});
}}

void backward_work(const paraseq::torch_bridge::Place& place, const paraseq::torch_bridge::NewtonArrays& arrays) {{
  paraseq::torch_bridge::with_space(backward_op, place, [&](const auto& space) {{ run_backward(arrays, space); }});
}}

}} // namespace {namespace}
"""
    cuda_kernels = f"""
TORCH_LIBRARY_IMPL({namespace}, CUDA, m) {{
  m.impl("newton", &{namespace}::newton);
  m.impl("newton_backward", &{namespace}::newton_backward);
}}
""" if split else ""
    operators = f"""// Generated by paraseq (python/paraseq/_compiled_cell.py) from a cell of your own, the PyTorch
// half: torch.ops.{namespace}.newton and .newton_backward for its {structure} Jacobian, {scalar}, on the CPU
// and, where Kokkos has CUDA, on CUDA.
#include "{namespace}_work.hpp"
#include "tensors.hpp"

#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <torch/library.h>

namespace {namespace} {{

// The groups of a call: u [B, T, groups x inputs], params [groups, max_params_per_group] and h0
// [B, groups x group_size], all of this extension's type on one device (the CPU, or CUDA where
// Kokkos has it: place_of names any other).
int64_t checked_groups(const char* op, const at::Tensor& u, const at::Tensor& params,
                       const std::optional<at::Tensor>& h0) {{
  using namespace paraseq::torch_bridge;
  const CellShape shape = cell_shape();
  check_tensor(op, "u", u, 3, u);
  check_tensor(op, "params", params, 2, u);
  constexpr at::ScalarType type = c10::CppTypeToScalarType<{scalar}>::value;
  TORCH_CHECK_VALUE(u.scalar_type() == type, op, ": argument 'u' has dtype ", u.scalar_type(), ", expected ", type,
                    " (this extension's)");
  TORCH_CHECK_VALUE(params.size(1) == shape.max_params_per_group, op, ": argument 'params' has shape ",
                    params.sizes(), ", expected [groups, ", shape.max_params_per_group, "]");
  const int64_t groups = params.size(0);
  {dense}
  TORCH_CHECK_VALUE(u.size(2) == groups * shape.inputs, op, ": argument 'u' has shape ", u.sizes(),
                    ", expected [B, T, ", groups * shape.inputs, "] (", groups, " groups from argument 'params' x ",
                    shape.inputs, " inputs)");
  if (h0) {{
    check_tensor(op, "h0", *h0, 2, u);
    TORCH_CHECK_VALUE(h0->size(0) == u.size(0) && h0->size(1) == groups * shape.group_size, op,
                      ": argument 'h0' has shape ", h0->sizes(), ", expected [", u.size(0), ", ",
                      groups * shape.group_size, "]");
  }}
  return groups;
}}

void check_states(const char* name, const at::Tensor& states, const at::Tensor& u, int64_t state_size) {{
  paraseq::torch_bridge::check_tensor(backward_op, name, states, 3, u);
  TORCH_CHECK_VALUE(states.size(0) == u.size(0) && states.size(1) == u.size(1) && states.size(2) == state_size,
                    backward_op, ": argument '", name, "' has shape ", states.sizes(), ", expected [", u.size(0), ", ",
                    u.size(1), ", ", state_size, "]");
}}

std::tuple<at::Tensor, at::Tensor, at::Tensor> newton(const at::Tensor& u, const at::Tensor& params,
                                                      const std::optional<at::Tensor>& h0, c10::ArrayRef<double> config,
                                                      bool with_residual) {{
  using namespace paraseq::torch_bridge;
  const int64_t groups = checked_groups(forward_op, u, params, h0);
  const CellShape shape = cell_shape();
  const Place place = place_of(forward_op, u);
  const at::Tensor u_c = prepared(u), params_c = prepared(params);
  // A cell of one's own is solved from a given h0 (newton_solve.hpp).
  const at::Tensor h0_c = h0 ? prepared(*h0) : at::zeros({{u.size(0), groups * shape.group_size}}, u_c.options());
  const at::Tensor h = at::empty({{u.size(0), u.size(1), groups * shape.group_size}}, u_c.options());
  const at::Tensor residual = at::empty({{with_residual ? u.size(0) : 0}}, u.options().dtype(at::kDouble));
  const at::Tensor stats = at::empty({{with_residual ? 2 : 0}}, u.options().dtype(at::kLong));
  NewtonArrays arrays;
  arrays.u = array_of(u_c), arrays.params = {{array_of(params_c)}}, arrays.h0 = array_of(h0_c);
  arrays.h = array_of(h), arrays.residual = array_of(residual), arrays.stats = array_of(stats);
  translate_errors([&] {{ forward_work(place, arrays, PackedNewtonConfig(config.begin(), config.end())); }});
  return {{h, residual, stats}};
}}

std::tuple<at::Tensor, at::Tensor, at::Tensor> newton_backward(const at::Tensor& u, const at::Tensor& params,
                                                               const std::optional<at::Tensor>& h0,
                                                               const at::Tensor& h, const at::Tensor& grad_h) {{
  using namespace paraseq::torch_bridge;
  const int64_t groups = checked_groups(backward_op, u, params, h0);
  const CellShape shape = cell_shape();
  check_states("h", h, u, groups * shape.group_size);
  check_states("grad_h", grad_h, u, groups * shape.group_size);
  const Place place = place_of(backward_op, u);
  const at::Tensor u_c = prepared(u), params_c = prepared(params);
  const at::Tensor h0_c = h0 ? prepared(*h0) : at::zeros({{u.size(0), groups * shape.group_size}}, u_c.options());
  const at::Tensor h_c = prepared(h), grad_h_c = prepared(grad_h);
  const at::Tensor du = at::empty(u.sizes(), u_c.options());
  const at::Tensor dparams = at::empty({{groups * shape.params}}, u_c.options());
  const at::Tensor dh0 = at::empty({{u.size(0), groups * shape.group_size}}, u_c.options());
  NewtonArrays arrays;
  arrays.u = array_of(u_c), arrays.params = {{array_of(params_c)}}, arrays.h0 = array_of(h0_c);
  arrays.h = array_of(h_c), arrays.grad_h = array_of(grad_h_c);
  arrays.du = array_of(du), arrays.dparams = array_of(dparams), arrays.dh0 = array_of(dh0);
  translate_errors([&] {{ backward_work(place, arrays); }});
  // The parameters' gradient has their shape; a cell without parameters has one unused slot per group.
  return {{du, shape.params > 0 ? dparams.view({{groups, shape.params}}) : at::zeros({{groups, 1}}, u_c.options()), dh0}};
}}

}} // namespace {namespace}

TORCH_LIBRARY({namespace}, m) {{
  m.def("newton(Tensor u, Tensor params, Tensor? h0, float[] config, bool with_residual) "
        "-> (Tensor h, Tensor residual, Tensor stats)");
  m.def("newton_backward(Tensor u, Tensor params, Tensor? h0, Tensor h, Tensor grad_h) "
        "-> (Tensor grad_u, Tensor grad_params, Tensor grad_h0)");
}}

TORCH_LIBRARY_IMPL({namespace}, CPU, m) {{
  m.impl("newton", &{namespace}::newton);
  m.impl("newton_backward", &{namespace}::newton_backward);
}}
{cuda_kernels}"""
    # Two units that compile side by side: a CUDA build compiles the work with nvcc and the PyTorch
    # half with the C++ compiler (PyTorch's headers alone took nvcc about 23 s, g++ 6 s).
    files[f"{namespace}_work{suffix}"] = work
    files[f"{namespace}.cpp"] = operators
    for unit, function, family, space in instances:
        files[f"{namespace}_{unit}{suffix}"] = (
            f"// Generated by paraseq (python/paraseq/_compiled_cell.py): {function} of {namespace} for\n"
            f"// CompiledNewtonModes::{family} on {space}, a unit of its own so that nvcc compiles it beside the others.\n"
            f'#include "{namespace}.hpp"\n\nnamespace {namespace} {{\n{_instance(function, family, space, False)}\n}}\n')
    for unit, scan, tag in kernels:
        files[f"{namespace}_{unit}{suffix}"] = (
            f"// Generated by paraseq (python/paraseq/_compiled_cell.py): the {tag[:-3]} kernel of {namespace}'s\n"
            f"// {scan.replace('_', ' ')} on CUDA, a unit of its own so that nvcc compiles it beside the others.\n"
            f'#include "{namespace}.hpp"\n\n{_scan_kernel(namespace, scan, tag, False)}\n')
    return files


class Extension:
    """A loaded extension: its operators and the size of its groups."""

    def __init__(self, namespace, group_size):
        self.namespace, self.group_size = namespace, group_size
        ops = getattr(torch.ops, namespace)
        self.newton, self.backward = ops.newton.default, ops.newton_backward.default


class Plan:
    """What a call runs: the extension and one trace's prologues and gathers (the same C++ cell may
    come from cells whose prologues differ)."""

    def __init__(self, extension, generated):
        self.extension = extension
        self.input_prologue, self.param_prologue = generated.input_prologue, generated.param_prologue
        self.used_tensors, self.groups = generated.used_tensors, generated.groups
        # Kept on the CPU: each call moves them to its tensors' device (a plan serves every device).
        self.input_index = torch.tensor(generated.input_index, dtype=torch.int64)
        self.param_index = torch.tensor(generated.param_index, dtype=torch.int64)


_extensions: dict = {}  # namespace -> Extension, loaded in this process
_plans: dict = {}  # plan key (choose's result) -> Plan


def _register(ext):
    name = ext.namespace

    @torch.library.register_fake(f"{name}::newton")
    def _newton_fake(u, params, h0, config, with_residual):
        h = u.new_empty((u.shape[0], u.shape[1], params.shape[0] * ext.group_size))
        return h, *_ops.newton_diagnostics_fake(u, with_residual)

    @torch.library.register_fake(f"{name}::newton_backward")
    def _backward_fake(u, params, h0, h, grad_h):
        return (torch.empty_like(u, memory_format=torch.contiguous_format),
                torch.empty_like(params, memory_format=torch.contiguous_format), h.new_empty((h.shape[0], h.shape[2])))

    def setup_context(ctx, inputs, output):
        u, params, h0, _, _ = inputs
        ctx.save_for_backward(u, params, h0, output[0])
        ctx.h0_given = h0 is not None

    def backward(ctx, grad_h, _grad_residual, _grad_stats):
        u, params, h0, h = ctx.saved_tensors
        grad_u, grad_params, grad_h0 = ext.backward(u, params, h0, h, grad_h.contiguous())
        return grad_u, grad_params, grad_h0 if ctx.h0_given else None, None, None

    def refuse(ctx, *grads):
        raise NotImplementedError(_user_cell.SECOND_DERIVATIVE_REFUSED)

    torch.library.register_autograd(f"{name}::newton", backward, setup_context=setup_context)
    torch.library.register_autograd(f"{name}::newton_backward", refuse, setup_context=lambda ctx, inputs, output: None)


# ---- choosing the path -----------------------------------------------------------------------------

@torch._dynamo.assume_constant_result
def choose(token, structure, slots, hidden, input_size, dtype, x_dtype, device_type, autocast, compile,
           cell_name) -> str:
    """The key of the cell's Plan, or "" for the general path (under compile="auto", with a warning
    naming why). Runs at trace time under torch.compile (the result is a constant)."""
    with unset_fake_temporarily():  # under torch.compile the tracer's fake mode is active here
        return _choose(token, structure, slots, hidden, input_size, dtype, x_dtype, device_type, autocast, compile,
                       cell_name)


_chosen = _user_function.TraceMemo()  # (arguments of _choose, trace_key) -> plan key, for eager calls


def _choose(token, structure, slots, hidden, input_size, dtype, x_dtype, device_type, autocast, compile, cell_name):
    # An eager call traces the step again only when something the trace depends on changed (a trace
    # and the row check cost milliseconds, more than many solves).
    memo = _user_function.trace_key(token)
    if memo is not None:
        memo = (structure, slots, hidden, input_size, dtype, x_dtype, device_type, autocast, compile, cell_name, memo)
        chosen = _chosen.get(memo)
        if chosen is not None:
            return chosen
    owner, function = _user_function.split(_user_function.entry(token).callable())
    tensors = [x.detach() for x in _user_function.found_tensors(owner, function)]
    try:
        require_device(device_type, "x")
        if dtype not in SCALAR_TYPES:
            raise Unsupported(f"a state of dtype {dtype} (the compiled path computes float32 and float64 states)")
        if autocast:
            raise Unsupported("autocast (the compiled path computes in the state's dtype; leave autocast off "
                              "around newton_apply)")
        key = _plan(token, tensors, structure, slots, hidden, input_size, dtype, x_dtype, cell_name)
        if memo is not None:
            _chosen.put(memo, key)
        return key
    except Unsupported as error:
        reason = f"does not support {error}"
    except BuildUnavailable as error:
        reason = f"is not available here: {error}"
    if compile is True:
        raise NotImplementedError(f"newton_apply: argument 'compile' is True, but the compiled path {reason}; pass "
                                  "compile='auto' or False for the general path") from None
    warnings.warn(f"newton_apply: compile='auto' takes the general path for this cell: the compiled path {reason}",
                  stacklevel=5)
    return ""


def _plan(token, tensors, structure, slots, hidden, input_size, dtype, x_dtype, cell_name):
    state_shape = (hidden,) if slots == 1 else (slots, hidden)
    graph = _cell_codegen.trace(token, tensors, state_shape, input_size, dtype, x_dtype)
    generated = _cell_codegen.generate(graph, state_shape, structure, dtype, cell_name)
    source = build_settings().source
    missing = [header for header in HEADERS if not (source / header).is_file()]
    if missing:
        raise BuildUnavailable(f"the Newton solver's headers were not found in {source} (no {', '.join(missing)})")
    settings = build_settings()
    namespace, loaded_now = _load("newton_apply", "paraseq_cell", "cells",
                                  lambda name: _extension_sources(name, generated.source, structure, dtype, settings.cuda,
                                                                  settings.suffix, settings.device_scan_kernels))
    if loaded_now:
        _extensions[namespace] = Extension(namespace, generated.group_size)
        _register(_extensions[namespace])
    key = f"{namespace}:{generated.digest}"
    if key not in _plans:
        _check_rows(token, graph, tensors, state_shape, input_size, dtype, x_dtype)
        _plans[key] = Plan(_extensions[namespace], generated)
    return key


def _check_rows(token, graph, tensors, state_shape, input_size, dtype, x_dtype):
    """The trace is of one row: refuses a step that computes a batch of rows otherwise than each
    row alone (one that does not treat leading dimensions as a batch), on random values, on the CPU
    (as the trace: the cell's tensors may live on another device)."""
    tensors = [x.detach().cpu() for x in tensors]
    generator = torch.Generator().manual_seed(0)
    h = torch.rand((2, 3, *state_shape), generator=generator, dtype=torch.float64).to(dtype) - 0.5
    x = torch.rand((2, 3, input_size), generator=generator, dtype=torch.float64).to(x_dtype) - 0.5
    rows = torch.vmap(torch.vmap(graph, in_dims=(0, 0) + (None,) * len(tensors)),
                      in_dims=(0, 0) + (None,) * len(tensors))
    with torch.no_grad():
        try:
            batched = _user_function.call_with(_user_function.entry(token), h, x, tensors)
        except Exception as error:
            batched = error
        alone = rows(h, x, *tensors)
    tolerance = 10 * torch.finfo(dtype).eps ** 0.5
    if not (isinstance(batched, torch.Tensor) and batched.shape == alone.shape and
            torch.allclose(batched, alone, rtol=tolerance, atol=tolerance, equal_nan=True)):
        raise Unsupported(f"a step that computes a batch of rows otherwise than each row alone (traced on one row, "
                          f"h_prev {list(state_shape)} and x [{input_size}]; step must treat leading dimensions as a "
                          "batch)")


def run(key, layout, x, h0, tensors, config, with_residual):
    """(h [B, T, (slots,) H], residual [B] or empty, stats [2] int64 or empty) from the plan's extension."""
    plan = _plans[key]
    B, T = x.shape[:2]
    dtype = h0.dtype if h0 is not None else x.dtype
    used = [tensors[k] for k in plan.used_tensors]
    if plan.input_index.numel() and B * T:
        batched = (0,) + (None,) * len(used)
        values = torch.vmap(plan.input_prologue, in_dims=batched)(x.reshape(B * T, x.shape[2]), *used)
        flat = torch.cat([value.reshape(B * T, -1) for value in values], dim=1)
        u = flat.index_select(1, plan.input_index.to(flat.device)).reshape(B, T, -1)
    else:
        u = x.new_zeros((B, T, plan.input_index.numel()), dtype=dtype)
    if plan.param_index.numel():
        flat = torch.cat([value.reshape(-1) for value in plan.param_prologue(*used)])
        params = flat.index_select(0, plan.param_index.to(flat.device)).reshape(plan.groups, -1)
    else:
        params = x.new_zeros((plan.groups, 1), dtype=dtype)
    state0 = layout.to_scan(h0.unsqueeze(1)).squeeze(1) if h0 is not None else None
    h, residual, stats = plan.extension.newton(u, params, state0, config, with_residual)
    return layout.from_scan(h), residual, stats
