// The autograd kernels of the differentiable paraseq operators (linear_scan, para_gru, para_gru_head, para_lstm,
// para_slstm, odeint), registered in C++ for the Autograd dispatch key. Each forward runs the operator below
// autograd (its CPU or CUDA kernel, or under torch.compile its fake kernel) and each backward calls
// the operators, so torch.compile still sees one opaque node per solve. linear_scan's backward is
// made of differentiable operators, so its gradients of gradients are exact; the Newton backward
// operators (para_gru_backward, para_lstm_backward, para_slstm_backward) have an autograd kernel that
// refuses to be differentiated, so a second derivative of para_gru / para_lstm / para_slstm raises
// instead of being zero, and
// odeint's backward raises the same way when its result is differentiated.
// Sizes are read as SymInts, so a graph compiled with dynamic shapes stays generic. In C++ rather
// than with torch.library.register_autograd, because that Python wrapper cost about 10 us of every
// call (docs/performance.md, per-call overhead).
#include "kernels.hpp"

#include <ATen/TensorOperators.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/einsum.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/mul.h>
#include <ATen/ops/zeros_like.h>
#include <torch/autograd.h>
#include <torch/csrc/autograd/functions/basic_ops.h>
#include <torch/library.h>

#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace paraseq::torch_bridge {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The dispatcher's handle of operator `name`, whose CPU/CUDA kernel is Kernel (kernels.hpp), looked
// up on first use: the schemas are registered by library.cpp's static initialisers.
template <auto& Kernel>
const auto& operator_handle(const char* name) {
  static const auto handle =
      c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<std::remove_reference_t<decltype(Kernel)>>();
  return handle;
}

std::optional<at::Tensor> optional_if(bool given, const at::Tensor& tensor) {
  return given ? std::optional<at::Tensor>(tensor) : std::nullopt;
}

// Whether an argument takes part in differentiation: a tensor that requires grad while grad mode is
// on, or that carries a forward-mode tangent (level 0, as ATen's generated autograd kernels check),
// so that a tangent reaches Function rather than being dropped. Settings never do.
template <class Setting>
bool differentiated(const Setting&) {
  return false;
}
bool differentiated(const at::Tensor& tensor) {
  return tensor.defined() &&
         ((at::GradMode::is_enabled() && tensor.requires_grad()) || tensor._fw_grad(/*level=*/0).defined());
}
bool differentiated(const std::optional<at::Tensor>& tensor) { return tensor && differentiated(*tensor); }

template <class Result>
Result as_result(const at::Tensor& output) {
  return output;
}
template <class Result>
Result as_result(const variable_list& outputs) {
  return [&]<std::size_t... I>(std::index_sequence<I...>) {
    return Result{outputs[I]...};
  }(std::make_index_sequence<std::tuple_size_v<Result>>{});
}

template <class... Tensors>
variable_list as_list(const std::tuple<Tensors...>& outputs) {
  return std::apply([](const auto&... output) { return variable_list{output...}; }, outputs);
}

// Calls `op` below the Autograd key: its CPU or CUDA kernel (or, under torch.compile, its fake one).
template <class Kernel, class... Args>
auto call_below_autograd(const c10::TypedOperatorHandle<Kernel>& op, const Args&... args) {
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  return op.call(args...);
}

// The autograd kernel of an operator: through Function when an argument is differentiated,
// otherwise straight to the kernel below autograd, since building a Function node that nothing
// will use costs several microseconds per call (measured on the H200).
template <class Function, class Kernel, class... Args>
auto run_with_autograd(const c10::TypedOperatorHandle<Kernel>& op, const Args&... args) {
  using Result = decltype(op.call(args...));
  if (!(differentiated(args) || ...)) return call_below_autograd(op, args...);
  return as_result<Result>(Function::apply(args...));
}

