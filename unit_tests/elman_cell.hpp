#pragma once
// The Elman cell of the cell tests (test_cells*.cpp): a user cell with a dense recurrent matrix, the
// DEER dense path, its float64 sequential loop and the checks the test units share.

#include <paraseq/core/errors.hpp>
#include <paraseq/core/structure.hpp>
#include <paraseq/solvers/newton.hpp>
#include <paraseq/solvers/newton_backward.hpp>

#include "cell_derivative_checks.hpp"
#include "test_support.hpp"

#include <gmock/gmock.h>

#include <cmath>
#include <string>
#include <vector>

namespace paraseq::test {

// h' = tanh(W h + u), W: [N, N] with N <= MaxN, u: [B, T, N]. One group holds the whole state; the
// gradient slots are W's entries, row-major. Its Jacobian is DenseUpTo<MaxN>: Dense at MaxN = 32.
template <class T, class MemorySpace, int MaxN = 9>
struct ElmanCell {
  using structure = DenseUpTo<MaxN>;
  static constexpr int max_inputs_per_group = MaxN;
  static constexpr int max_params_per_group = MaxN * MaxN;

  Kokkos::View<const T**, Kokkos::LayoutRight, MemorySpace> W;

  int state_size() const { return int(W.extent(0)); }
  int input_size() const { return state_size(); }
  int param_count() const { return state_size() * state_size(); }
  KOKKOS_FUNCTION int inputs_per_group() const { return int(W.extent(0)); }
  KOKKOS_FUNCTION int params_per_group() const { return int(W.extent(0) * W.extent(0)); }
  KOKKOS_FUNCTION int input_column(int, int k) const { return k; }
  KOKKOS_FUNCTION int param_index(int, int k) const { return k; }
  void check(const char* fn) const {
    if (W.extent(0) != W.extent(1)) paraseq::detail::throw_invalid(fn, "cell.W", "shape " + paraseq::detail::shape_of(W), "a square [N, N]");
  }

  template <class Acc>
  KOKKOS_FUNCTION void step(int, const Acc* h, const Acc* u, Acc* f) const {
    const int n = int(W.extent(0));
    for (int i = 0; i < n; ++i) {
      Acc pre = u[i];
      for (int j = 0; j < n; ++j) pre += Acc(W(i, j)) * h[j];
      f[i] = Kokkos::tanh(pre);
    }
  }
  template <class Acc>
  KOKKOS_FUNCTION void linearize(int g, const Acc* h, const Acc* u, Acc* f, Acc* J) const {
    step(g, h, u, f);
    const int n = int(W.extent(0));
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < n; ++j) J[i * n + j] = (Acc(1) - f[i] * f[i]) * Acc(W(i, j));
  }
  template <class Acc>
  KOKKOS_FUNCTION void vjp(int g, const Acc* h, const Acc* u, const Acc* mu, Acc* dh, Acc* du, Acc* dparams) const {
    const int n = int(W.extent(0));
    Acc f[MaxN];
    step(g, h, u, f);
    for (int i = 0; i < n; ++i) du[i] = mu[i] * (Acc(1) - f[i] * f[i]);
    for (int j = 0; j < n; ++j) {
      Acc sum = 0;
      for (int i = 0; i < n; ++i) {
        sum += Acc(W(i, j)) * du[i];
        dparams[i * n + j] = du[i] * h[j];
      }
      dh[j] = sum;
    }
  }
};

inline Host3 elman_sequential(const Host2& W, const Host3& u, const Host2& h0 = {}) {
  const int B = int(u.extent(0)), T = int(u.extent(1)), N = int(W.extent(0));
  Host3 h("elman_reference", B, T, N);
  for (int b = 0; b < B; ++b) {
    std::vector<double> state(N), next(N);
    for (int i = 0; i < N; ++i) state[i] = h0.data() ? h0(b, i) : 0;
    for (int t = 0; t < T; ++t) {
      for (int i = 0; i < N; ++i) {
        double pre = u(b, t, i);
        for (int j = 0; j < N; ++j) pre += W(i, j) * state[j];
        next[i] = std::tanh(pre);
      }
      state = next;
      for (int i = 0; i < N; ++i) h(b, t, i) = state[i];
    }
  }
  return h;
}

// max over b, t and i of |h(b, t, i) - tanh(W h_{t-1} + u_t)_i|, h_{-1} = h0: the residual of any h.
inline double elman_residual(const Host2& W, const Host3& u, const Host2& h0, const Host3& h) {
  const int B = int(u.extent(0)), T = int(u.extent(1)), N = int(W.extent(0));
  double largest = 0;
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t)
      for (int i = 0; i < N; ++i) {
        double pre = u(b, t, i);
        for (int j = 0; j < N; ++j) pre += W(i, j) * (t == 0 ? h0(b, j) : h(b, t - 1, j));
        largest = std::fmax(largest, std::fabs(h(b, t, i) - std::tanh(pre)));
      }
  return largest;
}

// Contractive W: rows scaled so that |J| < 1.
template <class Space>
View2<double, Space> contractive_matrix(int N, unsigned seed, double bound = 0.9) {
  View2<double, Space> W("W", N, N);
  fill_uniform(W, -bound / std::sqrt(double(N)), bound / std::sqrt(double(N)), seed);
  return W;
}

