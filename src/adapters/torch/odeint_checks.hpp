#pragma once
// What paraseq::odeint and odeint_backward check besides check_odeint (odeint.hpp) and do after
// the work: the 32-bit ranges of the loops' counters, finite times and settings, and the stored
// type's overflow. Apart from odeint.hpp so that the per-field, per-method translation units,
// which do not use them, do not depend on them.

#include "odeint.hpp"

#include <ATen/ops/isfinite.h>
#include <ATen/ops/nonzero.h>

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

} // namespace paraseq::torch_bridge
