// The quasi-Newton mode (NewtonJacobian::quasi: the diagonal of the Jacobian, a diagonal scan) of the
// Elman cell against the exact one: its own unit, beside test_cells.cpp.

#include "elman_cell.hpp"
#include "test_support.hpp"

namespace {

using namespace paraseq;
using namespace paraseq::test;

template <class Space>
class QuasiCells : public ::testing::Test {};
TYPED_TEST_SUITE(QuasiCells, ExecutionSpaces, SpaceName);

// Quasi-Newton keeps only diag(J): it still converges, but linearly, so it needs more iterations
// than the exact dense Newton to reach the same residual.
TYPED_TEST(QuasiCells, ElmanQuasiNewtonConvergesMoreSlowly) {
  using Space = TypeParam;
  const int B = 2, T_steps = 300, N = 6;
  const auto W = contractive_matrix<Space>(N, 7, 0.6);
  View3<double, Space> u("u", B, T_steps, N), h("h", B, T_steps, N);
  fill_uniform(u, -0.5, 0.5, 8);
  const Host3 reference = elman_sequential(as_double2(W), as_double3(u));
  const ElmanCell<double, typename Space::memory_space> cell{W};
  NewtonConfig config;
  config.mode = NewtonMode::newton;
  config.max_iters = 60;
  config.residual_atol = 1e-13;
  NewtonStats<typename Space::memory_space> exact, quasi;
  constexpr auto modes = CompiledNewtonModes::newton | CompiledNewtonModes::newton_quasi;
  newton_solve<modes>(Space{}, cell, u, h, config, ZeroInitialState{}, &exact);
  EXPECT_LE(max_relative_error(h, reference), 1e-11);
  config.jacobian = NewtonJacobian::quasi;
  Kokkos::deep_copy(h, NAN);
  newton_solve<modes>(Space{}, cell, u, h, config, ZeroInitialState{}, &quasi);
  EXPECT_LE(max_relative_error(h, reference), 1e-11);
  EXPECT_GT(quasi.iterations, exact.iterations);
  EXPECT_LT(quasi.iterations, config.max_iters);
}

} // namespace
