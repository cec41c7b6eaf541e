// paraseq::para_gru, para_gru_head, para_lstm, para_slstm and their backward: argument checks and outputs
// (newton_ops.hpp).
#include "kernels.hpp"
#include "newton_ops.hpp"

#include <ATen/ops/empty.h>

#include <cmath>
#include <limits>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

namespace paraseq::torch_bridge {
namespace {

// The entries of the packed config by field name, in layout order (newton_ops.hpp).
constexpr const char* newton_config_fields[newton_config_layout_size] = {
    "version",      "max_iters",    "omega",        "residual_atol", "residual_fail",
    "picard_iters", "picard_adapt", "scan_backend", "jacobian"};

// An entry as given: whole numbers in full (2147483648, not 2.14748e+09), others as streams print them.
std::string entry_text(double value) {
  if (value == std::trunc(value) && std::abs(value) < 1e15) return std::to_string(int64_t(value));
  return c10::str(value);
}

// Reads the entries of one packed config, each error naming the entry and its field.
struct PackedConfig {
  const char* op;
  c10::ArrayRef<double> entries;

  [[noreturn]] void refuse(int index, const char* expected) const {
    TORCH_CHECK_VALUE(false, op, ": argument 'config' has entry ", index, " (", newton_config_fields[index], ") = ",
                      entry_text(entries[index]), ", expected ", expected, " (paraseq.NewtonConfig layout version ",
                      newton_config_layout_version, ")");
  }
  // A whole number in [low, high] as an int: refused, not truncated.
  int integer(int index, double low, double high, const char* expected) const {
    const double value = entries[index];
    if (!(value >= low && value <= high && value == double(int64_t(value)))) refuse(index, expected);
    return int(value);
  }
  // A residual threshold: -1 for None, or a number >= 0 (NaN would refuse or accept everything).
  std::optional<double> threshold(int index) const {
    const double value = entries[index];
    if (value == -1) return std::nullopt;
    if (!(value >= 0)) refuse(index, "-1 (None) or a number >= 0");
    return value;
  }
};

} // namespace

NewtonConfig newton_config_from_list(const char* op, c10::ArrayRef<double> config) {
  TORCH_CHECK_VALUE(config.size() == newton_config_layout_size, op, ": argument 'config' has ", config.size(),
                    " entries, expected ", newton_config_layout_size, " (paraseq.NewtonConfig layout version ",
                    newton_config_layout_version, ": version, max_iters, omega, residual_atol, residual_fail, "
                    "picard_iters, picard_adapt, scan_backend, jacobian)");
  const PackedConfig packed{op, config};
  const double version = config[0];
  TORCH_CHECK_VALUE(version == newton_config_layout_version, op, ": argument 'config' has layout version ",
                    entry_text(version), ", expected ", newton_config_layout_version,
                    " (a config packed by another version of the paraseq Python package than this operator library's)");
  constexpr double int_max = std::numeric_limits<int>::max();
  constexpr const char* count = "an integer with 0 <= value <= 2147483647 (2^31 - 1)";
  NewtonConfig result;
  result.max_iters = packed.integer(1, 0, int_max, count);
  result.omega = config[2];
  if (!(result.omega > 0 && result.omega <= 1)) packed.refuse(2, "0 < omega <= 1");
  result.residual_atol = packed.threshold(3);
  result.residual_fail = packed.threshold(4);
  result.picard_iters = packed.integer(5, 0, int_max, count);
  result.picard_adapt = packed.integer(6, 0, 1, "0 (False) or 1 (True)") == 1;
  result.mode = scan_backend_modes[packed.integer(
      7, 0, 4, "0 (\"auto\"), 1 (\"newton\"), 2 (\"fused\"), 3 (\"sequential\") or 4 (\"one_pass\")")];
  // The solver refuses the fused mode with the quasi Jacobian itself (newton.hpp, check_newton_config).
  result.jacobian = packed.integer(8, 0, 1, "0 (\"exact\") or 1 (\"quasi\")") == 1 ? NewtonJacobian::quasi
                                                                                     : NewtonJacobian::exact;
  return result;
}

namespace {

// The cells' shapes, checked here so that errors name the operator's arguments: u [B, T, gates x H]
// (3 gates; ParaSLSTM 4), the parameters [rows, H] (a: 3 rows, p: 2; ParaSLSTM's r: 4), the state
// [B, T, S] (S = H for ParaGRU, 2H for ParaLSTM, 4H for ParaSLSTM) and its initial value [B, S].
struct CellShapes {
  const char* op;
  const at::Tensor& u;
  int64_t hidden_size, state_size;
  const char* state_layout;       // how the state's channels are laid out, for messages
  int64_t gates = 3;              // u's columns per channel
  const char* hidden_from = "a";  // the argument that gives H, for messages

