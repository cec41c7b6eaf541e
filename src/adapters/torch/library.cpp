// The operators of the paraseq namespace: their schemas, and their kernels (kernels.hpp) for the
// CPU and, when Kokkos has CUDA, for CUDA. Autograd kernels: autograd.cpp; fake kernels: python/paraseq/_ops.py.
// Part of the operators' PyTorch half (work.hpp): the C++ compiler builds it also where Kokkos has
// CUDA, and CMake then defines PARASEQ_TORCH_CUDA_KERNELS.
#include "kernels.hpp"

#include <torch/library.h>

TORCH_LIBRARY(paraseq, m) {
  // h_t = A_t h_{t-1} + b_t (reverse: lambda_t = A_{t+1}^T lambda_{t+1} + b_t). structure: "diag"
  // (A [B,T,N]), "block" (A [B,T,N/k,k,k], k = 2, 3 or 4) or "dense" (A [B,T,N,N], N <= 32).
  m.def("linear_scan(Tensor A, Tensor b, Tensor? h0, str structure, bool reverse) -> Tensor");
  // Newton solves of ParaGRU (state [B,T,H]) and ParaLSTM (state [B,T,2H], channels (c, h) interleaved)
  // from pre-projected inputs u [B,T,3H]. config: the solver settings packed in one list,
  // paraseq.NewtonConfig's layout (work.hpp, PackedNewtonConfig). residual: max |F| per
  // batch element ([B], float64) when with_residual, else empty; stats: [2] int64 on u's device
  // when with_residual, else empty: the Newton iterations run (the fused mode's most over its
  // windows) and the mode that ran as its scan_backend index (1 newton, 2 fused, 3 sequential).
  // A solve that fails the config's residual_fail check raises when with_residual is False; with
  // with_residual it returns, and the caller checks the residual (paraseq.newton_apply raises
  // paraseq.NewtonDivergenceError).
  m.def("para_gru(Tensor u, Tensor a, Tensor? h0, float[] config, bool with_residual) "
        "-> (Tensor h, Tensor residual, Tensor stats)");
  m.def("para_gru_backward(Tensor u, Tensor a, Tensor? h0, Tensor h, Tensor grad_h) "
        "-> (Tensor grad_u, Tensor grad_a, Tensor grad_h0)");
  // ParaGRU with head-block recurrence (ParaGRUHeads): a [3, n_heads, d_head, d_head] (A_z, A_r, A_c,
  // rows the input channel), 2 <= d_head <= 32, H = n_heads x d_head; otherwise as para_gru.
  m.def("para_gru_head(Tensor u, Tensor a, Tensor? h0, float[] config, bool with_residual) "
        "-> (Tensor h, Tensor residual, Tensor stats)");
  m.def("para_gru_head_backward(Tensor u, Tensor a, Tensor? h0, Tensor h, Tensor grad_h) "
        "-> (Tensor grad_u, Tensor grad_a, Tensor grad_h0)");
  m.def("para_lstm(Tensor u, Tensor a, Tensor p, Tensor? state0, float[] config, bool with_residual) "
        "-> (Tensor state, Tensor residual, Tensor stats)");
  m.def("para_lstm_backward(Tensor u, Tensor a, Tensor p, Tensor? state0, Tensor state, Tensor grad_state) "
        "-> (Tensor grad_u, Tensor grad_a, Tensor grad_p, Tensor grad_state0)");
  // ParaSLSTM (xLSTM's sLSTM, diagonal recurrence): u [B,T,4H] (pre-activations i, f, z, o), r [4,H]
  // (r_i, r_f, r_z, r_o, as applied: any clamp is the caller's), eps > 0 in h' = o c' / (n' + eps);
  // state [B,T,4H] with each channel's (c, n, m, h) together; otherwise as para_gru.
  m.def("para_slstm(Tensor u, Tensor r, Tensor? state0, float eps, float[] config, bool with_residual) "
        "-> (Tensor state, Tensor residual, Tensor stats)");
  m.def("para_slstm_backward(Tensor u, Tensor r, Tensor? state0, Tensor state, Tensor grad_state, float eps) "
        "-> (Tensor grad_u, Tensor grad_r, Tensor grad_state0)");
  // N trajectories of a built-in field observed at the times t: returns [N, len(t), n].
  // field: "damped_oscillator", "lotka_volterra", "sir", "linear_shared", "linear_own" or "mlp";
  // params [N, P] (own) and shared [Q] as in src/loops/fields.hpp; mlp_hidden for "mlp".
  // method: "euler", "heun", "rk4", "dopri5"; step_size fixes the steps, else euler and rk4 step on
  // the grid t and heun and dopri5 adapt with rtol and atol.
  // t: finite and strictly increasing. Sizes, max_steps and the step count must fit in 32 bits.
  m.def("odeint(str field, Tensor y0, Tensor t, Tensor? params, Tensor? shared, int mlp_hidden, str method, "
        "float? step_size, float rtol, float atol, int max_steps) -> Tensor");
  // odeint, and the accepted steps of each trajectory (int32 [N]): what odeint's autograd kernel
  // runs when a gradient will follow, so that odeint_backward does not count adaptive steps again.
  m.def("odeint_with_steps(str field, Tensor y0, Tensor t, Tensor? params, Tensor? shared, int mlp_hidden, "
        "str method, float? step_size, float rtol, float atol, int max_steps) -> (Tensor observed, Tensor accepted)");
  // Kokkos' configuration as text, for bug reports; no tensors, so one kernel serves every device.
  m.def("kokkos_configuration() -> str", &paraseq::torch_bridge::kokkos_configuration);
  // The bytes of paraseq's cached temporaries in every memory space, and their release (after a
  // fence): what paraseq holds outside PyTorch's caching allocator (docs/memory.md).
  m.def("workspace_bytes() -> int", &paraseq::torch_bridge::workspace_bytes);
  m.def("release_workspace() -> ()", &paraseq::torch_bridge::release_workspace);
  // accepted: odeint_with_steps' (the adaptive steps are then not counted again), or None.
  m.def("odeint_backward(str field, Tensor y0, Tensor t, Tensor? params, Tensor? shared, int mlp_hidden, "
        "str method, float? step_size, float rtol, float atol, int max_steps, Tensor grad_y, Tensor? accepted=None) "
        "-> (Tensor grad_y0, Tensor grad_params, Tensor grad_shared)");
}

namespace {

// Every kernel serves every device: it runs on the execution space of its tensors' device.
void register_kernels(torch::Library& m) {
  using namespace paraseq::torch_bridge;
  m.impl("linear_scan", &linear_scan);
  m.impl("para_gru", &para_gru);
  m.impl("para_gru_backward", &para_gru_backward);
  m.impl("para_gru_head", &para_gru_head);
  m.impl("para_gru_head_backward", &para_gru_head_backward);
  m.impl("para_lstm", &para_lstm);
  m.impl("para_lstm_backward", &para_lstm_backward);
  m.impl("para_slstm", &para_slstm);
  m.impl("para_slstm_backward", &para_slstm_backward);
  m.impl("odeint", &odeint);
  m.impl("odeint_with_steps", &odeint_with_steps);
  m.impl("odeint_backward", &odeint_backward);
}

} // namespace

TORCH_LIBRARY_IMPL(paraseq, CPU, m) { register_kernels(m); }
#ifdef PARASEQ_TORCH_CUDA_KERNELS
TORCH_LIBRARY_IMPL(paraseq, CUDA, m) { register_kernels(m); }
#endif
