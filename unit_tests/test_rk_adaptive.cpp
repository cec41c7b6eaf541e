// Adaptive Runge–Kutta loops on every enabled execution space: accuracy against the damped
// oscillator's closed form, step counts, dense-output observations, FSAL counts, statuses of
// failed trajectories, fused against stepped loops, and bad input. Calls whose subject is not the
// loop mode compile the fused loop alone (CompiledModes::fused_only): for the built-in fields and
// Heun and Dormand–Prince, the paraseq library's compiled instances.

#include "rk_test_support.hpp"

#include <gmock/gmock.h>

#include <cmath>
#include <tuple>
#include <vector>

namespace {

using namespace paraseq;
using namespace paraseq::test;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

template <class Space>
class RungeKuttaAdaptive : public ::testing::Test {};
TYPED_TEST_SUITE(RungeKuttaAdaptive, ExecutionSpaces, SpaceName);

template <class F>
void for_each_adaptive_method(const F& f) {
  std::apply([&](auto... method) { (f(method), ...); },
             std::tuple<ode::Heun, ode::BogackiShampine3, ode::DormandPrince5, ode::Tsit5>{});
}

ode::AdaptiveSteps interval(double t_end, double rtol, double atol) {
  ode::AdaptiveSteps steps;
  steps.t_end = t_end, steps.rtol = rtol, steps.atol = atol;
  return steps;
}

template <class View>
std::vector<int> host_vector(const View& v) {
  auto host = to_host(v);
  return std::vector<int>(host.data(), host.data() + host.span());
}

TYPED_TEST(RungeKuttaAdaptive, ErrorStaysWithinASmallMultipleOfTheTolerance) {
  using Space = TypeParam;
  const int N = 64;
  const OscillatorBatch<double, Space> batch(N);
  View2<double, Space> y1("y1", N, 2);
  for_each_adaptive_method([&](auto method) {
    using Method = decltype(method);
    for (double rtol : {1e-4, 1e-7}) {
      const auto report = ode::solve<fused_only>(Space{}, method, batch.problem(), interval(10, rtol, rtol * 1e-2),
                                                 ode::final_state(y1));
      EXPECT_EQ(report.failed, 0);
      // |y| <= 1.5 here: a global error of a few tolerances after ~10 oscillations.
      EXPECT_LE(max_abs_difference(y1, batch.exact(10)), 10 * rtol) << Method::name << " rtol " << rtol;
    }
  });
}

TYPED_TEST(RungeKuttaAdaptive, StepCountsFallInASaneBand) {
  using Space = TypeParam;
  const int N = 32;
  const OscillatorBatch<double, Space> batch(N);
  View2<double, Space> y1("y1", N, 2);
  auto accepted = [&](double rtol) {
    const auto report = ode::solve<fused_only>(Space{}, ode::DormandPrince5{}, batch.problem(),
                                               interval(10, rtol, rtol * 1e-2), ode::final_state(y1));
    const auto counts = host_vector(report.accepted), rejections = host_vector(report.rejected);
    double mean = 0, rejected = 0;
    for (int i = 0; i < N; ++i) mean += counts[i], rejected += rejections[i];
    EXPECT_LE(rejected, 0.25 * mean) << "rtol " << rtol;
    return mean / N;
  };
  const double loose = accepted(1e-4), medium = accepted(1e-6), tight = accepted(1e-8);
  // Up to ~3 periods (omega <= 2) over [0, 10]: tens to a few hundred steps.
  EXPECT_GE(medium, 20);
  EXPECT_LE(medium, 400);
  // A fifth-order pair: steps grow as tol^(-1/5), about 6.3 times for 10^4.
  EXPECT_GE(tight / loose, 3.5);
  EXPECT_LE(tight / loose, 12);
}

TYPED_TEST(RungeKuttaAdaptive, DenseOutputObservationsMatchTheClosedForm) {
  using Space = TypeParam;
  const int N = 40, count = 25;
  const OscillatorBatch<double, Space> batch(N);
  std::vector<double> times;
  for (int j = 0; j < count; ++j) times.push_back(10.0 * j / (count - 1) - 0.0137 * (j > 0 && j + 1 < count));
  View2<double, Space> y1("y1", N, 2), y1_plain("y1_plain", N, 2);
  View3<double, Space> observed("observed", N, count, 2);
  for_each_adaptive_method([&](auto method) {
    using Method = decltype(method);
    const double rtol = 1e-7;
    auto steps = interval(10, rtol, rtol * 1e-2);
    ode::solve<fused_only>(Space{}, method, batch.problem(), steps, ode::final_state(y1_plain));
    ode::solve<fused_only>(Space{}, method, batch.problem(), steps.observe_at(times),
                           ode::final_and_observed(y1, observed));
    EXPECT_TRUE(bitwise_equal(y1, y1_plain)) << Method::name << ": observations must not change the mesh";
    auto obs = to_host(observed);
    auto final_state = to_host(y1);
    double worst = 0;
    for (int j = 0; j < count; ++j) {
      const auto exact = batch.exact(times[j]);
      for (int i = 0; i < N; ++i)
        for (int k = 0; k < 2; ++k) worst = std::fmax(worst, std::fabs(obs(i, j, k) - exact(i, k)));
    }
    // Heun's dense output is only second order: its interpolation error dominates.
    EXPECT_LE(worst, (Method::order == 2 ? 100 : 10) * rtol) << Method::name;
    for (int i = 0; i < N; ++i)
      for (int k = 0; k < 2; ++k) EXPECT_EQ(obs(i, count - 1, k), final_state(i, k)) << "t_end observation";
  });
}

TYPED_TEST(RungeKuttaAdaptive, DormandPrinceMakesSixNewEvaluationsPerStep) {
  using Space = TypeParam;
  const int N = 9;
  const OscillatorBatch<double, Space> batch(N);
  View2<double, Space> y1("y1", N, 2);
  for (double first_step : {0.0, 0.01}) {
    auto field = CountingOscillator<typename Space::memory_space>::fresh();
    auto steps = interval(10, 1e-9, 1e-11);
    steps.first_step = first_step;
    const auto report = ode::solve<fused_only>(
        Space{}, ode::DormandPrince5{}, ode::problem(field, batch.y0, batch.params), steps, ode::final_state(y1));
    unsigned long long count = 0;
    Kokkos::deep_copy(count, field.evaluations);
    const auto accepted = host_vector(report.accepted), rejected = host_vector(report.rejected);
    // f(t0, y0), one more for the first-step heuristic, then 6 per attempted step.
    unsigned long long expected = 0;
    for (int i = 0; i < N; ++i) expected += (first_step > 0 ? 1 : 2) + 6ull * (accepted[i] + rejected[i]);
    EXPECT_EQ(count, expected) << "first_step " << first_step;
  }
}

TYPED_TEST(RungeKuttaAdaptive, SteppedLoopsMatchFusedOnesBitwise) {
  using Space = TypeParam;
  const int N = 50;
  const OscillatorBatch<float, Space> batch(N);
  View2<float, Space> fused("fused", N, 2), stepped("stepped", N, 2);
  View3<float, Space> fused_obs("fused_obs", N, 3, 2), stepped_obs("stepped_obs", N, 3, 2);
  auto steps = interval(5, 1e-5, 1e-7).observe_at({0, 1.3, 4.9});
  const auto report =
      ode::solve(Space{}, ode::DormandPrince5{}, batch.problem(), steps, ode::final_and_observed(fused, fused_obs));
  ode::SolveOptions options;
  options.mode = ode::LoopMode::stepped;
  int launches = 0;
  ode::solve(Space{}, ode::DormandPrince5{}, batch.problem(), steps, ode::final_and_observed(stepped, stepped_obs),
             options, [&](const auto&) { ++launches; });
  EXPECT_TRUE(bitwise_equal(fused, stepped));
  EXPECT_TRUE(bitwise_equal(fused_obs, stepped_obs));
  const auto accepted = host_vector(report.accepted), rejected = host_vector(report.rejected);
  int most = 0;
  for (int i = 0; i < N; ++i) most = std::max(most, accepted[i] + rejected[i]);
  EXPECT_EQ(launches, most); // one attempt per launch, until every trajectory is done
}

// The PyTorch adapter hands solve() a workspace from its allocator (SolveOptions::workspace): the
// results must be those of the call that allocates for itself, observations between the ends included.
TYPED_TEST(RungeKuttaAdaptive, ACallerWorkspaceGivesTheSameResults) {
  using Space = TypeParam;
  const int N = 33;
  const OscillatorBatch<double, Space> batch(N);
  const std::vector<double> times{0, 0.37, 1.0, 2.5};
  View2<double, Space> own("own", N, 2), given("given", N, 2);
  View3<double, Space> own_obs("own_obs", N, 4, 2), given_obs("given_obs", N, 4, 2);
  auto check = [&](auto method, const auto& steps, const char* what) {
    const auto report =
        ode::solve<fused_only>(Space{}, method, batch.problem(), steps, ode::final_and_observed(own, own_obs));
    Kokkos::View<char*, typename Space::memory_space> workspace("workspace", ode::solve_workspace_bytes<double>(N, 2, steps));
    ode::SolveOptions options;
    options.workspace = {workspace.data(), workspace.extent(0)};
    const auto with_workspace = ode::solve<fused_only>(Space{}, method, batch.problem(), steps,
                                                       ode::final_and_observed(given, given_obs), options);
    EXPECT_TRUE(bitwise_equal(own, given)) << what;
    EXPECT_TRUE(bitwise_equal(own_obs, given_obs)) << what;
    EXPECT_EQ(host_vector(report.accepted), host_vector(with_workspace.accepted)) << what;
    EXPECT_EQ(with_workspace.failed, 0) << what;
  };
  check(ode::DormandPrince5{}, interval(2.5, 1e-8, 1e-10).observe_at(times), "adaptive");
  check(ode::RK4{}, ode::FixedSteps::count(0, 0.01, 250).observe_at(times), "fixed steps");
}

TYPED_TEST(RungeKuttaAdaptive, PerComponentTolerancesReplaceTheScalars) {
  using Space = TypeParam;
  const int N = 16;
  const OscillatorBatch<double, Space> batch(N);
  View2<double, Space> scalar("scalar", N, 2), per_component("per_component", N, 2);
  auto steps = interval(10, 1e-6, 1e-8);
  const auto tight =
      ode::solve<fused_only>(Space{}, ode::DormandPrince5{}, batch.problem(), steps, ode::final_state(scalar));
  steps.rtol_per_component = {1e-6, 1e-6};
  steps.atol_per_component = {1e-8, 1e-8};
  ode::solve<fused_only>(Space{}, ode::DormandPrince5{}, batch.problem(), steps, ode::final_state(per_component));
  EXPECT_TRUE(bitwise_equal(scalar, per_component));
  steps.rtol_per_component = {1e-6, 1e-2};
  steps.atol_per_component = {1e-8, 1e-2};
  const auto loose =
      ode::solve<fused_only>(Space{}, ode::DormandPrince5{}, batch.problem(), steps, ode::final_state(per_component));
  EXPECT_LT(loose.max_accepted, tight.max_accepted);
}

TYPED_TEST(RungeKuttaAdaptive, AnEmptyIntervalReturnsTheInitialState) {
  using Space = TypeParam;
  const OscillatorBatch<double, Space> batch(5);
  View2<double, Space> y1("y1", 5, 2);
  auto steps = interval(0, 1e-6, 1e-8);
  const auto report =
      ode::solve<fused_only>(Space{}, ode::DormandPrince5{}, batch.problem(), steps, ode::final_state(y1));
  EXPECT_TRUE(bitwise_equal(y1, batch.y0));
  EXPECT_EQ(report.max_accepted, 0);
}

// y' = y^2, which blows up at t = 1 / y0, or (poisoned) y' = sqrt(y - 2), NaN from finite inputs
// near y0 = 1: one field type, so that the failure tests compile one loop.
struct Failing {
  static constexpr int state_size = 1;
  bool poisoned = false;
  template <class S, class P>
  KOKKOS_FUNCTION void operator()(S, const S* y, const P&, S* dy) const {
    dy[0] = poisoned ? S(Kokkos::sqrt(y[0] - S(2))) : y[0] * y[0];
  }
};

TYPED_TEST(RungeKuttaAdaptive, FailedTrajectoriesReportTheirStatusAndNaNOutputs) {
  using Space = TypeParam;
  const int N = 3;
  View2<double, Space> y0("y0", N, 1), y1("y1", N, 1);
  View3<double, Space> observed("observed", N, 2, 1);
  fill_constant(y0, 1.0);
  ode::SolveOptions report_only;
  report_only.on_failure = ode::OnFailure::report;
  auto expect_status = [&](const auto& field, ode::AdaptiveSteps steps, ode::Status status) {
    steps.observation_times = {0, steps.t_end};
    const auto report = ode::solve<fused_only>(Space{}, ode::DormandPrince5{}, ode::problem(field, y0), steps,
                                               ode::final_and_observed(y1, observed), report_only);
    EXPECT_EQ(report.failed, N);
    EXPECT_EQ(report.first_failed, 0);
    EXPECT_EQ(report.first_failed_status, status) << ode::status_name(status);
    for (int s : host_vector(report.status)) EXPECT_EQ(s, int(status));
    auto out = to_host(y1);
    auto obs = to_host(observed);
    for (int i = 0; i < N; ++i) {
      EXPECT_TRUE(std::isnan(out(i, 0)));
      EXPECT_EQ(obs(i, 0, 0), 1.0); // reached: t0
      EXPECT_TRUE(std::isnan(obs(i, 1, 0)));
    }
    EXPECT_THAT(Call([&] {
                  ode::solve<fused_only>(Space{}, ode::DormandPrince5{}, ode::problem(field, y0), steps,
                                         ode::final_state(y1));
                }),
                ThrowsMessage<std::runtime_error>(
                    AllOf(HasSubstr("3 of 3 trajectories failed"), HasSubstr(ode::status_name(status)))));
  };
  auto budget = interval(0.5, 1e-6, 1e-8);
  budget.max_steps = 5;
  expect_status(Failing{}, budget, ode::Status::max_steps);
  auto blowup = interval(2, 1e-6, 1e-8);
  blowup.min_step = 1e-8;
  expect_status(Failing{}, blowup, ode::Status::step_too_small);
  auto poisoned = interval(1, 1e-6, 1e-8);
  poisoned.min_step = 1e-12;
  expect_status(Failing{true}, poisoned, ode::Status::non_finite);
}

TYPED_TEST(RungeKuttaAdaptive, BadToleranceAndControllerSettingsAreRejected) {
  using Space = TypeParam;
  const OscillatorBatch<double, Space> batch(2);
  View2<double, Space> y1("y1", 2, 2);
  auto solve_with = [&](auto change) {
    auto steps = interval(1, 1e-6, 1e-8);
    change(steps);
    return Call(
        [=] { ode::solve<fused_only>(Space{}, ode::DormandPrince5{}, batch.problem(), steps, ode::final_state(y1)); });
  };
  auto throws_naming = [](const std::string& argument, const std::string& detail) {
    return ThrowsMessage<std::invalid_argument>(AllOf(HasSubstr(argument), HasSubstr(detail)));
  };
  EXPECT_THAT(solve_with([](auto& s) { s.rtol = -1; }), throws_naming("'steps.rtol'", ">= 0"));
  EXPECT_THAT(solve_with([](auto& s) { s.rtol = 0, s.atol = 0; }), throws_naming("'steps'", "rtol > 0 or atol > 0"));
  EXPECT_THAT(solve_with([](auto& s) { s.atol_per_component = {1e-8}; }),
              throws_naming("'steps.atol_per_component'", "length n = 2"));
  EXPECT_THAT(solve_with([](auto& s) { s.max_steps = 0; }), throws_naming("'steps.max_steps'", "max_steps >= 1"));
  EXPECT_THAT(solve_with([](auto& s) { s.t_end = -1; }), throws_naming("'steps'", "t_end >= t0"));
  EXPECT_THAT(solve_with([](auto& s) { s.controller.safety = 0; }), throws_naming("'steps.controller.safety'", "0 < safety"));
  EXPECT_THAT(solve_with([](auto& s) { s.controller.max_factor = 0.5; }),
              throws_naming("'steps.controller'", "min_factor <= 1 <= max_factor"));
  EXPECT_THAT(solve_with([](auto& s) { s.observation_times = {2}; }),
              throws_naming("'observation_times[0]'", "[t0, t_end]"));
}

} // namespace
