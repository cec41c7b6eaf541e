// ParaSLSTM's newton mode with the quasi Jacobian (its diagonal) on every enabled execution space
// against the float64 loop (slstm_checks.hpp): a unit of its own, as each kernel family of a
// 4x4-block cell costs tens of seconds under nvcc when header-only (test_cells_slstm.cpp lists the others).

#include "slstm_checks.hpp"

namespace {

using namespace paraseq;
using namespace paraseq::test;

template <class Space>
class SlstmQuasi : public ::testing::Test {};
TYPED_TEST_SUITE(SlstmQuasi, ExecutionSpaces, SpaceName);

TYPED_TEST(SlstmQuasi, ForwardMatchesTheLoop) {
  expect_slstm_mode_matches_the_loop<TypeParam, CompiledNewtonModes::newton_quasi>(NewtonMode::newton,
                                                                                   NewtonJacobian::quasi, 200);
}

} // namespace
