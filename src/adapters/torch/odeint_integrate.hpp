#pragma once
// The work of paraseq::odeint and odeint_backward for one field and method. Included by the
// operators' units generated from odeint_instance.cpp.in (a built-in field: every float type x
// space, see odeint.hpp) and by the extensions generated for a function of your own (one type and
// space).

#include "odeint.hpp"

#include <paraseq/core/fill.hpp>
#include <paraseq/loops/integrate.hpp>
#include <paraseq/loops/tableaus.hpp>

namespace paraseq::torch_bridge {

// Calls f(steps) for Method: fixed steps of step_size (landing on every t), fixed steps on the grid
// t (euler, rk4 without step_size) or adaptive steps (heun, dopri5 without step_size).
template <class Method, class F>
void with_steps(const char* op, const OdeintArgs& args, const std::vector<double>& times, const F& f) {
  if (args.step_size) {
    TORCH_CHECK_VALUE(*args.step_size > 0, op, ": argument 'step_size' is ", *args.step_size, ", expected a value > 0");
    f(ode::FixedSteps::until(times.front(), times.back(), *args.step_size).observe_at(times));
  } else if constexpr (ode::is_adaptive_method_v<Method>) {
    ode::AdaptiveSteps steps;
    steps.t0 = times.front();
    steps.t_end = times.back();
    steps.rtol = args.rtol;
    steps.atol = args.atol;
    steps.max_steps = int(args.max_steps);
    f(steps.observe_at(times));
  } else {
    f(ode::FixedSteps::on_grid(times).observe_at(times));
  }
}

// Calls f(method, steps, problem) for `field` with the problem's Views over the prepared tensors:
// shared parameters [Q] when SharedParameters, else the trajectories' own [N, P].
template <class T, class Method, bool SharedParameters, class Space, class Field, class F>
void with_problem(const char* op, const OdeintArgs& args, const std::vector<double>& times, const OdeintTensors& tensors,
                  const Field& field, const F& f) {
  const auto y0_view = as_view<const T, 2, Space>(tensors.y0);
  const Method method;
  with_steps<Method>(op, args, times, [&](const auto& steps) {
    if constexpr (SharedParameters) {
      TORCH_CHECK_VALUE(tensors.shared.defined(), op, ": argument 'shared' is None, expected the field's shared parameters");
      f(method, steps, ode::problem(field, y0_view, ode::NoView{}, as_view<const T, 1, Space>(tensors.shared)));
    } else {
      TORCH_CHECK_VALUE(tensors.params.defined(), op, ": argument 'params' is None, expected the field's [N, P] parameters");
      f(method, steps, ode::problem(field, y0_view, as_view<const T, 2, Space>(tensors.params)));
    }
  });
}

// A call's report and mesh (or tolerances) in a byte tensor from PyTorch's allocator, which caches
// device blocks: no device allocation or release per call. The tensor must outlive the call.
template <class T, class Steps>
at::Tensor solve_workspace(const OdeintTensors& tensors, const Steps& steps, ode::SolveOptions& options) {
  at::Tensor workspace = at::empty({long(ode::solve_workspace_bytes<T>(tensors.y0.size(0), int(tensors.y0.size(1)), steps))},
                                   tensors.y0.options().dtype(at::kByte));
  options.workspace = {workspace.data_ptr(), std::size_t(workspace.numel())};
  return workspace;
}

// The forward work for one field, method, compute type T and execution space: tensors.observed
// [N, len(t), n] from tensors.y0 and the parameters. Generated extensions (python/paraseq/
// _compiled_odeint.py) instantiate it for their field alone.
template <class T, class Method, bool SharedParameters, class Space, class Field>
void integrate_field(const char* op, const OdeintArgs& args, const std::vector<double>& times,
                     const OdeintTensors& tensors, const Space& space, const Field& field) {
  with_problem<T, Method, SharedParameters, Space>(op, args, times, tensors, field, [&](auto method, const auto& steps, const auto& problem) {
    ode::SolveOptions options;
    const at::Tensor workspace = solve_workspace<T>(tensors, steps, options);
    translate_errors([&] {
      const auto report = ode::solve<ode::CompiledModes::fused_only>(
          space, method, problem, steps, ode::observed(as_view<T, 3, Space>(tensors.observed)), options);
      if (tensors.accepted.defined()) paraseq::detail::copy(space, as_view<int, 1, Space>(tensors.accepted), report.accepted);
    });
  });
}

// The backward work (the discrete adjoint) for one field, method, T and space: tensors.grad_y0 and
// the parameters' gradients from tensors.grad_y.
template <class T, class Method, bool SharedParameters, class Space, class Field>
void integrate_field_adjoint(const char* op, const OdeintArgs& args, const std::vector<double>& times,
                             const OdeintTensors& tensors, const Space& space, const Field& field) {
  with_problem<T, Method, SharedParameters, Space>(op, args, times, tensors, field, [&](auto method, const auto& steps, const auto& problem) {
    const auto cotangents = ode::observed(as_view<const T, 3, Space>(tensors.grad_y));
    const auto y0_bar = as_view<T, 2, Space>(tensors.grad_y0);
    // The checkpoints and adjoint state come from paraseq's workspace cache (docs/memory.md).
    ode::SolveOptions options;
    const at::Tensor workspace = solve_workspace<T>(tensors, steps, options);
    if (tensors.accepted.defined()) options.accepted_steps = tensors.accepted.template data_ptr<int>();
    translate_errors([&] {
      if constexpr (SharedParameters) {
        const auto shared_bar = as_view<T, 1, Space>(tensors.grad_shared);
        ode::solve_with_gradient<ode::CompiledModes::fused_only>(space, method, problem, steps, ode::Outputs<>{}, cotangents,
                                 ode::Gradients<decltype(y0_bar), ode::NoView, decltype(shared_bar)>{y0_bar, {}, shared_bar},
                                 options);
      } else {
        const auto params_bar = as_view<T, 2, Space>(tensors.grad_params);
        ode::solve_with_gradient<ode::CompiledModes::fused_only>(space, method, problem, steps, ode::Outputs<>{}, cotangents,
                                 ode::Gradients<decltype(y0_bar), decltype(params_bar)>{y0_bar, params_bar}, options);
      }
    });
  });
}

// The built-in field FieldIndex and method MethodIndex, every float type x space.
template <int FieldIndex, int MethodIndex>
void integrate(const char* op, const OdeintArgs& args, const std::vector<double>& times, const OdeintTensors& tensors) {
  using Field = BuiltinField<FieldIndex>;
  const Field field = make_field<Field>(int(args.y0.size(1)), int(args.mlp_hidden));
  using shared = std::bool_constant<has_shared_parameters<Field>>; // a type: nvcc takes no variable template here
  dispatch_float(tensors.y0.scalar_type(), [&](auto zero) {
    with_space(op, args.y0, [&](const auto& space) {
      integrate_field<decltype(zero), BuiltinMethod<MethodIndex>, shared::value>(op, args, times, tensors, space, field);
    });
  });
}

template <int FieldIndex, int MethodIndex>
void integrate_adjoint(const char* op, const OdeintArgs& args, const std::vector<double>& times,
                       const OdeintTensors& tensors) {
  using Field = BuiltinField<FieldIndex>;
  const Field field = make_field<Field>(int(args.y0.size(1)), int(args.mlp_hidden));
  using shared = std::bool_constant<has_shared_parameters<Field>>; // a type: nvcc takes no variable template here
  dispatch_float(tensors.y0.scalar_type(), [&](auto zero) {
    with_space(op, args.y0, [&](const auto& space) {
      integrate_field_adjoint<decltype(zero), BuiltinMethod<MethodIndex>, shared::value>(op, args, times, tensors, space, field);
    });
  });
}

} // namespace paraseq::torch_bridge
