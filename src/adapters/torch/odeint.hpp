#pragma once
// paraseq::odeint and odeint_backward: the built-in fields (loops/fields.hpp) integrated by
// ode::solve and ode::solve_with_gradient (loops/integrate.hpp). The operators (odeint_forward.cpp,
// odeint_backward.cpp) check their arguments and pick the field and method; the work for one
// field and method, every float type x space, is `integrate` or `integrate_adjoint` of
// odeint_integrate.hpp, instantiated in translation units that CMake generates (three fields per
// unit and direction, or without the compiled instances, whose loops it then compiles, one per
// field, method and direction), so that a parallel build compiles them side by side.

#include "runtime.hpp"

#include <paraseq/loops/fields.hpp>
#include <paraseq/loops/tableaus.hpp>

#include <ATen/ops/empty.h>

#include <optional>
#include <string>
#include <tuple>
#include <type_traits>

namespace paraseq::torch_bridge {

// Where a field's parameters live: a row of params [N, P] per trajectory, or shared [Q].
template <class Field>
inline constexpr bool has_shared_parameters =
    std::is_same_v<Field, ode::Mlp> || std::is_same_v<Field, ode::Linear<ode::Sharing::shared, ode::Sharing::shared>>;

// The built-in fields and the methods by operator name. CMake instantiates the work of each
// (field, method) pair once per direction, PARASEQ_ODEINT_FIELD_COUNT x PARASEQ_ODEINT_METHOD_COUNT
// (checked in odeint_forward.cpp).
using BuiltinFields = std::tuple<ode::DampedOscillator, ode::LotkaVolterra, ode::SIR,
                                 ode::Linear<ode::Sharing::shared, ode::Sharing::shared>,
                                 ode::Linear<ode::Sharing::own, ode::Sharing::own>, ode::Mlp>;
inline constexpr const char* field_names[] = {"damped_oscillator", "lotka_volterra", "sir",
                                              "linear_shared",     "linear_own",     "mlp"};
using BuiltinMethods = std::tuple<ode::Euler, ode::Heun, ode::RK4, ode::DormandPrince5>;
inline constexpr const char* method_names[] = {"euler", "heun", "rk4", "dopri5"};
template <int Index>
using BuiltinField = std::tuple_element_t<Index, BuiltinFields>;
template <int Index>
using BuiltinMethod = std::tuple_element_t<Index, BuiltinMethods>;

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

// The field object: those whose state size is a run-time value take n (and the MLP its width).
template <class Field>
Field make_field(int n, int mlp_hidden) {
  if constexpr (std::is_same_v<Field, ode::Mlp>) return Field{n, mlp_hidden};
  else if constexpr (std::is_constructible_v<Field, int>) return Field{n};
  else return Field{};
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

// The prepared (contiguous, compute-type) tensors of one call. Forward: observed [N, len(t), n],
// and where defined each trajectory's accepted steps, accepted (int32 [N]). Backward: grad_y
// [N, len(t), n] and, where defined, the forward's accepted (adaptive steps: not counted again) in;
// grad_y0, grad_params, grad_shared out.
struct OdeintTensors {
  at::Tensor y0, params, shared;
  at::Tensor observed, accepted;
  at::Tensor grad_y, grad_y0, grad_params, grad_shared;
};

// Defined in odeint_integrate.hpp and instantiated per built-in field and method (see the top of this file).
template <int FieldIndex, int MethodIndex>
void integrate(const char* op, const OdeintArgs& args, const std::vector<double>& times, const OdeintTensors& tensors);
template <int FieldIndex, int MethodIndex>
void integrate_adjoint(const char* op, const OdeintArgs& args, const std::vector<double>& times,
                       const OdeintTensors& tensors);

inline at::Tensor prepared_or_undefined(const std::optional<at::Tensor>& tensor) {
  return tensor ? prepared(*tensor) : at::Tensor();
}

} // namespace paraseq::torch_bridge
