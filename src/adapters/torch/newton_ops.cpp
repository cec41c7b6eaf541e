// paraseq::para_gru, para_lstm and their backward: argument checks and outputs (newton_ops.hpp).
#include "kernels.hpp"
#include "newton_ops.hpp"

#include <ATen/ops/empty.h>

#include <limits>
#include <optional>
#include <tuple>
#include <vector>

namespace paraseq::torch_bridge {
namespace {

// An integer setting as the int the solver holds: refused, not truncated, when it does not fit.
int int_setting(const char* op, const char* name, int64_t value) {
  TORCH_CHECK_VALUE(value >= 0 && value <= std::numeric_limits<int>::max(), op, ": argument '", name, "' is ", value,
                    ", expected 0 <= ", name, " <= 2147483647 (2^31 - 1)");
  return int(value);
}

// A residual threshold: None, or a number >= 0 (NaN would refuse or accept everything).
std::optional<double> threshold_setting(const char* op, const char* name, std::optional<double> value) {
  TORCH_CHECK_VALUE(!value || *value >= 0, op, ": argument '", name, "' is ", *value, ", expected None or a number >= 0");
  return value;
}

// The solve's mode by its name: the names of NewtonMode, "auto" for automatic (a C++ keyword) and
// "scan", the former name of "newton", still accepted.
NewtonMode newton_mode(const char* op, const std::string& scan_backend) {
  if (scan_backend == "auto" || scan_backend == "automatic") return NewtonMode::automatic;
  if (scan_backend == "newton" || scan_backend == "scan") return NewtonMode::newton;
  if (scan_backend == "fused") return NewtonMode::fused;
  TORCH_CHECK_VALUE(scan_backend == "sequential", op, ": argument 'scan_backend' is \"", scan_backend,
                    "\", expected \"auto\", \"newton\", \"fused\" or \"sequential\" (\"scan\" is the former name of \"newton\")");
  return NewtonMode::sequential;
}

NewtonConfig newton_config(const char* op, int64_t max_iters, double omega, std::optional<double> residual_atol,
                           std::optional<double> residual_fail, int64_t picard_iters, bool picard_adapt,
                           const std::string& scan_backend) {
  NewtonConfig config;
  config.max_iters = int_setting(op, "max_iters", max_iters);
  TORCH_CHECK_VALUE(omega > 0 && omega <= 1, op, ": argument 'omega' is ", omega, ", expected 0 < omega <= 1");
  config.omega = omega;
  config.residual_atol = threshold_setting(op, "residual_atol", residual_atol);
  config.residual_fail = threshold_setting(op, "residual_fail", residual_fail);
  config.picard_iters = int_setting(op, "picard_iters", picard_iters);
  config.picard_adapt = picard_adapt;
  config.mode = newton_mode(op, scan_backend);
  return config;
}

// The cells' shapes, checked here so that errors name the operator's arguments: u [B, T, 3H],
// the parameters [rows, H] (a: 3 rows, p: 2), the state [B, T, S] (S = H for ParaGRU, 2H for
// ParaLSTM) and its initial value [B, S].
struct CellShapes {
  const char* op;
  const at::Tensor& u;
  int64_t hidden_size, state_size;
  const char* state_layout; // how the state's channels are laid out, for messages

