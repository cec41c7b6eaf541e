#pragma once
// The operators' two halves and what passes between them. The PyTorch half (kernels.hpp: checks,
// outputs, registrations; tensors.hpp) includes no Kokkos header, and the Kokkos half (the work:
// runtime.hpp, scan_work.cpp, newton_solve.hpp, odeint_integrate.hpp) no PyTorch header, so that
// where Kokkos has CUDA only the work is compiled by nvcc (PyTorch's headers took it about 23 s of
// every unit on the 2-core development machine) and the rest by the C++ compiler. Between them:
// contiguous arrays in the compute type (a pointer and extents), the device the tensors are on with
// PyTorch's current stream there, and a function that allocates scratch bytes from PyTorch's
// allocator. Errors cross as std::invalid_argument and std::runtime_error, which the PyTorch half
// raises as ValueError and RuntimeError (translate_errors, tensors.hpp).

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace paraseq::torch_bridge {

// The device of an operator's tensors: the host, or CUDA device `index` with `stream`, PyTorch's
// current stream there (a cudaStream_t).
struct Place {
  bool cuda = false;
  int index = -1;
  void* stream = nullptr;
};

// A contiguous row-major array of rank `rank` (at most 5); rank < 0 for an absent optional argument.
struct Array {
  void* data = nullptr;
  int rank = -1;
  int64_t extents[5] = {};

  bool given() const { return rank >= 0; }
};

// `bytes` bytes of device (or host) memory on the call's device that live until the operator returns.
using AllocateBytes = std::function<void*(std::size_t bytes)>;

// The runtime (runtime.cpp): Kokkos' own description of its version, backends and build options
// (python -m paraseq.info); the bytes that paraseq's cached temporaries (core/workspace.hpp) hold
// in every memory space, and their release (paraseq.workspace_bytes, paraseq.release_workspace).
std::string kokkos_configuration();
int64_t workspace_bytes();
void release_workspace();

// ---- linear_scan (scan_work.cpp) ----

// The structure of A: [B, T, N] (diagonal), [B, T, N/k, k, k] (block_k) or [B, T, N, N] (dense).
enum class ScanStructure { diagonal, block_2, block_3, block_4, dense };

// out = the forward recurrence from h0 (or zero where h0 is not given), or with `reverse` the
// reverse one; T is float or double.
template <class T>
void linear_scan_work(const char* op, const Place& place, ScanStructure structure, const Array& A, const Array& b,
                      const Array& h0, const Array& out, bool reverse);

// ---- the Newton operators (newton_solve.hpp, one generated unit per cell) ----

// The cells, by the parameters the operators pass (newton_solve.hpp makes each from its arrays):
// ParaGRU (a [3, H]), ParaGRUHeads (a [3, n_heads, d_head, d_head]), ParaLSTM (a [3, H], p [2, H]),
// ParaSLSTM (r [4, H] and eps).
struct MakeGru;
struct MakeGruHeads;
struct MakeLstm;
struct MakeSlstm;

// ParaGRUHeads' largest head (d_head), for the operators' checks (newton_solve.hpp asserts it is
// the cell's).
inline constexpr int64_t gru_max_head_size = 32;

// The arrays of one call, in the compute type. Forward: u, params, h0 (or not given) in; h,
// residual ([B] float64) and stats ([2] int64: iterations, scan_backend index of the mode that
// ran) out, residual and stats empty (extent 0) when not asked for. Backward: u, params, h0, h,
// grad_h in; du, dparams (every parameter's slots in order), dh0 out.
struct NewtonArrays {
  Array u, h0, h, residual, stats;
  std::vector<Array> params;
  Array grad_h, du, dparams, dh0;
  double eps = 0; // ParaSLSTM's h' = o c' / (n' + eps); no other cell has a setting
};

// The operators' `float[] config`: paraseq.NewtonConfig packed by its _operator_config() (python/
// paraseq/newton.py), layout version 2, one number per entry:
//   [0] layout version (2)
//   [1] max_iters (integer >= 0)
//   [2] omega (0 < omega <= 1)
//   [3] residual_atol (>= 0, or -1 for None)
//   [4] residual_fail (>= 0, or -1 for None)
//   [5] picard_iters (integer >= 0)
//   [6] picard_adapt (0 or 1)
//   [7] scan_backend: 0 "auto", 1 "newton", 2 "fused", 3 "sequential", 4 "one_pass"
//   [8] jacobian: 0 "exact", 1 "quasi" (NewtonJacobian)
// Counts are at most 2^31 - 1 (the NewtonConfig holds them as int). Unpacked, checked entry by entry
// (an error names the entry's field), by newton_config_from_list (newton_solve.hpp); the other
// NewtonConfig fields keep their defaults. A change of layout takes a new version number on both
// sides (version 1 had no entry [8]).
inline constexpr int newton_config_layout_version = 2;
inline constexpr int newton_config_layout_size = 9;
using PackedNewtonConfig = std::vector<double>;

// The solve (forward: h, and residual and stats where asked) and its gradients (backward: du,
// dparams, dh0; the automatic mode) for one cell and T on the arrays' device.
template <class MakeCell, class T>
void newton_forward(const char* op, const Place& place, const NewtonArrays& arrays, const PackedNewtonConfig& config);
template <class MakeCell, class T>
void newton_gradients(const char* op, const Place& place, const NewtonArrays& arrays);

// ---- odeint (odeint_integrate.hpp, generated units of three fields per direction) ----

// The built-in fields and methods by operator name, in the order of odeint_integrate.hpp's type lists
// (which it asserts), and the MLP's most hidden units (ode::Mlp::max_hidden).
inline constexpr const char* odeint_field_names[] = {"damped_oscillator", "lotka_volterra", "sir",
                                                     "linear_shared",     "linear_own",     "mlp"};
inline constexpr const char* odeint_method_names[] = {"euler", "heun", "rk4", "dopri5"};
inline constexpr int64_t odeint_mlp_max_hidden = 128;

// The settings of one integration, checked by the operators (odeint_checks.hpp).
struct OdeintSettings {
  int64_t mlp_hidden = 0;
  std::optional<double> step_size;
  double rtol = 0, atol = 0;
  int64_t max_steps = 0;
};

// The arrays of one call, in the compute type. Forward: y0 [N, n], params [N, P] or shared [Q] in;
// observed [N, len(t), n] and, where given, each trajectory's accepted steps (int32 [N]) out.
// Backward: grad_y [N, len(t), n] and, where given, the forward's accepted steps (adaptive steps:
// not counted again) in; grad_y0, grad_params, grad_shared out. `allocate` gives the loops'
// scratch (their report and mesh) from PyTorch's caching allocator.
struct OdeintArrays {
  Array y0, params, shared;
  Array observed, accepted;
  Array grad_y, grad_y0, grad_params, grad_shared;
  AllocateBytes allocate;
};

// The built-in field FieldIndex and method MethodIndex in T at the times `times` (on the host).
template <int FieldIndex, int MethodIndex, class T>
void integrate(const char* op, const Place& place, const OdeintSettings& settings, const std::vector<double>& times,
               const OdeintArrays& arrays);
template <int FieldIndex, int MethodIndex, class T>
void integrate_adjoint(const char* op, const Place& place, const OdeintSettings& settings,
                       const std::vector<double>& times, const OdeintArrays& arrays);

} // namespace paraseq::torch_bridge
