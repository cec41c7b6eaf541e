#pragma once
// The kernels of the paraseq operators, the PyTorch half of each (work.hpp): scan_ops.cpp,
// newton_ops.cpp, odeint_forward.cpp, odeint_backward.cpp, with the runtime's functions of
// work.hpp. library.cpp registers every one of them for the CPU and, when Kokkos has CUDA, for
// CUDA: each runs on the space of its tensors' device. No Kokkos header (see work.hpp).

#include "work.hpp"

#include <ATen/core/Tensor.h>
#include <c10/util/ArrayRef.h>

#include <cstdint>
#include <optional>
#include <string>
#include <tuple>

namespace paraseq::torch_bridge {

at::Tensor linear_scan(const at::Tensor& A, const at::Tensor& b, const std::optional<at::Tensor>& h0,
                       const std::string& structure, bool reverse);

// config: the packed NewtonConfig of the schema (work.hpp, PackedNewtonConfig).
// Returns (h, residual, stats), as the schema in library.cpp describes.
std::tuple<at::Tensor, at::Tensor, at::Tensor> para_gru(const at::Tensor& u, const at::Tensor& a,
                                                        const std::optional<at::Tensor>& h0, c10::ArrayRef<double> config,
                                                        bool with_residual);
std::tuple<at::Tensor, at::Tensor, at::Tensor> para_gru_backward(const at::Tensor& u, const at::Tensor& a,
                                                                 const std::optional<at::Tensor>& h0, const at::Tensor& h,
                                                                 const at::Tensor& grad_h);
// The head-block ParaGRU: a [3, n_heads, d_head, d_head], otherwise as para_gru.
std::tuple<at::Tensor, at::Tensor, at::Tensor> para_gru_head(const at::Tensor& u, const at::Tensor& a,
                                                             const std::optional<at::Tensor>& h0,
                                                             c10::ArrayRef<double> config, bool with_residual);
std::tuple<at::Tensor, at::Tensor, at::Tensor> para_gru_head_backward(const at::Tensor& u, const at::Tensor& a,
                                                                      const std::optional<at::Tensor>& h0,
                                                                      const at::Tensor& h, const at::Tensor& grad_h);
std::tuple<at::Tensor, at::Tensor, at::Tensor> para_lstm(const at::Tensor& u, const at::Tensor& a, const at::Tensor& p,
                                                         const std::optional<at::Tensor>& state0,
                                                         c10::ArrayRef<double> config, bool with_residual);
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>
para_lstm_backward(const at::Tensor& u, const at::Tensor& a, const at::Tensor& p, const std::optional<at::Tensor>& state0,
                   const at::Tensor& state, const at::Tensor& grad_state);
// ParaSLSTM: u [B, T, 4H] (i, f, z, o), r [4, H], state [B, T, 4H] with each channel's (c, n, m, h) together.
std::tuple<at::Tensor, at::Tensor, at::Tensor> para_slstm(const at::Tensor& u, const at::Tensor& r,
                                                          const std::optional<at::Tensor>& state0, double eps,
                                                          c10::ArrayRef<double> config, bool with_residual);
std::tuple<at::Tensor, at::Tensor, at::Tensor> para_slstm_backward(const at::Tensor& u, const at::Tensor& r,
                                                                   const std::optional<at::Tensor>& state0,
                                                                   const at::Tensor& state, const at::Tensor& grad_state,
                                                                   double eps);

at::Tensor odeint(const std::string& field, const at::Tensor& y0, const at::Tensor& t,
                  const std::optional<at::Tensor>& params, const std::optional<at::Tensor>& shared, int64_t mlp_hidden,
                  const std::string& method, std::optional<double> step_size, double rtol, double atol,
                  int64_t max_steps);
// odeint and each trajectory's accepted steps (int32 [N]), which odeint_backward takes (the
// autograd kernel of odeint calls this one when a gradient will be needed).
std::tuple<at::Tensor, at::Tensor> odeint_with_steps(const std::string& field, const at::Tensor& y0, const at::Tensor& t,
                                                     const std::optional<at::Tensor>& params,
                                                     const std::optional<at::Tensor>& shared, int64_t mlp_hidden,
                                                     const std::string& method, std::optional<double> step_size,
                                                     double rtol, double atol, int64_t max_steps);
std::tuple<at::Tensor, at::Tensor, at::Tensor>
odeint_backward(const std::string& field, const at::Tensor& y0, const at::Tensor& t,
                const std::optional<at::Tensor>& params, const std::optional<at::Tensor>& shared, int64_t mlp_hidden,
                const std::string& method, std::optional<double> step_size, double rtol, double atol, int64_t max_steps,
                const at::Tensor& grad_y, const std::optional<at::Tensor>& accepted);

} // namespace paraseq::torch_bridge