// The differentiable operators, each called by its autograd kernel and by its Function's forward.
const auto& linear_scan_op() { return operator_handle<linear_scan>("paraseq::linear_scan"); }
const auto& para_gru_op() { return operator_handle<para_gru>("paraseq::para_gru"); }
const auto& para_lstm_op() { return operator_handle<para_lstm>("paraseq::para_lstm"); }
const auto& para_slstm_op() { return operator_handle<para_slstm>("paraseq::para_slstm"); }
const auto& odeint_op() { return operator_handle<odeint>("paraseq::odeint"); }
const auto& odeint_with_steps_op() { return operator_handle<odeint_with_steps>("paraseq::odeint_with_steps"); }

// ---- linear_scan --------------------------------------------------------------------------------

// [first, x_0, ..., x_{T-2}] along time: the previous state of every step.
at::Tensor shifted(const at::Tensor& x, const at::Tensor& first) {
  return at::cat({first.unsqueeze(1), x.slice_symint(1, 0, x.sym_size(1) - 1)}, 1);
}

// The factors of dA_t = left_t right_t^T shaped so that their broadcast product has the layout of A: its
// diagonal, its k x k blocks (block_size k), or all of it.
std::pair<at::Tensor, at::Tensor> outer_factors(const std::string& structure, const at::Tensor& left,
                                                const at::Tensor& right, const c10::SymInt& block_size) {
  if (structure == "diag") return {left, right};
  if (structure == "dense") return {left.unsqueeze(-1), right.unsqueeze(-2)};
  const c10::SymInt B = left.sym_size(0), T = left.sym_size(1), groups = left.sym_size(2) / block_size;
  const std::vector<c10::SymInt> blocks{B, T, groups, block_size};
  return {left.reshape_symint(blocks).unsqueeze(-1), right.reshape_symint(blocks).unsqueeze(-2)};
}

// A_t^T v for one time step (A_t [B, ...], v [B, N]).
at::Tensor transpose_apply(const std::string& structure, const at::Tensor& A_t, const at::Tensor& v) {
  if (structure == "diag") return A_t * v;
  if (structure == "dense") return at::einsum("bij,bi->bj", {A_t, v});
  const c10::SymInt B = A_t.sym_size(0), groups = A_t.sym_size(1), k = A_t.sym_size(2);
  return at::einsum("bgij,bgi->bgj", {A_t, v.reshape_symint({B, groups, k})}).reshape_symint({B, groups * k});
}

struct LinearScanFunction : torch::autograd::Function<LinearScanFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& A, const at::Tensor& b,
                            const std::optional<at::Tensor>& h0, const std::string& structure, bool reverse) {
    const at::Tensor output = call_below_autograd(linear_scan_op(), A, b, h0, structure, reverse);
    ctx->saved_data["structure"] = structure;
    ctx->saved_data["reverse"] = reverse;
    ctx->saved_data["has_h0"] = h0.has_value();
    ctx->save_for_backward({A, output, h0.value_or(at::Tensor())});
    return output;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &A = saved[0], &output = saved[1], &h0 = saved[2];
    const std::string structure = ctx->saved_data["structure"].toStringRef();
    const bool reverse = ctx->saved_data["reverse"].toBool(), has_h0 = ctx->saved_data["has_h0"].toBool();
    if (output.sym_size(1) == 0) // no steps: nothing depends on A or h0
      return {at::zeros_like(A), at::zeros_like(output), has_h0 ? at::zeros_like(h0) : at::Tensor(), {}, {}};
    // The adjoint of the forward recurrence is the reverse one over the same A, and vice versa.
    const at::Tensor adjoint = linear_scan_op().call(A, grads[0].contiguous(), std::nullopt, structure, !reverse);
    at::Tensor left, previous, first;
    if (reverse) { // lambda_t = A_{t+1}^T lambda_{t+1} + b_t: dA_t = lambda_t adjoint_{t-1}^T, dA_0 = 0
      left = output;
      previous = adjoint;
      first = at::zeros_like(adjoint.select(1, 0));
    } else { // h_t = A_t h_{t-1} + b_t: dA_t = adjoint_t h_{t-1}^T
      left = adjoint;
      previous = output;
      first = has_h0 ? h0 : at::zeros_like(output.select(1, 0));
    }
    const c10::SymInt block_size = A.sym_size(-1);
    at::Tensor dA;
    if (at::GradMode::is_enabled()) { // a graph is recorded (create_graph): differentiable operators only
      const auto [l, r] = outer_factors(structure, left, shifted(previous, first), block_size);
      dA = l * r;
    } else { // the products straight into dA's slices along time, sparing the shifted copy of the states
      const c10::SymInt T = output.sym_size(1);
      dA = at::empty_like(A);
      const auto [later_l, later_r] =
          outer_factors(structure, left.slice_symint(1, 1, T), previous.slice_symint(1, 0, T - 1), block_size);
      at::Tensor later = dA.slice_symint(1, 1, T), start = dA.slice_symint(1, 0, 1);
      at::mul_out(later, later_l, later_r);
      const auto [start_l, start_r] = outer_factors(structure, left.slice_symint(1, 0, 1), first.unsqueeze(1), block_size);
      at::mul_out(start, start_l, start_r);
    }
    const at::Tensor dh0 = has_h0 ? transpose_apply(structure, A.select(1, 0), adjoint.select(1, 0)) : at::Tensor();
    return {dA, adjoint, dh0, {}, {}};
  }
};

