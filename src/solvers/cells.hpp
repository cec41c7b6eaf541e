#pragma once
// ParaGRU and ParaLSTM: the diagonal-recurrence cells of ParaRNN (Apple's ml-pararnn), exactly as in
// the reference equations, written to the cell concept of cell.hpp. Both take the pre-projected
// input u = W x + b (input_projection.hpp), gates stacked along the last axis of u.
//
//   ParaGRU  state h: [B, T, H]; u: [B, T, 3H] (z, r, c); a: [3, H] (a_z, a_r, a_c)
//       z = s(a_z h + u_z),  r = s(a_r h + u_r),  c = tanh(a_c (h r) + u_c),  h' = z c + (1 - z) h
//       gradient slots: [3, H] like a
//   ParaGRUHeads state h: [B, T, H], H = n_heads x d_head; u: [B, T, 3H] (z, r, c);
//            a: [3, n_heads, d_head, d_head] (A_z, A_r, A_c per head, rows the input channel, columns
//            the output channel: pararnn's (d_in, d_out)); on each head's d_head channels
//       z = s(h A_z + u_z),  r = s(h A_r + u_r),  c = tanh((h r) A_c + u_c),  h' = z c + (1 - z) h
//       gradient slots: [3, n_heads, d_head, d_head] like a
//   ParaLSTM state: [B, T, 2H], channel 2n = c_n and 2n+1 = h_n; u: [B, T, 3H] (f, c~, o);
//            a: [3, H] (a_f, a_c, a_o), p: [2, H] (peepholes p_f, p_o)
//       f = s(a_f h + p_f c + u_f),  c~ = tanh(a_c h + u_c),  c' = f c + (1 - f) c~,
//       o = s(a_o h + p_o c' + u_o),  h' = o tanh(c')
//       gradient slots: [5, H] = a's three rows, then p's two
//   ParaSLSTM state: [B, T, 4H], channels 4n .. 4n+3 = (c_n, n_n, m_n, h_n); u: [B, T, 4H] (i~, f~, z~, o~);
//            r: [4, H] (r_i, r_f, r_z, r_o, diagonal recurrent weights), eps > 0 (normaliser floor)
//       p_g = u_g + r_g h for g in (i, f, z, o),  m' = max(p_f + m, p_i),
//       i = exp(p_i - m'),  f = exp(p_f + m - m'),  c' = f c + i tanh(p_z),  n' = f n + i,
//       h' = s(p_o) c' / (n' + eps)
//       gradient slots: [4, H] like r
// s is the logistic function; h A is the row vector h times the matrix A. The GRU Jacobian is
// diagonal, the head GRU's a dense d_head x d_head block per head (DenseUpTo<32> with the run-time
// group size d_head: 2 <= d_head <= 32); the LSTM one is a 2 x 2 block per
// channel (BlockDiagonal<2> over the interleaved state), the sLSTM one a 4 x 4 block (BlockDiagonal<4>).
// ParaSLSTM is the sLSTM of xLSTM (Beck et al. 2024) with exponential input and forget gates and the
// stabiliser m, as pararnn's ParaSLSTM(mix="diag"): its derivative of the max at a tie p_f + m = p_i
// is the mean of the two branches' (torch.maximum's), and n stays > 0 from a state with n >= 0.

#include <paraseq/core/errors.hpp>
#include <paraseq/core/structure.hpp>
#include <paraseq/solvers/cell.hpp>

#include <Kokkos_Core.hpp>

#include <cstdio>
#include <limits>
#include <string>
#include <type_traits>

namespace paraseq {

namespace detail {
// The cells' exponential-based functions. In float on CUDA devices they use the hardware's
// approximate exp2 and reciprocal (relative error about 2^-21 each) instead of the correctly rounded
// library functions and division, whose range reduction and special cases were about half of the
// fused Newton kernel's instructions (docs/numerics.md states the accuracy). Double, hosts, and
// builds with PARASEQ_PRECISE_CELL_MATH defined use the library functions.
#if defined(__CUDA_ARCH__) && !defined(PARASEQ_PRECISE_CELL_MATH)
#define PARASEQ_APPROXIMATE_CELL_MATH 1

// e^x as __expf computes it (the hardware's 2^y at y = x log2(e), rounded to float), except that
// results below 2^-126 flush to 0 (ex2's .ftz): __expf's scaling for them was three of its five
// instructions, and 1 + e^x is 1 for all of them, so the gates below do not change in any bit.
// `scale` is log2(e) times a power of two, so x * scale rounds as (2^k x) log2(e) does.
__device__ inline float flushing_exp(float x, float scale) {
  float power;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(power) : "f"(x * scale));
  return power;
}
inline constexpr float log2_e = 1.4426950408889634f;
#endif

template <class Acc>
KOKKOS_INLINE_FUNCTION Acc logistic(Acc x) {
#ifdef PARASEQ_APPROXIMATE_CELL_MATH
  if constexpr (std::is_same_v<Acc, float>) return __fdividef(1.0f, 1.0f + flushing_exp(x, -log2_e)); // 0 and 1 at the extremes
#endif
  return Acc(1) / (Acc(1) + Kokkos::exp(-x));
}

template <class Acc>
KOKKOS_INLINE_FUNCTION Acc tanh(Acc x) {
#ifdef PARASEQ_APPROXIMATE_CELL_MATH
  if constexpr (std::is_same_v<Acc, float>) return 1.0f - __fdividef(2.0f, 1.0f + flushing_exp(x, 2.0f * log2_e)); // -1 and 1 at the extremes
#endif
  return Kokkos::tanh(x);
}
} // namespace detail

