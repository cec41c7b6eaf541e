// Gradients through the Runge–Kutta loops against reverse mode through a loop written here (with
// a small tape), on every enabled execution space. (test_rk_gradients.cpp has the finite
// differences, test_rk_gradients_modes.cpp the closed form and the invariances,
// test_rk_gradients_dual.cpp dual numbers standing in for a missing vjp(); they are separate
// translation units because each compiles many loop kernels.) Every call compiles the fused loop
// alone (fused_only): for the built-in fields, the paraseq library's instances.

#include "rk_test_support.hpp"

#include <gmock/gmock.h>

#include <cmath>
#include <type_traits>
#include <vector>

namespace {

using namespace paraseq;
using namespace paraseq::test;

template <class Space>
class RungeKuttaGradientsReverse : public ::testing::Test {};
TYPED_TEST_SUITE(RungeKuttaGradientsReverse, ExecutionSpaces, SpaceName);

// --- A scalar reverse-mode AD: every operation records its inputs and partial derivatives.
struct Tape {
  struct Node {
    int a, b;
    double da, db;
  };
  std::vector<Node> nodes;
  int push(int a, double da, int b = -1, double db = 0) {
    nodes.push_back({a, b, da, db});
    return int(nodes.size()) - 1;
  }
  // d(output)/d(node) for every node.
  std::vector<double> adjoints(int output) const {
    std::vector<double> bar(nodes.size(), 0.0);
    bar[output] = 1;
    for (int i = output; i >= 0; --i) {
      if (nodes[i].a >= 0) bar[nodes[i].a] += nodes[i].da * bar[i];
      if (nodes[i].b >= 0) bar[nodes[i].b] += nodes[i].db * bar[i];
    }
    return bar;
  }
};

Tape* tape = nullptr;

struct Var {
  double value = 0;
  int id = -1; // -1: a constant
  Var() = default;
  Var(double v) : value(v) {}
  static Var input(double v) { return {v, tape->push(-1, 0)}; }
  Var(double v, int node) : value(v), id(node) {}
};
Var unary(double value, const Var& x, double dx) { return {value, tape->push(x.id, dx)}; }
Var binary(double value, const Var& x, double dx, const Var& y, double dy) { return {value, tape->push(x.id, dx, y.id, dy)}; }
Var operator+(const Var& x, const Var& y) { return binary(x.value + y.value, x, 1, y, 1); }
Var operator-(const Var& x, const Var& y) { return binary(x.value - y.value, x, 1, y, -1); }
Var operator*(const Var& x, const Var& y) { return binary(x.value * y.value, x, y.value, y, x.value); }
Var operator/(const Var& x, const Var& y) {
  return binary(x.value / y.value, x, 1 / y.value, y, -x.value / (y.value * y.value));
}
Var operator-(const Var& x) { return unary(-x.value, x, -1); }
Var& operator+=(Var& x, const Var& y) { return x = x + y; }
Var tanh(const Var& x) {
  const double t = std::tanh(x.value);
  return unary(t, x, 1 - t * t);
}

// The gradient of sum_i w_i . y_i(t_end) through `steps` classic RK4 steps of h, by the tape.
template <class Field>
void tape_gradient(const Field& field, int n, double h, int steps, const std::vector<double>& y0,
                   const std::vector<double>& own, const std::vector<double>& shared, const std::vector<double>& w,
                   std::vector<double>& y0_bar, std::vector<double>& own_bar, std::vector<double>& shared_bar) {
  Tape local;
  tape = &local;
  std::vector<Var> y(n), p(own.size()), q(shared.size());
  for (int k = 0; k < n; ++k) y[k] = Var::input(y0[k]);
  for (std::size_t k = 0; k < own.size(); ++k) p[k] = Var::input(own[k]);
  for (std::size_t k = 0; k < shared.size(); ++k) q[k] = Var::input(shared[k]);
  const HostParameters<Var> params{p.data(), q.data()};
  for (int s = 0; s < steps; ++s) y = rk4_step(field, Var(s * h), Var(h), y, params);
  Var loss(0.0);
  for (int k = 0; k < n; ++k) loss += Var(w[k]) * y[k];
  const auto bar = local.adjoints(loss.id);
  for (int k = 0; k < n; ++k) y0_bar[k] = bar[k];
  for (std::size_t k = 0; k < own.size(); ++k) own_bar[k] = bar[n + k];
  for (std::size_t k = 0; k < shared.size(); ++k) shared_bar[k] = bar[n + own.size() + k];
  tape = nullptr;
}

// --- Helpers over Views.

// OwnParameters = false: a field without them (P = 0), called as its users call it, with neither
// params nor their gradient.
template <class Space, bool OwnParameters = true, class Field>
void expect_matches_tape(const Field& field, int N, int n, int P, int Q, double h, int steps, unsigned seed,
                         double lo = 0.2, double hi = 1.0) {
  View2<double, Space> y0("y0", N, n), params("params", N, P), y1("y1", N, n), w("w", N, n), y0_bar("y0_bar", N, n),
      p_bar("p_bar", N, P);
  View1<double, Space> shared("shared", Q), shared_bar("shared_bar", Q);
  fill_uniform(y0, lo, hi, seed);
  fill_uniform(params, lo, hi, seed + 1);
  fill_uniform(shared, -0.5, 0.5, seed + 2);
  fill_uniform(w, -1, 1, seed + 3);
  const auto mesh = ode::FixedSteps::count(0, h, steps);
  auto differentiate = [&](const auto& own, const auto& own_bar) {
    using OwnBar = std::decay_t<decltype(own_bar)>;
    ode::solve_with_gradient<fused_only>(
        Space{}, ode::RK4{}, ode::problem(field, y0, own, shared), mesh, ode::final_state(y1), ode::final_state(w),
        ode::Gradients<decltype(y0_bar), OwnBar, decltype(shared_bar)>{y0_bar, own_bar, shared_bar});
  };
  if constexpr (OwnParameters) differentiate(params, p_bar);
  else differentiate(ode::NoView{}, ode::NoView{});
  auto hy0 = to_host(y0), hp = to_host(params), hw = to_host(w), hy0_bar = to_host(y0_bar), hp_bar = to_host(p_bar);
  auto hq = to_host(shared);
  std::vector<double> shared_values(hq.data(), hq.data() + Q), shared_total(Q, 0.0);
  for (int i = 0; i < N; ++i) {
    std::vector<double> start(n), own(P), weights(n), start_bar(n), own_bar(P), shared_grad(Q);
    for (int k = 0; k < n; ++k) start[k] = hy0(i, k), weights[k] = hw(i, k);
    for (int k = 0; k < P; ++k) own[k] = hp(i, k);
    tape_gradient(field, n, h, steps, start, own, shared_values, weights, start_bar, own_bar, shared_grad);
    for (int k = 0; k < n; ++k) EXPECT_NEAR(hy0_bar(i, k), start_bar[k], 1e-12 * std::fmax(1, std::fabs(start_bar[k])));
    for (int k = 0; k < P; ++k) EXPECT_NEAR(hp_bar(i, k), own_bar[k], 1e-12 * std::fmax(1, std::fabs(own_bar[k])));
    for (int k = 0; k < Q; ++k) shared_total[k] += shared_grad[k];
  }
  auto hq_bar = to_host(shared_bar);
  for (int k = 0; k < Q; ++k) EXPECT_NEAR(hq_bar(k), shared_total[k], 1e-12 * std::fmax(1, std::fabs(shared_total[k])));
}

TYPED_TEST(RungeKuttaGradientsReverse, GradientsMatchReverseModeThroughATestLoop) {
  using Space = TypeParam;
  expect_matches_tape<Space>(ode::DampedOscillator{}, 4, 2, 2, 0, 0.05, 40, 21);
  expect_matches_tape<Space>(ode::LotkaVolterra{}, 4, 2, 4, 0, 0.05, 40, 22);
  expect_matches_tape<Space>(ode::SIR{}, 4, 3, 2, 0, 0.1, 30, 23);
  expect_matches_tape<Space>(ode::Linear<ode::Sharing::own, ode::Sharing::shared>{3}, 3, 3, 9, 3, 0.1, 20, 24, -0.5, 0.3);
  expect_matches_tape<Space, false>(ode::Mlp{4, 6}, 3, 4, 0, 2 * 4 * 6 + 6 + 4, 0.1, 20, 25);
}

} // namespace
