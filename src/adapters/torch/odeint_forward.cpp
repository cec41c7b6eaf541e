// paraseq::odeint: the states at the times t, [N, len(t), n]; paraseq::odeint_with_steps: the same
// and each trajectory's accepted steps, for odeint_backward.
#include "kernels.hpp"
#include "odeint_checks.hpp"

namespace paraseq::torch_bridge {
namespace {

constexpr const char* odeint_op = "paraseq::odeint";
constexpr const char* odeint_with_steps_op = "paraseq::odeint_with_steps";

static_assert(std::tuple_size_v<BuiltinFields> == PARASEQ_ODEINT_FIELD_COUNT &&
                  std::tuple_size_v<BuiltinMethods> == PARASEQ_ODEINT_METHOD_COUNT,
              "src/adapters/torch/CMakeLists.txt instantiates PARASEQ_ODEINT_FIELD_COUNT fields and "
              "PARASEQ_ODEINT_METHOD_COUNT methods: keep them equal to the lists in odeint.hpp");

// Both operators: with `accepted`, each trajectory's accepted steps there too.
at::Tensor run_builtin(const char* op, const OdeintArgs& args, at::Tensor* accepted) {
  return run_odeint(
      op, args,
      [&](const std::vector<double>& times, const OdeintTensors& tensors) {
        with_name_index(op, "field", field_names, args.field, [&](auto f) {
          with_name_index(op, "method", method_names, args.method, [&](auto m) {
            integrate<decltype(f)::value, decltype(m)::value>(op, args, times, tensors);
          });
        });
      },
      accepted);
}

} // namespace

at::Tensor odeint(const std::string& field, const at::Tensor& y0, const at::Tensor& t,
                  const std::optional<at::Tensor>& params, const std::optional<at::Tensor>& shared, int64_t mlp_hidden,
                  const std::string& method, std::optional<double> step_size, double rtol, double atol,
                  int64_t max_steps) {
  return run_builtin(odeint_op, {field, y0, t, params, shared, mlp_hidden, method, step_size, rtol, atol, max_steps},
                     nullptr);
}

std::tuple<at::Tensor, at::Tensor> odeint_with_steps(const std::string& field, const at::Tensor& y0, const at::Tensor& t,
                                                     const std::optional<at::Tensor>& params,
                                                     const std::optional<at::Tensor>& shared, int64_t mlp_hidden,
                                                     const std::string& method, std::optional<double> step_size,
                                                     double rtol, double atol, int64_t max_steps) {
  at::Tensor accepted;
  const at::Tensor observed = run_builtin(
      odeint_with_steps_op, {field, y0, t, params, shared, mlp_hidden, method, step_size, rtol, atol, max_steps},
      &accepted);
  return {observed, accepted};
}

} // namespace paraseq::torch_bridge
