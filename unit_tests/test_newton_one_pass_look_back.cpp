// The one-pass kernels' look-back (exchange_through_look_back of newton_fused.hpp) reading several
// windows at once (one_pass_newton's and one_pass_adjoint's LookBackReadAhead; 1 in the
// library's kernels): the maps between a window and the state it found are still applied one by one
// in window order, so h, dL/du, dL/dh0 and the parameter rows are bitwise those of the library's
// kernels when the look-backs read 4 windows at once, on every enabled space, over 65 windows of 16
// steps (several threads per window where the space allows). On GPUs the look-backs cross many
// windows; with a few host threads, mostly one or two, so the exchange itself is also checked with
// look-backs across 0 to 70 entries set up in memory, with stale states (an earlier call's tag) in
// between: the state it hands on and publishes against the float64 loop over the maps in between
// (1e-14), and bitwise between reading 1 and 4 entries at once.
// The one-pass forward keeps its chunks' inputs in registers or in team scratch (ChunkInputs; the
// library's choice differs between spaces): both give the same bits, with every initial guess, for
// ParaGRU in float and ParaLSTM (2 x 2 blocks, 4 inputs per group) in double.

#include <paraseq/solvers/cells.hpp>
#include <paraseq/solvers/newton.hpp>
#include <paraseq/solvers/newton_backward.hpp>

#include "newton_test_problems.hpp"
#include "test_support.hpp"

#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace {

using namespace paraseq;
using namespace paraseq::test;
using paraseq::detail::chunk_inputs_at;
using paraseq::detail::ChunkInputs;
using paraseq::detail::LibraryLaunchBounds;
using paraseq::detail::newton_shape;
using paraseq::detail::one_pass_adjoint;
using paraseq::detail::one_pass_newton;

template <class Space>
class OnePassLookBack : public ::testing::Test {};
TYPED_TEST_SUITE(OnePassLookBack, ExecutionSpaces, SpaceName);

TYPED_TEST(OnePassLookBack, ReadingFourWindowsAtOnceGivesTheSameBits) {
  using Space = TypeParam;
  const int B = 2, T = 64 * one_pass_window_steps + 7, H = 33;
  GruProblem<float, Space> problem(B, T, H, 0.5, 111, 1.5);
  const auto cell = problem.cell();
  const ScanShape shape = newton_shape(cell, problem.u);
  View3<float, Space> h_library("h_library", B, T, H), h_four("h_four", B, T, H), g("g", B, T, H);
  View3<float, Space> du_library("du_library", B, T, 3 * H), du_four("du_four", B, T, 3 * H);
  View2<float, Space> h0("h0", B, H), dh0_library("dh0_library", B, H), dh0_four("dh0_four", B, H);
  fill_uniform(h0, -0.5, 0.5, 112);
  fill_uniform(g, -1, 1, 113);
  for (const NewtonConfig& config : one_pass_configs<Space>(3)) {
    SCOPED_TRACE("threads=" + std::to_string(config.fused_team_threads) +
                 " groups=" + std::to_string(config.fused_team_groups));
    Kokkos::deep_copy(h_four, NAN);
    one_pass_newton<float>(Space{}, cell, problem.u, h_library, h0, config, shape);
    one_pass_newton<float, 0, LibraryLaunchBounds, 4>(Space{}, cell, problem.u, h_four, h0, config, shape);
    EXPECT_TRUE(bitwise_equal(h_library, h_four));
    Kokkos::deep_copy(du_four, NAN);
    Kokkos::deep_copy(dh0_four, NAN);
    const auto rows_library =
        one_pass_adjoint<float>(Space{}, cell, problem.u, h_library, h0, g, du_library, dh0_library, config, shape);
    const auto rows_four = one_pass_adjoint<float, LibraryLaunchBounds, 4>(Space{}, cell, problem.u, h_library, h0, g,
                                                                           du_four, dh0_four, config, shape);
    EXPECT_TRUE(bitwise_equal(du_library, du_four));
    EXPECT_TRUE(bitwise_equal(dh0_library, dh0_four));
    EXPECT_TRUE(bitwise_equal(rows_library, rows_four));
  }
}

