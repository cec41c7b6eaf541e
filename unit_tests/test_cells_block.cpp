// The block cell (3 x 3 Jacobian blocks, a state size given at run time) against its sequential loop
// in the newton and fused modes, and a state size off the block: its own unit, beside test_cells.cpp.

#include "block_mean_cell.hpp"
#include "test_support.hpp"

#include <paraseq/solvers/newton.hpp>

#include <gmock/gmock.h>

#include <cmath>
#include <stdexcept>

namespace {

using namespace paraseq;
using namespace paraseq::test;
using ::testing::HasSubstr;

template <class Space>
class BlockCells : public ::testing::Test {};
TYPED_TEST_SUITE(BlockCells, ExecutionSpaces, SpaceName);

TYPED_TEST(BlockCells, BlockCellMatchesSequentialLoopAndRejectsStateSizesOffTheBlock) {
  using Space = TypeParam;
  const int B = 2, T_steps = 400, N = 9;
  View3<double, Space> u("u", B, T_steps, N), h("h", B, T_steps, N), seq("seq", B, T_steps, N);
  fill_uniform(u, -1, 1, 21);
  const BlockMeanCell<typename Space::memory_space> cell{N, 0.25};
  constexpr auto modes = CompiledNewtonModes::sequential | CompiledNewtonModes::newton | CompiledNewtonModes::fused;
  NewtonConfig config;
  config.mode = NewtonMode::sequential;
  newton_solve<modes>(Space{}, cell, u, seq, config);
  // The loop above is the reference only if it is one: check its first step by hand.
  auto hu = to_host(u);
  auto hs = to_host(seq);
  EXPECT_NEAR(hs(0, 0, 4), std::tanh(hu(0, 0, 4)), 1e-15);
  EXPECT_NEAR(hs(0, 1, 4), std::tanh(0.25 * (hs(0, 0, 3) + hs(0, 0, 4) + hs(0, 0, 5)) + hu(0, 1, 4)), 1e-15);
  for (NewtonMode mode : {NewtonMode::newton, NewtonMode::fused}) {
    config.mode = mode;
    config.max_iters = 5;
    newton_solve<modes>(Space{}, cell, u, h, config);
    EXPECT_LE(max_relative_error(h, to_host(seq)), 1e-12);
  }

  View3<double, Space> u7("u7", B, T_steps, 7), h7("h7", B, T_steps, 7);
  try {
    newton_solve<CompiledNewtonModes::sequential>(Space{}, BlockMeanCell<typename Space::memory_space>{7, 0.25}, u7, h7);
    ADD_FAILURE() << "a state size of 7 with blocks of 3 was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_THAT(e.what(), HasSubstr("state size 7"));
    EXPECT_THAT(e.what(), HasSubstr("a multiple of the block size 3"));
  }
}

} // namespace