template <class T, class MemorySpace = Kokkos::DefaultExecutionSpace::memory_space>
struct ParaGRU {
  using structure = Diagonal;
  using param_view = Kokkos::View<const T**, Kokkos::LayoutRight, MemorySpace>;
  static constexpr int max_inputs_per_group = 3;
  static constexpr int max_params_per_group = 3;

  param_view a; // [3, H]: a_z, a_r, a_c

  int state_size() const { return int(a.extent(1)); }
  int input_size() const { return 3 * state_size(); }
  int param_count() const { return 3 * state_size(); }
  KOKKOS_INLINE_FUNCTION int inputs_per_group() const { return 3; }
  KOKKOS_INLINE_FUNCTION int params_per_group() const { return 3; }
  KOKKOS_INLINE_FUNCTION int input_column(int g, int k) const { return k * int(a.extent(1)) + g; }
  KOKKOS_INLINE_FUNCTION int param_index(int g, int k) const { return k * int(a.extent(1)) + g; }
  void check(const char* fn) const {
    if (a.extent(0) != 3) detail::throw_invalid(fn, "cell.a", "shape " + detail::shape_of(a), "shape [3, H] (a_z, a_r, a_c)");
  }

  template <class Acc>
  KOKKOS_INLINE_FUNCTION void step(int g, const Acc* h, const Acc* u, Acc* f) const {
    const Acc z = detail::logistic(Acc(a(0, g)) * h[0] + u[0]);
    const Acc r = detail::logistic(Acc(a(1, g)) * h[0] + u[1]);
    const Acc c = detail::tanh(Acc(a(2, g)) * (h[0] * r) + u[2]);
    f[0] = h[0] + z * (c - h[0]);
  }

  template <class Acc>
  KOKKOS_INLINE_FUNCTION void linearize(int g, const Acc* h, const Acc* u, Acc* f, Acc* J) const {
    const Acc a_z = Acc(a(0, g)), a_r = Acc(a(1, g)), a_c = Acc(a(2, g));
    const Acc z = detail::logistic(a_z * h[0] + u[0]);
    const Acc r = detail::logistic(a_r * h[0] + u[1]);
    const Acc c = detail::tanh(a_c * (h[0] * r) + u[2]);
    f[0] = h[0] + z * (c - h[0]);
    J[0] = (Acc(1) - z) + (c - h[0]) * z * (Acc(1) - z) * a_z +
           z * (Acc(1) - c * c) * a_c * (r + h[0] * r * (Acc(1) - r) * a_r);
  }

  template <class Acc>
  KOKKOS_INLINE_FUNCTION void vjp(int g, const Acc* h, const Acc* u, const Acc* mu, Acc* dh, Acc* du,
                                  Acc* dparams) const {
    const Acc a_z = Acc(a(0, g)), a_r = Acc(a(1, g)), a_c = Acc(a(2, g));
    const Acc z = detail::logistic(a_z * h[0] + u[0]);
    const Acc r = detail::logistic(a_r * h[0] + u[1]);
    const Acc q = h[0] * r;
    const Acc c = detail::tanh(a_c * q + u[2]);
    const Acc d_pre_z = mu[0] * (c - h[0]) * z * (Acc(1) - z);
    const Acc d_pre_c = mu[0] * z * (Acc(1) - c * c);
    const Acc d_q = d_pre_c * a_c;
    const Acc d_pre_r = d_q * h[0] * r * (Acc(1) - r);
    du[0] = d_pre_z;
    du[1] = d_pre_r;
    du[2] = d_pre_c;
    dparams[0] = d_pre_z * h[0];
    dparams[1] = d_pre_r * h[0];
    dparams[2] = d_pre_c * q;
    dh[0] = mu[0] * (Acc(1) - z) + d_pre_z * a_z + d_q * r + d_pre_r * a_r;
  }
};

