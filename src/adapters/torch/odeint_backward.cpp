// paraseq::odeint_backward: the discrete adjoint of paraseq::odeint through the steps it took.
#include "kernels.hpp"
#include "odeint_checks.hpp"

namespace paraseq::torch_bridge {
namespace {

constexpr const char* backward_op = "paraseq::odeint_backward";

} // namespace

std::tuple<at::Tensor, at::Tensor, at::Tensor>
odeint_backward(const std::string& field, const at::Tensor& y0, const at::Tensor& t,
                const std::optional<at::Tensor>& params, const std::optional<at::Tensor>& shared, int64_t mlp_hidden,
                const std::string& method, std::optional<double> step_size, double rtol, double atol, int64_t max_steps,
                const at::Tensor& grad_y, const std::optional<at::Tensor>& accepted) {
  const OdeintArgs args{field, y0, t, params, shared, mlp_hidden, method, step_size, rtol, atol, max_steps};
  return run_odeint_backward(
      backward_op, args, grad_y,
      [&](const std::vector<double>& times, const OdeintTensors& tensors) {
        with_name_index(backward_op, "field", field_names, field, [&](auto f) {
          with_name_index(backward_op, "method", method_names, method, [&](auto m) {
            integrate_adjoint<decltype(f)::value, decltype(m)::value>(backward_op, args, times, tensors);
          });
        });
      },
      accepted);
}

} // namespace paraseq::torch_bridge
