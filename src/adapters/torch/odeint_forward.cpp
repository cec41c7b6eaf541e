// paraseq::odeint: the states at the times t, [N, len(t), n]; paraseq::odeint_with_steps: the same
// and each trajectory's accepted steps, for odeint_backward. The PyTorch half (work.hpp); the work,
// integrate for each built-in field and method: odeint_integrate.hpp.
#include "kernels.hpp"
#include "odeint_checks.hpp"

namespace paraseq::torch_bridge {
namespace {

constexpr const char* odeint_op = "paraseq::odeint";
constexpr const char* odeint_with_steps_op = "paraseq::odeint_with_steps";

static_assert(std::size(odeint_field_names) == PARASEQ_ODEINT_FIELD_COUNT &&
                  std::size(odeint_method_names) == PARASEQ_ODEINT_METHOD_COUNT,
              "src/adapters/torch/CMakeLists.txt instantiates PARASEQ_ODEINT_FIELD_COUNT fields and "
              "PARASEQ_ODEINT_METHOD_COUNT methods: keep them equal to the lists in work.hpp");

// Both operators: with `accepted`, each trajectory's accepted steps there too.
at::Tensor run_builtin(const char* op, const OdeintArgs& args, at::Tensor* accepted) {
  return run_odeint(
      op, args,
      [&](const Place& place, const OdeintSettings& settings, const std::vector<double>& times, const OdeintArrays& arrays) {
        with_name_index(op, "field", odeint_field_names, args.field, [&](auto f) {
          with_name_index(op, "method", odeint_method_names, args.method, [&](auto m) {
            dispatch_float(compute_dtype(args.y0.scalar_type()), [&](auto zero) {
              integrate<decltype(f)::value, decltype(m)::value, decltype(zero)>(op, place, settings, times, arrays);
            });
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
