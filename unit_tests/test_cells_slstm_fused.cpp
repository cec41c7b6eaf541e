// ParaSLSTM's fused mode on every enabled execution space, forward (windows shorter than T) and
// adjoint, against the float64 loop and central differences of it (slstm_checks.hpp).

#include "slstm_checks.hpp"

namespace {

using namespace paraseq;
using namespace paraseq::test;

template <class Space>
class SlstmFused : public ::testing::Test {};
TYPED_TEST_SUITE(SlstmFused, ExecutionSpaces, SpaceName);

TYPED_TEST(SlstmFused, ForwardMatchesTheLoop) {
  expect_slstm_mode_matches_the_loop<TypeParam, CompiledNewtonModes::fused>(NewtonMode::fused, NewtonJacobian::exact, 16);
}

TYPED_TEST(SlstmFused, GradientsMatchFiniteDifferencesOfTheLoop) {
  expect_slstm_gradients_match_finite_differences<TypeParam, CompiledNewtonModes::fused>(NewtonMode::fused);
}

} // namespace
