// Gradients through the Runge–Kutta loops for parameters that every trajectory shares (a Linear
// field's A, an Mlp's weights, an oscillator's coefficients) and its own ones, against central
// finite differences, on every enabled execution space: a unit of its own beside
// test_rk_gradients.cpp (Tsit5 over the Linear field is not a compiled instance, so its loop
// kernels compile here). The oscillator runs twice: with its shared count bounded
// (max_shared_parameter_count, gradient sums in a local array) and without (sums in device memory).

#include "rk_test_support.hpp"

#include <gmock/gmock.h>

// In a named namespace: nvcc warns (#177) about the dual-number probe of an operator() with
// internal linkage that solve_with_gradient's check instantiates but never calls.
namespace shared_gradient_fields {

// y'' = -k y - c y' with k and c shared by every trajectory, as a generated field of the Python
// package's compiled path has them. The bounded variants declare max_shared_parameter_count.
struct OscillatorEquations {
  static constexpr int state_size = 2;
  template <class S, class P>
  KOKKOS_INLINE_FUNCTION void operator()(S, const S* y, const P& p, S* dy) const {
    dy[0] = y[1];
    dy[1] = -p.shared(0) * y[0] - p.shared(1) * y[1];
  }
  template <class T, class P, class G>
  KOKKOS_INLINE_FUNCTION void vjp(T, const T* y, const P& p, const T* g, T* y_bar, const G& p_bar) const {
    y_bar[0] += -p.shared(0) * g[1];
    y_bar[1] += g[0] - p.shared(1) * g[1];
    p_bar.shared(0) += -y[0] * g[1];
    p_bar.shared(1) += -y[1] * g[1];
  }
};
struct SharedOscillator : OscillatorEquations {
  KOKKOS_INLINE_FUNCTION int parameter_count() const { return 0; }
  KOKKOS_INLINE_FUNCTION int shared_parameter_count() const { return 2; }
};
struct BoundedSharedOscillator : SharedOscillator {
  static constexpr int max_shared_parameter_count = 2;
};
struct BoundOnlyOscillator : OscillatorEquations { // Q from the View, checked against the bound
  static constexpr int max_shared_parameter_count = 2;
};

} // namespace shared_gradient_fields

namespace {

using namespace paraseq;
using namespace paraseq::test;
using namespace shared_gradient_fields;

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

  View2<double, Space> y0_2("y0_2", N, 2), y1_2("y1_2", N, 2), w_2("w_2", N, 2);
  View1<double, Space> kc("kc", 2), in_memory("in_memory", 2), in_registers("in_registers", 2);
  fill_uniform(y0_2, -1, 1, 16);
  fill_uniform(w_2, -1, 1, 17);
  Kokkos::deep_copy(Kokkos::subview(kc, 0), 2.5);
  Kokkos::deep_copy(Kokkos::subview(kc, 1), 0.3);
  const auto oscillator_gradient = [&](auto field, const View1<double, Space>& kc_bar) {
    ode::solve_with_gradient<fused_only>(Space{}, ode::DormandPrince5{}, ode::problem(field, y0_2, ode::NoView{}, kc),
                                         steps, ode::final_state(y1_2), ode::final_state(w_2),
                                         ode::Gradients<ode::NoView, ode::NoView, View1<double, Space>>{{}, {}, kc_bar});
  };
  oscillator_gradient(SharedOscillator{}, in_memory);
  oscillator_gradient(BoundedSharedOscillator{}, in_registers);
  auto oscillator_loss = [&] {
    ode::solve<fused_only>(Space{}, ode::DormandPrince5{}, ode::problem(SharedOscillator{}, y0_2, ode::NoView{}, kc), steps,
                           ode::final_state(y1_2));
    return dot(y1_2, w_2);
  };
  expect_central_differences(kc, oscillator_loss, in_memory, 1e-6, 1e-8, "oscillator k, c (shared, sums in memory)");
  // The same sums in the same order: the same bits.
  const auto memory_host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, in_memory);
  const auto registers_host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, in_registers);
  for (int k = 0; k < 2; ++k) EXPECT_EQ(registers_host(k), memory_host(k)) << "shared parameter " << k;

  // A shared View longer than the bound is refused, naming it, before any kernel runs.
  View1<double, Space> three("three", 3);
  try {
    ode::solve<fused_only>(Space{}, ode::RK4{}, ode::problem(BoundOnlyOscillator{}, y0_2, ode::NoView{}, three), steps,
                           ode::final_state(y1_2));
    ADD_FAILURE() << "a shared View of 3 values was accepted by a field bounded to 2";
  } catch (const std::invalid_argument& error) {
    EXPECT_THAT(error.what(), ::testing::HasSubstr("max_shared_parameter_count = 2"));
  }
}

} // namespace
