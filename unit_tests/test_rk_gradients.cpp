// Gradients through the Runge–Kutta loops (the discrete adjoint) on every enabled execution space:
// against central finite differences for own parameters, zero steps and bad shapes. Shared
// parameters: test_rk_gradients_shared.cpp.
// Adaptive gradients against the closed form, checkpoint intervals, batch chunks and loop modes:
// test_rk_gradients_modes.cpp; reverse mode through a test loop and dual numbers:
// test_rk_gradients_reverse.cpp (separate translation units because each compiles many loop
// kernels). Every call compiles the fused loop alone (fused_only): for the built-in fields, the
// paraseq library's instances.

#include "rk_test_support.hpp"

#include <gmock/gmock.h>

#include <stdexcept>
#include <string>

namespace {

using namespace paraseq;
using namespace paraseq::test;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

template <class Space>
class RungeKuttaGradients : public ::testing::Test {};
TYPED_TEST_SUITE(RungeKuttaGradients, ExecutionSpaces, SpaceName);

TYPED_TEST(RungeKuttaGradients, FixedStepGradientsMatchFiniteDifferences) {
  using Space = TypeParam;
  const int N = 3;
  const OscillatorBatch<double, Space> batch(N);
  View2<double, Space> y1("y1", N, 2), w_final("w_final", N, 2), y0_bar("y0_bar", N, 2), p_bar("p_bar", N, 2);
  View3<double, Space> observed("observed", N, 3, 2), w_obs("w_obs", N, 3, 2);
  fill_uniform(w_final, -1, 1, 5);
  fill_uniform(w_obs, -1, 1, 6);
  auto steps = ode::FixedSteps::count(0, 0.05, 30).observe_at({0.3, 0.77, 1.5});
  auto run = [&](auto method) {
    auto loss = [&] {
      ode::solve<fused_only>(Space{}, method, batch.problem(), steps, ode::final_and_observed(y1, observed));
      return dot(y1, w_final) + dot(observed, w_obs);
    };
    ode::solve_with_gradient<fused_only>(Space{}, method, batch.problem(), steps, ode::final_and_observed(y1, observed),
                                         ode::final_and_observed(w_final, w_obs),
                                         ode::Gradients<decltype(y0_bar), decltype(p_bar)>{y0_bar, p_bar});
    expect_central_differences(batch.y0, loss, y0_bar, 1e-6, 1e-8, std::string(method.name) + " y0");
    expect_central_differences(batch.params, loss, p_bar, 1e-6, 1e-8, std::string(method.name) + " params");
  };
  run(ode::RK4{});
  run(ode::DormandPrince5{});
  run(ode::Heun{});
}

TYPED_TEST(RungeKuttaGradients, ZeroStepsPassTheCotangentsThrough) {
  using Space = TypeParam;
  const OscillatorBatch<double, Space> batch(4);
  View2<double, Space> y1("y1", 4, 2), w("w", 4, 2), y0_bar("y0_bar", 4, 2), p_bar("p_bar", 4, 2);
  View3<double, Space> observed("observed", 4, 1, 2), w_obs("w_obs", 4, 1, 2);
  fill_uniform(w, -1, 1, 61);
  fill_uniform(w_obs, -1, 1, 62);
  fill_constant(p_bar, 7.0);
  ode::solve_with_gradient<fused_only>(Space{}, ode::RK4{}, batch.problem(),
                                       ode::FixedSteps::count(1, 0.1, 0).observe_at({1}),
                                       ode::final_and_observed(y1, observed), ode::final_and_observed(w, w_obs),
                                       ode::Gradients<decltype(y0_bar), decltype(p_bar)>{y0_bar, p_bar});
  auto gy = to_host(y0_bar), gp = to_host(p_bar), hw = to_host(w);
  auto hwo = to_host(w_obs);
  for (int i = 0; i < 4; ++i)
    for (int k = 0; k < 2; ++k) {
      EXPECT_EQ(gy(i, k), hw(i, k) + hwo(i, 0, k));
      EXPECT_EQ(gp(i, k), 0.0);
    }
}

TYPED_TEST(RungeKuttaGradients, BadGradientShapesNameTheArgument) {
  using Space = TypeParam;
  const OscillatorBatch<double, Space> batch(4);
  View2<double, Space> y1("y1", 4, 2), w_short("w", 3, 2), y0_bar("y0_bar", 4, 2), p_bar("p_bar", 4, 2),
      p_bar_wide("p_bar", 4, 3);
  const auto steps = ode::FixedSteps::count(0, 0.1, 3);
  auto throws_naming = [](const std::string& argument, const std::string& detail) {
    return ThrowsMessage<std::invalid_argument>(AllOf(HasSubstr(argument), HasSubstr(detail)));
  };
  EXPECT_THAT(
      Call([&] {
        ode::solve_with_gradient<fused_only>(Space{}, ode::RK4{}, batch.problem(), steps, ode::final_state(y1),
                                             ode::final_state(w_short),
                                             ode::Gradients<decltype(y0_bar), decltype(p_bar)>{y0_bar, p_bar});
      }),
      throws_naming("'cotangents.final_state'", "[3, 2]"));
  EXPECT_THAT(
      Call([&] {
        ode::solve_with_gradient<fused_only>(
            Space{}, ode::RK4{}, batch.problem(), steps, ode::final_state(y1), ode::final_state(y1),
            ode::Gradients<decltype(y0_bar), decltype(p_bar_wide)>{y0_bar, p_bar_wide});
      }),
      throws_naming("'gradients.params'", "[4, 3]"));
}

} // namespace
