// The gradients of the Elman cell's newton mode (test_cells.cpp has its forward): a unit of its own,
// so that the adjoint scans compile beside the forward ones.

#include "elman_cell.hpp"
#include "test_support.hpp"

namespace {

using namespace paraseq;
using namespace paraseq::test;

template <class Space>
class CellGradients : public ::testing::Test {};
TYPED_TEST_SUITE(CellGradients, ExecutionSpaces, SpaceName);

TYPED_TEST(CellGradients, ElmanGradientsMatchFiniteDifferences) {
  expect_elman_gradients_match_finite_differences<TypeParam, CompiledNewtonModes::newton>(NewtonMode::newton);
}

} // namespace