// Solves `problem` from h0 in the one-pass mode with the inputs in registers and in team scratch,
// with every config and initial guess (the given one in h), and expects the same (finite) bits.
template <class Space, class Problem, class Acc>
void check_inputs_in_scratch(const Problem& problem, const View2<Acc, Space>& h0, int channels) {
  using paraseq::detail::one_pass_read_ahead;
  const auto cell = problem.cell();
  const ScanShape shape = newton_shape(cell, problem.u);
  const int B = int(problem.u.extent(0)), T = int(problem.u.extent(1));
  View3<Acc, Space> in_registers("in_registers", B, T, channels), in_scratch("in_scratch", B, T, channels);
  for (InitialGuess guess : {InitialGuess::cell_at_zero, InitialGuess::zeros, InitialGuess::given})
    for (NewtonConfig config : one_pass_configs<Space>(3)) {
      config.initial_guess = guess;
      SCOPED_TRACE("threads=" + std::to_string(config.fused_team_threads) + " groups=" +
                   std::to_string(config.fused_team_groups) + " guess=" + std::to_string(int(guess)));
      fill_uniform(in_registers, -0.3, 0.3, 121); // the given guess
      fill_uniform(in_scratch, -0.3, 0.3, 121);
      one_pass_newton<Acc, 0, LibraryLaunchBounds, one_pass_read_ahead, chunk_inputs_at<ChunkInputs::registers>>(
          Space{}, cell, problem.u, in_registers, h0, config, shape);
      one_pass_newton<Acc, 0, LibraryLaunchBounds, one_pass_read_ahead, chunk_inputs_at<ChunkInputs::team_scratch>>(
          Space{}, cell, problem.u, in_scratch, h0, config, shape);
      EXPECT_TRUE(bitwise_equal(in_registers, in_scratch));
      EXPECT_EQ(max_relative_error(in_scratch, as_double3(in_registers)), 0.0); // and finite
    }
}

TYPED_TEST(OnePassLookBack, InputsInTeamScratchGiveTheSameBits) {
  using Space = TypeParam;
  const int B = 2, T = 37 * one_pass_window_steps + 5, H = 33;
  GruProblem<float, Space> gru(B, T, H, 0.5, 114, 1.5);
  View2<float, Space> gru_h0("gru_h0", B, H);
  fill_uniform(gru_h0, -0.5, 0.5, 115);
  check_inputs_in_scratch<Space>(gru, gru_h0, H);
  LstmProblem<double, Space> lstm(B, T, 37, 0.5, 116);
  View2<double, Space> lstm_h0("lstm_h0", B, 74);
  fill_uniform(lstm_h0, -0.5, 0.5, 117);
  check_inputs_in_scratch<Space>(lstm, lstm_h0, 74);
}

// One team runs the exchange of entry `at` over tagged words set up in memory: maps
// [entries][lanes][map x W], states [entries][lanes][D x W] (W words per value); `entering`
// receives what each lane's folding thread hands on.
template <class Space, int D, int ReadAhead>
struct LookBackExchange {
  using member_type = typename Kokkos::TeamPolicy<Space>::member_type;
  static constexpr int W = paraseq::detail::words_per_value<double>;
  Kokkos::View<std::uint64_t***, Kokkos::LayoutRight, Space> maps, states;
  Kokkos::View<double**, Kokkos::LayoutRight, Space> entering;
  int lanes, at, d;
  std::uint32_t tag;

  KOKKOS_FUNCTION void operator()(const member_type& team) const {
    const int lane = team.team_rank() % lanes;
    double fold[paraseq::detail::map_size<D>];
    paraseq::detail::read_tagged<double, paraseq::detail::map_size<D>>(&maps(at, lane, 0), tag, fold);
    paraseq::detail::exchange_through_look_back<double, D, ReadAhead>(
        team, team.team_rank() < lanes, at, d, tag, fold, [&](int k) { return &maps(k, lane, 0); },
        [&](int k) { return &states(k, lane, 0); },
        [&](const double* in) {
          for (int i = 0; i < d; ++i) entering(lane, i) = in[i];
        });
  }
};

