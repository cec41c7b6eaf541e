// paraseq::odeint_backward: the discrete adjoint of paraseq::odeint through the steps it took.
#include "kernels.hpp"
#include "odeint_checks.hpp"

#include <ATen/ops/zeros.h>

namespace paraseq::torch_bridge {
namespace {

constexpr const char* backward_op = "paraseq::odeint_backward";

} // namespace

std::tuple<at::Tensor, at::Tensor, at::Tensor>
odeint_backward(const std::string& field, const at::Tensor& y0, const at::Tensor& t,
                const std::optional<at::Tensor>& params, const std::optional<at::Tensor>& shared, int64_t mlp_hidden,
                const std::string& method, std::optional<double> step_size, double rtol, double atol, int64_t max_steps,
                const at::Tensor& grad_y) {
  const OdeintArgs args{field, y0, t, params, shared, mlp_hidden, method, step_size, rtol, atol, max_steps};
  const std::vector<double> times = check_odeint_arguments(backward_op, args);
  check_tensor(backward_op, "grad_y", grad_y, 3, y0);
  OdeintTensors tensors;
  tensors.y0 = prepared(y0), tensors.params = prepared_or_undefined(params), tensors.shared = prepared_or_undefined(shared);
  tensors.grad_y = prepared(grad_y);
  tensors.grad_y0 = at::empty(y0.sizes(), tensors.y0.options());
  // Gradients of absent parameters are empty tensors.
  tensors.grad_params = at::zeros(params ? params->sizes() : c10::IntArrayRef{0}, tensors.y0.options());
  tensors.grad_shared = at::zeros(shared ? shared->sizes() : c10::IntArrayRef{0}, tensors.y0.options());
  with_name_index(backward_op, "field", field_names, field, [&](auto f) {
    with_name_index(backward_op, "method", method_names, method, [&](auto m) {
      integrate_adjoint<decltype(f)::value, decltype(m)::value>(backward_op, args, times, tensors);
    });
  });
  const at::Tensor grad_y0 = tensors.grad_y0.to(y0.scalar_type()), grad_params = tensors.grad_params.to(y0.scalar_type()),
                   grad_shared = tensors.grad_shared.to(y0.scalar_type());
  require_finite_when_stored(backward_op, "the gradient grad_y0", grad_y0);
  require_finite_when_stored(backward_op, "the gradient grad_params", grad_params);
  require_finite_when_stored(backward_op, "the gradient grad_shared", grad_shared.unsqueeze(0));
  return {grad_y0, grad_params, grad_shared};
}

} // namespace paraseq::torch_bridge
