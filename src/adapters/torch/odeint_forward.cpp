// paraseq::odeint: the states at the times t, [N, len(t), n].
#include "kernels.hpp"
#include "odeint_checks.hpp"

namespace paraseq::torch_bridge {
namespace {

constexpr const char* odeint_op = "paraseq::odeint";

} // namespace

at::Tensor odeint(const std::string& field, const at::Tensor& y0, const at::Tensor& t,
                  const std::optional<at::Tensor>& params, const std::optional<at::Tensor>& shared, int64_t mlp_hidden,
                  const std::string& method, std::optional<double> step_size, double rtol, double atol,
                  int64_t max_steps) {
  const OdeintArgs args{field, y0, t, params, shared, mlp_hidden, method, step_size, rtol, atol, max_steps};
  const std::vector<double> times = check_odeint_arguments(odeint_op, args);
  OdeintTensors tensors;
  tensors.y0 = prepared(y0), tensors.params = prepared_or_undefined(params), tensors.shared = prepared_or_undefined(shared);
  tensors.observed = at::empty({y0.size(0), long(times.size()), y0.size(1)}, tensors.y0.options());
  with_name_index(odeint_op, "field", field_names, field, [&](auto f) {
    with_name_index(odeint_op, "method", method_names, method, [&](auto m) {
      integrate<decltype(f)::value, decltype(m)::value>(odeint_op, args, times, tensors);
    });
  });
  const at::Tensor observed = tensors.observed.to(y0.scalar_type());
  require_finite_when_stored(odeint_op, "the state", observed);
  return observed;
}

} // namespace paraseq::torch_bridge