// Entry `stop` has published its leaving state and every entry after it its map, with `tag`; the
// entries between hold stale states (the previous call's tag, values 1e30) and the entries before
// `stop` nothing. Returns the states entry `at` hands on and publishes, [lanes][d] each.
template <class Space, int D, int ReadAhead>
std::pair<Host2, Host2> run_exchange(const Host3& maps, const Host3& states, int stop, int at, int d, int lanes,
                                     int threads_per_lane) {
  using paraseq::detail::publish_tagged;
  constexpr int MapSize = paraseq::detail::map_size<D>, W = paraseq::detail::words_per_value<double>;
  const std::uint32_t tag = 7;
  Kokkos::View<std::uint64_t***, Kokkos::LayoutRight, Kokkos::HostSpace> map_words("map_words", at + 1, lanes,
                                                                                    MapSize * W),
      state_words("state_words", at + 1, lanes, D * W);
  const double stale[D] = {1e30, 1e30};
  for (int lane = 0; lane < lanes; ++lane) {
    publish_tagged(&state_words(stop, lane, 0), &states(stop, lane, 0), D, tag);
    for (int k = stop + 1; k <= at; ++k) {
      publish_tagged(&map_words(k, lane, 0), &maps(k, lane, 0), MapSize, tag);
      if (k < at) publish_tagged(&state_words(k, lane, 0), stale, D, tag - 1);
    }
  }
  LookBackExchange<Space, D, ReadAhead> exchange{Kokkos::create_mirror_view_and_copy(Space{}, map_words),
                                                 Kokkos::create_mirror_view_and_copy(Space{}, state_words),
                                                 Kokkos::View<double**, Kokkos::LayoutRight, Space>("entering", lanes, D),
                                                 lanes,
                                                 at,
                                                 d,
                                                 tag};
  Kokkos::parallel_for("look_back_exchange", Kokkos::TeamPolicy<Space>(Space{}, 1, lanes * threads_per_lane), exchange);
  Space{}.fence();
  const auto leaving = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, exchange.states);
  Host2 published("published", lanes, D);
  for (int lane = 0; lane < lanes; ++lane)
    EXPECT_TRUE((paraseq::detail::read_tagged<double, D>(&leaving(at, lane, 0), tag, &published(lane, 0))));
  const auto handed_on = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, exchange.entering);
  Host2 entering("entering", lanes, D);
  Kokkos::deep_copy(entering, handed_on);
  return {entering, published};
}

TYPED_TEST(OnePassLookBack, ExchangeAppliesTheMapsBetweenInOrder) {
  using Space = TypeParam;
  constexpr int D = 2;
  const int d = 2, stop = 3;
  const int most = std::min(24, Kokkos::TeamPolicy<Space>(Space{}, 1, 1).team_size_max(
                                    LookBackExchange<Space, D, 4>{}, Kokkos::ParallelForTag{}));
  const int lanes = most >= 6 ? 3 : 1, threads_per_lane = std::max(1, std::min(8, most / lanes));
  for (int between : {0, 1, 2, 3, 4, 5, 8, 9, 31, 32, 33, 40, 70}) {
    SCOPED_TRACE("maps between=" + std::to_string(between));
    const int at = stop + between + 1;
    Host3 maps("maps", at + 1, lanes, paraseq::detail::map_size<D>), states("states", at + 1, lanes, D);
    fill_uniform(maps, -0.4, 0.4, 200 + between); // contractions: the states stay of order 1
    fill_uniform(states, -1, 1, 300 + between);
    Host2 expected_entering("expected_entering", lanes, D), expected_published("expected_published", lanes, D);
    for (int lane = 0; lane < lanes; ++lane) {
      double state[D] = {states(stop, lane, 0), states(stop, lane, 1)}, next[D];
      for (int k = stop + 1; k <= at; ++k) {
        if (k == at)
          for (int i = 0; i < d; ++i) expected_entering(lane, i) = state[i];
        for (int i = 0; i < d; ++i) {
          next[i] = maps(k, lane, D * D + i);
          for (int j = 0; j < d; ++j) next[i] += maps(k, lane, j * D + i) * state[j];
        }
        for (int i = 0; i < d; ++i) state[i] = next[i];
      }
      for (int i = 0; i < d; ++i) expected_published(lane, i) = state[i];
    }
    const auto [entering_one, published_one] = run_exchange<Space, D, 1>(maps, states, stop, at, d, lanes,
                                                                          threads_per_lane);
    const auto [entering_four, published_four] = run_exchange<Space, D, 4>(maps, states, stop, at, d, lanes,
                                                                            threads_per_lane);
    EXPECT_LE(max_relative_error(entering_one, expected_entering), 1e-14);
    EXPECT_LE(max_relative_error(published_one, expected_published), 1e-14);
    EXPECT_TRUE(bitwise_equal(entering_one, entering_four));
    EXPECT_TRUE(bitwise_equal(published_one, published_four));
  }
}

} // namespace
