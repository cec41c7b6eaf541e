// ParaSLSTM's gradients (newton_backward) in the newton mode on every enabled execution space,
// against central differences of the float64 loop (slstm_checks.hpp); the sequential mode's:
// test_cells_slstm.cpp; the fused mode's: test_cells_slstm_fused.cpp.

#include "slstm_checks.hpp"

namespace {

using namespace paraseq;
using namespace paraseq::test;

template <class Space>
class SlstmGradients : public ::testing::Test {};
TYPED_TEST_SUITE(SlstmGradients, ExecutionSpaces, SpaceName);

TYPED_TEST(SlstmGradients, NewtonModeMatchesFiniteDifferencesOfTheLoop) {
  expect_slstm_gradients_match_finite_differences<TypeParam, CompiledNewtonModes::newton>(NewtonMode::newton);
}

} // namespace
