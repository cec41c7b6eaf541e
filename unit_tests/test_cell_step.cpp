// cell_step (decoding one step at a time) against newton_solve of the same inputs, ParaGRU and
// ParaLSTM in double precision, and its argument checks; on every enabled execution space.

#include <paraseq/solvers/cell_step.hpp>
#include <paraseq/solvers/cells.hpp>

#include "test_support.hpp"

#include <gmock/gmock.h>

#include <cmath>

namespace {

using namespace paraseq;
using namespace paraseq::test;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

template <class Space>
class CellStep : public ::testing::Test {};
TYPED_TEST_SUITE(CellStep, ExecutionSpaces, SpaceName);

// Steps t = 0 .. T-1 from h0 (or from zero) and compares each state with the solve's h[:, t, :].
template <class Space, class Cell, class H0>
void expect_steps_reproduce_the_solve(const Cell& cell, int B, int T, const H0& h0, unsigned seed) {
  const int N = cell.state_size(), U = cell.input_size();
  View3<double, Space> u("u", B, T, U), h("h", B, T, N);
  fill_uniform(u, -1.5, 1.5, seed);
  NewtonConfig config; // Newton on T steps is exact after T iterations (each fixes one more step)
  config.mode = NewtonMode::newton;
  config.max_iters = T;
  newton_solve(Space{}, cell, u, h, config, h0);
  const auto solved = to_host(h);

  View2<double, Space> u_t("u_t", B, U), previous("previous", B, N), next("next", B, N);
  double worst = 0;
  for (int t = 0; t < T; ++t) {
    Kokkos::deep_copy(u_t, Kokkos::subview(u, Kokkos::ALL, t, Kokkos::ALL));
    if (t > 0) cell_step(Space{}, cell, u_t, previous, next);
    else cell_step(Space{}, cell, u_t, h0, next);
    const auto stepped = to_host(next);
    for (int b = 0; b < B; ++b)
      for (int n = 0; n < N; ++n)
        worst = std::fmax(worst, std::fabs(stepped(b, n) - solved(b, t, n)) / std::fmax(1.0, std::fabs(solved(b, t, n))));
    Kokkos::deep_copy(previous, next);
  }
  EXPECT_LE(worst, 1e-12);
}

TYPED_TEST(CellStep, StepsReproduceNewtonSolveOfTheSameInputs) {
  using Space = TypeParam;
  using Mem = typename Space::memory_space;
  const int B = 3, T = 24, H = 5;
  View2<double, Space> a("a", 3, H), p("p", 2, H), gru_h0("gru_h0", B, H), lstm_h0("lstm_h0", B, 2 * H);
  fill_uniform(a, -0.9, 0.9, 1);
  fill_uniform(p, -0.5, 0.5, 2);
  fill_uniform(gru_h0, -0.5, 0.5, 3);
  fill_uniform(lstm_h0, -0.5, 0.5, 4);
  const ParaGRU<double, Mem> gru{a};
  const ParaLSTM<double, Mem> lstm{a, p};
  expect_steps_reproduce_the_solve<Space>(gru, B, T, gru_h0, 11);
  expect_steps_reproduce_the_solve<Space>(gru, B, T, ZeroInitialState{}, 12);
  expect_steps_reproduce_the_solve<Space>(lstm, B, T, lstm_h0, 13);
  expect_steps_reproduce_the_solve<Space>(lstm, B, T, ZeroInitialState{}, 14);
}

TYPED_TEST(CellStep, BadShapesNameTheArgument) {
  using Space = TypeParam;
  const int B = 2, H = 4;
  View2<double, Space> a("a", 3, H), u("u", B, 3 * H), u_narrow("u", B, 3 * H - 1), h("h", B, H),
      h_short("h", B - 1, H), h_prev_wide("h_prev", B, H + 1);
  const ParaGRU<double, typename Space::memory_space> cell{a};
  auto step = [&](const auto& u_view, const auto& h_prev, const auto& h_view) {
    return [=] { cell_step(Space{}, cell, u_view, h_prev, h_view); };
  };
  auto throws_naming = [](const char* argument, const char* expected) {
    return ThrowsMessage<std::invalid_argument>(AllOf(HasSubstr("paraseq::cell_step"), HasSubstr(argument), HasSubstr(expected)));
  };
  EXPECT_THAT(step(u_narrow, ZeroInitialState{}, h), throws_naming("'u'", "[2, 12]"));
  EXPECT_THAT(step(u, ZeroInitialState{}, h_short), throws_naming("'h'", "[2, 4]"));
  EXPECT_THAT(step(u, h_prev_wide, h), throws_naming("'h_prev'", "[2, 4]"));
}

} // namespace
