// The one-pass Newton mode (newton_one_pass.hpp) with ParaGRU and ParaLSTM (2 x 2 blocks): against
// the newton mode after the same iterations (the same mathematics, so equal to rounding, also
// before convergence), against the float64 sequential loop once converged, bitwise repeatable,
// over sequences of many windows, shorter than one window and of one step; on every enabled space.

#include <paraseq/solvers/cells.hpp>
#include <paraseq/solvers/newton.hpp>

#include "newton_test_problems.hpp"
#include "test_support.hpp"

#include <cstring>
#include <string>
#include <vector>

namespace {

using namespace paraseq;
using namespace paraseq::test;

constexpr int window_steps = 16;
// 37 windows and a ragged tail of 5 steps.
constexpr int many_windows = 37 * window_steps + 5;

// The one-pass mode with 16-step windows: one thread per window, and the window shared by several
// threads where the space allows it (their maps composed into the window's).
template <class Space>
std::vector<NewtonConfig> one_pass_configs(int iterations) {
  std::vector<NewtonConfig> configs{with_mode(NewtonMode::one_pass, {}, window_steps)};
  if (const int threads = std::min(4, shared_window_threads<Space>()); threads > 1) {
    configs.push_back(configs.back());
    configs.back().fused_team_threads = threads;
  }
  for (NewtonConfig& config : configs) config.max_iters = iterations;
  return configs;
}

std::string describe(const NewtonConfig& config) {
  return "K=" + std::to_string(config.max_iters) + " window=" + std::to_string(config.fused_window) +
         " threads=" + std::to_string(config.fused_team_threads);
}

// Solves `problem` with h0 in the one-pass mode with every config and K iterations, and checks it
// against the newton mode with K iterations (relative 1e-12) and, when `converged`, against the
// float64 loop from h0 (`reference`, 1e-10).
template <class Space, class Problem>
void check_one_pass(const Problem& problem, const View2<double, Space>& h0, const Host3& reference, int iterations,
                    bool converged) {
  const int B = int(problem.u.extent(0)), T = int(problem.u.extent(1)), N = int(reference.extent(2));
  View3<double, Space> h("h", B, T, N), by_newton("by_newton", B, T, N);
  NewtonConfig newton = with_mode(NewtonMode::newton);
  newton.max_iters = iterations;
  newton_solve(Space{}, problem.cell(), problem.u, by_newton, newton, h0);
  const Host3 newton_result = as_double3(by_newton);
  for (const NewtonConfig& config : one_pass_configs<Space>(iterations)) {
    SCOPED_TRACE(describe(config));
    Kokkos::deep_copy(h, NAN);
    NewtonStats<typename Space::memory_space> stats;
    newton_solve(Space{}, problem.cell(), problem.u, h, config, h0, &stats);
    EXPECT_EQ(stats.mode, NewtonMode::one_pass);
    EXPECT_EQ(stats.iterations, iterations);
    EXPECT_LE(max_relative_error(h, newton_result), 1e-12);
    if (converged) EXPECT_LE(max_abs_difference(as_double3(h), reference), 1e-10);
  }
}

template <class Space>
class NewtonOnePass : public ::testing::Test {};
TYPED_TEST_SUITE(NewtonOnePass, ExecutionSpaces, SpaceName);

// K = 1 and 2 are far from the loop's solution (the newton mode's iterates, not the fused mode's
// window-by-window ones); K = 3 has converged (test_newton.cpp).
TYPED_TEST(NewtonOnePass, GruMatchesNewtonModeAndLoop) {
  using Space = TypeParam;
  for (int T_steps : {many_windows, window_steps - 5, 1}) {
    SCOPED_TRACE("T=" + std::to_string(T_steps));
    GruProblem<double, Space> problem(3, T_steps, 70, 0.5, 81);
    View2<double, Space> h0("h0", 3, 70);
    fill_uniform(h0, -0.5, 0.5, 83);
    const Host3 reference = gru_sequential(as_double2(problem.a), as_double3(problem.u), as_double2(h0));
    for (int iterations : {1, 2, 3}) check_one_pass<Space>(problem, h0, reference, iterations, iterations == 3);
  }
}

// ParaLSTM's 2 x 2 blocks: K = 4 has converged to float64 rounding (test_newton.cpp).
TYPED_TEST(NewtonOnePass, LstmMatchesNewtonModeAndLoop) {
  using Space = TypeParam;
  for (int T_steps : {many_windows, window_steps - 5, 1}) {
    SCOPED_TRACE("T=" + std::to_string(T_steps));
    LstmProblem<double, Space> problem(2, T_steps, 37, 0.5, 85);
    View2<double, Space> h0("h0", 2, 74);
    fill_uniform(h0, -0.5, 0.5, 87);
    const Host3 reference =
        lstm_sequential(as_double2(problem.a), as_double2(problem.p), as_double3(problem.u), as_double2(h0));
    for (int iterations : {1, 4}) check_one_pass<Space>(problem, h0, reference, iterations, iterations == 4);
  }
}

// The look-back stops at whichever window has published its delta; the result must not depend on it.
TYPED_TEST(NewtonOnePass, RepeatedSolvesAreBitwiseEqual) {
  using Space = TypeParam;
  GruProblem<float, Space> problem(2, 64 * window_steps + 3, 33, 0.5, 89, 1.5);
  View3<float, Space> first("first", 2, 64 * window_steps + 3, 33), again("again", 2, 64 * window_steps + 3, 33);
  for (const NewtonConfig& config : one_pass_configs<Space>(3)) {
    SCOPED_TRACE(describe(config));
    newton_solve(Space{}, problem.cell(), problem.u, first, config);
    const auto expected = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, first);
    for (int repeat = 0; repeat < 5; ++repeat) {
      newton_solve(Space{}, problem.cell(), problem.u, again, config);
      const auto result = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, again);
      EXPECT_EQ(std::memcmp(expected.data(), result.data(), expected.span() * sizeof(float)), 0);
    }
  }
}

TYPED_TEST(NewtonOnePass, RefusesResidualAtol) {
  using Space = TypeParam;
  GruProblem<double, Space> problem(1, 8, 2, 0.5, 91);
  View3<double, Space> h("h", 1, 8, 2);
  NewtonConfig config = with_mode(NewtonMode::one_pass);
  config.residual_atol = 1e-8;
  EXPECT_THROW(newton_solve(Space{}, problem.cell(), problem.u, h, config), std::invalid_argument);
}

} // namespace
