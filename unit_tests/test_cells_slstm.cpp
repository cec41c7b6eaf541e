// ParaSLSTM (the xLSTM sLSTM cell with diagonal recurrence, cells.hpp) on every enabled execution
// space: its Jacobian against central differences of its step (also at a tie of the stabiliser's
// max), every Newton mode against a float64 loop over t written here from the sLSTM equations, and
// newton_backward's gradients (u, r, h0) against central differences of that loop.

#include <paraseq/solvers/cells.hpp>
#include <paraseq/solvers/newton.hpp>
#include <paraseq/solvers/newton_backward.hpp>

#include "cell_derivative_checks.hpp"
#include "test_support.hpp"

#include <gmock/gmock.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <tuple>

namespace {

using namespace paraseq;
using namespace paraseq::test;
using ::testing::HasSubstr;

static_assert(NewtonCell<ParaSLSTM<double>, double> && NewtonCell<ParaSLSTM<float>, float>);
static_assert(std::is_same_v<ParaSLSTM<double>::structure, BlockDiagonal<4>>);

template <class Space>
class SlstmCell : public ::testing::Test {};
TYPED_TEST_SUITE(SlstmCell, ExecutionSpaces, SpaceName);

constexpr double slstm_eps = 1e-6;

// The sLSTM recurrence over t in double, from the equations of Beck et al. (2024) with exponential
// gates and a diagonal recurrence: u [B, T, 4H] holds the pre-activations (i, f, z, o), r [4, H];
// the state [B, T, 4H] interleaves (c, n, m, h) per channel, h0 [B, 4H] likewise.
Host3 slstm_sequential(const Host2& r, const Host3& u, const Host2& h0, double eps) {
  const int B = int(u.extent(0)), T = int(u.extent(1)), H = int(r.extent(1));
  Host3 state("state", B, T, 4 * H);
  for (int b = 0; b < B; ++b)
    for (int k = 0; k < H; ++k) {
      double c = h0(b, 4 * k), n = h0(b, 4 * k + 1), m = h0(b, 4 * k + 2), h = h0(b, 4 * k + 3);
      for (int t = 0; t < T; ++t) {
        const double i_tilde = u(b, t, k) + r(0, k) * h;
        const double f_tilde = u(b, t, H + k) + r(1, k) * h;
        const double z_tilde = u(b, t, 2 * H + k) + r(2, k) * h;
        const double o_tilde = u(b, t, 3 * H + k) + r(3, k) * h;
        const double m_next = std::max(f_tilde + m, i_tilde);
        const double input_gate = std::exp(i_tilde - m_next);
        const double forget_gate = std::exp(f_tilde + m - m_next);
        c = forget_gate * c + input_gate * std::tanh(z_tilde);
        n = forget_gate * n + input_gate;
        m = m_next;
        h = 1 / (1 + std::exp(-o_tilde)) * c / (n + eps);
        state(b, t, 4 * k) = c;
        state(b, t, 4 * k + 1) = n;
        state(b, t, 4 * k + 2) = m;
        state(b, t, 4 * k + 3) = h;
      }
    }
  return state;
}

// A state with n >= 0 (the cell's domain), drawn per slot.
template <class View>
void fill_state(const View& state, unsigned seed) {
  fill_uniform(state, -1, 1, seed);
  edit_on_host(state, [](auto& host) {
    for (std::size_t i = 1; i < host.span(); i += 4) host.data()[i] = 0.25 + std::fabs(host.data()[i]);
  });
}

// The worst over every group of cell_derivative_errors: (Jacobian, vjp).
template <class Space>
std::pair<double, double> jacobian_errors(const ParaSLSTM<double, typename Space::memory_space>& cell,
                                          const View1<double, Space>& state, const View1<double, Space>& u,
                                          const View1<double, Space>& mu) {
  const int groups = cell.hidden_size();
  const auto host = cell_derivative_errors<Space>(cell, state, u, mu);
  double worst_jacobian = 0, worst_vjp = 0;
  for (int g = 0; g < groups; ++g) {
    worst_jacobian = std::max(worst_jacobian, host(2 * g));
    worst_vjp = std::max(worst_vjp, host(2 * g + 1));
  }
  return {worst_jacobian, worst_vjp};
}

TYPED_TEST(SlstmCell, JacobianAndVjpMatchFiniteDifferencesAlsoAtATie) {
  using Space = TypeParam;
  const int H = 6;
  View2<double, Space> r("r", 4, H);
  View1<double, Space> state("state", 4 * H), u("u", 4 * H), mu("mu", 4 * H);
  fill_uniform(r, -0.5, 0.5, 1);
  fill_state(state, 2);
  fill_uniform(u, -2, 2, 3);
  fill_uniform(mu, -1, 1, 4);
  const ParaSLSTM<double, typename Space::memory_space> cell{r, 1e-6};
  auto [jacobian_error, vjp_error] = jacobian_errors<Space>(cell, state, u, mu);
  EXPECT_LE(jacobian_error, 1e-8);
  EXPECT_LE(vjp_error, 1e-13);
  // At a tie of the max (f~ + m = i~, exactly: h = 0, f~ + m = 0.25 + 0.5 = 0.75 = i~), the two
  // branches' derivatives differ; central differences straddle the kink and give their mean, the
  // cell's tie rule (dm'/dm = 1/2).
  edit_on_host(state, [&](auto& host) {
    for (int g = 0; g < H; ++g) host(4 * g + 2) = 0.5, host(4 * g + 3) = 0.0;
  });
  edit_on_host(u, [&](auto& host) {
    for (int g = 0; g < H; ++g) host(g) = 0.75, host(H + g) = 0.25;
  });
  std::tie(jacobian_error, vjp_error) = jacobian_errors<Space>(cell, state, u, mu);
  EXPECT_LE(jacobian_error, 1e-5);
  EXPECT_LE(vjp_error, 1e-13);
}

TYPED_TEST(SlstmCell, RejectsARecurrentWeightOfTheWrongShapeAndAnEpsNotPositiveAndFinite) {
  using Space = TypeParam;
  View2<double, Space> r3("r", 3, 4), r("r", 4, 4);
  View3<double, Space> u("u", 1, 2, 16), h("h", 1, 2, 16);
  try {
    newton_solve<CompiledNewtonModes::sequential>(Space{}, ParaSLSTM<double, typename Space::memory_space>{r3}, u, h);
    ADD_FAILURE() << "r of shape [3, 4] was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_THAT(e.what(), HasSubstr("cell.r"));
    EXPECT_THAT(e.what(), HasSubstr("[4, H]"));
  }
  for (double eps : {0.0, -1e-6, double(NAN), double(INFINITY)}) {
    try {
      newton_solve<CompiledNewtonModes::sequential>(Space{}, ParaSLSTM<double, typename Space::memory_space>{r, eps}, u, h);
      ADD_FAILURE() << "eps = " << eps << " was accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_THAT(e.what(), HasSubstr("argument 'cell.eps' has the value "));
      EXPECT_THAT(e.what(), HasSubstr("expected a finite number > 0"));
    }
  }
}

// Every mode (sequential; newton with the exact and with the quasi Jacobian; fused in windows
// shorter than T) against the float64 loop, from a random h0 with n0 > 0. The exact Jacobian needs
// many iterations here (docs/solvers.md, "ParaSLSTM's convergence"): K = 30 for T = 160, and in the
// fused mode K = W, for which a window of W steps is exact whatever the cell.
TYPED_TEST(SlstmCell, EveryModeMatchesTheSequentialLoop) {
  using Space = TypeParam;
  const int B = 2, T_steps = 160, H = 5;
  View2<double, Space> r("r", 4, H), h0("h0", B, 4 * H);
  View3<double, Space> u("u", B, T_steps, 4 * H), h("h", B, T_steps, 4 * H);
  fill_uniform(r, -0.5, 0.5, 11);
  fill_uniform(u, -1, 1, 12);
  fill_state(h0, 13);
  const Host3 reference = slstm_sequential(as_double2(r), as_double3(u), as_double2(h0), slstm_eps);
  const ParaSLSTM<double, typename Space::memory_space> cell{r, slstm_eps};
  struct Case {
    NewtonMode mode;
    NewtonJacobian jacobian;
    int iterations;
  };
  for (const Case& run : {Case{NewtonMode::sequential, NewtonJacobian::exact, 0}, Case{NewtonMode::newton, NewtonJacobian::exact, 30},
                          Case{NewtonMode::newton, NewtonJacobian::quasi, 200}, Case{NewtonMode::fused, NewtonJacobian::exact, 16}}) {
    SCOPED_TRACE("mode " + std::to_string(int(run.mode)) + ", jacobian " + std::to_string(int(run.jacobian)));
    NewtonConfig config;
    config.mode = run.mode;
    config.jacobian = run.jacobian;
    config.max_iters = run.iterations;
    config.fused_window = 16;
    if (run.jacobian == NewtonJacobian::quasi) config.residual_atol = 1e-13;
    Kokkos::deep_copy(h, NAN);
    NewtonStats<typename Space::memory_space> stats;
    newton_solve(Space{}, cell, u, h, config, h0, &stats);
    EXPECT_EQ(stats.mode, run.mode);
    EXPECT_LE(max_relative_error(h, reference), 1e-11);
    if (run.jacobian == NewtonJacobian::quasi) EXPECT_LT(stats.iterations, 60);
  }
}

// newton_backward in each mode against central differences of the float64 loop's loss sum(g * state).
TYPED_TEST(SlstmCell, GradientsMatchFiniteDifferencesOfTheLoop) {
  using Space = TypeParam;
  const int B = 2, T_steps = 6, H = 3;
  View2<double, Space> r("r", 4, H), h0("h0", B, 4 * H), dh0("dh0", B, 4 * H);
  View3<double, Space> u("u", B, T_steps, 4 * H), h("h", B, T_steps, 4 * H), g("g", B, T_steps, 4 * H),
      du("du", B, T_steps, 4 * H);
  View1<double, Space> dr("dr", 4 * H);
  fill_uniform(r, -0.5, 0.5, 21);
  fill_uniform(u, -1.5, 1.5, 22);
  fill_state(h0, 23);
  fill_uniform(g, -1, 1, 24);
  const ParaSLSTM<double, typename Space::memory_space> cell{r, slstm_eps};
  Host2 hr = as_double2(r); // a copy: perturbed by the differences below
  Host3 hu = as_double3(u), hg = as_double3(g);
  Host2 hh0 = as_double2(h0);
  auto loss = [&]() {
    const Host3 state = slstm_sequential(hr, hu, hh0, slstm_eps);
    double sum = 0;
    for (std::size_t i = 0; i < state.span(); ++i) sum += hg.data()[i] * state.data()[i];
    return sum;
  };
  for (NewtonMode mode : {NewtonMode::newton, NewtonMode::fused, NewtonMode::sequential}) {
    SCOPED_TRACE("mode " + std::to_string(int(mode)));
    NewtonConfig config;
    config.mode = mode;
    config.max_iters = 12;
    newton_solve(Space{}, cell, u, h, config, h0);
    EXPECT_LE(max_relative_error(h, slstm_sequential(hr, hu, hh0, slstm_eps)), 1e-12);
    Kokkos::deep_copy(du, NAN);
    Kokkos::deep_copy(dr, NAN);
    Kokkos::deep_copy(dh0, NAN);
    newton_backward(Space{}, cell, u, h, g, du, dr, h0, dh0, config);
    expect_gradient_matches_central_differences(du, hu.data(), hu.span(), loss, "du");
    expect_gradient_matches_central_differences(dr, hr.data(), hr.span(), loss, "dr");
    expect_gradient_matches_central_differences(dh0, hh0.data(), hh0.span(), loss, "dh0");
  }
}

} // namespace
