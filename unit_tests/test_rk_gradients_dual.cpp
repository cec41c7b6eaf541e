// Dual numbers standing in for a missing vjp(): the gradients of an adaptive Tsit5 solve of a field
// without one against those of the same field with its vjp(), on every enabled execution space. A
// translation unit of its own: Tsit5 is not a compiled instance, so both fields' adaptive gradient
// loops compile here (the header path). Every call compiles the fused loop alone (fused_only).

#include "rk_test_support.hpp"

namespace {

using namespace paraseq;
using namespace paraseq::test;

template <class Space>
class RungeKuttaGradientsDual : public ::testing::Test {};
TYPED_TEST_SUITE(RungeKuttaGradientsDual, ExecutionSpaces, SpaceName);

// The oscillator without a vjp(): gradients come from dual numbers.
struct OscillatorWithoutVjp {
  static constexpr int state_size = 2;
  static constexpr int max_parameter_count = 2;
  template <class S, class P>
  KOKKOS_FUNCTION void operator()(S, const S* y, const P& p, S* dy) const {
    dy[0] = y[1];
    dy[1] = -p.own(0) * y[0] - p.own(1) * y[1];
  }
};
static_assert(!ode::FieldWithVjp<OscillatorWithoutVjp, double> && ode::FieldWithVjp<ode::DampedOscillator, double>);

TYPED_TEST(RungeKuttaGradientsDual, DualNumbersStandInForAMissingVjp) {
  using Space = TypeParam;
  const int N = 6;
  const OscillatorBatch<double, Space> batch(N);
  View2<double, Space> y1("y1", N, 2), w("w", N, 2), explicit_y0("e_y0", N, 2), explicit_p("e_p", N, 2),
      dual_y0("d_y0", N, 2), dual_p("d_p", N, 2);
  fill_uniform(w, -1, 1, 31);
  auto steps = ode::AdaptiveSteps{};
  steps.t_end = 3, steps.rtol = 1e-8, steps.atol = 1e-10;
  steps.observation_times = {1.7};
  View3<double, Space> observed("observed", N, 1, 2), w_obs("w_obs", N, 1, 2);
  fill_uniform(w_obs, -1, 1, 32);
  ode::solve_with_gradient<fused_only>(
      Space{}, ode::Tsit5{}, batch.problem(), steps, ode::final_and_observed(y1, observed),
      ode::final_and_observed(w, w_obs),
      ode::Gradients<decltype(explicit_y0), decltype(explicit_p)>{explicit_y0, explicit_p});
  ode::solve_with_gradient<fused_only>(Space{}, ode::Tsit5{},
                                       ode::problem(OscillatorWithoutVjp{}, batch.y0, batch.params), steps,
                                       ode::final_and_observed(y1, observed), ode::final_and_observed(w, w_obs),
                                       ode::Gradients<decltype(dual_y0), decltype(dual_p)>{dual_y0, dual_p});
  // Both are the discrete adjoint of an adaptive solve, equal to rounding only while both forward
  // passes accept the same steps. The dual numbers and the explicit vjp round differently (and
  // differently again where the compiler contracts to FMA, as under a -march that has it); the error
  // estimate, a difference of two solutions of size rtol, magnifies such a difference by 1/rtol, so a
  // step accepted in one pass can be rejected in the other, and each gradient is then that of its own
  // mesh. Both meshes keep each step's error below the tolerance, and the oscillator's solutions do not
  // grow, so the gradients' discretisation errors, and their difference, stay below t_end * rtol
  // (measured: 2.55e-11 with Kokkos 4.6.01 in a Spack build). A wrong derivative is off by O(1).
  const double discretisation_bound = steps.t_end * steps.rtol;
  EXPECT_LE(max_abs_difference(dual_y0, to_host(explicit_y0)), discretisation_bound);
  EXPECT_LE(max_abs_difference(dual_p, to_host(explicit_p)), discretisation_bound);
}

} // namespace