// ParaGRU with head-block recurrence (pararnn's ParaGRU(mix="head")): the gates' recurrent matrices
// are block-diagonal, one dense d_head x d_head block per head, so each head is one group of the
// dense scan. Its Jacobian costs O(d_head^3) per step and head (the A_r, A_c product); its vjp O(d_head^2).
template <class T, class MemorySpace = Kokkos::DefaultExecutionSpace::memory_space>
struct ParaGRUHeads {
  using structure = DenseUpTo<max_dense_size>;
  using param_view = Kokkos::View<const T****, Kokkos::LayoutRight, MemorySpace>;
  static constexpr int max_head_size = max_dense_size;
  static constexpr int max_inputs_per_group = 3 * max_head_size;
  static constexpr int max_params_per_group = 3 * max_head_size * max_head_size;

  param_view a; // [3, n_heads, d_head, d_head]: A_z, A_r, A_c; a(k, head, i, j) weighs h_i in gate k's channel j

  int head_count() const { return int(a.extent(1)); }
  int group_size() const { return int(a.extent(2)); } // d_head: each head is one group
  int state_size() const { return head_count() * group_size(); }
  int input_size() const { return 3 * state_size(); }
  int param_count() const { return 3 * state_size() * group_size(); }
  KOKKOS_INLINE_FUNCTION int inputs_per_group() const { return 3 * int(a.extent(2)); }
  KOKKOS_INLINE_FUNCTION int params_per_group() const { return 3 * int(a.extent(2) * a.extent(3)); }
  // Input k = gate * d_head + j: channel j of head g in gate k's block of u.
  KOKKOS_INLINE_FUNCTION int input_column(int g, int k) const {
    const int d = int(a.extent(2));
    return (k / d) * int(a.extent(1)) * d + g * d + k % d;
  }
  // Parameter k = (gate * d_head + i) * d_head + j: a(gate, g, i, j) at its place in a.
  KOKKOS_INLINE_FUNCTION int param_index(int g, int k) const {
    const int dd = int(a.extent(2) * a.extent(3));
    return ((k / dd) * int(a.extent(1)) + g) * dd + k % dd;
  }
  void check(const char* fn) const {
    const std::string expected = "shape [3, n_heads, d_head, d_head] (A_z, A_r, A_c per head) with n_heads >= 1 and 2 <= d_head <= " +
                                 std::to_string(max_head_size);
    if (a.extent(0) != 3 || a.extent(1) < 1 || a.extent(2) != a.extent(3) || a.extent(2) < 2 || a.extent(2) > std::size_t(max_head_size))
      detail::throw_invalid(fn, "cell.a", "shape " + detail::shape_of(a), expected);
  }

  template <class Acc>
  KOKKOS_INLINE_FUNCTION void step(int g, const Acc* h, const Acc* u, Acc* f) const {
    const int d = int(a.extent(2));
    Acc z[max_head_size], r[max_head_size], q[max_head_size];
    gates(g, h, u, z, r, q);
    for (int j = 0; j < d; ++j) {
      Acc pre_c = u[2 * d + j];
      for (int i = 0; i < d; ++i) pre_c += q[i] * Acc(a(2, g, i, j));
      f[j] = h[j] + z[j] * (detail::tanh(pre_c) - h[j]);
    }
  }

  // J[i * d + j] = df_i / dh_j = delta_ij (1 - z_i) + (c_i - h_i) z_i' A_z[j][i]
  //                              + z_i c_i' (A_c[j][i] r_j + sum_k A_r[j][k] h_k r_k' A_c[k][i]),
  // with z' = z (1 - z), r' = r (1 - r), c' = 1 - c^2. Both linearisations are called, not inlined:
  // loop nests of run-time size (d_head) whose arrays live in local memory either way, which the
  // scans' and the fused kernel's unrolled steps would otherwise each compile again (half of nvcc's
  // time for the head GRU's units, measured with nvcc 13.0 on 2026-12-05).
  template <class Acc>
  KOKKOS_FUNCTION __attribute__((noinline)) void linearize(int g, const Acc* h, const Acc* u, Acc* f, Acc* J) const {
    linearize_rows<false>(g, h, u, f, J);
  }

  // f and J's diagonal alone, in O(d^2) rather than linearize's O(d^3): the quasi Jacobian.
  template <class Acc>
  KOKKOS_FUNCTION __attribute__((noinline)) void linearize_diagonal(int g, const Acc* h, const Acc* u, Acc* f,
                                                                    Acc* J_diag) const {
    linearize_rows<true>(g, h, u, f, J_diag);
  }

