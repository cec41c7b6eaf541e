#pragma once
// The work of paraseq::odeint and odeint_backward (work.hpp; the PyTorch half: odeint_checks.hpp,
// odeint_forward.cpp, odeint_backward.cpp): the built-in fields (loops/fields.hpp) integrated by
// ode::solve and ode::solve_with_gradient (loops/integrate.hpp). Included by the units that CMake
// generates from odeint_instance.cpp.in (three fields per unit and direction, or without the
// compiled instances, whose loops they then compile, one per field, method and direction) and by
// the extensions generated for a function of your own (one type; python/paraseq/_compiled_odeint.py).

#include "runtime.hpp"

#include <paraseq/core/fill.hpp>
#include <paraseq/loops/fields.hpp>
#include <paraseq/loops/integrate.hpp>
#include <paraseq/loops/tableaus.hpp>

#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

namespace paraseq::torch_bridge {

// The built-in fields and methods, in the order of their names (work.hpp).
using BuiltinFields = std::tuple<ode::DampedOscillator, ode::LotkaVolterra, ode::SIR,
                                 ode::Linear<ode::Sharing::shared, ode::Sharing::shared>,
                                 ode::Linear<ode::Sharing::own, ode::Sharing::own>, ode::Mlp>;
using BuiltinMethods = std::tuple<ode::Euler, ode::Heun, ode::RK4, ode::DormandPrince5>;
static_assert(std::tuple_size_v<BuiltinFields> == std::size(odeint_field_names) &&
                  std::tuple_size_v<BuiltinMethods> == std::size(odeint_method_names),
              "a name in work.hpp for every built-in field and method");
static_assert(odeint_mlp_max_hidden == ode::Mlp::max_hidden, "work.hpp's odeint_mlp_max_hidden is ode::Mlp's");
template <int Index>
using BuiltinField = std::tuple_element_t<Index, BuiltinFields>;
template <int Index>
using BuiltinMethod = std::tuple_element_t<Index, BuiltinMethods>;

// Where a field's parameters live: a row of params [N, P] per trajectory, or shared [Q].
template <class Field>
inline constexpr bool has_shared_parameters =
    std::is_same_v<Field, ode::Mlp> || std::is_same_v<Field, ode::Linear<ode::Sharing::shared, ode::Sharing::shared>>;

// The field object: those whose state size is a run-time value take n (and the MLP its width).
template <class Field>
Field make_field(int n, int mlp_hidden) {
  if constexpr (std::is_same_v<Field, ode::Mlp>) return Field{n, mlp_hidden};
  else if constexpr (std::is_constructible_v<Field, int>) return Field{n};
  else return Field{};
}

// Calls f(steps) for Method: fixed steps of step_size (landing on every t), fixed steps on the grid
// t (euler, rk4 without step_size) or adaptive steps (heun, dopri5 without step_size).
template <class Method, class F>
void with_steps(const OdeintSettings& settings, const std::vector<double>& times, const F& f) {
  if (settings.step_size) { // finite and > 0 (odeint_checks.hpp)
    f(ode::FixedSteps::until(times.front(), times.back(), *settings.step_size).observe_at(times));
  } else if constexpr (ode::is_adaptive_method_v<Method>) {
    ode::AdaptiveSteps steps;
    steps.t0 = times.front();
    steps.t_end = times.back();
    steps.rtol = settings.rtol;
    steps.atol = settings.atol;
    steps.max_steps = int(settings.max_steps);
    f(steps.observe_at(times));
  } else {
    f(ode::FixedSteps::on_grid(times).observe_at(times));
  }
}

// Calls f(method, steps, problem) for `field` with the problem's Views over the arrays: shared
// parameters [Q] when SharedParameters, else the trajectories' own [N, P].
template <class T, class Method, bool SharedParameters, class Space, class Field, class F>
void with_problem(const char* op, const OdeintSettings& settings, const std::vector<double>& times,
                  const OdeintArrays& arrays, const Field& field, const F& f) {
  const auto y0_view = as_view<const T, 2, Space>(arrays.y0);
  const Method method;
  with_steps<Method>(settings, times, [&](const auto& steps) {
    if constexpr (SharedParameters) {
      if (!arrays.shared.given())
        throw std::invalid_argument(std::string(op) + ": argument 'shared' is None, expected the field's shared parameters");
      f(method, steps, ode::problem(field, y0_view, ode::NoView{}, as_view<const T, 1, Space>(arrays.shared)));
    } else {
      if (!arrays.params.given())
        throw std::invalid_argument(std::string(op) + ": argument 'params' is None, expected the field's [N, P] parameters");
      f(method, steps, ode::problem(field, y0_view, as_view<const T, 2, Space>(arrays.params)));
    }
  });
}

// A call's report and mesh (or tolerances) in scratch from PyTorch's allocator (arrays.allocate),
// which caches device blocks: no device allocation or release per call.
template <class T, class Steps>
void allocate_solve_workspace(const OdeintArrays& arrays, const Steps& steps, ode::SolveOptions& options) {
  const std::size_t bytes = ode::solve_workspace_bytes<T>(long(arrays.y0.extents[0]), int(arrays.y0.extents[1]), steps);
  options.workspace = {arrays.allocate(bytes), bytes};
}

// The forward work for one field, method, compute type T and execution space: arrays.observed
// [N, len(t), n] from arrays.y0 and the parameters. Generated extensions (python/paraseq/
// _compiled_odeint.py) instantiate it for their field alone.
template <class T, class Method, bool SharedParameters, class Space, class Field>
void integrate_field(const char* op, const OdeintSettings& settings, const std::vector<double>& times,
                     const OdeintArrays& arrays, const Space& space, const Field& field) {
  with_problem<T, Method, SharedParameters, Space>(op, settings, times, arrays, field, [&](auto method, const auto& steps, const auto& problem) {
    ode::SolveOptions options;
    allocate_solve_workspace<T>(arrays, steps, options);
    const auto report = ode::solve<ode::CompiledModes::fused_only>(
        space, method, problem, steps, ode::observed(as_view<T, 3, Space>(arrays.observed)), options);
    if (arrays.accepted.given()) paraseq::detail::copy(space, as_view<int, 1, Space>(arrays.accepted), report.accepted);
  });
}

// The backward work (the discrete adjoint) for one field, method, T and space: arrays.grad_y0 and
// the parameters' gradients from arrays.grad_y.
template <class T, class Method, bool SharedParameters, class Space, class Field>
void integrate_field_adjoint(const char* op, const OdeintSettings& settings, const std::vector<double>& times,
                             const OdeintArrays& arrays, const Space& space, const Field& field) {
  with_problem<T, Method, SharedParameters, Space>(op, settings, times, arrays, field, [&](auto method, const auto& steps, const auto& problem) {
    const auto cotangents = ode::observed(as_view<const T, 3, Space>(arrays.grad_y));
    const auto y0_bar = as_view<T, 2, Space>(arrays.grad_y0);
    // The checkpoints and adjoint state come from paraseq's workspace cache (docs/memory.md).
    ode::SolveOptions options;
    allocate_solve_workspace<T>(arrays, steps, options);
    if (arrays.accepted.given()) options.accepted_steps = static_cast<int*>(arrays.accepted.data);
    if constexpr (SharedParameters) {
      const auto shared_bar = as_view<T, 1, Space>(arrays.grad_shared);
      ode::solve_with_gradient<ode::CompiledModes::fused_only>(space, method, problem, steps, ode::Outputs<>{}, cotangents,
                               ode::Gradients<decltype(y0_bar), ode::NoView, decltype(shared_bar)>{y0_bar, {}, shared_bar},
                               options);
    } else {
      const auto params_bar = as_view<T, 2, Space>(arrays.grad_params);
      ode::solve_with_gradient<ode::CompiledModes::fused_only>(space, method, problem, steps, ode::Outputs<>{}, cotangents,
                               ode::Gradients<decltype(y0_bar), decltype(params_bar)>{y0_bar, params_bar}, options);
    }
  });
}

// The built-in field FieldIndex and method MethodIndex in T, on the arrays' device.
template <int FieldIndex, int MethodIndex, class T>
void integrate(const char* op, const Place& place, const OdeintSettings& settings, const std::vector<double>& times,
               const OdeintArrays& arrays) {
  using Field = BuiltinField<FieldIndex>;
  const Field field = make_field<Field>(int(arrays.y0.extents[1]), int(settings.mlp_hidden));
  using shared = std::bool_constant<has_shared_parameters<Field>>; // a type: nvcc takes no variable template here
  with_space(op, place, [&](const auto& space) {
    integrate_field<T, BuiltinMethod<MethodIndex>, shared::value>(op, settings, times, arrays, space, field);
  });
}

template <int FieldIndex, int MethodIndex, class T>
void integrate_adjoint(const char* op, const Place& place, const OdeintSettings& settings,
                       const std::vector<double>& times, const OdeintArrays& arrays) {
  using Field = BuiltinField<FieldIndex>;
  const Field field = make_field<Field>(int(arrays.y0.extents[1]), int(settings.mlp_hidden));
  using shared = std::bool_constant<has_shared_parameters<Field>>; // a type: nvcc takes no variable template here
  with_space(op, place, [&](const auto& space) {
    integrate_field_adjoint<T, BuiltinMethod<MethodIndex>, shared::value>(op, settings, times, arrays, space, field);
  });
}

} // namespace paraseq::torch_bridge
