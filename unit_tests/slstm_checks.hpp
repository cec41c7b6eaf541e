#pragma once
// The ParaSLSTM tests' shared pieces (test_cells_slstm*.cpp): a float64 loop over t written from the
// sLSTM equations, a state in the cell's domain, and the checks of one Newton mode's forward and
// gradients against that loop, each compiling only the kernel family it is given.

#include <paraseq/solvers/cells.hpp>
#include <paraseq/solvers/newton.hpp>
#include <paraseq/solvers/newton_backward.hpp>

#include "cell_derivative_checks.hpp"
#include "test_support.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>

namespace paraseq::test {

inline constexpr double slstm_eps = 1e-6;

// The sLSTM recurrence over t in double, from the equations of Beck et al. (2024) with exponential
// gates and a diagonal recurrence: u [B, T, 4H] holds the pre-activations (i, f, z, o), r [4, H];
// the state [B, T, 4H] interleaves (c, n, m, h) per channel, h0 [B, 4H] likewise.
inline Host3 slstm_sequential(const Host2& r, const Host3& u, const Host2& h0, double eps) {
  const int B = int(u.extent(0)), T = int(u.extent(1)), H = int(r.extent(1));
  Host3 state("state", B, T, 4 * H);
  for (int b = 0; b < B; ++b)
    for (int k = 0; k < H; ++k) {
      double c = h0(b, 4 * k), n = h0(b, 4 * k + 1), m = h0(b, 4 * k + 2), h = h0(b, 4 * k + 3);
      for (int t = 0; t < T; ++t) {
        const double i_tilde = u(b, t, k) + r(0, k) * h;
        const double f_tilde = u(b, t, H + k) + r(1, k) * h;
        const double z_tilde = u(b, t, 2 * H + k) + r(2, k) * h;
        const double o_tilde = u(b, t, 3 * H + k) + r(3, k) * h;
        const double m_next = std::max(f_tilde + m, i_tilde);
        const double input_gate = std::exp(i_tilde - m_next);
        const double forget_gate = std::exp(f_tilde + m - m_next);
        c = forget_gate * c + input_gate * std::tanh(z_tilde);
        n = forget_gate * n + input_gate;
        m = m_next;
        h = 1 / (1 + std::exp(-o_tilde)) * c / (n + eps);
        state(b, t, 4 * k) = c;
        state(b, t, 4 * k + 1) = n;
        state(b, t, 4 * k + 2) = m;
        state(b, t, 4 * k + 3) = h;
      }
    }
  return state;
}

// A state with n >= 0 (the cell's domain), drawn per slot.
template <class View>
void fill_state(const View& state, unsigned seed) {
  fill_uniform(state, -1, 1, seed);
  edit_on_host(state, [](auto& host) {
    for (std::size_t i = 1; i < host.span(); i += 4) host.data()[i] = 0.25 + std::fabs(host.data()[i]);
  });
}

// One mode's solve (of family Family: the kernels this call compiles) against the float64 loop over
// T = 160 steps from a random h0 with n0 > 0. The exact Jacobian needs many iterations here
// (docs/solvers.md, "ParaSLSTM's convergence"): K = 30 for T = 160, and in the fused mode K = W, for
// which a window of W steps is exact whatever the cell; the quasi Jacobian stops at a residual of
// 1e-13, in fewer than 60 iterations.
template <class Space, CompiledNewtonModes Family>
void expect_slstm_mode_matches_the_loop(NewtonMode mode, NewtonJacobian jacobian, int iterations) {
  const int B = 2, T_steps = 160, H = 5;
  View2<double, Space> r("r", 4, H), h0("h0", B, 4 * H);
  View3<double, Space> u("u", B, T_steps, 4 * H), h("h", B, T_steps, 4 * H);
  fill_uniform(r, -0.5, 0.5, 11);
  fill_uniform(u, -1, 1, 12);
  fill_state(h0, 13);
  const Host3 reference = slstm_sequential(as_double2(r), as_double3(u), as_double2(h0), slstm_eps);
  const ParaSLSTM<double, typename Space::memory_space> cell{r, slstm_eps};
  NewtonConfig config;
  config.mode = mode;
  config.jacobian = jacobian;
  config.max_iters = iterations;
  config.fused_window = 16;
  if (jacobian == NewtonJacobian::quasi) config.residual_atol = 1e-13;
  Kokkos::deep_copy(h, NAN);
  NewtonStats<typename Space::memory_space> stats;
  newton_solve<Family>(Space{}, cell, u, h, config, h0, &stats);
  EXPECT_EQ(stats.mode, mode);
  EXPECT_LE(max_relative_error(h, reference), 1e-11);
  if (jacobian == NewtonJacobian::quasi) EXPECT_LT(stats.iterations, 60);
}

// newton_backward in one mode (of family Family) against central differences of the float64 loop's
// loss sum(g * state), for du, dr and dh0.
template <class Space, CompiledNewtonModes Family>
void expect_slstm_gradients_match_finite_differences(NewtonMode mode) {
  const int B = 2, T_steps = 6, H = 3;
  View2<double, Space> r("r", 4, H), h0("h0", B, 4 * H), dh0("dh0", B, 4 * H);
  View3<double, Space> u("u", B, T_steps, 4 * H), h("h", B, T_steps, 4 * H), g("g", B, T_steps, 4 * H),
      du("du", B, T_steps, 4 * H);
  View1<double, Space> dr("dr", 4 * H);
  fill_uniform(r, -0.5, 0.5, 21);
  fill_uniform(u, -1.5, 1.5, 22);
  fill_state(h0, 23);
  fill_uniform(g, -1, 1, 24);
  const ParaSLSTM<double, typename Space::memory_space> cell{r, slstm_eps};
  Host2 hr = as_double2(r); // a copy: perturbed by the differences below
  Host3 hu = as_double3(u), hg = as_double3(g);
  Host2 hh0 = as_double2(h0);
  auto loss = [&]() {
    const Host3 state = slstm_sequential(hr, hu, hh0, slstm_eps);
    double sum = 0;
    for (std::size_t i = 0; i < state.span(); ++i) sum += hg.data()[i] * state.data()[i];
    return sum;
  };
  NewtonConfig config;
  config.mode = mode;
  config.max_iters = 12;
  newton_solve<Family>(Space{}, cell, u, h, config, h0);
  EXPECT_LE(max_relative_error(h, slstm_sequential(hr, hu, hh0, slstm_eps)), 1e-12);
  Kokkos::deep_copy(du, NAN);
  Kokkos::deep_copy(dr, NAN);
  Kokkos::deep_copy(dh0, NAN);
  newton_backward<Family>(Space{}, cell, u, h, g, du, dr, h0, dh0, config);
  expect_gradient_matches_central_differences(du, hu.data(), hu.span(), loss, "du");
  expect_gradient_matches_central_differences(dr, hr.data(), hr.span(), loss, "dr");
  expect_gradient_matches_central_differences(dh0, hh0.data(), hh0.span(), loss, "dh0");
}

} // namespace paraseq::test
