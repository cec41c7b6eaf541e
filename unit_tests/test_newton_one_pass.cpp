// The one-pass Newton mode (newton_one_pass.hpp) with ParaGRU and ParaLSTM (2 x 2 blocks): against
// the newton mode after the same iterations (the same mathematics, so equal to rounding, also
// before convergence), from every initial guess and with a damped update, against the float64
// sequential loop once converged, bitwise repeatable, over sequences of many windows, shorter than
// one window and of one step; its adjoint (newton_one_pass_adjoint.hpp) against the newton mode's
// (a reverse scan, then the local products) and bitwise repeatable; on every enabled space.
// test_newton.cpp checks ParaGRU in float against the float64 loop in every mode, this one among
// them, and the adjoint against finite differences and the float64 reverse-mode loop.

#include <paraseq/solvers/cells.hpp>
#include <paraseq/solvers/newton.hpp>
#include <paraseq/solvers/newton_backward.hpp>

#include "newton_test_problems.hpp"
#include "test_support.hpp"

#include <cstring>
#include <string>
#include <vector>

namespace {

using namespace paraseq;
using namespace paraseq::test;

constexpr int window_steps = one_pass_window_steps;
// 37 windows and a ragged tail of 5 steps.
constexpr int many_windows = 37 * window_steps + 5;

std::string describe(const NewtonConfig& config) {
  return "K=" + std::to_string(config.max_iters) + " window=" + std::to_string(config.fused_window) +
         " threads=" + std::to_string(config.fused_team_threads) + " groups=" + std::to_string(config.fused_team_groups);
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

// Each window moves the state before it by omega times the delta entering it, and starts from the
// previous window's initial guess, which in InitialGuess::given lives in h, where that window
// writes its result: every guess and a damped update (omega < 1) against the newton mode after the
// same iterations, before convergence (relative 1e-12).
TYPED_TEST(NewtonOnePass, GuessesAndDampingMatchNewtonMode) {
  using Space = TypeParam;
  const int B = 2, T = many_windows, H = 40;
  GruProblem<double, Space> problem(B, T, H, 0.5, 105);
  View2<double, Space> h0("h0", B, H);
  fill_uniform(h0, -0.5, 0.5, 107);
  View3<double, Space> h("h", B, T, H), by_newton("by_newton", B, T, H);
  for (InitialGuess guess : {InitialGuess::cell_at_zero, InitialGuess::zeros, InitialGuess::given})
    for (double omega : {1.0, 0.6}) {
      NewtonConfig newton = with_mode(NewtonMode::newton);
      newton.initial_guess = guess;
      newton.omega = omega;
      newton.max_iters = 2;
      fill_uniform(by_newton, -0.3, 0.3, 109); // the given guess
      newton_solve(Space{}, problem.cell(), problem.u, by_newton, newton, h0);
      const Host3 expected = as_double3(by_newton);
      for (NewtonConfig config : one_pass_configs<Space>(2)) {
        config.initial_guess = guess;
        config.omega = omega;
        SCOPED_TRACE(describe(config) + " guess=" + std::to_string(int(guess)) + " omega=" + std::to_string(omega));
        fill_uniform(h, -0.3, 0.3, 109);
        newton_solve(Space{}, problem.cell(), problem.u, h, config, h0);
        EXPECT_LE(max_relative_error(h, expected), 1e-12);
      }
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

// The one-pass adjoint against the newton mode's at the same converged h (relative 1e-12): dL/du,
// the parameters' gradient and dL/dh0, for loss <g, h>.
template <class Space, class Problem>
void check_one_pass_gradients(const Problem& problem, int N, int param_count, unsigned seed) {
  const int B = int(problem.u.extent(0)), T = int(problem.u.extent(1)), U = int(problem.u.extent(2));
  View3<double, Space> h("h", B, T, N), g("g", B, T, N), du_newton("du_newton", B, T, U), du("du", B, T, U);
  View2<double, Space> h0("h0", B, N), dh0_newton("dh0_newton", B, N), dh0("dh0", B, N);
  View1<double, Space> dparams_newton("dparams_newton", param_count), dparams("dparams", param_count);
  fill_uniform(h0, -0.5, 0.5, seed);
  fill_uniform(g, -1, 1, seed + 1);
  NewtonConfig solve = with_mode(NewtonMode::newton);
  solve.max_iters = 10;
  newton_solve(Space{}, problem.cell(), problem.u, h, solve, h0);
  newton_backward(Space{}, problem.cell(), problem.u, h, g, du_newton, dparams_newton, h0, dh0_newton,
                  with_mode(NewtonMode::newton));
  const auto du_expected = to_host(du_newton);
  const auto dparams_expected = to_host(dparams_newton);
  const auto dh0_expected = to_host(dh0_newton);
  for (const NewtonConfig& config : one_pass_configs<Space>(3)) {
    SCOPED_TRACE(describe(config));
    Kokkos::deep_copy(du, NAN);
    Kokkos::deep_copy(dparams, NAN);
    Kokkos::deep_copy(dh0, NAN);
    newton_backward(Space{}, problem.cell(), problem.u, h, g, du, dparams, h0, dh0, config);
    EXPECT_LE(max_relative_error(du, du_expected), 1e-12);
    EXPECT_LE(max_relative_error(dparams, dparams_expected), 1e-12);
    EXPECT_LE(max_relative_error(dh0, dh0_expected), 1e-12);
  }
}

TYPED_TEST(NewtonOnePass, GruGradientsMatchNewtonModeAdjoint) {
  using Space = TypeParam;
  for (int T_steps : {many_windows, window_steps - 5, 1}) {
    SCOPED_TRACE("T=" + std::to_string(T_steps));
    check_one_pass_gradients<Space>(GruProblem<double, Space>(3, T_steps, 70, 0.5, 93), 70, 3 * 70, 95);
  }
}

TYPED_TEST(NewtonOnePass, LstmGradientsMatchNewtonModeAdjoint) {
  using Space = TypeParam;
  for (int T_steps : {many_windows, window_steps - 5, 1}) {
    SCOPED_TRACE("T=" + std::to_string(T_steps));
    check_one_pass_gradients<Space>(LstmProblem<double, Space>(2, T_steps, 37, 0.5, 97), 74, 5 * 37, 99);
  }
}

// The adjoint's look-back stops at whichever later window has published its nu, and the parameter
// rows of its windows are added in a fixed order: gradients must not depend on either.
TYPED_TEST(NewtonOnePass, RepeatedGradientsAreBitwiseEqual) {
  using Space = TypeParam;
  const int B = 2, T = 64 * window_steps + 3, H = 33;
  GruProblem<float, Space> problem(B, T, H, 0.5, 101, 1.5);
  View3<float, Space> h("h", B, T, H), g("g", B, T, H), du("du", B, T, 3 * H), du_again("du_again", B, T, 3 * H);
  View2<float, Space> dh0("dh0", B, H), dh0_again("dh0_again", B, H);
  View1<float, Space> da("da", 3 * H), da_again("da_again", 3 * H);
  fill_uniform(g, -1, 1, 103);
  for (const NewtonConfig& config : one_pass_configs<Space>(3)) {
    SCOPED_TRACE(describe(config));
    newton_solve(Space{}, problem.cell(), problem.u, h, config);
    newton_backward(Space{}, problem.cell(), problem.u, h, g, du, da, ZeroInitialState{}, dh0, config);
    for (int repeat = 0; repeat < 5; ++repeat) {
      newton_backward(Space{}, problem.cell(), problem.u, h, g, du_again, da_again, ZeroInitialState{}, dh0_again,
                      config);
      EXPECT_TRUE(bitwise_equal(du, du_again));
      EXPECT_TRUE(bitwise_equal(da, da_again));
      EXPECT_TRUE(bitwise_equal(dh0, dh0_again));
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