at::Tensor linear_scan_autograd(const at::Tensor& A, const at::Tensor& b, const std::optional<at::Tensor>& h0,
                                const std::string& structure, bool reverse) {
  return run_with_autograd<LinearScanFunction>(linear_scan_op(), A, b, h0, structure, reverse);
}

// ---- ParaGRU (diagonal and head-block) / ParaLSTM / ParaSLSTM Newton solves --------------------------------------------
// The packed solver config and with_residual are passed through; the residual and stats outputs
// are diagnostics (max |F| per batch element; iterations and mode), not differentiable.

const auto& para_gru_backward_op() { return operator_handle<para_gru_backward>("paraseq::para_gru_backward"); }
const auto& para_gru_head_op() { return operator_handle<para_gru_head>("paraseq::para_gru_head"); }
const auto& para_gru_head_backward_op() {
  return operator_handle<para_gru_head_backward>("paraseq::para_gru_head_backward");
}

// The two GRU operator pairs (diagonal, head-block) share their schemas, so their Functions differ
// only in the operators they call.
struct DiagonalGru {
  static constexpr const char* name = "para_gru";
  static const auto& forward_op() { return para_gru_op(); }
  static const auto& backward_op() { return para_gru_backward_op(); }
};
struct HeadGru {
  static constexpr const char* name = "para_gru_head";
  static const auto& forward_op() { return para_gru_head_op(); }
  static const auto& backward_op() { return para_gru_head_backward_op(); }
};
const auto& para_lstm_backward_op() { return operator_handle<para_lstm_backward>("paraseq::para_lstm_backward"); }
const auto& para_slstm_backward_op() { return operator_handle<para_slstm_backward>("paraseq::para_slstm_backward"); }

// The adjoint solve has no derivative of its own (its backward would need the cells' second
// derivatives), so differentiating it raises rather than contributing zeros.
[[noreturn]] void refuse_second_derivative(const char* op) {
  TORCH_CHECK_NOT_IMPLEMENTED(false, "paraseq::", op, "_backward is not differentiable: second derivatives of paraseq::",
                              op, " (newton_apply, ParaGRU, ParaLSTM, ParaSLSTM) are not implemented. First derivatives, "
                              "also with create_graph=True, are exact; differentiate a sequential() loop for a "
                              "Hessian or a gradient penalty");
}

template <class Gru>
struct ParaGruBackwardFunction : torch::autograd::Function<ParaGruBackwardFunction<Gru>> {
  static variable_list forward(AutogradContext*, const at::Tensor& u, const at::Tensor& a,
                               const std::optional<at::Tensor>& h0, const at::Tensor& h, const at::Tensor& grad_h) {
    return as_list(call_below_autograd(Gru::backward_op(), u, a, h0, h, grad_h));
  }
  static variable_list backward(AutogradContext*, variable_list) { refuse_second_derivative(Gru::name); }
};

