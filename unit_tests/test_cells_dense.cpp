// The Elman cell at the dense limit (paraseq::Dense, N = 32) on every enabled execution space, its
// newton and sequential modes (the fused mode: test_cells_dense_fused.cpp): units of their own,
// because every Newton kernel with 32 x 32 maps takes minutes to compile (test_cells.cpp has the
// same cell as DenseUpTo<9>).

#include "elman_cell.hpp"
#include "test_support.hpp"

#include <type_traits>

namespace {

using namespace paraseq;
using namespace paraseq::test;

template <class Space>
class DenseCells : public ::testing::Test {};
TYPED_TEST_SUITE(DenseCells, ExecutionSpaces, SpaceName);

TYPED_TEST(DenseCells, ElmanAtTheDenseLimitMatchesSequentialLoop) {
  static_assert(std::is_same_v<DenseUpTo<max_dense_size>, Dense>);
  expect_elman_solve_matches_sequential_loop<TypeParam, max_dense_size,
                                             CompiledNewtonModes::newton | CompiledNewtonModes::sequential>(32, 100);
}

TYPED_TEST(DenseCells, DenseStateLargerThan32IsRejected) { expect_wider_state_rejected<TypeParam, max_dense_size>(); }

} // namespace
