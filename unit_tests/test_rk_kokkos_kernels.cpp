// paraseq's Runge–Kutta loops against KokkosODE (Kokkos Kernels) on the same batch of damped
// oscillators: the same classic RK4 steps agree to rounding, and both adaptive Dormand–Prince
// integrators land within their tolerance of the closed form, with similar step counts.

#include <paraseq/loops/kokkos_kernels.hpp>

#include "rk_test_support.hpp"

namespace {

using namespace paraseq;
using namespace paraseq::test;
using KokkosODE::Experimental::ODE_params;
using KokkosODE::Experimental::RK_type;

template <class Space>
class RungeKuttaAgainstKokkosOde : public ::testing::Test {};
TYPED_TEST_SUITE(RungeKuttaAgainstKokkosOde, ExecutionSpaces, SpaceName);

TYPED_TEST(RungeKuttaAgainstKokkosOde, ClassicRK4AgreesToRounding) {
  using Space = TypeParam;
  const int N = 64, steps = 200;
  const OscillatorBatch<double, Space> batch(N);
  View2<double, Space> ours("ours", N, 2), theirs("theirs", N, 2);
  View1<int, Space> counts("counts", N);
  ode::solve(Space{}, ode::RK4{}, batch.problem(), ode::FixedSteps::count(0, 0.01, steps), ode::final_state(ours));
  const auto status = ode::kokkos_ode_solve<RK_type::RK4>(Space{}, batch.problem(), 0, 2, ODE_params(steps), theirs, counts);
  for (int i = 0; i < N; ++i) EXPECT_EQ(to_host(status)(i), 0);
  EXPECT_LE(max_abs_difference(ours, to_host(theirs)), 1e-12);
  EXPECT_LE(max_abs_difference(ours, batch.exact(2)), 1e-8); // and both are RK4 solutions
}

TYPED_TEST(RungeKuttaAgainstKokkosOde, AdaptiveDormandPrinceAgreesWithinTolerance) {
  using Space = TypeParam;
  const int N = 64;
  const double rtol = 1e-8, atol = 1e-10, t_end = 10;
  const OscillatorBatch<double, Space> batch(N);
  View2<double, Space> ours("ours", N, 2), theirs("theirs", N, 2);
  View1<int, Space> counts("counts", N);
  ode::AdaptiveSteps steps;
  steps.t_end = t_end, steps.rtol = rtol, steps.atol = atol;
  const auto report = ode::solve(Space{}, ode::DormandPrince5{}, batch.problem(), steps, ode::final_state(ours));
  const auto status = ode::kokkos_ode_solve<RK_type::RKDP>(Space{}, batch.problem(), 0, t_end,
                                                           ODE_params(100, 100000, atol, rtol, 1e-12), theirs, counts);
  const auto exact = batch.exact(t_end);
  EXPECT_LE(max_abs_difference(ours, exact), 10 * rtol);
  EXPECT_LE(max_abs_difference(theirs, exact), 10 * rtol);
  EXPECT_LE(max_abs_difference(ours, to_host(theirs)), 20 * rtol);
  auto accepted = to_host(report.accepted);
  auto their_steps = to_host(counts);
  double ours_total = 0, theirs_total = 0;
  for (int i = 0; i < N; ++i) {
    EXPECT_EQ(to_host(status)(i), 0);
    ours_total += accepted(i), theirs_total += their_steps(i);
  }
  EXPECT_GT(ours_total, theirs_total / 3);
  EXPECT_LT(ours_total, theirs_total * 3);
}

} // namespace