template <class Gru>
std::tuple<at::Tensor, at::Tensor, at::Tensor> para_gru_backward_autograd(const at::Tensor& u, const at::Tensor& a,
                                                                          const std::optional<at::Tensor>& h0,
                                                                          const at::Tensor& h, const at::Tensor& grad_h) {
  return run_with_autograd<ParaGruBackwardFunction<Gru>>(Gru::backward_op(), u, a, h0, h, grad_h);
}

struct ParaLstmBackwardFunction : torch::autograd::Function<ParaLstmBackwardFunction> {
  static variable_list forward(AutogradContext*, const at::Tensor& u, const at::Tensor& a, const at::Tensor& p,
                               const std::optional<at::Tensor>& state0, const at::Tensor& state,
                               const at::Tensor& grad_state) {
    return as_list(call_below_autograd(para_lstm_backward_op(), u, a, p, state0, state, grad_state));
  }
  static variable_list backward(AutogradContext*, variable_list) { refuse_second_derivative("para_lstm"); }
};

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>
para_lstm_backward_autograd(const at::Tensor& u, const at::Tensor& a, const at::Tensor& p,
                            const std::optional<at::Tensor>& state0, const at::Tensor& state,
                            const at::Tensor& grad_state) {
  return run_with_autograd<ParaLstmBackwardFunction>(para_lstm_backward_op(), u, a, p, state0, state, grad_state);
}

struct ParaSlstmBackwardFunction : torch::autograd::Function<ParaSlstmBackwardFunction> {
  static variable_list forward(AutogradContext*, const at::Tensor& u, const at::Tensor& r,
                               const std::optional<at::Tensor>& state0, const at::Tensor& state,
                               const at::Tensor& grad_state, double eps) {
    return as_list(call_below_autograd(para_slstm_backward_op(), u, r, state0, state, grad_state, eps));
  }
  static variable_list backward(AutogradContext*, variable_list) { refuse_second_derivative("para_slstm"); }
};

std::tuple<at::Tensor, at::Tensor, at::Tensor> para_slstm_backward_autograd(const at::Tensor& u, const at::Tensor& r,
                                                                            const std::optional<at::Tensor>& state0,
                                                                            const at::Tensor& state,
                                                                            const at::Tensor& grad_state, double eps) {
  return run_with_autograd<ParaSlstmBackwardFunction>(para_slstm_backward_op(), u, r, state0, state, grad_state, eps);
}

template <class Gru>
struct ParaGruFunction : torch::autograd::Function<ParaGruFunction<Gru>> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& u, const at::Tensor& a,
                               const std::optional<at::Tensor>& h0, c10::ArrayRef<double> config, bool with_residual) {
    const auto [h, residual, stats] = call_below_autograd(Gru::forward_op(), u, a, h0, config, with_residual);
    ctx->saved_data["has_h0"] = h0.has_value();
    ctx->save_for_backward({u, a, h0.value_or(at::Tensor()), h});
    ctx->mark_non_differentiable({residual, stats});
    return {h, residual, stats};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const bool has_h0 = ctx->saved_data["has_h0"].toBool();
    auto [du, da, dh0] = Gru::backward_op().call(saved[0], saved[1], optional_if(has_h0, saved[2]), saved[3], grads[0].contiguous());
    return {du, da, has_h0 ? dh0 : at::Tensor(), {}, {}};
  }
};

template <class Gru>
std::tuple<at::Tensor, at::Tensor, at::Tensor> para_gru_autograd(const at::Tensor& u, const at::Tensor& a,
                                                                 const std::optional<at::Tensor>& h0,
                                                                 c10::ArrayRef<double> config, bool with_residual) {
  return run_with_autograd<ParaGruFunction<Gru>>(Gru::forward_op(), u, a, h0, config, with_residual);
}

