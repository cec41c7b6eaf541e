// ParaGRUHeads (ParaGRU with head-block recurrence, pararnn's mix="head") on every enabled execution
// space, through its compiled instances: the Jacobian and vjp against central differences of its
// step, the newton, fused and sequential modes against a float64 loop written here from the
// equations, their gradients against central differences of that loop, and malformed parameters.

#include <paraseq/solvers/cells.hpp>
#include <paraseq/solvers/newton.hpp>
#include <paraseq/solvers/newton_backward.hpp>

#include "cell_derivative_checks.hpp"
#include "test_support.hpp"

#include <gmock/gmock.h>

#include <cmath>
#include <stdexcept>
#include <tuple>
#include <vector>

namespace {

using namespace paraseq;
using namespace paraseq::test;
using ::testing::HasSubstr;
using Host4 = Kokkos::View<double****, Kokkos::LayoutRight, Kokkos::HostSpace>;

double logistic(double x) { return 1 / (1 + std::exp(-x)); }

// The head GRU over t in double: a [3, n_heads, d, d] (A_z, A_r, A_c, rows the input channel), u
// [B, T, 3H] (z, r, c blocks), h0 [B, H] or none; per head, z = s(h A_z + u_z), r = s(h A_r + u_r),
// c = tanh((h r) A_c + u_c), h' = z c + (1 - z) h.
Host3 heads_sequential(const Host4& a, const Host3& u, const Host2& h0) {
  const int B = int(u.extent(0)), T = int(u.extent(1)), heads = int(a.extent(1)), d = int(a.extent(2)), H = heads * d;
  Host3 out("heads_reference", B, T, H);
  std::vector<double> h(H), next(H), z(d), q(d);
  for (int b = 0; b < B; ++b) {
    for (int i = 0; i < H; ++i) h[i] = h0.data() ? h0(b, i) : 0;
    for (int t = 0; t < T; ++t) {
      for (int head = 0; head < heads; ++head) {
        const int base = head * d;
        for (int j = 0; j < d; ++j) {
          double pre_z = u(b, t, base + j), pre_r = u(b, t, H + base + j);
          for (int i = 0; i < d; ++i) {
            pre_z += h[base + i] * a(0, head, i, j);
            pre_r += h[base + i] * a(1, head, i, j);
          }
          z[j] = logistic(pre_z);
          q[j] = h[base + j] * logistic(pre_r);
        }
        for (int j = 0; j < d; ++j) {
          double pre_c = u(b, t, 2 * H + base + j);
          for (int i = 0; i < d; ++i) pre_c += q[i] * a(2, head, i, j);
          next[base + j] = z[j] * std::tanh(pre_c) + (1 - z[j]) * h[base + j];
        }
      }
      h = next;
      for (int i = 0; i < H; ++i) out(b, t, i) = h[i];
    }
  }
  return out;
}

template <class View>
Host4 as_double4(const View& view) {
  auto host = to_host(view);
  Host4 out("double", host.extent(0), host.extent(1), host.extent(2), host.extent(3));
  for (std::size_t i = 0; i < host.span(); ++i) out.data()[i] = double(host.data()[i]);
  return out;
}

template <class Space>
class HeadCells : public ::testing::Test {};
TYPED_TEST_SUITE(HeadCells, ExecutionSpaces, SpaceName);

TYPED_TEST(HeadCells, JacobianAndVjpMatchFiniteDifferences) {
  using Space = TypeParam;
  for (int d : {2, 5, 32}) {
    const int heads = 2, H = heads * d;
    View4<double, Space> a("a", 3, heads, d, d);
    View1<double, Space> h("h", H), u("u", 3 * H), mu("mu", H);
    fill_uniform(a, -1.5 / std::sqrt(d), 1.5 / std::sqrt(d), 1 + d);
    fill_uniform(h, -1, 1, 2);
    fill_uniform(u, -1, 1, 3);
    fill_uniform(mu, -1, 1, 4);
    const auto errors = cell_derivative_errors<Space>(ParaGRUHeads<double, typename Space::memory_space>{a}, h, u, mu);
    ASSERT_EQ(errors.extent(0), std::size_t(2 * heads));
    for (std::size_t k = 0; k < errors.extent(0); ++k) EXPECT_LE(errors(k), 1e-8) << "d_head " << d << ", entry " << k;
  }
}

// Every mode, and the quasi Jacobian, against the loop, from a random h0, with heads of 4 channels and
// of the bound, 32.
TYPED_TEST(HeadCells, ModesMatchTheSequentialLoop) {
  using Space = TypeParam;
  for (int d : {4, 32}) {
    const int B = 2, T_steps = 150, heads = 3, H = heads * d;
    View4<double, Space> a("a", 3, heads, d, d);
    View2<double, Space> h0("h0", B, H);
    View3<double, Space> u("u", B, T_steps, 3 * H), h("h", B, T_steps, H);
    fill_uniform(a, -1.0 / std::sqrt(d), 1.0 / std::sqrt(d), 5);
    fill_uniform(u, -1, 1, 6);
    fill_uniform(h0, -1, 1, 7);
    const Host3 reference = heads_sequential(as_double4(a), as_double3(u), as_double2(h0));
    const ParaGRUHeads<double, typename Space::memory_space> cell{a};
    for (NewtonMode mode : {NewtonMode::sequential, NewtonMode::newton, NewtonMode::fused, NewtonMode::automatic}) {
      NewtonConfig config;
      config.mode = mode;
      config.max_iters = 12;
      config.fused_window = 32;
      Kokkos::deep_copy(h, NAN);
      NewtonStats<typename Space::memory_space> stats;
      newton_solve(Space{}, cell, u, h, config, h0, &stats);
      if (mode != NewtonMode::automatic) EXPECT_EQ(stats.mode, mode);
      // A device walks heads of 8 or more channels with the team step (newton.hpp's rule).
      else if (!Kokkos::SpaceAccessibility<Space, Kokkos::HostSpace>::accessible && d >= 8)
        EXPECT_EQ(stats.mode, NewtonMode::sequential);
      EXPECT_LE(max_relative_error(h, reference), 1e-12) << "d_head " << d << ", mode " << int(mode);
    }
    // The quasi Jacobian (J's diagonal, from linearize_diagonal): linear convergence, exact after
    // at most T iterations.
    NewtonConfig quasi;
    quasi.mode = NewtonMode::newton;
    quasi.jacobian = NewtonJacobian::quasi;
    quasi.max_iters = T_steps;
    quasi.residual_atol = 1e-14;
    Kokkos::deep_copy(h, NAN);
    newton_solve(Space{}, cell, u, h, quasi, h0);
    EXPECT_LE(max_relative_error(h, reference), 1e-12) << "d_head " << d << ", quasi Jacobian";
  }
}

// The float instance: its newton mode within float's accuracy of the float64 loop.
TYPED_TEST(HeadCells, FloatNewtonMatchesTheDoubleLoop) {
  using Space = TypeParam;
  const int B = 2, T_steps = 200, heads = 4, d = 8, H = heads * d;
  View4<float, Space> a("a", 3, heads, d, d);
  View3<float, Space> u("u", B, T_steps, 3 * H), h("h", B, T_steps, H);
  fill_uniform(a, -0.3, 0.3, 8);
  fill_uniform(u, -1, 1, 9);
  NewtonConfig config;
  config.mode = NewtonMode::newton;
  config.max_iters = 8;
  newton_solve(Space{}, ParaGRUHeads<float, typename Space::memory_space>{a}, u, h, config);
  EXPECT_LE(max_relative_error(h, heads_sequential(as_double4(a), as_double3(u), Host2())), 1e-5);
}

// Every mode's gradients, the sequential one's from the team adjoint (SequentialTeamAdjoint), with
// heads of 3 and of 6 channels.
TYPED_TEST(HeadCells, GradientsMatchFiniteDifferencesOfTheLoop) {
  using Space = TypeParam;
  for (int d : {3, 6}) {
    SCOPED_TRACE("d_head " + std::to_string(d));
    const int B = 2, T_steps = 5, heads = 2, H = heads * d;
    View4<double, Space> a("a", 3, heads, d, d);
    View2<double, Space> h0("h0", B, H), dh0("dh0", B, H);
    View3<double, Space> u("u", B, T_steps, 3 * H), h("h", B, T_steps, H), g("g", B, T_steps, H),
        du("du", B, T_steps, 3 * H);
    View1<double, Space> da("da", 3 * H * d);
    fill_uniform(a, -0.8, 0.8, 10);
    fill_uniform(u, -1.5, 1.5, 11);
    fill_uniform(h0, -1, 1, 12);
    fill_uniform(g, -1, 1, 13);
    const ParaGRUHeads<double, typename Space::memory_space> cell{a};
    Host4 ha = as_double4(a); // copies, perturbed by the differences below
    Host3 hu = as_double3(u), hg = as_double3(g);
    Host2 hh0 = as_double2(h0);
    auto loss = [&]() {
      const Host3 state = heads_sequential(ha, hu, hh0);
      double sum = 0;
      for (std::size_t i = 0; i < state.span(); ++i) sum += hg.data()[i] * state.data()[i];
      return sum;
    };
    for (NewtonMode mode : {NewtonMode::newton, NewtonMode::fused, NewtonMode::sequential}) {
      NewtonConfig config;
      config.mode = mode;
      config.max_iters = 10;
      newton_solve(Space{}, cell, u, h, config, h0);
      EXPECT_LE(max_relative_error(h, heads_sequential(ha, hu, hh0)), 1e-12);
      Kokkos::deep_copy(du, NAN);
      Kokkos::deep_copy(da, NAN);
      Kokkos::deep_copy(dh0, NAN);
      newton_backward(Space{}, cell, u, h, g, du, da, h0, dh0, config);
      SCOPED_TRACE("mode " + std::to_string(int(mode)));
      expect_gradient_matches_central_differences(du, hu.data(), hu.span(), loss, "du");
      expect_gradient_matches_central_differences(da, ha.data(), ha.span(), loss, "da");
      expect_gradient_matches_central_differences(dh0, hh0.data(), hh0.span(), loss, "dh0");
    }
  }
}

// Heads of the bound, 32 channels, in double: the team adjoint's gradients (whose parameter sums
// outgrow a GPU's default 48 KiB of team scratch and move to level 1 there) against the newton
// mode's reverse scan.
TYPED_TEST(HeadCells, TeamAdjointOfWideHeadsMatchesTheScanAdjoint) {
  using Space = TypeParam;
  const int B = 2, T_steps = 40, heads = 2, d = 32, H = heads * d;
  View4<double, Space> a("a", 3, heads, d, d);
  View2<double, Space> h0("h0", B, H);
  View3<double, Space> u("u", B, T_steps, 3 * H), h("h", B, T_steps, H), g("g", B, T_steps, H);
  fill_uniform(a, -1.0 / std::sqrt(d), 1.0 / std::sqrt(d), 14);
  fill_uniform(u, -1, 1, 15);
  fill_uniform(h0, -1, 1, 16);
  fill_uniform(g, -1, 1, 17);
  const ParaGRUHeads<double, typename Space::memory_space> cell{a};
  NewtonConfig sequential, scans;
  sequential.mode = NewtonMode::sequential;
  scans.mode = NewtonMode::newton;
  newton_solve(Space{}, cell, u, h, sequential, h0);
  auto gradients = [&](const NewtonConfig& config) {
    View3<double, Space> du("du", B, T_steps, 3 * H);
    View1<double, Space> da("da", 3 * H * d);
    View2<double, Space> dh0("dh0", B, H);
    newton_backward(Space{}, cell, u, h, g, du, da, h0, dh0, config);
    return std::tuple{du, da, dh0};
  };
  const auto [du, da, dh0] = gradients(sequential);
  const auto [du_scan, da_scan, dh0_scan] = gradients(scans);
  EXPECT_LE(max_relative_error(du, to_host(du_scan)), 1e-11);
  EXPECT_LE(max_relative_error(da, to_host(da_scan)), 1e-11);
  EXPECT_LE(max_relative_error(dh0, to_host(dh0_scan)), 1e-11);
}

TYPED_TEST(HeadCells, MalformedHeadsAreRejected) {
  using Space = TypeParam;
  auto expect_rejected = [](int rows, int heads, int d_in, int d_out, const char* shape) {
    View4<double, Space> a("a", rows, heads, d_in, d_out);
    const int H = heads * d_in;
    View3<double, Space> u("u", 1, 4, 3 * H), h("h", 1, 4, H);
    try {
      newton_solve(Space{}, ParaGRUHeads<double, typename Space::memory_space>{a}, u, h);
      ADD_FAILURE() << "cell.a of shape " << shape << " was accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_THAT(e.what(), HasSubstr("cell.a"));
      EXPECT_THAT(e.what(), HasSubstr(shape));
      EXPECT_THAT(e.what(), HasSubstr("2 <= d_head <= 32"));
    }
  };
  expect_rejected(3, 2, 1, 1, "[3, 2, 1, 1]");   // d_head 1: the diagonal ParaGRU
  expect_rejected(3, 1, 33, 33, "[3, 1, 33, 33]"); // past the dense bound
  expect_rejected(3, 2, 3, 4, "[3, 2, 3, 4]");   // blocks not square
  expect_rejected(2, 2, 3, 3, "[2, 2, 3, 3]");   // a gate missing
  expect_rejected(3, 0, 3, 3, "[3, 0, 3, 3]");   // no heads
}

} // namespace
