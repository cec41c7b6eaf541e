// Float Views accumulated in double with a DenseUpTo<8> A, against the sequential float64 reference,
// on every enabled execution space. A float scan accumulated in double is not a compiled instance,
// so this unit compiles its kernels (the header path): a unit of its own, as each such kernel set
// takes most of a minute under nvcc (the other structures: test_linear_scan_float.cpp).

#include <paraseq/core/linear_scan.hpp>

#include "linear_scan_checks.hpp"
#include "test_support.hpp"

namespace {

using namespace paraseq;
using namespace paraseq::test;

template <class Space>
class LinearScanDenseFloat : public ::testing::Test {};
TYPED_TEST_SUITE(LinearScanDenseFloat, ExecutionSpaces, SpaceName);

// A bound of 8 keeps the kernels small.
TYPED_TEST(LinearScanDenseFloat, FloatDenseAccumulatedInDoubleMatchesToSinglePrecision) {
  using Space = TypeParam;
  View4<float, Space> A8("A8", 1, 2000, 8, 8);
  fill_contractive(A8, 8, 9);
  expect_matches_reference<Space, float>(DenseUpTo<8>{}, A8, 1, 2000, 8, 1e-5, {ScanConfig{}, ScanConfig{1, 16, 5}});
}

} // namespace