struct ParaLstmFunction : torch::autograd::Function<ParaLstmFunction> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& u, const at::Tensor& a, const at::Tensor& p,
                               const std::optional<at::Tensor>& state0, c10::ArrayRef<double> config,
                               bool with_residual) {
    const auto [state, residual, stats] = call_below_autograd(para_lstm_op(), u, a, p, state0, config, with_residual);
    ctx->saved_data["has_state0"] = state0.has_value();
    ctx->save_for_backward({u, a, p, state0.value_or(at::Tensor()), state});
    ctx->mark_non_differentiable({residual, stats});
    return {state, residual, stats};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const bool has_state0 = ctx->saved_data["has_state0"].toBool();
    auto [du, da, dp, dstate0] = para_lstm_backward_op().call(saved[0], saved[1], saved[2], optional_if(has_state0, saved[3]),
                                                              saved[4], grads[0].contiguous());
    return {du, da, dp, has_state0 ? dstate0 : at::Tensor(), {}, {}};
  }
};

std::tuple<at::Tensor, at::Tensor, at::Tensor> para_lstm_autograd(const at::Tensor& u, const at::Tensor& a,
                                                                  const at::Tensor& p,
                                                                  const std::optional<at::Tensor>& state0,
                                                                  c10::ArrayRef<double> config, bool with_residual) {
  return run_with_autograd<ParaLstmFunction>(para_lstm_op(), u, a, p, state0, config, with_residual);
}

struct ParaSlstmFunction : torch::autograd::Function<ParaSlstmFunction> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& u, const at::Tensor& r,
                               const std::optional<at::Tensor>& state0, double eps, c10::ArrayRef<double> config,
                               bool with_residual) {
    const auto [state, residual, stats] = call_below_autograd(para_slstm_op(), u, r, state0, eps, config, with_residual);
    ctx->saved_data["has_state0"] = state0.has_value();
    ctx->saved_data["eps"] = eps;
    ctx->save_for_backward({u, r, state0.value_or(at::Tensor()), state});
    ctx->mark_non_differentiable({residual, stats});
    return {state, residual, stats};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const bool has_state0 = ctx->saved_data["has_state0"].toBool();
    auto [du, dr, dstate0] = para_slstm_backward_op().call(saved[0], saved[1], optional_if(has_state0, saved[2]), saved[3],
                                                           grads[0].contiguous(), ctx->saved_data["eps"].toDouble());
    return {du, dr, has_state0 ? dstate0 : at::Tensor(), {}, {}, {}};
  }
};

std::tuple<at::Tensor, at::Tensor, at::Tensor> para_slstm_autograd(const at::Tensor& u, const at::Tensor& r,
                                                                   const std::optional<at::Tensor>& state0, double eps,
                                                                   c10::ArrayRef<double> config, bool with_residual) {
  return run_with_autograd<ParaSlstmFunction>(para_slstm_op(), u, r, state0, eps, config, with_residual);
}

// ---- odeint -------------------------------------------------------------------------------------
// Gradients flow to y0, params and shared; the observation times t get none (paraseq.odeint refuses
// a t that requires grad). The forward runs odeint_with_steps and keeps each trajectory's accepted
// steps for odeint_backward, which then does not count adaptive steps again (one forward loop
// fewer). odeint_backward has no derivative of its own: while the graph of the
// gradient is built (create_graph=True), the gradients get an Error node whose edges lead to what
// they depend on (the saved inputs and the incoming gradient), so that differentiating them again
// raises instead of giving silently zero second derivatives.

// Autograd nodes are held by std::shared_ptr up to some LibTorch version and by c10::intrusive_ptr
// after it: make one the way this LibTorch's edges hold it.
template <class Node, class... Arguments>
auto make_node(Arguments&&... arguments) {
  using pointer = decltype(torch::autograd::Edge{}.function);
  if constexpr (std::is_same_v<pointer, std::shared_ptr<torch::autograd::Node>>)
    return std::make_shared<Node>(std::forward<Arguments>(arguments)...);
  else return c10::make_intrusive<Node>(std::forward<Arguments>(arguments)...);
}

