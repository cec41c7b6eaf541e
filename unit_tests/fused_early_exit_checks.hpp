#pragma once
// The fused mode's early exit (NewtonConfig::residual_atol, solvers/newton_fused.hpp) for any cell:
// the checks test_newton.cpp (ParaGRU, cached linearisations) and test_cells_fused.cpp (the dense
// Elman cell, evaluated again in the re-run) share.

#include <paraseq/solvers/newton.hpp>

#include "test_support.hpp"

#include <string>

namespace paraseq::test {

// With residual_atol the fused mode stops before max_iters on a contractive cell, its result's
// max |F| (residual_of: a float64 loop over h_t - f(h_{t-1}), h_{-1} = h0) is <= atol, it matches
// the float64 sequential loop `reference` within the error an atol-sized residual leaves behind
// (atol / (1 - L) through a recurrence that contracts by L; L < 0.9 here: 10 atol), a repeated solve
// is bitwise equal,
// and an atol no window reaches runs all K iterations, bitwise as the fixed-K fused mode.
template <class Space, CompiledNewtonModes Modes, class Cell, class UView, class H0View, class ResidualOf>
void expect_fused_early_exit(const Cell& cell, const UView& u, const H0View& h0, const Host3& reference,
                             const ResidualOf& residual_of, int window) {
  const int B = int(u.extent(0)), T_steps = int(u.extent(1)), N = cell.state_size();
  SCOPED_TRACE("T=" + std::to_string(T_steps) + " window=" + std::to_string(window));
  View3<double, Space> h("h", B, T_steps, N), again("again", B, T_steps, N), fixed("fixed", B, T_steps, N);
  NewtonConfig config;
  config.mode = NewtonMode::fused;
  config.fused_window = window;
  config.max_iters = 30;
  config.residual_atol = 1e-10;
  NewtonStats<typename Space::memory_space> stats;
  newton_solve<Modes>(Space{}, cell, u, h, config, h0, &stats);
  EXPECT_EQ(stats.mode, NewtonMode::fused);
  EXPECT_GE(stats.iterations, 1);
  EXPECT_LT(stats.iterations, config.max_iters);
  EXPECT_LE(residual_of(as_double3(h)), *config.residual_atol);
  EXPECT_LE(max_relative_error(h, reference), 10 * *config.residual_atol);

  NewtonStats<typename Space::memory_space> stats_again;
  newton_solve<Modes>(Space{}, cell, u, again, config, h0, &stats_again);
  EXPECT_TRUE(bitwise_equal(h, again));
  EXPECT_EQ(stats_again.iterations, stats.iterations);

  // Three iterations from f(0, u) leave every window far above 1e-300.
  config.max_iters = 3;
  config.residual_atol = 1e-300;
  newton_solve<Modes>(Space{}, cell, u, again, config, h0, &stats_again);
  EXPECT_EQ(stats_again.iterations, 3);
  config.residual_atol.reset();
  newton_solve<Modes>(Space{}, cell, u, fixed, config, h0, &stats);
  EXPECT_EQ(stats.iterations, 3);
  EXPECT_TRUE(bitwise_equal(again, fixed));
}

} // namespace paraseq::test
