// paraseq::para_gru, para_lstm and their backward: newton_solve and newton_backward
// (solvers/newton.hpp, solvers/newton_backward.hpp) with the cells of solvers/cells.hpp.
#include "runtime.hpp"

#include <paraseq/solvers/cells.hpp>
#include <paraseq/solvers/newton.hpp>
#include <paraseq/solvers/newton_backward.hpp>

#include <ATen/ops/empty.h>
#include <torch/library.h>

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

// The cells over the prepared parameter tensors: ParaGRU (a) or ParaLSTM (a, p).
struct MakeGru {
  template <class T, class Space>
  auto operator()(const std::vector<at::Tensor>& params) const {
    return ParaGRU<T, typename Space::memory_space>{as_view<const T, 2, Space>(params[0])};
  }
};
struct MakeLstm {
  template <class T, class Space>
  auto operator()(const std::vector<at::Tensor>& params) const {
    return ParaLSTM<T, typename Space::memory_space>{as_view<const T, 2, Space>(params[0]),
                                                     as_view<const T, 2, Space>(params[1])};
  }
};

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
std::tuple<at::Tensor, at::Tensor> newton_forward(const char* op, const at::Tensor& u, const std::vector<at::Tensor>& params,
                                                  const std::optional<at::Tensor>& h0, int64_t state_size,
                                                  const NewtonConfig& config, bool with_residual) {
  const at::Tensor u_c = prepared(u), h0_c = h0 ? prepared(*h0) : at::Tensor();
  at::Tensor h = at::empty({u.size(0), u.size(1), state_size}, u_c.options());
  at::Tensor residual = at::empty({with_residual ? u.size(0) : 0}, u.options().dtype(at::kDouble));
  with_space(op, u, [&](const auto& space) {
    using Space = std::decay_t<decltype(space)>;
    using Mem = typename Space::memory_space;
    dispatch_float(u_c.scalar_type(), [&](auto zero) {
      using T = decltype(zero);
      const auto cell = MakeCell{}.template operator()<T, Space>(params);
      const auto u_view = as_view<const T, 3, Space>(u_c);
      const auto h_view = as_view<T, 3, Space>(h);
      NewtonStats<Mem> stats;
      NewtonStats<Mem>* stats_ptr = with_residual ? &stats : nullptr;
      translate_errors([&] {
        try {
          if (h0) newton_solve(space, cell, u_view, h_view, config, as_view<const T, 2, Space>(h0_c), stats_ptr);
          else newton_solve(space, cell, u_view, h_view, config, ZeroInitialState{}, stats_ptr);
        } catch (const NewtonDivergenceError& error) { // the Python package raises paraseq.NewtonDivergenceError
          TORCH_CHECK(false, "NewtonDivergenceError: ", error.what());
        }
      });
      if (with_residual) Kokkos::deep_copy(space, as_view<double, 1, Space>(residual), stats.residual);
    });
  });
  return {h.to(u.scalar_type()), residual};
}

// Returns (du, dparams as [rows, H] each, dh0).
template <class MakeCell>
std::vector<at::Tensor> newton_gradients(const char* op, const at::Tensor& u, const std::vector<at::Tensor>& params,
                                         const std::optional<at::Tensor>& h0, const at::Tensor& h,
                                         const at::Tensor& grad_h) {
  check_tensor(op, "h", h, 3, u);
  check_tensor(op, "grad_h", grad_h, 3, u);
  if (h0) check_tensor(op, "h0", *h0, 2, u);
  const at::Tensor u_c = prepared(u), h_c = prepared(h), g_c = prepared(grad_h), h0_c = h0 ? prepared(*h0) : at::Tensor();
  at::Tensor du = at::empty(u.sizes(), u_c.options());
  long param_count = 0;
  for (const at::Tensor& p : params) param_count += p.numel();
  at::Tensor dparams = at::empty({param_count}, u_c.options());
  at::Tensor dh0 = at::empty({h.size(0), h.size(2)}, u_c.options());
  with_space(op, u, [&](const auto& space) {
    using Space = std::decay_t<decltype(space)>;
    dispatch_float(u_c.scalar_type(), [&](auto zero) {
      using T = decltype(zero);
      const auto cell = MakeCell{}.template operator()<T, Space>(params);
      const auto u_view = as_view<const T, 3, Space>(u_c);
      // Writable only because newton_backward checks h with newton_solve's checks; it reads it.
      const auto h_view = as_view<T, 3, Space>(h_c);
      const auto g_view = as_view<const T, 3, Space>(g_c);
      const auto du_view = as_view<T, 3, Space>(du);
      const auto dp_view = as_view<T, 1, Space>(dparams);
      const auto dh0_view = as_view<T, 2, Space>(dh0);
      translate_errors([&] {
        if (h0) newton_backward(space, cell, u_view, h_view, g_view, du_view, dp_view, as_view<const T, 2, Space>(h0_c), dh0_view);
        else newton_backward(space, cell, u_view, h_view, g_view, du_view, dp_view, ZeroInitialState{}, dh0_view);
      });
    });
  });
  // dparams holds the parameters' slots in order (a's rows, then p's); each gradient gets its own
  // storage (copy = true): outputs of an operator must not alias each other.
  std::vector<at::Tensor> result{du.to(u.scalar_type())};
  long offset = 0;
  for (const at::Tensor& p : params) {
    result.push_back(dparams.narrow(0, offset, p.numel()).view(p.sizes()).to(u.scalar_type(), false, true));
    offset += p.numel();
  }
  result.push_back(dh0.to(u.scalar_type()));
  return result;
}

