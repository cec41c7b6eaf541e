// Float Views accumulated in double (linear_scan<double>) against the sequential float64 reference,
// on every enabled execution space: not compiled instances (the library's are accumulated in the
// Views' own type), so their kernels compile here, in a unit of their own beside
// test_linear_scan.cpp (the dense structure's: test_linear_scan_structures.cpp).

#include <paraseq/core/linear_scan.hpp>

#include "linear_scan_checks.hpp"
#include "test_support.hpp"

#include <gmock/gmock.h>

namespace {

using namespace paraseq;
using namespace paraseq::test;

template <class Space>
class LinearScanFloat : public ::testing::Test {};
TYPED_TEST_SUITE(LinearScanFloat, ExecutionSpaces, SpaceName);

TYPED_TEST(LinearScanFloat, ContractiveOperatorsMatchToSinglePrecision) {
  using Space = TypeParam;
  const int T_steps = 10000;
  View3<float, Space> A("A", 2, T_steps, 5);
  fill_uniform(A, 0.9f, 0.999f, 7);
  expect_matches_reference<Space, float>(Diagonal{}, A, 2, T_steps, 5, 1e-5, decompositions<Space>());
  View5<float, Space> A4("A4", 1, T_steps, 2, 4, 4);
  fill_contractive(A4, 4, 8);
  expect_matches_reference<Space, float>(BlockDiagonal<4>{}, A4, 1, T_steps, 8, 1e-5, {ScanConfig{}, ScanConfig{1, 64, 9}});
}

} // namespace
