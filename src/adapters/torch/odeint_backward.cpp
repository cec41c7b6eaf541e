// paraseq::odeint_backward: the discrete adjoint of paraseq::odeint through the steps it took. The
// PyTorch half (work.hpp); the work, integrate_adjoint for each built-in field and method:
// odeint_integrate.hpp.
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
      [&](const Place& place, const OdeintSettings& settings, const std::vector<double>& times, const OdeintArrays& arrays) {
        with_name_index(backward_op, "field", odeint_field_names, field, [&](auto f) {
          with_name_index(backward_op, "method", odeint_method_names, method, [&](auto m) {
            dispatch_float(compute_dtype(y0.scalar_type()), [&](auto zero) {
              integrate_adjoint<decltype(f)::value, decltype(m)::value, decltype(zero)>(backward_op, place, settings,
                                                                                        times, arrays);
            });
          });
        });
      },
      accepted);
}

} // namespace paraseq::torch_bridge
