// Gradients through the Runge–Kutta loops (the discrete adjoint) on every enabled execution space:
// the same bits across checkpoint intervals, batch chunks and loop modes, for fixed and adaptive
// steps, and adaptive gradients against the closed form. Finite differences, zero steps and bad
// shapes: test_rk_gradients.cpp; reverse mode through a test loop and dual numbers:
// test_rk_gradients_reverse.cpp (separate translation units because each compiles many loop
// kernels). Calls whose subject is not the loop mode compile the fused loop alone (fused_only):
// for the built-in fields, the paraseq library's instances.

#include "rk_test_support.hpp"

#include <gmock/gmock.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <tuple>
#include <utility>
#include <vector>

namespace {

using namespace paraseq;
using namespace paraseq::test;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

template <class Space>
class RungeKuttaGradientModes : public ::testing::Test {};
TYPED_TEST_SUITE(RungeKuttaGradientModes, ExecutionSpaces, SpaceName);

constexpr std::size_t ample_workspace = std::size_t(1) << 30;

// Checkpoint intervals and batch chunks change what the loops store and recompute, never the bits
// of a gradient: the MLP's shared weights, summed over the trajectories in row order, included.
TYPED_TEST(RungeKuttaGradientModes, CheckpointIntervalsAndChunksGiveTheSameBits) {
  using Space = TypeParam;
  const int N = 10, n = 3, hidden = 4, Q = 2 * n * hidden + hidden + n, steps = 37;
  View2<float, Space> y0("y0", N, n), y1("y1", N, n), w("w", N, n);
  View1<float, Space> weights("weights", Q);
  fill_uniform(y0, -1, 1, 41);
  fill_uniform(w, -1, 1, 42);
  fill_uniform(weights, -0.8, 0.8, 43);
  const auto problem = ode::problem(ode::Mlp{n, hidden}, y0, ode::NoView{}, weights);
  const auto mesh = ode::FixedSteps::count(0, 0.05, steps);
  auto gradients = [&](int interval, std::size_t workspace) {
    View2<float, Space> y0_bar("y0_bar", N, n);
    View1<float, Space> weights_bar("weights_bar", Q);
    ode::SolveOptions options;
    options.checkpoint_interval = interval;
    options.max_gradient_workspace_bytes = workspace;
    ode::solve_with_gradient<fused_only>(
        Space{}, ode::DormandPrince5{}, problem, mesh, ode::final_state(y1), ode::final_state(w),
        ode::Gradients<decltype(y0_bar), ode::NoView, decltype(weights_bar)>{y0_bar, {}, weights_bar}, options);
    return std::make_pair(y0_bar, weights_bar);
  };
  const auto reference = gradients(0, ample_workspace);
  const std::size_t three = 3 * ode::gradient_workspace_bytes<float>(false, n, steps, 1, Q);
  for (auto [interval, workspace] :
       {std::pair{1, three}, std::pair{5, three}, std::pair{37, ample_workspace}, std::pair{100, ample_workspace}}) {
    const auto other = gradients(interval, workspace);
    EXPECT_TRUE(bitwise_equal(other.first, reference.first)) << "interval " << interval;
    EXPECT_TRUE(bitwise_equal(other.second, reference.second)) << "interval " << interval;
  }
  EXPECT_THAT(Call([&] { gradients(0, 64); }),
              ThrowsMessage<std::invalid_argument>(AllOf(HasSubstr("'options.max_gradient_workspace_bytes'"),
                                                         HasSubstr("the workspace of one trajectory"))));
}

// Twelve damped oscillators stepped by DormandPrince5 over [0, 4] (rtol 1e-9) and observed at 1.5:
// trajectories of different step counts; the outputs and the cotangents of a loss on them.
template <class Space>
struct AdaptiveOscillators {
  static constexpr int N = 12, n = 2;
  OscillatorBatch<double, Space> batch;
  View2<double, Space> y1{"y1", N, n}, w{"w", N, n};
  View3<double, Space> observed{"observed", N, 1, n}, w_obs{"w_obs", N, 1, n};
  ode::AdaptiveSteps steps;
  explicit AdaptiveOscillators(unsigned seed) : batch(N, seed) {
    fill_uniform(w, -1, 1, seed + 1);
    fill_uniform(w_obs, -1, 1, seed + 2);
    steps.t_end = 4, steps.rtol = 1e-9, steps.atol = 1e-11;
    steps.observation_times = {1.5};
  }
  using Gradients = ode::Gradients<View2<double, Space>, View2<double, Space>>;
  // The loss's gradients of y0 and of the parameters under `options`, with the solve's report.
  template <ode::CompiledModes Modes = ode::CompiledModes::all>
  auto gradient(const ode::SolveOptions& options) const {
    const Gradients g{View2<double, Space>("y0_bar", N, n), View2<double, Space>("p_bar", N, n)};
    const auto report = ode::solve_with_gradient<Modes>(Space{}, ode::DormandPrince5{}, batch.problem(), steps,
                                                        ode::final_and_observed(y1, observed),
                                                        ode::final_and_observed(w, w_obs), g, options);
    return std::pair{g, report};
  }
};

// Adaptive steps: trajectories of different step counts, whose segments are counted back from
// each one's last step (Checkpoints in integrate_kernels.hpp). Every interval (1: every state
// checkpointed, nothing replayed; more steps than any trajectory takes: one segment) and chunking
// gives the same bits, observations between the ends included.
TYPED_TEST(RungeKuttaGradientModes, AdaptiveCheckpointIntervalsAndChunksGiveTheSameBits) {
  using Space = TypeParam;
  const AdaptiveOscillators<Space> problem(53);
  const int N = problem.N, n = problem.n;
  std::vector<int> accepted;
  auto gradients = [&](int interval, std::size_t workspace) {
    ode::SolveOptions options;
    options.checkpoint_interval = interval;
    options.max_gradient_workspace_bytes = workspace;
    const auto [g, report] = problem.template gradient<fused_only>(options);
    const auto counts = to_host(report.accepted);
    accepted.assign(counts.data(), counts.data() + N);
    return g;
  };
  const auto reference = gradients(1, ample_workspace);
  const int most = *std::max_element(accepted.begin(), accepted.end());
  ASSERT_GT(most - *std::min_element(accepted.begin(), accepted.end()), 3) << "step counts that differ";
  const std::size_t three = 3 * ode::gradient_workspace_bytes<double>(true, n, most, 3, 0);
  for (auto [interval, workspace] : {std::pair{0, ample_workspace}, std::pair{3, three}, std::pair{7, ample_workspace},
                                     std::pair{most + 5, ample_workspace}}) {
    const auto other = gradients(interval, workspace);
    EXPECT_TRUE(bitwise_equal(other.y0, reference.y0)) << "interval " << interval;
    EXPECT_TRUE(bitwise_equal(other.params, reference.params)) << "interval " << interval;
  }
}

// SolveOptions::accepted_steps: solve()'s step counts replace the gradient's counting pass and give
// the bits of the gradient that counts them, in the fused and the stepped loop, in one chunk and in
// several; counts that the problem does not take (one too many, or all too few to hold the
// checkpoints) are refused before the backward pass, naming the first trajectory that differs.
TYPED_TEST(RungeKuttaGradientModes, ForwardStepCountsGiveTheBitsOfCountedOnes) {
  using Space = TypeParam;
  const AdaptiveOscillators<Space> problem(57);
  const int N = problem.N, n = problem.n;
  const auto forward = ode::solve(Space{}, ode::DormandPrince5{}, problem.batch.problem(), problem.steps,
                                  ode::final_and_observed(problem.y1, problem.observed));
  auto gradients = [&](const int* counts, ode::LoopMode mode, std::size_t workspace) {
    ode::SolveOptions options;
    options.accepted_steps = counts;
    options.mode = mode;
    options.checkpoint_interval = 3;
    options.max_gradient_workspace_bytes = workspace;
    const auto [g, report] = problem.gradient(options);
    EXPECT_TRUE(bitwise_equal(report.accepted, forward.accepted));
    EXPECT_EQ(report.max_accepted, forward.max_accepted);
    return g;
  };
  const auto reference = gradients(nullptr, ode::LoopMode::fused, ample_workspace);
  const std::size_t three = 3 * ode::gradient_workspace_bytes<double>(true, n, forward.max_accepted, 3, 0);
  for (const ode::LoopMode mode : {ode::LoopMode::fused, ode::LoopMode::stepped})
    for (const std::size_t workspace : {ample_workspace, three}) {
      const auto given = gradients(forward.accepted.data(), mode, workspace);
      EXPECT_TRUE(bitwise_equal(given.y0, reference.y0)) << "mode " << int(mode) << ", workspace " << workspace;
      EXPECT_TRUE(bitwise_equal(given.params, reference.params)) << "mode " << int(mode) << ", workspace " << workspace;
    }
  Kokkos::View<int*, typename Space::memory_space> wrong("wrong", N);
  for (const auto& [edit, first] : {std::pair{+[](int, int) { return 1; }, 0},
                                    std::pair{+[](int i, int count) { return i == 5 ? count + 1 : count; }, 5}}) {
    Kokkos::deep_copy(wrong, forward.accepted);
    edit_on_host(wrong, [&](auto& host) {
      for (int i = 0; i < N; ++i) host(i) = edit(i, host(i));
    });
    EXPECT_THAT(Call([&] { gradients(wrong.data(), ode::LoopMode::fused, ample_workspace); }),
                ThrowsMessage<std::invalid_argument>(AllOf(HasSubstr("'options.accepted_steps'"),
                                                           HasSubstr("for trajectory " + std::to_string(first) + ","))));
  }
}

// What the lag is for: walking back from its last step, a trajectory of any step count enters a
// new segment (and replays it) exactly at iterations 0, k, 2k, ... of the backward loop, so a warp's
// trajectories replay together.
TEST(RungeKuttaCheckpointSegments, EveryStepCountReplaysAtTheSameBackwardIterations) {
  using Host = Kokkos::DefaultHostExecutionSpace;
  for (int k : {1, 3, 7}) {
    ode::detail::Checkpoints<double, Host> checkpoints;
    checkpoints.interval = k;
    checkpoints.lag = decltype(checkpoints.lag)("lag", 1);
    for (int steps = 1; steps <= 30; ++steps) {
      checkpoints.lag(0) = (k - steps % k) % k;
      EXPECT_EQ(checkpoints.segment_start(true, 0, checkpoints.segment_of(true, 0, 0)), 0);
      for (int it = 0; it < steps; ++it) {
        const int step = steps - 1 - it;
        const bool enters = it == 0 || checkpoints.segment_of(true, 0, step) != checkpoints.segment_of(true, 0, step + 1);
        EXPECT_EQ(enters, it % k == 0) << "interval " << k << ", " << steps << " steps, backward iteration " << it;
      }
    }
  }
}

// Shared gradients of more trajectories than one block of their sum holds (OrderedColumnSum: 256
// rows per block here), in chunks that start inside blocks: the same bits as in one chunk, and
// within float's accuracy of the sum of one-trajectory solves.
TYPED_TEST(RungeKuttaGradientModes, SharedGradientBlocksGiveTheSameBitsInEveryChunking) {
  using Space = TypeParam;
  const int N = 1100, n = 3, hidden = 4, Q = 2 * n * hidden + hidden + n, steps = 12;
  View2<float, Space> y0("y0", N, n), y1("y1", N, n), w("w", N, n);
  View1<float, Space> weights("weights", Q);
  fill_uniform(y0, -1, 1, 46);
  fill_uniform(w, -1, 1, 47);
  fill_uniform(weights, -0.8, 0.8, 48);
  const auto mesh = ode::FixedSteps::count(0, 0.05, steps);
  auto gradient = [&](const View2<float, Space>& starts, const View2<float, Space>& cotangents, std::size_t workspace) {
    View1<float, Space> weights_bar("weights_bar", Q);
    ode::SolveOptions options;
    options.max_gradient_workspace_bytes = workspace;
    View2<float, Space> out("out", starts.extent(0), n);
    ode::solve_with_gradient<fused_only>(
        Space{}, ode::RK4{}, ode::problem(ode::Mlp{n, hidden}, starts, ode::NoView{}, weights), mesh,
        ode::final_state(out), ode::final_state(cotangents),
        ode::Gradients<ode::NoView, ode::NoView, decltype(weights_bar)>{{}, {}, weights_bar}, options);
    return weights_bar;
  };
  const auto reference = gradient(y0, w, ample_workspace);
  const std::size_t one = ode::gradient_workspace_bytes<float>(false, n, steps, 0, Q);
  for (std::size_t trajectories : {300, 7}) {
    EXPECT_TRUE(bitwise_equal(gradient(y0, w, trajectories * one), reference)) << trajectories << " per chunk";
  }
  // The sum of the trajectories' own gradients, each from a solve of one, added in double.
  std::vector<double> sum(Q, 0.0);
  for (int i = 0; i < N; ++i) {
    const auto row = std::make_pair(i, i + 1);
    View2<float, Space> start("start", 1, n), cotangent("cotangent", 1, n);
    Kokkos::deep_copy(start, Kokkos::subview(y0, row, Kokkos::ALL));
    Kokkos::deep_copy(cotangent, Kokkos::subview(w, row, Kokkos::ALL));
    const auto part = to_host(gradient(start, cotangent, ample_workspace));
    for (int q = 0; q < Q; ++q) sum[q] += part(q);
  }
  const auto total = to_host(reference);
  for (int q = 0; q < Q; ++q) EXPECT_NEAR(total(q), sum[q], 1e-5 * (1 + std::fabs(sum[q]))) << "weight " << q;
}

// The stepped loops (one launch per step, forward and backward, the own parameters' gradients
// carried between launches) give the bits of the fused loop, across checkpoint intervals and
// chunks; a call that compiles the fused loop alone runs the same kernel, and refuses the stepped
// mode. Adaptive steps: AdaptiveGradientsMatchTheClosedForm.
TYPED_TEST(RungeKuttaGradientModes, SteppedLoopsGiveTheBitsOfTheFusedLoop) {
  using Space = TypeParam;
  const int N = 10, n = 2, steps = 37;
  const OscillatorBatch<float, Space> batch(N, 44);
  View2<float, Space> y1("y1", N, n), w("w", N, n);
  fill_uniform(w, -1, 1, 45);
  const auto mesh = ode::FixedSteps::count(0, 0.05, steps);
  using Gradients = ode::Gradients<View2<float, Space>, View2<float, Space>>;
  auto gradients = [&](int interval, std::size_t workspace, ode::LoopMode mode) {
    const Gradients g{View2<float, Space>("y0_bar", N, n), View2<float, Space>("p_bar", N, n)};
    ode::SolveOptions options;
    options.checkpoint_interval = interval;
    options.max_gradient_workspace_bytes = workspace;
    options.mode = mode;
    ode::solve_with_gradient(Space{}, ode::DormandPrince5{}, batch.problem(), mesh, ode::final_state(y1),
                             ode::final_state(w), g, options);
    return g;
  };
  const auto reference = gradients(0, ample_workspace, ode::LoopMode::fused);
  const std::size_t three = 3 * ode::gradient_workspace_bytes<float>(false, n, steps, 1, 0);
  for (auto [interval, workspace] : {std::pair{5, three}, std::pair{37, ample_workspace}}) {
    const auto stepped = gradients(interval, workspace, ode::LoopMode::stepped);
    EXPECT_TRUE(bitwise_equal(stepped.y0, reference.y0)) << "interval " << interval;
    EXPECT_TRUE(bitwise_equal(stepped.params, reference.params)) << "interval " << interval;
  }
  const Gradients alone{View2<float, Space>("y0_bar", N, n), View2<float, Space>("p_bar", N, n)};
  ode::solve_with_gradient<fused_only>(Space{}, ode::DormandPrince5{}, batch.problem(), mesh, ode::final_state(y1),
                                       ode::final_state(w), alone);
  EXPECT_TRUE(bitwise_equal(alone.y0, reference.y0));
  EXPECT_TRUE(bitwise_equal(alone.params, reference.params));
  ode::SolveOptions stepped;
  stepped.mode = ode::LoopMode::stepped;
  EXPECT_THAT(Call([&] {
                ode::solve_with_gradient<fused_only>(Space{}, ode::DormandPrince5{}, batch.problem(), mesh,
                                                     ode::final_state(y1), ode::final_state(w), alone, stepped);
              }),
              ThrowsMessage<std::invalid_argument>(AllOf(HasSubstr("'options.mode'"), HasSubstr("fused_only"))));
}

TYPED_TEST(RungeKuttaGradientModes, AdaptiveGradientsMatchTheClosedForm) {
  using Space = TypeParam;
  const int N = 5;
  const double t_end = 3, inside = 1.234;
  const OscillatorBatch<double, Space> batch(N);
  View2<double, Space> y1("y1", N, 2), w("w", N, 2), y0_bar("y0_bar", N, 2), p_bar("p_bar", N, 2);
  View3<double, Space> observed("observed", N, 1, 2), w_obs("w_obs", N, 1, 2);
  fill_uniform(w, -1, 1, 51);
  fill_uniform(w_obs, -1, 1, 52);
  auto steps = ode::AdaptiveSteps{};
  steps.t_end = t_end, steps.rtol = 1e-10, steps.atol = 1e-12;
  steps.observation_times = {inside};
  const ode::Gradients<decltype(y0_bar), decltype(p_bar)> gradients{y0_bar, p_bar};
  ode::solve_with_gradient(Space{}, ode::DormandPrince5{}, batch.problem(), steps,
                           ode::final_and_observed(y1, observed), ode::final_and_observed(w, w_obs), gradients);
  // One declaration per rank: nvcc rejects an auto declaration that deduces different types.
  auto hy = to_host(batch.y0), hp = to_host(batch.params), hw = to_host(w), gy = to_host(y0_bar), gp = to_host(p_bar);
  auto hwo = to_host(w_obs);
  for (int i = 0; i < N; ++i) {
    auto loss = [&](double a, double v, double k, double c) {
      const auto end = oscillator_exact(a, v, k, c, t_end), mid = oscillator_exact(a, v, k, c, inside);
      return hw(i, 0) * end[0] + hw(i, 1) * end[1] + hwo(i, 0, 0) * mid[0] + hwo(i, 0, 1) * mid[1];
    };
    const double e = 1e-6, a = hy(i, 0), v = hy(i, 1), k = hp(i, 0), c = hp(i, 1);
    const double exact[4] = {(loss(a + e, v, k, c) - loss(a - e, v, k, c)) / (2 * e),
                             (loss(a, v + e, k, c) - loss(a, v - e, k, c)) / (2 * e),
                             (loss(a, v, k + e, c) - loss(a, v, k - e, c)) / (2 * e),
                             (loss(a, v, k, c + e) - loss(a, v, k, c - e)) / (2 * e)};
    const double computed[4] = {gy(i, 0), gy(i, 1), gp(i, 0), gp(i, 1)};
    for (int j = 0; j < 4; ++j) EXPECT_NEAR(computed[j], exact[j], 1e-7) << "trajectory " << i << " gradient " << j;
  }
  // The stepped loops (the same call, LoopMode::stepped) give the same bits.
  View2<double, Space> stepped_y0_bar("stepped_y0_bar", N, 2), stepped_p_bar("stepped_p_bar", N, 2);
  ode::SolveOptions stepped;
  stepped.mode = ode::LoopMode::stepped;
  ode::solve_with_gradient(
      Space{}, ode::DormandPrince5{}, batch.problem(), steps, ode::final_and_observed(y1, observed),
      ode::final_and_observed(w, w_obs),
      ode::Gradients<decltype(stepped_y0_bar), decltype(stepped_p_bar)>{stepped_y0_bar, stepped_p_bar}, stepped);
  EXPECT_TRUE(bitwise_equal(stepped_y0_bar, y0_bar));
  EXPECT_TRUE(bitwise_equal(stepped_p_bar, p_bar));
}

} // namespace
