#pragma once
// paraseq::odeint and odeint_backward: the built-in fields (loops/fields.hpp) integrated by
// ode::solve and ode::solve_with_gradient (loops/integrate.hpp). The two operators live in two
// translation units (odeint_forward.cpp, odeint_backward.cpp) that share this dispatch; each one
// instantiates every field x method x float type once.

#include "runtime.hpp"

#include <paraseq/loops/fields.hpp>
#include <paraseq/loops/integrate.hpp>
#include <paraseq/loops/tableaus.hpp>

#include <ATen/ops/empty.h>

#include <optional>
#include <string>
#include <type_traits>

namespace paraseq::torch_bridge {

// Where a field's parameters live: a row of params [N, P] per trajectory, or shared [Q].
template <class Field>
inline constexpr bool has_shared_parameters =
    std::is_same_v<Field, ode::Mlp> || std::is_same_v<Field, ode::Linear<ode::Sharing::shared, ode::Sharing::shared>>;

// Calls f(field) for the built-in field `name` with state size n.
template <class F>
void with_field(const char* op, const std::string& name, int n, int mlp_hidden, const F& f) {
  using ode::Sharing;
  if (name == "damped_oscillator") return f(ode::DampedOscillator{});
  if (name == "lotka_volterra") return f(ode::LotkaVolterra{});
  if (name == "sir") return f(ode::SIR{});
  if (name == "linear_shared") return f(ode::Linear<Sharing::shared, Sharing::shared>{n});
  if (name == "linear_own") return f(ode::Linear<Sharing::own, Sharing::own>{n});
  if (name == "mlp") return f(ode::Mlp{n, mlp_hidden});
  TORCH_CHECK_VALUE(false, op, ": argument 'field' is \"", name, "\", expected \"damped_oscillator\", ",
                    "\"lotka_volterra\", \"sir\", \"linear_shared\", \"linear_own\" or \"mlp\"");
}

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

// Calls f(method, steps): fixed steps of step_size (landing on every t), fixed steps on the grid t
// (euler, rk4 without step_size) or adaptive steps (heun, dopri5 without step_size).
template <class F>
void with_stepping(const char* op, const OdeintArgs& args, const std::vector<double>& times, const F& f) {
  const bool known = args.method == "euler" || args.method == "heun" || args.method == "rk4" || args.method == "dopri5";
  TORCH_CHECK_VALUE(known, op, ": argument 'method' is \"", args.method,
                    "\", expected \"euler\", \"heun\", \"rk4\" or \"dopri5\"");
  const bool fixed_only = args.method == "euler" || args.method == "rk4";
  auto call = [&](auto method) {
    if (args.step_size) {
      TORCH_CHECK_VALUE(*args.step_size > 0, op, ": argument 'step_size' is ", *args.step_size, ", expected a value > 0");
      f(method, ode::FixedSteps::until(times.front(), times.back(), *args.step_size).observe_at(times));
    } else if (fixed_only) {
      f(method, ode::FixedSteps::on_grid(times).observe_at(times));
    } else if constexpr (ode::is_adaptive_method_v<decltype(method)>) {
      ode::AdaptiveSteps steps;
      steps.t0 = times.front();
      steps.t_end = times.back();
      steps.rtol = args.rtol;
      steps.atol = args.atol;
      steps.max_steps = int(args.max_steps);
      f(method, steps.observe_at(times));
    }
  };
  if (args.method == "euler") call(ode::Euler{});
  else if (args.method == "heun") call(ode::Heun{});
  else if (args.method == "rk4") call(ode::RK4{});
  else call(ode::DormandPrince5{});
}

// Checks the arguments; returns the observation times on the host.
inline std::vector<double> check_odeint(const char* op, const OdeintArgs& args) {
  check_tensor(op, "y0", args.y0, 2, args.y0);
  TORCH_CHECK_VALUE(args.t.dim() == 1 && args.t.numel() >= 1, op, ": argument 't' has shape ", args.t.sizes(),
                    ", expected a 1-D tensor of at least one time");
  TORCH_CHECK_TYPE(args.t.is_floating_point(), op, ": argument 't' has dtype ", args.t.scalar_type(),
                   ", expected a floating type");
  if (args.params) check_tensor(op, "params", *args.params, 2, args.y0);
  if (args.shared) check_tensor(op, "shared", *args.shared, 1, args.y0);
  std::vector<double> times = host_values(args.t);
  for (std::size_t k = 1; k < times.size(); ++k)
    TORCH_CHECK_VALUE(times[k] > times[k - 1], op, ": argument 't' has t[", k, "] = ", times[k], " after t[", k - 1,
                      "] = ", times[k - 1], ", expected strictly increasing times");
  return times;
}

// Calls f(space, method, steps, problem) with the problem's Views over the prepared tensors.
template <class T, class F>
void with_problem(const char* op, const OdeintArgs& args, const std::vector<double>& times, const at::Tensor& y0,
                  const at::Tensor& params, const at::Tensor& shared, const F& f) {
  with_space(op, args.y0, [&](const auto& space) {
    using Space = std::decay_t<decltype(space)>;
    with_field(op, args.field, int(args.y0.size(1)), int(args.mlp_hidden), [&](const auto& field) {
      using Field = std::decay_t<decltype(field)>;
      const auto y0_view = as_view<const T, 2, Space>(y0);
      with_stepping(op, args, times, [&](auto method, const auto& steps) {
        if constexpr (has_shared_parameters<Field>) {
          TORCH_CHECK_VALUE(shared.defined(), op, ": argument 'shared' is None, expected the field's shared parameters");
          f(space, method, steps, ode::problem(field, y0_view, ode::NoView{}, as_view<const T, 1, Space>(shared)));
        } else {
          TORCH_CHECK_VALUE(params.defined(), op, ": argument 'params' is None, expected the field's [N, P] parameters");
          f(space, method, steps, ode::problem(field, y0_view, as_view<const T, 2, Space>(params)));
        }
      });
    });
  });
}

inline at::Tensor prepared_or_undefined(const std::optional<at::Tensor>& tensor) {
  return tensor ? prepared(*tensor) : at::Tensor();
}

} // namespace paraseq::torch_bridge
