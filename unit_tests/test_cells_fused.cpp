// The fused mode of the Elman cell (test_cells.cpp has its other modes, test_cells_fused_gradients.cpp
// its adjoint): a translation unit of its own, so that the fused kernels of a dense user cell compile
// beside the scans, not after them.

#include "elman_cell.hpp"
#include "fused_early_exit_checks.hpp"
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

// residual_atol's early exit where the re-run evaluates the cell again (groups above 4 keep no
// linearisation): the last thread of a window evaluates its steps in the compose phase too.
TYPED_TEST(FusedCells, ElmanFusedResidualAtolStopsEachWindowEarly) {
  using Space = TypeParam;
  const int B = 2, T_steps = 96, N = 6;
  const auto W = contractive_matrix<Space>(N, 31, 0.5);
  View3<double, Space> u("u", B, T_steps, N);
  View2<double, Space> h0("h0", B, N);
  fill_uniform(u, -0.5, 0.5, 32);
  fill_uniform(h0, -0.5, 0.5, 33);
  const Host2 W_host = as_double2(W), h0_host = as_double2(h0);
  const Host3 u_host = as_double3(u);
  const ElmanCell<double, typename Space::memory_space> cell{W};
  // Three windows, then one: on a device a window of 96 steps is 12 threads per lane (8 steps each).
  for (const int window : {32, 96})
    expect_fused_early_exit<Space, CompiledNewtonModes::fused>(
        cell, u, h0, elman_sequential(W_host, u_host, h0_host),
        [&](const Host3& h) { return elman_residual(W_host, u_host, h0_host, h); }, window);
}

} // namespace
