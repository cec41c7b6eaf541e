// paraseq::para_gru, para_lstm and their backward: argument checks and outputs (newton_ops.hpp).
#include "kernels.hpp"
#include "newton_ops.hpp"

#include <ATen/ops/empty.h>

#include <tuple>

namespace paraseq::torch_bridge {
namespace {

NewtonConfig newton_config(const char* op, int64_t max_iters, double omega, std::optional<double> residual_atol,
                           std::optional<double> residual_fail, int64_t picard_iters, bool picard_adapt,
                           const std::string& scan_backend) {
  NewtonConfig config;
  config.max_iters = int(max_iters);
  config.omega = omega;
  config.residual_atol = residual_atol;
  config.residual_fail = residual_fail;
  config.picard_iters = int(picard_iters);
  config.picard_adapt = picard_adapt;
  if (scan_backend == "auto") config.mode = NewtonMode::automatic;
  else if (scan_backend == "fused") config.mode = NewtonMode::fused;
  else if (scan_backend == "scan") config.mode = NewtonMode::newton;
  else if (scan_backend == "sequential") config.mode = NewtonMode::sequential;
  else
    TORCH_CHECK_VALUE(false, op, ": argument 'scan_backend' is \"", scan_backend,
                      "\", expected \"auto\", \"fused\", \"scan\" or \"sequential\"");
  return config;
}

// The recurrent parameters, checked against u and prepared (contiguous, compute type).
std::vector<at::Tensor> prepared_params(const char* op, const at::Tensor& u, const std::vector<const char*>& names,
                                        const std::vector<at::Tensor>& params) {
  std::vector<at::Tensor> result;
  for (std::size_t k = 0; k < params.size(); ++k) {
    check_tensor(op, names[k], params[k], 2, u);
    result.push_back(prepared(params[k]));
  }
  return result;
}

template <class MakeCell>
std::tuple<at::Tensor, at::Tensor> solve(const char* op, const at::Tensor& u, const std::vector<at::Tensor>& params,
                                         const std::optional<at::Tensor>& h0, int64_t state_size,
                                         const NewtonConfig& config, bool with_residual) {
  NewtonTensors tensors;
  tensors.u = prepared(u), tensors.params = params, tensors.h0 = h0 ? prepared(*h0) : at::Tensor();
  tensors.h = at::empty({u.size(0), u.size(1), state_size}, tensors.u.options());
  tensors.residual = at::empty({with_residual ? u.size(0) : 0}, u.options().dtype(at::kDouble));
  dispatch_float(tensors.u.scalar_type(), [&](auto zero) { newton_forward<MakeCell, decltype(zero)>(op, tensors, config); });
  return {tensors.h.to(u.scalar_type()), tensors.residual};
}

// Returns (du, dparams as [rows, H] each, dh0).
template <class MakeCell>
std::vector<at::Tensor> gradients(const char* op, const at::Tensor& u, const std::vector<at::Tensor>& params,
                                  const std::optional<at::Tensor>& h0, const at::Tensor& h, const at::Tensor& grad_h) {
  check_tensor(op, "h", h, 3, u);
  check_tensor(op, "grad_h", grad_h, 3, u);
  if (h0) check_tensor(op, "h0", *h0, 2, u);
  NewtonTensors tensors;
  tensors.u = prepared(u), tensors.params = params, tensors.h0 = h0 ? prepared(*h0) : at::Tensor();
  tensors.h = prepared(h), tensors.grad_h = prepared(grad_h);
  tensors.du = at::empty(u.sizes(), tensors.u.options());
  long param_count = 0;
  for (const at::Tensor& p : params) param_count += p.numel();
  tensors.dparams = at::empty({param_count}, tensors.u.options());
  tensors.dh0 = at::empty({h.size(0), h.size(2)}, tensors.u.options());
  dispatch_float(tensors.u.scalar_type(), [&](auto zero) { newton_gradients<MakeCell, decltype(zero)>(op, tensors, {}); });
  // dparams holds the parameters' slots in order (a's rows, then p's); each gradient gets its own
  // storage (copy = true): outputs of an operator must not alias each other.
  std::vector<at::Tensor> result{tensors.du.to(u.scalar_type())};
  long offset = 0;
  for (const at::Tensor& p : params) {
    result.push_back(tensors.dparams.narrow(0, offset, p.numel()).view(p.sizes()).to(u.scalar_type(), false, true));
    offset += p.numel();
  }
  result.push_back(tensors.dh0.to(u.scalar_type()));
  return result;
}

constexpr const char* gru_op = "paraseq::para_gru";
constexpr const char* lstm_op = "paraseq::para_lstm";
constexpr const char* gru_backward_op = "paraseq::para_gru_backward";
constexpr const char* lstm_backward_op = "paraseq::para_lstm_backward";

} // namespace

std::tuple<at::Tensor, at::Tensor> para_gru(const at::Tensor& u, const at::Tensor& a, const std::optional<at::Tensor>& h0,
                                            int64_t max_iters, double omega, std::optional<double> residual_atol,
                                            std::optional<double> residual_fail, int64_t picard_iters, bool picard_adapt,
                                            const std::string& scan_backend, bool with_residual) {
  check_tensor(gru_op, "u", u, 3, u);
  const auto params = prepared_params(gru_op, u, {"a"}, {a});
  if (h0) check_tensor(gru_op, "h0", *h0, 2, u);
  const NewtonConfig config =
      newton_config(gru_op, max_iters, omega, residual_atol, residual_fail, picard_iters, picard_adapt, scan_backend);
  return solve<MakeGru>(gru_op, u, params, h0, a.size(1), config, with_residual);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> para_gru_backward(const at::Tensor& u, const at::Tensor& a,
                                                                 const std::optional<at::Tensor>& h0, const at::Tensor& h,
                                                                 const at::Tensor& grad_h) {
  check_tensor(gru_backward_op, "u", u, 3, u);
  const auto params = prepared_params(gru_backward_op, u, {"a"}, {a});
  const auto grads = gradients<MakeGru>(gru_backward_op, u, params, h0, h, grad_h);
  return {grads[0], grads[1], grads[2]};
}

std::tuple<at::Tensor, at::Tensor> para_lstm(const at::Tensor& u, const at::Tensor& a, const at::Tensor& p,
                                             const std::optional<at::Tensor>& state0, int64_t max_iters, double omega,
                                             std::optional<double> residual_atol, std::optional<double> residual_fail,
                                             int64_t picard_iters, bool picard_adapt, const std::string& scan_backend,
                                             bool with_residual) {
  check_tensor(lstm_op, "u", u, 3, u);
  const auto params = prepared_params(lstm_op, u, {"a", "p"}, {a, p});
  if (state0) check_tensor(lstm_op, "state0", *state0, 2, u);
  const NewtonConfig config =
      newton_config(lstm_op, max_iters, omega, residual_atol, residual_fail, picard_iters, picard_adapt, scan_backend);
  return solve<MakeLstm>(lstm_op, u, params, state0, 2 * a.size(1), config, with_residual);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>
para_lstm_backward(const at::Tensor& u, const at::Tensor& a, const at::Tensor& p, const std::optional<at::Tensor>& state0,
                   const at::Tensor& state, const at::Tensor& grad_state) {
  check_tensor(lstm_backward_op, "u", u, 3, u);
  const auto params = prepared_params(lstm_backward_op, u, {"a", "p"}, {a, p});
  const auto grads = gradients<MakeLstm>(lstm_backward_op, u, params, state0, state, grad_state);
  return {grads[0], grads[1], grads[2], grads[3]};
}

} // namespace paraseq::torch_bridge
