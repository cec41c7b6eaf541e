// paraseq::odeint: the states at the times t, [N, len(t), n].
#include "odeint.hpp"

#include <torch/library.h>

namespace paraseq::torch_bridge {
namespace {

constexpr const char* odeint_op = "paraseq::odeint";

at::Tensor odeint(const std::string& field, const at::Tensor& y0, const at::Tensor& t,
                  const std::optional<at::Tensor>& params, const std::optional<at::Tensor>& shared, int64_t mlp_hidden,
                  const std::string& method, std::optional<double> step_size, double rtol, double atol,
                  int64_t max_steps) {
  const OdeintArgs args{field, y0, t, params, shared, mlp_hidden, method, step_size, rtol, atol, max_steps};
  const std::vector<double> times = check_odeint(odeint_op, args);
  const at::Tensor y0_c = prepared(y0), params_c = prepared_or_undefined(params), shared_c = prepared_or_undefined(shared);
  at::Tensor observed = at::empty({y0.size(0), long(times.size()), y0.size(1)}, y0_c.options());
  dispatch_float(y0_c.scalar_type(), [&](auto zero) {
    using T = decltype(zero);
    with_problem<T>(odeint_op, args, times, y0_c, params_c, shared_c, [&](const auto& space, auto method_tag, const auto& steps, const auto& problem) {
      using Space = std::decay_t<decltype(space)>;
      translate_errors([&] { ode::solve(space, method_tag, problem, steps, ode::observed(as_view<T, 3, Space>(observed))); });
    });
  });
  return observed.to(y0.scalar_type());
}

} // namespace

TORCH_LIBRARY_IMPL(paraseq, CPU, m) { m.impl("odeint", &odeint); }
#ifdef KOKKOS_ENABLE_CUDA
TORCH_LIBRARY_IMPL(paraseq, CUDA, m) { m.impl("odeint", &odeint); }
#endif

} // namespace paraseq::torch_bridge
