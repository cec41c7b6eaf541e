// The uniform-mesh fast path of fixed steps (FixedSteps::count and ::until with observations on the
// grid) and the fused loop's segments between observations: agreement with an explicit grid of the
// same points and with a float64 RK4 loop written here, a partial last step landing on t_end,
// zero steps, fused against stepped bits, non-finite states caught at the next observation or the
// end with lanes of one thread stopping separately, and the one-reduction finiteness check of the
// inputs still naming the first bad argument. Calls whose subject is not the loop mode compile the
// fused loop alone (fused_only): for the built-in fields, the paraseq library's compiled instances.

#include "rk_test_support.hpp"

#include <gmock/gmock.h>

#include <cmath>
#include <vector>

namespace {

using namespace paraseq;
using namespace paraseq::test;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

template <class Space>
class RungeKuttaUniform : public ::testing::Test {};
TYPED_TEST_SUITE(RungeKuttaUniform, ExecutionSpaces, SpaceName);

// y'' + c y' + k y = cos(3 t): the field depends on t, so the mesh's times matter.
struct ForcedOscillator {
  static constexpr int state_size = 2;
  static constexpr int max_parameter_count = 2;
  KOKKOS_INLINE_FUNCTION int parameter_count() const { return 2; }
  template <class S, class P>
  KOKKOS_FUNCTION void operator()(S t, const S* y, const P& p, S* dy) const {
    using Kokkos::cos;
    dy[0] = y[1];
    dy[1] = -p.own(0) * y[0] - p.own(1) * y[1] + cos(S(3) * t);
  }
};

// y' = y^2: from y0 = 1 it blows up at t = 1, from y0 = -1 it is -1 / (1 + t).
struct Riccati {
  static constexpr int state_size = 1;
  template <class S, class P>
  KOKKOS_FUNCTION void operator()(S, const S* y, const P&, S* dy) const {
    dy[0] = y[0] * y[0];
  }
};

template <class View>
std::vector<int> host_vector(const View& v) {
  auto host = to_host(v);
  return std::vector<int>(host.data(), host.data() + host.span());
}

// The test's own RK4 in double over the steps (t_k, h_k).
std::vector<double> reference_rk4(double k, double c, std::vector<double> y, const std::vector<double>& t,
                                  const std::vector<double>& h) {
  const double own[2] = {k, c};
  const HostParameters<double> p{own, nullptr};
  for (std::size_t s = 0; s < h.size(); ++s) y = rk4_step(ForcedOscillator{}, t[s], h[s], y, p);
  return y;
}

template <class T, class Space, class Method, class Steps>
View2<T, Space> solve_forced(const OscillatorBatch<T, Space>& batch, Method method, const Steps& steps) {
  View2<T, Space> y1("y1", batch.y0.extent(0), 2);
  ode::solve<fused_only>(Space{}, method, ode::problem(ForcedOscillator{}, batch.y0, batch.params), steps,
                         ode::final_state(y1));
  return y1;
}

TYPED_TEST(RungeKuttaUniform, StepsOfDtAgreeWithAnExplicitGridOfTheSamePointsAndAFloat64Loop) {
  using Space = TypeParam;
  const int N = 13, steps = 200;
  const double t0 = 0.25, dt = 0.01;
  std::vector<double> grid(steps + 1);
  for (int k = 0; k <= steps; ++k) grid[k] = t0 + k * dt;
  const OscillatorBatch<double, Space> batch(N, 5);
  const OscillatorBatch<float, Space> batch32(N, 5);

  // The same steps on the uniform path and as an explicit grid: round-off apart, in either type.
  const auto uniform = solve_forced(batch, ode::RK4{}, ode::FixedSteps::count(t0, dt, steps));
  EXPECT_LE(max_abs_difference(uniform, to_host(solve_forced(batch, ode::RK4{}, ode::FixedSteps::on_grid(grid)))), 1e-13);
  const auto uniform_dp5 = solve_forced(batch, ode::DormandPrince5{}, ode::FixedSteps::count(t0, dt, steps));
  EXPECT_LE(max_abs_difference(uniform_dp5, to_host(solve_forced(batch, ode::DormandPrince5{}, ode::FixedSteps::on_grid(grid)))),
            1e-13);
  const auto uniform32 = solve_forced(batch32, ode::RK4{}, ode::FixedSteps::count(t0, dt, steps));
  EXPECT_LE(max_abs_difference(uniform32, to_host(solve_forced(batch32, ode::RK4{}, ode::FixedSteps::on_grid(grid)))), 2e-5);

  // Against the float64 loop: RK4 to round-off, DP5 to its (much smaller than RK4's) truncation error.
  const auto y0 = to_host(batch.y0);
  const auto p = to_host(batch.params);
  const auto rk4 = to_host(uniform), dp5 = to_host(uniform_dp5);
  const auto rk4_32 = to_host(uniform32); // a float View: auto deduces one type per declaration
  const std::vector<double> times(grid.begin(), grid.end() - 1), lengths(steps, dt);
  for (int i = 0; i < N; ++i) {
    const auto ref = reference_rk4(p(i, 0), p(i, 1), {y0(i, 0), y0(i, 1)}, times, lengths);
    for (int c = 0; c < 2; ++c) {
      EXPECT_NEAR(rk4(i, c), ref[c], 1e-13) << i;
      EXPECT_NEAR(dp5(i, c), ref[c], 1e-8) << i;
      EXPECT_NEAR(rk4_32(i, c), ref[c], 1e-4) << i; // batch32 holds batch's values rounded to float
    }
  }
}

TYPED_TEST(RungeKuttaUniform, APartialLastStepLandsOnTheEndTimeAndGridObservationsSplitNothing) {
  using Space = TypeParam;
  const int N = 5;
  const OscillatorBatch<double, Space> batch(N, 9);
  View2<double, Space> y1("y1", N, 2);
  View3<double, Space> observed("observed", N, 4, 2);
  // 0.9 is 3 * 0.3 within rounding: a grid point, not a split.
  auto steps = ode::FixedSteps::until(0, 1, 0.3).observe_at({0, 0.3, 0.9, 1.0});
  const auto report =
      ode::solve<fused_only>(Space{}, ode::RK4{}, ode::problem(ForcedOscillator{}, batch.y0, batch.params), steps,
                             ode::final_and_observed(y1, observed));
  EXPECT_EQ(report.max_accepted, 4);
  EXPECT_EQ(report.failed, 0);
  const auto y0 = to_host(batch.y0);
  const auto p = to_host(batch.params);
  const auto obs = to_host(observed);
  const auto out = to_host(y1);
  for (int i = 0; i < N; ++i) {
    const std::vector<double> start{y0(i, 0), y0(i, 1)};
    const auto at_03 = reference_rk4(p(i, 0), p(i, 1), start, {0}, {0.3});
    const auto at_09 = reference_rk4(p(i, 0), p(i, 1), start, {0, 0.3, 0.6}, {0.3, 0.3, 0.3});
    const auto at_1 = reference_rk4(p(i, 0), p(i, 1), at_09, {0.9}, {0.1});
    for (int c = 0; c < 2; ++c) {
      EXPECT_EQ(obs(i, 0, c), start[c]);
      EXPECT_NEAR(obs(i, 1, c), at_03[c], 1e-14);
      EXPECT_NEAR(obs(i, 2, c), at_09[c], 1e-14);
      EXPECT_NEAR(out(i, c), at_1[c], 1e-14);
      EXPECT_EQ(obs(i, 3, c), out(i, c)); // the observation at t_end is the final state, bit for bit
    }
  }
}

TYPED_TEST(RungeKuttaUniform, ZeroStepsReturnTheInitialState) {
  using Space = TypeParam;
  const int N = 9;
  const OscillatorBatch<float, Space> batch(N);
  View2<float, Space> y1("y1", N, 2);
  View3<float, Space> observed("observed", N, 1, 2);
  fill_constant(y1, 7.0f);
  fill_constant(observed, 7.0f);
  const auto report =
      ode::solve<fused_only>(Space{}, ode::Tsit5{}, ode::problem(ForcedOscillator{}, batch.y0, batch.params),
                             ode::FixedSteps::until(2, 2, 0.1).observe_at({2}), ode::final_and_observed(y1, observed));
  EXPECT_EQ(report.max_accepted, 0);
  EXPECT_EQ(report.failed, 0);
  EXPECT_TRUE(bitwise_equal(y1, batch.y0));
  const auto obs = to_host(observed);
  const auto y0 = to_host(batch.y0);
  for (int i = 0; i < N; ++i)
    for (int c = 0; c < 2; ++c) EXPECT_EQ(obs(i, 0, c), y0(i, c));
}

TYPED_TEST(RungeKuttaUniform, SteppedLoopsMatchFusedOnesBitwise) {
  using Space = TypeParam;
  const int N = 21;
  const OscillatorBatch<float, Space> batch(N, 3);
  const auto problem = ode::problem(ForcedOscillator{}, batch.y0, batch.params);
  // 29 steps, the last one partial; every observation on the grid.
  const auto mesh = ode::FixedSteps::until(0, 2, 0.07).observe_at({0.7, 1.4, 2.0});
  auto both = [&](auto method) {
    View2<float, Space> fused("fused", N, 2), stepped("stepped", N, 2);
    View3<float, Space> fused_obs("fused_obs", N, 3, 2), stepped_obs("stepped_obs", N, 3, 2);
    ode::solve(Space{}, method, problem, mesh, ode::final_and_observed(fused, fused_obs));
    ode::SolveOptions options;
    options.mode = ode::LoopMode::stepped;
    std::vector<float> times;
    ode::solve(Space{}, method, problem, mesh, ode::final_and_observed(stepped, stepped_obs), options,
               [&](const auto& state) { times.push_back(to_host(state.t)(0)); });
    EXPECT_TRUE(bitwise_equal(fused, stepped)) << decltype(method)::name;
    EXPECT_TRUE(bitwise_equal(fused_obs, stepped_obs)) << decltype(method)::name;
    ASSERT_EQ(times.size(), std::size_t(29)); // no observation added a mesh point
    EXPECT_EQ(times.back(), 2.0f);             // the partial last step lands on t_end
    for (std::size_t k = 0; k + 1 < times.size(); ++k) EXPECT_NEAR(times[k], 0.07 * (k + 1), 1e-6);
  };
  both(ode::RK4{});
  both(ode::Tsit5{});
}

TYPED_TEST(RungeKuttaUniform, NonFiniteStatesStopAtTheNextObservationOrTheEnd) {
  using Space = TypeParam;
  const int N = 11; // odd trajectories blow up; on host backends they share a thread with even ones
  View2<double, Space> y0("y0", N, 1), y1("y1", N, 1);
  View3<double, Space> observed("observed", N, 3, 1);
  auto host = Kokkos::create_mirror_view(y0);
  for (int i = 0; i < N; ++i) host(i, 0) = i % 2 ? 1.0 : -1.0;
  copy_contiguous(y0, host);
  ode::SolveOptions report_only;
  report_only.on_failure = ode::OnFailure::report;
  const auto steps = ode::FixedSteps::count(0, 0.1, 30).observe_at({0.5, 2.0, 3.0});
  const auto report = ode::solve<fused_only>(Space{}, ode::RK4{}, ode::problem(Riccati{}, y0), steps,
                                             ode::final_and_observed(y1, observed), report_only);
  EXPECT_EQ(report.failed, N / 2);
  EXPECT_EQ(report.first_failed, 1);
  EXPECT_EQ(report.first_failed_status, ode::Status::non_finite);
  const auto status = host_vector(report.status), accepted = host_vector(report.accepted);
  const auto out = to_host(y1);
  const auto obs = to_host(observed);
  for (int i = 0; i < N; ++i) {
    const double sign = i % 2 ? 1.0 : -1.0;
    EXPECT_NEAR(obs(i, 0, 0), sign / (1 - sign * 0.5), 1e-4) << i; // y(0.5) = y0 / (1 - y0 t)
    if (i % 2) { // past t = 1 the state overflows; the check at the observation at 2.0 stops it
      EXPECT_EQ(status[i], int(ode::Status::non_finite)) << i;
      EXPECT_EQ(accepted[i], 20) << i;
      EXPECT_FALSE(std::isfinite(obs(i, 1, 0))) << i;
      EXPECT_TRUE(std::isnan(obs(i, 2, 0))) << i;
      EXPECT_TRUE(std::isnan(out(i, 0))) << i;
    } else {
      EXPECT_EQ(status[i], int(ode::Status::success)) << i;
      EXPECT_EQ(accepted[i], 30) << i;
      EXPECT_NEAR(obs(i, 1, 0), -1.0 / 3, 1e-5) << i;
      EXPECT_NEAR(out(i, 0), -0.25, 1e-5) << i;
      EXPECT_EQ(obs(i, 2, 0), out(i, 0)) << i;
    }
  }
  // Without observations the check at the end catches it; by default solve() throws.
  EXPECT_THAT(Call([&] {
                ode::solve<fused_only>(Space{}, ode::RK4{}, ode::problem(Riccati{}, y0),
                                       ode::FixedSteps::count(0, 0.1, 30), ode::final_state(y1));
              }),
              ThrowsMessage<std::runtime_error>(
                  AllOf(HasSubstr("5 of 11 trajectories failed"), HasSubstr("trajectory 1"), HasSubstr("non_finite"))));
}

TYPED_TEST(RungeKuttaUniform, FixedStepsThatOverflowReportNonFinite) {
  using Space = TypeParam;
  View2<double, Space> y0("y0", 2, 1), y1("y1", 2, 1);
  fill_constant(y0, 1.0);
  EXPECT_THAT(Call([&] {
                ode::solve<fused_only>(Space{}, ode::RK4{}, ode::problem(Riccati{}, y0),
                                       ode::FixedSteps::count(0, 0.5, 40), ode::final_state(y1));
              }),
              ThrowsMessage<std::runtime_error>(HasSubstr("non_finite")));
}

TYPED_TEST(RungeKuttaUniform, OneFinitenessCheckNamesTheFirstBadArgumentAndRow) {
  using Space = TypeParam;
  const int N = 6, n = 2;
  const OscillatorBatch<double, Space> batch(N);
  View2<double, Space> y1("y1", N, 2), y0_nan("y0", N, 2), params_nan("params", N, 2);
  copy_contiguous(y0_nan, batch.y0);
  copy_contiguous(params_nan, batch.params);
  edit_on_host(y0_nan, [](auto& host) { host(4, 0) = NAN; });
  edit_on_host(params_nan, [](auto& host) { host(3, 1) = INFINITY, host(5, 0) = NAN; });
  const auto steps = ode::FixedSteps::count(0, 0.1, 3);
  auto throws_naming = [](const std::string& argument, const std::string& detail) {
    return ThrowsMessage<std::invalid_argument>(AllOf(HasSubstr(argument), HasSubstr(detail)));
  };
  EXPECT_THAT(Call([&] {
                ode::solve<fused_only>(Space{}, ode::RK4{}, ode::problem(ode::DampedOscillator{}, batch.y0, params_nan),
                                       steps, ode::final_state(y1));
              }),
              throws_naming("'params'", "row 3"));
  EXPECT_THAT(Call([&] {
                ode::solve<fused_only>(Space{}, ode::RK4{}, ode::problem(ode::DampedOscillator{}, y0_nan, params_nan),
                                       steps, ode::final_state(y1));
              }),
              throws_naming("'y0'", "row 4"));
  // Shared parameters have their own row count: Q = n * n = 4 here, more than N = 2.
  View2<double, Space> y0_two("y0", 2, n), y1_two("y1", 2, n);
  View1<double, Space> A("A", n * n);
  edit_on_host(A, [](auto& host) { host(3) = NAN; });
  // Linear<> (shared A, no b) has no compiled instance: Euler, the method of the smallest kernels,
  // since the check comes before any step.
  EXPECT_THAT(Call([&] {
                ode::solve<fused_only>(Space{}, ode::Euler{}, ode::problem(ode::Linear<>{n}, y0_two, ode::NoView{}, A),
                                       steps, ode::final_state(y1_two));
              }),
              throws_naming("'shared'", "row 3"));
}

TYPED_TEST(RungeKuttaUniform, ACallersWorkspaceHoldsTheTemporariesWithTheSameBits) {
  using Space = TypeParam;
  using Mem = typename Space::memory_space;
  const int N = 17;
  const OscillatorBatch<double, Space> batch(N, 21);
  const auto forced = ode::problem(ForcedOscillator{}, batch.y0, batch.params);
  auto check = [&](const auto& problem, auto method, const auto& steps, int observations) {
    View2<double, Space> own("own", N, 2), given("given", N, 2);
    View3<double, Space> own_obs("own_obs", N, observations, 2), given_obs("given_obs", N, observations, 2);
    const auto mine = ode::solve<fused_only>(Space{}, method, problem, steps, ode::final_and_observed(own, own_obs));
    const std::size_t bytes = ode::solve_workspace_bytes<double>(N, 2, steps);
    Kokkos::View<char*, Mem> workspace("workspace", bytes + 3);
    ode::SolveOptions options;
    options.workspace = {workspace.data() + 3, bytes}; // solve() aligns its pieces itself
    const auto theirs =
        ode::solve<fused_only>(Space{}, method, problem, steps, ode::final_and_observed(given, given_obs), options);
    EXPECT_TRUE(bitwise_equal(own, given));
    EXPECT_TRUE(bitwise_equal(own_obs, given_obs));
    EXPECT_EQ(host_vector(mine.accepted), host_vector(theirs.accepted));
    EXPECT_EQ(host_vector(mine.status), host_vector(theirs.status));
    for (const auto* p : {theirs.status.data(), theirs.accepted.data(), theirs.rejected.data()}) {
      EXPECT_GE(reinterpret_cast<const char*>(p), workspace.data());
      EXPECT_LE(reinterpret_cast<const char*>(p + N), workspace.data() + workspace.size());
    }
    options.workspace.bytes = bytes - 1;
    EXPECT_THAT(Call([&] {
                  ode::solve<fused_only>(Space{}, method, problem, steps, ode::final_and_observed(given, given_obs),
                                         options);
                }),
                ThrowsMessage<std::invalid_argument>(
                    AllOf(HasSubstr("'options.workspace'"), HasSubstr("solve_workspace_bytes"))));
  };
  check(forced, ode::RK4{}, ode::FixedSteps::count(0, 0.1, 20).observe_at({0.5, 2.0}), 2);        // uniform
  check(forced, ode::RK4{}, ode::FixedSteps::count(0, 0.1, 20).observe_at({0.55, 0.55, 1.0}), 3); // explicit: a split
  // Adaptive steps on the damped oscillator, whose loop is the library's compiled instance.
  ode::AdaptiveSteps adaptive;
  adaptive.t_end = 2, adaptive.rtol = 1e-8, adaptive.atol = 1e-10;
  check(batch.problem(), ode::DormandPrince5{}, adaptive.observe_at({0.3, 1.7}), 2);
}

} // namespace
