// User cells through the cell concept, on every enabled execution space: the Jacobians of every
// cell against central finite differences, the built-in cells' float arithmetic, and the newton and
// sequential modes of an Elman cell with a dense recurrent matrix (the DEER dense path). Its
// gradients: test_cells_gradients.cpp; its quasi Jacobian: test_cells_quasi.cpp; its fused mode:
// test_cells_fused*.cpp; the block cell's solves: test_cells_block.cpp; the dense limit:
// test_cells_dense*.cpp. One family of Newton kernels (and one direction) per unit, so that they
// compile side by side.

#include <paraseq/solvers/cells.hpp>
#include <paraseq/solvers/newton.hpp>
#include <paraseq/solvers/newton_backward.hpp>

#include "block_mean_cell.hpp"
#include "cell_derivative_checks.hpp"
#include "elman_cell.hpp"
#include "test_support.hpp"

#include <gmock/gmock.h>

#include <cmath>
#include <stdexcept>

namespace {

using namespace paraseq;
using namespace paraseq::test;
using ::testing::HasSubstr;

// The concept accepts the library's and this file's cells and rejects a cell without its vjp (the
// solver's static_assert then names the missing vjp).
struct CellWithoutVjp {
  using structure = Diagonal;
  static constexpr int max_inputs_per_group = 1;
  static constexpr int max_params_per_group = 1;
  int state_size() const { return 1; }
  int input_size() const { return 1; }
  int param_count() const { return 0; }
  int inputs_per_group() const { return 1; }
  int params_per_group() const { return 0; }
  int input_column(int, int) const { return 0; }
  int param_index(int, int) const { return 0; }
  void check(const char*) const {}
  template <class Acc>
  void step(int, const Acc* h, const Acc* u, Acc* f) const { f[0] = h[0] + u[0]; }
  template <class Acc>
  void linearize(int, const Acc* h, const Acc* u, Acc* f, Acc* J) const { f[0] = h[0] + u[0], J[0] = 1; }
};
static_assert(NewtonCell<ParaGRU<float>, float> && NewtonCell<ParaLSTM<double>, double>);
static_assert(NewtonCell<ElmanCell<double, Kokkos::HostSpace>, double> && NewtonCell<BlockMeanCell<Kokkos::HostSpace>, float>);
static_assert(!NewtonCell<CellWithoutVjp, double> && paraseq::detail::has_cell_linearize<CellWithoutVjp, double>);

template <class Space>
class Cells : public ::testing::Test {};
TYPED_TEST_SUITE(Cells, ExecutionSpaces, SpaceName);

// For every group at a random (h, u): the Jacobian and the vjp against central differences.
template <class Space, class Cell>
void expect_derivatives_consistent(const Cell& cell, unsigned seed) {
  const int N = cell.state_size(), groups = group_count<typename Cell::structure>(N);
  View1<double, Space> h("h", N), u("u", cell.input_size()), mu("mu", N);
  fill_uniform(h, -0.9, 0.9, seed);
  fill_uniform(u, -1, 1, seed + 1);
  fill_uniform(mu, -1, 1, seed + 2);
  const auto host = cell_derivative_errors<Space>(cell, h, u, mu);
  for (int g = 0; g < groups; ++g) {
    EXPECT_LE(host(2 * g), 1e-8) << "Jacobian of group " << g;
    EXPECT_LE(host(2 * g + 1), 1e-13) << "vjp of group " << g;
  }
}

TYPED_TEST(Cells, JacobiansMatchFiniteDifferences) {
  using Space = TypeParam;
  using memory = typename Space::memory_space;
  View2<double, Space> a("a", 3, 6), p("p", 2, 6), W("W", 9, 9);
  fill_uniform(a, -1.5, 1.5, 1);
  fill_uniform(p, -1.5, 1.5, 2);
  fill_uniform(W, -0.5, 0.5, 3);
  expect_derivatives_consistent<Space>(ParaGRU<double, memory>{a}, 10);
  expect_derivatives_consistent<Space>(ParaLSTM<double, memory>{a, p}, 20);
  expect_derivatives_consistent<Space>(ElmanCell<double, memory>{W}, 30);
  expect_derivatives_consistent<Space>(BlockMeanCell<memory>{9, 0.4}, 40);
}

// The built-in cells' float arithmetic on the space (on CUDA: the approximate exp and division of
// docs/numerics.md) against the cells' equations written here in double, over gate inputs from -80
// to 80: a few 1e-7 per gate, finite everywhere, the exact limits where every gate saturates.
template <class Space>
void expect_float_cells_match_equations(bool lstm) {
  using memory = typename Space::memory_space;
  constexpr int H = 4096;
  const int N = lstm ? 2 * H : H;
  View2<float, Space> a("a", 3, H), p("p", 2, H);
  View1<float, Space> state("state", N), u("u", 3 * H), next("next", N);
  fill_uniform(a, -1.5, 1.5, 5);
  fill_uniform(p, -1.5, 1.5, 6);
  fill_uniform(state, -1, 1, 7);
  {
    auto host_u = Kokkos::create_mirror_view(u);
    for (int k = 0; k < 3 * H; ++k) host_u(k) = float(-80.0 + 160.0 * ((k * 7919) % (3 * H)) / (3 * H - 1));
    host_u(0) = host_u(H) = host_u(2 * H) = 80.0f; // group 0: every gate saturated high
    host_u(1) = host_u(H + 1) = host_u(2 * H + 1) = -80.0f; // group 1: saturated low
    Kokkos::deep_copy(u, host_u);
  }
  const ParaGRU<float, memory> gru{a};
  const ParaLSTM<float, memory> lstm_cell{a, p};
  Kokkos::parallel_for(
      "test::float_cells", Kokkos::RangePolicy<Space>(0, H), KOKKOS_LAMBDA(int g) {
        float in[3], s[2], out[2];
        for (int k = 0; k < 3; ++k) in[k] = u(k * H + g);
        if (lstm) {
          s[0] = state(2 * g);
          s[1] = state(2 * g + 1);
          lstm_cell.step(g, s, in, out);
          next(2 * g) = out[0];
          next(2 * g + 1) = out[1];
        } else {
          s[0] = state(g);
          gru.step(g, s, in, out);
          next(g) = out[0];
        }
      });
  const auto A = to_host(a), P = to_host(p);
  const auto S = to_host(state), U = to_host(u), F = to_host(next);
  auto sigmoid = [](double x) { return 1 / (1 + std::exp(-x)); };
  double worst = 0;
  for (int g = 0; g < H; ++g) {
    double expected[2];
    if (lstm) {
      const double c = S(2 * g), h = S(2 * g + 1);
      const double f = sigmoid(double(A(0, g)) * h + double(P(0, g)) * c + double(U(g)));
      const double c_tilde = std::tanh(double(A(1, g)) * h + double(U(H + g)));
      expected[0] = f * c + (1 - f) * c_tilde;
      const double o = sigmoid(double(A(2, g)) * h + double(P(1, g)) * expected[0] + double(U(2 * H + g)));
      expected[1] = o * std::tanh(expected[0]);
    } else {
      const double h = S(g);
      const double z = sigmoid(double(A(0, g)) * h + double(U(g)));
      const double r = sigmoid(double(A(1, g)) * h + double(U(H + g)));
      const double c = std::tanh(double(A(2, g)) * (h * r) + double(U(2 * H + g)));
      expected[0] = z * c + (1 - z) * h;
    }
    for (int i = 0; i < (lstm ? 2 : 1); ++i) {
      const double got = F(lstm ? 2 * g + i : g);
      ASSERT_TRUE(std::isfinite(got)) << "group " << g;
      worst = std::max(worst, std::abs(got - expected[i]));
    }
  }
  EXPECT_LE(worst, 1e-6);
  if (lstm) { // group 0: f = 1 exactly, so c' = c; group 1: f, o < 1e-34 and c~ = -1, so c' = -1, h' ~ 0
    EXPECT_EQ(F(0), S(0));
    EXPECT_EQ(F(2), -1.0f);
    EXPECT_NEAR(F(3), 0.0f, 1e-30);
  } else { // group 0: z = c = 1, so h' = 1 (to the rounding of h + (1 - h)); group 1: z < 1e-34, so h' = h
    EXPECT_NEAR(F(0), 1.0f, 1.2e-7);
    EXPECT_EQ(F(1), S(1));
  }
}

TYPED_TEST(Cells, FloatCellsMatchTheirEquationsInDouble) {
  expect_float_cells_match_equations<TypeParam>(false);
  expect_float_cells_match_equations<TypeParam>(true);
}

// The fused mode of the same cell: test_cells_fused.cpp; the dense N = 32: test_cells_dense*.cpp.
TYPED_TEST(Cells, ElmanDenseNewtonMatchesSequentialLoop) {
  expect_elman_solve_matches_sequential_loop<TypeParam, 9, CompiledNewtonModes::newton | CompiledNewtonModes::sequential>(
      8, 500);
}

// A call names the modes it compiles: another mode is an error that names them, and the automatic
// choice picks among them.
TYPED_TEST(Cells, ACallRunsOnlyTheModesItCompiles) {
  using Space = TypeParam;
  const auto W = contractive_matrix<Space>(3, 41);
  View3<double, Space> u("u", 2, 16, 3), h("h", 2, 16, 3);
  const ElmanCell<double, typename Space::memory_space> cell{W};
  NewtonConfig config;
  config.mode = NewtonMode::newton;
  try {
    newton_solve<CompiledNewtonModes::sequential>(Space{}, cell, u, h, config);
    ADD_FAILURE() << "a mode that the call does not compile ran";
  } catch (const std::invalid_argument& e) {
    EXPECT_THAT(e.what(), HasSubstr("config.mode"));
    EXPECT_THAT(e.what(), HasSubstr("NewtonMode::newton"));
    EXPECT_THAT(e.what(), HasSubstr("a mode that this call compiles (CompiledNewtonModes::sequential)"));
  }
  config.mode = NewtonMode::automatic;
  config.jacobian = NewtonJacobian::quasi;
  EXPECT_THROW(newton_solve<CompiledNewtonModes::newton>(Space{}, cell, u, h, config), std::invalid_argument);
  config.jacobian = NewtonJacobian::exact;
  NewtonStats<typename Space::memory_space> stats;
  newton_solve<CompiledNewtonModes::sequential>(Space{}, cell, u, h, config, ZeroInitialState{}, &stats);
  EXPECT_EQ(stats.mode, NewtonMode::sequential);
  EXPECT_LE(max_relative_error(h, elman_sequential(as_double2(W), as_double3(u))), 1e-14);
}

TYPED_TEST(Cells, ElmanWithLargeJacobianRaisesDivergence) {
  using Space = TypeParam;
  const int B = 1, T_steps = 200, N = 6;
  const auto W = contractive_matrix<Space>(N, 31, 12.0); // |J| >> 1: a chaotic tanh network
  View3<double, Space> u("u", B, T_steps, N), h("h", B, T_steps, N);
  fill_uniform(u, -1, 1, 32);
  NewtonConfig config;
  config.mode = NewtonMode::newton;
  config.residual_fail = 1e-6;
  try {
    newton_solve<CompiledNewtonModes::newton>(Space{}, ElmanCell<double, typename Space::memory_space>{W}, u, h, config);
    ADD_FAILURE() << "no NewtonDivergenceError";
  } catch (const NewtonDivergenceError& e) {
    EXPECT_GT(e.residual(), 1e-6);
    EXPECT_EQ(e.iteration(), 3);
    EXPECT_THAT(e.what(), HasSubstr("residual_fail"));
  }
}

TYPED_TEST(Cells, DenseStateWiderThanTheCellsBoundIsRejected) { expect_wider_state_rejected<TypeParam, 9>(); }

} // namespace
