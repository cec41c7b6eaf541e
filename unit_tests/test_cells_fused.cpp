// The fused mode of the Elman cell (test_cells.cpp has its other modes, test_cells_fused_gradients.cpp
// its adjoint): a translation unit of its own, so that the fused kernels of a dense user cell compile
// beside the scans, not after them.

#include "elman_cell.hpp"
#include "test_support.hpp"

namespace {

using namespace paraseq;
using namespace paraseq::test;

template <class Space>
class FusedCells : public ::testing::Test {};
TYPED_TEST_SUITE(FusedCells, ExecutionSpaces, SpaceName);

TYPED_TEST(FusedCells, ElmanDenseFusedMatchesSequentialLoop) {
  expect_elman_solve_matches_sequential_loop<TypeParam, 9, CompiledNewtonModes::fused>(8, 500);
}

} // namespace