  void check_param(const char* name, const at::Tensor& param, int64_t rows) const {
    TORCH_CHECK_VALUE(param.size(0) == rows && param.size(1) == hidden_size, op, ": argument '", name, "' has shape ",
                      param.sizes(), ", expected [", rows, ", H] = [", rows, ", ", hidden_size,
                      "] (H from argument 'a')");
  }
  void check_u() const {
    TORCH_CHECK_VALUE(u.size(2) == 3 * hidden_size, op, ": argument 'u' has shape ", u.sizes(),
                      ", expected [B, T, 3H] = [B, T, ", 3 * hidden_size, "] (H = ", hidden_size, " from argument 'a')");
  }
  void check_initial(const char* name, const at::Tensor& initial) const {
    check_tensor(op, name, initial, 2, u);
    TORCH_CHECK_VALUE(initial.size(0) == u.size(0) && initial.size(1) == state_size, op, ": argument '", name,
                      "' has shape ", initial.sizes(), ", expected [B, ", state_layout, "] = [", u.size(0), ", ",
                      state_size, "] (B from argument 'u')");
  }
  void check_states(const char* name, const at::Tensor& states) const {
    check_tensor(op, name, states, 3, u);
    TORCH_CHECK_VALUE(states.size(0) == u.size(0) && states.size(1) == u.size(1) && states.size(2) == state_size, op,
                      ": argument '", name, "' has shape ", states.sizes(), ", expected [B, T, ", state_layout, "] = [",
                      u.size(0), ", ", u.size(1), ", ", state_size, "] (B, T from argument 'u')");
  }
};

// Checks u and the parameters of a ParaGRU (params {a}) or ParaLSTM (params {a, p}) operator.
CellShapes checked_cell(const char* op, const at::Tensor& u, const std::vector<const char*>& names,
                        const std::vector<at::Tensor>& params) {
  check_tensor(op, "u", u, 3, u);
  for (std::size_t k = 0; k < params.size(); ++k) check_tensor(op, names[k], params[k], 2, u);
  const bool lstm = params.size() == 2;
  const CellShapes shapes{op, u, params[0].size(1), (lstm ? 2 : 1) * params[0].size(1),
                          lstm ? "2H (channels (c, h) interleaved)" : "H"};
  shapes.check_param("a", params[0], 3);
  if (lstm) shapes.check_param("p", params[1], 2);
  shapes.check_u();
  return shapes;
}

// The recurrent parameters, prepared (contiguous, compute type).
std::vector<at::Tensor> prepared_params(const std::vector<at::Tensor>& params) {
  std::vector<at::Tensor> result;
  for (const at::Tensor& param : params) result.push_back(prepared(param));
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

// Returns (du, dparams as [rows, H] each, dh0); h and grad_h are checked by the caller.
template <class MakeCell>
std::vector<at::Tensor> gradients(const char* op, const at::Tensor& u, const std::vector<at::Tensor>& params,
                                  const std::optional<at::Tensor>& h0, const at::Tensor& h, const at::Tensor& grad_h) {
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
  const CellShapes shapes = checked_cell(gru_op, u, {"a"}, {a});
  if (h0) shapes.check_initial("h0", *h0);
  const auto params = prepared_params({a});
  const NewtonConfig config =
      newton_config(gru_op, max_iters, omega, residual_atol, residual_fail, picard_iters, picard_adapt, scan_backend);
  return solve<MakeGru>(gru_op, u, params, h0, a.size(1), config, with_residual);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> para_gru_backward(const at::Tensor& u, const at::Tensor& a,
                                                                 const std::optional<at::Tensor>& h0, const at::Tensor& h,
                                                                 const at::Tensor& grad_h) {
  const CellShapes shapes = checked_cell(gru_backward_op, u, {"a"}, {a});
  if (h0) shapes.check_initial("h0", *h0);
  shapes.check_states("h", h);
  shapes.check_states("grad_h", grad_h);
  const auto params = prepared_params({a});
  const auto grads = gradients<MakeGru>(gru_backward_op, u, params, h0, h, grad_h);
  return {grads[0], grads[1], grads[2]};
}

std::tuple<at::Tensor, at::Tensor> para_lstm(const at::Tensor& u, const at::Tensor& a, const at::Tensor& p,
                                             const std::optional<at::Tensor>& state0, int64_t max_iters, double omega,
                                             std::optional<double> residual_atol, std::optional<double> residual_fail,
                                             int64_t picard_iters, bool picard_adapt, const std::string& scan_backend,
                                             bool with_residual) {
  const CellShapes shapes = checked_cell(lstm_op, u, {"a", "p"}, {a, p});
  if (state0) shapes.check_initial("state0", *state0);
  const auto params = prepared_params({a, p});
  const NewtonConfig config =
      newton_config(lstm_op, max_iters, omega, residual_atol, residual_fail, picard_iters, picard_adapt, scan_backend);
  return solve<MakeLstm>(lstm_op, u, params, state0, 2 * a.size(1), config, with_residual);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>
para_lstm_backward(const at::Tensor& u, const at::Tensor& a, const at::Tensor& p, const std::optional<at::Tensor>& state0,
                   const at::Tensor& state, const at::Tensor& grad_state) {
  const CellShapes shapes = checked_cell(lstm_backward_op, u, {"a", "p"}, {a, p});
  if (state0) shapes.check_initial("state0", *state0);
  shapes.check_states("state", state);
  shapes.check_states("grad_state", grad_state);
  const auto params = prepared_params({a, p});
  const auto grads = gradients<MakeLstm>(lstm_backward_op, u, params, state0, state, grad_state);
  return {grads[0], grads[1], grads[2], grads[3]};
}

} // namespace paraseq::torch_bridge