  template <class Acc>
  KOKKOS_INLINE_FUNCTION void vjp(int g, const Acc* h, const Acc* u, const Acc* mu, Acc* dh, Acc* du,
                                  Acc* dparams) const {
    const int d = int(a.extent(2)), dd = d * d;
    Acc z[max_head_size], r[max_head_size], q[max_head_size], d_pre_c[max_head_size];
    gates(g, h, u, z, r, q);
    for (int i = 0; i < d; ++i) {
      Acc pre_c = u[2 * d + i];
      for (int k = 0; k < d; ++k) pre_c += q[k] * Acc(a(2, g, k, i));
      const Acc c = detail::tanh(pre_c);
      du[i] = mu[i] * (c - h[i]) * z[i] * (Acc(1) - z[i]); // of pre_z
      d_pre_c[i] = du[2 * d + i] = mu[i] * z[i] * (Acc(1) - c * c);
    }
    for (int k = 0; k < d; ++k) { // of pre_r, through q_k = h_k r_k
      Acc d_q = 0;
      for (int i = 0; i < d; ++i) d_q += Acc(a(2, g, k, i)) * d_pre_c[i];
      du[d + k] = d_q * q[k] * (Acc(1) - r[k]);
      dh[k] = mu[k] * (Acc(1) - z[k]) + d_q * r[k];
    }
    for (int k = 0; k < d; ++k)
      for (int i = 0; i < d; ++i) {
        dh[k] += Acc(a(0, g, k, i)) * du[i] + Acc(a(1, g, k, i)) * du[d + i];
        dparams[k * d + i] = h[k] * du[i];
        dparams[dd + k * d + i] = h[k] * du[d + i];
        dparams[2 * dd + k * d + i] = q[k] * d_pre_c[i];
      }
  }

  // The team step (cell.hpp): A_z, A_r, A_c staged as d x (d + 1) arrays, so that a thread per
  // column (the step's gates) and a thread per row (the vjp's products with A^T) both read distinct
  // shared-memory banks; the work space holds z, r, q and the c gate's pre-activation gradient.
  KOKKOS_INLINE_FUNCTION int team_params_size() const { return 3 * int(a.extent(2)) * (int(a.extent(2)) + 1); }
  KOKKOS_INLINE_FUNCTION int team_work_size() const { return 4 * int(a.extent(2)); }

  template <class Acc, class Member>
  KOKKOS_INLINE_FUNCTION void stage_team_params(const Member& team, int g, Acc* staged) const {
    const int d = int(a.extent(2)), stride = d + 1;
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, 3 * d * d), [&](int k) {
      const int gate = k / (d * d), i = k / d % d, j = k % d;
      staged[(gate * d + i) * stride + j] = Acc(a(gate, g, i, j));
    });
    team.team_barrier();
  }

  template <class Acc, class Member, class Input>
  KOKKOS_INLINE_FUNCTION void team_step(const Member& team, const Acc* staged, const Acc* h, const Input& input, Acc* f,
                                        Acc* work) const {
    const int d = int(a.extent(2));
    Acc *z = work, *r = work + d, *q = work + 2 * d;
    team_gates(team, staged, h, input, z, r, q);
    const Acc* A_c = staged + 2 * d * (d + 1);
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, d), [&](int j) {
      Acc pre_c = input(2 * d + j);
      for (int i = 0; i < d; ++i) pre_c += q[i] * A_c[i * (d + 1) + j];
      f[j] = h[j] + z[j] * (detail::tanh(pre_c) - h[j]);
    });
    team.team_barrier();
  }

  template <class Acc, class Member, class Input>
  KOKKOS_INLINE_FUNCTION void team_vjp(const Member& team, const Acc* staged, const Acc* h, const Input& input,
                                       const Acc* mu, Acc* dh, Acc* du, Acc* dparams, Acc* work) const {
    const int d = int(a.extent(2)), stride = d + 1, dd = d * d;
    const Acc *A_z = staged, *A_r = staged + d * stride, *A_c = staged + 2 * d * stride;
    Acc *z = work, *r = work + d, *q = work + 2 * d, *d_pre_c = work + 3 * d;
    team_gates(team, staged, h, input, z, r, q);
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, d), [&](int i) {
      Acc pre_c = input(2 * d + i);
      for (int k = 0; k < d; ++k) pre_c += q[k] * A_c[k * stride + i];
      const Acc c = detail::tanh(pre_c);
      du[i] = mu[i] * (c - h[i]) * z[i] * (Acc(1) - z[i]); // of pre_z
      d_pre_c[i] = du[2 * d + i] = mu[i] * z[i] * (Acc(1) - c * c);
    });
    team.team_barrier();
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, d), [&](int k) { // of pre_r, through q_k = h_k r_k
      Acc d_q = 0;
      for (int i = 0; i < d; ++i) d_q += A_c[k * stride + i] * d_pre_c[i];
      du[d + k] = d_q * q[k] * (Acc(1) - r[k]);
      dh[k] = mu[k] * (Acc(1) - z[k]) + d_q * r[k];
    });
    team.team_barrier();
    // Thread j: row j of the products with A_z^T and A_r^T, and column j of the parameter sums.
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, d), [&](int j) {
      Acc via_gates = 0;
      for (int i = 0; i < d; ++i) via_gates += A_z[j * stride + i] * du[i] + A_r[j * stride + i] * du[d + i];
      dh[j] += via_gates;
      for (int k = 0; k < d; ++k) {
        dparams[k * d + j] += h[k] * du[j];
        dparams[dd + k * d + j] += h[k] * du[d + j];
        dparams[2 * dd + k * d + j] += q[k] * d_pre_c[j];
      }
    });
    team.team_barrier();
  }

