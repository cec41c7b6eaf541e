// The fused mode of the Elman cell at the dense limit (paraseq::Dense, N = 32): its own unit, beside
// test_cells_dense.cpp's scans.

#include "elman_cell.hpp"
#include "test_support.hpp"

namespace {

using namespace paraseq;
using namespace paraseq::test;

template <class Space>
class DenseFusedCells : public ::testing::Test {};
TYPED_TEST_SUITE(DenseFusedCells, ExecutionSpaces, SpaceName);

TYPED_TEST(DenseFusedCells, ElmanAtTheDenseLimitFusedMatchesSequentialLoop) {
  expect_elman_solve_matches_sequential_loop<TypeParam, max_dense_size, CompiledNewtonModes::fused>(32, 100);
}

} // namespace