constexpr const char* gru_op = "paraseq::para_gru";
constexpr const char* lstm_op = "paraseq::para_lstm";
constexpr const char* gru_backward_op = "paraseq::para_gru_backward";
constexpr const char* lstm_backward_op = "paraseq::para_lstm_backward";

std::tuple<at::Tensor, at::Tensor> para_gru(const at::Tensor& u, const at::Tensor& a, const std::optional<at::Tensor>& h0,
                                            int64_t max_iters, double omega, std::optional<double> residual_atol,
                                            std::optional<double> residual_fail, int64_t picard_iters, bool picard_adapt,
                                            const std::string& scan_backend, bool with_residual) {
  check_tensor(gru_op, "u", u, 3, u);
  const auto params = prepared_params(gru_op, u, {"a"}, {a});
  if (h0) check_tensor(gru_op, "h0", *h0, 2, u);
  const NewtonConfig config =
      newton_config(gru_op, max_iters, omega, residual_atol, residual_fail, picard_iters, picard_adapt, scan_backend);
  return newton_forward<MakeGru>(gru_op, u, params, h0, a.size(1), config, with_residual);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> para_gru_backward(const at::Tensor& u, const at::Tensor& a,
                                                                 const std::optional<at::Tensor>& h0, const at::Tensor& h,
                                                                 const at::Tensor& grad_h) {
  check_tensor(gru_backward_op, "u", u, 3, u);
  const auto params = prepared_params(gru_backward_op, u, {"a"}, {a});
  const auto grads = newton_gradients<MakeGru>(gru_backward_op, u, params, h0, h, grad_h);
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
  return newton_forward<MakeLstm>(lstm_op, u, params, state0, 2 * a.size(1), config, with_residual);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>
para_lstm_backward(const at::Tensor& u, const at::Tensor& a, const at::Tensor& p, const std::optional<at::Tensor>& state0,
                   const at::Tensor& state, const at::Tensor& grad_state) {
  check_tensor(lstm_backward_op, "u", u, 3, u);
  const auto params = prepared_params(lstm_backward_op, u, {"a", "p"}, {a, p});
  const auto grads = newton_gradients<MakeLstm>(lstm_backward_op, u, params, state0, state, grad_state);
  return {grads[0], grads[1], grads[2], grads[3]};
}

} // namespace

TORCH_LIBRARY_IMPL(paraseq, CPU, m) {
  m.impl("para_gru", &para_gru);
  m.impl("para_gru_backward", &para_gru_backward);
  m.impl("para_lstm", &para_lstm);
  m.impl("para_lstm_backward", &para_lstm_backward);
}
#ifdef KOKKOS_ENABLE_CUDA
TORCH_LIBRARY_IMPL(paraseq, CUDA, m) {
  m.impl("para_gru", &para_gru);
  m.impl("para_gru_backward", &para_gru_backward);
  m.impl("para_lstm", &para_lstm);
  m.impl("para_lstm_backward", &para_lstm_backward);
}
#endif

} // namespace paraseq::torch_bridge