private:
  // The team step's gates: thread j computes z_j, r_j and q_j = h_j r_j (as gates() below).
  template <class Acc, class Member, class Input>
  KOKKOS_INLINE_FUNCTION void team_gates(const Member& team, const Acc* staged, const Acc* h, const Input& input, Acc* z,
                                         Acc* r, Acc* q) const {
    const int d = int(a.extent(2)), stride = d + 1;
    const Acc *A_z = staged, *A_r = staged + d * stride;
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, d), [&](int j) {
      Acc pre_z = input(j), pre_r = input(d + j);
      for (int i = 0; i < d; ++i) {
        pre_z += h[i] * A_z[i * stride + j];
        pre_r += h[i] * A_r[i * stride + j];
      }
      z[j] = detail::logistic(pre_z);
      r[j] = detail::logistic(pre_r);
      q[j] = h[j] * r[j];
    });
    team.team_barrier();
  }

  // linearize's f and J, or (DiagonalOnly) f and J_ii alone.
  template <bool DiagonalOnly, class Acc>
  KOKKOS_INLINE_FUNCTION void linearize_rows(int g, const Acc* h, const Acc* u, Acc* f, Acc* J) const {
    const int d = int(a.extent(2));
    Acc z[max_head_size], r[max_head_size], q[max_head_size], s[max_head_size];
    gates(g, h, u, z, r, q);
    for (int k = 0; k < d; ++k) s[k] = q[k] * (Acc(1) - r[k]);
    for (int i = 0; i < d; ++i) {
      Acc pre_c = u[2 * d + i];
      for (int k = 0; k < d; ++k) pre_c += q[k] * Acc(a(2, g, k, i));
      const Acc c = detail::tanh(pre_c);
      f[i] = h[i] + z[i] * (c - h[i]);
      const Acc via_z = (c - h[i]) * z[i] * (Acc(1) - z[i]), via_c = z[i] * (Acc(1) - c * c);
      for (int j = DiagonalOnly ? i : 0; j < (DiagonalOnly ? i + 1 : d); ++j) {
        Acc dq = Acc(a(2, g, j, i)) * r[j];
        for (int k = 0; k < d; ++k) dq += Acc(a(1, g, j, k)) * s[k] * Acc(a(2, g, k, i));
        J[DiagonalOnly ? i : i * d + j] = (i == j ? Acc(1) - z[i] : Acc(0)) + via_z * Acc(a(0, g, j, i)) + via_c * dq;
      }
    }
  }

  // The update and reset gates z, r of head g and q = h r, the reset-scaled state that feeds A_c.
  template <class Acc>
  KOKKOS_INLINE_FUNCTION void gates(int g, const Acc* h, const Acc* u, Acc* z, Acc* r, Acc* q) const {
    const int d = int(a.extent(2));
    for (int j = 0; j < d; ++j) {
      Acc pre_z = u[j], pre_r = u[d + j];
      for (int i = 0; i < d; ++i) {
        pre_z += h[i] * Acc(a(0, g, i, j));
        pre_r += h[i] * Acc(a(1, g, i, j));
      }
      z[j] = detail::logistic(pre_z);
      r[j] = detail::logistic(pre_r);
      q[j] = h[j] * r[j];
    }
  }
};

template <class T, class MemorySpace = Kokkos::DefaultExecutionSpace::memory_space>
struct ParaLSTM {
  using structure = BlockDiagonal<2>;
  using param_view = Kokkos::View<const T**, Kokkos::LayoutRight, MemorySpace>;
  static constexpr int max_inputs_per_group = 3;
  static constexpr int max_params_per_group = 5;

