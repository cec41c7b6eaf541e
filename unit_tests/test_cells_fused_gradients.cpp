// The adjoint of the Elman cell's fused mode (test_cells_fused.cpp has its forward): a unit of its
// own, so that the fused adjoint kernels compile beside the forward ones. Its h comes from the
// sequential loop, so that this unit compiles no fused forward kernel.

#include "elman_cell.hpp"
#include "test_support.hpp"

namespace {

using namespace paraseq;
using namespace paraseq::test;

template <class Space>
class FusedCellGradients : public ::testing::Test {};
TYPED_TEST_SUITE(FusedCellGradients, ExecutionSpaces, SpaceName);

// The dense adjoint of the fused kernel: maps of N x N, no cached Jacobians.
TYPED_TEST(FusedCellGradients, ElmanFusedGradientsMatchFiniteDifferences) {
  expect_elman_gradients_match_finite_differences<TypeParam, CompiledNewtonModes::fused, CompiledNewtonModes::sequential>(
      NewtonMode::fused);
}

} // namespace
