// paraseq::odeint_backward: the discrete adjoint of paraseq::odeint through the steps it took.
#include "odeint.hpp"

#include <ATen/ops/zeros.h>
#include <torch/library.h>

namespace paraseq::torch_bridge {
namespace {

constexpr const char* backward_op = "paraseq::odeint_backward";

std::tuple<at::Tensor, at::Tensor, at::Tensor>
odeint_backward(const std::string& field, const at::Tensor& y0, const at::Tensor& t,
                const std::optional<at::Tensor>& params, const std::optional<at::Tensor>& shared, int64_t mlp_hidden,
                const std::string& method, std::optional<double> step_size, double rtol, double atol, int64_t max_steps,
                const at::Tensor& grad_y) {
  const OdeintArgs args{field, y0, t, params, shared, mlp_hidden, method, step_size, rtol, atol, max_steps};
  const std::vector<double> times = check_odeint(backward_op, args);
  check_tensor(backward_op, "grad_y", grad_y, 3, y0);
  const at::Tensor y0_c = prepared(y0), params_c = prepared_or_undefined(params), shared_c = prepared_or_undefined(shared);
  const at::Tensor grad_c = prepared(grad_y);
  at::Tensor grad_y0 = at::empty(y0.sizes(), y0_c.options());
  // Gradients of absent parameters are empty tensors.
  at::Tensor grad_params = at::zeros(params ? params->sizes() : c10::IntArrayRef{0}, y0_c.options());
  at::Tensor grad_shared = at::zeros(shared ? shared->sizes() : c10::IntArrayRef{0}, y0_c.options());
  dispatch_float(y0_c.scalar_type(), [&](auto zero) {
    using T = decltype(zero);
    with_problem<T>(backward_op, args, times, y0_c, params_c, shared_c, [&](const auto& space, auto method_tag, const auto& steps, const auto& problem) {
      using Space = std::decay_t<decltype(space)>;
      using Problem = std::decay_t<decltype(problem)>;
      const auto cotangents = ode::observed(as_view<const T, 3, Space>(grad_c));
      const auto y0_bar = as_view<T, 2, Space>(grad_y0);
      translate_errors([&] {
        if constexpr (ode::is_given_v<decltype(Problem::shared)>)
          ode::solve_with_gradient(space, method_tag, problem, steps, ode::Outputs<>{}, cotangents,
                                   ode::Gradients<decltype(y0_bar), ode::NoView, decltype(as_view<T, 1, Space>(grad_shared))>{
                                       y0_bar, {}, as_view<T, 1, Space>(grad_shared)});
        else
          ode::solve_with_gradient(space, method_tag, problem, steps, ode::Outputs<>{}, cotangents,
                                   ode::Gradients<decltype(y0_bar), decltype(as_view<T, 2, Space>(grad_params))>{
                                       y0_bar, as_view<T, 2, Space>(grad_params)});
      });
    });
  });
  return {grad_y0.to(y0.scalar_type()), grad_params.to(y0.scalar_type()), grad_shared.to(y0.scalar_type())};
}

} // namespace

TORCH_LIBRARY_IMPL(paraseq, CPU, m) { m.impl("odeint_backward", &odeint_backward); }
#ifdef KOKKOS_ENABLE_CUDA
TORCH_LIBRARY_IMPL(paraseq, CUDA, m) { m.impl("odeint_backward", &odeint_backward); }
#endif

} // namespace paraseq::torch_bridge