variable_list once_differentiable(variable_list gradients, const variable_list& depends_on) {
  if (!at::GradMode::is_enabled() || !torch::autograd::any_variable_requires_grad(depends_on)) return gradients;
  const auto error = make_node<torch::autograd::Error>(
      "paraseq.odeint does not support double backward (a derivative of its gradient, such as a Hessian): its "
      "backward, paraseq::odeint_backward, is not differentiable",
      torch::autograd::collect_next_edges(depends_on));
  for (auto& gradient : gradients)
    if (gradient.defined()) {
      gradient = gradient.detach();
      torch::autograd::create_gradient_edge(gradient, error);
    }
  return gradients;
}

struct OdeintFunction : torch::autograd::Function<OdeintFunction> {
  static at::Tensor forward(AutogradContext* ctx, const std::string& field, const at::Tensor& y0, const at::Tensor& t,
                            const std::optional<at::Tensor>& params, const std::optional<at::Tensor>& shared,
                            int64_t mlp_hidden, const std::string& method, std::optional<double> step_size,
                            double rtol, double atol, int64_t max_steps) {
    const auto [observed, accepted] = call_below_autograd(odeint_with_steps_op(), field, y0, t, params, shared,
                                                          mlp_hidden, method, step_size, rtol, atol, max_steps);
    auto& data = ctx->saved_data;
    data["field"] = field, data["mlp_hidden"] = mlp_hidden, data["method"] = method, data["step_size"] = step_size;
    data["rtol"] = rtol, data["atol"] = atol, data["max_steps"] = max_steps;
    data["has_params"] = params.has_value(), data["has_shared"] = shared.has_value();
    ctx->save_for_backward({y0, t, params.value_or(at::Tensor()), shared.value_or(at::Tensor()), accepted});
    return observed;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto& op = operator_handle<odeint_backward>("paraseq::odeint_backward");
    const auto saved = ctx->get_saved_variables();
    auto& data = ctx->saved_data;
    const bool has_params = data["has_params"].toBool(), has_shared = data["has_shared"].toBool();
    auto [grad_y0, grad_params, grad_shared] =
        op.call(data["field"].toStringRef(), saved[0], saved[1], optional_if(has_params, saved[2]),
                optional_if(has_shared, saved[3]), data["mlp_hidden"].toInt(), data["method"].toStringRef(),
                data["step_size"].toOptional<double>(), data["rtol"].toDouble(), data["atol"].toDouble(),
                data["max_steps"].toInt(), grads[0].contiguous(), saved[4]);
    const variable_list differentiable =
        once_differentiable({grad_y0, has_params ? grad_params : at::Tensor(), has_shared ? grad_shared : at::Tensor()},
                            {saved[0], saved[2], saved[3], grads[0]});
    variable_list result(11);
    result[1] = differentiable[0], result[3] = differentiable[1], result[4] = differentiable[2];
    return result;
  }
};

at::Tensor odeint_autograd(const std::string& field, const at::Tensor& y0, const at::Tensor& t,
                           const std::optional<at::Tensor>& params, const std::optional<at::Tensor>& shared,
                           int64_t mlp_hidden, const std::string& method, std::optional<double> step_size, double rtol,
                           double atol, int64_t max_steps) {
  return run_with_autograd<OdeintFunction>(odeint_op(), field, y0, t, params, shared, mlp_hidden, method, step_size,
                                           rtol, atol, max_steps);
}

} // namespace
} // namespace paraseq::torch_bridge

TORCH_LIBRARY_IMPL(paraseq, Autograd, m) {
  using namespace paraseq::torch_bridge;
  m.impl("linear_scan", &linear_scan_autograd);
  m.impl("para_gru", &para_gru_autograd<DiagonalGru>);
  m.impl("para_gru_backward", &para_gru_backward_autograd<DiagonalGru>);
  m.impl("para_gru_head", &para_gru_autograd<HeadGru>);
  m.impl("para_gru_head_backward", &para_gru_backward_autograd<HeadGru>);
  m.impl("para_lstm", &para_lstm_autograd);
  m.impl("para_lstm_backward", &para_lstm_backward_autograd);
  m.impl("para_slstm", &para_slstm_autograd);
  m.impl("para_slstm_backward", &para_slstm_backward_autograd);
  m.impl("odeint", &odeint_autograd);
}