// The modes a test runs, with the kernel family each compiles (CompiledNewtonModes): a test unit
// names the families it tests, so that it compiles those alone.
struct ModeAndFamily {
  NewtonMode mode;
  CompiledNewtonModes family;
};
inline constexpr ModeAndFamily modes_and_families[] = {{NewtonMode::newton, CompiledNewtonModes::newton},
                                                       {NewtonMode::fused, CompiledNewtonModes::fused},
                                                       {NewtonMode::sequential, CompiledNewtonModes::sequential}};

// Every Newton mode of Modes against the float64 loop, N channels, from a random h0.
template <class Space, int MaxN, CompiledNewtonModes Modes>
void expect_elman_solve_matches_sequential_loop(int N, int T_steps) {
  SCOPED_TRACE("N=" + std::to_string(N));
  const int B = 2;
  const auto W = contractive_matrix<Space>(N, 100 + N);
  View3<double, Space> u("u", B, T_steps, N), h("h", B, T_steps, N);
  View2<double, Space> h0("h0", B, N);
  fill_uniform(u, -0.5, 0.5, 200 + N);
  fill_uniform(h0, -0.5, 0.5, 300 + N);
  const Host3 reference = elman_sequential(as_double2(W), as_double3(u), as_double2(h0));
  const ElmanCell<double, typename Space::memory_space, MaxN> cell{W};
  int modes_run = 0;
  for (const auto& [mode, family] : modes_and_families) {
    if (!compiles(Modes, family)) continue;
    SCOPED_TRACE("mode=" + std::to_string(int(mode)));
    NewtonConfig config;
    config.mode = mode;
    config.max_iters = 6;
    config.fused_window = 40;
    Kokkos::deep_copy(h, NAN);
    newton_solve<Modes>(Space{}, cell, u, h, config, h0);
    EXPECT_LE(max_relative_error(h, reference), 1e-10);
    ++modes_run;
  }
  EXPECT_GT(modes_run, 0);
}

// The forward and the adjoint in one mode (of family Family) against central differences of the
// float64 loop's loss sum(g * h), for du, dW and dh0. With ForwardFamily = sequential the forward
// is the sequential loop: the adjoint's unit then compiles no forward kernels of the mode (the fused
// mode's forward has a unit of its own).
template <class Space, CompiledNewtonModes Family, CompiledNewtonModes ForwardFamily = Family>
void expect_elman_gradients_match_finite_differences(NewtonMode mode) {
  static_assert(ForwardFamily == Family || ForwardFamily == CompiledNewtonModes::sequential);
  const int B = 2, T_steps = 5, N = 4;
  const auto W = contractive_matrix<Space>(N, 11, 1.5);
  View3<double, Space> u("u", B, T_steps, N), h("h", B, T_steps, N), g("g", B, T_steps, N), du("du", B, T_steps, N);
  View2<double, Space> h0("h0", B, N), dh0("dh0", B, N);
  View1<double, Space> dW("dW", N * N);
  fill_uniform(u, -1, 1, 12);
  fill_uniform(h0, -0.5, 0.5, 13);
  fill_uniform(g, -1, 1, 14);
  const ElmanCell<double, typename Space::memory_space> cell{W};
  NewtonConfig config;
  config.mode = ForwardFamily == Family ? mode : NewtonMode::sequential;
  config.max_iters = T_steps; // exact after T iterations
  newton_solve<ForwardFamily>(Space{}, cell, u, h, config, h0);
  EXPECT_LE(max_relative_error(h, elman_sequential(as_double2(W), as_double3(u), as_double2(h0))), 1e-12);
  config.mode = mode;

  Host3 hu = as_double3(u), hg = as_double3(g);
  Host2 hW = as_double2(W), hh0 = as_double2(h0);
  auto loss = [&]() {
    const Host3 hh = elman_sequential(hW, hu, hh0);
    double sum = 0;
    for (std::size_t i = 0; i < hh.span(); ++i) sum += hg.data()[i] * hh.data()[i];
    return sum;
  };
  newton_backward<Family>(Space{}, cell, u, h, g, du, dW, h0, dh0, config);
  expect_gradient_matches_central_differences(du, hu.data(), hu.span(), loss, "du");
  expect_gradient_matches_central_differences(dW, hW.data(), hW.span(), loss, "dW");
  expect_gradient_matches_central_differences(dh0, hh0.data(), hh0.span(), loss, "dh0");
}

// A state one wider than the cell's DenseUpTo<MaxN> is an error that names the bound (checked before
// any kernel runs: the call compiles the cheapest, the sequential loop).
template <class Space, int MaxN>
void expect_wider_state_rejected() {
  View2<double, Space> W("W", MaxN + 1, MaxN + 1);
  View3<double, Space> u("u", 1, 4, MaxN + 1), h("h", 1, 4, MaxN + 1);
  EXPECT_THROW(
      {
        try {
          newton_solve<CompiledNewtonModes::sequential>(Space{}, ElmanCell<double, typename Space::memory_space, MaxN>{W}, u, h);
        } catch (const std::invalid_argument& e) {
          EXPECT_THAT(e.what(), ::testing::HasSubstr("1 <= N <= " + std::to_string(MaxN)));
          throw;
        }
      },
      std::invalid_argument);
}

} // namespace paraseq::test