  param_view a; // [3, H]: a_f, a_c, a_o (on h)
  param_view p; // [2, H]: p_f, p_o (peepholes on c)

  int hidden_size() const { return int(a.extent(1)); }
  int state_size() const { return 2 * hidden_size(); }
  int input_size() const { return 3 * hidden_size(); }
  int param_count() const { return 5 * hidden_size(); }
  KOKKOS_INLINE_FUNCTION int inputs_per_group() const { return 3; }
  KOKKOS_INLINE_FUNCTION int params_per_group() const { return 5; }
  KOKKOS_INLINE_FUNCTION int input_column(int g, int k) const { return k * int(a.extent(1)) + g; }
  KOKKOS_INLINE_FUNCTION int param_index(int g, int k) const { return k * int(a.extent(1)) + g; }
  void check(const char* fn) const {
    if (a.extent(0) != 3) detail::throw_invalid(fn, "cell.a", "shape " + detail::shape_of(a), "shape [3, H] (a_f, a_c, a_o)");
    detail::require_extents(fn, "cell.p", p, {2, long(a.extent(1))}, "[2, H] (p_f, p_o) with H from cell.a");
  }

  template <class Acc>
  KOKKOS_INLINE_FUNCTION void step(int g, const Acc* state, const Acc* u, Acc* next) const {
    Gates<Acc> gates(*this, g, state, u);
    next[0] = gates.c_next;
    next[1] = gates.o * gates.tanh_c;
  }

  // Rows and columns in state order (c, h).
  template <class Acc>
  KOKKOS_INLINE_FUNCTION void linearize(int g, const Acc* state, const Acc* u, Acc* next, Acc* J) const {
    const Gates<Acc> s(*this, g, state, u);
    next[0] = s.c_next;
    next[1] = s.o * s.tanh_c;
    const Acc f_slope = s.f * (Acc(1) - s.f), o_slope = s.o * (Acc(1) - s.o);
    const Acc dc_dc = s.f + (state[0] - s.c_tilde) * f_slope * s.p_f;
    const Acc dc_dh = (state[0] - s.c_tilde) * f_slope * s.a_f + (Acc(1) - s.f) * (Acc(1) - s.c_tilde * s.c_tilde) * s.a_c;
    const Acc do_dc = o_slope * s.p_o * dc_dc;
    const Acc do_dh = o_slope * (s.a_o + s.p_o * dc_dh);
    const Acc dtanh = s.o * (Acc(1) - s.tanh_c * s.tanh_c);
    J[0] = dc_dc;
    J[1] = dc_dh;
    J[2] = do_dc * s.tanh_c + dtanh * dc_dc;
    J[3] = do_dh * s.tanh_c + dtanh * dc_dh;
  }

  template <class Acc>
  KOKKOS_INLINE_FUNCTION void vjp(int g, const Acc* state, const Acc* u, const Acc* mu, Acc* dstate, Acc* du,
                                  Acc* dparams) const {
    const Gates<Acc> s(*this, g, state, u);
    const Acc c = state[0], h = state[1];
    const Acc d_pre_o = mu[1] * s.tanh_c * s.o * (Acc(1) - s.o);
    const Acc d_c_next = mu[0] + mu[1] * s.o * (Acc(1) - s.tanh_c * s.tanh_c) + d_pre_o * s.p_o;
    const Acc d_pre_f = d_c_next * (c - s.c_tilde) * s.f * (Acc(1) - s.f);
    const Acc d_pre_c = d_c_next * (Acc(1) - s.f) * (Acc(1) - s.c_tilde * s.c_tilde);
    du[0] = d_pre_f;
    du[1] = d_pre_c;
    du[2] = d_pre_o;
    dparams[0] = d_pre_f * h;        // a_f
    dparams[1] = d_pre_c * h;        // a_c
    dparams[2] = d_pre_o * h;        // a_o
    dparams[3] = d_pre_f * c;        // p_f
    dparams[4] = d_pre_o * s.c_next; // p_o
    dstate[0] = d_c_next * s.f + d_pre_f * s.p_f;
    dstate[1] = d_pre_f * s.a_f + d_pre_c * s.a_c + d_pre_o * s.a_o;
  }

private:
  // The forward quantities every member function needs, computed once.
  template <class Acc>
  struct Gates {
    Acc a_f, a_c, a_o, p_f, p_o, f, c_tilde, c_next, o, tanh_c;
    KOKKOS_INLINE_FUNCTION Gates(const ParaLSTM& cell, int g, const Acc* state, const Acc* u)
        : a_f(cell.a(0, g)), a_c(cell.a(1, g)), a_o(cell.a(2, g)), p_f(cell.p(0, g)), p_o(cell.p(1, g)) {
      f = detail::logistic(a_f * state[1] + p_f * state[0] + u[0]);
      c_tilde = detail::tanh(a_c * state[1] + u[1]);
      c_next = f * state[0] + (Acc(1) - f) * c_tilde;
      o = detail::logistic(a_o * state[1] + p_o * c_next + u[2]);
      tanh_c = detail::tanh(c_next);
    }
  };
};

