// The ordered scan of the block-diagonal and dense structures (BlockDiagonal<2..4>, Dense and a
// declared bound, DenseUpTo<M>) against the sequential float64 reference, forward and reverse, on
// every enabled execution space: a unit of its own beside test_linear_scan.cpp. Float Views
// accumulated in double: test_linear_scan_float.cpp, and for a DenseUpTo<8> A
// test_linear_scan_dense_float.cpp (each header-path dense kernel set is a unit's worth of nvcc).

#include <paraseq/core/linear_scan.hpp>

#include "linear_scan_checks.hpp"
#include "test_support.hpp"

#include <gmock/gmock.h>

#include <string>

namespace {

using namespace paraseq;
using namespace paraseq::test;
using ::testing::HasSubstr;

template <class Space>
class LinearScanStructures : public ::testing::Test {};
TYPED_TEST_SUITE(LinearScanStructures, ExecutionSpaces, SpaceName);

TYPED_TEST(LinearScanStructures, BlockDiagonalMatchesSequentialReferenceInDouble) {
  using Space = TypeParam;
  View5<double, Space> A2("A2", 2, 777, 5, 2, 2);
  fill_contractive(A2, 2, 2);
  expect_matches_reference<Space, double>(BlockDiagonal<2>{}, A2, 2, 777, 10, 1e-12, decompositions<Space>());
  View5<double, Space> A3("A3", 2, 500, 2, 3, 3);
  fill_contractive(A3, 3, 3);
  expect_matches_reference<Space, double>(BlockDiagonal<3>{}, A3, 2, 500, 6, 1e-12, decompositions<Space>());
  View5<double, Space> A4("A4", 1, 613, 3, 4, 4);
  fill_contractive(A4, 4, 4);
  expect_matches_reference<Space, double>(BlockDiagonal<4>{}, A4, 1, 613, 12, 1e-12, decompositions<Space>());
}

TYPED_TEST(LinearScanStructures, DenseMatchesSequentialReferenceInDouble) {
  using Space = TypeParam;
  View4<double, Space> A("A", 2, 300, 8, 8);
  fill_contractive(A, 8, 5);
  expect_matches_reference<Space, double>(Dense{}, A, 2, 300, 8, 1e-12, decompositions<Space>(3));
  View4<double, Space> A32("A32", 1, 64, 32, 32);
  fill_contractive(A32, 32, 6);
  expect_matches_reference<Space, double>(Dense{}, A32, 1, 64, 32, 1e-12, {ScanConfig{}, ScanConfig{1, 5, 4}});
}

// A dense A whose bound is declared smaller than 32: the same recurrence with maps sized for it,
// and a wider state is an error that names the bound.
TYPED_TEST(LinearScanStructures, DenseUpToABoundMatchesSequentialReference) {
  using Space = TypeParam;
  for (int N : {3, 5}) {
    SCOPED_TRACE("N=" + std::to_string(N));
    View4<double, Space> A("A", 2, 200, N, N);
    fill_contractive(A, N, 20 + N);
    expect_matches_reference<Space, double>(DenseUpTo<5>{}, A, 2, 200, N, 1e-12, decompositions<Space>(2));
  }
  View4<double, Space> A6("A6", 1, 4, 6, 6);
  View3<double, Space> b6("b6", 1, 4, 6), h6("h6", 1, 4, 6);
  EXPECT_THAT(thrown_message([&] { linear_scan(Space{}, DenseUpTo<5>{}, A6, b6, h6); }),
              HasSubstr("a state size N <= 5 for a DenseUpTo<5> A"));
}

} // namespace
