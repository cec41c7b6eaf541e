// Fixed-step Runge–Kutta loops on every enabled execution space: meshes that land on end and
// observation times, fused against stepped loops, determinism and bad input. Convergence orders,
// stability polynomials and FSAL counts: test_rk_orders.cpp. Calls whose subject is not the loop
// mode compile the fused loop alone (CompiledModes::fused_only): for the built-in fields, the
// paraseq library's compiled instances.

#include "rk_test_support.hpp"

#include <gmock/gmock.h>

#include <cmath>
#include <limits>
#include <tuple>
#include <type_traits>
#include <vector>

namespace {

using namespace paraseq;
using namespace paraseq::test;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

template <class Space>
class RungeKuttaFixed : public ::testing::Test {};
TYPED_TEST_SUITE(RungeKuttaFixed, ExecutionSpaces, SpaceName);

TYPED_TEST(RungeKuttaFixed, ZeroStepsReturnTheInitialState) {
  using Space = TypeParam;
  const OscillatorBatch<double, Space> batch(7);
  View2<double, Space> y1("y1", 7, 2);
  View3<double, Space> observed("observed", 7, 2, 2);
  fill_constant(y1, 5.0);
  auto steps = ode::FixedSteps::count(0.5, 0.1, 0).observe_at({0.5, 0.5});
  const auto report =
      ode::solve<fused_only>(Space{}, ode::RK4{}, batch.problem(), steps, ode::final_and_observed(y1, observed));
  EXPECT_TRUE(bitwise_equal(y1, batch.y0));
  auto obs = to_host(observed);
  auto y0 = to_host(batch.y0);
  for (int i = 0; i < 7; ++i)
    for (int j = 0; j < 2; ++j)
      for (int k = 0; k < 2; ++k) EXPECT_EQ(obs(i, j, k), y0(i, k));
  EXPECT_EQ(report.max_accepted, 0);
}

// The test's own RK4 over a list of step sizes, in double.
std::vector<double> reference_rk4(double k, double c, std::vector<double> y, double t, const std::vector<double>& hs) {
  const double own[2] = {k, c};
  const HostParameters<double> p{own, nullptr};
  for (double h : hs) {
    y = rk4_step(ode::DampedOscillator{}, t, h, y, p);
    t += h;
  }
  return y;
}

TYPED_TEST(RungeKuttaFixed, APartialLastStepLandsOnTheEndTime) {
  using Space = TypeParam;
  const OscillatorBatch<double, Space> batch(3);
  View2<double, Space> y1("y1", 3, 2);
  const auto steps = ode::FixedSteps::until(0, 1, 0.3);
  EXPECT_EQ(steps.steps, 4);
  const auto report = ode::solve<fused_only>(Space{}, ode::RK4{}, batch.problem(), steps, ode::final_state(y1));
  EXPECT_EQ(report.max_accepted, 4);
  auto y0 = to_host(batch.y0);
  auto p = to_host(batch.params);
  auto result = to_host(y1);
  for (int i = 0; i < 3; ++i) {
    const auto ref = reference_rk4(p(i, 0), p(i, 1), {y0(i, 0), y0(i, 1)}, 0, {0.3, 0.3, 0.3, 0.1});
    EXPECT_NEAR(result(i, 0), ref[0], 1e-14);
    EXPECT_NEAR(result(i, 1), ref[1], 1e-14);
  }
}

TYPED_TEST(RungeKuttaFixed, ObservationTimesSplitTheStepsTheyFallIn) {
  using Space = TypeParam;
  const OscillatorBatch<double, Space> batch(3);
  View2<double, Space> y1("y1", 3, 2);
  View3<double, Space> observed("observed", 3, 4, 2);
  auto steps = ode::FixedSteps::count(0, 0.1, 5).observe_at({0, 0.25, 0.25, 0.3});
  const auto report =
      ode::solve<fused_only>(Space{}, ode::RK4{}, batch.problem(), steps, ode::final_and_observed(y1, observed));
  EXPECT_EQ(report.max_accepted, 6); // 0.25 splits the third step
  auto y0 = to_host(batch.y0);
  auto p = to_host(batch.params);
  auto obs = to_host(observed);
  auto result = to_host(y1);
  for (int i = 0; i < 3; ++i) {
    const std::vector<double> start{y0(i, 0), y0(i, 1)};
    const auto at_025 = reference_rk4(p(i, 0), p(i, 1), start, 0, {0.1, 0.1, 0.05});
    const auto at_03 = reference_rk4(p(i, 0), p(i, 1), at_025, 0.25, {0.05});
    const auto at_05 = reference_rk4(p(i, 0), p(i, 1), at_03, 0.3, {0.1, 0.1});
    for (int k = 0; k < 2; ++k) {
      EXPECT_EQ(obs(i, 0, k), start[k]);
      EXPECT_NEAR(obs(i, 1, k), at_025[k], 1e-14);
      EXPECT_EQ(obs(i, 2, k), obs(i, 1, k));
      EXPECT_NEAR(obs(i, 3, k), at_03[k], 1e-14);
      EXPECT_NEAR(result(i, k), at_05[k], 1e-14);
    }
  }
}

// The loop modes' one test in this file: a call of CompiledModes::all runs either loop, its fused one
// the same kernel as a fused_only call's.
TYPED_TEST(RungeKuttaFixed, SteppedLoopsMatchFusedOnesBitwiseAndCallTheObserver) {
  using Space = TypeParam;
  const int N = 33, steps = 40;
  const OscillatorBatch<float, Space> batch(N);
  View2<float, Space> fused("fused", N, 2), stepped("stepped", N, 2);
  View3<float, Space> fused_obs("fused_obs", N, 2, 2), stepped_obs("stepped_obs", N, 2, 2);
  const auto mesh = ode::FixedSteps::until(0, 2, 0.05).observe_at({0.52, 2.0});
  ode::solve(Space{}, ode::DormandPrince5{}, batch.problem(), mesh, ode::final_and_observed(fused, fused_obs));
  EXPECT_THAT(Call([&] {
                ode::solve(Space{}, ode::DormandPrince5{}, batch.problem(), mesh, ode::final_state(stepped), {},
                           [](const auto&) {});
              }),
              ThrowsMessage<std::invalid_argument>(AllOf(HasSubstr("'observer'"), HasSubstr("LoopMode::stepped"))));
  ode::SolveOptions options;
  options.mode = ode::LoopMode::stepped;
  std::vector<float> times;
  auto observer = [&](const auto& state) {
    EXPECT_EQ(state.launch, int(times.size()));
    times.push_back(to_host(state.t)(N - 1));
  };
  ode::solve(Space{}, ode::DormandPrince5{}, batch.problem(), mesh, ode::final_and_observed(stepped, stepped_obs),
             options, observer);
  EXPECT_TRUE(bitwise_equal(fused, stepped));
  EXPECT_TRUE(bitwise_equal(fused_obs, stepped_obs));
  // A call that compiles the fused loop alone runs the same kernel, and refuses the stepped mode.
  View2<float, Space> alone("alone", N, 2);
  View3<float, Space> alone_obs("alone_obs", N, 2, 2);
  ode::solve<fused_only>(Space{}, ode::DormandPrince5{}, batch.problem(), mesh,
                         ode::final_and_observed(alone, alone_obs));
  EXPECT_TRUE(bitwise_equal(fused, alone));
  EXPECT_TRUE(bitwise_equal(fused_obs, alone_obs));
  EXPECT_THAT(Call([&] {
                ode::solve<fused_only>(Space{}, ode::DormandPrince5{}, batch.problem(), mesh, ode::final_state(alone),
                                       options);
              }),
              ThrowsMessage<std::invalid_argument>(AllOf(HasSubstr("'options.mode'"), HasSubstr("fused_only"))));
  ASSERT_EQ(times.size(), std::size_t(steps + 1)); // 0.52 adds a mesh point
  EXPECT_FLOAT_EQ(times[10], 0.52f);
  EXPECT_FLOAT_EQ(times.back(), 2.0f);
}

TYPED_TEST(RungeKuttaFixed, RepeatedRunsAreBitwiseEqual) {
  using Space = TypeParam;
  const int N = 1000, n = 12;
  View2<double, Space> y0("y0", N, n), y1("y1", N, n), y2("y2", N, n);
  View1<double, Space> weights("weights", 2 * n * 16 + 16 + n);
  fill_uniform(y0, -1, 1, 3);
  fill_uniform(weights, -0.3, 0.3, 4);
  const auto problem = ode::problem(ode::Mlp{n, 16}, y0, ode::NoView{}, weights);
  const auto steps = ode::FixedSteps::count(0, 0.05, 50);
  ode::solve<fused_only>(Space{}, ode::DormandPrince5{}, problem, steps, ode::final_state(y1));
  ode::solve<fused_only>(Space{}, ode::DormandPrince5{}, problem, steps, ode::final_state(y2));
  EXPECT_TRUE(bitwise_equal(y1, y2));
}

template <class Exception = std::invalid_argument>
auto throws_naming(const std::string& argument, const std::string& detail) {
  return ThrowsMessage<Exception>(AllOf(HasSubstr(argument), HasSubstr(detail)));
}

TYPED_TEST(RungeKuttaFixed, BadInputNamesTheArgumentAndWhatWasExpected) {
  using Space = TypeParam;
  const int N = 4;
  const OscillatorBatch<double, Space> batch(N);
  View2<double, Space> y1("y1", N, 2), y1_short("y1", N - 1, 2), params3("params", N, 3), y0_wide("y0", N, 3);
  const auto problem = batch.problem();
  const auto steps = ode::FixedSteps::count(0, 0.1, 10);
  auto solve = [&](const auto& p, const ode::FixedSteps& s, const auto& out) {
    return Call([=] { ode::solve<fused_only>(Space{}, ode::RK4{}, p, s, out); });
  };
  EXPECT_THAT(solve(problem, steps, ode::final_state(y1_short)),
              throws_naming("'outputs.final_state'", "[3, 2]"));
  EXPECT_THAT(solve(ode::problem(ode::DampedOscillator{}, y0_wide, batch.params), steps, ode::final_state(y1)),
              throws_naming("'y0'", "[4, 3]"));
  EXPECT_THAT(solve(ode::problem(ode::DampedOscillator{}, batch.y0, params3), steps, ode::final_state(y1)),
              throws_naming("'params'", "parameter_count"));
  EXPECT_THAT(solve(ode::problem(ode::DampedOscillator{}, batch.y0), steps, ode::final_state(y1)),
              throws_naming("'params'", "[N, 2]"));
  EXPECT_THAT(solve(problem, ode::FixedSteps::count(0, 0.1, -1), ode::final_state(y1)),
              throws_naming("'steps'", "steps >= 0"));
  EXPECT_THAT(solve(problem, ode::FixedSteps::count(0, -0.1, 3), ode::final_state(y1)),
              throws_naming("'steps'", "dt > 0"));
  EXPECT_THAT(Call([] { ode::FixedSteps::until(0, 1, 0); }), throws_naming("'dt'", "dt > 0"));
  EXPECT_THAT(solve(problem, ode::FixedSteps::on_grid({0, 0.5, 0.5}), ode::final_state(y1)),
              throws_naming("'steps'", "strictly increasing"));

  View3<double, Space> observed("observed", N, 2, 2);
  auto unsorted = ode::FixedSteps::count(0, 0.1, 10).observe_at({0.5, 0.2});
  EXPECT_THAT(solve(problem, unsorted, ode::observed(observed)), throws_naming("'observation_times[1]'", "nondecreasing"));
  auto outside = ode::FixedSteps::count(0, 0.1, 10).observe_at({0.5, 1.5});
  EXPECT_THAT(solve(problem, outside, ode::observed(observed)), throws_naming("'observation_times[1]'", "[t0, t_end]"));
  auto three = ode::FixedSteps::count(0, 0.1, 10).observe_at({0.1, 0.2, 0.3});
  EXPECT_THAT(solve(problem, three, ode::observed(observed)), throws_naming("'outputs.observed'", "[4, 3, 2]"));
  ode::SolveOptions bounded;
  bounded.max_observation_elements = 15;
  auto two = ode::FixedSteps::count(0, 0.1, 10).observe_at({0.1, 0.2});
  EXPECT_THAT(
      Call([&] { ode::solve<fused_only>(Space{}, ode::RK4{}, problem, two, ode::observed(observed), bounded); }),
      throws_naming("'outputs.observed'", "max_observation_elements = 15"));

  View2<double, Space> y0_nan("y0", N, 2);
  copy_contiguous(y0_nan, batch.y0);
  edit_on_host(y0_nan, [](auto& host) { host(2, 1) = NAN; });
  EXPECT_THAT(solve(ode::problem(ode::DampedOscillator{}, y0_nan, batch.params), steps, ode::final_state(y1)),
              throws_naming("'y0'", "row 2"));

  View2<double, Space> big("big", N, 65), big_out("big_out", N, 65);
  View1<double, Space> A_and_b("A_and_b", 65 * 65 + 65);
  using SharedLinear = ode::Linear<ode::Sharing::shared, ode::Sharing::shared>;
  EXPECT_THAT(solve(ode::problem(SharedLinear{65}, big, ode::NoView{}, A_and_b), steps, ode::final_state(big_out)),
              throws_naming("'field'", "1 <= n <= 64"));
  View1<double, Space> weights("weights", 2 * 2 * 200 + 200 + 2);
  EXPECT_THAT(solve(ode::problem(ode::Mlp{2, 200}, batch.y0, ode::NoView{}, weights), steps, ode::final_state(y1)),
              throws_naming("'field'", "hidden <= 128"));
}

} // namespace
