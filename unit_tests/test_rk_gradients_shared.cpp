// Gradients through the Runge–Kutta loops for parameters that every trajectory shares (a Linear
// field's A, an Mlp's weights) and its own ones, against central finite differences, on every
// enabled execution space: a unit of its own beside test_rk_gradients.cpp (Tsit5 over the Linear
// field is not a compiled instance, so its loop kernels compile here).

#include "rk_test_support.hpp"

#include <gmock/gmock.h>

namespace {

using namespace paraseq;
using namespace paraseq::test;

template <class Space>
class RungeKuttaSharedGradients : public ::testing::Test {};
TYPED_TEST_SUITE(RungeKuttaSharedGradients, ExecutionSpaces, SpaceName);

TYPED_TEST(RungeKuttaSharedGradients, MatchFiniteDifferences) {
  using Space = TypeParam;
  const int N = 4, n = 3, hidden = 5;
  View2<double, Space> y0("y0", N, n), y1("y1", N, n), w("w", N, n), y0_bar("y0_bar", N, n);
  View2<double, Space> b("b", N, n), b_bar("b_bar", N, n);
  View1<double, Space> A("A", n * n), A_bar("A_bar", n * n);
  View1<double, Space> weights("weights", 2 * n * hidden + hidden + n), weights_bar("weights_bar", 2 * n * hidden + hidden + n);
  fill_uniform(y0, -1, 1, 11);
  fill_uniform(w, -1, 1, 12);
  fill_uniform(b, -0.5, 0.5, 13);
  fill_uniform(A, -0.6, 0.4, 14);
  fill_uniform(weights, -0.8, 0.8, 15);
  const auto steps = ode::FixedSteps::count(0, 0.1, 20);

  const auto linear = ode::problem(ode::Linear<ode::Sharing::shared, ode::Sharing::own>{n}, y0, b, A);
  auto linear_loss = [&] {
    ode::solve<fused_only>(Space{}, ode::Tsit5{}, linear, steps, ode::final_state(y1));
    return dot(y1, w);
  };
  ode::solve_with_gradient<fused_only>(
      Space{}, ode::Tsit5{}, linear, steps, ode::final_state(y1), ode::final_state(w),
      ode::Gradients<decltype(y0_bar), decltype(b_bar), decltype(A_bar)>{y0_bar, b_bar, A_bar});
  expect_central_differences(A, linear_loss, A_bar, 1e-6, 1e-8, "Linear A (shared)");
  expect_central_differences(b, linear_loss, b_bar, 1e-6, 1e-8, "Linear b (own)");
  expect_central_differences(y0, linear_loss, y0_bar, 1e-6, 1e-8, "Linear y0");

  const auto mlp = ode::problem(ode::Mlp{n, hidden}, y0, ode::NoView{}, weights);
  auto mlp_loss = [&] {
    ode::solve<fused_only>(Space{}, ode::RK4{}, mlp, steps, ode::final_state(y1));
    return dot(y1, w);
  };
  ode::solve_with_gradient<fused_only>(
      Space{}, ode::RK4{}, mlp, steps, ode::final_state(y1), ode::final_state(w),
      ode::Gradients<ode::NoView, ode::NoView, decltype(weights_bar)>{{}, {}, weights_bar});
  expect_central_differences(weights, mlp_loss, weights_bar, 1e-6, 1e-8, "Mlp weights (shared)");
}

} // namespace