// The sLSTM cell with diagonal recurrence (pararnn's ParaSLSTM, mix="diag"), 4x4 blocks per channel;
// compiled instances in the paraseq library, as the other built-in cells (cmake/paraseqInstances.cmake).
template <class T, class MemorySpace = Kokkos::DefaultExecutionSpace::memory_space>
struct ParaSLSTM {
  using structure = BlockDiagonal<4>;
  using param_view = Kokkos::View<const T**, Kokkos::LayoutRight, MemorySpace>;
  static constexpr int max_inputs_per_group = 4;
  static constexpr int max_params_per_group = 4;
  // Exact Newton from f(0, u_t) diverges over long sequences (docs/solvers.md): the automatic mode
  // runs the loop.
  static constexpr bool newton_may_diverge = true;

  param_view r;      // [4, H]: r_i, r_f, r_z, r_o (on h)
  double eps = 1e-6; // h' = o c' / (n' + eps)

  int hidden_size() const { return int(r.extent(1)); }
  int state_size() const { return 4 * hidden_size(); }
  int input_size() const { return 4 * hidden_size(); }
  int param_count() const { return 4 * hidden_size(); }
  KOKKOS_INLINE_FUNCTION int inputs_per_group() const { return 4; }
  KOKKOS_INLINE_FUNCTION int params_per_group() const { return 4; }
  KOKKOS_INLINE_FUNCTION int input_column(int g, int k) const { return k * int(r.extent(1)) + g; }
  KOKKOS_INLINE_FUNCTION int param_index(int g, int k) const { return k * int(r.extent(1)) + g; }
  void check(const char* fn) const {
    if (r.extent(0) != 4)
      detail::throw_invalid(fn, "cell.r", "shape " + detail::shape_of(r), "shape [4, H] (r_i, r_f, r_z, r_o)");
    if (!(eps > 0 && eps <= std::numeric_limits<double>::max())) { // also NaN and inf
      char value[32];
      std::snprintf(value, sizeof value, "%g", eps);
      detail::throw_invalid(fn, "cell.eps", std::string("the value ") + value, "a finite number > 0 (in n' + eps)");
    }
  }

  template <class Acc>
  KOKKOS_INLINE_FUNCTION void step(int g, const Acc* state, const Acc* u, Acc* next) const {
    const Gates<Acc> s(*this, g, state, u);
    next[0] = s.c_next;
    next[1] = s.n_next;
    next[2] = s.m_next;
    next[3] = s.h_next;
  }

  // Rows and columns in state order (c, n, m, h).
  template <class Acc>
  KOKKOS_INLINE_FUNCTION void linearize(int g, const Acc* state, const Acc* u, Acc* next, Acc* J) const {
    const Gates<Acc> s(*this, g, state, u);
    next[0] = s.c_next;
    next[1] = s.n_next;
    next[2] = s.m_next;
    next[3] = s.h_next;
    const Acc c = state[0], n = state[1], beta = Acc(1) - s.alpha;
    const Acc dm_dh = s.alpha * s.r_f + beta * s.r_i;
    const Acc di_dm = -s.i * s.alpha, di_dh = s.i * (s.r_i - dm_dh);
    const Acc df_dm = s.f * beta, df_dh = s.f * (s.r_f - dm_dh);
    const Acc dc_dm = df_dm * c + di_dm * s.z;
    const Acc dc_dh = df_dh * c + di_dh * s.z + s.i * (Acc(1) - s.z * s.z) * s.r_z;
    const Acc dn_dm = df_dm * n + di_dm, dn_dh = df_dh * n + di_dh;
    const Acc o_over_d = s.o / s.d, h_per_n = -s.h_next / s.d; // dh'/dc' and dh'/dn'
    const Acc dh_do = s.c_next / s.d;
    const Acc row_c[4] = {s.f, Acc(0), dc_dm, dc_dh};
    const Acc row_n[4] = {Acc(0), s.f, dn_dm, dn_dh};
    for (int j = 0; j < 4; ++j) {
      J[j] = row_c[j];
      J[4 + j] = row_n[j];
      J[12 + j] = o_over_d * row_c[j] + h_per_n * row_n[j];
    }
    J[8] = J[9] = Acc(0);
    J[10] = s.alpha;
    J[11] = dm_dh;
    J[15] += dh_do * s.o * (Acc(1) - s.o) * s.r_o;
  }

