// paraseq::odeint: the states at the times t, [N, len(t), n].
#include "kernels.hpp"
#include "odeint_checks.hpp"

namespace paraseq::torch_bridge {
namespace {

constexpr const char* odeint_op = "paraseq::odeint";

static_assert(std::tuple_size_v<BuiltinFields> == PARASEQ_ODEINT_FIELD_COUNT &&
                  std::tuple_size_v<BuiltinMethods> == PARASEQ_ODEINT_METHOD_COUNT,
              "src/adapters/torch/CMakeLists.txt instantiates PARASEQ_ODEINT_FIELD_COUNT fields and "
              "PARASEQ_ODEINT_METHOD_COUNT methods: keep them equal to the lists in odeint.hpp");

} // namespace

at::Tensor odeint(const std::string& field, const at::Tensor& y0, const at::Tensor& t,
                  const std::optional<at::Tensor>& params, const std::optional<at::Tensor>& shared, int64_t mlp_hidden,
                  const std::string& method, std::optional<double> step_size, double rtol, double atol,
                  int64_t max_steps) {
  const OdeintArgs args{field, y0, t, params, shared, mlp_hidden, method, step_size, rtol, atol, max_steps};
  return run_odeint(odeint_op, args, [&](const std::vector<double>& times, const OdeintTensors& tensors) {
    with_name_index(odeint_op, "field", field_names, field, [&](auto f) {
      with_name_index(odeint_op, "method", method_names, method, [&](auto m) {
        integrate<decltype(f)::value, decltype(m)::value>(odeint_op, args, times, tensors);
      });
    });
  });
}

} // namespace paraseq::torch_bridge
