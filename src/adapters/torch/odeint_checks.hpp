#pragma once
// paraseq::odeint and odeint_backward, the PyTorch half (work.hpp; the work: odeint_integrate.hpp):
// the arguments and their checks (the 32-bit ranges of the loops' counters, finite and increasing
// times, the settings), the prepared tensors and outputs around the work, and the stored type's
// overflow after it. Shared by odeint_forward.cpp, odeint_backward.cpp and the extensions generated
// for a function of your own (python/paraseq/_compiled_odeint.py).

#include "tensors.hpp"

#include <ATen/ops/empty.h>
#include <ATen/ops/isfinite.h>
#include <ATen/ops/nonzero.h>
#include <ATen/ops/zeros.h>

#include <climits>
#include <cmath>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

namespace paraseq::torch_bridge {

struct OdeintArgs {
  std::string field;
  at::Tensor y0, t;
  std::optional<at::Tensor> params, shared;
  int64_t mlp_hidden;
  std::string method;
  std::optional<double> step_size;
  double rtol, atol;
  int64_t max_steps;
};

// Calls f(std::integral_constant<int, i>{}) for the i with names[i] == value; otherwise raises a
// ValueError that names the argument and the accepted values.
template <int Count, int Index = 0, class F>
void with_name_index(const char* op, const char* argument, const char* const (&names)[Count], const std::string& value,
                     const F& f) {
  if constexpr (Index == Count) {
    std::string expected;
    for (int k = 0; k < Count; ++k)
      expected += std::string(k == 0 ? "" : k + 1 == Count ? " or " : ", ") + "\"" + names[k] + "\"";
    TORCH_CHECK_VALUE(false, op, ": argument '", argument, "' is \"", value, "\", expected ", expected);
  } else if (value == names[Index]) {
    f(std::integral_constant<int, Index>{});
  } else {
    with_name_index<Count, Index + 1>(op, argument, names, value, f);
  }
}

// Checks the arguments; returns the observation times on the host. The loops count trajectories,
// times and steps in int: larger values are refused rather than truncated.
inline std::vector<double> check_odeint_arguments(const char* op, const OdeintArgs& args) {
  check_tensor(op, "y0", args.y0, 2, args.y0);
  TORCH_CHECK_VALUE(args.y0.size(0) <= INT_MAX, op, ": argument 'y0' has shape ", args.y0.sizes(),
                    ", expected at most 2^31 - 1 trajectories");
  TORCH_CHECK_VALUE(args.t.numel() <= INT_MAX, op, ": argument 't' has shape ", args.t.sizes(),
                    ", expected at most 2^31 - 1 times");
  if (args.field == "mlp") {
    TORCH_CHECK_VALUE(args.mlp_hidden >= 1 && args.mlp_hidden <= odeint_mlp_max_hidden, op, ": argument 'mlp_hidden' is ",
                      args.mlp_hidden, ", expected 1 to ", odeint_mlp_max_hidden, " (the MLP's hidden units)");
  } else {
    TORCH_CHECK_VALUE(args.mlp_hidden == 0, op, ": argument 'mlp_hidden' is ", args.mlp_hidden,
                      ", expected 0 (field \"", args.field, "\" has no hidden layer)");
  }
  TORCH_CHECK_VALUE(args.max_steps >= 1 && args.max_steps <= INT_MAX, op, ": argument 'max_steps' is ", args.max_steps,
                    ", expected 1 to 2^31 - 1");
  TORCH_CHECK_VALUE(std::isfinite(args.rtol) && args.rtol >= 0, op, ": argument 'rtol' is ", args.rtol,
                    ", expected a finite value >= 0");
  TORCH_CHECK_VALUE(std::isfinite(args.atol) && args.atol >= 0, op, ": argument 'atol' is ", args.atol,
                    ", expected a finite value >= 0");
  if (args.step_size)
    TORCH_CHECK_VALUE(std::isfinite(*args.step_size) && *args.step_size > 0, op, ": argument 'step_size' is ",
                      *args.step_size, ", expected a finite value > 0");
  TORCH_CHECK_VALUE(args.t.dim() == 1 && args.t.numel() >= 1, op, ": argument 't' has shape ", args.t.sizes(),
                    ", expected a 1-D tensor of at least one time");
  TORCH_CHECK_TYPE(args.t.is_floating_point(), op, ": argument 't' has dtype ", args.t.scalar_type(),
                   ", expected a floating type");
  if (args.params) check_tensor(op, "params", *args.params, 2, args.y0);
  if (args.shared) check_tensor(op, "shared", *args.shared, 1, args.y0);
  const std::vector<double> times = host_values(args.t);
  for (std::size_t k = 1; k < times.size(); ++k)
    TORCH_CHECK_VALUE(times[k] > times[k - 1], op, ": argument 't' has t[", k, "] = ", times[k], " after t[", k - 1,
                      "] = ", times[k - 1], ", expected strictly increasing times");
  for (std::size_t k = 0; k < times.size(); ++k)
    TORCH_CHECK_VALUE(std::isfinite(times[k]), op, ": argument 't' has t[", k, "] = ", times[k], ", expected finite times");
  if (args.step_size) {
    const double steps = std::ceil((times.back() - times.front()) / *args.step_size);
    TORCH_CHECK_VALUE(steps <= INT_MAX, op, ": argument 'step_size' is ", *args.step_size, ", which takes ", steps,
                      " steps from t[0] = ", times.front(), " to t[-1] = ", times.back(),
                      ", expected at most 2^31 - 1 steps (a larger step_size)");
  }
  return times;
}

// Half and bfloat16 results are computed in float and then stored: a float value that overflows
// the stored type becomes inf, which the loops' check of the float state cannot see. Reported as a
// failed trajectory with the non_finite status, as the loops report one. `stored` is [N, ...]
// (grad_shared: [1, Q], one row for all trajectories).
inline void require_finite_when_stored(const char* op, const char* what, const at::Tensor& stored) {
  if (compute_dtype(stored.scalar_type()) == stored.scalar_type() || stored.numel() == 0) return;
  const at::Tensor failed = at::nonzero(at::isfinite(stored).logical_not().reshape({stored.size(0), -1}).any(1));
  TORCH_CHECK(failed.size(0) == 0, op, ": ", failed.size(0), " of ", stored.size(0),
              " trajectories failed; the first, trajectory ", failed[0][0].item<long>(),
              ", stopped with status non_finite (", what, " overflowed ", stored.scalar_type(),
              " when stored; compute in float32 or float64)");
}

// The settings of the work (checked by check_odeint_arguments).
inline OdeintSettings settings_of(const OdeintArgs& args) {
  return {args.mlp_hidden, args.step_size, args.rtol, args.atol, args.max_steps};
}

inline at::Tensor prepared_or_undefined(const std::optional<at::Tensor>& tensor) {
  return tensor ? prepared(*tensor) : at::Tensor();
}

// paraseq::odeint (and each generated extension's odeint) around its work: checks, the prepared
// tensors, integrate(place, settings, times, arrays) filling arrays.observed [N, len(t), n] (and,
// given `accepted`, each trajectory's accepted steps into a new int32 [N] tensor there) with errors
// translated, the stored result.
template <class Integrate>
at::Tensor run_odeint(const char* op, const OdeintArgs& args, const Integrate& integrate, at::Tensor* accepted = nullptr) {
  const std::vector<double> times = check_odeint_arguments(op, args);
  const Place place = place_of(op, args.y0);
  const at::Tensor y0 = prepared(args.y0), params = prepared_or_undefined(args.params),
                   shared = prepared_or_undefined(args.shared);
  const at::Tensor observed = at::empty({args.y0.size(0), long(times.size()), args.y0.size(1)}, y0.options());
  if (accepted) *accepted = at::empty({args.y0.size(0)}, y0.options().dtype(at::kInt));
  OdeintArrays arrays;
  arrays.y0 = array_of(y0), arrays.params = array_of(params), arrays.shared = array_of(shared);
  arrays.observed = array_of(observed);
  if (accepted) arrays.accepted = array_of(*accepted);
  arrays.allocate = scratch_allocator(y0);
  translate_errors([&] { integrate(place, settings_of(args), times, arrays); });
  const at::Tensor stored = observed.to(args.y0.scalar_type());
  require_finite_when_stored(op, "the state", stored);
  return stored;
}

// paraseq::odeint_backward (and each generated extension's) around its work: integrate_adjoint(
// place, settings, times, arrays) fills arrays.grad_y0, grad_params and grad_shared from
// arrays.grad_y (and the forward's accepted steps, where given: adaptive steps are then not
// counted again).
template <class IntegrateAdjoint>
std::tuple<at::Tensor, at::Tensor, at::Tensor>
run_odeint_backward(const char* op, const OdeintArgs& args, const at::Tensor& grad_y,
                    const IntegrateAdjoint& integrate_adjoint, const std::optional<at::Tensor>& accepted = std::nullopt) {
  const std::vector<double> times = check_odeint_arguments(op, args);
  check_tensor(op, "grad_y", grad_y, 3, args.y0);
  if (accepted) {
    TORCH_CHECK_VALUE(accepted->scalar_type() == at::kInt && accepted->dim() == 1 &&
                          accepted->size(0) == args.y0.size(0) && accepted->device() == args.y0.device(),
                      op, ": argument 'accepted' is a ", accepted->scalar_type(), " tensor of shape ", accepted->sizes(),
                      " on ", accepted->device(), ", expected int32 [", args.y0.size(0), "] on ", args.y0.device(),
                      " (the accepted steps that odeint_with_steps returned)");
  }
  const Place place = place_of(op, args.y0);
  const at::Tensor y0 = prepared(args.y0), params = prepared_or_undefined(args.params),
                   shared = prepared_or_undefined(args.shared);
  const at::Tensor grad_y_c = prepared(grad_y), accepted_c = accepted ? accepted->contiguous() : at::Tensor();
  const at::Tensor grad_y0 = at::empty(args.y0.sizes(), y0.options());
  // Gradients of absent parameters are empty tensors.
  const at::Tensor grad_params = at::zeros(args.params ? args.params->sizes() : c10::IntArrayRef{0}, y0.options());
  const at::Tensor grad_shared = at::zeros(args.shared ? args.shared->sizes() : c10::IntArrayRef{0}, y0.options());
  OdeintArrays arrays;
  arrays.y0 = array_of(y0), arrays.params = array_of(params), arrays.shared = array_of(shared);
  arrays.grad_y = array_of(grad_y_c), arrays.accepted = array_of(accepted_c);
  arrays.grad_y0 = array_of(grad_y0), arrays.grad_params = array_of(grad_params), arrays.grad_shared = array_of(grad_shared);
  arrays.allocate = scratch_allocator(y0);
  translate_errors([&] { integrate_adjoint(place, settings_of(args), times, arrays); });
  const auto stored = args.y0.scalar_type();
  const at::Tensor grad_y0_stored = grad_y0.to(stored), grad_params_stored = grad_params.to(stored),
                   grad_shared_stored = grad_shared.to(stored);
  require_finite_when_stored(op, "the gradient grad_y0", grad_y0_stored);
  require_finite_when_stored(op, "the gradient grad_params", grad_params_stored);
  require_finite_when_stored(op, "the gradient grad_shared", grad_shared_stored.unsqueeze(0));
  return {grad_y0_stored, grad_params_stored, grad_shared_stored};
}

} // namespace paraseq::torch_bridge