  template <class Acc>
  KOKKOS_INLINE_FUNCTION void vjp(int g, const Acc* state, const Acc* u, const Acc* mu, Acc* dstate, Acc* du,
                                  Acc* dparams) const {
    const Gates<Acc> s(*this, g, state, u);
    const Acc c = state[0], n = state[1], h = state[3];
    const Acc d_c_next = mu[0] + mu[3] * s.o / s.d;
    const Acc d_n_next = mu[1] - mu[3] * s.h_next / s.d;
    const Acc d_pre_o = mu[3] * (s.c_next / s.d) * s.o * (Acc(1) - s.o);
    const Acc d_pre_z = d_c_next * s.i * (Acc(1) - s.z * s.z);
    const Acc d_i = d_c_next * s.z + d_n_next, d_f = d_c_next * c + d_n_next * n;
    // i = exp(p_i - m'), f = exp(p_f + m - m'), m' = max(p_f + m, p_i)
    const Acc d_m_next = mu[2] - d_i * s.i - d_f * s.f;
    const Acc d_pre_i = d_i * s.i + (Acc(1) - s.alpha) * d_m_next;
    const Acc d_left = d_f * s.f + s.alpha * d_m_next; // of p_f + m
    du[0] = d_pre_i;
    du[1] = d_left;
    du[2] = d_pre_z;
    du[3] = d_pre_o;
    dparams[0] = d_pre_i * h;
    dparams[1] = d_left * h;
    dparams[2] = d_pre_z * h;
    dparams[3] = d_pre_o * h;
    dstate[0] = d_c_next * s.f;
    dstate[1] = d_n_next * s.f;
    dstate[2] = d_left;
    dstate[3] = s.r_i * d_pre_i + s.r_f * d_left + s.r_z * d_pre_z + s.r_o * d_pre_o;
  }

private:
  // The forward quantities every member function needs, computed once. alpha = dm'/d(p_f + m):
  // 1 on the forget branch, 0 on the input branch, 1/2 at a tie.
  template <class Acc>
  struct Gates {
    Acc r_i, r_f, r_z, r_o, alpha, m_next, i, f, z, o, c_next, n_next, d, h_next;
    KOKKOS_INLINE_FUNCTION Gates(const ParaSLSTM& cell, int g, const Acc* state, const Acc* u)
        : r_i(cell.r(0, g)), r_f(cell.r(1, g)), r_z(cell.r(2, g)), r_o(cell.r(3, g)) {
      const Acc h = state[3];
      const Acc pre_i = u[0] + r_i * h, left = u[1] + r_f * h + state[2];
      alpha = left > pre_i ? Acc(1) : left < pre_i ? Acc(0) : Acc(0.5);
      m_next = left > pre_i ? left : pre_i;
      i = Kokkos::exp(pre_i - m_next);
      f = Kokkos::exp(left - m_next);
      z = detail::tanh(u[2] + r_z * h);
      o = detail::logistic(u[3] + r_o * h);
      c_next = f * state[0] + i * z;
      n_next = f * state[1] + i;
      d = n_next + Acc(cell.eps);
      h_next = o * c_next / d;
    }
  };
};

namespace detail {
template <class T, class MemorySpace>
inline constexpr bool is_builtin_cell_v<ParaGRU<T, MemorySpace>> = true;
template <class T, class MemorySpace>
inline constexpr bool is_builtin_cell_v<ParaGRUHeads<T, MemorySpace>> = true;
template <class T, class MemorySpace>
inline constexpr bool is_builtin_cell_v<ParaLSTM<T, MemorySpace>> = true;
template <class T, class MemorySpace>
inline constexpr bool is_builtin_cell_v<ParaSLSTM<T, MemorySpace>> = true;
template <class T, class MemorySpace>
inline constexpr bool is_compiled_cell_v<ParaGRU<T, MemorySpace>, T, MemorySpace> = std::is_floating_point_v<T>;
template <class T, class MemorySpace>
inline constexpr bool is_compiled_cell_v<ParaGRUHeads<T, MemorySpace>, T, MemorySpace> = std::is_floating_point_v<T>;
template <class T, class MemorySpace>
inline constexpr bool is_compiled_cell_v<ParaLSTM<T, MemorySpace>, T, MemorySpace> = std::is_floating_point_v<T>;
template <class T, class MemorySpace>
inline constexpr bool is_compiled_cell_v<ParaSLSTM<T, MemorySpace>, T, MemorySpace> = std::is_floating_point_v<T>;
} // namespace detail

} // namespace paraseq
