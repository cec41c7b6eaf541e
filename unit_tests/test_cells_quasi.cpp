// The quasi-Newton mode (NewtonJacobian::quasi: the diagonal of the Jacobian, a diagonal scan) of the
// Elman cell against a float64 loop of the same iteration: its own unit, beside test_cells.cpp, so
// that it compiles the quasi kernels alone.

#include "elman_cell.hpp"
#include "test_support.hpp"

#include <cmath>
#include <vector>

namespace {

using namespace paraseq;
using namespace paraseq::test;

// `iterations` quasi-Newton iterations from the zero iterate, one time step after another in
// float64: x_t <- f(x_{t-1}, u_t) + diag(J(x_{t-1}, u_t)) (x'_{t-1} - x_{t-1}), where x is the previous
// iterate and x' the new one (x'_{-1} = x_{-1} = 0, the zero initial state).
Host3 elman_quasi_newton_iterates(const Host2& W, const Host3& u, int iterations) {
  const int B = int(u.extent(0)), T = int(u.extent(1)), N = int(W.extent(0));
  Host3 iterate("quasi_reference", B, T, N), next("quasi_next", B, T, N);
  for (int k = 0; k < iterations; ++k) {
    for (int b = 0; b < B; ++b)
      for (int t = 0; t < T; ++t)
        for (int i = 0; i < N; ++i) {
          double pre = u(b, t, i);
          for (int j = 0; j < N; ++j) pre += W(i, j) * (t > 0 ? iterate(b, t - 1, j) : 0.0);
          const double f = std::tanh(pre), diagonal = (1 - f * f) * W(i, i);
          const double change = t > 0 ? next(b, t - 1, i) - iterate(b, t - 1, i) : 0.0;
          next(b, t, i) = f + diagonal * change;
        }
    Kokkos::deep_copy(iterate, next);
  }
  return iterate;
}

template <class Space>
class QuasiCells : public ::testing::Test {};
TYPED_TEST_SUITE(QuasiCells, ExecutionSpaces, SpaceName);

// Quasi-Newton keeps only diag(J): each iteration is the float64 loop's, and it still converges
// (linearly), to the sequential loop's states.
TYPED_TEST(QuasiCells, ElmanQuasiNewtonIteratesAsTheLoopAndConverges) {
  using Space = TypeParam;
  const int B = 2, T_steps = 300, N = 6;
  const auto W = contractive_matrix<Space>(N, 7, 0.6);
  View3<double, Space> u("u", B, T_steps, N), h("h", B, T_steps, N);
  fill_uniform(u, -0.5, 0.5, 8);
  const ElmanCell<double, typename Space::memory_space> cell{W};
  NewtonConfig config;
  config.mode = NewtonMode::newton;
  config.jacobian = NewtonJacobian::quasi;
  config.initial_guess = InitialGuess::zeros;
  constexpr auto modes = CompiledNewtonModes::newton_quasi;
  for (const int iterations : {1, 2, 5}) {
    SCOPED_TRACE("iterations=" + std::to_string(iterations));
    config.max_iters = iterations;
    Kokkos::deep_copy(h, NAN);
    newton_solve<modes>(Space{}, cell, u, h, config, ZeroInitialState{});
    EXPECT_LE(max_relative_error(h, elman_quasi_newton_iterates(as_double2(W), as_double3(u), iterations)), 1e-12);
  }
  config.max_iters = 60;
  config.residual_atol = 1e-13;
  NewtonStats<typename Space::memory_space> stats;
  Kokkos::deep_copy(h, NAN);
  newton_solve<modes>(Space{}, cell, u, h, config, ZeroInitialState{}, &stats);
  EXPECT_LE(max_relative_error(h, elman_sequential(as_double2(W), as_double3(u))), 1e-11);
  EXPECT_LT(stats.iterations, config.max_iters);
  EXPECT_GT(stats.iterations, 5); // linear convergence: the exact Jacobian's Newton needs fewer here
}

} // namespace