  void check_param(const char* name, const at::Tensor& param, int64_t rows) const {
    TORCH_CHECK_VALUE(param.size(0) == rows && param.size(1) == hidden_size, op, ": argument '", name, "' has shape ",
                      param.sizes(), ", expected [", rows, ", H] = [", rows, ", ", hidden_size, "] (H from argument '",
                      hidden_from, "')");
  }
  void check_u() const {
    TORCH_CHECK_VALUE(u.size(2) == gates * hidden_size, op, ": argument 'u' has shape ", u.sizes(), ", expected [B, T, ",
                      gates, "H] = [B, T, ", gates * hidden_size, "] (H = ", hidden_size, " from argument '",
                      hidden_from, "')");
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

// Checks u and a [3, n_heads, d_head, d_head] of a head-block ParaGRU operator; its state is [B, T, H],
// H = n_heads x d_head.
CellShapes checked_head_cell(const char* op, const at::Tensor& u, const at::Tensor& a) {
  check_tensor(op, "u", u, 3, u);
  check_tensor(op, "a", a, 4, u);
  constexpr int64_t max_head = ParaGRUHeads<float>::max_head_size;
  TORCH_CHECK_VALUE(a.size(0) == 3 && a.size(1) >= 1 && a.size(2) == a.size(3) && a.size(2) >= 2 && a.size(2) <= max_head,
                    op, ": argument 'a' has shape ", a.sizes(),
                    ", expected [3, n_heads, d_head, d_head] (A_z, A_r, A_c per head) with n_heads >= 1 and 2 <= d_head <= ",
                    max_head);
  const CellShapes shapes{op, u, a.size(1) * a.size(2), a.size(1) * a.size(2), "H"};
  TORCH_CHECK_VALUE(u.size(2) == 3 * shapes.hidden_size, op, ": argument 'u' has shape ", u.sizes(),
                    ", expected [B, T, 3H] = [B, T, ", 3 * shapes.hidden_size, "] (H = n_heads x d_head = ",
                    shapes.hidden_size, " from argument 'a')");
  return shapes;
}

// Checks u [B, T, 4H], r [4, H] (r_i, r_f, r_z, r_o) and eps of a ParaSLSTM operator; its state is
// [B, T, 4H], each channel's (c, n, m, h) together.
CellShapes checked_slstm_cell(const char* op, const at::Tensor& u, const at::Tensor& r, double eps) {
  check_tensor(op, "u", u, 3, u);
  check_tensor(op, "r", r, 2, u);
  const CellShapes shapes{op, u, r.size(1), 4 * r.size(1), "4H (each channel's (c, n, m, h) together)", 4, "r"};
  shapes.check_param("r", r, 4);
  shapes.check_u();
  TORCH_CHECK_VALUE(eps > 0 && eps <= std::numeric_limits<double>::max(), op, ": argument 'eps' is ", eps,
                    ", expected a finite number > 0 (h' = o c' / (n' + eps))");
  return shapes;
}

// The recurrent parameters, prepared (contiguous, compute type).
std::vector<at::Tensor> prepared_params(const std::vector<at::Tensor>& params) {
  std::vector<at::Tensor> result;
  for (const at::Tensor& param : params) result.push_back(prepared(param));
  return result;
}

template <class MakeCell>
std::tuple<at::Tensor, at::Tensor, at::Tensor> solve(const char* op, const at::Tensor& u,
                                                     const std::vector<at::Tensor>& params,
                                                     const std::optional<at::Tensor>& h0, int64_t state_size,
                                                     const NewtonConfig& config, bool with_residual, double eps = 0) {
  NewtonTensors tensors;
  tensors.u = prepared(u), tensors.params = params, tensors.h0 = h0 ? prepared(*h0) : at::Tensor();
  tensors.eps = eps;
  tensors.h = at::empty({u.size(0), u.size(1), state_size}, tensors.u.options());
  tensors.residual = at::empty({with_residual ? u.size(0) : 0}, u.options().dtype(at::kDouble));
  tensors.stats = at::empty({with_residual ? 2 : 0}, u.options().dtype(at::kLong));
  dispatch_float(tensors.u.scalar_type(), [&](auto zero) { newton_forward<MakeCell, decltype(zero)>(op, tensors, config); });
  return {tensors.h.to(u.scalar_type()), tensors.residual, tensors.stats};
}

// Returns (du, dparams in each parameter's shape, dh0); h and grad_h are checked by the caller.
template <class MakeCell>
std::vector<at::Tensor> gradients(const char* op, const at::Tensor& u, const std::vector<at::Tensor>& params,
                                  const std::optional<at::Tensor>& h0, const at::Tensor& h, const at::Tensor& grad_h,
                                  double eps = 0) {
  NewtonTensors tensors;
  tensors.u = prepared(u), tensors.params = params, tensors.h0 = h0 ? prepared(*h0) : at::Tensor();
  tensors.eps = eps;
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
constexpr const char* gru_head_op = "paraseq::para_gru_head";
constexpr const char* gru_head_backward_op = "paraseq::para_gru_head_backward";
constexpr const char* lstm_op = "paraseq::para_lstm";
constexpr const char* gru_backward_op = "paraseq::para_gru_backward";
constexpr const char* lstm_backward_op = "paraseq::para_lstm_backward";
constexpr const char* slstm_op = "paraseq::para_slstm";
constexpr const char* slstm_backward_op = "paraseq::para_slstm_backward";

} // namespace

std::tuple<at::Tensor, at::Tensor, at::Tensor> para_gru(const at::Tensor& u, const at::Tensor& a,
                                                        const std::optional<at::Tensor>& h0, c10::ArrayRef<double> config,
                                                        bool with_residual) {
  const CellShapes shapes = checked_cell(gru_op, u, {"a"}, {a});
  if (h0) shapes.check_initial("h0", *h0);
  const NewtonConfig solver_config = newton_config_from_list(gru_op, config);
  const auto params = prepared_params({a});
  return solve<MakeGru>(gru_op, u, params, h0, a.size(1), solver_config, with_residual);
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

std::tuple<at::Tensor, at::Tensor, at::Tensor> para_gru_head(const at::Tensor& u, const at::Tensor& a,
                                                             const std::optional<at::Tensor>& h0,
                                                             c10::ArrayRef<double> config, bool with_residual) {
  const CellShapes shapes = checked_head_cell(gru_head_op, u, a);
  if (h0) shapes.check_initial("h0", *h0);
  const NewtonConfig solver_config = newton_config_from_list(gru_head_op, config);
  const auto params = prepared_params({a});
  return solve<MakeGruHeads>(gru_head_op, u, params, h0, shapes.state_size, solver_config, with_residual);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> para_gru_head_backward(const at::Tensor& u, const at::Tensor& a,
                                                                      const std::optional<at::Tensor>& h0,
                                                                      const at::Tensor& h, const at::Tensor& grad_h) {
  const CellShapes shapes = checked_head_cell(gru_head_backward_op, u, a);
  if (h0) shapes.check_initial("h0", *h0);
  shapes.check_states("h", h);
  shapes.check_states("grad_h", grad_h);
  const auto params = prepared_params({a});
  const auto grads = gradients<MakeGruHeads>(gru_head_backward_op, u, params, h0, h, grad_h);
  return {grads[0], grads[1], grads[2]};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> para_lstm(const at::Tensor& u, const at::Tensor& a, const at::Tensor& p,
                                                         const std::optional<at::Tensor>& state0,
                                                         c10::ArrayRef<double> config, bool with_residual) {
  const CellShapes shapes = checked_cell(lstm_op, u, {"a", "p"}, {a, p});
  if (state0) shapes.check_initial("state0", *state0);
  const NewtonConfig solver_config = newton_config_from_list(lstm_op, config);
  const auto params = prepared_params({a, p});
  return solve<MakeLstm>(lstm_op, u, params, state0, 2 * a.size(1), solver_config, with_residual);
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

std::tuple<at::Tensor, at::Tensor, at::Tensor> para_slstm(const at::Tensor& u, const at::Tensor& r,
                                                          const std::optional<at::Tensor>& state0, double eps,
                                                          c10::ArrayRef<double> config, bool with_residual) {
  const CellShapes shapes = checked_slstm_cell(slstm_op, u, r, eps);
  if (state0) shapes.check_initial("state0", *state0);
  const NewtonConfig solver_config = newton_config_from_list(slstm_op, config);
  const auto params = prepared_params({r});
  return solve<MakeSlstm>(slstm_op, u, params, state0, shapes.state_size, solver_config, with_residual, eps);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> para_slstm_backward(const at::Tensor& u, const at::Tensor& r,
                                                                   const std::optional<at::Tensor>& state0,
                                                                   const at::Tensor& state, const at::Tensor& grad_state,
                                                                   double eps) {
  const CellShapes shapes = checked_slstm_cell(slstm_backward_op, u, r, eps);
  if (state0) shapes.check_initial("state0", *state0);
  shapes.check_states("state", state);
  shapes.check_states("grad_state", grad_state);
  const auto params = prepared_params({r});
  const auto grads = gradients<MakeSlstm>(slstm_backward_op, u, params, state0, state, grad_state, eps);
  return {grads[0], grads[1], grads[2]};
}

} // namespace paraseq::torch_bridge
