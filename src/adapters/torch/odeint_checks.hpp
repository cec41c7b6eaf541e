#pragma once
// What paraseq::odeint and odeint_backward check besides check_odeint (odeint.hpp) and do after
// the work: the 32-bit ranges of the loops' counters, finite times and settings, and the stored
// type's overflow. Apart from odeint.hpp so that the per-field, per-method translation units,
// which do not use them, do not depend on them.

#include "odeint.hpp"

#include <ATen/ops/isfinite.h>
#include <ATen/ops/nonzero.h>
#include <ATen/ops/zeros.h>

#include <climits>
#include <cmath>

namespace paraseq::torch_bridge {

// Checks the arguments; returns the observation times on the host. The loops count trajectories,
// times and steps in int: larger values are refused rather than truncated.
inline std::vector<double> check_odeint_arguments(const char* op, const OdeintArgs& args) {
  check_tensor(op, "y0", args.y0, 2, args.y0);
  TORCH_CHECK_VALUE(args.y0.size(0) <= INT_MAX, op, ": argument 'y0' has shape ", args.y0.sizes(),
                    ", expected at most 2^31 - 1 trajectories");
  TORCH_CHECK_VALUE(args.t.numel() <= INT_MAX, op, ": argument 't' has shape ", args.t.sizes(),
                    ", expected at most 2^31 - 1 times");
  if (args.field == "mlp") {
    TORCH_CHECK_VALUE(args.mlp_hidden >= 1 && args.mlp_hidden <= ode::Mlp::max_hidden, op, ": argument 'mlp_hidden' is ",
                      args.mlp_hidden, ", expected 1 to ", ode::Mlp::max_hidden, " (the MLP's hidden units)");
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
  const std::vector<double> times = check_odeint(op, args);
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

// paraseq::odeint (and each generated extension's odeint) around its work: checks, the prepared
// tensors, integrate(times, tensors) filling tensors.observed [N, len(t), n] (and, given `accepted`,
// each trajectory's accepted steps into a new int32 [N] tensor there), the stored result.
template <class Integrate>
at::Tensor run_odeint(const char* op, const OdeintArgs& args, const Integrate& integrate, at::Tensor* accepted = nullptr) {
  const std::vector<double> times = check_odeint_arguments(op, args);
  OdeintTensors tensors;
  tensors.y0 = prepared(args.y0), tensors.params = prepared_or_undefined(args.params),
  tensors.shared = prepared_or_undefined(args.shared);
  tensors.observed = at::empty({args.y0.size(0), long(times.size()), args.y0.size(1)}, tensors.y0.options());
  if (accepted) tensors.accepted = *accepted = at::empty({args.y0.size(0)}, tensors.y0.options().dtype(at::kInt));
  integrate(times, tensors);
  const at::Tensor observed = tensors.observed.to(args.y0.scalar_type());
  require_finite_when_stored(op, "the state", observed);
  return observed;
}

// paraseq::odeint_backward (and each generated extension's) around its work: integrate_adjoint(
// times, tensors) fills tensors.grad_y0, grad_params and grad_shared from tensors.grad_y (and the
// forward's accepted steps, where given: adaptive steps are then not counted again).
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
  OdeintTensors tensors;
  tensors.y0 = prepared(args.y0), tensors.params = prepared_or_undefined(args.params),
  tensors.shared = prepared_or_undefined(args.shared);
  tensors.grad_y = prepared(grad_y);
  if (accepted) tensors.accepted = accepted->contiguous();
  tensors.grad_y0 = at::empty(args.y0.sizes(), tensors.y0.options());
  // Gradients of absent parameters are empty tensors.
  tensors.grad_params = at::zeros(args.params ? args.params->sizes() : c10::IntArrayRef{0}, tensors.y0.options());
  tensors.grad_shared = at::zeros(args.shared ? args.shared->sizes() : c10::IntArrayRef{0}, tensors.y0.options());
  integrate_adjoint(times, tensors);
  const auto stored = args.y0.scalar_type();
  const at::Tensor grad_y0 = tensors.grad_y0.to(stored), grad_params = tensors.grad_params.to(stored),
                   grad_shared = tensors.grad_shared.to(stored);
  require_finite_when_stored(op, "the gradient grad_y0", grad_y0);
  require_finite_when_stored(op, "the gradient grad_params", grad_params);
  require_finite_when_stored(op, "the gradient grad_shared", grad_shared.unsqueeze(0));
  return {grad_y0, grad_params, grad_shared};
}

} // namespace paraseq::torch_bridge
