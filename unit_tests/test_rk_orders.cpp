// Fixed-step Runge–Kutta methods on every enabled execution space: convergence orders against the
// damped oscillator's closed form, stability polynomials and FSAL evaluation counts, for every
// method. (test_rk_methods.cpp has the meshes, loop modes, determinism and bad input; the two are
// separate translation units because each compiles many loop kernels.) The loop mode is not the
// subject here: every call compiles the fused loop alone (CompiledModes::fused_only), which for the
// built-in fields and the methods with compiled instances is the paraseq library's.

#include "rk_test_support.hpp"

#include <cmath>
#include <limits>
#include <tuple>
#include <type_traits>
#include <vector>

namespace {

using namespace paraseq;
using namespace paraseq::test;

template <class Space>
class RungeKuttaOrders : public ::testing::Test {};
TYPED_TEST_SUITE(RungeKuttaOrders, ExecutionSpaces, SpaceName);

using AllMethods = std::tuple<ode::Euler, ode::Heun, ode::BogackiShampine3, ode::RK4, ode::DormandPrince5, ode::Tsit5>;

template <class F>
void for_each_method(const F& f) {
  std::apply([&](auto... method) { (f(method), ...); }, AllMethods{});
}

template <class Space, class Method, class Batch>
double fixed_error(const Batch& batch, double dt, int steps) {
  View2<double, Space> y1("y1", batch.y0.extent(0), 2);
  ode::solve<fused_only>(Space{}, Method{}, batch.problem(), ode::FixedSteps::count(0, dt, steps),
                         ode::final_state(y1));
  return max_abs_difference(y1, batch.exact(dt * steps));
}

TYPED_TEST(RungeKuttaOrders, ErrorRatioOnHalvingTheStepMatchesTheOrder) {
  using Space = TypeParam;
  const OscillatorBatch<double, Space> batch(64);
  for_each_method([&](auto method) {
    using Method = decltype(method);
    // Steps small enough to be asymptotic, large enough to stay far above rounding.
    constexpr double dt_by_order[] = {0, 0.004, 0.02, 0.05, 0.1, 0.05};
    const double dt = dt_by_order[Method::order];
    const int steps = int(std::lround(2.0 / dt));
    const double coarse = fixed_error<Space, Method>(batch, dt, steps);
    const double fine = fixed_error<Space, Method>(batch, dt / 2, 2 * steps);
    EXPECT_NEAR(std::log2(coarse / fine), Method::order, 0.2)
        << Method::name << ": errors " << coarse << " and " << fine;
  });
}

// The coefficients b^T A^(k-1) 1 of R(z) = sum_k z^k b^T A^(k-1) 1, from the tableau; with
// absolute values, they give the a-priori rounding bound eps * sum_k |z|^k |b|^T |A|^(k-1) 1.
template <class Method>
std::vector<double> stability_coefficients(bool absolute = false) {
  constexpr int s = Method::stages;
  auto entry = [&](double x) { return absolute ? std::fabs(x) : x; };
  std::vector<double> coefficients{1};
  std::vector<double> power(s, 1.0); // A^(k-1) 1
  for (int k = 1; k <= s; ++k) {
    double coefficient = 0;
    for (int i = 0; i < s; ++i) coefficient += entry(Method::b[i]) * power[i];
    coefficients.push_back(coefficient);
    std::vector<double> next(s, 0.0);
    for (int i = 0; i < s; ++i)
      for (int j = 0; j < s; ++j) next[i] += entry(Method::a[i][j]) * power[j];
    power = next;
  }
  return coefficients;
}

double evaluate_polynomial(const std::vector<double>& coefficients, double z) {
  double value = 0;
  for (std::size_t k = coefficients.size(); k-- > 0;) value = value * z + coefficients[k];
  return value;
}

// One step of h = 1 of y' = z y from y = 1, for each z, in T. The damped oscillator with k = 0 and
// c = -z holds that decay in its velocity: v' = -0 x - c v = z v whatever the position x, rounded
// as z v, so that its velocity after the step is the decay's.
template <class Space, class T, class Method>
std::vector<double> one_step_of_decay(Method method, const std::vector<double>& z) {
  const int N = int(z.size());
  View2<T, Space> y0("y0", N, 2), params("params", N, 2), y1("y1", N, 2);
  auto start = Kokkos::create_mirror_view(y0);
  auto k_and_c = Kokkos::create_mirror_view(params);
  for (int i = 0; i < N; ++i) start(i, 0) = 0, start(i, 1) = 1, k_and_c(i, 0) = 0, k_and_c(i, 1) = T(-z[i]);
  copy_contiguous(y0, start);
  copy_contiguous(params, k_and_c);
  ode::solve<fused_only>(Space{}, method, ode::problem(ode::DampedOscillator{}, y0, params),
                         ode::FixedSteps::count(0, 1, 1), ode::final_state(y1));
  const auto result = to_host(y1);
  std::vector<double> velocity(N);
  for (int i = 0; i < N; ++i) velocity[i] = double(result(i, 1));
  return velocity;
}

const std::vector<double> stability_points{-0.1, -0.5, -1, -1.5, -2, -2.5, -2.78};

// values[i] = R(z_i), the stability polynomial of the tableau, to `tolerance` (Tsit5: see below).
template <class T, class Method>
void expect_stability_polynomial(const std::vector<double>& values, double tolerance) {
  const auto coefficients = stability_coefficients<Method>();
  for (std::size_t i = 0; i < stability_points.size(); ++i) {
    const double z = stability_points[i];
    // Tsit5's coefficients reach 12.9 and cancel: it is held to a tenth of its rounding bound.
    const double bound =
        std::numeric_limits<T>::epsilon() * evaluate_polynomial(stability_coefficients<Method>(true), -z);
    const double allowed = std::is_same_v<Method, ode::Tsit5> ? std::fmax(tolerance, bound / 10) : tolerance;
    EXPECT_NEAR(values[i], evaluate_polynomial(coefficients, z), allowed) << Method::name << " at h lambda = " << z;
  }
}

template <class Space, class T>
void expect_stability_polynomials(double tolerance) {
  for_each_method([&](auto method) {
    using Method = decltype(method);
    const auto coefficients = stability_coefficients<Method>();
    double factorial = 1;
    for (int k = 1; k <= Method::order; ++k) // up to the order, R agrees with exp(z)
      EXPECT_NEAR(coefficients[k], 1 / (factorial *= k), 1e-14) << Method::name << " z^" << k;
    expect_stability_polynomial<T, Method>(one_step_of_decay<Space, T>(method, stability_points), tolerance);
  });
}

TYPED_TEST(RungeKuttaOrders, OneStepOfLinearDecayIsTheStabilityPolynomial) {
  using Space = TypeParam;
  EXPECT_NEAR(stability_coefficients<ode::DormandPrince5>()[6], 1.0 / 600, 1e-15); // Hairer–Wanner's value
  expect_stability_polynomials<Space, double>(1e-14);
  expect_stability_polynomials<Space, float>(1e-6);

  // Linear<own> (A per trajectory, no b) with n = 1 is the decay itself.
  const int N = int(stability_points.size());
  View2<double, Space> y0("y0", N, 1), lambda("lambda", N, 1), y1("y1", N, 1);
  fill_constant(y0, 1.0);
  edit_on_host(lambda, [&](auto& host) {
    for (int i = 0; i < N; ++i) host(i, 0) = stability_points[i];
  });
  ode::solve<fused_only>(Space{}, ode::RK4{}, ode::problem(ode::Linear<ode::Sharing::own>{1}, y0, lambda),
                         ode::FixedSteps::count(0, 1, 1), ode::final_state(y1));
  const auto result = to_host(y1);
  std::vector<double> values(N);
  for (int i = 0; i < N; ++i) values[i] = result(i, 0);
  expect_stability_polynomial<double, ode::RK4>(values, 1e-14);
}

TYPED_TEST(RungeKuttaOrders, FsalMethodsReuseTheirLastStage) {
  using Space = TypeParam;
  const int N = 5, steps = 37;
  const OscillatorBatch<double, Space> batch(N);
  View2<double, Space> y1("y1", N, 2);
  for_each_method([&](auto method) {
    using Method = decltype(method);
    auto field = CountingOscillator<typename Space::memory_space>::fresh();
    ode::solve<fused_only>(Space{}, method, ode::problem(field, batch.y0, batch.params),
                           ode::FixedSteps::count(0, 0.01, steps), ode::final_state(y1));
    unsigned long long count = 0;
    Kokkos::deep_copy(count, field.evaluations);
    // FSAL: one evaluation to start, then stages - 1 new ones per step (6 for Dormand–Prince).
    const unsigned long long per_trajectory =
        Method::fsal ? 1 + (Method::stages - 1) * steps : Method::stages * steps;
    EXPECT_EQ(count, N * per_trajectory) << Method::name;
  });
}

} // namespace
