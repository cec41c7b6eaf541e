// ParaSLSTM (the xLSTM sLSTM cell with diagonal recurrence, cells.hpp) on every enabled execution
// space: its Jacobian against central differences of its step (also at a tie of the stabiliser's
// max), its argument checks, and the sequential mode's forward and gradients against a float64 loop
// over t written from the sLSTM equations (slstm_checks.hpp). Each other kernel family has a unit of
// its own: with PARASEQ_ETI these tests link the library's instances, but header-only
// (PARASEQ_ETI=OFF) each family compiles here, tens of seconds under nvcc for a 4x4-block cell: the
// newton mode with the exact Jacobian (test_cells_slstm_newton.cpp) and the quasi one
// (test_cells_slstm_quasi.cpp), the newton mode's gradients (test_cells_slstm_gradients.cpp), the
// fused mode (test_cells_slstm_fused.cpp).

#include "slstm_checks.hpp"

#include <gmock/gmock.h>

#include <stdexcept>
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

TYPED_TEST(SlstmCell, SequentialModeMatchesTheLoop) {
  expect_slstm_mode_matches_the_loop<TypeParam, CompiledNewtonModes::sequential>(NewtonMode::sequential,
                                                                                NewtonJacobian::exact, 0);
}

TYPED_TEST(SlstmCell, SequentialModeGradientsMatchFiniteDifferencesOfTheLoop) {
  expect_slstm_gradients_match_finite_differences<TypeParam, CompiledNewtonModes::sequential>(NewtonMode::sequential);
}

} // namespace
